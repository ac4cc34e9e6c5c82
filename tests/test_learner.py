"""What a learner sees: the defects found by reading and running the notebooks as a learner
would (issue #12), each held by a test, and the new views of notebooks 01, 04 and 05."""

import ast
import importlib
import json
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

import flashsim
from flashsim import FlashsimError
from flashsim.hardware import l2
from flashsim.measured import papers
from flashsim.views import backward
from flashsim.views import widgets as w

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KiB = 1024


def _code_cells(path):
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _markdown(path):
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def _literal(node):
    """The value of a constant expression (numbers, * and **), or None."""
    try:
        return eval(compile(ast.Expression(node), "<cell>", "eval"), {"__builtins__": {}}, {})
    except Exception:
        return None


def _panel_calls(tree):
    """[(variable, factory, {kwarg: value})] for ``X = module.*_panel(...)``, the factory
    named ``"module.name"`` (a module of flashsim.views: widgets, hopper, beyond)."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr.endswith("_panel")):
            kw = {k.arg: _literal(k.value) for k in node.value.keywords}
            owner = node.value.func.value
            module = owner.id if isinstance(owner, ast.Name) else "widgets"
            out.append((node.targets[0].id, f"{module}.{node.value.func.attr}", kw))
    return out


def _control_sets(tree):
    """[(variable, control, value)] for ``X.controls["c"].value = <constant>``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            t = node.targets[0]
            if (isinstance(t, ast.Attribute) and t.attr == "value"
                    and isinstance(t.value, ast.Subscript)
                    and isinstance(t.value.value, ast.Attribute)
                    and t.value.value.attr == "controls"):
                out.append((t.value.value.value.id, _literal(t.value.slice),
                            _literal(node.value)))
    return out


# Cheap arguments to build each panel once and read its controls.
CHEAP = {"widgets.sram_panel": dict(seq_len=256), "widgets.tile_panel": dict(seq_len=128),
         "widgets.roofline_panel": dict(seq_len=256), "widgets.standard_panel": dict(seq_len=256),
         "widgets.loop_order_panel": dict(seq_len=256), "widgets.online_softmax_panel": {},
         "widgets.parallelism_panel": dict(seq_len=256), "widgets.warps_panel": {},
         "widgets.recomputation_panel": dict(seq_len=256)}


def _factory(name: str):
    module, attr = name.split(".")
    return getattr(importlib.import_module(f"flashsim.views.{module}"), attr)


class _Controls(dict):
    """Each factory's controls, built once (cheaply where CHEAP says how) when first asked."""

    def __missing__(self, name):
        self[name] = _factory(name)(**CHEAP.get(name, {})).controls
        return self[name]


@pytest.fixture
def controls(monkeypatch):
    """Panels' controls, their pictures not drawn: a panel still computes its view (whose
    limits set a control's range), but a PNG costs a render this test does not look at (the
    notebook tests draw these same cells' pictures)."""
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(w.Panel, "png", lambda self: b"")
    return _Controls()


def test_every_value_a_cell_sets_is_on_its_sliders_grid(controls):
    """In a browser a slider snaps a value off its steps to the nearest one and sends that
    back; so every value a notebook gives a control (at creation or later) must be one the
    control can show exactly. A cell that drives a panel is replayed on a panel built with
    the cell's own arguments, so controls whose range follows the view (a step slider) are
    checked against the range they have at that moment."""
    checked = 0
    for path in NOTEBOOKS:
        for src in _code_cells(path):
            tree = ast.parse(src)
            calls = {var: (name, kw) for var, name, kw in _panel_calls(tree)}
            for var, (name, kw) in calls.items():
                for arg, value in kw.items():
                    c = controls[name].get(arg)
                    if c is not None and value is not None:
                        assert w.on_grid(c, value), (path.name, name, arg, value)
                        checked += 1
            live = {}
            for var, ctl, value in _control_sets(tree):
                name, kw = calls[var]
                if var not in live:
                    live[var] = _factory(name)(**{k: v for k, v in kw.items()
                                                    if v is not None})
                c = live[var].controls[ctl]
                if value is None:                      # e.g. ``.max``: the widget's own
                    continue
                assert w.on_grid(c, value), (path.name, var, ctl, value)
                c.value = value
                checked += 1
    assert checked > 20


def test_on_grid_refuses_what_a_browser_would_snap():
    pytest.importorskip("ipywidgets")
    import ipywidgets as W
    log = W.FloatLogSlider(value=2**17, base=2, min=14, max=20, step=0.125)
    assert w.on_grid(log, 2**17) and not w.on_grid(log, 227 * KiB)     # the old defect
    ints = W.IntSlider(value=0, min=0, max=10, step=2)
    assert w.on_grid(ints, 4) and not w.on_grid(ints, 5) and not w.on_grid(ints, 12)
    sel = w._sram_slider(48 * KiB)
    assert w.on_grid(sel, 48 * KiB) and not w.on_grid(sel, 49 * KiB + 7)


