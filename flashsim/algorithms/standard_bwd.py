"""Standard attention backward (FlashAttention paper, Algorithm 3), as eager frameworks run it.

Versions: one, with the backward of each extra elementwise pass of the forward.

It reads what the forward saved in HBM, the N x N matrix P, and materialises dP and dS in
HBM. The matmul tiles are the forward's (fixed, cuBLAS-like, 64 x 64 by default); in each
matmul kernel the output block stays in SRAM while the other operand streams, as in the
forward's kernels 1 and 3.

    kernel 1  dV = P^T dO      for each K/V block j (dV_j accumulated in SRAM):
                               for each i: load P_ij, dO_i; then store dV_j       (line 1)
    kernel 2  dP = dO V^T      for each Q block i (dO_i resident):
                               for each j: load V_j, store dP_ij                  (line 2)
    kernel 3  dX = P o (dP - rowsum(P o dP))   the softmax backward, R whole rows at a time,
                               R = floor(M / (2 N b + 4)): P and dP read once, dX written once.
                               When a row of P and one of dP do not fit together, two passes
                               over tiles (the row sums, then dX): P and dP read twice.  (line 3)
    passes    one per extra forward pass, in reverse order, each a full read and write of
              an N x N gradient: ``mask`` -> masked_fill(dX, mask, 0); ``scale`` -> tau dX.
    kernel 4  dQ = dS K        for each i (dQ_i in SRAM): for each j: load dS_ij, K_j   (line 4)
    kernel 5  dK = dS^T Q      for each j (dK_j in SRAM): for each i: load dS_ij, Q_i   (line 5)

The softmax's input gradient is dS, or d(S_masked) and so on when the forward had extra
passes (``gradients``). The 1/sqrt(d) of kernels 4 and 5 rides in the matmul (cuBLAS's
alpha) unless the forward had a separate ``scale`` pass, whose backward then scales dS.
A causal mask does not shrink the work: P is 0 above the diagonal, so dS is too.

Traffic per head, with b bytes per element, T_r = ceil(N / B_r), T_c = ceil(N / B_c):

    read  Q: T_c N d b      read  K, V: T_r N d b each      read dO: (T_c + 1) N d b
    write dQ, dK, dV: N d b each
    read  P: 2 N^2 b (kernels 1 and 3)     dP: written N^2 b, read N^2 b
    each gradient of an N x N matrix (dS, one per pass): written N^2 b, read N^2 b;
    dS read twice (kernels 4 and 5): 2 N^2 b
    (kernel 3 reads P and dP twice, one N^2 b more each, when a row does not fit)

FLOPs: 8 N^2 d (four matmuls). Outside the matmuls (``flashsim.nest.Compute`` says what
counts): no exponentials (P is read, not recomputed); the softmax backward 4 N^2; the
1/sqrt(d) scale either as the ``scale`` pass's backward, N^2, or on each tile product of
kernels 4 and 5 as the code applies it, N d (T_c + T_r).
SRAM working set: b (B_r d + B_c d + B_r B_c) for the matmul kernels; R (2 N b + 4) for
kernel 3, or 2 b B_r B_c + 4 B_r when it streams tiles.
With a mask (``plan.mask``) the ``mask`` pass's backward reads the dense boolean mask again
(N^2 bytes); without that pass nothing more is read (P is 0 where masked, so dS is). With
dropout (``plan.dropout``) kernel 1 reads P_drop (the forward's P o Z / (1 - p)) instead of
P, kernel 2 writes dP_drop, and a dropout-backward pass reads dP_drop and the stored keep
mask Z (N^2 bytes) and writes dP = dP_drop o Z / (1 - p): N^2 (2 b + 1) bytes more, and N^2
operations.
Placed as GEMM kernels place it (``placement="registers"``, ``REGISTERS``): operand tiles in
shared memory, b max(B_r B_c + B_r d, B_r d + B_c d, B_r B_c + B_c d) for the matmul kernels
and b B_r B_c + 4 B_r (P_ij, D_i) when kernel 3 streams tiles; the fp32 accumulators dV_j,
dP_ij, dQ_i, dK_j (and the streamed dP_ij, and an elementwise pass's tiles) in registers,
4 max(B_c d, B_r B_c, B_r d). Kernel 3's whole rows stay in shared memory, as above.
"""

