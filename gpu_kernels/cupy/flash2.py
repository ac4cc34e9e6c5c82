"""FlashAttention-2 forward in fp32 on CUDA cores (``cuda/flash2.cu``): the plain reference
that the tensor-core kernel (``flash2_tc``) is read against.

Versions: one. One thread block per Q block i; K/V streamed; deferred rescale; L = logsumexp
of each row of tau Q K^T. Tiles from ``flashsim.plan("flash2", ...)`` for ``SRAM`` bytes (the
tile policy's ``sram_rule``). Shared memory: 4 (2 B_r d + 2 B_r + d (B_c + 1) + B_c d + B_r B_c)
bytes (Q_i, O_i, m_i, l_i, K_j^T with a padding column, V_j, S_ij).

Tiles against flashsim's default rule: the same, its two-level rule at M = 48 KiB, which
places Q_i, O_i, m_i, l_i, K_j, V_j and S_ij in shared memory as this kernel does.
"""

from __future__ import annotations

import functools

from ..common import KernelLaunch, Result, cdiv
from .common import NUM_THREADS, Fp32Launch, fp32_configure, fp32_variants

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
        O, stats = self.run_fused(Q, K, V, ("L",))
        return Result(O, stats["L"])



# configure(B, H, N, d, *, causal=False, block_rows=None, block_cols=None, sram=SRAM): tiles
# from flashsim's plan for ``sram`` bytes; compile_variants(): what CI compiles (d = 64, 128)
configure = functools.partial(fp32_configure, Flash2Launch, "cupy_flash2", ALGORITHM, shared_bytes)
compile_variants = functools.partial(fp32_variants, CU_FILE, ALGORITHM, HOT)
