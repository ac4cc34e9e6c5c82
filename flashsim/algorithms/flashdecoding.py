"""Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023): the KV length split across thread blocks.

Versions: 1. two launches (the split launch, then the combine launch); 2. fused
(``plan(fused_combine=True)``): the split launch's blocks run the combine themselves once
the splits of their sequence have all written, as the decode kernel's v7 does (a block waits
at a counter; gpu_kernels/cuda/decode.cu). The loop nest and the counts are version 1's;
the time model charges the combine no launch latency of its own.

    1. split launch   kvcache.py's nest with S > 1: block (sequence, split s, Q tile i)
                      streams its split's K/V tiles and writes a partial output O_part (fp32,
                      already divided by its own l) and its logsumexp L_part = m + log l.
    2. combine        one block per B_m rows of a sequence's group: for each split s, read
                      L_part and O_part of its rows and merge them into the running state
                      with the associative (m, l) merge of online softmax (notebook 03,
                      ``online_softmax.merge``): M = max(M, L_s); l = l e^{M_old - M} +
                      e^{L_s - M}; acc likewise with O_s; then O = acc / l, L = M + log l.

Why: at batch x kv_heads thread blocks fewer than the SMs, one block per (sequence, KV
head) leaves most SMs idle and the few busy ones cannot pull HBM's bandwidth; S splits
multiply the blocks by S for a small extra write and read of fp32 partials.

``auto`` splits: FlashAttention-2's ``num_splits_heuristic`` (flash-attention,
csrc/flash_attn/flash_api.cpp): with W = blocks without splits and C = 2 x SMs slots (two
blocks of 4 warps per SM), S = 1 when W >= 0.8 C; otherwise, among S <= min(128, C, T_c)
whose tiles per split differ from S - 1's, the smallest whose wave efficiency
(W S / C) / ceil(W S / C) is at least 0.85 of the best.

Combine traffic per KV head of a sequence (S_b splits, G = g q_len rows, d_v, b bytes):

    read  L_part: 4 S_b G            read  O_part: 4 S_b G d_v
    write O: G d_v b                 write L: 4 G
    exponentials 2 S_b G; non-matmul ops S_b G (7 + 3 d_v) + G (d_v + 2)
"""

from __future__ import annotations

import math

import numpy as np

from ..nest import Alloc, Compute, Load, Loop, Store, Tensor
from ..units import STAT_BYTES, cdiv
from ._common import ACC_BYTES, exp_diff
from .kvcache import split_geometry, suffix

MAX_SPLITS = 128                 # flash_api.cpp: num_splits_heuristic(..., 128)
# The combine's buffers in registers (the split launch places as kvcache.REGISTERS): the
# fp32 accumulator and the running statistics; L_s, O_s land in shared memory.
REGISTERS = {"O_c": ACC_BYTES, "M_c": STAT_BYTES, "l_c": STAT_BYTES, "L_c": STAT_BYTES}
BLOCKS_PER_SM = 2                # flash_api.cpp passes multiProcessorCount * 2


def num_splits_heuristic(blocks: int, sms: int, tiles: int, max_splits: int = MAX_SPLITS
                         ) -> int:
    """FlashAttention-2's choice of splits (see the header): ``blocks`` = thread blocks
    without splits, ``sms`` = slots (2 x SMs), ``tiles`` = K/V tiles of the longest
    sequence."""
    if blocks >= 0.8 * sms:
        return 1
    top = min(max_splits, sms, tiles)

    def eligible(s):
        return s == 1 or cdiv(tiles, s) != cdiv(tiles, s - 1)

    eff = {}
    for s in range(1, top + 1):
        if eligible(s):
            waves = blocks * s / sms
            eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(s for s in sorted(eff) if eff[s] >= 0.85 * best)


def combine_rows(d_v: int, G: int) -> int:
    """B_m of the combine kernel: 4 rows when d_v % 128 == 0, 8 when % 64, else 16
    (flash_fwd_kernel.h, ``combine_attn_seqk_parallel``'s kBlockM), cut to a divisor of G."""
    rule = 4 if d_v % 128 == 0 else (8 if d_v % 64 == 0 else 16)
    return max(m for m in range(1, min(rule, G) + 1) if G % m == 0)


