"""Pieces the three algorithms share: block arithmetic, causal bounds, safe exponentials,
and the loop-nest pieces several nests build alike (a tiled product, the backward's K/V
loop, runs of block loads)."""

from __future__ import annotations

import math

import numpy as np

from ..nest import Alloc, Load, Loop, Store
from ..units import cdiv

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


def block_last(pos: np.ndarray, block: int) -> np.ndarray:
    """The last entry of each ``block``-row block of ``pos`` (the last one may be short)."""
    n = len(pos)
    return pos[np.minimum(np.arange(-(-n // block)) * block + block, n) - 1]


def visible_stop_j(q_pos, k_pos, block_rows: int, block_cols: int) -> np.ndarray:
    """For each Q block i: one past the last K/V block j it sees under a causal mask, with
    queries and keys at global positions ``q_pos``, ``k_pos`` (each ascending). Tile (i, j)
    is fully masked when its first key comes after its last query, so the tiles Q block i
    sees are a prefix ``j < stop``. With ``q_pos = k_pos = 0..N-1`` this is
    :func:`causal_stop_j`; on a device of context parallelism the positions are its slice's."""
    return np.searchsorted(np.asarray(k_pos)[::block_cols], block_last(np.asarray(q_pos),
                                                                       block_rows), "right")


def visible_start_i(q_pos, k_pos, block_rows: int, block_cols: int) -> np.ndarray:
    """For each K/V block j: the first Q block i that sees any of its keys (the same rule as
    :func:`visible_stop_j`, read the other way; :func:`causal_start_i` for one device)."""
    return np.searchsorted(block_last(np.asarray(q_pos), block_rows),
                           np.asarray(k_pos)[::block_cols], "left")


def apply_position_mask(S: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray) -> None:
    """Set S[r, c] = -inf where key c's position comes after query r's, in place.
    S: (..., len(q_pos), len(k_pos))."""
    S[..., np.asarray(k_pos)[None, :] > np.asarray(q_pos)[:, None]] = -np.inf


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


def product_kernel(plan, label: str, acc: str, into: str, step: tuple):
    """A kernel of a tiled product with d columns, one thread block per block of ``acc``'s
    index (its last letter: ``"O_i"`` is over i, ``"dV_j"`` over j): the accumulator
    (rows x d, in SRAM) starts at 0, the other index's blocks stream through ``step`` (its
    loads and the product), and the accumulator is written once to ``into``.
    Bytes: what ``step`` loads, for every pair of blocks, plus ``into`` written once."""
    outer = acc[-1]
    inner = "j" if outer == "i" else "i"
    size, N = {"i": plan.block_rows, "j": plan.block_cols}, plan.seq_len
    return Loop(outer, size[outer], N, label=label, parallel=True, body=(
        Alloc(acc, outer, plan.head_dim, plan.elem_bytes, 0.0),
        Loop(inner, size[inner], N, body=step),
        Store(acc, into, rows=outer),
    ))


def kv_block_reach(plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each K/V block j of a one-device plan: (rows(j), tiles(j), c(j)), the query rows
    and Q blocks that reach it (under a causal mask those from Q block
    ``first = floor(j B_c / B_r)`` on, :func:`causal_start_i`; all N and T_r otherwise) and
    its width B_c (the last one may be short). The closed forms sum these."""
    N, Br, Bc = plan.seq_len, plan.block_rows, plan.block_cols
    j = np.arange(cdiv(N, Bc))
    first = j * Bc // Br if plan.causal else np.zeros(len(j), dtype=np.int64)
    return N - first * Br, cdiv(N, Br) - first, block_extent(j, Bc, N)


def kv_outer_loop(plan, n_kv: int, label: str, inner, parallel: bool = False):
    """The outer loop of a FlashAttention backward over K/V blocks j (``n_kv`` keys): K_j
    and V_j loaded once, dK_j and dV_j (B_c x d) accumulated in SRAM over ``inner`` (the Q
    blocks) and written once. Bytes: K, V read and dK, dV written once each."""
    d, b = plan.head_dim, plan.elem_bytes
    return Loop("j", plan.block_cols, n_kv, label=label, parallel=parallel, body=(
        *block_loads("j", "K", "V"),
        Alloc("dK_j", "j", d, b, 0.0),
        Alloc("dV_j", "j", d, b, 0.0),
        inner,
        Store("dK_j", "dK", rows="j"),
        Store("dV_j", "dV", rows="j"),
    ))


def block_loads(var: str, *names: str) -> tuple:
    """Loads of block ``var`` of each tensor named: ``block_loads("i", "Q", "O")`` is
    ``Load("Q_i", "Q", rows="i"), Load("O_i", "O", rows="i")``."""
    return tuple(Load(f"{name}_{var}", name, rows=var) for name in names)


def paper_blocks(n: int, d: int, sram: int, b: int, working_set, next_bc) -> tuple[int, int]:
    """FlashAttention's block rule: B_c = ceil(M / 4d) (M in elements), B_r = min(B_c, d),
    capped at N; then B_c lowered, ``next_bc(B_r, B_c)`` at a time (B_r following it),
    until ``working_set(B_r, B_c) <= sram``. (0, 0) when nothing fits."""
    Bc = min(cdiv(sram // b, 4 * d), n)
    while Bc > 0:
        Br = min(Bc, d, n)
        if working_set(Br, Bc) <= sram:
            return Br, Bc
        Bc = next_bc(Br, Bc)
    return 0, 0
