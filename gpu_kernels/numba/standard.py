"""Standard attention in numba.cuda, fp32: the three kernels of flashsim's ``standard``.

Versions: one, three launches, as eager frameworks run attention. Read it beside
``flashsim/algorithms/standard.py``: same tiles, same loops, same loads and stores.

    kernel 1  S = tau Q K^T    one thread block per (Q block i, head); Q_i stays in shared
                               memory; for each K block j: load K_j, compute S_ij (tau
                               rides in the matmul, like cuBLAS's alpha), store S_ij.
                               read N d + T_r N d, write N^2 (per head)
    kernel 2  P = softmax(S)   one thread block per row r of S (causal: keys c > r get 0).
                               If a row fits in shared memory (flashsim's softmax_rows >= 1
                               and 4 N bytes plus the reduction arrays fit in 48 KiB): load
                               it once, then max, sum, normalise from shared memory: read
                               N^2, write N^2. Otherwise stream it twice: an online max/sum
                               sweep, then a normalising sweep: read 2 N^2, write N^2.
    kernel 3  O = P V          one thread block per (Q block i, head); O_i accumulates in
                               registers; for each j: load P_ij and V_j.
                               read N^2 + T_r N d, write N d

HBM traffic: flashsim.standard's closed form (``predicted_traffic`` asks flashsim); the
differences are the rare N for which flashsim fits a row of S in 48 KiB but this kernel,
which also keeps 2 x 128 reduction words, does not (12033 <= N <= 12286): there it streams;
and, when it streams under a causal mask, the hidden keys of the tiles on the diagonal:
row r reads keys 0..r, where flashsim reads every tile with a visible element whole (at
most B_c / N more of S).
kernel 2 holds one row per block where flashsim's model holds R = floor(M / (4N + 8))
rows per block: the same bytes, since rows are independent. Under a causal mask S is
computed in full and masked inside the softmax, as eager code does; a streaming softmax
reads only the keys a row sees.

Kernels 1 and 3 use ``numba.common.tile_ops``' register-tiled device functions, each with
its own thread layout (a tiling for the Q_i, K_j^T arrays and one for P_ij^T, V_j). Tiles:
flashsim's SRAM rule at 48 KiB (the tile policy's ``sram_rule``); shared memory: the larger
of kernel 1's Q_i^T, K_j^T and kernel 3's P_ij^T, V_j (``Tiling.shared_words``), and kernel
2's 4 N bytes (dynamic) plus 2 x 4 NT.

Tiles against flashsim's default rule: the same as its rule for this placement (S_ij and
O_i in registers) on the H200 preset with M = 48 KiB, this kernel's shared memory.
"""

from __future__ import annotations

import functools
import math

from ..common import KernelLaunch, Result, cdiv, check_flag, check_shape
from .common import (ALIGN, MAX_HEAD_DIM, NEG_INF, SHARED_LIMIT, WORD, NumbaLaunch, Tiling,
                     check_shared, check_tiling, cuda, float32, own, plan_blocks, tile_ops)

ALGORITHM = "standard"
ARRAYS_QK = ("Q", "K")          # shared arrays of kernel 1
ARRAYS_PV = ("P", "V")          # shared arrays of kernel 3
ARRAYS = ARRAYS_QK              # (for tools that take one tiling per module)
SOFTMAX_THREADS = 128
SIGNATURE_QK = ("void(float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int64, "
                "float32)")
SIGNATURE_SOFTMAX = "void(float32[:, :, ::1], float32[:, :, ::1], int64)"
SIGNATURE_PV = "void(float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int64)"


