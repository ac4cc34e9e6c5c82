"""FlashAttention-2 forward in numba.cuda, fp32: the schedule of flashsim's ``flash2``.

Versions: one. Dao (2023), Algorithm 1: one thread block per (Q block i, head); Q_i stays
in shared memory, the unnormalised O_i and m_i, l_i stay in registers, K_j and V_j stream
through shared memory, the division by l_i waits until the end, and only O and the
logsumexp L are written. Read it beside ``flashsim/algorithms/flash2.py``: same names, same
loops, same order of loads and stores.

    for each Q block i (blockIdx.x) and head (blockIdx.y):
        load Q_i                                   read  B_r d
        O_i = 0, m_i = -inf, l_i = 0
        for j in 0 .. T_c-1 (causal: while j B_c <= the last row of block i):
            load K_j, V_j                          read  2 B_c d
            S_ij = tau Q_i K_j^T                   (B_r x B_c, registers)
            m_new = max(m_i, rowmax S_ij); P_ij = exp(S_ij - m_new)
            alpha = exp(m_i - m_new); l_i = alpha l_i + rowsum P_ij
            O_i = alpha O_i + P_ij V_j             (P_ij through shared memory)
            m_i = m_new
        O_i = O_i / l_i; L_i = m_i + log l_i       write B_r d + B_r

HBM traffic per head (fp32): Q read once, K and V read T_r = ceil(N/B_r) times (fewer under
the mask), O and L written once: flashsim.flash2's closed form; ``predicted_traffic`` asks
flashsim for it. Masked and out-of-range entries of S_ij are -inf, so exp gives 0; every
row sees key 0 in block j = 0, so m_i is finite from then on and exp(m_i - m_new) never
meets (-inf) - (-inf).

Each thread keeps its own share of l_i (the sum over its columns, rescaled by the same
alpha as the whole row); the shares are added once at the end. The row maximum must be
agreed every block (all threads of a row need the same m_new): through ``m_part``.
P_ij V_j and rowsum P_ij are summed per block before they are added to O_i and l_i (as
the formula reads): one fp32 running sum over all N keys lost to the fp32 NumPy baseline
on the H200 at N = 2048 (3.8e-7 against a tolerance of 3.8e-7; FA1, which sums per block,
had 1.4e-7); summed per block, the sum over N is one of T_c terms.

Shared memory: Q_i^T, K_j^T, V_j, P_ij^T and m_part (``Tiling.shared_words``). Default tiles
are flashsim's ``fastest_blocks`` for this kernel (``numba.common.plan_blocks``): the tiles
with the shortest roofline time, each at the score of its best thread layout that fits 48
KiB. flashsim's SRAM rule at 48 KiB would give square tiles, because its model also counts
the O_i and S_ij that this kernel keeps in registers; those run slower (numba_h200.py times
both). Tile loads and products are ``numba.common.tile_ops``' register-tiled device
functions.

Tiles against flashsim's default rule: they differ; its rule for this placement (H200
preset, M = 48 KiB) takes the largest square tiles that fit, larger than these.
"""

from __future__ import annotations

import functools
import math

from ..common import KernelLaunch, Result, cdiv
from .common import NEG_INF, NumbaLaunch, configure_launch, cuda, float32, own, tile_ops

ALGORITHM = "flash2"
ARRAYS = ("Q", "K", "V", "P", "rows")        # shared arrays, for the budget
SIGNATURE = ("void(float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
             "float32[:, :, ::1], float32[:, ::1], int64, float32)")


