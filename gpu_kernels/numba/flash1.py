"""FlashAttention forward in numba.cuda, fp32: the schedule of flashsim's ``flash1``, version 2.

Versions: one. Dao et al. (2022), Algorithm 1, line for line: O, l, m live in HBM
(initialised to 0, 0, -inf); the outer loop runs over K/V blocks j and, for each j, every
Q block i loads Q_i, O_i, l_i, m_i, folds in the tile S_ij = tau Q_i K_j^T and writes
O_i, l_i, m_i back. Read it beside ``flashsim/algorithms/flash1.py``.

    initialise O = 0, l = 0, m = -inf in HBM                       write N d + 2 N
    for j in 0 .. T_c-1:                       one launch per j (see below)
        for each Q block i (causal: i >= floor(j B_c / B_r)) and head, one thread block:
            load K_j, V_j                                            read  2 B_c d
            load Q_i, O_i, l_i, m_i                                  read  2 B_r d + 2 B_r
            S_ij = tau Q_i K_j^T
            m~_ij = rowmax S_ij; P~_ij = exp(S_ij - m~_ij); l~_ij = rowsum P~_ij
            m_new = max(m_i, m~_ij); l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
            O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
            write O_i, l_i = l_new, m_i = m_new                      write B_r d + 2 B_r

Why one launch per K/V block. The only dependency between thread blocks is O_i, l_i, m_i
carried from step j to step j+1 for the same i. Consecutive launches in one stream are
ordered, so launch j+1 sees every write of launch j: correct with no extra machinery, and
within a launch all (i, head) blocks run in parallel, as in the paper. One launch whose
blocks loop over j would need a grid-wide barrier between steps (a cooperative launch,
with every block resident at once, which caps the grid at what fits on the GPU); and if
each block instead kept its own i across all j, that is FlashAttention-2's order, not
this one. The price is T_c launches (N / B_c; 342 at N = 16384, d = 64) and the HBM
round trip of O, l, m at every step, which is what this algorithm's traffic counts.

HBM traffic per head (fp32): K, V read T_r times, once by each block (fewer blocks under
the mask); Q, O read T_c times (fewer rows under the mask); O, l, m written T_c times plus
the initialisation: flashsim's flash1, version 2 (``kv_launches``: the same launches and
thread blocks as this kernel, ``launch.plan()``), and its closed form;
``predicted_traffic`` asks flashsim for it. (The CuPy kernel runs version 1, one block per
head, which reads K and V once.) A tile row that the causal mask hides entirely has
m~_ij = -inf; its P~ is set to 0 there (never exp(-inf - (-inf))), and the row's m_i is
finite from block j = 0 on, so e^(m~_ij - m_new) = 0 drops it.

Shared memory: Q_i^T, K_j^T, V_j, P~_ij^T and two row-statistic arrays (``Tiling.shared_words``);
tiles from flashsim's ``fastest_blocks`` as in ``flash2``; tile loads and products are
``numba.common.tile_ops``' device functions.

Tiles against flashsim's default rule: they differ; its rule for this placement (H200
preset, M = 48 KiB) takes the largest square tiles that fit, larger than these.
"""

from __future__ import annotations

import functools
import math

import numpy

from ..common import KernelLaunch, Result, cdiv
from .common import (NEG_INF, NumbaLaunch, configure_launch, cuda, fill, fill_launch, float32,
                     own, tile_ops)

ALGORITHM = "flash1"
ARRAYS = ("Q", "K", "V", "P", "rows", "rows")     # two row-statistic arrays: max and sum
SIGNATURE = ("void(float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
             "float32[:, :, ::1], float32[:, ::1], float32[:, ::1], int64, int64, int64, "
             "float32)")


