"""FlashAttention-2 forward on tensor cores, fp16 / bf16 (``cuda/flash2_tc.cu``).

    Q, K, V, O: (B, H, N, d) float16 or bfloat16, d in {64, 128}; L: (B, H, N) float32, the
    natural-log logsumexp of each row of tau Q K^T.

mma.sync m16n8k16 with fp32 accumulation and fp32 softmax statistics; any N (ragged last
blocks are masked); causal is top-left aligned (query r sees keys <= r). The header of the
.cu file lists the versions (``version=1..5``). Tile rule: the tile policy's ``table_rule``
on ``CONFIGS``, the fastest correct configuration per d of the sweep in
``benchmarks/cupy_h200.py`` on the H200 (``cupy_h200.json``, "tc_configs"). Threads:
32 B_r / WARP_M (one warp per 16 query rows, 32 from v5 on). Shared memory (dynamic):
``smem_bytes``. The plain fp32 kernel of the same loop is ``flash2`` (``cuda/flash2.cu``).

Tiles against flashsim's default rule: they differ; its rule for this placement (S, P and
O in the registers of the launch's warps, H200 preset) takes larger square tiles than the
measured table's.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashsim.algorithms import ALGORITHMS

from ..common import (KernelInputError, KernelLaunch, Result, cdiv, dtype_name, flashsim_dtype,
                      table_rule)
from .common import LOG2E, CupyLaunch, output

ALGORITHM = "flash2"
CU_FILE = "flash2_tc.cu"
HOT = ("flash2_tc_fwd",)
HEAD_DIMS = (64, 128)
VERSIONS = (1, 2, 3, 4, 5)
# Default compile-time constants per head dimension (B_r = BLOCK_R, B_c = BLOCK_C).
CONFIGS = {
    64: {"BLOCK_R": 128, "BLOCK_C": 64, "VERSION": 5, "MIN_BLOCKS": 1},
    128: {"BLOCK_R": 128, "BLOCK_C": 64, "VERSION": 3, "MIN_BLOCKS": 1},
}
TILES = {d: (c["BLOCK_R"], c["BLOCK_C"]) for d, c in CONFIGS.items()}


def warp_rows(version: int) -> int:
    """Query rows per warp (WARP_M in the .cu file): two m16 tiles from v5 on."""
    return 32 if version >= 5 else 16


def smem_bytes(d: int, block_rows: int, block_cols: int, version: int) -> int:
    """Dynamic shared memory of one block: Q_i plus K_j, V_j (two stages in v4), padded rows
    before v3 (same formula as SMEM_BYTES in the .cu file)."""
    stages = 2 if version == 4 else 1
    stride = d if version >= 3 else d + 8
    return (block_rows + 2 * stages * block_cols) * stride * 2


_MACROS = {"block_rows": "BLOCK_R", "block_cols": "BLOCK_C", "version": "VERSION",
           "min_blocks": "MIN_BLOCKS"}


def defines(d: int, dtype: str, **config) -> dict[str, int]:
    """The compile-time constants: CONFIGS[d] with the given ones, by macro name (BLOCK_R=...)
    or by argument name (block_rows=..., version=...)."""
    c = dict(CONFIGS[d])
    c.update({_MACROS.get(k, k): v for k, v in config.items() if v is not None})
    return {"HEAD_DIM": d, "IS_BF16": int(dtype_name(dtype) == "bfloat16"), **c}


@dataclass
class TcLaunch(CupyLaunch):
    CU_FILE = CU_FILE
    KERNEL = "flash2_tc_fwd"
    DEFINES = staticmethod(defines)
    PLAN_WARPS = staticmethod(lambda launch: launch.threads // 32)   # S, P, O in registers
    version: int = 0
    min_blocks: int = 1

    def tuning(self) -> dict[str, int]:
        """The compile-time options beside the tiles and the version."""
        return {"min_blocks": self.min_blocks}

    def defines(self) -> dict[str, int]:
        return self.DEFINES(self.d, self.dtype, block_rows=self.block_rows,
                            block_cols=self.block_cols, version=self.version, **self.tuning())

    def launches(self) -> list[KernelLaunch]:
        return [KernelLaunch(self.KERNEL, (cdiv(self.N, self.block_rows), self.BH), self.threads,
                             self.dynamic_smem, step=0)]

    def plan_record(self) -> dict:
        return dict(super().plan_record(), version=self.version)

    def run(self, Q, K, V, out=None, lse=None) -> Result:
        """Q, K, V: (B, H, N, d) fp16/bf16 CuPy arrays or torch tensors -> Result(O like Q,
        L (B, H, N) float32) as CuPy arrays; ``out`` / ``lse``: preallocated O and L to
        write into (checked like the inputs)."""
        import cupy

        q, k, v = self.inputs(Q, K, V)
        O = output(out, "out", tuple(q.shape), dtype_name(self.dtype), like=q)
        L = output(lse, "lse", tuple(q.shape[:-1]), "float32")
        (forward,) = self.launches()
        self.launch_kernel(forward, (q, k, v, O, L, cupy.int32(self.N),
                                     cupy.float32(self.tau * LOG2E), cupy.int32(self.causal)))
        return Result(O, L)


def checked_choice(version, d: int, dtype, versions, head_dims, kernel: str) -> str:
    """The fp16/bf16 dtype name, once ``version``, ``d`` and ``dtype`` are ones ``kernel``
    (its name in the error) takes; else KernelInputError."""
    if version is not None and version not in versions:
        raise KernelInputError(f"version {version} does not exist; choose one of {versions}")
    if d not in head_dims:
        raise KernelInputError(f"head dimension d = {d} is not supported; this kernel takes d in {head_dims}")
    dtype = flashsim_dtype(dtype)
    if dtype not in ("fp16", "bf16"):
        raise KernelInputError(f"dtype {dtype}: {kernel} takes fp16 or bf16")
    return dtype


def configure(B: int, H: int, N: int, d: int, *, dtype: str = "fp16", causal: bool = False,
              block_rows=None, block_cols=None, version=None, min_blocks=None) -> TcLaunch:
    """The launch for (B, H, N, d): CONFIGS[d] unless tiles, ``version`` or ``min_blocks``
    are given; checked against what the kernel can run."""
    dtype = checked_choice(version, d, dtype, VERSIONS, HEAD_DIMS, "the tensor-core kernel")
    Br, Bc = table_rule(TILES, d, block_rows, block_cols)
    D = defines(d, dtype, block_rows=Br, block_cols=Bc, version=version, min_blocks=min_blocks)
    wm = warp_rows(D["VERSION"])
    if Br % wm or Br > 16 * wm or Bc % 16 or Bc < 16:
        raise KernelInputError(f"version {D['VERSION']} needs block_rows a multiple of {wm} (at most "
                               f"{16 * wm}) and block_cols a multiple of 16, got {Br}, {Bc}")
    smem = smem_bytes(d, Br, Bc, D["VERSION"])
    # flashsim's plan: the preset's SRAM, or the working set of these tiles where it is larger
    need = ALGORITHMS[ALGORITHM].working_set_bytes(Br, Bc, d, 2)
    from flashsim.hardware.presets import DEFAULT_GPU, gpu

    sram = None if need <= gpu(DEFAULT_GPU).sram_per_block else need
    launch = TcLaunch("cupy_flash2_tc", ALGORITHM, B, H, N, d, dtype, causal, Br, Bc,
                      32 * Br // wm, 0, smem, sram, version=D["VERSION"], min_blocks=D["MIN_BLOCKS"])
    launch.plan()             # flashsim accepts it (raises KernelInputError if not)
    return launch


def tuning_configs(d: int) -> list[dict[str, int]]:
    """The variants the benchmark sweeps (and CI compiles) for one d: every version at the
    baseline tiles B_r = 128, B_c = 64, then other tiles for the faster versions."""
    def c(br, bc, version, min_blocks=1):
        return {"BLOCK_R": br, "BLOCK_C": bc, "VERSION": version, "MIN_BLOCKS": min_blocks}

    out = [c(128, 64, v) for v in VERSIONS]
    if d == 64:
        out += [c(128, 128, 4), c(64, 64, 4, 2), c(128, 32, 4), c(128, 32, 5), c(256, 64, 5), c(64, 64, 5),
                c(64, 64, 3)]
    else:
        out += [c(128, 128, 4), c(64, 64, 4, 2), c(128, 32, 5), c(256, 32, 5), c(64, 32, 5),
                c(64, 64, 3), c(128, 32, 3)]
    return out


def compile_variants():
    out = []
    for d in HEAD_DIMS:
        for dtype in ("fp16", "bf16"):
            configs = tuning_configs(d) if dtype == "fp16" else [CONFIGS[d]]
            if CONFIGS[d] not in configs:
                configs = [CONFIGS[d]] + configs
            for c in configs:
                D = defines(d, dtype, **c)
                out.append((CU_FILE, D, smem_bytes(d, D["BLOCK_R"], D["BLOCK_C"], D["VERSION"]), HOT))
    return out
