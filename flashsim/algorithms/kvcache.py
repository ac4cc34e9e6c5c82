"""FlashAttention-2 over a KV cache (decoding): q_len new query rows against kv_len cached keys.

Versions (``plan.gqa_pack``), for one sequence and one KV head whose group holds
g = heads / kv_heads query heads; the group's G = g q_len query rows are laid out head by
head (row h q_len + m is query head h, position kv_len - q_len + m, the last rows of the
sequence, so under a causal mask row m sees keys 0 .. kv_len - q_len + m):

    1. per head   B_r = q_len: one thread block per (sequence, query head); each block
                  reads the group's K and V itself, so K/V are requested g times
                  (FlashAttention-2's flash_attn_with_kvcache without its GQA swap).
    2. pack-GQA   B_r = q_len h_pack (h_pack = g when it fits, else the largest divisor of
                  g whose B_r <= 64): the group's rows packed into one tile (FlashAttention's
                  pack_gqa, FlashInfer's decode); K/V requested G / B_r times, once when
                  h_pack = g.

Splitting the KV length (Flash-Decoding, ``flashdecoding.py``), a block table (``paged.py``)
and a latent cache (``mla.py``) are options of this one nest. With S splits, split s of a
sequence covers its K/V tiles [s T_s, min((s + 1) T_s, T_c)), T_c = ceil(kv_len / B_c),
T_s = ceil(T_c / S); a sequence has S_b = ceil(T_c / T_s) <= S splits, none empty.

Traffic of the split launch per KV head of sequence b (kv_len n, b bytes per element,
d_qk = d_v = d here; a latent cache has its own, see mla.py), Q blocks = G / B_r:

    read  Q: S_b G d b            read  K, V: (G / B_r) n d b each
    without splits:   write O: G d b,        L: 4 G
    with splits:      write O_part: 4 S_b G d,  L_part: 4 S_b G       (fp32 partials)

(the K/V bytes do not depend on S: the splits cut the same tiles among more blocks).
FLOPs 2 (d_qk + d_v) G n. Outside the matmuls, E = G n elements of S visited and
R = sum over blocks of rows x tiles: exponentials E + R; non-matmul ops
5 E + (3 + d_v) R + (d_v + 2) S_b G (flash2's count, the finish once per split).
SRAM as flash2 (``flash2.REGISTERS``): Q_i, K_j, V_j in shared memory, S_ij, O_i, m_i, l_i
in registers.

Blocks of a launch: the parallel loop ``t`` runs over every (sequence, split, Q block),
split-major within a sequence (block k = s (G / B_r) + i); sequences of one length share
one nest and the leading dimensions (batch, kv_heads), a ragged batch gives each sequence
its own tensors (``Q[b]``, ``K[b]``, ...) in the one launch.
"""

from __future__ import annotations

import numpy as np

from ..nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES, cdiv
from ._common import ACC_BYTES, apply_position_mask, exp_diff, registers
from .flash2 import REGISTERS as FLASH2_REGISTERS

# Placed as FlashAttention-2 places its forward (flash2.REGISTERS): Q_i, K_j, V_j (and a
# paged tile's table entries) in shared memory; S_ij, the fp32 O_i, m_i, l_i, L_i in
# registers. The combine adds flashdecoding.REGISTERS.
REGISTERS = dict(FLASH2_REGISTERS)
PACK_ROWS = 64          # FlashAttention-2's kBlockM for split-KV decode (all head dims)


def default_block_cols(d: int) -> int:
    """B_c of FlashAttention-2's split-KV kernels: 256 for d <= 64, 128 for d <= 128, else
    64 (flash-attention, csrc/flash_attn/src/flash_fwd_launch_template.h,
    ``run_mha_fwd_splitkv_dispatch``)."""
    return 256 if d <= 64 else (128 if d <= 128 else 64)


def pack_heads(g: int, q_len: int, pack: bool, rows: int = PACK_ROWS) -> int:
    """Query heads per Q tile: 1 (per head) or the largest divisor of g with q_len h <= rows
    (at least 1)."""
    if not pack:
        return 1
    return max(h for h in range(1, g + 1) if g % h == 0 and (h * q_len <= rows or h == 1))


def split_geometry(n: int, block_cols: int, splits: int) -> tuple[int, int, int]:
    """(T_c tiles, T_s tiles per split, S_b splits) for a sequence of n keys."""
    tiles = cdiv(n, block_cols)
    per = cdiv(tiles, splits)
    return tiles, per, cdiv(tiles, per)


def suffix(dp, b: int) -> str:
    """Tensor-name suffix of sequence b: '' when the batch shares one nest."""
    return "" if len(dp.seqs) == 1 else f"[{b}]"


