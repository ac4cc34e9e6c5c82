"""FlashAttention-2 backward (Dao, 2023, Algorithm 2): the logsumexp L and D = rowsum(dO o O).

Versions: one. Like FlashAttention's Algorithm 4, it recomputes each tile of P instead of
reading an N x N matrix, but from the one statistic the FlashAttention-2 forward saves,
P_ij = exp(S_ij - L_i), and with D = rowsum(dO o O) computed once, up front, so that the
main loop needs neither O_i nor l_i, m_i. On a GPU each K/V block j is one thread block;
they all add into dQ, with fp32 atomics, so dQ is accumulated in fp32 whatever the data
type and converted at the end.

    pre:  for each Q block i: load O_i, dO_i; store D_i = rowsum(dO_i o O_i);
          store dQ_i = 0 (fp32)                         (lines 3-4; one kernel, as in FA2)
    for each K/V block j (one thread block each):
        load K_j, V_j; dK_j = 0, dV_j = 0 in SRAM       (lines 6-7)
        for each Q block i (causal: from the first one that K_j reaches):
            load Q_i, dO_i, L_i, D_i                     (line 9, less O_i: D replaces it)
            S_ij = tau Q_i K_j^T, masked; P_ij = exp(S_ij - L_i)
            dV_j += P_ij^T dO_i;  dP_ij = dO_i V_j^T;  dS_ij = P_ij o (dP_ij - D_i)
            dQ_i += tau dS_ij K_j                        (line 15: an atomic add per element,
                                                          which the memory system performs as a
                                                          read and a write of dQ_i: counted so)
            dK_j += tau dS_ij^T Q_i
        write dK_j, dV_j                                (line 18)
    post (fp16/bf16 only): dQ = dQ_acc converted to the data type

Traffic per head, with b bytes per element, 4-byte statistics and fp32 dQ accumulation,
and R = sum_j rows(j) the Q rows visited (rows(j) = N; causal: N - floor(j B_c / B_r) B_r):

    read  O: N d b             read  dO: N d b + R d b      write D: 4 N
    read  K, V: N d b each     read  Q: R d b               read  L, D: 4 R each
    dQ accumulator (fp32: "dQ" when b = 4, else "dQ_acc"): write 4 N d + 4 R d, read 4 R d
    write dK, dV: N d b each
    fp16/bf16: read dQ_acc 4 N d once more, write dQ N d b

So per K/V block the inner loop moves Q_i and dO_i in and dQ_i in and out: without a mask
R = T_c N, as in Algorithm 4, but O_i, l_i and m_i no longer cross HBM every step.
FLOPs: 10 d sum_j c_j rows(j), as in Algorithm 4 (five matmuls per tile).
Outside the matmuls (``flashsim.nest.Compute`` says what counts), with E = sum_j c_j rows(j)
elements of S visited and C = sum_j c_j tiles(j), tiles(j) the Q blocks block j visits:
exponentials E (P_ij recomputed); operations 2 N d (D, once) + 5 E + d R + d C (tau on
each tile's dQ_i and dK_j products, as the code applies it).
SRAM working set: b (4 B_c d + 2 B_r d + 2 B_r B_c) + 4 B_r d + 8 B_r
(K_j, V_j, dK_j, dV_j, Q_i, dO_i, S_ij/P_ij, dS_ij, the fp32 dQ_i, and L_i, D_i).

As the forward, the nest runs one step of context parallelism's backward: N_q query rows
(Q, O, dO, L, D, dQ) against N_k key rows (K, V, dK, dV; ``kv_len``) at global positions
``q_pos``, ``k_pos``. K/V block j then starts at the first Q block that sees one of its keys
(``visible_start_i``), so rows(j) = N_q - min(start(j) B_r, N_q) with N_q for N above and
N_k for N in the K, V, dK, dV terms; a K/V block that no query sees still writes its
zero dK_j, dV_j, as flash-attn's kernel does.
With a mask (``plan.mask``) K/V block j visits only the Q blocks of its non-skipped tiles
(``Mask.visited_rows``): rows(j) = their rows, tiles(j) = how many. With dropout the
scale Z / (1 - p) of each tile is regenerated from the seed (nothing read): dV_j +=
(P_ij o Z)^T dO_i, dP_ij = (dO_i V_j^T) o Z, 2 E more operations; D = rowsum(dO o O) holds
as without dropout.
Placed as FlashAttention-2's backward kernel places it (``placement="registers"``,
``REGISTERS``): K_j, V_j, Q_i, dO_i and the P_ij, dS_ij tiles (matmul operands, needed
transposed too) in shared memory, b (2 B_c d + 2 B_r d + 2 B_r B_c); the fp32 accumulators
dK_j, dV_j, dQ_i and L_i, D_i in registers, 8 B_c d + 4 B_r d + 8 B_r.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FlashsimError
from ..nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES, cdiv
from ._common import (ACC_BYTES, apply_position_mask, block_extent, block_loads, exp_diff,
                      kv_block_reach, kv_outer_loop, largest_square_block, matmul_flops,
                      registers, visible_start_i)
from .flash2 import _positions
from ..masks import dropout_scale

# dQ is accumulated in fp32 (atomic adds): ACC_BYTES. The buffers a kernel keeps in
# registers, with their bytes per element there:
REGISTERS = {"dK_j": ACC_BYTES, "dV_j": ACC_BYTES, "dQ_i": ACC_BYTES, "L_i": STAT_BYTES,
             "D_i": STAT_BYTES}


def accumulator(b: int) -> str:
    """The HBM tensor that dQ is accumulated in: dQ itself in fp32, else dQ_acc."""
    return "dQ" if b == ACC_BYTES else "dQ_acc"


def working_set_bytes(block_rows: int, block_cols: int, d: int, b: int) -> int:
    r, c = block_rows, block_cols
    return b * (4 * c * d + 2 * r * d + 2 * r * c) + ACC_BYTES * r * d + 2 * STAT_BYTES * r


def placed_bytes(block_rows: int, block_cols: int, d: int, b: int) -> tuple[int, int]:
    """(shared memory, registers) at their peaks with ``REGISTERS`` (see the header)."""
    r, c = block_rows, block_cols
    return (b * (2 * c * d + 2 * r * d + 2 * r * c),
            ACC_BYTES * (2 * c * d + r * d) + 2 * STAT_BYTES * r)


def default_blocks(n: int, d: int, sram: int, b: int) -> tuple[int, int]:
    """B_r = B_c = the largest multiple of 16 whose working set fits in ``sram`` bytes (the
    forward's rule with this working set); below 16, the largest that fits. Capped at N."""
    B = largest_square_block(n, sram, lambda B: working_set_bytes(B, B, d, b))
    return B, B


def build(plan, *, kv_len: int | None = None, q_pos=None, k_pos=None) -> Nest:
    """The nest for ``plan``; ``kv_len``, ``q_pos``, ``k_pos`` for a step of context
    parallelism (see the header; by default N_k = N_q and positions 0..N-1)."""
    N, N_k, q_pos, k_pos = _positions(plan, kv_len, q_pos, k_pos)
    d, Br, Bc = plan.head_dim, plan.block_rows, plan.block_cols
    b, tau, causal = plan.elem_bytes, 1.0 / math.sqrt(plan.head_dim), plan.causal
    acc = accumulator(b)
    tensors = {name: Tensor(name, N, d, b) for name in ("Q", "O", "dO", "dQ")}
    tensors.update({name: Tensor(name, N_k, d, b) for name in ("K", "V", "dK", "dV")})
    tensors.update({"L": Tensor("L", N, 1, STAT_BYTES), "D": Tensor("D", N, 1, STAT_BYTES),
                    acc: Tensor(acc, N, d, ACC_BYTES)})
    start = visible_start_i(q_pos, k_pos, Br, Bc) if causal else None
    mask, p_drop = getattr(plan, "mask", None), getattr(plan, "dropout", 0.0)
    if (mask is not None or p_drop) and (kv_len is not None or q_pos is not None
                                         or k_pos is not None):
        raise FlashsimError("masks and dropout are not modelled with context parallelism")
    T = np.swapaxes

    def zscale(ctx):
        return dropout_scale(plan.dropout_seed, p_drop, ctx.range("i"), ctx.range("j"))

    def rowsum_do_o(sram, ctx):
        sram["D_i"] = (sram["dO_i"] * sram["O_i"]).sum(axis=-1, keepdims=True)

    pre = Loop("i", Br, N, label="D = rowsum(dO o O); dQ = 0 (fp32)", parallel=True, body=(
        *block_loads("i", "O", "dO"),
        Alloc("D_i", "i", 1, STAT_BYTES),
        Compute("D_i = rowsum(dO_i o O_i)", rowsum_do_o,
                nonmatmul=lambda e: 2 * e("i") * d),                   # x, +
        Store("D_i", "D", rows="i"),
        Alloc("dQ_i", "i", d, ACC_BYTES, 0.0),
        Store("dQ_i", acc, rows="i"),
    ))

    def recompute_p(sram, ctx):
        S = tau * (sram["Q_i"] @ T(sram["K_j"], -1, -2))               # (.., B_r, B_c)
        if causal:
            (r0, r1), (c0, c1) = ctx.range("i"), ctx.range("j")
            apply_position_mask(S, q_pos[r0:r1], k_pos[c0:c1])
        if mask is not None:
            S[..., ~mask.visible(ctx.range("i"), ctx.range("j"), Br, Bc)] = -np.inf
        sram["S_ij"] = exp_diff(S, sram["L_i"])                        # P_ij = exp(S_ij - L_i)

    def dv(sram, ctx):
        P = sram["S_ij"] * zscale(ctx) if p_drop else sram["S_ij"]
        sram["dV_j"] = sram["dV_j"] + T(P, -1, -2) @ sram["dO_i"]

    def dp_ds(sram, ctx):
        dP = sram["dO_i"] @ T(sram["V_j"], -1, -2)
        if p_drop:
            dP = dP * zscale(ctx)
        sram["dS_ij"] = sram["S_ij"] * (dP - sram["D_i"])

    def dq(sram, ctx):
        sram["dQ_i"] = sram["dQ_i"] + tau * (sram["dS_ij"] @ sram["K_j"])

    def dk(sram, ctx):
        sram["dK_j"] = sram["dK_j"] + tau * (T(sram["dS_ij"], -1, -2) @ sram["Q_i"])

    inner = Loop("i", Br, N, label="Q blocks streamed; dQ_i added to in HBM",
                 start=(lambda ctx: int(start[ctx.idx["j"]])) if causal else None,
                 visit=(lambda ctx: mask.visited_rows(Br, Bc)[ctx.idx["j"]])   # classified
                 if mask is not None else None,                         # when first run
                 body=(
                     *block_loads("i", "Q", "dO", "L", "D"),
                     Alloc("S_ij", "i", "j", b),
                     Alloc("dS_ij", "i", "j", b),
                     Compute("S_ij = tau Q_i K_j^T, masked; P_ij = exp(S_ij - L_i)",
                             recompute_p, matmul_flops("i", "j", d),
                             exps=lambda e: e("i") * e("j"),          # tau x, -, exp
                             nonmatmul=lambda e: 3 * e("i") * e("j")),
                     Compute("dV_j += P_ij^T dO_i", dv, matmul_flops("i", "j", d),
                             nonmatmul=(lambda e: e("i") * e("j")) if p_drop else None),
                     Compute("dP_ij = dO_i V_j^T; dS_ij = P_ij o (dP_ij - D_i)", dp_ds,
                             matmul_flops("i", "j", d),
                             nonmatmul=lambda e: (2 + bool(p_drop)) * e("i") * e("j")),
                     Load("dQ_i", acc, rows="i"),
                     Compute("dQ_i += tau dS_ij K_j (atomic add)", dq, matmul_flops("i", "j", d),
                             nonmatmul=lambda e: e("i") * d),          # tau x
                     Store("dQ_i", acc, rows="i"),
                     Compute("dK_j += tau dS_ij^T Q_i", dk, matmul_flops("i", "j", d),
                             nonmatmul=lambda e: e("j") * d),          # tau x
                 ))
    main = kv_outer_loop(plan, N_k, "K/V blocks (one thread block each)", inner, parallel=True)
    body = (pre, main)
    if acc != "dQ":
        def convert(sram, ctx):
            sram["dQ_i"] = sram["dQacc_i"].copy()      # values stay float64 in the simulator

        body += (Loop("i", Br, N, label="dQ = dQ_acc in the data type", parallel=True,
                      body=(
            Load("dQacc_i", acc, rows="i"),
            Alloc("dQ_i", "i", d, b),
            Compute("dQ_i = convert(dQ_acc_i)", convert),
            Store("dQ_i", "dQ", rows="i"),
        )),)
    return Nest(tensors, place(body, registers(plan, REGISTERS)))


def closed_form(plan, *, kv_len: int | None = None, q_pos=None, k_pos=None
                ) -> tuple[dict, dict, int]:
    """(read bytes, write bytes, FLOPs) per head, from the formulas in the header."""
    N, d, Br, Bc, b = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols, plan.elem_bytes
    N_k = N if kv_len is None else kv_len
    j = np.arange(cdiv(N_k, Bc))
    if getattr(plan, "mask", None) is not None:
        rows = _mask_rows(plan)[0]
    elif plan.causal and q_pos is None and k_pos is None and kv_len is None:
        rows = N - (j * Bc // Br) * Br
    elif plan.causal:
        N, N_k, q_pos, k_pos = _positions(plan, kv_len, q_pos, k_pos)
        rows = N - np.minimum(visible_start_i(q_pos, k_pos, Br, Bc) * Br, N)
    else:
        rows = np.full(len(j), N)
    R, nd, kd, s, a = int(rows.sum()), N * d * b, N_k * d * b, STAT_BYTES, ACC_BYTES
    read = {"Q": R * d * b, "K": kd, "V": kd, "O": nd, "dO": nd + R * d * b,
            "dQ": 0, "dK": 0, "dV": 0, "L": s * R, "D": s * R}
    write = {"Q": 0, "K": 0, "V": 0, "O": 0, "dO": 0, "dQ": 0, "dK": kd, "dV": kd,
             "L": 0, "D": s * N}
    acc = accumulator(b)
    read[acc] = a * R * d
    write[acc] = a * N * d + a * R * d
    if acc != "dQ":
        read[acc] += a * N * d
        write["dQ"] = nd
    flops = int(10 * d * (block_extent(j, Bc, N_k) * rows).sum())
    return read, write, flops


def closed_form_nonmatmul(plan) -> tuple[int, int]:
    """(exponentials, non-matmul operations) per head, from the formulas in the header."""
    N, d = plan.seq_len, plan.head_dim
    rows, tiles, c = kv_block_reach(plan)
    if getattr(plan, "mask", None) is not None:
        rows, tiles = _mask_rows(plan)
    E, R, C = int((c * rows).sum()), int(rows.sum()), int((c * tiles).sum())
    drop = 2 * E if getattr(plan, "dropout", 0.0) else 0    # Z scale on P_ij and dP_ij
    return E, 2 * N * d + 5 * E + d * R + d * C + drop


def _mask_rows(plan) -> tuple[np.ndarray, np.ndarray]:
    """(rows(j), tiles(j)) under ``plan.mask``: the rows and the number of the tiles K/V
    block j does not skip, from the tile classes (``flashsim.masks``)."""
    keep = plan.mask.classify(plan.block_rows, plan.block_cols) != 0
    heights = block_extent(np.arange(keep.shape[0]), plan.block_rows, plan.seq_len)
    return heights @ keep, keep.sum(axis=0)
