"""The docs site: ``mkdocs build --strict`` passes and the site holds every notebook with
its figures, every page of docs/ and an API page per public module.

The notebooks are not executed again here: docs/hooks.py reuses the copies the notebook
tests executed in this session (docs/notebook_run.py), or executes those not yet run.
Without MkDocs (the ``docs`` extra) the build test skips, except in CI (the ``CI``
variable set), where it fails.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "build" / "notebooks"      # where docs/notebook_run.py keeps them


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it")
    pytest.skip(reason)


def test_a_panel_shows_its_picture_to_static_renderers():
    pytest.importorskip("ipywidgets")
    from flashsim.views import widgets
    panel = widgets.sram_panel(seq_len=1024, head_dim=64, sram=64 * 1024)
    panel.controls["sram"].value = 2**17                 # the picture moves on: so does the PNG
    bundle = panel._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == panel.widget.model_id
    assert base64.b64decode(bundle["image/png"]) == panel.image.value == panel.png()


def _outputs(notebook: pathlib.Path) -> list[dict]:
    cells = json.loads(notebook.read_text())["cells"]
    return [o.get("data", {}) for c in cells if c["cell_type"] == "code" for o in c["outputs"]]


def _png(data: dict) -> str:
    return "".join(data["image/png"]).replace("\n", "")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module's tests."""
    if importlib.util.find_spec("mkdocs") is None:
        _missing("MkDocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


@pytest.mark.slow
def test_site_holds_every_notebook_with_its_figures(site):
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    for source in notebooks:
        page = (site / "notebooks" / source.stem / "index.html").read_text()
        outputs = _outputs(EXECUTED / source.name)
        widgets = [d for d in outputs if "application/vnd.jupyter.widget-view+json" in d]
        assert all("image/png" in d for d in widgets), f"{source.name}: a widget without its PNG"
        figures = [_png(d) for d in outputs if "image/png" in d]
        missing = [i for i, png in enumerate(figures) if png not in page]
        assert not missing, f"{source.name}: figures {missing} of {len(figures)} not on its page"
        if "_panel(" in source.read_text() or "plt." in source.read_text():
            assert figures, f"{source.name} draws, but its executed copy has no figure"
        assert "Traceback" not in page, source.name


@pytest.mark.slow
def test_site_holds_every_page_and_an_api_page_per_module(site):
    readme = (ROOT / "README.md").read_text().splitlines()
    sentence = next(line for line in readme if line and not line.startswith(("#", "!", "<")))
    assert sentence.strip("*").split("`")[0][:40] in (site / "index.html").read_text()   # README is home
    for page in (ROOT / "docs").glob("*.md"):
        assert (site / page.stem / "index.html").exists(), page.name
    for package in ("flashsim", "gpu_kernels"):            # every public module, found here
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            if any(p.startswith("_") for p in parts):
                continue
            html = (site / "api" / ".".join(parts) / "index.html").read_text()
            assert 'class="doc doc-' in html, f"no API docs rendered for {'.'.join(parts)}"


def test_a_stored_copy_is_what_executed_gives_back(tmp_path, monkeypatch, notebook_run):
    """What the browser test keeps (``store``) is reused by the docs build's ``executed``
    (nothing executed again) while its source is unchanged, and not once it changes; a copy
    that is not a valid notebook is refused and nothing is written."""
    import nbformat

    monkeypatch.setattr(notebook_run, "EXECUTED", tmp_path / "executed")
    source = tmp_path / "nb.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 +")])   # would raise
    nbformat.write(nb, source)
    ran = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "1 + 1", execution_count=1,
        outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)])])
    copy = notebook_run.store(source, ran)
    assert notebook_run.executed(source, after=0.0) == copy
    assert nbformat.read(copy, as_version=4).cells[0].outputs[0]["data"]["text/plain"] == "2"
    with pytest.raises(nbformat.ValidationError):
        notebook_run.store(source, {"cells": [{"cell_type": "code"}]})
    assert sorted(p.name for p in copy.parent.iterdir()) == [".nb.ipynb.lock", "nb.ipynb"]
    source.write_text(source.read_text() + " ")                  # the source changed
    with pytest.raises(notebook_run.CellExecutionError):         # so it is executed: and fails
        notebook_run.executed(source, after=0.0)
