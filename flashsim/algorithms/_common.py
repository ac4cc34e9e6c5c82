"""Pieces the three algorithms share: block arithmetic, causal bounds, safe exponentials."""

from __future__ import annotations

import math

import numpy as np

# fp32: what tensor cores (and these kernels' CUDA-core code) accumulate in, whatever the
# data type, so an accumulator in registers takes 4 bytes an element.
ACC_BYTES = 4
PLACEMENTS = ("two-level", "registers")


def registers(plan, table: dict) -> dict:
    """The register table to :func:`flashsim.nest.place` a nest with: ``table`` when the
    plan places buffers as a GPU kernel does (``placement="registers"``), empty (every buffer
    in SRAM, the paper's two-level model) otherwise."""
    return dict(table) if getattr(plan, "placement", "two-level") == "registers" else {}


def largest_square_block(n: int, sram: int, working_set) -> int:
    """FlashAttention-2's block rule: the largest B with ``working_set(B) <= sram`` (the
    working set grows with B), rounded down to a multiple of 16 (tensor-core friendly) when
    B >= 16, then capped at N."""
    lo, hi = 0, math.isqrt(sram)            # B^2 elements of >= 1 byte never fit past this
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if working_set(mid) <= sram:
            lo = mid
        else:
            hi = mid - 1
    if lo >= 16:
        lo -= lo % 16
    return min(lo, n)


def block_extent(k, block: int, n: int):
    """Rows in block ``k`` of an ``n``-row dimension cut into ``block``-row blocks (the last
    one may be short). ``k`` may be a NumPy array."""
    return np.minimum((np.asarray(k) + 1) * block, n) - np.asarray(k) * block


def causal_stop_j(i: int, block_rows: int, block_cols: int, n: int) -> int:
    """One past the last K/V block j that Q block i sees under a causal mask.

    Tile (i, j) is fully masked when its first column is after its last row:
    ``j*B_c > min((i+1)*B_r, N) - 1``."""
    last_row = min((i + 1) * block_rows, n) - 1
    return last_row // block_cols + 1


def causal_start_i(j: int, block_rows: int, block_cols: int) -> int:
    """The first Q block i that K/V block j reaches under a causal mask (same rule)."""
    return (j * block_cols) // block_rows


def apply_causal_mask(S: np.ndarray, rows: tuple[int, int], cols: tuple[int, int]) -> None:
    """Set S[r, c] = -inf where key c comes after query r (global indices), in place."""
    r = np.arange(rows[0], rows[1])[:, None]
    c = np.arange(cols[0], cols[1])[None, :]
    S[..., c > r] = -np.inf


def exp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """exp(a - b), reading exp(-inf - (-inf)) as 0: a row with nothing seen yet (or a tile
    row that the mask hides entirely) contributes nothing."""
    with np.errstate(invalid="ignore"):
        out = np.exp(a - b)
    return np.where(np.isneginf(a), 0.0, out)


def matmul_flops(a: str, b: str, d: int):
    """FLOPs of an (a x d) @ (d x b) product, 2 per multiply-add, from block extents."""
    return lambda ext: 2 * ext(a) * ext(b) * d
