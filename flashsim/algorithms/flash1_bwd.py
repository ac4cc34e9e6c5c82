"""FlashAttention backward (Dao et al., 2022, Algorithm 4): recompute P, never store it.

Versions: one, the paper's Algorithm 4 without dropout. It reads what the forward
(Algorithm 1) saved, O, l and m, and recomputes each tile P_ij = diag(l_i)^-1 exp(S_ij - m_i)
from Q_i and K_j instead of reading an N x N P from HBM: more FLOPs, far fewer bytes.

    dQ = 0 in HBM                                       (line 5)
    for each K/V block j:
        load K_j, V_j; dK~_j = 0, dV~_j = 0 in SRAM     (lines 7-8)
        for each Q block i (causal: from the first one that K_j reaches):
            load Q_i, O_i, dO_i, dQ_i, l_i, m_i          (line 10)
            S_ij = tau Q_i K_j^T, masked; P_ij = diag(l_i)^-1 exp(S_ij - m_i)
            dV~_j += P_ij^T dO_i;  dP_ij = dO_i V_j^T;  D_i = rowsum(dO_i o O_i)
            dS_ij = P_ij o (dP_ij - D_i)
            write dQ_i <- dQ_i + tau dS_ij K_j            (line 21: read-modify-write in HBM)
            dK~_j += tau dS_ij^T Q_i
        write dK_j, dV_j                                (line 24)

Line 5 also zeroes dK and dV in HBM; we skip that, because line 24 overwrites every
element without reading it (the paper's proof of Theorem 5 also counts dK and dV written
once). dQ's zeroing is needed: every inner step reads dQ_i back.

Traffic per head, with b bytes per element and 4-byte statistics, and, as in the forward,
R = sum_j rows(j), the Q rows visited; rows(j) = N; causal: N - floor(j B_c / B_r) B_r:

    read  K, V: N d b each                 write dK, dV: N d b each
    read  Q, O, dO: R d b each             read  l, m: 4 R each
    read  dQ: R d b                        write dQ: R d b + N d b (+ N d b: line 5)

Without a mask R = T_c N: Q, O, dO and dQ cross HBM T_c = N / B_c times, Theta(N^2 d^2 / M)
(Theorem 5), against standard attention's N x N matrices.
FLOPs: 10 d sum_j c_j rows(j), with c_j the columns of block j (10 N^2 d without a mask):
five matmuls per tile, one of them (S_ij) the forward's, recomputed.
Outside the matmuls (``flashsim.nest.Compute`` says what counts), with E = sum_j c_j rows(j)
elements of S visited and C = sum_j c_j tiles(j), tiles(j) the Q blocks block j visits:
exponentials E; operations 6 E + 3 d R + d C (D_i recomputed at every tile, line 19).
SRAM working set: b (4 B_c d + 4 B_r d + 2 B_r B_c) + 12 B_r
(K_j, V_j, dK~_j, dV~_j, Q_i, O_i, dO_i, dQ_i, S_ij/P_ij, dP_ij/dS_ij, and l_i, m_i, D_i).
Placed as a kernel would (``placement="registers"``, ``REGISTERS``): K_j, V_j, Q_i, O_i,
dO_i and the P_ij, dS_ij tiles in shared memory, b (2 B_c d + 3 B_r d + 2 B_r B_c); the fp32
accumulators dK~_j, dV~_j, dQ_i and l_i, m_i, D_i in registers, 8 B_c d + 4 B_r d + 12 B_r.
"""

from __future__ import annotations

import math

import numpy as np

from ..nest import Alloc, Compute, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES
from ._common import (ACC_BYTES, apply_causal_mask, block_loads, causal_start_i, exp_diff,
                      kv_block_reach, kv_outer_loop, matmul_flops, paper_blocks,
                      registers)

# The buffers a kernel keeps in registers, with their bytes per element there.
REGISTERS = {"dK_j": ACC_BYTES, "dV_j": ACC_BYTES, "dQ_i": ACC_BYTES, "l_i": STAT_BYTES,
             "m_i": STAT_BYTES, "D_i": STAT_BYTES}



def working_set_bytes(block_rows: int, block_cols: int, d: int, b: int) -> int:
    r, c = block_rows, block_cols
    return b * (4 * c * d + 4 * r * d + 2 * r * c) + 3 * STAT_BYTES * r


def placed_bytes(block_rows: int, block_cols: int, d: int, b: int) -> tuple[int, int]:
    """(shared memory, registers) at their peaks with ``REGISTERS`` (see the header)."""
    r, c = block_rows, block_cols
    return (b * (2 * c * d + 3 * r * d + 2 * r * c),
            ACC_BYTES * (2 * c * d + r * d) + 3 * STAT_BYTES * r)


def default_blocks(n: int, d: int, sram: int, b: int) -> tuple[int, int]:
    """The paper's rule (the forward's: B_c = ceil(M / 4d), B_r = min(B_c, d) in elements,
    capped at N), then the largest B_c below it, B_r = min(B_c, d) following, whose
    backward working set fits in ``sram``."""
    def next_bc(Br, Bc):
        # The largest B_c that fits with this B_r (the working set is linear in B_c), if
        # B_r stays the same there; else one step down, B_r shrinking with B_c.
        fit = (sram - b * 4 * Br * d - 3 * STAT_BYTES * Br) // (b * (4 * d + 2 * Br))
        return fit if Br <= fit < Bc else Bc - 1

    return paper_blocks(n, d, sram, b, lambda r, c: working_set_bytes(r, c, d, b), next_bc)


