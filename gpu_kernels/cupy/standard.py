"""Standard attention in fp32 on CUDA cores: three launches (``cuda/standard.cu``).

Versions: one. Kernel 1 writes S = tau Q K^T (B, H, N, N) to HBM, kernel 2 the row softmax P
(R whole rows per block, or B_r x B_c tiles read twice when a row does not fit: R = 0;
under a causal mask those tiles' visible elements only),
kernel 3 O = P V: the schedule of ``flashsim.plan("standard", ...)`` with its tiles (B_r, B_c)
and softmax rows R for ``SRAM`` bytes of shared memory (the tile policy's ``sram_rule``).

Shared memory (bytes, 4-byte words): kernel 1 4 (B_r d + d (B_c + 1)), kernel 2 4 R (N + 2)
(dynamic) or 4 (B_r B_c + 2 B_r) streaming, kernel 3 4 (B_r B_c + B_c d + B_r d).

Tiles against flashsim's default rule: the same, its two-level rule at M = 48 KiB, which
places each kernel's tiles in shared memory as this kernel does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common import KernelLaunch, Result, cdiv
from .common import NUM_THREADS, SRAM, Fp32Launch, fp32_plan, fp32_variants

ALGORITHM = "standard"
CU_FILE = "standard.cu"
HOT = ("standard_qk", "standard_softmax", "standard_softmax_streaming", "standard_pv")


def shared_bytes(d: int, B_r: int, B_c: int, R: int = 0, N: int = 0) -> dict[str, int]:
    """Shared memory of each kernel (``standard_softmax``'s is dynamic: R rows of N)."""
    return {"standard_qk": 4 * (B_r * d + d * (B_c + 1)),
            "standard_softmax": 4 * R * (N + 2),
            "standard_softmax_streaming": 4 * (B_r * B_c + 2 * B_r),
            "standard_pv": 4 * (B_r * B_c + B_c * d + B_r * d)}


@dataclass
class StandardLaunch(Fp32Launch):
    CU_FILE = CU_FILE
    MAIN = "standard_qk"
    softmax_rows: int = 0          # R: whole rows of S per block of kernel 2 (0: streaming)

    def launches(self) -> list[KernelLaunch]:
        N, BH, R = self.N, self.BH, self.softmax_rows
        grid = (cdiv(N, self.block_rows), BH)
        if R >= 1:
            softmax = KernelLaunch("standard_softmax", (cdiv(N, R), BH), NUM_THREADS,
                                   4 * R * (N + 2), step=1)
        else:
            softmax = KernelLaunch("standard_softmax_streaming", grid, NUM_THREADS, step=1)
        return [KernelLaunch("standard_qk", grid, NUM_THREADS, step=0), softmax,
                KernelLaunch("standard_pv", grid, NUM_THREADS, step=2)]

    def run(self, Q, K, V, mark=None) -> Result:
        """softmax(tau Q K^T) V with S and P written to HBM. Q, K, V: (B, H, N, d) float32
        CuPy arrays or torch tensors -> Result(O, None) (CuPy). ``mark()`` is called after
        each kernel (per-kernel timing)."""
        import cupy

        q, k, v = self.inputs(Q, K, V)
        N = cupy.int32(self.N)
        S = cupy.empty((self.BH, self.N, self.N), dtype=cupy.float32)
        P = cupy.empty_like(S)
        O = cupy.empty_like(q)
        scores, softmax, pv = self.launches()
        self.launch_kernel(scores, (q, k, S, N, cupy.float32(self.tau)))
        _call(mark)
        if self.softmax_rows >= 1:
            self.launch_kernel(softmax, (S, P, N, cupy.int32(self.softmax_rows), cupy.int32(self.causal)))
        else:
            self.launch_kernel(softmax, (S, P, N, cupy.int32(self.causal)))
        _call(mark)
        self.launch_kernel(pv, (P, v, O, N))
        _call(mark)
        return Result(O, None)


def _call(mark) -> None:
    if mark is not None:
        mark()


def configure(B: int, H: int, N: int, d: int, *, causal: bool = False, block_rows=None,
              block_cols=None, sram: int = SRAM) -> StandardLaunch:
    """The launches for (B, H, N, d): tiles and R from flashsim's plan for ``sram`` bytes."""
    p = fp32_plan(ALGORITHM, B, H, N, d, causal=causal, block_rows=block_rows,
                  block_cols=block_cols, sram=sram)
    smem = shared_bytes(d, p.block_rows, p.block_cols, p.softmax_rows, N)
    static = max(v for k, v in smem.items() if k != "standard_softmax")
    return StandardLaunch("cupy_standard", ALGORITHM, B, H, N, d, "fp32", causal, p.block_rows,
                          p.block_cols, NUM_THREADS, static, smem["standard_softmax"], p.sram_bytes,
                          softmax_rows=p.softmax_rows)


def compile_variants():
    """(file, defines, dynamic smem, hot kernels) checked by CI: the plans for d = 64, 128."""
    return fp32_variants(CU_FILE, ALGORITHM, HOT)