from __future__ import annotations

import math

import numpy as np

from ..nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor, place
from ..units import STAT_BYTES, cdiv
from . import standard
from ._common import ACC_BYTES, matmul_flops, product_kernel, registers
from .standard import MASK_BYTES

# The buffers a kernel keeps in registers, with their bytes per element there (None: as in
# HBM). Kernel 3's streamed dP_ij tile shares kernel 2's name and place.
REGISTERS = {"dV_j": ACC_BYTES, "dP_ij": ACC_BYTES, "dQ_i": ACC_BYTES, "dK_j": ACC_BYTES,
             "X_ij": None}



def working_set_bytes(block_rows: int, block_cols: int, d: int, b: int) -> int:
    """The larger of the matmul kernels' and the streaming softmax backward's."""
    r, c = block_rows, block_cols
    return max(b * (r * d + c * d + r * c), 2 * b * r * c + STAT_BYTES * r)


def placed_bytes(block_rows: int, block_cols: int, d: int, b: int) -> tuple[int, int]:
    """(shared memory, registers) with ``REGISTERS``: the larger of the matmul kernels' and
    the streaming softmax backward's, as ``working_set_bytes`` (see the header)."""
    r, c = block_rows, block_cols
    shared = max(b * max(r * c + r * d, r * d + c * d, r * c + c * d), b * r * c + STAT_BYTES * r)
    return shared, ACC_BYTES * max(c * d, r * c, r * d)


def default_blocks(n: int, d: int, sram: int, b: int) -> tuple[int, int]:
    """The forward's fixed tile (64 x 64), halved only when it does not fit."""
    B = standard.MATMUL_TILE
    while B > 0 and working_set_bytes(min(B, n), min(B, n), d, b) > sram:
        B //= 2
    return min(B, n), min(B, n)