def test_sram_slider_holds_what_cells_name_and_refuses_the_rest():
    pytest.importorskip("ipywidgets")
    from traitlets import TraitError
    opts = w.sram_options()
    for m in (48 * KiB, 100 * KiB, 227 * KiB, 163 * KiB, 99 * KiB, 2**14, 2**17, 2**20):
        assert m in opts
    assert opts == sorted(set(opts)) and opts[0] == 16 * KiB and opts[-1] == 1024 * KiB
    assert all(b / a < 2 ** 0.2 for a, b in zip(opts, opts[1:]))       # no big gaps
    panel = w.tile_panel(seq_len=256, sram=48 * KiB)
    with pytest.raises(TraitError):
        panel.controls["sram"].value = 49 * KiB + 7                     # not representable
    assert panel.view["sram"] == 48 * KiB                               # unchanged


def test_caption_and_view_follow_the_widget_as_the_browser_moves_it():
    """What the browser sends back is the slider's index; the view, the picture's note and
    the caption all follow the widget's own state."""
    pytest.importorskip("ipywidgets")
    panel = w.sram_panel(seq_len=256)
    slider = panel.controls["sram"]
    for label, m in (slider.options[3], slider.options[-1], ("227 KiB", 227 * KiB)):
        slider.index = [o[1] for o in slider.options].index(m)   # as the browser does
        assert panel.view["sram"] == slider.value == m
        assert f"SRAM M = {label}" in panel.caption
        assert f"{m:,} B" in panel.picture.note.get_text()
        assert label in panel.caption_html.value
    tiles = w.tile_panel(seq_len=256, sram=48 * KiB)
    p = flashsim.plan("flash2", 256, 64, dtype="fp16", sram=48 * KiB, causal=True)
    assert "SRAM M = 48 KiB" in tiles.caption
    assert (tiles.view["block_rows"], tiles.view["block_cols"]) == (p.block_rows, p.block_cols)


def test_captions_name_every_control():
    pytest.importorskip("ipywidgets")
    panel = w.sram_panel(seq_len=256, causal=True)
    cap = panel.caption
    for c in panel.controls.values():
        assert c.description in cap
    assert "causal = on" in cap and "N = 256" in cap


def test_demonstrations_drive_panels_of_their_own():
    """A panel shown to the reader keeps the values it was created with after Run All: a
    cell only sets the controls of a panel it creates itself."""
    for path in NOTEBOOKS:
        for src in _code_cells(path):
            tree = ast.parse(src)
            made = {var for var, _, _ in _panel_calls(tree)}
            for var, ctl, _ in _control_sets(tree):
                assert var in made, f"{path.name}: sets {var}.controls[{ctl!r}] made elsewhere"


def test_sram_slider_is_wide_enough_to_drag():
    pytest.importorskip("ipywidgets")
    panel = w.sram_panel(seq_len=256)
    width = int(panel.controls["sram"].layout.width.rstrip("px"))
    steps = len(panel.controls["sram"].options)
    assert width / steps >= 8                                   # pixels per step
    for name, c in panel.controls.items():
        if name != "sram" and c.layout.width:
            assert int(c.layout.width.rstrip("px")) < width


# ------------------------------------------------------------------ the pictures' words

def _softmax_picture(view):
    pytest.importorskip("matplotlib")
    from flashsim.views import pictures as P
    fig = P.figure((9.0, 5.0), 80)
    pic = P.OnlineSoftmaxPicture(fig)
    pic.update(view)
    fig.canvas.draw()
    return fig, pic


def test_m_old_and_m_new_labels_do_not_overlap_when_equal():
    x_steps = w.online_softmax_view("random", 32, 8)["steps"]
    same = [s for s in range(1, x_steps)
            if w.online_softmax_view("random", 32, 8, step=s)["alpha"] == 1.0]
    assert same, "an example step where the max does not change"
    v = w.online_softmax_view("random", 32, 8, step=same[0])
    assert v["m_old"] == v["m_new"]
    fig, pic = _softmax_picture(v)
    r = fig.canvas.get_renderer()
    a, b = pic.m_old_label.get_window_extent(r), pic.m_new_label.get_window_extent(r)
    assert not a.overlaps(b)


