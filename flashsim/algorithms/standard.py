"""Standard attention (FlashAttention paper, Algorithm 0), as eager frameworks run it.

Versions: one, with optional extra elementwise passes.

    kernel 1  S = Q K^T        for each Q block i (Q_i resident): for each K block j:
                               load K_j, store S_ij. The 1/sqrt(d) scale rides in the
                               matmul (cuBLAS's alpha) unless a separate ``scale`` pass asks.
    passes    scale, mask      each a full read and write of the N x N matrix, in the order
                               given, as eager PyTorch launches ``S / sqrt(d)`` and
                               ``masked_fill``.
    kernel 2  P = softmax(S)   R whole rows at a time, R = floor(M / (N b + 8)): read once,
                               write once. When not even one row fits in SRAM, the kernel
                               streams each row block twice (online max/sum, then normalise):
                               S is read twice. Under a causal mask (no dense mask, no
                               ``mask`` pass) the streaming kernel reads only the tiles the
                               mask leaves a visible element in, and stores P = 0 for the
                               others without reading them, as both of our kernels do
                               (``cuda/standard.cu``, ``numba/standard.py``).
    kernel 3  O = P V          for each Q block i (O_i accumulated in SRAM): for each j:
                               load P_ij and V_j; store O_i.

A causal mask does not shrink the matmuls: like eager code, S is computed in full and the
mask is applied inside the softmax (or by the ``mask`` pass). Only the streaming softmax
skips: the tiles above the diagonal are never read. The tiles of kernels 1 and 3 are
fixed (default 64 x 64, cuBLAS-like, halved only when they do not fit), so the traffic does
not depend on M except through the softmax's row fit.

Traffic per head, with b bytes per element and T_r = ceil(N / B_r):

    read  Q: N d b          read  K, V: T_r N d b each      write O: N d b
    each N x N matrix (S, then one per pass, then P): written N^2 b, read N^2 b
    (S-before-softmax read 2 N^2 b when a row does not fit; causal: 2 V b, where
    V = sum_i rows_i min(N, stop_i B_c) are the elements of the tiles with a visible
    element, stop_i = floor((last row of block i) / B_c) + 1)

The paper's Theta(N d + N^2) is this with the K/V re-reads folded in: they add
2 N^2 d b / B_r, a fraction d / B_r of one N x N pass each.
FLOPs: 4 N^2 d (the two matmuls). SRAM working set: b (B_r d + B_c d + B_r B_c) for
kernels 1 and 3; R (N b + 8) for kernel 2.
Outside the matmuls (``flashsim.nest.Compute`` says what counts): the 1/sqrt(d) scale, N^2
(in kernel 1 or the ``scale`` pass), and the softmax: exponentials N^2, operations 5 N^2
(max, subtract, exp, sum, divide), causal or not where a whole row fits.
When a row does not fit, the softmax streams twice: exponentials 2 N^2 + N T_c, operations
7 N^2 + 3 N T_c, T_c = ceil(N / B_c) (the online pass rescales its sum once per tile);
causal: 2 V + t and 7 V + 3 t over the visible tiles, t = sum_i rows_i stop_i.
With a mask (``plan.mask``, ``flashsim.masks``) nothing is skipped either: the masked
softmax (or the ``mask`` pass, when given) reads a dense N x N boolean ``mask`` from HBM,
N^2 bytes, as ``masked_fill`` and SDPA with a boolean mask do; a row that sees nothing gets
P = 0. With dropout (``plan.dropout`` = p) a separate pass reads P, writes the keep mask
Z (N^2 bytes, bool) and P_drop = P o Z / (1 - p) (N^2 b), and kernel 3 reads P_drop: the
forward moves N^2 (2 b + 1) bytes more and does N^2 more operations (the scale).
Placed as GEMM kernels place it (``placement="registers"``, ``REGISTERS``): the operand
tiles in shared memory, b (B_c d + B_r max(d, B_c)); the fp32 accumulators S_ij (kernel 1)
and O_i (kernel 3), and the tiles of an elementwise pass, in registers, 4 B_r max(B_c, d).
Kernel 2 keeps its rows and their statistics in shared memory, as above.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FlashsimError
from ..nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES, cdiv
from ._common import (ACC_BYTES, apply_causal_mask, block_extent, causal_stop_j, exp_diff,
                      matmul_flops, product_kernel, registers)
from ..masks import dropout_scale

MASK_BYTES = 1          # a boolean mask or dropout keep-mask element, as PyTorch stores it

PASSES = ("scale", "mask")
# The buffers a kernel keeps in registers, with their bytes per element there (None: as in
# HBM). The streaming softmax's S_ij tile (when a row does not fit) shares kernel 1's name
# and place.
REGISTERS = {"S_ij": ACC_BYTES, "O_i": ACC_BYTES, "X_ij": None}
# The tile an eager matmul uses: fixed, like a cuBLAS kernel's, and independent of M.
MATMUL_TILE = 64


def working_set_bytes(block_rows: int, block_cols: int, d: int, b: int) -> int:
    """Kernels 1 and 3 (kernel 2 picks its rows to fit)."""
    r, c = block_rows, block_cols
    return b * (r * d + c * d + r * c)


def placed_bytes(block_rows: int, block_cols: int, d: int, b: int) -> tuple[int, int]:
    """(shared memory, registers) of kernels 1 and 3 with ``REGISTERS`` (see the header)."""
    r, c = block_rows, block_cols
    return b * (c * d + r * max(d, c)), ACC_BYTES * r * max(c, d)


def default_blocks(n: int, d: int, sram: int, b: int) -> tuple[int, int]:
    B = MATMUL_TILE
    while B > 0 and working_set_bytes(min(B, n), min(B, n), d, b) > sram:
        B //= 2
    return min(B, n), min(B, n)


def softmax_rows(n: int, sram: int, b: int, masked: bool = False) -> int:
    """Whole rows of S that kernel 2 holds at once (0: a row does not fit); ``masked``: a
    row of the dense boolean mask beside each (the fused masked softmax)."""
    return min(n, sram // (n * (b + masked * MASK_BYTES) + 2 * STAT_BYTES))


def matrices(extra_passes) -> list[str]:
    """Names of the N x N matrices in HBM, in order: S, one per extra pass, then P."""
    return ["S"] + [{"scale": "S_scaled", "mask": "S_masked"}[p] for p in extra_passes] + ["P"]


def build(plan) -> Nest:
    N, d, Br, Bc = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols
    b, tau, causal = plan.elem_bytes, 1.0 / math.sqrt(plan.head_dim), plan.causal
    passes = tuple(plan.extra_passes)
    mats = matrices(passes)
    tensors = {"Q": Tensor("Q", N, d, b), "K": Tensor("K", N, d, b),
               "V": Tensor("V", N, d, b), "O": Tensor("O", N, d, b)}
    tensors.update({name: Tensor(name, N, N, b) for name in mats})
    mask, p_drop = getattr(plan, "mask", None), getattr(plan, "dropout", 0.0)
    if mask is not None:
        tensors["mask"] = Tensor("mask", N, N, MASK_BYTES)
    if p_drop:
        tensors["Z"] = Tensor("Z", N, N, MASK_BYTES)
        tensors["P_drop"] = Tensor("P_drop", N, N, b)
    fused_mask = mask is not None and "mask" not in passes    # read by the softmax

    def hide(S, sram, buf):
        """-inf where the dense mask in SRAM buffer ``buf`` says hidden, in place."""
        S[..., ~sram[buf].astype(bool)] = -np.inf
    scale_in_matmul = 1.0 if "scale" in passes else tau

    def s_tile(sram, ctx):
        sram["S_ij"] = scale_in_matmul * (sram["Q_i"] @ np.swapaxes(sram["K_j"], -1, -2))

    kernel1 = Loop("i", Br, N, label="kernel 1: S = Q K^T", parallel=True, body=(
        Load("Q_i", "Q", rows="i"),
        Loop("j", Bc, N, body=(
            Load("K_j", "K", rows="j"),
            Alloc("S_ij", "i", "j", b),
            Compute("S_ij = Q_i K_j^T", s_tile, matmul_flops("i", "j", d),
                    nonmatmul=None if "scale" in passes else (lambda e: e("i") * e("j"))),
            Store("S_ij", "S", rows="i", cols="j"),
        )),
    ))

    def elementwise(name: str):
        def fn(sram, ctx):
            if name == "scale":
                sram["X_ij"] = tau * sram["X_ij"]
            elif mask is not None:    # mask: masked_fill with the dense mask read
                hide(sram["X_ij"], sram, "M_ij")
            elif causal:      # mask: masked_fill with the causal mask
                apply_causal_mask(sram["X_ij"], ctx.range("i"), ctx.range("j"))
        return fn

    pass_loops = tuple(
        Loop("i", Br, N, label=f"pass: {name}", parallel=True, body=(Loop("j", Bc, N, body=(
            Load("X_ij", src, rows="i", cols="j"),
            *((Load("M_ij", "mask", rows="i", cols="j"),)
              if name == "mask" and mask is not None else ()),
            Compute(f"{name} S_ij", elementwise(name),       # masking is a select: no op
                    nonmatmul=(lambda e: e("i") * e("j")) if name == "scale" else None),
            Store("X_ij", dst, rows="i", cols="j"),
        )),))
        for name, src, dst in zip(passes, mats[:-2], mats[1:-1]))

    last = mats[-2]
    R = plan.softmax_rows
    if R >= 1:
        def row_softmax(sram, ctx):
            S = sram["S_r"]
            if causal:
                apply_causal_mask(S, ctx.range("r"), (0, N))
            if fused_mask:
                hide(S, sram, "M_r")
            sram["m_r"] = S.max(axis=-1, keepdims=True)
            P = exp_diff(S, sram["m_r"])
            sram["l_r"] = P.sum(axis=-1, keepdims=True)
            with np.errstate(invalid="ignore"):               # l_r = 0: a row sees nothing
                sram["S_r"] = np.where(sram["l_r"] > 0, P / sram["l_r"], 0.0)

        kernel2 = Loop("r", R, N, label="kernel 2: P = softmax(S), whole rows",
                       parallel=True, body=(
            Load("S_r", last, rows="r"),
            *((Load("M_r", "mask", rows="r"),) if fused_mask else ()),
            Alloc("m_r", "r", 1, STAT_BYTES),
            Alloc("l_r", "r", 1, STAT_BYTES),
            Compute("m_r = rowmax S_r; l_r = rowsum exp(S_r - m_r); P_r = exp(S_r - m_r) / l_r",
                    row_softmax, exps=lambda e: e("r") * N,     # max, -, exp, sum, /
                    nonmatmul=lambda e: 5 * e("r") * N),
            Store("S_r", "P", rows="r"),
        ))
    else:
        def masked_tile(sram, ctx):
            """S_ij with the causal or dense mask applied (in place), as both passes read it."""
            S = sram["S_ij"]
            if causal:
                apply_causal_mask(S, ctx.range("i"), ctx.range("j"))
            if fused_mask:
                hide(S, sram, "M_ij")
            return S

        def stats(sram, ctx):
            S = masked_tile(sram, ctx)
            m_new = np.maximum(sram["m_i"], S.max(axis=-1, keepdims=True))
            sram["l_i"] = (exp_diff(sram["m_i"], m_new) * sram["l_i"]
                           + exp_diff(S, m_new).sum(axis=-1, keepdims=True))
            sram["m_i"] = m_new

        def normalise(sram, ctx):
            S = masked_tile(sram, ctx)
            with np.errstate(invalid="ignore", divide="ignore"):
                sram["S_ij"] = np.where(sram["l_i"] > 0, exp_diff(S, sram["m_i"]) / sram["l_i"],
                                        0.0)

        mload = (Load("M_ij", "mask", rows="i", cols="j"),) if fused_mask else ()
        # P = 0 stored for the tiles the causal mask hides, without reading them (both
        # kernels: docs/model.md, the DRAM misses)
        skip = skips_hidden_tiles(plan)
        visible = (lambda ctx: causal_stop_j(ctx.idx["i"], Br, Bc, N)) if skip else None
        hidden = (Loop("j", Bc, N, start=visible, body=(
            Alloc("S_ij", "i", "j", b, 0.0),
            Store("S_ij", "P", rows="i", cols="j"),
        )),) if skip else ()

        kernel2 = Loop("i", Br, N, label="kernel 2: P = softmax(S), rows too long for SRAM",
                       parallel=True, body=(
                           Alloc("m_i", "i", 1, STAT_BYTES, -np.inf),
                           Alloc("l_i", "i", 1, STAT_BYTES, 0.0),
                           Loop("j", Bc, N, stop=visible, body=(
                               Load("S_ij", last, rows="i", cols="j"),
                               *mload,
                               Compute("online m_i, l_i over S_ij", stats,
                                       exps=lambda e: e("i") * e("j") + e("i"),
                                       nonmatmul=lambda e: 4 * e("i") * e("j") + 3 * e("i")),
                           )),
                           Loop("j", Bc, N, stop=visible, body=(
                               Load("S_ij", last, rows="i", cols="j"),
                               *mload,
                               Compute("P_ij = exp(S_ij - m_i) / l_i", normalise,
                                       exps=lambda e: e("i") * e("j"),
                                       nonmatmul=lambda e: 3 * e("i") * e("j")),
                               Store("S_ij", "P", rows="i", cols="j"),
                           )),
                           *hidden,
                       ))

    def pv(sram, ctx):
        sram["O_i"] = sram["O_i"] + sram["P_ij"] @ sram["V_j"]

    def drop(sram, ctx):
        Zs = dropout_scale(plan.dropout_seed, p_drop, ctx.range("i"), ctx.range("j"))
        sram["Z_ij"] = (Zs > 0).astype(np.float64) + 0 * sram["X_ij"]
        sram["X_ij"] = sram["X_ij"] * Zs

    dropout = (Loop("i", Br, N, label="pass: dropout", parallel=True, body=(
        Loop("j", Bc, N, body=(
            Load("X_ij", "P", rows="i", cols="j"),
            Alloc("Z_ij", "i", "j", MASK_BYTES),
            Compute("Z_ij = keep(seed, offset); P_drop_ij = P_ij o Z_ij / (1 - p)", drop,
                    nonmatmul=lambda e: e("i") * e("j")),
            Store("Z_ij", "Z", rows="i", cols="j"),
            Store("X_ij", "P_drop", rows="i", cols="j"),
        )),)),) if p_drop else ()

    kernel3 = product_kernel(plan, "kernel 3: O = P V", "O_i", "O", (
        Load("P_ij", "P_drop" if p_drop else "P", rows="i", cols="j"),
        Load("V_j", "V", rows="j"),
        Compute("O_i += P_ij V_j", pv, matmul_flops("i", "j", d)),
    ))
    return Nest(tensors, place((kernel1,) + pass_loops + (kernel2,) + dropout + (kernel3,),
                               registers(plan, REGISTERS)))


def closed_form(plan) -> tuple[dict, dict, int]:
    """(read bytes, write bytes, FLOPs) per head, from the formulas in the header."""
    N, d, Br, b = plan.seq_len, plan.head_dim, plan.block_rows, plan.elem_bytes
    Tr, nd, nn = cdiv(N, Br), N * d * b, N * N * b
    mats = matrices(plan.extra_passes)
    read = {"Q": nd, "K": Tr * nd, "V": Tr * nd, "O": 0}
    write = {"Q": 0, "K": 0, "V": 0, "O": nd}
    for name in mats:
        read[name], write[name] = nn, nn
    if plan.softmax_rows == 0:
        read[mats[-2]] = 2 * b * streamed(plan)[0]
    mm = N * N * MASK_BYTES
    if getattr(plan, "mask", None) is not None:       # the dense mask, read once or twice
        fused = "mask" not in plan.extra_passes
        read["mask"], write["mask"] = mm * (2 if fused and plan.softmax_rows == 0 else 1), 0
    if getattr(plan, "dropout", 0.0):                 # the dropout pass; kernel 3 reads P_drop
        read["Z"], write["Z"] = 0, mm
        read["P_drop"], write["P_drop"] = nn, nn
    return read, write, 4 * N * N * d


def closed_form_nonmatmul(plan) -> tuple[int, int]:
    """(exponentials, non-matmul operations) per head, from the formulas in the header."""
    nn = plan.seq_len ** 2
    drop = nn if getattr(plan, "dropout", 0.0) else 0      # the dropout pass's scale
    if plan.softmax_rows >= 1:
        return nn, nn + 5 * nn + drop
    V, tiles = streamed(plan)
    return 2 * V + tiles, nn + 7 * V + 3 * tiles + drop


def skips_hidden_tiles(plan) -> bool:
    """Whether the streaming softmax leaves unread the tiles the mask hides: a fused causal
    softmax does; a dense mask or the ``mask`` pass leaves the softmax reading every tile."""
    return (plan.causal and getattr(plan, "mask", None) is None
            and "mask" not in plan.extra_passes)


def streamed(plan) -> tuple[int, int]:
    """(V, t) of the streaming softmax, per head and pass: the elements of the tiles it reads
    and the sum over them of their rows (N^2 and N T_c; causal: only the tiles with a
    visible element, those before ``causal_stop_j``)."""
    N, Br, Bc = plan.seq_len, plan.block_rows, plan.block_cols
    if not skips_hidden_tiles(plan):
        return N * N, N * cdiv(N, Bc)
    i = np.arange(cdiv(N, Br))
    rows = block_extent(i, Br, N)
    stop = np.array([causal_stop_j(int(k), Br, Bc, N) for k in i])
    return int(np.sum(rows * np.minimum(N, stop * Bc))), int(np.sum(rows * stop))


def check_passes(extra_passes) -> tuple:
    passes = tuple(extra_passes)
    for p in passes:
        if p not in PASSES:
            raise FlashsimError(f"unknown extra pass {p!r}: choose from {', '.join(PASSES)}")
    if len(set(passes)) != len(passes):
        raise FlashsimError(f"extra passes repeat a name: {','.join(passes)}")
    return passes
