"""Notebook 08's logic (flashsim.views.decode): every figure it shows comes from a counted
decode plan; measured points are drawn when the data exist and absent otherwise."""

import pytest

import flashsim
from flashsim import measured
from flashsim.views import decode as dv


def test_view_numbers_are_the_plans():
    v = dv.decode_view(kv_len=4096, batch=2, heads=32, kv_heads=8, page_size=16, splits=4)
    p = flashsim.plan("paged", q_len=1, kv_len=4096, head_dim=128, heads=32, kv_heads=8,
                      batch=2, dtype="fp16", splits=4, page_size=16)
    rep = p.count()
    assert v["bytes_per_token"] == rep.requested_bytes / 2
    assert sum(v["bytes_by_kind"].values()) == rep.requested_bytes
    assert v["bytes_by_kind"]["K/V cache"] == rep.kv_bytes == 2 * 2 * 8 * 4096 * 128 * 2
    assert v["cache_bytes_per_seq"] == 4096 * 2 * 8 * 128 * 2
    assert v["time_s"] == pytest.approx(p.predict_seconds())
    assert v["busy_sms"] == sum(n > 0 for n in v["sm_blocks"][0])
    assert sum(v["sm_blocks"][0]) == p.predict()[0].blocks == 2 * 8 * 4


def test_kv_heads_settings_mean_mha_gqa_mqa_mla():
    kinds = {k: dv.decode_view(kv_len=1024, heads=32, kv_heads=k)["kind"]
             for k in (0, 8, 1, -1)}
    assert kinds == {0: "mha", 8: "gqa", 1: "mqa", -1: "mla"}
    per = dv.decode_view(kv_len=1024, heads=32, kv_heads=-1)["cache_bytes_per_token"]
    assert per["mha"] > per["gqa"] > per["mla"] > per["mqa"]
    with pytest.raises(flashsim.FlashsimError, match="more than"):
        dv.decode_view(heads=8, kv_heads=16)


def test_splits_fill_the_sms_at_batch_1():
    one = dv.decode_view(kv_len=32768, batch=1, heads=32, kv_heads=8, splits=1)
    auto = dv.decode_view(kv_len=32768, batch=1, heads=32, kv_heads=8, splits=0)
    assert one["busy_sms"] == 8 and auto["busy_sms"] == 132
    assert one["time_s"] >= 4 * auto["time_s"]
    assert auto["unsplit_s"] == pytest.approx(one["time_s"])


def test_without_data_the_points_are_absent_and_said_to_be(monkeypatch):
    def missing(name):
        raise FileNotFoundError(name)
    monkeypatch.setattr(measured, "load", missing)
    v = dv.decode_view(kv_len=4096)
    assert v["measured"] == [] and "not measured yet" in v["measured_note"]
    assert dv.measured_table() == [] and "not measured yet" in dv.format_measured([])


def test_with_data_the_matching_points_are_drawn(monkeypatch):
    pt = dict(impl="ours", batch=1, heads=32, kv_heads=8, kv_len=4096, q_len=1,
              head_dim=128, page_size=None, dtype="fp16", time_s=2e-5, kv_bytes=16777216,
              tbps=0.84, check_ok=True)
    other = {**pt, "kv_heads": 1}
    def load(name):                  # the decode table only (no overheads profile: a clean L2)
        if name != dv.DATA:
            raise FileNotFoundError(name)
        return {"points": [pt, other]}
    monkeypatch.setattr(measured, "load", load)
    v = dv.decode_view(kv_len=4096, batch=1, heads=32, kv_heads=8)
    assert v["measured"] == [pt]
    rows = dv.measured_table()
    assert len(rows) == 2 and rows[0]["predicted_s"] > 0
    assert "ours" in dv.format_measured(rows)
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from flashsim.views import pictures
    fig = pictures.figure((10, 6), 60)
    pic = dv.DecodePicture(fig)
    pic.update(v)
    xs, ys = pic.points.get_data()
    assert list(xs) == [4096] and list(ys) == [pytest.approx(20.0)]
    assert pic.note.get_text() == "1 measured points"


