"""FlashAttention (Algorithm 1) in fp32 on CUDA cores (``cuda/flash1.cu``).

Versions: one. Outer loop over K/V blocks j, inner loop over Q blocks i, O, l, m in HBM
between steps; one thread block per (batch, head), as the original FlashAttention kernel.
Tiles from ``flashsim.plan("flash1", ...)`` for ``SRAM`` bytes (the tile policy's
``sram_rule``). Shared memory: 4 (d (B_c + 1) + B_c d + 2 B_r d + B_r B_c + 2 B_r) bytes
(K_j^T with a padding column, V_j, Q_i, O_i, S_ij, l_i, m_i).
"""

from __future__ import annotations

from ..common import KernelLaunch, Result
from .common import NUM_THREADS, SRAM, Fp32Launch, fp32_plan, fp32_variants

ALGORITHM = "flash1"
CU_FILE = "flash1.cu"
HOT = ("flash1_fwd",)


def shared_bytes(d: int, B_r: int, B_c: int) -> int:
    return 4 * (d * (B_c + 1) + B_c * d + 2 * B_r * d + B_r * B_c + 2 * B_r)


class Flash1Launch(Fp32Launch):
    CU_FILE = CU_FILE

    def launches(self) -> list[KernelLaunch]:
        return [KernelLaunch("flash1_fwd", (self.BH,), NUM_THREADS, step=0)]

    def run(self, Q, K, V) -> Result:
        """Q, K, V: (B, H, N, d) float32 -> Result(O, None) (CuPy); the statistics l, m
        (B, H, N) stay in ``workspace`` (``logsumexp()``)."""
        import cupy

        q, k, v = self.inputs(Q, K, V)
        O = cupy.empty_like(q)
        l = cupy.empty((self.batch, self.heads, self.N), dtype=cupy.float32)
        m = cupy.empty_like(l)
        (step,) = self.launches()
        self.launch_kernel(step, (q, k, v, O, l, m, cupy.int32(self.N), cupy.float32(self.tau),
                                  cupy.int32(self.causal)))
        self.workspace.update(l=l, m=m)
        return Result(O, None)

    def logsumexp(self):
        """L = m + log l of the last run (B, H, N)."""
        import cupy

        return self.workspace["m"] + cupy.log(self.workspace["l"])


def configure(B: int, H: int, N: int, d: int, *, causal: bool = False, block_rows=None,
              block_cols=None, sram: int = SRAM) -> Flash1Launch:
    p = fp32_plan(ALGORITHM, B, H, N, d, causal=causal, block_rows=block_rows,
                  block_cols=block_cols, sram=sram)
    return Flash1Launch("cupy_flash1", ALGORITHM, B, H, N, d, "fp32", causal, p.block_rows,
                        p.block_cols, NUM_THREADS, shared_bytes(d, p.block_rows, p.block_cols), 0,
                        p.sram_bytes)


def compile_variants():
    return fp32_variants(CU_FILE, ALGORITHM, HOT)