@functools.lru_cache(maxsize=None)
def kernel(tiling, causal: bool):
    """One step j of the outer loop; grid (T_r - i_start(j), batch*heads), TR*TC threads."""
    ops = tile_ops(tiling, causal)
    load_Q, load_KV, s_tile, pv = ops.load_Q, ops.load_KV, ops.s_tile, ops.pv
    origin, flash_tiles, row_total = ops.origin, ops.flash_tiles, ops.row_total
    B_r, B_c, d, TC, RM, CN, DN, VR, VC, VD, Br_p, RG, CG, KG = \
        tiling.values("B_r B_c d TC RM CN DN VR VC VD Br_p RG CG KG")

    def flash1_step(Q, K, V, O, l, m, N, j, i_start, tau):
        """Q, K, V, O: (batch*heads, N, d); l, m: (batch*heads, N); step j of the outer
        loop, Q blocks i_start, i_start+1, ...; tau = 1/sqrt(d)."""
        i = i_start + cuda.blockIdx.x      # Q block i
        bh = cuda.blockIdx.y               # (batch, head)
        t = cuda.threadIdx.x
        r0, c0, k0 = origin(t)             # this thread's first row, S column, O column
        row0 = i * B_r
        col0 = j * B_c                     # K/V block j

        Q_iT, K_jT, V_j, P_ijT = flash_tiles()        # shared memory (P_ijT holds P~_ij^T)
        max_part = cuda.shared.array((Br_p, TC), float32)                 # for m~_ij
        sum_part = cuda.shared.array((Br_p, TC), float32)                 # for l~_ij

        S_ij = cuda.local.array((RM, CN), float32)
        O_i = cuda.local.array((RM, DN), float32)
        PV = cuda.local.array((RM, DN), float32)        # P~_ij V_j
        l_i = cuda.local.array(RM, float32)
        m_i = cuda.local.array(RM, float32)
        mt_ij = cuda.local.array(RM, float32)           # m~_ij
        x = cuda.local.array(RM, float32)
        y = cuda.local.array(CN, float32)
        z = cuda.local.array(DN, float32)

        load_KV(K_jT, V_j, K, V, t, bh, col0, N)        # load K_j, V_j: read 2 B_c d
        load_Q(Q_iT, Q, t, bh, row0, N)                 # load Q_i: read B_r d
        # load O_i, l_i, m_i straight to registers: read B_r d + 2 B_r
        for a in range(RM):
            r = own(r0, RG, VR, a)
            ok = r < B_r and row0 + r < N
            l_i[a] = l[bh, row0 + r] if ok else float32(0)
            m_i[a] = m[bh, row0 + r] if ok else NEG_INF
            for b in range(DN):
                k = own(k0, KG, VD, b)
                O_i[a, b] = O[bh, row0 + r, k] if ok and k < d else float32(0)
        cuda.syncthreads()

        # S_ij = tau Q_i K_j^T, masked (this thread's RM x CN); its part of m~_ij = rowmax S_ij
        s_tile(S_ij, max_part, Q_iT, K_jT, x, y, t, r0, c0, row0, col0, N, tau)
        cuda.syncthreads()
        # P~_ij = exp(S_ij - m~_ij), 0 where masked; l~_ij = rowsum P~_ij (this thread's part)
        for a in range(RM):
            r = own(r0, RG, VR, a)
            mt_ij[a] = row_total(max_part, r, NEG_INF, True)       # m~_ij: the row's max
            row_sum = float32(0)
            for b in range(CN):
                p = float32(0) if S_ij[a, b] == NEG_INF else math.exp(S_ij[a, b] - mt_ij[a])
                row_sum += p
                P_ijT[own(c0, CG, VC, b), r] = p
            sum_part[r, t % TC] = row_sum
        cuda.syncthreads()

        pv(PV, P_ijT, V_j, r0, k0, x, z)      # PV = P~_ij V_j (this thread's RM x DN)

        # m_new, l_new; O_i = diag(l_new)^-1 (diag(l_i) e^(m_i-m_new) O_i + e^(m~-m_new) PV);
        # write O_i, l_i, m_i: B_r d + 2 B_r
        for a in range(RM):
            r = own(r0, RG, VR, a)
            if r < B_r and row0 + r < N:
                lt_ij = row_total(sum_part, r, float32(0), False)    # l~_ij: the row's sum
                m_new = max(m_i[a], mt_ij[a])
                old = math.exp(m_i[a] - m_new)        # 0 on the first step (m_i = -inf)
                new = math.exp(mt_ij[a] - m_new)      # 0 for a fully masked tile row
                l_new = old * l_i[a] + new * lt_ij
                # The paper's line, rearranged with its weights l_i e^(m_i - m_new) / l_new =
                # 1 - beta l~_ij: O_i + beta (P~_ij V_j - l~_ij O_i). The correction is small
                # next to O_i, so each of the T_c steps rounds O_i once, not four times:
                # 31% less error at N = 16384, d = 128 in an fp32 emulation.
                beta = new / l_new
                for b in range(DN):
                    k = own(k0, KG, VD, b)
                    if k < d:
                        O[bh, row0 + r, k] = O_i[a, b] + beta * (PV[a, b] - lt_ij * O_i[a, b])
                if t % TC == 0:
                    l[bh, row0 + r] = l_new
                    m[bh, row0 + r] = m_new

    return cuda.jit(flash1_step)