def query_positions(G: int, q_len: int, n: int) -> np.ndarray:
    """Position of each packed query row (head-major): n - q_len + (row mod q_len)."""
    return n - q_len + np.arange(G) % q_len


def _attention_ops(dp, b: int, n: int, x: str, iv: str, jv: str, split_of, extra_j=()):
    """The body of one thread block: Q_i loaded, K/V tiles of its split streamed, O_i and
    L_i finished. ``split_of(ctx)``: the block's split (None without splits)."""
    G, d, dv, bb = dp.group_rows, dp.head_dim, dp.v_dim, dp.elem_bytes
    tau, causal, shared = dp.scale, dp.causal, dp.shared_kv
    tiles, per, _ = split_geometry(n, dp.block_cols, dp.splits)
    q_pos = query_positions(G, dp.q_len, n)
    kname = ("KV" if shared else "K") + x

    def s_tile(sram, ctx):
        S = tau * (sram["Q_i"] @ np.swapaxes(sram["K_j"], -1, -2))    # (.., B_r, B_c)
        if causal:
            (r0, r1), (c0, c1) = ctx.range(iv), ctx.range(jv)
            apply_position_mask(S, q_pos[r0:r1], np.arange(c0, c1))
        sram["S_ij"] = S

    def online_update(sram, ctx):
        m_i, S = sram["m_i"], sram["S_ij"]
        V_j = sram["K_j"][..., :dv] if shared else sram["V_j"]          # latent: V = K[:d_v]
        m_new = np.maximum(m_i, S.max(axis=-1, keepdims=True))
        P = exp_diff(S, m_new)
        alpha = exp_diff(m_i, m_new)
        sram["l_i"] = alpha * sram["l_i"] + P.sum(axis=-1, keepdims=True)
        sram["O_i"] = alpha * sram["O_i"] + P @ V_j
        sram["m_i"] = m_new
        sram["S_ij"] = P

    def finish(sram, ctx):
        l_i = sram["l_i"]
        with np.errstate(divide="ignore", invalid="ignore"):          # l_i = 0: saw nothing
            sram["O_i"] = np.where(l_i > 0, sram["O_i"] / l_i, 0.0)
            sram["L_i"] = sram["m_i"] + np.log(l_i)

    if split_of is None:
        start = stop = None
    else:
        start = lambda ctx: split_of(ctx) * per                        # noqa: E731
        stop = lambda ctx: min((split_of(ctx) + 1) * per, tiles)       # noqa: E731
    loads = (Load("K_j", kname, rows=jv),) + (() if shared else (Load("V_j", "V" + x, rows=jv),))
    inner = Loop(jv, dp.block_cols, n, label="K/V tiles of the block's split", start=start,
                 stop=stop, body=extra_j + loads + (
        Alloc("S_ij", iv, jv, bb),
        Compute("S_ij = tau Q_i K_j^T", s_tile,
                lambda e: 2 * e(iv) * e(jv) * d, nonmatmul=lambda e: e(iv) * e(jv)),
        Compute("m_new = max(m_i, rowmax S_ij); P_ij = exp(S_ij - m_new); alpha = "
                "exp(m_i - m_new); l_i = alpha l_i + rowsum P_ij; O_i = alpha O_i + P_ij V_j",
                online_update, lambda e: 2 * e(iv) * e(jv) * dv,
                exps=lambda e: e(iv) * e(jv) + e(iv),
                nonmatmul=lambda e: 4 * e(iv) * e(jv) + 3 * e(iv) + e(iv) * dv),
    ))
    head = (Load("Q_i", "Q" + x, rows=iv), Alloc("O_i", iv, dv, bb, 0.0),
            Alloc("m_i", iv, 1, STAT_BYTES, -np.inf), Alloc("l_i", iv, 1, STAT_BYTES, 0.0))
    tail = (Alloc("L_i", iv, 1, STAT_BYTES),
            Compute("O_i = O_i / l_i; L_i = m_i + log l_i", finish,
                    nonmatmul=lambda e: e(iv) * dv + 2 * e(iv)))
    return head + (inner,) + tail