@functools.lru_cache(maxsize=None)
def qk_kernel(tiling):
    """Kernel 1; grid (T_r, batch*heads), TR*TC threads."""
    B_r, B_c, RM, CN, VR, VC, RG, CG, d_p, QS, KS = \
        tiling.values("B_r B_c RM CN VR VC RG CG d_p QS KS")
    ops = tile_ops(tiling)
    load_Q, load_K, qk, block_start = ops.load_Q, ops.load_K, ops.qk, ops.block_start

    def scores(Q, K, S, N, tau):
        """Q, K: (batch*heads, N, d); S: (batch*heads, N, N) = tau Q K^T."""
        i, bh, t, r0, c0, _ = block_start()       # Q block i; this thread's first row, column
        row0 = i * B_r

        Q_iT = cuda.shared.array((d_p, QS), float32, alignment=ALIGN)     # Q_i^T (d, B_r)
        K_jT = cuda.shared.array((d_p, KS), float32, alignment=ALIGN)     # K_j^T (d, B_c)
        S_ij = cuda.local.array((RM, CN), float32)
        x = cuda.local.array(RM, float32)
        y = cuda.local.array(CN, float32)

        load_Q(Q_iT, Q, t, bh, row0, N)          # load Q_i: read B_r d
        T_c = (N + B_c - 1) // B_c
        for j in range(T_c):
            col0 = j * B_c
            cuda.syncthreads()                   # all done with the last K_j
            load_K(K_jT, K, t, bh, col0, N)      # load K_j: read B_c d
            cuda.syncthreads()
            qk(S_ij, Q_iT, K_jT, r0, c0, x, y)   # S_ij = Q_i K_j^T (this thread's RM x CN)
            # store tau S_ij: write B_r B_c
            for a in range(RM):
                r = own(r0, RG, VR, a)
                if r < B_r and row0 + r < N:
                    for b in range(CN):
                        cc = own(c0, CG, VC, b)
                        if cc < B_c and col0 + cc < N:
                            S[bh, row0 + r, col0 + cc] = tau * S_ij[a, b]

    return cuda.jit(scores)


def _pow2_at_least(n: int, cap: int) -> int:
    p = 1
    while p < min(n, cap):
        p *= 2
    return p


def softmax_threads(N: int) -> int:
    """Threads per row: a power of two (for the reduction tree) giving each thread about
    four keys, at most 128."""
    return _pow2_at_least(cdiv(N, 4), SOFTMAX_THREADS)

@functools.lru_cache(maxsize=None)
def softmax_kernel(NT: int, row_fits: bool, causal: bool):
    """Kernel 2; grid (N, batch*heads), NT threads, 4 N bytes of dynamic shared memory
    when ``row_fits``."""

    def row_softmax(S, P, N):
        """S, P: (batch*heads, N, N); P[r] = softmax(S[r]) over the keys row r sees."""
        row = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        S_r = cuda.shared.array(0, float32)      # the whole row, N words, when it fits
        red_m = cuda.shared.array(NT, float32)   # reduction trees over the NT threads
        red_l = cuda.shared.array(NT, float32)
        last = row if causal else N - 1          # keys c <= last are seen

        if row_fits:
            # load S_r: read N; this thread's part of m_r = rowmax S_r
            m_r = NEG_INF
            for c in range(t, N, NT):
                s = S[bh, row, c]
                S_r[c] = s
                if c <= last:
                    m_r = max(m_r, s)
            red_m[t] = m_r
            cuda.syncthreads()
            h = NT // 2
            while h > 0:                         # m_r = max over the threads
                if t < h:
                    red_m[t] = max(red_m[t], red_m[t + h])
                cuda.syncthreads()
                h //= 2
            m_r = red_m[0]
            # S_r = exp(S_r - m_r), 0 for masked keys; l_r = rowsum
            l_r = float32(0)
            for c in range(t, N, NT):
                p = math.exp(S_r[c] - m_r) if c <= last else float32(0)
                S_r[c] = p
                l_r += p
            red_l[t] = l_r
            cuda.syncthreads()
            h = NT // 2
            while h > 0:                         # l_r = sum over the threads
                if t < h:
                    red_l[t] += red_l[t + h]
                cuda.syncthreads()
                h //= 2
        else:
            # first sweep over S: read N; online m_r, l_r over this thread's keys
            m_r = NEG_INF
            l_r = float32(0)
            for c in range(t, last + 1, NT):
                s = S[bh, row, c]
                if s > m_r:
                    l_r = l_r * math.exp(m_r - s) + float32(1)
                    m_r = s
                else:
                    l_r += math.exp(s - m_r)
            red_m[t] = m_r
            red_l[t] = l_r
            cuda.syncthreads()
            h = NT // 2
            while h > 0:                         # combine the (m, l) pairs of the threads
                if t < h:
                    m_a = red_m[t]
                    m_b = red_m[t + h]
                    m_ab = max(m_a, m_b)
                    if m_ab != NEG_INF:          # (both empty: stays -inf, 0)
                        red_l[t] = (red_l[t] * math.exp(m_a - m_ab)
                                    + red_l[t + h] * math.exp(m_b - m_ab))
                    red_m[t] = m_ab
                cuda.syncthreads()
                h //= 2
        m_r = red_m[0]
        l_r = red_l[0]

        # P_r = exp(S_r - m_r) / l_r: write N (the streaming version reads S again)
        for c in range(t, N, NT):
            if row_fits:
                p = S_r[c]
            else:
                p = math.exp(S[bh, row, c] - m_r) if c <= last else float32(0)
            P[bh, row, c] = p / l_r

    return cuda.jit(row_softmax)


