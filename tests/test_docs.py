"""Docs that cannot go stale: the measurements page is generated from the committed data."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_measurements_page_matches_the_data():
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "make_measurements.py"), "--check"])
    assert done.returncode == 0, "run: python docs/make_measurements.py"


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in ci.splitlines() if "pytest" in line).strip()
    assert test_command in readme