def test_step_words_say_which_one_is_last_and_that_the_first_has_nothing_to_rescale():
    v = w.online_softmax_view("rising maximum", 32, 8, step=10**6)
    _, pic = _softmax_picture(v)
    assert "block 4 of 4 (the last)" in pic.title.get_text()
    first = w.online_softmax_view("rising maximum", 32, 8, step=0)
    _, pic = _softmax_picture(first)
    assert "nothing to rescale" in pic.text.get_text()
    assert "rescaled" not in pic.text.get_text()
    from flashsim.views import pictures as P
    tv = w.tile_view(step=10**6)
    fig = P.figure((9.0, 5.0), 80)
    tp = P.TilePicture(fig)
    tp.update(tv)
    text = tp.text.get_text()
    assert f"tile {tv['steps']} of {tv['steps']} (the last)" in text
    assert "O rows" not in text and "rows of the output" in text


# ------------------------------------------------------------------ DRAM beside requests

def test_dram_bytes_is_the_l2_models_and_is_cached():
    p = flashsim.plan("flash2", 512, 64, dtype="fp16", gpu="h200")
    x = l2.simulate(p)
    assert w.dram_bytes(p) == x.dram_read_bytes + x.dram_write_bytes + x.dirty_at_end_bytes
    same = flashsim.plan("flash2", 512, 64, dtype="fp16", gpu="h200")
    assert w.dram_bytes(same) == w.dram_bytes(p)


