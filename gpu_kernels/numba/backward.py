"""The backward pass in numba.cuda, fp32: FlashAttention-2's, and the standard pipeline.

Read it beside ``flashsim/algorithms/flash2_bwd.py`` and ``standard_bwd.py``: same names,
same loops, same order of loads and stores, so flashsim's count of the plan with these
tiles is the traffic these kernels ask of the memory below shared memory.

Versions:

1. ``flash2_backward`` (Dao, 2023, Algorithm 2). Two kernels.
   ``flash2_bwd_preprocess``: for each block of rows, D = rowsum(dO o O) and dQ = 0.
   ``flash2_bwd``: one thread block per (K/V block j, head). K_j, V_j stay in shared
   memory and dK_j, dV_j in registers while the Q blocks i stream through:

       load K_j, V_j                                    read  2 B_c d
       for i (causal: from the first i that K_j reaches):
           load Q_i, dO_i, L_i, D_i                     read  2 B_r d + 2 B_r
           S_ij = tau Q_i K_j^T, masked; P_ij = exp(S_ij - L_i)
           dP_ij = dO_i V_j^T; dS_ij = P_ij o (dP_ij - D_i)    (P_ij, dS_ij to shared)
           dV_j += P_ij^T dO_i; dK_j += tau dS_ij^T Q_i          (registers)
           dQ_i += tau dS_ij K_j                        atomic add of B_r d: the L2 reads
                                                        and writes dQ_i (4 B_r d each way)
       store dK_j, dV_j                                 write 2 B_c d

2. ``standard_backward`` (FlashAttention paper, Algorithm 3). Five kernels, P, dP and dS
   in HBM, with the matmul tiles of flashsim's ``standard`` (64 x 64 by default):
   ``accumulate`` (dV = P^T dO), ``scores`` (dP = dO V^T), ``softmax_bwd_rows``
   (dS = P o (dP - rowsum(P o dP)), one row per thread block, the row in registers),
   ``accumulate`` (dQ = tau dS K) and ``accumulate`` (dK = tau dS^T Q).

``standard_forward`` (S = tau Q K^T, P = softmax(S) with L = logsumexp, O = P V, with the same
kernels) gives what the backward passes read: P for the standard one, O and L for FA2's.

Shapes: Q, K, V, O, dO, dQ, dK, dV are (batch*heads, N, d) inside; L and D (batch*heads, N);
P, dP, dS (batch*heads, N, N). The public functions also take (N, d) or (B, H, N, d).

Shared memory per block, 4-byte words, (n|1) the row stride n rounded up to odd so that
the rows a warp reads at once fall in different banks (``padded``):
``flash2_bwd``: 4 (2 B_c (d|1) + 2 B_r (d|1) + 2 B_r (B_c|1) + 2 B_r), which at d = 64
fits 48 KiB with B_r = B_c = 32 (41,984 B), at d = 128 with 16. flashsim's SRAM model
also counts dK_j, dV_j and the dQ_i partial sums, which this kernel keeps in registers:
its predictions for these tiles use the H200 preset's M (the traffic of given tiles does
not depend on M).

Tiles against flashsim's default rule (H200 preset, M = 48 KiB): the same for
``standard_bwd``; for ``flash2_bwd`` the same at d = 64 and 128, larger below (multiples of
16, not only powers of two).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..common import (KernelInputError, KernelLaunch, check_flag, check_shape, describe,
                      largest_rule)
from .common import NEG_INF, SHARED_LIMIT, NumbaLaunch, cdiv, cuda, float32, split, tree

V3 = "float32[:, :, ::1]"
V2 = "float32[:, ::1]"
SIGNATURES = {
    "flash2_bwd": f"void({V3}, {V3}, {V3}, {V3}, {V2}, {V2}, {V3}, {V3}, {V3}, int64, float32)",
    "flash2_bwd_preprocess": f"void({V3}, {V3}, {V2}, {V3}, int64)",
    "scores": f"void({V3}, {V3}, {V3}, int64, float32)",
    "accumulate": f"void({V3}, {V3}, {V3}, int64, float32)",
    "softmax_rows": f"void({V3}, {V3}, {V2})",
    "softmax_bwd_rows": f"void({V3}, {V3}, {V3})",
}
PRE_ROWS = 16      # rows per block of the FA2 preprocessing kernel
MAX_ROW = 4096     # longest row the row kernels keep in registers (N)


def padded(n: int) -> int:
    """Row stride in words for an n-word row of a shared tile: odd, so that the rows a warp
    reads at once start in different banks."""
    return n if n % 2 else n + 1


# --------------------------------------------------------------------------------------
# Loads and sums every kernel below shares (thread t handles elements t, t + NT, ...)


def _row_loader(ROWS: int, d: int, NT: int, pair: bool):
    """``load(A_s, B_s, A, B, t, bh, row0, N)``: rows row0 .. row0 + ROWS of A (and of B,
    with ``pair``), each (batch*heads, N, d), into shared A_s (B_s); zeros past N."""

    @cuda.jit(device=True, inline="always")
    def load(A_s, B_s, A, B, t, bh, row0, N):
        for e in range(t, ROWS * d, NT):
            r, k = split(e, d)
            if not pair:
                A_s[r, k] = A[bh, row0 + r, k] if row0 + r < N else float32(0)
            elif row0 + r < N:
                A_s[r, k] = A[bh, row0 + r, k]
                B_s[r, k] = B[bh, row0 + r, k]
            else:
                A_s[r, k] = 0
                B_s[r, k] = 0
    return load


def _dots(n: int, along_rows: bool, pair: bool = True):
    """``dots(A, B, C, D, a, b)``: (sum_k A[a, k] B[b, k], sum_k C[a, k] D[b, k]) over k < n
    (``along_rows``), else the same sums over the first index: A[k, a] B[k, b], ...; the
    second is 0 without ``pair``."""

    @cuda.jit(device=True, inline="always")
    def dots(A, B, C, D, a, b):
        x = float32(0)
        y = float32(0)
        for k in range(n):
            if along_rows:
                x += A[a, k] * B[b, k]
                if pair:
                    y += C[a, k] * D[b, k]
            else:
                x += A[k, a] * B[k, b]
                if pair:
                    y += C[k, a] * D[k, b]
        return x, y
    return dots


# --------------------------------------------------------------------------------------
# FlashAttention-2 backward


def flash2_bwd_shared_bytes(B_r: int, B_c: int, d: int) -> int:
    return 4 * (2 * B_c * padded(d) + 2 * B_r * padded(d) + 2 * B_r * padded(B_c) + 2 * B_r)


def flash2_bwd_source(B_r: int, B_c: int, d: int, NT: int, causal: bool):
    """The Python function of the main FA2 backward kernel for one configuration."""
    DS, CS = padded(d), padded(B_c)
    load_KV, load_Q_dO = _row_loader(B_c, d, NT, True), _row_loader(B_r, d, NT, True)
    row_dots, col_dots = _dots(d, True), _dots(B_r, False)
    ES = cdiv(B_r * B_c, NT)        # entries of S_ij each thread computes
    EK = cdiv(B_c * d, NT)          # entries of dK_j and dV_j each thread owns
    EQ = cdiv(B_r * d, NT)          # entries of the dQ_i update each thread computes

    def flash2_bwd(Q, K, V, dO, L, D, dQ, dK, dV, N, tau):
        """Q, K, V, dO, dQ, dK, dV: (batch*heads, N, d); L, D: (batch*heads, N).
        dQ must hold zeros (``flash2_bwd_preprocess``)."""
        j = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        col0 = j * B_c

        K_j = cuda.shared.array((B_c, DS), float32)
        V_j = cuda.shared.array((B_c, DS), float32)
        Q_i = cuda.shared.array((B_r, DS), float32)
        dO_i = cuda.shared.array((B_r, DS), float32)
        P_ij = cuda.shared.array((B_r, CS), float32)
        dS_ij = cuda.shared.array((B_r, CS), float32)
        L_i = cuda.shared.array(B_r, float32)
        D_i = cuda.shared.array(B_r, float32)
        dK_j = cuda.local.array(EK, float32)
        dV_j = cuda.local.array(EK, float32)

        load_KV(K_j, V_j, K, V, t, bh, col0, N)     # load K_j, V_j: read 2 B_c d
        for a in range(EK):
            dK_j[a] = 0
            dV_j[a] = 0

        T_r = (N + B_r - 1) // B_r
        i_start = col0 // B_r if causal else 0    # blocks above the diagonal: skipped
        for i in range(i_start, T_r):
            row0 = i * B_r
            cuda.syncthreads()                    # all done with the last Q_i, dO_i, P, dS
            # load Q_i, dO_i, L_i, D_i: read 2 B_r d + 2 B_r
            load_Q_dO(Q_i, dO_i, Q, dO, t, bh, row0, N)
            for r in range(t, B_r, NT):
                if row0 + r < N:
                    L_i[r] = L[bh, row0 + r]
                    D_i[r] = D[bh, row0 + r]
                else:
                    L_i[r] = 0
                    D_i[r] = 0
            cuda.syncthreads()

            # S_ij = tau Q_i K_j^T; P_ij = exp(S_ij - L_i); dP_ij = dO_i V_j^T;
            # dS_ij = P_ij o (dP_ij - D_i). Masked and out-of-range entries: P = dS = 0.
            for a in range(ES):
                e = t + NT * a
                if e < B_r * B_c:
                    r, c = split(e, B_c)
                    p = float32(0)
                    s, dp = row_dots(Q_i, K_j, dO_i, V_j, r, c)
                    if row0 + r < N and col0 + c < N and not (causal and col0 + c > row0 + r):
                        p = math.exp(tau * s - L_i[r])
                    P_ij[r, c] = p
                    dS_ij[r, c] = p * (dp - D_i[r])
            cuda.syncthreads()

            # dV_j += P_ij^T dO_i; dK_j += tau dS_ij^T Q_i (registers)
            for a in range(EK):
                e = t + NT * a
                if e < B_c * d:
                    c, k = split(e, d)
                    v, g = col_dots(P_ij, dO_i, dS_ij, Q_i, c, k)
                    dV_j[a] += v
                    dK_j[a] += tau * g

            # dQ_i += tau dS_ij K_j: atomic adds, a read-modify-write of dQ_i in the L2
            for a in range(EQ):
                e = t + NT * a
                if e < B_r * d:
                    r, k = split(e, d)
                    if row0 + r < N:
                        q = float32(0)
                        for c in range(B_c):
                            q += dS_ij[r, c] * K_j[c, k]
                        cuda.atomic.add(dQ, (bh, row0 + r, k), tau * q)

        # store dK_j, dV_j: write 2 B_c d
        for a in range(EK):
            e = t + NT * a
            if e < B_c * d:
                c, k = split(e, d)
                if col0 + c < N:
                    dK[bh, col0 + c, k] = dK_j[a]
                    dV[bh, col0 + c, k] = dV_j[a]

    return flash2_bwd


def flash2_bwd_preprocess_source(d: int, NT: int):
    """D = rowsum(dO o O) and dQ = 0, PRE_ROWS rows per block (as FA2's dot_do_o kernel)."""
    DS = padded(d)

    def flash2_bwd_preprocess(O, dO, D, dQ, N):
        """O, dO, dQ: (batch*heads, N, d); D: (batch*heads, N)."""
        row0 = cuda.blockIdx.x * PRE_ROWS
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        prod = cuda.shared.array((PRE_ROWS, DS), float32)
        # read O_i, dO_i: 2 PRE_ROWS d; write dQ_i = 0: PRE_ROWS d
        for e in range(t, PRE_ROWS * d, NT):
            r, k = split(e, d)
            if row0 + r < N:
                prod[r, k] = dO[bh, row0 + r, k] * O[bh, row0 + r, k]
                dQ[bh, row0 + r, k] = 0
            else:
                prod[r, k] = 0
        cuda.syncthreads()
        # write D_i: PRE_ROWS
        for r in range(t, PRE_ROWS, NT):
            if row0 + r < N:
                s = float32(0)
                for k in range(d):
                    s += prod[r, k]
                D[bh, row0 + r] = s

    return flash2_bwd_preprocess


# --------------------------------------------------------------------------------------
# The standard pipeline's kernels


def scores_source(B_r: int, B_c: int, d: int, NT: int):
    """C = alpha A B^T, (N x N) from two (N x d): A_i resident, B_j streamed, C_ij stored
    (flashsim standard's kernel 1, S = tau Q K^T, and standard_bwd's kernel 2, dP = dO V^T)."""
    DS = padded(d)
    EC = cdiv(B_r * B_c, NT)
    load_A, load_B = _row_loader(B_r, d, NT, False), _row_loader(B_c, d, NT, False)
    dot = _dots(d, True, pair=False)

    def scores(A, B, C, N, alpha):
        """A, B: (batch*heads, N, d); C: (batch*heads, N, N)."""
        A_i = cuda.shared.array((B_r, DS), float32)
        B_j = cuda.shared.array((B_c, DS), float32)
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        row0 = i * B_r
        load_A(A_i, A_i, A, A, t, bh, row0, N)            # load A_i: read B_r d
        for j in range((N + B_c - 1) // B_c):
            col0 = j * B_c
            cuda.syncthreads()
            load_B(B_j, B_j, B, B, t, bh, col0, N)        # load B_j: read B_c d
            cuda.syncthreads()
            # store C_ij = alpha A_i B_j^T: write B_r B_c
            for a in range(EC):
                e = t + NT * a
                if e < B_r * B_c:
                    r, c = split(e, B_c)
                    if row0 + r < N and col0 + c < N:
                        s, _ = dot(A_i, B_j, A_i, B_j, r, c)
                        C[bh, row0 + r, col0 + c] = alpha * s

    return scores


def accumulate_source(B_out: int, B_in: int, d: int, NT: int, transpose: bool):
    """out = alpha X Y (or alpha X^T Y with ``transpose``), X (N x N), Y and out (N x d):
    a block of B_out rows of out stays in registers while tiles of X and blocks of Y of
    B_in rows stream (standard's kernel 3, O = P V; standard_bwd's kernels 1, 4, 5)."""
    DS, OS = padded(d), padded(B_out)
    OUT = B_out * d                 # entries of the out block
    EO = cdiv(OUT, NT)              # ... that each thread owns
    load_Y = _row_loader(B_in, d, NT, False)
    dot = _dots(B_in, False, pair=False)

    def accumulate(X, Y, out, N, alpha):
        """X: (batch*heads, N, N); Y, out: (batch*heads, N, d)."""
        o0 = cuda.blockIdx.x * B_out
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        X_t = cuda.shared.array((B_in, OS), float32)   # X_t[u, v]: out row v, sum index u
        Y_t = cuda.shared.array((B_in, DS), float32)
        acc = cuda.local.array(EO, float32)
        for a in range(EO):
            acc[a] = 0
        for tb in range((N + B_in - 1) // B_in):
            t0 = tb * B_in
            cuda.syncthreads()
            # load the X tile (B_in x B_out, read along X's rows) and Y's block: read
            # B_out B_in + B_in d
            for e in range(t, B_in * B_out, NT):
                if transpose:                  # X_t[u, v] = X[t0 + u, o0 + v]
                    u, v = split(e, B_out)
                    ok = t0 + u < N and o0 + v < N
                    X_t[u, v] = X[bh, t0 + u, o0 + v] if ok else float32(0)
                else:                          # X_t[u, v] = X[o0 + v, t0 + u]
                    v, u = split(e, B_in)
                    ok = t0 + u < N and o0 + v < N
                    X_t[u, v] = X[bh, o0 + v, t0 + u] if ok else float32(0)
            load_Y(Y_t, Y_t, Y, Y, t, bh, t0, N)
            cuda.syncthreads()
            for a in range(EO):
                e = t + NT * a
                if e < OUT:
                    v, k = split(e, d)
                    s, _ = dot(X_t, Y_t, X_t, Y_t, v, k)
                    acc[a] += s
        # store the out block: write B_out d
        for a in range(EO):
            e = t + NT * a
            if e < OUT:
                v, k = split(e, d)
                if o0 + v < N:
                    out[bh, o0 + v, k] = alpha * acc[a]

    return accumulate


def softmax_rows_source(N: int, NT: int, causal: bool, ROWS: int = 1):
    """P = softmax(S) row by row and L = logsumexp, ROWS rows per block, one at a time held
    in registers (standard's kernel 2: S read once, P written once)."""
    EPT = cdiv(N, NT)
    tree_max, tree_sum = tree(NT, "max"), tree(NT, "sum")

    def softmax_rows(S, P, L):
        """S, P: (batch*heads, N, N); L: (batch*heads, N)."""
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        red = cuda.shared.array(NT, float32)
        x = cuda.local.array(EPT, float32)
        for r in range(cuda.blockIdx.x * ROWS, min(cuda.blockIdx.x * ROWS + ROWS, N)):
            # read S_r: N (masked and past-N entries are -inf)
            m = NEG_INF
            for a in range(EPT):
                c = t + NT * a
                v = NEG_INF
                if c < N and not (causal and c > r):
                    v = S[bh, r, c]
                x[a] = v
                m = max(m, v)
            cuda.syncthreads()                   # all done reading red for the last row
            red[t] = m
            cuda.syncthreads()
            tree_max(red, t)                     # m_r = rowmax S_r
            m = red[0]
            cuda.syncthreads()
            l_part = float32(0)
            for a in range(EPT):
                x[a] = math.exp(x[a] - m)        # exp(-inf) = 0
                l_part += x[a]
            red[t] = l_part
            cuda.syncthreads()
            tree_sum(red, t)                     # l_r = rowsum exp(S_r - m_r)
            l_row = red[0]
            # write P_r = exp(S_r - m_r) / l_r: N; L_r = m_r + log l_r: 1
            for a in range(EPT):
                c = t + NT * a
                if c < N:
                    P[bh, r, c] = x[a] / l_row
            if t == 0:
                L[bh, r] = m + math.log(l_row)

    return softmax_rows


def softmax_bwd_rows_source(N: int, NT: int, ROWS: int = 1):
    """dS = P o (dP - rowsum(P o dP)), ROWS rows per block, one at a time held in registers
    (standard_bwd's kernel 3: P and dP read once, dS written once)."""
    EPT = cdiv(N, NT)
    tree_sum = tree(NT, "sum")

    def softmax_bwd_rows(P, dP, dS):
        """P, dP, dS: (batch*heads, N, N)."""
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        red = cuda.shared.array(NT, float32)
        x = cuda.local.array(EPT, float32)
        y = cuda.local.array(EPT, float32)
        for r in range(cuda.blockIdx.x * ROWS, min(cuda.blockIdx.x * ROWS + ROWS, N)):
            # read P_r, dP_r: 2 N
            part = float32(0)
            for a in range(EPT):
                c = t + NT * a
                x[a] = P[bh, r, c] if c < N else float32(0)
                y[a] = dP[bh, r, c] if c < N else float32(0)
                part += x[a] * y[a]
            cuda.syncthreads()                   # all done reading red for the last row
            red[t] = part
            cuda.syncthreads()
            tree_sum(red, t)                     # D_r = rowsum(P_r o dP_r)
            D_r = red[0]
            # write dS_r = P_r o (dP_r - D_r): N
            for a in range(EPT):
                c = t + NT * a
                if c < N:
                    dS[bh, r, c] = x[a] * (y[a] - D_r)

    return softmax_bwd_rows


# Compiled kernels, one per configuration (cuda.jit compiles on first launch).
_jit = functools.lru_cache(maxsize=None)
flash2_bwd = _jit(lambda *cfg: cuda.jit(flash2_bwd_source(*cfg)))
flash2_bwd_preprocess = _jit(lambda *cfg: cuda.jit(flash2_bwd_preprocess_source(*cfg)))
scores = _jit(lambda *cfg: cuda.jit(scores_source(*cfg)))
accumulate = _jit(lambda *cfg: cuda.jit(accumulate_source(*cfg)))
softmax_rows = _jit(lambda *cfg: cuda.jit(softmax_rows_source(*cfg)))
softmax_bwd_rows = _jit(lambda *cfg: cuda.jit(softmax_bwd_rows_source(*cfg)))


# --------------------------------------------------------------------------------------
# Launches


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def standard_shared_bytes(B_r: int, B_c: int, d: int, NT: int) -> int:
    """The most shared memory any kernel of the standard pipeline uses."""
    return 4 * max((B_r + B_c) * padded(d),                 # scores
                   B_r * (padded(B_c) + padded(d)),         # accumulate, transposed
                   B_c * (padded(B_r) + padded(d)),         # accumulate
                   NT)                                      # the row kernels


def standard_tile(N: int, d: int, NT: int = 256) -> int:
    """The matmul tile: flashsim standard's 64, halved until the kernels fit 48 KiB, capped
    at N (the tile policy's ``largest_rule``)."""
    B = largest_rule((64, 32, 16, 8, 4, 2, 1),
                     lambda B: B == 1 or standard_shared_bytes(B, B, d, NT) <= SHARED_LIMIT)
    return min(B, N)


def default_flash2_blocks(d: int) -> int:
    """The largest of 64, 32, 16, 8 whose flash2_bwd tiles fit in 48 KiB (the tile
    policy's ``largest_rule``)."""
    try:
        return largest_rule((64, 32, 16, 8),
                            lambda B: flash2_bwd_shared_bytes(B, B, d) <= SHARED_LIMIT)
    except KernelInputError:
        raise KernelInputError(f"head dimension d = {d}: no flash2_bwd tile fits in "
                               f"{SHARED_LIMIT} B") from None


@dataclass
class BackwardLaunch(NumbaLaunch):
    """One configuration of one backward pipeline (``pass_`` "bwd"; ``threads`` per block, a
    power of two). Inputs inside ``run`` are device arrays (batch*heads, N, d); ``L`` is
    (batch*heads, N), ``P`` (batch*heads, N, N). Its plan (``Launch.plan``) is flashsim's
    backward with these tiles on the preset's SRAM (see the module docstring)."""
    rows_per_block: int = 1     # rows of P per block in the row kernels

    @property
    def MAIN(self) -> str:     # noqa: N802 - the class attribute of Launch, per algorithm
        return "flash2_bwd" if self.algorithm == "flash2" else "accumulate"

    def launches(self) -> list[KernelLaunch]:
        N, BH, NT = self.N, self.BH, self.threads
        rows, cols = (cdiv(N, self.block_rows), BH), (cdiv(N, self.block_cols), BH)
        if self.algorithm == "flash2":
            return [KernelLaunch("flash2_bwd_preprocess", (cdiv(N, PRE_ROWS), BH), NT),
                    KernelLaunch("flash2_bwd", cols, NT, step=1)]
        return [KernelLaunch("accumulate", cols, NT, step=0),                       # dV
                KernelLaunch("scores", rows, NT, step=1),                           # dP
                KernelLaunch("softmax_bwd_rows", (cdiv(N, self.rows_per_block), BH), NT),  # dS
                KernelLaunch("accumulate", rows, NT, step=3),                       # dQ
                KernelLaunch("accumulate", cols, NT, step=4)]                       # dK

    def run(self, Q, K, V, dO, saved: dict):
        """(dQ, dK, dV) as device arrays; ``saved`` holds the forward's tensors: ``O`` and
        ``L`` for flash2, ``P`` for standard (see ``forward``)."""
        Q, K, V, dO = (self.device(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V"), (dO, "dO")))
        self.launched = []
        if self.algorithm == "flash2":
            return self._flash2(Q, K, V, dO, self.device(saved["O"], "O"),
                                self.device(saved["L"], "L", (self.BH, self.N)))
        return self._standard(Q, K, V, dO, self.device(saved["P"], "P", (self.BH, self.N, self.N)))

    def _flash2(self, Q, K, V, dO, O, L):
        BH, N, d, NT = self.BH, self.N, self.d, self.threads
        Br, Bc = self.block_rows, self.block_cols
        dQ, dK, dV = (self.buffer(n, (BH, N, d)) for n in ("dQ", "dK", "dV"))
        D = self.buffer("D", (BH, N))
        pre, main = self.launches()
        self.launch(flash2_bwd_preprocess(d, NT), pre, O, dO, D, dQ, N)
        self.launch(flash2_bwd(Br, Bc, d, NT, self.causal), main,
                    Q, K, V, dO, L, D, dQ, dK, dV, N, float32(self.tau))
        return dQ, dK, dV

    def _standard(self, Q, K, V, dO, P):
        BH, N, d, NT = self.BH, self.N, self.d, self.threads
        Br, Bc = self.block_rows, self.block_cols
        dQ, dK, dV = (self.buffer(n, (BH, N, d)) for n in ("dQ", "dK", "dV"))
        dP, dS = self.buffer("dP", (BH, N, N)), self.buffer("dS", (BH, N, N))
        one, tau = float32(1), float32(self.tau)
        k_dV, k_dP, k_dS, k_dQ, k_dK = self.launches()
        # dV = P^T dO; dP = dO V^T; dS = P o (dP - rowsum(P o dP)); dQ = tau dS K;
        # dK = tau dS^T Q: flashsim standard_bwd's kernels 1 to 5
        self.launch(accumulate(Bc, Br, d, NT, True), k_dV, P, dO, dV, N, one)
        self.launch(scores(Br, Bc, d, NT), k_dP, dO, V, dP, N, one)
        self.launch(softmax_bwd_rows(N, NT, self.rows_per_block), k_dS, P, dP, dS)
        self.launch(accumulate(Br, Bc, d, NT, False), k_dQ, dS, K, dQ, N, tau)
        self.launch(accumulate(Bc, Br, d, NT, True), k_dK, dS, Q, dK, N, tau)
        return dQ, dK, dV

    def forward(self, Q, K, V):
        """The standard forward with the standard tiles of this launch's shape: returns
        device arrays O (BH, N, d), P (BH, N, N) and L (BH, N). S lives in the workspace."""
        Q, K, V = (self.device(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V")))
        BH, N, d, NT = self.BH, self.N, self.d, self.threads
        B = standard_tile(N, d, NT) if self.algorithm == "flash2" else self.block_rows
        S, P = self.buffer("S", (BH, N, N)), self.buffer("P", (BH, N, N))
        L, O = self.buffer("L", (BH, N)), self.buffer("O", (BH, N, d))
        scores(B, B, d, NT)[(cdiv(N, B), BH), NT](Q, K, S, N, float32(self.tau))
        R = self.rows_per_block
        softmax_rows(N, NT, self.causal, R)[(cdiv(N, R), BH), NT](S, P, L)
        accumulate(B, B, d, NT, False)[(cdiv(N, B), BH), NT](P, V, O, N, float32(1))
        return O, P, L


def configure(algorithm: str, shape, *, causal: bool = False, block_rows=None,
              block_cols=None, threads=None, rows_per_block: int = 1) -> BackwardLaunch:
    """The launch for inputs of ``shape`` ((N, d) or (B, H, N, d)), validated.

    flash2: B_r = B_c = ``default_flash2_blocks(d)`` unless given, 256 threads.
    standard: ``standard_tile`` (flashsim's 64 x 64 where it fits) unless given, 256 threads."""
    if algorithm not in ("flash2", "standard"):
        raise KernelInputError(f"algorithm {algorithm!r}: choose flash2 or standard")
    check_flag(bool(causal), "causal")
    B, H, N, d = check_shape(shape)
    NT = 256 if threads is None else int(threads)
    if not _pow2(NT) or NT > 1024:
        raise KernelInputError(f"threads = {NT}: a power of two up to 1024")
    if algorithm == "flash2":
        Br0 = Bc0 = default_flash2_blocks(d)
    else:
        Br0 = Bc0 = standard_tile(N, d, NT)
    Br = Br0 if block_rows is None else int(block_rows)
    Bc = Bc0 if block_cols is None else int(block_cols)
    if algorithm == "standard" and N > MAX_ROW:
        raise KernelInputError(f"N = {N}: the row kernels hold a row in registers, N <= {MAX_ROW}")
    if algorithm == "flash2":
        need = flash2_bwd_shared_bytes(Br, Bc, d)
    else:
        need = standard_shared_bytes(Br, Bc, d, NT)
    if need > SHARED_LIMIT:
        raise KernelInputError(f"{algorithm} backward: B_r={Br}, B_c={Bc}, d={d} needs {need} B of "
                               f"shared memory; numba kernels get {SHARED_LIMIT} B")
    if int(rows_per_block) < 1:
        raise KernelInputError(f"rows_per_block = {rows_per_block}: at least 1")
    return BackwardLaunch(f"numba_{algorithm}_bwd", algorithm, B, H, N, d, "fp32", bool(causal),
                          Br, Bc, NT, need, 0, None, "bwd", rows_per_block=int(rows_per_block))


def configure_flash2(B: int, H: int, N: int, d: int, **kw) -> BackwardLaunch:
    """``configure("flash2", (B, H, N, d), **kw)``: the registry's entry point."""
    return configure("flash2", (B, H, N, d), **kw)


def configure_standard(B: int, H: int, N: int, d: int, **kw) -> BackwardLaunch:
    """``configure("standard", (B, H, N, d), **kw)``: the registry's entry point."""
    return configure("standard", (B, H, N, d), **kw)


# --------------------------------------------------------------------------------------
# Host API: NumPy in, NumPy out


def _launch_for(algorithm, Q, causal, block_rows, block_cols, threads, rows_per_block=1):
    describe(Q, "Q")
    return configure(algorithm, Q.shape, causal=causal, block_rows=block_rows,
                     block_cols=block_cols, threads=threads, rows_per_block=rows_per_block)


def standard_forward(Q, K, V, *, causal=False, block_rows=None, threads=None,
                     rows_per_block=1):
    """O, P, L of softmax(Q K^T / sqrt(d)) V by the eager kernels; float32 numpy in, numpy
    out (shapes (..., N, d), (..., N, N), (..., N))."""
    launch = _launch_for("standard", Q, causal, block_rows, block_rows, threads, rows_per_block)
    lead, N, d = tuple(Q.shape[:-2]), launch.N, launch.d
    O, P, L = launch.forward(Q, K, V)
    return (O.copy_to_host().reshape(lead + (N, d)), P.copy_to_host().reshape(lead + (N, N)),
            L.copy_to_host().reshape(lead + (N,)))


def flash2_backward(Q, K, V, O, L, dO, *, causal=False, block_rows=None, block_cols=None,
                    threads=None):
    """(dQ, dK, dV) by FlashAttention-2's backward. Q, K, V, O, dO: float32 (..., N, d);
    L: (..., N), the forward's logsumexp. numpy in, numpy out."""
    launch = _launch_for("flash2", Q, causal, block_rows, block_cols, threads)
    return tuple(g.copy_to_host().reshape(Q.shape)
                 for g in launch.run(Q, K, V, dO, {"O": O, "L": L}))


def standard_backward(Q, K, V, P, dO, *, causal=False, block_rows=None, block_cols=None,
                      threads=None, rows_per_block=1):
    """(dQ, dK, dV) by the standard pipeline (P, dP, dS in HBM). Q, K, V, dO: float32
    (..., N, d); P: (..., N, N), the forward's softmax. numpy in, numpy out."""
    launch = _launch_for("standard", Q, causal, block_rows, block_cols, threads, rows_per_block)
    return tuple(g.copy_to_host().reshape(Q.shape) for g in launch.run(Q, K, V, dO, {"P": P}))