def softmax_bwd_rows(n: int, sram: int, b: int) -> int:
    """Whole rows of P and dP that kernel 3 holds at once (0: a pair does not fit)."""
    return min(n, sram // (2 * n * b + STAT_BYTES))


def gradients(extra_passes) -> list[str]:
    """The N x N gradients in HBM besides dP, in the forward's order: dS, then one per pass
    (dS_scaled, dS_masked); kernel 3 writes the last, kernels 4 and 5 read dS."""
    return ["d" + name for name in standard.matrices(extra_passes)[:-1]]


def _zero_masked(X: np.ndarray, rows: tuple[int, int], cols: tuple[int, int]) -> None:
    """masked_fill's backward: the gradient is 0 where key c comes after query r."""
    r = np.arange(rows[0], rows[1])[:, None]
    c = np.arange(cols[0], cols[1])[None, :]
    X[..., c > r] = 0.0


def build(plan) -> Nest:
    N, d, Br, Bc = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols
    b, tau, causal = plan.elem_bytes, 1.0 / math.sqrt(plan.head_dim), plan.causal
    passes = tuple(plan.extra_passes)
    grads = gradients(passes)
    tensors = {name: Tensor(name, N, d, b) for name in ("Q", "K", "V", "dO", "dQ", "dK", "dV")}
    tensors.update({name: Tensor(name, N, N, b) for name in ["P", "dP"] + grads})
    mask, p_drop = getattr(plan, "mask", None), getattr(plan, "dropout", 0.0)
    if mask is not None and "mask" in passes:
        tensors["mask"] = Tensor("mask", N, N, MASK_BYTES)
    if p_drop:
        tensors.update({"P_drop": Tensor("P_drop", N, N, b), "Z": Tensor("Z", N, N, MASK_BYTES),
                        "dP_drop": Tensor("dP_drop", N, N, b)})
    alpha = 1.0 if "scale" in passes else tau       # the matmul's scale for dQ and dK
    T = np.swapaxes

    def dv(sram, ctx):
        sram["dV_j"] = sram["dV_j"] + T(sram["P_ij"], -1, -2) @ sram["dO_i"]

    kernel1 = product_kernel(plan, "kernel 1: dV = P^T dO", "dV_j", "dV", (
        Load("P_ij", "P_drop" if p_drop else "P", rows="i", cols="j"),
        Load("dO_i", "dO", rows="i"),
        Compute("dV_j += P_ij^T dO_i", dv, matmul_flops("i", "j", d)),
    ))

    def dp(sram, ctx):
        sram["dP_ij"] = sram["dO_i"] @ T(sram["V_j"], -1, -2)

    kernel2 = Loop("i", Br, N, label="kernel 2: dP = dO V^T", parallel=True, body=(
        Load("dO_i", "dO", rows="i"),
        Loop("j", Bc, N, body=(
            Load("V_j", "V", rows="j"),
            Alloc("dP_ij", "i", "j", b),
            Compute("dP_ij = dO_i V_j^T", dp, matmul_flops("i", "j", d)),
            Store("dP_ij", "dP_drop" if p_drop else "dP", rows="i", cols="j"),
        )),
    ))

    def undrop(sram, ctx):
        sram["X_ij"] = sram["X_ij"] * sram["Z_ij"] / (1.0 - p_drop)

    dropout = (Loop("i", Br, N, label="pass: backward of dropout", parallel=True, body=(
        Loop("j", Bc, N, body=(
            Load("X_ij", "dP_drop", rows="i", cols="j"),
            Load("Z_ij", "Z", rows="i", cols="j"),
            Compute("dP_ij = dP_drop_ij o Z_ij / (1 - p)", undrop,
                    nonmatmul=lambda e: e("i") * e("j")),
            Store("X_ij", "dP", rows="i", cols="j"),
        )),)),) if p_drop else ()

    R = softmax_bwd_rows(N, plan.sram_bytes, b)
    if R >= 1:
        def row_softmax_bwd(sram, ctx):
            P, dP = sram["P_r"], sram["dP_r"]
            sram["D_r"] = (P * dP).sum(axis=-1, keepdims=True)
            sram["dP_r"] = P * (dP - sram["D_r"])

        kernel3 = Loop("r", R, N, label="kernel 3: softmax backward, whole rows",
                       parallel=True, body=(
            Load("P_r", "P", rows="r"),
            Load("dP_r", "dP", rows="r"),
            Alloc("D_r", "r", 1, STAT_BYTES),
            Compute("D_r = rowsum(P_r o dP_r); dX_r = P_r o (dP_r - D_r)", row_softmax_bwd,
                    nonmatmul=lambda e: 4 * e("r") * N),        # x, +; -, x
            Store("dP_r", grads[-1], rows="r"),
        ))
    else:
        def rowsum(sram, ctx):
            sram["D_i"] = sram["D_i"] + (sram["P_ij"] * sram["dP_ij"]).sum(axis=-1, keepdims=True)

        def ds(sram, ctx):
            sram["dP_ij"] = sram["P_ij"] * (sram["dP_ij"] - sram["D_i"])

        kernel3 = Loop("i", Br, N, label="kernel 3: softmax backward, rows too long for SRAM",
                       parallel=True, body=(
                           Alloc("D_i", "i", 1, STAT_BYTES, 0.0),
                           Loop("j", Bc, N, body=(
                               Load("P_ij", "P", rows="i", cols="j"),
                               Load("dP_ij", "dP", rows="i", cols="j"),
                               Compute("D_i += rowsum(P_ij o dP_ij)", rowsum,
                                       nonmatmul=lambda e: 2 * e("i") * e("j")),
                           )),
                           Loop("j", Bc, N, body=(
                               Load("P_ij", "P", rows="i", cols="j"),
                               Load("dP_ij", "dP", rows="i", cols="j"),
                               Compute("dX_ij = P_ij o (dP_ij - D_i)", ds,
                                       nonmatmul=lambda e: 2 * e("i") * e("j")),
                               Store("dP_ij", grads[-1], rows="i", cols="j"),
                           )),
                       ))

    def elementwise_bwd(name: str):
        def fn(sram, ctx):
            if name == "scale":
                sram["X_ij"] = tau * sram["X_ij"]
            elif mask is not None:    # masked_fill(dX, mask, 0), the dense mask read
                sram["X_ij"][..., ~sram["M_ij"].astype(bool)] = 0.0
            elif causal:      # mask: masked_fill(dX, mask, 0)
                _zero_masked(sram["X_ij"], ctx.range("i"), ctx.range("j"))
        return fn

    pass_loops = tuple(
        Loop("i", Br, N, label=f"pass: backward of {name}", parallel=True,
             body=(Loop("j", Bc, N, body=(
            Load("X_ij", src, rows="i", cols="j"),
            *((Load("M_ij", "mask", rows="i", cols="j"),)
              if name == "mask" and mask is not None else ()),
            Compute(f"backward of {name} on dX_ij", elementwise_bwd(name),
                    nonmatmul=(lambda e: e("i") * e("j")) if name == "scale" else None),
            Store("X_ij", dst, rows="i", cols="j"),
        )),))
        for name, src, dst in reversed(list(zip(passes, grads[1:], grads[:-1]))))

    def dq(sram, ctx):
        sram["dQ_i"] = sram["dQ_i"] + alpha * (sram["dS_ij"] @ sram["K_j"])

    kernel4 = product_kernel(plan, "kernel 4: dQ = dS K", "dQ_i", "dQ", (
        Load("dS_ij", "dS", rows="i", cols="j"),
        Load("K_j", "K", rows="j"),
        Compute("dQ_i += tau dS_ij K_j", dq, matmul_flops("i", "j", d),
                nonmatmul=None if "scale" in passes else (lambda e: e("i") * d)),
    ))

    def dk(sram, ctx):
        sram["dK_j"] = sram["dK_j"] + alpha * (T(sram["dS_ij"], -1, -2) @ sram["Q_i"])

    kernel5 = product_kernel(plan, "kernel 5: dK = dS^T Q", "dK_j", "dK", (
        Load("dS_ij", "dS", rows="i", cols="j"),
        Load("Q_i", "Q", rows="i"),
        Compute("dK_j += tau dS_ij^T Q_i", dk, matmul_flops("i", "j", d),
                nonmatmul=None if "scale" in passes else (lambda e: e("j") * d)),
    ))
    return Nest(tensors, place((kernel1, kernel2) + dropout + (kernel3,) + pass_loops
                               + (kernel4, kernel5),
                               registers(plan, REGISTERS)))


def closed_form(plan) -> tuple[dict, dict, int]:
    """(read bytes, write bytes, FLOPs) per head, from the formulas in the header."""
    N, d, Br, Bc, b = plan.seq_len, plan.head_dim, plan.block_rows, plan.block_cols, plan.elem_bytes
    Tr, Tc, nd, nn = cdiv(N, Br), cdiv(N, Bc), N * d * b, N * N * b
    grads = gradients(plan.extra_passes)
    twice = softmax_bwd_rows(N, plan.sram_bytes, b) == 0       # kernel 3 streams tiles
    read = {"Q": Tc * nd, "K": Tr * nd, "V": Tr * nd, "dO": (Tc + 1) * nd,
            "dQ": 0, "dK": 0, "dV": 0,
            "P": 2 * nn + twice * nn, "dP": nn + twice * nn}
    write = {"Q": 0, "K": 0, "V": 0, "dO": 0, "dQ": nd, "dK": nd, "dV": nd, "P": 0, "dP": nn}
    for name in grads:
        read[name], write[name] = nn, nn
    read["dS"] = 2 * nn
    mm = N * N * MASK_BYTES
    if getattr(plan, "mask", None) is not None and "mask" in plan.extra_passes:
        read["mask"], write["mask"] = mm, 0
    if getattr(plan, "dropout", 0.0):     # kernel 1 reads P_drop; the pass makes dP
        read["P"] -= nn
        read["P_drop"], write["P_drop"] = nn, 0
        read["Z"], write["Z"] = mm, 0
        read["dP_drop"], write["dP_drop"] = nn, nn
    return read, write, 8 * N * N * d


def closed_form_nonmatmul(plan) -> tuple[int, int]:
    """(exponentials, non-matmul operations) per head, from the formulas in the header."""
    N, d = plan.seq_len, plan.head_dim
    drop = N * N if getattr(plan, "dropout", 0.0) else 0       # the dropout backward's scale
    if "scale" in plan.extra_passes:
        return 0, 5 * N * N + drop
    return 0, (4 * N * N + N * d * (cdiv(N, plan.block_cols) + cdiv(N, plan.block_rows))
               + drop)