def build(plan) -> Nest:
    N, d, Br, Bc = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols
    b, tau, causal = plan.elem_bytes, 1.0 / math.sqrt(plan.head_dim), plan.causal
    tensors = {name: Tensor(name, N, d, b)
               for name in ("Q", "K", "V", "O", "dO", "dQ", "dK", "dV")}
    tensors.update({"l": Tensor("l", N, 1, STAT_BYTES), "m": Tensor("m", N, 1, STAT_BYTES)})
    T = np.swapaxes

    def recompute_p(sram, ctx):
        S = tau * (sram["Q_i"] @ T(sram["K_j"], -1, -2))               # (.., B_r, B_c)
        if causal:
            apply_causal_mask(S, ctx.range("i"), ctx.range("j"))
        sram["S_ij"] = exp_diff(S, sram["m_i"]) / sram["l_i"]           # P_ij

    def dv(sram, ctx):
        sram["dV_j"] = sram["dV_j"] + T(sram["S_ij"], -1, -2) @ sram["dO_i"]

    def dp(sram, ctx):
        sram["dP_ij"] = sram["dO_i"] @ T(sram["V_j"], -1, -2)

    def ds(sram, ctx):
        sram["D_i"] = (sram["dO_i"] * sram["O_i"]).sum(axis=-1, keepdims=True)
        sram["dP_ij"] = sram["S_ij"] * (sram["dP_ij"] - sram["D_i"])   # dS_ij

    def dq(sram, ctx):
        sram["dQ_i"] = sram["dQ_i"] + tau * (sram["dP_ij"] @ sram["K_j"])

    def dk(sram, ctx):
        sram["dK_j"] = sram["dK_j"] + tau * (T(sram["dP_ij"], -1, -2) @ sram["Q_i"])

    init = Loop("i", Br, N, label="initialise dQ = 0 in HBM (line 5)", body=(
        Alloc("dQ_i", "i", d, b, 0.0),
        Store("dQ_i", "dQ", rows="i"),
    ))
    inner = Loop("i", Br, N, label="Q blocks: Q_i, O_i, dO_i, dQ_i, l_i, m_i read each time",
                 start=(lambda ctx: causal_start_i(ctx.idx["j"], Br, Bc)) if causal else None,
                 body=(
                     *block_loads("i", "Q", "O", "dO", "dQ", "l", "m"),
                     Alloc("S_ij", "i", "j", b),
                     Alloc("dP_ij", "i", "j", b),
                     Alloc("D_i", "i", 1, STAT_BYTES),
                     Compute("S_ij = tau Q_i K_j^T, masked; P_ij = diag(l_i)^-1 exp(S_ij - m_i)",
                             recompute_p, matmul_flops("i", "j", d),
                             exps=lambda e: e("i") * e("j"),          # tau x, -, exp, /
                             nonmatmul=lambda e: 4 * e("i") * e("j")),
                     Compute("dV~_j += P_ij^T dO_i", dv, matmul_flops("i", "j", d)),
                     Compute("dP_ij = dO_i V_j^T", dp, matmul_flops("i", "j", d)),
                     Compute("D_i = rowsum(dO_i o O_i); dS_ij = P_ij o (dP_ij - D_i)", ds,
                             nonmatmul=lambda e: 2 * e("i") * d + 2 * e("i") * e("j")),
                     Compute("dQ_i += tau dS_ij K_j", dq, matmul_flops("i", "j", d),
                             nonmatmul=lambda e: e("i") * d),          # tau x
                     Store("dQ_i", "dQ", rows="i"),
                     Compute("dK~_j += tau dS_ij^T Q_i", dk, matmul_flops("i", "j", d),
                             nonmatmul=lambda e: e("j") * d),          # tau x
                 ))
    outer = kv_outer_loop(plan, N, "K/V blocks (outer)", inner)
    return Nest(tensors, place((init, outer), registers(plan, REGISTERS)))


def closed_form(plan) -> tuple[dict, dict, int]:
    """(read bytes, write bytes, FLOPs) per head, from the formulas in the header."""
    N, d, b = plan.seq_len, plan.head_dim, plan.elem_bytes
    rows, _, c = kv_block_reach(plan)
    R, nd, s = int(rows.sum()), N * d * b, STAT_BYTES
    read = {"Q": R * d * b, "K": nd, "V": nd, "O": R * d * b, "dO": R * d * b,
            "dQ": R * d * b, "dK": 0, "dV": 0, "l": s * R, "m": s * R}
    write = {"Q": 0, "K": 0, "V": 0, "O": 0, "dO": 0,
             "dQ": R * d * b + nd, "dK": nd, "dV": nd, "l": 0, "m": 0}
    flops = int(10 * d * (c * rows).sum())
    return read, write, flops


def closed_form_nonmatmul(plan) -> tuple[int, int]:
    """(exponentials, non-matmul operations) per head, from the formulas in the header."""
    d = plan.head_dim
    rows, tiles, c = kv_block_reach(plan)
    E, R, C = int((c * rows).sum()), int(rows.sum()), int((c * tiles).sum())
    return E, 6 * E + 3 * d * R + d * C
