"""FlashAttention-2 forward (Dao, 2023, Algorithm 1): outer loop over Q blocks.

Versions: one. Each Q block i is one thread block on a GPU. It keeps Q_i, the unnormalised
output O_i and the statistics m_i, l_i in SRAM while K_j, V_j stream through; the division
by l_i waits until the end (deferred rescaling), and only O and the logsumexp L are written.

Traffic per head, with b bytes per element, T_r = ceil(N/B_r) and 4-byte statistics:

    read  Q: N d b           read  K, V: C d b each     C = sum_i cols(i)
    write O: N d b           write L: 4 N
    cols(i) = N; causal: min(N, (floor((min((i+1) B_r, N) - 1) / B_c) + 1) B_c)

so without a mask K and V are read T_r times: 2 N^2 d b / B_r, which falls as B_r grows.
FLOPs: 4 d sum_i r_i cols(i), with r_i the rows of block i (4 N^2 d without a mask).
Outside the matmuls (``flashsim.nest.Compute`` says what counts), with E = sum_i r_i cols(i)
elements of S visited and R = sum_i r_i tiles(i) tile rows, tiles(i) = ceil(cols(i) / B_c):

    exponentials    E + R                    (P_ij, and alpha once per row per tile)
    non-matmul ops  5 E + (3 + d) R + (d + 2) N
                    (the O_i rescale by alpha costs d per row per tile; the division by l_i
                    and the logsumexp, d + 2 per row, come once, at the end: FlashAttention-2's
                    deferred rescaling, against FlashAttention's every tile)
SRAM working set: b (2 B_r d + 2 B_c d + B_r B_c) + 8 B_r  (Q_i, O_i, K_j, V_j, S_ij, m_i, l_i).

The same nest runs one step of context parallelism (``flashsim.context_parallel``): N_q
query rows against N_k key rows (``kv_len``) at global positions ``q_pos``, ``k_pos``, so
the causal mask and the skipped tiles follow the positions: Q block i reads the K/V blocks
j < stop(i) (``visible_stop_j``), cols(i) = min(N_k, stop(i) B_c), and a Q block that sees
no key at all is neither read nor written (so Q, O and L move R = the rows of the Q blocks
that see something, not N_q). A row that sees nothing in a block it shares gets O = 0 and
L = -inf: the empty state, which the merge of partial results ignores.
With a mask (``plan.mask``, ``flashsim.masks``) Q block i visits only its non-skipped tiles
j in visits(i) (a list, not a prefix), cols(i) = sum of their columns, tiles(i) = how many;
every Q block is still loaded and its O_i, L_i written (a row that sees nothing: O = 0,
L = -inf). With dropout (``plan.dropout`` = p) the kept entries of P_ij are scaled by
1/(1 - p) before P_ij V_j, from random numbers regenerated from (seed, row, column): no
byte more, E more operations (the scale); l_i sums P_ij undropped.
Placed as FlashAttention-2/3 kernels place it (``placement="registers"``, ``REGISTERS``):
Q_i, K_j, V_j in shared memory, b (B_r d + 2 B_c d); the S_ij tile (P_ij takes its
registers), the fp32 O_i accumulator and m_i, l_i in registers, 4 B_r B_c + 4 B_r d + 8 B_r.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FlashsimError
from ..nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES, cdiv
from ._common import (ACC_BYTES, apply_position_mask, block_extent, block_loads, exp_diff,
                      largest_square_block, matmul_flops, registers, visible_stop_j)
from ..masks import dropout_scale

# The buffers a kernel keeps in registers, with their bytes per element there.
REGISTERS = {"S_ij": ACC_BYTES, "O_i": ACC_BYTES, "m_i": STAT_BYTES, "l_i": STAT_BYTES,
             "L_i": STAT_BYTES}



def working_set_bytes(block_rows: int, block_cols: int, d: int, b: int) -> int:
    r, c = block_rows, block_cols
    return b * (2 * r * d + 2 * c * d + r * c) + 2 * STAT_BYTES * r


def placed_bytes(block_rows: int, block_cols: int, d: int, b: int) -> tuple[int, int]:
    """(shared memory, registers) at their peaks with ``REGISTERS`` (see the header)."""
    r, c = block_rows, block_cols
    return b * (r * d + 2 * c * d), ACC_BYTES * (r * c + r * d) + 2 * STAT_BYTES * r


def default_blocks(n: int, d: int, sram: int, b: int) -> tuple[int, int]:
    """B_r = B_c = the largest multiple of 16 (tensor-core friendly) whose working set fits
    in ``sram`` bytes; below 16, the largest that fits. Capped at N."""
    B = largest_square_block(n, sram, lambda B: working_set_bytes(B, B, d, b))
    return B, B


def _positions(plan, kv_len, q_pos, k_pos):
    """(N_q, N_k, q_pos, k_pos): positions only under a causal mask (0..N-1 by default)."""
    n_q = plan.seq_len
    n_k = n_q if kv_len is None else kv_len
    if not plan.causal:
        return n_q, n_k, None, None
    q_pos = np.arange(n_q) if q_pos is None else np.asarray(q_pos)
    k_pos = np.arange(n_k) if k_pos is None else np.asarray(k_pos)
    return n_q, n_k, q_pos, k_pos


def build(plan, *, kv_len: int | None = None, q_pos=None, k_pos=None) -> Nest:
    """The nest for ``plan``; ``kv_len``, ``q_pos``, ``k_pos`` for a step of context
    parallelism (see the header; by default N_k = N_q and positions 0..N-1)."""
    N, N_k, q_pos, k_pos = _positions(plan, kv_len, q_pos, k_pos)
    d, Br, Bc = plan.head_dim, plan.block_rows, plan.block_cols
    b, tau, causal = plan.elem_bytes, 1.0 / math.sqrt(plan.head_dim), plan.causal
    tensors = {
        "Q": Tensor("Q", N, d, b), "K": Tensor("K", N_k, d, b), "V": Tensor("V", N_k, d, b),
        "O": Tensor("O", N, d, b), "L": Tensor("L", N, 1, STAT_BYTES),
    }
    stop = visible_stop_j(q_pos, k_pos, Br, Bc) if causal else None
    first_i = int((stop == 0).sum()) if causal else 0     # Q blocks that see no key
    mask, p_drop = getattr(plan, "mask", None), getattr(plan, "dropout", 0.0)
    if (mask is not None or p_drop) and (kv_len is not None or q_pos is not None
                                         or k_pos is not None):
        raise FlashsimError("masks and dropout are not modelled with context parallelism")

    def s_tile(sram, ctx):
        S = tau * (sram["Q_i"] @ np.swapaxes(sram["K_j"], -1, -2))    # (.., B_r, B_c)
        if causal:
            (r0, r1), (c0, c1) = ctx.range("i"), ctx.range("j")
            apply_position_mask(S, q_pos[r0:r1], k_pos[c0:c1])
        if mask is not None:
            S[..., ~mask.visible(ctx.range("i"), ctx.range("j"), Br, Bc)] = -np.inf
        sram["S_ij"] = S

    def dropped(P, ctx):
        """P_ij with dropout: kept entries scaled by 1/(1 - p), regenerated from the seed."""
        if not p_drop:
            return P
        return P * dropout_scale(plan.dropout_seed, p_drop, ctx.range("i"), ctx.range("j"))

    def online_update(sram, ctx):
        m_i, S = sram["m_i"], sram["S_ij"]
        m_new = np.maximum(m_i, S.max(axis=-1, keepdims=True))       # running max
        P = exp_diff(S, m_new)                                       # P~_ij, unnormalised
        alpha = exp_diff(m_i, m_new)                                 # rescale old state
        sram["l_i"] = alpha * sram["l_i"] + P.sum(axis=-1, keepdims=True)
        sram["O_i"] = alpha * sram["O_i"] + dropped(P, ctx) @ sram["V_j"]
        sram["m_i"] = m_new
        sram["S_ij"] = P

    def finish(sram, ctx):
        l_i = sram["l_i"]
        with np.errstate(divide="ignore", invalid="ignore"):         # l_i = 0: saw nothing
            sram["O_i"] = np.where(l_i > 0, sram["O_i"] / l_i, 0.0)  # deferred rescale
            sram["L_i"] = sram["m_i"] + np.log(l_i)                  # logsumexp (-inf if empty)

    inner = Loop("j", Bc, N_k, label="K/V blocks streamed through SRAM",
                 stop=(lambda ctx: int(stop[ctx.idx["i"]])) if causal else None,
                 visit=(lambda ctx: mask.visited_cols(Br, Bc)[ctx.idx["i"]])   # classified
                 if mask is not None else None,                         # when first run
                 body=(
                     *block_loads("j", "K", "V"),
                     Alloc("S_ij", "i", "j", b),
                     Compute("S_ij = tau Q_i K_j^T", s_tile, matmul_flops("i", "j", d),
                             nonmatmul=lambda e: e("i") * e("j")),             # tau x
                     # max rc, subtract rc, exp rc; alpha: subtract r, exp r; l_i: r x,
                     # rc +; O_i rescale: r d x (adding P V is the matmul's accumulate)
                     Compute("m_new = max(m_i, rowmax S_ij); P_ij = exp(S_ij - m_new); "
                             "alpha = exp(m_i - m_new); l_i = alpha l_i + rowsum P_ij; "
                             "O_i = alpha O_i + P_ij V_j; m_i = m_new",
                             online_update, matmul_flops("i", "j", d),
                             exps=lambda e: e("i") * e("j") + e("i"),
                             nonmatmul=lambda e: ((4 + bool(p_drop)) * e("i") * e("j")
                                                  + 3 * e("i") + e("i") * d)),   # + dropout
                 ))
    body = (Loop("i", Br, N, label="Q blocks (one thread block each)", parallel=True,
                 start=(lambda ctx: first_i) if first_i else None, body=(
        Load("Q_i", "Q", rows="i"),
        Alloc("O_i", "i", d, b, 0.0),
        Alloc("m_i", "i", 1, STAT_BYTES, -np.inf),
        Alloc("l_i", "i", 1, STAT_BYTES, 0.0),
        inner,
        Alloc("L_i", "i", 1, STAT_BYTES),
        Compute("O_i = O_i / l_i; L_i = m_i + log l_i", finish,     # r d divisions, r logs, r +
                nonmatmul=lambda e: e("i") * d + 2 * e("i")),
        Store("O_i", "O", rows="i"),
        Store("L_i", "L", rows="i"),
    )),)
    return Nest(tensors, place(body, registers(plan, REGISTERS)))


def closed_form(plan, *, kv_len: int | None = None, q_pos=None, k_pos=None
                ) -> tuple[dict, dict, int]:
    """(read bytes, write bytes, FLOPs) per head, from the formulas in the header."""
    N, d, Br, Bc, b = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols, plan.elem_bytes
    i = np.arange(cdiv(N, Br))
    if getattr(plan, "mask", None) is not None:
        cols = _mask_cols(plan)[0]
        rows = block_extent(i, Br, N)                     # every Q block read and written
        R, C = int(rows.sum()), int(cols.sum())
        read = {"Q": R * d * b, "K": C * d * b, "V": C * d * b, "O": 0, "L": 0}
        write = {"Q": 0, "K": 0, "V": 0, "O": R * d * b, "L": STAT_BYTES * R}
        return read, write, int(4 * d * (rows * cols).sum())
    if plan.causal and q_pos is None and k_pos is None and kv_len is None:
        last_row = np.minimum((i + 1) * Br, N) - 1
        cols = np.minimum(N, (last_row // Bc + 1) * Bc)
    elif plan.causal:
        N, N_k, q_pos, k_pos = _positions(plan, kv_len, q_pos, k_pos)
        cols = np.minimum(N_k, visible_stop_j(q_pos, k_pos, Br, Bc) * Bc)
    else:
        cols = np.full(len(i), N if kv_len is None else kv_len)
    rows = block_extent(i, Br, N) * (cols > 0)           # Q blocks that see no key: skipped
    R, C = int(rows.sum()), int(cols.sum())
    read = {"Q": R * d * b, "K": C * d * b, "V": C * d * b, "O": 0, "L": 0}
    write = {"Q": 0, "K": 0, "V": 0, "O": R * d * b, "L": STAT_BYTES * R}
    flops = int(4 * d * (rows * cols).sum())
    return read, write, flops


def closed_form_nonmatmul(plan) -> tuple[int, int]:
    """(exponentials, non-matmul operations) per head, from the formulas in the header."""
    N, d, Br, Bc = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols
    i = np.arange(cdiv(N, Br))
    if getattr(plan, "mask", None) is not None:
        cols, tiles = _mask_cols(plan)
    elif plan.causal:
        last_row = np.minimum((i + 1) * Br, N) - 1
        tiles = last_row // Bc + 1
        cols = np.minimum(N, tiles * Bc)
    else:
        tiles, cols = np.full(len(i), cdiv(N, Bc)), np.full(len(i), N)
    r = block_extent(i, Br, N)
    E, R = int((r * cols).sum()), int((r * tiles).sum())
    drop = E if getattr(plan, "dropout", 0.0) else 0       # the 1/(1 - p) scale
    return E + R, 5 * E + (3 + d) * R + (d + 2) * N + drop


def _mask_cols(plan) -> tuple[np.ndarray, np.ndarray]:
    """(cols(i), tiles(i)) under ``plan.mask``: the columns and the number of the tiles
    Q block i does not skip, from the tile classes (``flashsim.masks``)."""
    keep = plan.mask.classify(plan.block_rows, plan.block_cols) != 0
    widths = block_extent(np.arange(keep.shape[1]), plan.block_cols, plan.seq_len)
    return keep @ widths, keep.sum(axis=1)