@functools.lru_cache(maxsize=None)
def pv_kernel(tiling):
    """Kernel 3; grid (T_r, batch*heads), TR*TC threads."""
    B_r, B_c, d, RM, DN, VR, VD, RG, KG, Bc_p, d_p, QS = \
        tiling.values("B_r B_c d RM DN VR VD RG KG Bc_p d_p QS")
    ops = tile_ops(tiling)
    load_V, load_P, pv, block_start = ops.load_V, ops.load_P, ops.pv, ops.block_start

    def weighted_sum(P, V, O, N):
        """P: (batch*heads, N, N); V, O: (batch*heads, N, d); O = P V."""
        i, bh, t, r0, _, k0 = block_start()       # Q block i; this thread's first row of O_i
        O_i = cuda.local.array((RM, DN), float32)
        row0 = i * B_r

        P_ijT = cuda.shared.array((Bc_p, QS), float32, alignment=ALIGN)   # P_ij^T (B_c, B_r)
        V_j = cuda.shared.array((Bc_p, d_p), float32, alignment=ALIGN)    # V_j    (B_c, d)
        PV = cuda.local.array((RM, DN), float32)       # P_ij V_j, one block's part
        x = cuda.local.array(RM, float32)
        z = cuda.local.array(DN, float32)
        for a in range(RM):
            for b in range(DN):
                O_i[a, b] = 0

        T_c = (N + B_c - 1) // B_c
        for j in range(T_c):
            col0 = j * B_c
            cuda.syncthreads()                   # all done with the last P_ij, V_j
            load_P(P_ijT, P, t, bh, row0, col0, N)   # load P_ij: read B_r B_c
            load_V(V_j, V, t, bh, col0, N)           # load V_j: read B_c d
            cuda.syncthreads()
            # O_i += P_ij V_j, summed per block and then added (as cuBLAS-style blocked
            # sums do; see flash2)
            pv(PV, P_ijT, V_j, r0, k0, x, z)
            for a in range(RM):
                for b in range(DN):
                    O_i[a, b] += PV[a, b]

        # store O_i: write B_r d
        for a in range(RM):
            r = own(r0, RG, VR, a)
            if r < B_r and row0 + r < N:
                for b in range(DN):
                    k = own(k0, KG, VD, b)
                    if k < d:
                        O[bh, row0 + r, k] = O_i[a, b]

    return cuda.jit(weighted_sum)


def row_fits(N: int, softmax_rows: int) -> bool:
    """Kernel 2 holds the row in shared memory: flashsim says a row fits in M, and the
    row plus the two reduction arrays fit in 48 KiB."""
    return softmax_rows >= 1 and WORD * (N + 2 * softmax_threads(N)) <= SHARED_LIMIT


