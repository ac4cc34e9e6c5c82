"""Execute the notebooks headless, once, and keep the executed copies for the docs site.

Two consumers need every notebook executed: the notebook tests (``conftest.py`` at the
repository root makes each ``notebooks/*.ipynb`` a test) and the docs site (``docs/hooks.py``
renders the notebooks with their outputs). Executing them twice would double the
notebooks' share of CI time, so both call :func:`executed`: whichever runs first executes
the notebook and writes ``build/notebooks/NAME.ipynb``; the other reuses that copy when it
was executed from the same source (its SHA-256 is stored in the copy's metadata) after
``since``. A third, the browser test (tests/test_browser.py), runs some notebooks in
JupyterLab; it keeps what JupyterLab executed as their copies (:func:`store`), and when it
runs, the notebook tests leave those notebooks to it. The test session puts its start time
in ``FLASHSIM_NOTEBOOKS_EXECUTED_SINCE``, which the ``mkdocs build`` it starts inherits; a
``mkdocs`` started by hand puts its own start time there (docs/hooks.py), so it executes
every notebook once.

Executed copies keep no widget state, so static renderers fall back from a widget view to
the PNG a panel puts beside it (``flashsim.views.widgets.Panel._repr_mimebundle_``).
A failing cell raises ``CellExecutionError`` (its message holds the cell and the
traceback) and leaves no copy behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import tempfile

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

__all__ = ["NOTEBOOKS", "EXECUTED", "CellExecutionError", "notebooks", "executed", "store",
           "since"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
SINCE_ENV = "FLASHSIM_NOTEBOOKS_EXECUTED_SINCE"
CELL_TIMEOUT_S = 300


def notebooks() -> list[pathlib.Path]:
    """Every notebook of the tour, in reading order (their names start with the number)."""
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def since() -> float | None:
    """Executed copies written after this time (seconds since the epoch) may be reused."""
    value = os.environ.get(SINCE_ENV)
    return float(value) if value else None


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reusable(source: pathlib.Path, copy: pathlib.Path, after: float | None) -> bool:
    if after is None or not copy.exists() or copy.stat().st_mtime < after:
        return False
    meta = nbformat.read(copy, as_version=4).metadata.get("flashsim", {})
    return meta.get("source_sha256") == _digest(source)


def executed(source: pathlib.Path, after: float | None = None) -> pathlib.Path:
    """The executed copy of ``source``: reused if written after ``after`` from the same
    source, else executed now (cwd = the notebook's folder, as in JupyterLab)."""
    source = pathlib.Path(source).resolve()
    copy = EXECUTED / source.name
    EXECUTED.mkdir(parents=True, exist_ok=True)
    # One execution at a time per notebook (parallel tests, the docs build): whoever comes
    # second waits here, then reuses the copy the first wrote.
    with open(EXECUTED / f".{source.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _reusable(source, copy, after):
            return copy
        return _execute(source, copy)


def _execute(source: pathlib.Path, copy: pathlib.Path) -> pathlib.Path:
    digest = _digest(source)
    nb = nbformat.read(source, as_version=4)
    # IPC sockets in a folder of its own, not TCP: a TCP kernel binds ports its manager
    # picked and let go of, which a kernel starting at the same moment in another test
    # worker can take first ("Kernel died before replying to kernel_info": Address already
    # in use). The path is absolute: the kernel runs in the notebook's folder.
    with tempfile.TemporaryDirectory(prefix="flashsim-kernel-") as sockets:
        config = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, store_widget_state=False, config=config,
                                resources={"metadata": {"path": str(source.parent)}})
        client.execute()                   # raises CellExecutionError at the first failing cell
    return _write(nb, digest, copy)


def store(source: pathlib.Path, nb: dict) -> pathlib.Path:
    """Keep ``nb``, ``source`` executed elsewhere (the browser test's JupyterLab: every cell
    run, none raised), as its executed copy, for :func:`executed` to reuse."""
    source, nb = pathlib.Path(source).resolve(), nbformat.from_dict(nb)
    nbformat.validate(nb)                  # raises ValidationError: nothing written
    EXECUTED.mkdir(parents=True, exist_ok=True)
    with open(EXECUTED / f".{source.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _write(nb, _digest(source), EXECUTED / source.name)


def _write(nb, digest: str, copy: pathlib.Path) -> pathlib.Path:
    nb.metadata["flashsim"] = {"source_sha256": digest}
    tmp = copy.with_name(f".{copy.name}.{os.getpid()}")     # atomic: readers never see half
    nbformat.write(nb, tmp)
    os.replace(tmp, copy)
    return copy
