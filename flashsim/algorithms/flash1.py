"""FlashAttention forward (Dao et al., 2022, Algorithm 1): outer loop over K/V blocks.

Versions (``plan.kv_launches``), both the paper's Algorithm 1 line for line: O, l and m
start in HBM (written as 0, 0 and -inf); for every K/V block j, every Q block i loads Q_i,
O_i, l_i, m_i, updates them with the tile S_ij = tau Q_i K_j^T and writes O_i, l_i, m_i
back. They differ in how a GPU runs it:

    1. one block per head (the default; ``cupy_flash1``): one launch, one thread block per
       head runs the whole nest, K_j and V_j loaded once per j.
    2. one launch per K/V block (``kv_launches=True``; ``numba_flash1``): line 2 is one
       launch of T_r blocks per head, then launch j (T_c of them, in stream order: launch
       j + 1 sees every write of launch j) runs one thread block per (Q block i, head), and
       each block loads K_j and V_j itself, so K and V cross T_r times (tiles(j) times
       under the mask) where version 1 reads them once.

Traffic per head, with b bytes per element, T_c = ceil(N/B_c), T_r = ceil(N/B_r) and 4-byte
statistics:

    read  K, V: N d b each             R = sum_j rows(j), the Q rows visited
      version 2: C d b each            rows(j) = N; causal: N - floor(j B_c / B_r) B_r
                                       C = sum_j c_j tiles(j), the K/V rows loaded
                                       tiles(j) = T_r; causal: T_r - floor(j B_c / B_r)
    read  Q, O: R d b each             (C = T_r N without a mask)
    read  l, m: 4 R each
    write O: R d b + N d b             (the + N d b, and + 4 N for l and m, is the
    write l, m: 4 R + 4 N each          initialisation of line 2)

Without a mask R = T_c N, so Q and O cross T_c = N / B_c times: with the paper's
B_c = ceil(M / 4d) that is Theta(N^2 d^2 / M) (Theorem 2), and doubling M halves it.
FLOPs: 4 d sum_j c_j rows(j), with c_j the columns of block j (4 N^2 d without a mask).
Outside the matmuls (``flashsim.nest.Compute`` says what counts), with E = sum_j c_j rows(j)
elements of S visited:

    exponentials    E + 2 R                  (P~_ij; e^(m_i - m_new), e^(m~_ij - m_new))
    non-matmul ops  5 E + (9 + 4 d) R
                    (O_i is rescaled by diag(l_new)^-1 diag(l_i) at every tile: 4 d per row
                    per tile, where FlashAttention-2 pays d per row per tile and d + 2 per
                    row once; with the same tiles FlashAttention does more at every shape)
SRAM working set: b (2 B_c d + 2 B_r d + B_r B_c) + 16 B_r
(K_j, V_j, Q_i, O_i, S_ij and four statistics vectors: l_i, m_i, m~_ij, l~_ij).
Placed as a kernel would (``placement="registers"``, ``REGISTERS``): K_j, V_j, Q_i in shared
memory, b (2 B_c d + B_r d); S_ij, O_i (fp32, as loaded) and the four statistics in
registers, 4 B_r B_c + 4 B_r d + 16 B_r.

In version 1 no loop is parallel: one thread block runs the whole nest for one head, as
the original FlashAttention kernel did (every K/V block j updates every O_i, so the j loop
cannot be split inside one launch). With batch x heads smaller than the SM count, SMs sit
idle: the reason FlashAttention-2 parallelises over Q blocks too. Version 2 splits the j
loop across launches instead (``Loop.launch_per_iteration``), so its blocks fill the GPU
but pay a launch and the O, l, m round trip per step.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..nest import Alloc, Compute, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES
from ._common import (ACC_BYTES, apply_causal_mask, block_loads, causal_start_i, exp_diff,
                      kv_block_reach, matmul_flops, paper_blocks, registers)

# The buffers a kernel keeps in registers, with their bytes per element there.
REGISTERS = {"S_ij": ACC_BYTES, "O_i": ACC_BYTES, "l_i": STAT_BYTES, "m_i": STAT_BYTES,
             "mt_ij": STAT_BYTES, "lt_ij": STAT_BYTES}



def working_set_bytes(block_rows: int, block_cols: int, d: int, b: int) -> int:
    r, c = block_rows, block_cols
    return b * (2 * c * d + 2 * r * d + r * c) + 4 * STAT_BYTES * r


def placed_bytes(block_rows: int, block_cols: int, d: int, b: int) -> tuple[int, int]:
    """(shared memory, registers) at their peaks with ``REGISTERS`` (see the header)."""
    r, c = block_rows, block_cols
    return b * (2 * c * d + r * d), ACC_BYTES * (r * c + r * d) + 4 * STAT_BYTES * r


def default_blocks(n: int, d: int, sram: int, b: int) -> tuple[int, int]:
    """The paper's rule B_c = ceil(M / 4d), B_r = min(B_c, d) with M in elements, capped at
    N, then B_c shrunk until the whole working set (which the paper's rule leaves out of
    its budget: the S_ij tile and the statistics) fits in ``sram`` bytes."""
    def next_bc(Br, Bc):
        # Largest B_c that fits with this B_r (the working set is linear in B_c).
        fit = (sram - b * 2 * Br * d - 4 * STAT_BYTES * Br) // (b * (2 * d + Br))
        return min(Bc - 1, max(fit, 0))

    return paper_blocks(n, d, sram, b, lambda r, c: working_set_bytes(r, c, d, b), next_bc)


def build(plan) -> Nest:
    N, d, Br, Bc = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols
    b, tau, causal = plan.elem_bytes, 1.0 / math.sqrt(plan.head_dim), plan.causal
    tensors = {
        "Q": Tensor("Q", N, d, b), "K": Tensor("K", N, d, b), "V": Tensor("V", N, d, b),
        "O": Tensor("O", N, d, b),
        "l": Tensor("l", N, 1, STAT_BYTES), "m": Tensor("m", N, 1, STAT_BYTES),
    }

    def s_tile(sram, ctx):
        S = tau * (sram["Q_i"] @ np.swapaxes(sram["K_j"], -1, -2))    # (.., B_r, B_c)
        if causal:
            apply_causal_mask(S, ctx.range("i"), ctx.range("j"))
        sram["S_ij"] = S

    def tile_softmax(sram, ctx):
        S = sram["S_ij"]
        sram["mt_ij"] = S.max(axis=-1, keepdims=True)                 # m~_ij = rowmax(S_ij)
        P = exp_diff(S, sram["mt_ij"])                                # P~_ij = exp(S_ij - m~_ij)
        sram["lt_ij"] = P.sum(axis=-1, keepdims=True)                 # l~_ij = rowsum(P~_ij)
        sram["S_ij"] = P

    def update(sram, ctx):
        m_i, l_i, mt, lt = sram["m_i"], sram["l_i"], sram["mt_ij"], sram["lt_ij"]
        m_new = np.maximum(m_i, mt)
        a, bt = exp_diff(m_i, m_new), exp_diff(mt, m_new)            # e^{m_i - m_new}, e^{m~ - m_new}
        l_new = a * l_i + bt * lt
        O = (l_i * a * sram["O_i"] + bt * (sram["S_ij"] @ sram["V_j"])) / l_new
        sram["O_i"], sram["l_i"], sram["m_i"] = O, l_new, m_new

    init = Loop("i", Br, N, label="initialise O = 0, l = 0, m = -inf in HBM", body=(
        Alloc("O_i", "i", d, b, 0.0),
        Alloc("l_i", "i", 1, STAT_BYTES, 0.0),
        Alloc("m_i", "i", 1, STAT_BYTES, -np.inf),
        Store("O_i", "O", rows="i"),
        Store("l_i", "l", rows="i"),
        Store("m_i", "m", rows="i"),
    ))
    # one Q block at one K/V block j: Q_i, O_i, l_i, m_i read, updated and written back
    q_block = (
        *block_loads("i", "Q", "O", "l", "m"),
        Alloc("S_ij", "i", "j", b),
        Alloc("mt_ij", "i", 1, STAT_BYTES),
        Alloc("lt_ij", "i", 1, STAT_BYTES),
        Compute("S_ij = tau Q_i K_j^T", s_tile, matmul_flops("i", "j", d),
                nonmatmul=lambda e: e("i") * e("j")),             # tau x
        # rowmax rc, subtract rc, exp rc, rowsum rc
        Compute("m~_ij = rowmax S_ij; P~_ij = exp(S_ij - m~_ij); "
                "l~_ij = rowsum P~_ij", tile_softmax,
                exps=lambda e: e("i") * e("j"),
                nonmatmul=lambda e: 4 * e("i") * e("j")),
        # per row: max 1, two (subtract, exp) 4, l_new 3, l_i e^.. 1; per
        # element of O_i: two products, a sum and a division, 4 d per row
        Compute("m_new = max(m_i, m~_ij); l_new = e^(m_i-m_new) l_i + "
                "e^(m~_ij-m_new) l~_ij; O_i = diag(l_new)^-1 (diag(l_i) "
                "e^(m_i-m_new) O_i + e^(m~_ij-m_new) P~_ij V_j)",
                update, matmul_flops("i", "j", d),
                exps=lambda e: 2 * e("i"),
                nonmatmul=lambda e: 9 * e("i") + 4 * d * e("i")),
        Store("O_i", "O", rows="i"),
        Store("l_i", "l", rows="i"),
        Store("m_i", "m", rows="i"),
    )
    first_i = (lambda ctx: causal_start_i(ctx.idx["j"], Br, Bc)) if causal else None
    if getattr(plan, "kv_launches", False):           # version 2: a launch per K/V block
        init = replace(init, parallel=True)
        outer = Loop("j", Bc, N, label="K/V blocks (one launch each)",
                     launch_per_iteration=True, body=(
                         Loop("i", Br, N, label="Q blocks of step j (one thread block each)",
                              parallel=True, start=first_i, body=(
                                  *block_loads("j", "K", "V"),    # by every block
                                  *q_block)),))
    else:
        outer = Loop("j", Bc, N, label="K/V blocks (outer)", body=(
            *block_loads("j", "K", "V"),
            Loop("i", Br, N, label="Q blocks: O_i, l_i, m_i read and written each time",
                 start=first_i, body=q_block),
        ))
    return Nest(tensors, place((init, outer), registers(plan, REGISTERS)))


def closed_form(plan) -> tuple[dict, dict, int]:
    """(read bytes, write bytes, FLOPs) per head, from the formulas in the header."""
    N, d, b = plan.seq_len, plan.head_dim, plan.elem_bytes
    rows, tiles, c = kv_block_reach(plan)
    R = int(rows.sum())
    kv = int((c * tiles).sum()) if getattr(plan, "kv_launches", False) else N  # C or N
    s = STAT_BYTES
    read = {"Q": R * d * b, "K": kv * d * b, "V": kv * d * b, "O": R * d * b,
            "l": s * R, "m": s * R}
    write = {"Q": 0, "K": 0, "V": 0, "O": R * d * b + N * d * b,
             "l": s * R + s * N, "m": s * R + s * N}
    flops = int(4 * d * (c * rows).sum())
    return read, write, flops


def closed_form_nonmatmul(plan) -> tuple[int, int]:
    """(exponentials, non-matmul operations) per head, from the formulas in the header."""
    d = plan.head_dim
    rows, _, c = kv_block_reach(plan)
    E, R = int((c * rows).sum()), int(rows.sum())
    return E + 2 * R, 5 * E + (9 + 4 * d) * R
