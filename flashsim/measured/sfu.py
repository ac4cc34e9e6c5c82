"""Special-function instructions of our tensor-core kernel: flashsim's prediction, the
kernel's own count, and the comparison with Nsight Compute's (``benchmarks/sfu_check.py``
measures; this module holds no GPU code).

The prediction is the loop nest's exponential count for the kernel's tiles, one warp
instruction per 32 lanes: ``exp_ops / 32``. What the kernel really executes
(``gpu_kernels/cuda/flash2_tc.cu``), per thread block of B_r rows and per K/V block j:

* P_ij: ``ex2.approx`` on every element of the B_r x B_c tile (masked elements and, in a
  ragged last block, rows past N included), one lane each: B_r B_c / 32 instructions;
* alpha: each of the four threads that share a row computes it (the rows' statistics live
  in a quad), so a warp instruction covers 8 rows, not 32: B_r / 8 instructions;

and once per thread block, in the epilogue, one ``lg2`` (L_i) and one ``rcp`` (1 / l_i) per
8 rows: B_r / 4. So the kernel executes exp_ops / 32 plus 3 / B_c of the P part (the
quad-redundant alphas) plus the epilogue: 4.7% more at B_c = 64. The disassembly agrees:
per iteration of the main loop 2 M_T (1 + B_c / 4) MUFU.EX2 per warp (34 at d = 128 with
v3, 68 at d = 64 with v5's two m16 tiles), and 2 M_T MUFU.LG2 and MUFU.RCP in the
epilogue (the other MUFU.RCP in the SASS sit in the division's slow path, which a finite,
normal l_i never takes).
"""

from __future__ import annotations

from ..units import cdiv

LANES = 32
TOLERANCE = 0.10           # the criterion: measured within 10% of the prediction


def kv_blocks(N: int, block_rows: int, block_cols: int, causal: bool) -> list[int]:
    """K/V blocks each Q block visits (the kernel's j_end, flashsim's causal_stop_j)."""
    T_r, T_c = cdiv(N, block_rows), cdiv(N, block_cols)
    if not causal:
        return [T_c] * T_r
    return [min(T_c, cdiv(min((i + 1) * block_rows, N), block_cols)) for i in range(T_r)]


def kernel_mufu(N: int, d: int, batch: int, heads: int, causal: bool, block_rows: int,
                block_cols: int) -> dict:
    """Warp-level special-function instructions flash2_tc executes (see the module)."""
    tiles = sum(kv_blocks(N, block_rows, block_cols, causal))
    blocks = cdiv(N, block_rows)
    bh = batch * heads
    ex2 = bh * tiles * (block_rows * block_cols // LANES + block_rows // 8)
    lg2 = rcp = bh * blocks * (block_rows // 8)
    return {"ex2": ex2, "lg2": lg2, "rcp": rcp, "total": ex2 + lg2 + rcp}


def predicted(N: int, d: int, batch: int, heads: int, causal: bool, block_rows: int,
              block_cols: int) -> dict:
    """flashsim's exponentials for the kernel's tiles, and the instructions they make."""
    from ..plan import plan
    rep = plan("flash2", N, d, batch=batch, heads=heads, dtype="fp16", causal=causal,
               block_rows=block_rows, block_cols=block_cols, sram="1GiB").count()
    return {"exp_ops": rep.exp_ops, "instructions": rep.exp_ops / LANES}


def measured_mufu(point: dict) -> tuple[float | None, str | None]:
    """The MUFU warp instructions a point recorded: the per-opcode count when ncu gave it,
    else the XU pipe's instruction count (which may hold other XU work too)."""
    per_opcode = point.get("per_opcode") or {}
    mufu = [v for k, v in per_opcode.items() if k.upper().startswith("MUFU")]
    if mufu:
        return float(sum(mufu)), "sass__inst_executed_per_opcode (MUFU)"
    for name in ("smsp__inst_executed_pipe_xu.sum", "sm__inst_executed_pipe_xu.sum"):
        v = (point.get("metrics") or {}).get(name)
        if isinstance(v, (int, float)):
            return float(v), name
    return None, None


def compare(data: dict, tolerance: float = TOLERANCE) -> list[dict]:
    """One row per measured point: measured instructions, flashsim's prediction
    (exp_ops / 32), the kernel's exact count, and whether measured is within
    ``tolerance`` of the prediction."""
    rows = []
    for p in data["points"]:
        shape = (p["N"], p["d"], p["batch"], p["heads"], p["causal"], p["block_rows"],
                 p["block_cols"])
        pred = predicted(*shape)
        exact = kernel_mufu(*shape)
        got, source = measured_mufu(p)
        ratio = None if got is None else got / pred["instructions"]
        rows.append({"N": p["N"], "d": p["d"], "batch": p["batch"], "heads": p["heads"],
                     "causal": p["causal"], "version": p.get("version"),
                     "block_rows": p["block_rows"], "block_cols": p["block_cols"],
                     "exp_ops": pred["exp_ops"], "predicted": pred["instructions"],
                     "kernel_exact": exact["total"], "measured": got, "source": source,
                     "ratio": ratio,
                     "within": ratio is not None and abs(ratio - 1) <= tolerance})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'N':>6} {'d':>4} {'causal':>6} {'v':>2} {'exp_ops/32':>13} {'kernel':>13} "
             f"{'measured':>13} {'meas/pred':>9}"]
    for r in rows:
        m = "-" if r["measured"] is None else f"{r['measured']:,.0f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"{r['N']:>6} {r['d']:>4} {str(r['causal']):>6} {r['version'] or '':>2} "
                     f"{r['predicted']:>13,.0f} {r['kernel_exact']:>13,} {m:>13} {ratio:>9}")
    return "\n".join(lines)
