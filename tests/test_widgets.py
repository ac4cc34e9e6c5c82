"""The notebooks' views: what each slider shows is right, the panels redraw what changed
and nothing stale, and the committed notebooks carry no outputs."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import flashsim
from flashsim import FlashsimError
from flashsim.views import widgets as w

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------- 01 memory, roofline

def test_memory_table_orders_of_magnitude():
    rows = {r["gpu"]: r for r in w.memory_table()}
    assert set(rows) == set(flashsim.GPUS)
    # The FlashAttention paper: A100 SRAM about 19 TB/s, HBM 1.5-2.0 TB/s.
    assert 19e12 < rows["a100-40gb"]["sram_bandwidth"] < 20e12
    for r in rows.values():
        assert r["hbm_capacity"] > 1000 * r["sram_total"]
        assert r["sram_bandwidth"] > 5 * r["hbm_bandwidth"]
        assert r["sram_total"] == r["sms"] * r["sram_per_block"]


def test_roofline_intensity_is_flops_over_counted_bytes():
    v = w.roofline_view("h200", 1024, 64, "fp16")
    for alg in w.ALGS:
        rep = flashsim.plan(alg, 1024, 64, dtype="fp16", gpu="h200").count()
        assert v["algs"][alg]["intensity"] == rep.flops / rep.hbm_bytes
    assert v["ridge"] == pytest.approx(989.4e12 / 4.8e12)
    assert v["algs"]["standard"]["bound"] == "memory"
    assert v["algs"]["flash2"]["intensity"] > 5 * v["algs"]["standard"]["intensity"]


# ------------------------------------------------------------------- 02 standard

@pytest.mark.parametrize("scale,mask,passes", [(False, False, 4), (True, False, 6),
                                                (False, True, 6), (True, True, 8)])
def test_standard_view_counts_n_by_n_passes(scale, mask, passes):
    v = w.standard_view(2048, 64, "fp16", scale=scale, mask=mask)
    assert v["square_passes"] == passes            # S, P written and read, + 2 per extra pass
    assert v["square_bytes"] == passes * 2048**2 * 2
    assert v["ratio"] > 5
    rep = flashsim.plan("standard", 2048, 64, dtype="fp16", gpu="h200", causal=mask,
                        extra_passes=v["passes"]).count()
    assert v["hbm_bytes"] == rep.hbm_bytes


def test_standard_curve_grows_as_n_squared():
    c = w.standard_view(4096, 64)["curve"]
    ratio = c["standard"][-1] / c["standard"][-2]    # N doubles
    assert 3.5 < ratio <= 4.0
    assert (c["floor"] <= c["flash2"]).all() and (c["flash2"] < c["standard"]).all()


# ------------------------------------------------------------------- 03 online softmax

@pytest.mark.parametrize("example", w.EXAMPLES)
def test_online_softmax_view_ends_at_softmax(example):
    v = w.online_softmax_view(example, n=37, block=8, step=10**6)   # clamped to the last
    assert v["hi"] == 37 and v["k"] == v["steps"] - 1 == 4
    assert np.max(np.abs(v["y"] - v["softmax"])) <= 1e-12
    assert v["output"] == pytest.approx(v["softmax"] @ v["v"], abs=1e-12)
    assert v["limits"]["step"] == (0, 4)


def test_examples_reach_the_hard_paths():
    assert len(w.online_softmax_view("rising maximum", 32, 8)["max_changes"]) >= 3
    huge = w.softmax_example("huge logits", 32)
    assert np.abs(huge).max() > 9e3
    last = w.online_softmax_view("max in the last block", 32, 8, step=3)
    assert last["m_new"] > last["m_old"] and last["alpha"] < 0.05
    with pytest.raises(FlashsimError):
        w.softmax_example("nope")


# ------------------------------------------------------------------- 04 SRAM, tiles

def test_sram_view_matches_the_counter_at_the_chosen_m():
    v = w.sram_view(1024, 64, "fp16", sram=48 * 1024, causal=True)
    for alg in w.ALGS:
        p = flashsim.plan(alg, 1024, 64, dtype="fp16", sram=48 * 1024, causal=True)
        assert v["bytes"][alg] == p.count().hbm_bytes
        assert v["blocks"][alg] == (p.block_rows, p.block_cols)
    assert v["sizes"][0] == 16 * 1024 and v["sizes"][-1] == 1024 * 1024
    for alg in w.ALGS:
        assert (v["curves"][alg] >= v["floor"]).all()


def test_sram_view_theorem2_curve_tracks_flash1():
    v = w.sram_view(8192, 64, "fp16", sram=2**17)
    f1, th = v["curves"]["flash1"], v["theorem2"]
    big = v["sizes"] >= 128 * 1024                   # B_r = d: the paper's regime
    assert np.all(np.abs(np.log(f1[big] / th[big])) < np.log(1.5))
    assert f1[0] > 8 * f1[-1]                        # 64x more SRAM: much less traffic
    assert v["curves"]["standard"][-1] > 4 * v["curves"]["flash2"][-1]


def test_tile_view_steps_through_the_trace():
    kw = dict(algorithm="flash2", seq_len=256, head_dim=64, dtype="fp16", sram=48 * 1024,
              causal=True)
    first = w.tile_view(**kw, step=0)
    assert (first["block_rows"], first["block_cols"]) == (64, 64)
    assert first["state"].shape == (4, 4)
    assert first["steps"] == 10 and first["skipped"] == 6          # causal: 10 of 16 tiles
    for s in range(first["steps"]):
        v = w.tile_view(**kw, step=s)
        assert (v["state"] == 1).sum() == s and (v["state"] == 2).sum() == 1
        i, j = v["i"], v["j"]
        assert v["state"][i, j] == 2 and j <= i                       # never above the diagonal
        assert ("Q", (64 * i, 64 * i + 64)) in v["held"]
        assert ("K", (64 * j, 64 * j + 64)) in v["held"]
    last = w.tile_view(**kw, step=10**6)
    assert last["step"] == 9 and last["read_bytes"] <= last["total_read"]
    p = flashsim.plan("flash2", 256, 64, dtype="fp16", sram=48 * 1024, causal=True)
    assert last["total_read"] == p.count().hbm_read_bytes


def test_tile_view_flash1_rewrites_o_every_outer_step():
    v = w.tile_view("flash1", 256, 32, "fp32", sram=64 * 1024, causal=False, step=10**6)
    Tc = v["state"].shape[1]
    assert (v["state"] == 3).sum() == 0
    # O_i is written at initialisation and once per outer step j: T_c + 1 times in all.
    # At the last tile, the current block's last write has not happened yet.
    assert v["o_writes"][v["i"]] == Tc and v["o_writes"][0] == Tc + 1
    with pytest.raises(FlashsimError):
        w.tile_view("flash2", 1024, 64, "fp16", sram=16 * 1024, causal=False)  # 4096 tiles


# ------------------------------------------------------------------- 05 FlashAttention-2

def test_loop_order_o_once_in_flash2():
    v = w.loop_order_view(4096, 64, "fp16", sram=100 * 1024)
    assert v["o_passes"]["flash2"] == 1
    Tc = -(-4096 // v["blocks"]["flash1"][1])
    assert v["o_passes"]["flash1"] == 2 * Tc + 1      # read T_c times, written T_c + 1 times
    assert v["hbm_bytes"]["flash2"] < v["hbm_bytes"]["flash1"]


def test_occupancy_waves_and_idle_sms():
    fa1 = w.occupancy("flash1", batch=2, heads=4, seq_len=8192, block_rows=128)
    fa2 = w.occupancy("flash2", batch=2, heads=4, seq_len=8192, block_rows=128)
    assert fa1["blocks"] == 8 and fa1["waves"] == 1 and fa1["time_units"] == 64
    assert fa1["utilisation"] == pytest.approx(8 / 132)
    assert fa2["blocks"] == 8 * 64 and fa2["waves"] == 4            # ceil(512 / 132)
    assert fa2["utilisation"] == pytest.approx(512 / (4 * 132))
    ragged = w.occupancy("flash2", 1, 1, 1000, 128)
    assert ragged["blocks"] == 8                                     # ceil(1000 / 128)
    with pytest.raises(FlashsimError):
        w.occupancy("flash3", 1, 1, 10, 10)
    with pytest.raises(FlashsimError):
        w.occupancy("flash2", 0, 1, 10, 10)


@pytest.mark.parametrize("batch,heads,n", [(2, 4, 8192), (64, 16, 1024), (1, 1, 65536),
                                           (3, 5, 1000)])
def test_parallelism_busy_picture_holds_all_the_work(batch, heads, n):
    v = w.parallelism_view(batch, heads, n, 128)
    Tr = -(-n // 128)
    for s in ("flash1", "flash2"):
        busy = v["busy"][s]
        assert busy.shape[0] == 132
        work = busy.sum() * v["time_units"] / busy.shape[1]
        assert work == pytest.approx(batch * heads * Tr)
    assert v["speedup"] == v["flash1"]["time_units"] / v["flash2"]["time_units"]


# ------------------------------------------------------------------- panels

def _pixels(png: bytes) -> np.ndarray:
    import io
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)


def _differ(a: bytes, b: bytes) -> float:
    pa, pb = _pixels(a), _pixels(b)
    assert pa.shape == pb.shape
    return float((np.abs(pa - pb).max(axis=-1) > 40).mean())


PANELS = [
    (w.sram_panel, [("sram", 2**15), ("sram", 2**19), ("seq_len", 65536), ("sram", 100 * 1024),
                    ("seq_len", 2048), ("causal", True), ("sram", 2**16)]),
    (w.online_softmax_panel, [("step", 1), ("step", 3), ("example", "huge logits"),
                              ("step", 2), ("n", 37), ("block", 5), ("n", 20), ("step", 3)]),
    (w.tile_panel, [("step", 3), ("step", 7), ("causal", False), ("step", 11)]),
    (w.standard_panel, [("seq_len", 65536), ("seq_len", 1024), ("scale", True),
                        ("seq_len", 8192)]),
    (w.roofline_panel, [("seq_len", 65536), ("gpu", "a100-80gb"), ("seq_len", 2048)]),
    (w.loop_order_panel, [("seq_len", 65536), ("sram", 2**18)]),
    (w.parallelism_panel, [("batch", 1), ("batch", 16), ("heads", 3), ("seq_len", 1024)]),
    (w.warps_panel, [("warps", 8), ("block_cols", 128), ("warps", 2), ("head_dim", 64)]),
]
# Notebooks 09-11's layered pictures (the last move's family is the one a fresh panel,
# set control by control, ends on: a family's slider selects its family)
from flashsim.views import beyond as _beyond, hopper as _hopper, masks as _masks  # noqa: E402
PANELS += [
    (_masks.mask_panel, [("window", 2048), ("documents", 5), ("seq_len", 8192),
                         ("window", 512), ("density", 0.5)]),
    (_hopper.timeline_panel, [("head_dim", 64), ("schedule", "pingpong"), ("head_dim", 256)]),
    (_hopper.fp8_panel, [("block", 64), ("outlier_fraction", 0.01), ("block", 128)]),
    (_beyond.timeline_panel, [("devices", 8), ("seq_len", 131072), ("link", "32"),
                              ("devices", 2), ("causal", False)]),
]


@pytest.mark.parametrize("make,moves", PANELS, ids=[m.__name__ for m, _ in PANELS])
def test_panel_redraw_in_layers_leaves_nothing_stale(make, moves):
    """After a run of slider moves (most of them redrawn from saved layers), the picture
    matches one drawn in full at the final values."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("matplotlib")
    panel = make()
    for name, value in moves:
        panel.controls[name].value = value
        assert panel.controls[name].value == value
        assert panel.error is None
        assert panel.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    fresh = make()
    for name, value in panel.values().items():
        fresh.controls[name].value = value
    fresh._renderer.keys = None                     # forget the saved layers: draw it all
    fresh.refresh()
    assert fresh.values() == panel.values()
    assert _differ(panel.image.value, fresh.image.value) < 1e-4   # measured: 0 pixels


