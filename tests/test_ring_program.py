"""benchmarks/ring_attention.py (``python -m benchmarks.ring_attention``), the program the two-GPU check runs, exercised on the CPU:
two processes, gloo, tiny shapes in float64. PyTorch is not a flashsim dependency: without
it this test is skipped."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ring_program_on_cpu_with_gloo(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "ring.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.ring_attention", "--backend", "gloo",
         "--device", "cpu", "--nproc", "2", "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["skipped"] == [] and doc["provenance"]["backend"] == "gloo"
    seen = {(p["schedule"], p["causal"]) for p in doc["points"]}
    assert seen == {(s, c) for s in ("ring", "zigzag", "striped", "allgather")
                    for c in (False, True)}
    for p in doc["points"]:
        check = p["check"]
        assert check["check_ok"] and check["max_abs_err_ring_vs_float64"] < 1e-12
        assert check["max_abs_diff_ring_vs_single_gpu"] < 1e-12
        # what the ranks handed to the communicator is what flashsim counts on the links
        assert p["measured"]["link_bytes_sent_per_run"] == p["model"]["link_bytes"] > 0
        steps = p["measured"]["per_rank"][0]["ring_step_ms"]
        assert len(steps) == 2 + (p["schedule"] == "allgather")    # P steps (+ the gather)