def split_launch(dp, extra_j=None) -> tuple[Loop, dict]:
    """The launch of thread blocks over (sequence, split, Q block), and its tensors.
    ``extra_j(b, n, x, jv)``: ops to run first in each K/V tile (the block table's)."""
    G, d, dv, bb, Br = dp.group_rows, dp.head_dim, dp.v_dim, dp.elem_bytes, dp.block_rows
    nQ, split = G // Br, dp.splits > 1
    tensors, body, off = {}, [], 0
    for b, n in enumerate(dp.seqs):
        x, _, S_b = suffix(dp, b), *split_geometry(n, dp.block_cols, dp.splits)[1:]
        iv, jv, kv = f"i{b}", f"j{b}", f"k{b}"
        tensors["Q" + x] = Tensor("Q" + x, G, d, bb)
        if dp.shared_kv:
            tensors["KV" + x] = Tensor("KV" + x, n, d, bb)
        else:
            tensors["K" + x], tensors["V" + x] = Tensor("K" + x, n, d, bb), Tensor("V" + x, n, dv, bb)
        more = () if extra_j is None else extra_j(b, n, x, jv, tensors)
        if split:
            tensors["O_part" + x] = Tensor("O_part" + x, S_b * G, dv, ACC_BYTES)
            tensors["L_part" + x] = Tensor("L_part" + x, S_b * G, 1, STAT_BYTES)
            ops = _attention_ops(dp, b, n, x, iv, jv, lambda ctx, kv=kv: ctx.idx[kv] // nQ, more)
            blk = Loop(iv, Br, G, start=lambda ctx, kv=kv: ctx.idx[kv] % nQ,
                       stop=lambda ctx, kv=kv: ctx.idx[kv] % nQ + 1,
                       body=ops + (Store("O_i", "O_part" + x, rows=kv),
                                   Store("L_i", "L_part" + x, rows=kv)))
            body.append(Loop(kv, Br, S_b * G, start=lambda ctx, o=off: ctx.idx["t"] - o,
                             stop=lambda ctx, o=off: ctx.idx["t"] - o + 1, body=(blk,)))
            off += S_b * nQ
        else:
            tensors["O" + x], tensors["L" + x] = Tensor("O" + x, G, dv, bb), Tensor("L" + x, G, 1, STAT_BYTES)
            ops = _attention_ops(dp, b, n, x, iv, jv, None, more)
            body.append(Loop(iv, Br, G, start=lambda ctx, o=off: ctx.idx["t"] - o,
                             stop=lambda ctx, o=off: ctx.idx["t"] - o + 1,
                             body=ops + (Store("O_i", "O" + x, rows=iv),
                                         Store("L_i", "L" + x, rows=iv))))
            off += nQ
    label = "splits x Q tiles (one thread block each)" if split else \
        "Q tiles (one thread block each)"
    return Loop("t", 1, off, body=tuple(body), label=label, parallel=True), tensors


def build(dp) -> Nest:
    """The nest of ``dp`` (a ``flashsim.decode.DecodePlan``): the split launch, and with
    splits the combine launch of ``flashdecoding.py``."""
    from . import flashdecoding, paged
    extra = paged.table_ops(dp) if dp.page_size else None
    launch, tensors = split_launch(dp, extra)
    body = [launch]
    if dp.splits > 1:
        combine, more = flashdecoding.combine_launch(dp)
        body.append(combine)
        tensors.update(more)
    table = {**REGISTERS, **flashdecoding.REGISTERS}
    return Nest(tensors, place(tuple(body), registers(dp, table)))


def closed_form(dp) -> tuple[dict, dict, int, int, int]:
    """(read, write, FLOPs, exponentials, non-matmul ops) per copy (one KV head of the
    sequences in the nest), from the header's formulas."""
    from . import flashdecoding, paged
    G, d, dv, bb, Br = dp.group_rows, dp.head_dim, dp.v_dim, dp.elem_bytes, dp.block_rows
    nQ = G // Br
    read, write = {}, {}
    flops = exps = other = 0
    for b, n in enumerate(dp.seqs):
        x = suffix(dp, b)
        tiles, per, S_b = split_geometry(n, dp.block_cols, dp.splits)
        S = S_b if dp.splits > 1 else 1
        read["Q" + x], write["Q" + x] = S * G * d * bb, 0
        kv_names = ("KV",) if dp.shared_kv else ("K", "V")
        for name in kv_names:
            width = d if name in ("K", "KV") else dv
            read[name + x], write[name + x] = nQ * n * width * bb, 0
        if dp.splits > 1:
            read["O_part" + x] = read["L_part" + x] = 0
            write["O_part" + x], write["L_part" + x] = ACC_BYTES * S * G * dv, STAT_BYTES * S * G
        else:
            read["O" + x] = read["L" + x] = 0
            write["O" + x], write["L" + x] = G * dv * bb, STAT_BYTES * G
        flops += 2 * (d + dv) * G * n
        E = G * n
        R = G * tiles                     # every row visits every tile once, over its splits
        exps += E + R
        other += 5 * E + (3 + dv) * R + (dv + 2) * S * G
    if dp.splits > 1:
        r, w, e, o = flashdecoding.combine_closed_form(dp)
        read.update({k: read.get(k, 0) + v for k, v in r.items()})
        write.update({k: write.get(k, 0) + v for k, v in w.items()})
        exps, other = exps + e, other + o
    if dp.page_size:
        for k, v in paged.table_closed_form(dp).items():
            read[k], write[k] = v, 0
    return read, write, flops, exps, other