@functools.lru_cache(maxsize=None)
def kernel(tiling, causal: bool):
    """The compiled kernel for one tiling and mask; grid (T_r, batch*heads), TR*TC threads."""
    B_r, B_c, d, TC, RM, CN, DN, VR, VC, VD, Br_p, RG, CG, KG = \
        tiling.values("B_r B_c d TC RM CN DN VR VC VD Br_p RG CG KG")
    ops = tile_ops(tiling, causal)
    load_Q, load_KV, s_tile, pv = ops.load_Q, ops.load_KV, ops.s_tile, ops.pv
    block_start, flash_tiles, row_total = ops.block_start, ops.flash_tiles, ops.row_total

    def flash2_forward(Q, K, V, O, L, N, tau):
        """Q, K, V, O: (batch*heads, N, d); L: (batch*heads, N); tau = 1/sqrt(d)."""
        # Q block i, (batch, head), thread; its first row, S column and O column
        i, bh, t, r0, c0, k0 = block_start()
        first_col = t % TC == 0
        row0 = i * B_r

        Q_iT, K_jT, V_j, P_ijT = flash_tiles()                         # shared memory
        m_part = cuda.shared.array((Br_p, TC), float32)                # one per thread column

        S_ij = cuda.local.array((RM, CN), float32)
        O_i = cuda.local.array((RM, DN), float32)
        m_i = cuda.local.array(RM, float32)
        l_i = cuda.local.array(RM, float32)            # this thread's share of l_i
        alpha = cuda.local.array(RM, float32)          # exp(m_i - m_new)
        PV = cuda.local.array((RM, DN), float32)       # P_ij V_j, one K/V block's part
        x = cuda.local.array(RM, float32)              # a column of Q_i^T or P_ij^T
        y = cuda.local.array(CN, float32)              # a row of K_j^T
        z = cuda.local.array(DN, float32)              # a row of V_j

        load_Q(Q_iT, Q, t, bh, row0, N)                # load Q_i: read B_r d
        for a in range(RM):
            m_i[a] = NEG_INF
            l_i[a] = 0
            for b in range(DN):
                O_i[a, b] = 0

        T_c = (N + B_c - 1) // B_c
        j_stop = T_c
        if causal:   # tiles with j B_c > last row of block i are fully masked: skipped
            j_stop = min(T_c, (min(row0 + B_r, N) - 1) // B_c + 1)
        for j in range(j_stop):
            col0 = j * B_c
            cuda.syncthreads()                   # all done with the last K_j, V_j, P_ij
            load_KV(K_jT, V_j, K, V, t, bh, col0, N)      # load K_j, V_j: read 2 B_c d
            cuda.syncthreads()

            # S_ij = tau Q_i K_j^T, masked (this thread's RM x CN); its part of rowmax S_ij
            s_tile(S_ij, m_part, Q_iT, K_jT, x, y, t, r0, c0, row0, col0, N, tau)
            cuda.syncthreads()

            # m_new = max(m_i, rowmax S_ij); P_ij = exp(S_ij - m_new);
            # alpha = exp(m_i - m_new); l_i = alpha l_i + rowsum P_ij; m_i = m_new
            for a in range(RM):
                r = own(r0, RG, VR, a)
                m_new = row_total(m_part, r, m_i[a], True)   # max(m_i, rowmax S_ij)
                alpha[a] = math.exp(m_i[a] - m_new)
                m_i[a] = m_new
                row_sum = float32(0)
                for b in range(CN):
                    p = math.exp(S_ij[a, b] - m_new)
                    row_sum += p
                    P_ijT[own(c0, CG, VC, b), r] = p
                l_i[a] = alpha[a] * l_i[a] + row_sum
            cuda.syncthreads()

            pv(PV, P_ijT, V_j, r0, k0, x, z)     # PV = P_ij V_j (this thread's RM x DN)
            # O_i = alpha O_i + P_ij V_j (summed per block, then added: the long sum over
            # all N keys is a sum of T_c block sums, which keeps fp32 rounding small)
            for a in range(RM):
                for b in range(DN):
                    O_i[a, b] = alpha[a] * O_i[a, b] + PV[a, b]

        # l_i = sum of the shares; O_i = O_i / l_i; L_i = m_i + log l_i: write B_r d + B_r
        cuda.syncthreads()                       # all done reading m_part
        for a in range(RM):
            m_part[own(r0, RG, VR, a), t % TC] = l_i[a]
        cuda.syncthreads()
        for a in range(RM):
            r = own(r0, RG, VR, a)
            if r < B_r and row0 + r < N:
                l_row = row_total(m_part, r, float32(0), False)   # l_i: the shares' sum
                for b in range(DN):
                    k = own(k0, KG, VD, b)
                    if k < d:
                        O[bh, row0 + r, k] = O_i[a, b] / l_row
                if first_col:
                    L[bh, row0 + r] = m_i[a] + math.log(l_row)

    return cuda.jit(flash2_forward)


class Flash2Launch(NumbaLaunch):
    def launches(self) -> list[KernelLaunch]:
        return [KernelLaunch("flash2_forward", (cdiv(self.N, self.block_rows), self.BH),
                             self.tiling.threads, step=0)]

    def run(self, Q, K, V, out=None) -> Result:
        """Q, K, V: (B, H, N, d) or (B*H, N, d) float32 (device arrays, or NumPy: copied).
        Returns Result(O (B*H, N, d), L (B*H, N)) as device arrays; ``out``: O's buffer."""
        Q, K, V = (self.device(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V")))
        O = out if out is not None else cuda.device_array(Q.shape, dtype="float32")
        L = self.buffer("L", (self.BH, self.N))
        self.launched = []
        (forward,) = self.launches()
        self.launch(kernel(self.tiling, self.causal), forward, Q, K, V, O, L, self.N,
                    float32(self.tau))
        return Result(O, L)


def configure(B: int, H: int, N: int, d: int, *, causal=False, block_rows=None,
              block_cols=None, threads=None) -> Flash2Launch:
    """The launch for (B, H, N, d): tiles B_r, B_c from flashsim's ``fastest_blocks`` unless
    given, threads (TR, TC) chosen unless given; validated."""
    return configure_launch(Flash2Launch, "numba_flash2", ALGORITHM, (B, H, N, d), ARRAYS,
                            causal=causal, block_rows=block_rows, block_cols=block_cols,
                            threads=threads)


def kernels_for(tiling, causal: bool):
    """(name, kernel, signature) of every kernel a launch with this tiling uses (for
    compile checks: ``numba.cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))``)."""
    return [("flash2_forward", kernel(tiling, causal), SIGNATURE)]