def test_panel_callback_updates_the_view():
    pytest.importorskip("ipywidgets")
    panel = w.sram_panel(seq_len=4096)
    panel.controls["sram"].value = 2**18
    assert panel.view["sram"] == 2**18
    assert panel.view["bytes"]["flash1"] == flashsim.plan(
        "flash1", 4096, 64, dtype="fp16", sram=2**18).count().hbm_bytes
    assert panel.last_ms > 0


def test_panel_reports_bad_input_and_keeps_the_picture():
    pytest.importorskip("ipywidgets")
    panel = w.tile_panel(seq_len=256)
    panel.controls["seq_len"].value = 1024
    before, png = panel.view, panel.image.value
    panel.controls["sram"].value = 2**14
    assert panel.error is not None and "too many" in panel.error
    assert "too many" in panel.message.value
    assert panel.image.value == png and panel.view["seq_len"] == before["seq_len"]
    panel.controls["sram"].value = 2**17
    assert panel.error is None and panel.view["seq_len"] == 1024


def test_step_slider_follows_the_number_of_steps():
    pytest.importorskip("ipywidgets")
    panel = w.online_softmax_panel(n=32, block=8)
    assert panel.controls["step"].max == 3
    panel.controls["block"].value = 3
    assert panel.controls["step"].max == 10
    panel.controls["step"].value = 10
    assert panel.view["hi"] == 32
    panel.controls["block"].value = 16                       # step 10 no longer exists
    assert panel.controls["step"].max == 1 and panel.view["k"] == 1