class Flash1Launch(NumbaLaunch):
    MAIN = "flash1_step"
    PLAN_OPTIONS = {"kv_launches": True}      # flashsim's flash1, version 2

    def i_start(self, j: int) -> int:
        """The first Q block that K/V block j reaches (0 without the mask)."""
        return (j * self.block_cols) // self.block_rows if self.causal else 0

    def launches(self) -> list[KernelLaunch]:
        """Three fills (line 2: O = 0, l = 0, m = -inf; the plan's launch 0, which the
        registry's ``unlike_plan`` names), then one launch per K/V block j: the plan's
        launch 1 + j."""
        BH, T_r, T_c = self.BH, cdiv(self.N, self.block_rows), cdiv(self.N, self.block_cols)
        fills = [fill_launch(BH * self.N * self.d), fill_launch(BH * self.N), fill_launch(BH * self.N)]
        return fills + [KernelLaunch("flash1_step", (T_r - self.i_start(j), BH), self.tiling.threads,
                                     step=1 + j) for j in range(T_c)]

    def run(self, Q, K, V, out=None) -> Result:
        """Q, K, V: (B, H, N, d) or (B*H, N, d) float32. Returns Result(O (B*H, N, d), None);
        l and m, (B*H, N), stay in ``workspace`` (``logsumexp()``)."""
        Q, K, V = (self.device(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V")))
        BH, N = self.BH, self.N
        O = out if out is not None else cuda.device_array(Q.shape, dtype="float32")
        l = self.buffer("l", (BH, N))
        m = self.buffer("m", (BH, N))
        self.launched = []
        fill(O, 0.0, self)                             # line 2: O = 0, l = 0, m = -inf
        fill(l, 0.0, self)
        fill(m, -math.inf, self)
        step = kernel(self.tiling, self.causal)
        tau = float32(self.tau)
        for j, kl in enumerate(self.launches()[3:]):   # outer loop: one launch per K/V block
            self.launch(step, kl, Q, K, V, O, l, m, N, j, self.i_start(j), tau)
        return Result(O, None)

    def logsumexp(self):
        """L = m + log l of the last run, (B*H, N), a device array."""
        l, m = (self.workspace[n].copy_to_host() for n in "lm")
        return cuda.to_device((m + numpy.log(l)).astype(numpy.float32))


def configure(B: int, H: int, N: int, d: int, *, causal=False, block_rows=None,
              block_cols=None, threads=None) -> Flash1Launch:
    """The launch for (B, H, N, d): tiles B_r, B_c from flashsim's ``fastest_blocks`` unless
    given (see numba.common.plan_blocks), threads chosen unless given."""
    return configure_launch(Flash1Launch, "numba_flash1", ALGORITHM, (B, H, N, d), ARRAYS,
                            causal=causal, block_rows=block_rows, block_cols=block_cols,
                            threads=threads)


def kernels_for(tiling, causal: bool):
    """(name, kernel, signature) of every kernel a launch with this tiling uses (for
    compile checks: ``numba.cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))``)."""
    from .common import _fill_kernel
    return [("flash1_step", kernel(tiling, causal), SIGNATURE),
            ("fill_flat", _fill_kernel(), "void(float32[::1], float32)")]
