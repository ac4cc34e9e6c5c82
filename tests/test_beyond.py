"""Notebook 11's views: the context-parallel timeline and bytes, and its panel."""

import pytest

import flashsim
from flashsim import context_parallel as cpm
from flashsim.views import beyond


def test_timeline_view_reports_idle_devices_and_bytes():
    v = beyond.timeline_view(devices=4, seq_len=65536, link="450", schedule="ring",
                             causal=True)
    assert v["rows"] == [16384] * 4 and v["overlapped"]
    idle = v["idle_fraction"]
    assert idle == sorted(idle, reverse=True) and idle[-1] == pytest.approx(0, abs=1e-12)
    assert v["link_bytes"] == 32 * 2 * 3 * 65536 * 128 * 2
    assert sum(v["link_send_bytes"]) == v["link_bytes"]
    share = beyond.link_share(v)
    assert (share > 0).all() and (share < 0.1).all()      # links carry a few % of HBM's
    assert "ring on 4 devices" in beyond.describe(v)


def test_slow_link_and_threshold():
    fast = beyond.timeline_view(devices=4, seq_len=65536, link="450", schedule="zigzag")
    slow = beyond.timeline_view(devices=4, seq_len=65536, link="32", schedule="zigzag")
    assert fast["overlapped"] and not slow["overlapped"]
    assert slow["min_rows_for_overlap"] == pytest.approx(989.4e12 * 2 / (2 * 32e9))
    assert slow["total_s"] > fast["total_s"]


def test_schedules_table_has_one_row_per_schedule():
    rows = beyond.schedules_table(devices=2, seq_len=8192)
    assert [r["schedule"] for r in rows] == list(cpm.SCHEDULES)
    assert "zigzag" in beyond.format_schedules(rows)


def test_unknown_link_is_one_error():
    with pytest.raises(flashsim.FlashsimError, match="link"):
        beyond.timeline_view(link="100")


def test_panel_controls_lie_on_their_grids():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("matplotlib")
    panel = beyond.timeline_panel()
    for name, value in (("devices", 8), ("seq_len", 2**20), ("link", "900"),
                        ("schedule", "striped"), ("causal", False)):
        panel.controls[name].value = value
        assert panel.view[name if name != "link" else "link_gbps"] == (
            float(value) if name == "link" else value)
    assert panel.error is None and len(panel.view["rows"]) == 8
    assert panel.image.value[:4] == b"\x89PNG"