def combine_launch(dp) -> tuple[Loop, dict]:
    """The combine launch over (sequence, B_m-row block) and the output tensors."""
    G, dv, bb = dp.group_rows, dp.v_dim, dp.elem_bytes
    Bm = combine_rows(dv, G)
    nC = G // Bm
    tensors, body, off = {}, [], 0
    for b, n in enumerate(dp.seqs):
        body.append(_combine_sequence(dp, b, n, off, Bm, tensors))
        off += nC
    return Loop("t2", 1, off, body=tuple(body), label="combine (one block per B_m rows)",
                parallel=True), tensors


def _combine_sequence(dp, b: int, n: int, off: int, Bm: int, tensors: dict) -> Loop:
    """The combine blocks of sequence b (its loops; its output tensors added)."""
    G, dv, bb = dp.group_rows, dp.v_dim, dp.elem_bytes
    nC = G // Bm
    x = suffix(dp, b)
    S_b = split_geometry(n, dp.block_cols, dp.splits)[2]
    cv, sv, rv = f"c{b}", f"s{b}", f"r{b}"
    tensors["O" + x] = Tensor("O" + x, G, dv, bb)
    tensors["L" + x] = Tensor("L" + x, G, 1, STAT_BYTES)

    def merge(sram, ctx):            # the (m, l) merge: (M, l, acc) with (L_s, 1, O_s)
        L_s, M = sram["L_s"], sram["M_c"]
        M_new = np.maximum(M, L_s)
        a, w = exp_diff(M, M_new), exp_diff(L_s, M_new)
        sram["l_c"] = a * sram["l_c"] + w
        sram["O_c"] = a * sram["O_c"] + w * sram["O_s"]
        sram["M_c"] = M_new

    def finish(sram, ctx):
        l_c = sram["l_c"]
        with np.errstate(divide="ignore", invalid="ignore"):
            sram["O_c"] = np.where(l_c > 0, sram["O_c"] / l_c, 0.0)
            sram["L_c"] = sram["M_c"] + np.log(l_c)

    part = Loop(rv, Bm, S_b * G, start=lambda ctx: ctx.idx[sv] * nC + ctx.idx[cv],
                stop=lambda ctx: ctx.idx[sv] * nC + ctx.idx[cv] + 1, body=(
        Load("L_s", "L_part" + x, rows=rv),
        Load("O_s", "O_part" + x, rows=rv),
        # max r, subtract 2r, exp 2r, l: r x + r +; acc: 2 r d_v x + r d_v +
        Compute("M_new = max(M, L_s); a = exp(M - M_new); w = exp(L_s - M_new); "
                "l = a l + w; acc = a acc + w O_s", merge,
                exps=lambda e: 2 * e(rv),
                nonmatmul=lambda e: 7 * e(rv) + 3 * e(rv) * dv),
    ))
    return Loop(cv, Bm, G, start=lambda ctx: ctx.idx["t2"] - off,
                stop=lambda ctx: ctx.idx["t2"] - off + 1, body=(
        Alloc("O_c", cv, dv, ACC_BYTES, 0.0),
        Alloc("M_c", cv, 1, STAT_BYTES, -np.inf),
        Alloc("l_c", cv, 1, STAT_BYTES, 0.0),
        Loop(sv, 1, S_b, body=(part,), label="splits merged"),
        Alloc("L_c", cv, 1, STAT_BYTES),
        Compute("O = acc / l; L = M + log l", finish,
                nonmatmul=lambda e: e(cv) * dv + 2 * e(cv)),
        Store("O_c", "O" + x, rows=cv),
        Store("L_c", "L" + x, rows=cv),
    ))


def combine_closed_form(dp) -> tuple[dict, dict, int, int]:
    """(read, write, exponentials, non-matmul ops) of the combine, per copy (the header)."""
    G, dv, bb = dp.group_rows, dp.v_dim, dp.elem_bytes
    read, write, exps, other = {}, {}, 0, 0
    for b, n in enumerate(dp.seqs):
        x = suffix(dp, b)
        S_b = split_geometry(n, dp.block_cols, dp.splits)[2]
        read["L_part" + x], read["O_part" + x] = STAT_BYTES * S_b * G, ACC_BYTES * S_b * G * dv
        write["O" + x], write["L" + x] = G * dv * bb, STAT_BYTES * G
        read["O" + x] = read["L" + x] = 0
        exps += 2 * S_b * G
        other += S_b * G * (7 + 3 * dv) + G * (dv + 2)
    return read, write, exps, other
