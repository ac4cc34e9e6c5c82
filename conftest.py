"""Every notebook in notebooks/ is a test: it is executed headless and fails at its first
failing cell (the notebooks assert what they show).

Execution goes through docs/notebook_run.py, which keeps the executed copy for the docs
site: the docs test (tests/test_docs_site.py) then builds the site without executing the
notebooks again, whichever of the two runs first. This session's start time goes into the
environment so that the ``mkdocs build`` the docs test starts reuses only copies executed
in this session.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent


@functools.cache
def _load_notebook_run():
    spec = importlib.util.spec_from_file_location("notebook_run", ROOT / "docs" / "notebook_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    # setdefault: pytest-xdist workers inherit the controller's start time.
    os.environ.setdefault("FLASHSIM_NOTEBOOKS_EXECUTED_SINCE", repr(time.time()))


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