def test_pictures_draw_without_widgets():
    pytest.importorskip("matplotlib")
    from flashsim.views import pictures as P
    for cls, view in ((P.SramPicture, w.sram_view(2048)),
                      (P.TilePicture, w.tile_view()),
                      (P.OnlineSoftmaxPicture, w.online_softmax_view()),
                      (P.RooflinePicture, w.roofline_view()),
                      (P.StandardTrafficPicture, w.standard_view()),
                      (P.LoopOrderPicture, w.loop_order_view()),
                      (P.WavesPicture, w.parallelism_view()),
                      (P.WarpsPicture, w.warp_partition_view())):
        fig = P.draw(cls, view)
        fig.canvas.draw()
    P.memory_hierarchy(w.memory_table()).canvas.draw()


def test_import_flashsim_stays_light():
    code = ("import sys, flashsim, flashsim.views.widgets, flashsim.algorithms.online_softmax, "
            "flashsim.views.pictures; bad = [m for m in ('matplotlib', 'ipywidgets') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------- notebooks

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_at_least_five_notebooks_three_with_widgets():
    assert len(NOTEBOOKS) >= 5
    with_widgets = [nb for nb in NOTEBOOKS if "_panel(" in nb.read_text()]
    assert len(with_widgets) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebooks_have_no_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, path.name
    assert "widgets" not in nb.get("metadata", {}), "saved widget state is an output too"


def _canvas_pixels(fig) -> np.ndarray:
    """``fig`` drawn on its canvas, as (height, width, 4) ints."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).astype(int)


def test_kept_text_draws_what_agg_draws():
    """The panels' canvas keeps rasterized lines of text: a figure drawn from the kept lines
    equals the stock Agg drawing (overlapping glyphs may round one level apart), and drawn
    again it is served from them (no new line kept) with the same pixels."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from flashsim.views import pictures

    fig = pictures.figure((4.0, 2.5))
    ax = fig.add_subplot()
    ax.plot([0, 3], [0, 7])
    ax.set_title("step 3: block 4 of 8 (x[24:32])", fontsize=9)
    ax.text(0.3, 2.0, "m_old = 1.25\nalpha = e^(m_old - m_new)\nfi ff VA Wo", family="monospace")
    cache = getattr(type(fig.canvas), "text_cache", None)
    if cache is None:
        pytest.skip("this matplotlib draws text in one bitmap a line: nothing is kept")
    first = _canvas_pixels(fig)
    kept = len(cache)
    again = _canvas_pixels(fig)
    assert kept > 0 and len(cache) == kept and np.array_equal(first, again)
    stock = _canvas_pixels(FigureCanvasAgg(fig).figure)
    differ = np.abs(first - stock).max(axis=-1)
    assert differ.max() <= 1 and (differ > 0).sum() <= 20, (differ.max(), (differ > 0).sum())
    assert (np.abs(first - 255).max(axis=-1) > 0).sum() > 1000     # something was drawn


def test_kept_text_follows_the_font_rcparams_name():
    """A kept line is kept under the font files its properties resolve to: the same
    FontProperties ("sans-serif") under other rcParams draws in the other font, as stock Agg
    does, and back under the first it draws as it did."""
    pytest.importorskip("matplotlib")
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from flashsim.views import pictures

    fig = pictures.figure((3.0, 1.0))
    fig.text(0.1, 0.4, "Kept text, 0.125", family="sans-serif", fontsize=12)
    cached = type(fig.canvas)
    drawn = []
    for font in ("DejaVu Sans", "DejaVu Serif", "DejaVu Sans"):
        with matplotlib.rc_context({"font.sans-serif": [font]}):
            drawn.append(_canvas_pixels(fig))
            if font == "DejaVu Serif":
                serif_stock = _canvas_pixels(FigureCanvasAgg(fig).figure)
                cached(fig)                               # back on the panels' canvas
    assert np.array_equal(drawn[0], drawn[2])
    assert (np.abs(drawn[0] - drawn[1]).max(axis=-1) > 0).sum() > 50
    assert np.abs(drawn[1] - serif_stock).max() <= 1
