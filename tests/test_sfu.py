"""Special-function instructions of the tensor-core kernel: the kernel's exact count stays
within 10% of flashsim's exp_ops / 32 at the measured shapes, and, when the H200 data are
committed (benchmarks/sfu_check.py), so does the measured count."""

from importlib import resources

import json
import pytest

from flashsim.measured import sfu

SHAPES = [(N, d, causal) for d in (64, 128) for N in (1024, 4096) for causal in (False, True)]


@pytest.mark.parametrize("N,d,causal", SHAPES)
def test_kernel_count_is_exp_ops_over_32_plus_the_quad_redundant_alphas(N, d, causal):
    Br, Bc = 128, 64
    pred = sfu.predicted(N, d, 1, 4, causal, Br, Bc)
    exact = sfu.kernel_mufu(N, d, 1, 4, causal, Br, Bc)
    tiles = sum(sfu.kv_blocks(N, Br, Bc, causal))
    # P: the same elements; alpha: 4 lanes per row instead of 1; plus lg2 and rcp per row / 8
    assert exact["ex2"] - pred["instructions"] == pytest.approx(4 * tiles * Br * 3 / 32)
    assert exact["lg2"] == exact["rcp"] == 4 * (N // Br) * Br // 8
    assert abs(exact["total"] / pred["instructions"] - 1) <= sfu.TOLERANCE
    assert exact["total"] > pred["instructions"]


def test_compare_reads_per_opcode_counts_before_the_xu_pipe():
    shape = dict(N=1024, d=64, batch=1, heads=4, causal=False, block_rows=128,
                 block_cols=64, version=5)
    exact = sfu.kernel_mufu(1024, 64, 1, 4, False, 128, 64)["total"]
    data = {"points": [
        dict(shape, per_opcode={"MUFU.EX2": exact - 10, "MUFU.LG2": 5, "MUFU.RCP": 5,
                                "FFMA": 1e9},
             metrics={"smsp__inst_executed_pipe_xu.sum": 3 * exact}),
        dict(shape, per_opcode={}, metrics={"smsp__inst_executed_pipe_xu.sum": 3 * exact}),
        dict(shape, per_opcode={}, metrics={}),
    ]}
    rows = sfu.compare(data)
    assert rows[0]["measured"] == exact and rows[0]["within"]
    assert rows[0]["source"].startswith("sass__inst_executed_per_opcode")
    assert rows[1]["measured"] == 3 * exact and not rows[1]["within"]
    assert rows[2]["measured"] is None and not rows[2]["within"]
    assert "meas/pred" in sfu.format_rows(rows)


def _committed():
    path = resources.files("flashsim.measured").joinpath("data/sfu_h200.json")
    return json.loads(path.read_text()) if path.is_file() else None


@pytest.mark.skipif(_committed() is None, reason="no sfu_h200.json committed yet "
                    "(benchmarks/sfu_check.py run on the H200)")
def test_measured_special_function_instructions_within_10_percent():
    data = _committed()
    rows = sfu.compare(data)
    assert rows and all(r["measured"] is not None for r in rows)
    assert all(r["within"] for r in rows), sfu.format_rows(rows)
