"""Every notebook in notebooks/ is a test: it is executed headless and fails at its first
failing cell (the notebooks assert what they show); the ones the browser test runs in
JupyterLab are executed and checked there instead, when it runs.

Execution goes through docs/notebook_run.py, which keeps the executed copy for the docs
site: the docs test (tests/test_docs_site.py) then builds the site without executing the
notebooks again, whichever of the two runs first. This session's start time goes into the
environment so that the ``mkdocs build`` the docs test starts reuses only copies executed
in this session.

Tests run in parallel (pytest-xdist, ``-n auto --dist loadfile`` in pyproject.toml: a
file's tests share a worker, so a module-scoped fixture such as a compile or a JupyterLab
server is built once; ``--dist loadgroup`` is not used: with pytest 9.2 it silently stops
grouping, pytest-xdist issue #1386). A notebook that a notebook test and the docs build
both want is executed once: docs/notebook_run.py locks it, and the second reuses the copy;
one that the browser test runs in JupyterLab is executed there only.
A test that times what a user sees takes the machine to itself with the ``quiet`` fixture.

Time on a 2-core CI machine: the workers take files in the order of ``FIRST`` (then the rest
in collection order; ``--no-loadscope-reorder`` in pyproject.toml keeps xdist from sorting
files by their number of tests): the notebooks first, so both workers execute them and the
docs build reuses them (else it executes every one itself, serially, on one worker); then
the browser test, the longest file, so that it does not start last and leave the other
worker idle; then files of short tests, longest first, which the other worker runs while
the browser test's ``quiet`` slider moves wait for the test running there to end; the docs
build (one test of 14 s) only after them, when the browser test is done: it reuses the
executed copies that the browser test keeps of the notebooks it runs (the notebook tests
skip those; see ``pytest_collection_finish``), and would execute any not kept yet. Compile
checks read what they check of a compile from ``gpu_kernels/compile_cache.json`` (committed;
a compile it lacks is run), and a variant that several files compile is compiled once per
session: ``FLASHSIM_CUBIN_CACHE`` names a folder where ``gpu_kernels.compile.compile_cubin``
keeps each result under the hash of what it compiled.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import pathlib
import shutil
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent

# Files that take ten seconds or more, in the order the workers should start them (seconds
# on one core of the 2-core machine, 2026-12-02). A new slow file belongs here too.
FIRST = [
    "notebooks/09_after_flashattention2.ipynb",    # 11: the paper's error table, FP8 panel
    "notebooks/06_model_vs_hardware.ipynb",        # 11
    "notebooks",                                   # the others: 2-5 each
    "tests/test_browser.py",                       # 70: JupyterLab, Chromium, six notebooks
    "tests/test_numba_kernels.py",                 # 24: kernels under the simulator
    "tests/test_widgets.py",                       # 15
    "tests/test_kernel_tiles.py",                  # 12
    "tests/test_registry.py",                      # 7
    "tests/test_learner.py",                       # 7
    "tests/test_measure.py",                       # 7
    "tests/test_cli_contract.py",                  # 8
    "tests/test_harness.py",                       # 6
    "tests/test_docs_site.py",                     # 14: mkdocs build --strict (notebooks reused)
    "tests/test_flash3.py",                        # 4 (--probe reads the compile cache)
]


@functools.cache
def _load_notebook_run():
    spec = importlib.util.spec_from_file_location("notebook_run", ROOT / "docs" / "notebook_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QUIET_ENV = "FLASHSIM_QUIET_LOCKS"
CUBIN_ENV = "FLASHSIM_CUBIN_CACHE"     # gpu_kernels.compile.CACHE_ENV (not imported here)


def pytest_configure(config):
    # setdefault: pytest-xdist workers inherit the controller's start time and lock folder.
    os.environ.setdefault("FLASHSIM_NOTEBOOKS_EXECUTED_SINCE", repr(time.time()))
    os.environ.setdefault(QUIET_ENV, tempfile.mkdtemp(prefix="flashsim-quiet-"))
    if getattr(config.option, "numprocesses", None):
        # One worker a core: NumPy's OpenBLAS would start a thread a core in each worker,
        # and the workers' threads then wait on each other (measured: 21 -> 17 s for five
        # NumPy-heavy test files on 2 cores). Set before the workers start, which import NumPy.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if CUBIN_ENV not in os.environ:         # this process made it: it removes it at the end
        config._flashsim_cubins = tempfile.mkdtemp(prefix="flashsim-cubins-")
        os.environ[CUBIN_ENV] = config._flashsim_cubins


def pytest_unconfigure(config):
    folder = getattr(config, "_flashsim_cubins", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(CUBIN_ENV, None)


def _rank(item) -> int:
    path = item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else ""
    for i, name in enumerate(FIRST):
        if path == name or path.startswith(name + "/"):
            return i
    return len(FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)                   # stable: a file's tests keep their order


@functools.cache
def _locks():
    """This process's two lock files, shared by the session's workers: "machine", held
    shared by every running test and exclusive by a quiet one, and "turn", which a quiet
    test holds while it waits, so that tests starting meanwhile wait behind it."""
    folder = pathlib.Path(os.environ[QUIET_ENV])
    return open(folder / "machine", "a"), open(folder / "turn", "a")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    machine, turn = _locks()
    fcntl.flock(turn, fcntl.LOCK_EX)          # behind a quiet test that is waiting
    fcntl.flock(turn, fcntl.LOCK_UN)
    fcntl.flock(machine, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(machine, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet():
    machine, turn = _locks()
    fcntl.flock(machine, fcntl.LOCK_UN)       # so two quiet tests cannot wait on each other
    fcntl.flock(turn, fcntl.LOCK_EX)
    fcntl.flock(machine, fcntl.LOCK_EX)       # every other worker's running test has ended
    try:
        yield
    finally:
        fcntl.flock(machine, fcntl.LOCK_SH)
        fcntl.flock(turn, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def notebook_run():
    """docs/notebook_run.py: the notebooks' executed copies, shared with the docs build."""
    return _load_notebook_run()


def pytest_collection_finish(session):
    """The notebooks the browser test runs in JupyterLab in this session, when it runs: they
    are executed and checked there, and it keeps their executed copies, so their notebook
    tests skip rather than execute them a second time."""
    session.config._flashsim_in_browser = set()
    browser = next((i for i in session.items if i.path == ROOT / "tests" / "test_browser.py"), None)
    if browser is not None and browser.module.runs_here():
        session.config._flashsim_in_browser = {p.name for p in browser.module.browser_notebooks()}


@pytest.fixture(scope="session")
def quiet():
    """``with quiet():`` runs its body while no other test of the session runs (the other
    workers wait): for what measures time as a user would see it."""
    return _quiet


def pytest_collect_file(file_path, parent):
    if (file_path.suffix == ".ipynb" and file_path.parent == ROOT / "notebooks"
            and not parent.config.getoption("nbmake", default=False)):   # nbmake collects them
        return NotebookFile.from_parent(parent, path=file_path)
    return None


class NotebookFile(pytest.File):
    def collect(self):
        yield NotebookItem.from_parent(self, name=self.path.name)


class NotebookItem(pytest.Item):
    def runtest(self):
        if self.path.name in getattr(self.config, "_flashsim_in_browser", ()):
            pytest.skip("executed and checked in JupyterLab by tests/test_browser.py this session")
        run = _load_notebook_run()
        run.executed(self.path, after=run.since())

    def repr_failure(self, excinfo, style=None):
        if type(excinfo.value).__name__ == "CellExecutionError":
            return str(excinfo.value)             # the failing cell and its traceback
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, f"notebook {self.path.name}"
