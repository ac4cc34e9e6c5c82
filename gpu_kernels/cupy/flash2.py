"""FlashAttention-2 forward in fp32 on CUDA cores (``cuda/flash2.cu``): the plain reference
that the tensor-core kernel (``flash2_tc``) is read against.

Versions: one. One thread block per Q block i; K/V streamed; deferred rescale; L = logsumexp
of each row of tau Q K^T. Tiles from ``flashsim.plan("flash2", ...)`` for ``SRAM`` bytes (the
tile policy's ``sram_rule``). Shared memory: 4 (2 B_r d + 2 B_r + d (B_c + 1) + B_c d + B_r B_c)
bytes (Q_i, O_i, m_i, l_i, K_j^T with a padding column, V_j, S_ij).
"""

from __future__ import annotations

from ..common import KernelLaunch, Result, cdiv
from .common import NUM_THREADS, SRAM, Fp32Launch, fp32_plan, fp32_variants

ALGORITHM = "flash2"
CU_FILE = "flash2.cu"
HOT = ("flash2_fwd",)


def shared_bytes(d: int, B_r: int, B_c: int) -> int:
    return 4 * (2 * B_r * d + 2 * B_r + d * (B_c + 1) + B_c * d + B_r * B_c)


class Flash2Launch(Fp32Launch):
    CU_FILE = CU_FILE

    def launches(self) -> list[KernelLaunch]:
        return [KernelLaunch("flash2_fwd", (cdiv(self.N, self.block_rows), self.BH), NUM_THREADS,
                             step=0)]

    def run(self, Q, K, V) -> Result:
        """Q, K, V: (B, H, N, d) float32 -> Result(O (B, H, N, d), L (B, H, N)) (CuPy)."""
        import cupy

        q, k, v = self.inputs(Q, K, V)
        O = cupy.empty_like(q)
        L = cupy.empty((self.batch, self.heads, self.N), dtype=cupy.float32)
        (forward,) = self.launches()
        self.launch_kernel(forward, (q, k, v, O, L, cupy.int32(self.N), cupy.float32(self.tau),
                                     cupy.int32(self.causal)))
        return Result(O, L)


def configure(B: int, H: int, N: int, d: int, *, causal: bool = False, block_rows=None,
              block_cols=None, sram: int = SRAM) -> Flash2Launch:
    p = fp32_plan(ALGORITHM, B, H, N, d, causal=causal, block_rows=block_rows,
                  block_cols=block_cols, sram=sram)
    return Flash2Launch("cupy_flash2", ALGORITHM, B, H, N, d, "fp32", causal, p.block_rows,
                        p.block_cols, NUM_THREADS, shared_bytes(d, p.block_rows, p.block_cols), 0,
                        p.sram_bytes)


def compile_variants():
    return fp32_variants(CU_FILE, ALGORITHM, HOT)