def test_each_measured_points_prediction_is_the_kernel_launchs_own_plan():
    """Notebook 08's predicted times: for every contiguous point of the committed data, the
    prediction of the launch ``gpu_kernels.cupy.decode`` configures for it (its variant,
    tiles and splits), whose plan reads K/V once per block of rows as the kernel does."""
    decode = pytest.importorskip("gpu_kernels.cupy.decode")
    rows = [r for r in dv.measured_table() if not r.get("page_size")]
    assert any(r.get("warps") == 8 and r["q_len"] * r["heads"] // r["kv_heads"] > 64
               for r in rows)                                   # 128-row blocks among them
    assert any(r.get("fused") and r["splits"] > 1 for r in rows)      # merged in the split
    for r in rows:
        kw = {**decode.VARIANTS[r.get("variant", "v1")], "block_cols": r["block_cols"],
              "stages": r["stages"], "splits": r["splits"]}         # the row's own tiles and splits
        if kw["short_chunks"] is None:          # v26's rule, which given splits turn off: its warps say
            kw["short_chunks"] = int(r["warps"] == 4 and r["q_len"] * r["heads"] // r["kv_heads"] > 64)
        launch = decode.configure(r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
                                  kv_lens=[r["kv_len"]] * r["batch"], q_len=r["q_len"], **kw)
        assert r["predicted_s"] == pytest.approx(
            launch.plan().predict_seconds(dirty_bytes=dv.flush_dirty_bytes())), r


def test_the_flushs_dirty_lines_are_nsight_computes_and_the_predictions_start_from_them():
    """The measured steps started from the harness's flush, whose dirty lines the benchmark's
    profile saw written back: the most a plain read past the L2 wrote after the table's
    flush; after a clean flush the same reads wrote almost nothing."""
    from flashsim.hardware.presets import gpu
    l2 = gpu("h200").l2_bytes
    reads = {"dirty": [], "clean": []}
    for x in dv.overhead_profile():
        if x["what"] == "plain_read" and x["kv_bytes"] > l2:
            reads[x["flush"]].append(x["dram_write_bytes"])
    dirty = dv.flush_dirty_bytes()
    assert dirty == max(reads["dirty"]) and 0 < dirty <= l2
    assert max(reads["clean"]) < 0.01 * dirty
    row = next(r for r in dv.measured_table() if r["batch"] == 8 and r["kv_heads"] == 1
               and r["kv_len"] == 32768 and r["q_len"] == 1 and not r.get("page_size"))
    p = flashsim.plan("flashdecoding", q_len=1, kv_len=32768, head_dim=128, heads=32, kv_heads=1,
                      batch=8, dtype="fp16", gpu="h200", splits=row["splits"],
                      block_cols=row["block_cols"], block_rows=32, warps=row["warps"],
                      fused_combine=bool(row["fused"]))
    assert row["predicted_s"] > p.predict_seconds()      # the write-back of the flush's lines


def test_panel_caption_and_view_follow_the_controls():
    pytest.importorskip("ipywidgets")
    panel = dv.decode_panel(kv_len=4096)
    s = panel.controls["kv_heads"]
    s.index = [o[1] for o in s.options].index(-1)            # as the browser does
    assert panel.view["kind"] == "mla" and "KV heads = MLA" in panel.caption
    panel.controls["heads"].value = 8
    panel.controls["kv_heads"].value = 16
    assert panel.error and "more than" in panel.error and panel.view["kind"] == "mla"
    for c in panel.controls.values():
        assert c.description in panel.caption


def test_tables_the_notebook_prints():
    rows = {r["kind"]: r for r in dv.intensity_table(kv_len=4096)}
    assert rows["MLA"]["cache_bytes_per_token"] == 576 * 2
    assert rows["MHA"]["flops_per_byte"] < rows["GQA-8"]["flops_per_byte"] < rows["MLA"]["flops_per_byte"]
    g = dv.gqa_table(kv_len=4096, batch=8)
    assert g[0]["kv_bytes"] == 4 * g[1]["kv_bytes"] and g[0]["time_s"] > g[1]["time_s"]
    f = dv.fragmentation_table(kv_lens=(100, 3000), page_sizes=(1, 16), capacity=4096)
    assert f[0]["paged_waste"] == 0 and f[1]["paged_waste"] > 0
    assert f[0]["table_bytes"] > f[1]["table_bytes"]


def test_an_overheads_profile_whose_csv_is_not_its_json_is_refused(monkeypatch):
    real = measured.load

    def load(name):
        d = real(name)
        if name == "decode_overheads_ncu_h200.json":
            d["launches"][0] = {**d["launches"][0], "kernel": "decode_combine"}
        return d
    monkeypatch.setattr(measured, "load", load)
    with pytest.raises(flashsim.FlashsimError, match="not the JSON's"):
        dv.overhead_profile()


def test_the_configs_profile_pairs_each_call_with_its_kernels():
    """Every call of the committed profile has kernels; ours are the decode kernels its launch
    named, the peer's none of them, and the DRAM bytes each call read cover its K/V."""
    calls = dv.configs_profile()
    assert calls and {c["what"] for c in calls} == {"peer", "ours"}
    for c in calls:
        names = [k["name"] for k in c["kernels"]]
        assert names
        if c["what"] == "ours":
            assert all(n.startswith("decode_") for n in names)
        else:
            assert not any(n.startswith("decode_") for n in names)
        assert sum(k["dram_read_bytes"] for k in c["kernels"]) >= 0.99 * c["kv_bytes"]


def test_a_configs_profile_whose_csv_is_not_its_json_is_refused(monkeypatch):
    real = measured.load

    def load(name):
        d = real(name)
        if name == "decode_configs_ncu_h200.json":
            i = next(i for i, c in enumerate(d["calls"]) if c["kernels"])
            d["calls"][i] = {**d["calls"][i], "kernels": ["decode_combine"] + d["calls"][i]["kernels"]}
        return d
    monkeypatch.setattr(measured, "load", load)
    with pytest.raises(flashsim.FlashsimError, match="not the JSON's"):
        dv.configs_profile()


def test_timeline_draws_the_committed_blocks_or_says_it_has_none(monkeypatch):
    """Notebook 08's step, block by block: from --timeline's committed run, one line a block
    in each phase (stamps in order within a block), the plain read of 64 KB in flight beside;
    without the file, a note and nothing drawn."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from flashsim.views import pictures
    row = dv.timeline_runs(8, 1, 32768, 1)
    if row is None:
        pytest.skip("decode_timeline_h200.json not committed")
    st = row["stamps"]
    blocks = len(st["sm"])
    assert blocks == 8 * row["splits"] and row["run"]["event_ns"] > row["run"]["span_ns"]
    for i in range(blocks):
        chain = [st[a][i] for a, *_ in dv.PHASES] + [st["exit_ns"][i]]
        assert chain == sorted(chain) and chain[0] >= 0
    fig = pictures.figure((8, 4), 60)
    dv.timeline_picture(fig, 8, 1, 32768, 1)
    ours, read = fig.axes
    assert [len(c.get_segments()) for c in ours.collections] == [blocks] * len(dv.PHASES)
    assert len(read.collections[0].get_segments()) == 128

    def missing(name):
        raise FileNotFoundError(name)
    monkeypatch.setattr(measured, "load", missing)
    assert dv.timeline_runs() is None
    fig = pictures.figure((8, 4), 60)
    dv.timeline_picture(fig)
    assert "not measured yet" in fig.axes[0].get_title() and not fig.axes[0].collections
