"""The benchmark scripts as a package (benchmarks/), without a GPU: each runs as
``python -m benchmarks.NAME``, measures through the one harness, and ``benchmarks.all`` runs
every one of them."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                 if p.stem not in ("__init__", "common", "all"))


def test_the_scripts():
    assert SCRIPTS == ["backward_h200", "core_speed", "cupy_h200", "decode_h200", "hopper_h200",
                       "masks_h200", "measure_all", "ncu_sweep", "numba_h200", "ring_attention",
                       "sfu_check", "slider_latency", "sm_placement"]


@pytest.mark.parametrize("name", SCRIPTS + ["all"])
def test_runs_as_a_module_and_takes_out(name):
    """``--help`` imports the script as ``python -m`` does (no sys.path games, no GPU)."""
    args = ["run", "--help"] if name in ("ncu_sweep", "sfu_check") else ["--help"]
    res = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--out" in res.stdout


@pytest.mark.parametrize("name", SCRIPTS + ["all", "common"])
def test_measures_through_the_harness(name):
    text = (ROOT / "benchmarks" / f"{name}.py").read_text()
    assert "sys.path.insert" not in text and "_provenance" not in text
    if name not in ("common",):
        assert "from gpu_kernels import harness" in text or "from gpu_kernels.harness import" in text


def test_all_runs_every_script():
    from benchmarks import all as run_all

    args = argparse.Namespace(out="/tmp/x", quick=False, ncu=True, cpu=True, scale=1.0)
    names = [s[0] for s in run_all.steps(args)]
    # ring_attention needs two GPUs, hopper_h200 and masks_h200 six minutes each: their own
    # commands (docstrings)
    assert set(names) == set(SCRIPTS) - {"ring_attention", "hopper_h200", "masks_h200"} | {"gpu_tests"}
    args.ncu = args.cpu = False
    assert {s[0] for s in run_all.steps(args)} == {"gpu_tests", "sm_placement", "numba_h200",
                                                    "cupy_h200", "backward_h200"}
    total = sum(limit for _, _, limit, _ in run_all.steps(args))
    assert total <= 10 * 60           # the whole GPU run fits one 10-minute command
