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


def test_clock_log_without_nvml_logs_nothing(monkeypatch):
    from benchmarks.common import ClockLog

    monkeypatch.setitem(sys.modules, "pynvml", None)       # import pynvml fails
    log = ClockLog().start()
    log.stop()
    assert log.sample() is None
    assert log.as_dict()["samples"] == [] and log.as_dict()["source"].startswith("none")


def test_clock_log_samples_nvml_in_a_thread(monkeypatch):
    """A stand-in pynvml whose SM clock drops: the thread's samples carry it, host-stamped,
    with the reasons bitmask and the names of its bits."""
    import time
    import types

    from benchmarks.common import ClockLog

    sm = iter([1980, 1980, 1200] + [1200] * 10_000)
    nv = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: "gpu0", NVML_CLOCK_SM=0,
        NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetClockInfo=lambda h, which: next(sm) if which == 0 else 3201,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x8,
        nvmlDeviceGetPowerUsage=lambda h: 700_000, nvmlDeviceGetTemperature=lambda h, s: 60,
        nvmlClocksThrottleReasonHwSlowdown=0x8, nvmlClocksThrottleReasonGpuIdle=0x1)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    log = ClockLog(period_s=0.001).start()
    time.sleep(0.05)
    log.stop()
    d = log.as_dict()
    assert d["source"] == "NVML" and d["reason_bits"] == {"GpuIdle": 1, "HwSlowdown": 8}
    s = d["samples"]
    assert len(s) >= 3 and [x[1] for x in s[:3]] == [1980, 1980, 1200]
    assert all(x[2:] == [3201, 8, 700.0, 60] for x in s)
    assert all(a[0] <= b[0] for a, b in zip(s, s[1:]))      # host times, in order