class StandardLaunch(NumbaLaunch):
    """``tiling`` is the pair (kernel 1's, kernel 3's)."""
    MAIN = "scores"

    @functools.cached_property
    def softmax_row_fits(self) -> bool:
        return row_fits(self.N, self.plan().softmax_rows)

    def launches(self) -> list[KernelLaunch]:
        """Kernel 1 and 3 as flashsim's kernels 1 and 3; kernel 2 one row per block."""
        tl_qk, tl_pv = self.tiling
        N, BH, NT = self.N, self.BH, softmax_threads(self.N)
        grid = (cdiv(N, self.block_rows), BH)
        fits = self.softmax_row_fits
        return [KernelLaunch("scores", grid, tl_qk.threads, step=0),
                KernelLaunch("row_softmax_fits" if fits else "row_softmax_stream", (N, BH), NT,
                             WORD * N if fits else 0),
                KernelLaunch("weighted_sum", grid, tl_pv.threads, step=2)]

    def run(self, Q, K, V, out=None, mark=None) -> Result:
        """Q, K, V: (B, H, N, d) or (B*H, N, d) float32. Returns Result(O (B*H, N, d), None);
        S and P, (B*H, N, N), stay in ``workspace``. ``mark()`` is called after each kernel
        (the harness records an event there: per-kernel times)."""
        Q, K, V = (self.device(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V")))
        BH, N = self.BH, self.N
        O = out if out is not None else cuda.device_array(Q.shape, dtype="float32")
        S = self.buffer("S", (BH, N, N))
        P = self.buffer("P", (BH, N, N))
        tl_qk, tl_pv = self.tiling
        scores, softmax, weighted_sum = self.launches()
        self.launched = []
        self.launch(qk_kernel(tl_qk), scores, Q, K, S, N, float32(self.tau))
        _call(mark)
        self.launch(softmax_kernel(softmax.threads, self.softmax_row_fits, self.causal), softmax,
                    S, P, N)
        _call(mark)
        self.launch(pv_kernel(tl_pv), weighted_sum, P, V, O, N)
        _call(mark)
        return Result(O, None)


def _call(mark) -> None:
    if mark is not None:
        mark()


def configure(B: int, H: int, N: int, d: int, *, causal=False, block_rows=None,
              block_cols=None, threads=None) -> StandardLaunch:
    """The launches for (B, H, N, d): tiles B_r, B_c from flashsim at 48 KiB unless given
    (kernels 1 and 3 share them), threads (TR, TC) chosen per kernel unless given (then used
    for both)."""
    check_flag(causal, "causal")
    B, H, N, d = check_shape((B, H, N, d), max_head_dim=MAX_HEAD_DIM)
    Br, Bc, sram = plan_blocks(ALGORITHM, N, d, causal=causal, block_rows=block_rows,
                               block_cols=block_cols)
    tilings = tuple(check_tiling(threads, Br, Bc, d, arrays) for arrays in (ARRAYS_QK, ARRAYS_PV))
    need = max(check_shared(ALGORITHM, tl, arrays)
               for tl, arrays in zip(tilings, (ARRAYS_QK, ARRAYS_PV)))
    return StandardLaunch("numba_standard", ALGORITHM, B, H, N, d, "fp32", causal, Br, Bc,
                          tilings[0].threads, need, 0, sram, tiling=tilings)


def kernels_for(tilings, causal: bool, N: int = 4096):
    """(name, kernel, signature) of every kernel a launch uses (for compile checks)."""
    if isinstance(tilings, Tiling):
        tilings = (tilings, tilings)
    NT = softmax_threads(N)
    return [("scores", qk_kernel(tilings[0]), SIGNATURE_QK),
            ("row_softmax_fits", softmax_kernel(NT, True, causal), SIGNATURE_SOFTMAX),
            ("row_softmax_stream", softmax_kernel(NT, False, causal), SIGNATURE_SOFTMAX),
            ("weighted_sum", pv_kernel(tilings[1]), SIGNATURE_PV)]
