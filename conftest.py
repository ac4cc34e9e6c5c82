"""Every notebook in notebooks/ is a test: it is executed headless and fails at its first
failing cell (the notebooks assert what they show).

Execution goes through docs/notebook_run.py, which keeps the executed copy for the docs
site: the docs test (tests/test_docs_site.py) then builds the site without executing the
notebooks again, whichever of the two runs first. This session's start time goes into the
environment so that the ``mkdocs build`` the docs test starts reuses only copies executed
in this session.

Tests run in parallel (pytest-xdist, ``-n auto --dist loadfile`` in pyproject.toml: a
file's tests share a worker, so a module-scoped fixture such as a compile or a JupyterLab
server is built once; ``--dist loadgroup`` is not used: with pytest 9.2 it silently stops
grouping, pytest-xdist issue #1386). A notebook that a notebook test and the docs build
both want is executed once: docs/notebook_run.py locks it, and the second reuses the copy.
A test that times what a user sees takes the machine to itself with the ``quiet`` fixture.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import pathlib
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent


@functools.cache
def _load_notebook_run():
    spec = importlib.util.spec_from_file_location("notebook_run", ROOT / "docs" / "notebook_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QUIET_ENV = "FLASHSIM_QUIET_LOCKS"


def pytest_configure(config):
    # setdefault: pytest-xdist workers inherit the controller's start time and lock folder.
    os.environ.setdefault("FLASHSIM_NOTEBOOKS_EXECUTED_SINCE", repr(time.time()))
    os.environ.setdefault(QUIET_ENV, tempfile.mkdtemp(prefix="flashsim-quiet-"))


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
        run = _load_notebook_run()
        run.executed(self.path, after=run.since())

    def repr_failure(self, excinfo, style=None):
        if type(excinfo.value).__name__ == "CellExecutionError":
            return str(excinfo.value)             # the failing cell and its traceback
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, f"notebook {self.path.name}"
