"""FlashAttention (Algorithm 1) in fp32 on CUDA cores (``cuda/flash1.cu``).

Tiles against flashsim's default rule: the same, its two-level rule at M = 48 KiB, which
places K_j, V_j, Q_i, O_i, S_ij, l_i and m_i in shared memory as this kernel does.

Versions: one. Outer loop over K/V blocks j, inner loop over Q blocks i, O, l, m in HBM
between steps; one thread block per (batch, head), as the original FlashAttention kernel.
Tiles from ``flashsim.plan("flash1", ...)`` for ``SRAM`` bytes (the tile policy's
``sram_rule``). Shared memory: 4 (d (B_c + 1) + B_c d + 2 B_r d + B_r B_c + 2 B_r) bytes
(K_j^T with a padding column, V_j, Q_i, O_i, S_ij, l_i, m_i).
"""

from __future__ import annotations

import functools

from ..common import KernelLaunch, Result
from .common import NUM_THREADS, Fp32Launch, fp32_configure, fp32_variants

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
        (B, H, N) that the kernel leaves in HBM stay in ``workspace`` (``logsumexp()``)."""
        O, stats = self.run_fused(Q, K, V, ("l", "m"))
        self.workspace.update(stats)
        return Result(O, None)

    def logsumexp(self):
        """L = m + log l of the last run (B, H, N)."""
        import cupy

        return self.workspace["m"] + cupy.log(self.workspace["l"])



# configure(B, H, N, d, *, causal=False, block_rows=None, block_cols=None, sram=SRAM): tiles
# from flashsim's plan for ``sram`` bytes; compile_variants(): what CI compiles (d = 64, 128)
configure = functools.partial(fp32_configure, Flash1Launch, "cupy_flash1", ALGORITHM, shared_bytes)
compile_variants = functools.partial(fp32_variants, CU_FILE, ALGORITHM, HOT)