def test_flash2_requests_more_than_flash1_at_large_m_but_dram_sees_the_floor():
    v = w.sram_view(2048, 64, "fp16", sram=227 * KiB)
    assert v["bytes"]["flash2"] > v["bytes"]["flash1"]
    (br1, bc1), (br2, bc2) = v["blocks"]["flash1"], v["blocks"]["flash2"]
    assert -(-2048 // br2) > -(-2048 // bc1)                   # T_r of flash2 > T_c of flash1
    for alg in ("flash1", "flash2"):
        assert (v["dram"][alg] >= v["floor"]).all() and (v["dram"][alg] < 1.05 * v["floor"]).all()
    assert w.sram_view(2 * w.DRAM_MAX_N, 64, "fp16")["dram"] is None


def test_roofline_puts_dram_beside_requests():
    v = w.roofline_view("h200", 1024, 64, "fp16")
    for alg, a in v["algs"].items():
        assert a["dram_bytes"] <= a["requested_bytes"]
        assert a["dram_intensity"] >= a["intensity"]
    assert v["algs"]["flash2"]["dram_bound"] == "compute"
    assert w.roofline_view("h200", 65536, 64)["algs"]["flash2"]["dram_bytes"] is None


def test_memory_levels_and_the_three_sram_sizes():
    levels = {r["level"]: r for r in w.memory_levels("h200")}
    assert list(levels) == ["registers", "shared memory", "L2", "DRAM (HBM)"]
    assert levels["registers"]["per_sm"] == 256 * KiB > levels["shared memory"]["per_sm"]
    assert levels["shared memory"]["per_block"] == 227 * KiB
    s = w.sram_sizes("a100-40gb")
    assert s["paper_total"] == 108 * 192 * KiB and s["M"] == 163 * KiB
    assert "registers" in w.format_memory_levels("h100")


# ------------------------------------------------------------------ notebook 05's new views

def test_flash2_defers_the_rescale():
    N, d, Br, Bc = 1024, 64, 64, 32
    f1, f2 = (w.nonmatmul_flops(a, N, d, Br, Bc) for a in ("flash1", "flash2"))
    Tc = N // Bc
    assert f1["softmax"] == f2["softmax"] == 5 * N * N
    assert f1["rescale"] == 4 * d * N * Tc + N * Tc and f2["rescale"] == 2 * d * N * Tc
    assert f2["final"] == N * d + 2 * N and f1["final"] == 0
    assert f2["total"] < f1["total"]
    # the saving grows with the number of K/V blocks: smaller B_c, more rescales saved
    small = [w.nonmatmul_flops(a, N, d, Br, 16) for a in ("flash1", "flash2")]
    assert small[0]["total"] - small[1]["total"] > f1["total"] - f2["total"]
    with pytest.raises(FlashsimError):
        w.nonmatmul_flops("standard", N, d, Br, Bc)


@pytest.mark.parametrize("warps", [1, 2, 4, 8])
def test_split_q_needs_no_exchange_between_warps(warps):
    v = w.warp_partition_view(128, 64, 64, warps)
    k, q = v["split-K"], v["split-Q"]
    assert q["exchange_written"] == q["exchange_read"] == q["barriers"] == 0
    assert k["exchange_written"] == warps * (128 * 64 + 2 * 128)
    # every element of S has one owner; split-K's columns, split-Q's rows
    assert np.bincount(k["owner_S"].ravel()).tolist() == [128 * 64 // warps] * warps
    assert (k["owner_S"][0] == k["owner_S"][-1]).all()            # split-K: by column
    assert (q["owner_S"][:, 0] == q["owner_S"][:, -1]).all()      # split-Q: by row
    assert (q["owner_O"] == q["owner_S"][:, :1]).all()
    with pytest.raises(FlashsimError):
        w.warp_partition_view(100, 64, 64, 8)


# ------------------------------------------------------------------ notebook 07: the paper

def test_figure2_versions_are_labelled_and_kept_apart():
    v2, neurips = papers.FLASHATTENTION_FIGURE2_ARXIV_V2, papers.FLASHATTENTION_FIGURE2_NEURIPS
    assert (v2["standard"]["hbm_rw_gb"], v2["standard"]["runtime_ms"],
            v2["flash"]["runtime_ms"]) == (40.3, 41.7, 7.3)
    assert (neurips["standard"]["hbm_rw_gb"], neurips["standard"]["runtime_ms"],
            neurips["flash"]["runtime_ms"]) == (35.3, 35.1, 11.7)
    assert "v2" in v2["source"] and "NeurIPS" in neurips["source"]
    assert "NeurIPS" not in v2["source"]
    text = backward.format_figure2(backward.figure2())
    assert "arXiv v2" in text and "NeurIPS 2022" in text
    # the GFLOP gap, from the numbers: ours 12 and 14 units of N^2 d B H, the paper's ~1
    fig = backward.figure2()
    rows = {r["algorithm"]: r for r in fig["rows"]}
    assert rows["standard"]["flops"] == 12 * fig["flop_units"]
    assert rows["flash1"]["flops"] == 14 * fig["flop_units"]
    assert 0.9 < 66.6e9 / fig["flop_units"] < 1.1


def test_notebook_07_quotes_each_version_under_its_own_name():
    md = _markdown(ROOT / "notebooks" / "07_recomputation.ipynb")
    for sentence in re.split(r"(?<=[.)])\s", md):
        if "40.3" in sentence and "35.3" not in sentence:
            assert "NeurIPS" not in sentence
        if "35.3" in sentence and "40.3" not in sentence:
            assert "arXiv" not in sentence
    assert "arXiv" in md and "NeurIPS" in md and "factor of about 12" in md


def test_docs_list_every_notebook():
    text = (ROOT / "docs" / "notebooks.md").read_text()
    rows = re.findall(r"^\| `(\d\d_\w+)\.ipynb` \|", text, flags=re.M)
    assert sorted(rows) == [p.stem for p in NOTEBOOKS]
    # no count to go stale as notebooks are added (it once said five of seven)
    assert not re.search(r"\b(Five|Six|Seven|Eight|Nine|Ten|Eleven|Twelve) notebooks", text)


# ------------------------------------------------------------------ notebooks stay clean

EXTRA_KEYS = "metadata.language_info"


def test_setup_installs_nbstripout_as_a_git_filter():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^notebooks = \[(.*)\]$", pyproject, flags=re.M).group(1)
    assert "nbstripout" in extra
    readme = (ROOT / "README.md").read_text()
    setup = next(line for line in readme.splitlines() if "[notebooks]" in line
                 and line.startswith("python3 -m venv"))
    assert "nbstripout --install" in setup
    assert f'git config filter.nbstripout.extrakeys "{EXTRA_KEYS}"' in setup
    attrs = (ROOT / ".gitattributes").read_text()
    assert "*.ipynb filter=nbstripout" in attrs


@pytest.fixture(scope="module")
def stripped(tmp_path_factory) -> dict:
    """Every notebook as JupyterLab's autosave writes it (outputs, execution counts, kernel
    and language metadata, widget state), then put through the filter's nbstripout, one
    process for all of them (each start costs about 2 s): ``{name: the bytes it leaves}``."""
    if shutil.which("nbstripout") is None:
        pytest.skip("nbstripout is in the notebooks extra")
    folder = tmp_path_factory.mktemp("saved")
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        nb["metadata"]["language_info"] = {"name": "python", "version": "3.12.3"}
        nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
        for k, cell in enumerate(nb["cells"]):
            cell["metadata"] = {"scrolled": True, "execution": {"iopub.status.busy": "now"}}
            if cell["cell_type"] == "code":
                cell["execution_count"] = k
                cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x\n"]}]
        (folder / path.name).write_text(json.dumps(nb, indent=1))
    subprocess.run(["nbstripout", "--extra-keys", EXTRA_KEYS,
                    *(str(folder / p.name) for p in NOTEBOOKS)], capture_output=True, check=True)
    return {p.name: (folder / p.name).read_text() for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_what_jupyterlab_saves_strips_back_to_the_committed_file(path, stripped):
    """The git filter the README installs must turn what JupyterLab saves back into the
    committed bytes, so ``git status`` stays clean."""
    assert stripped[path.name] == path.read_text()
