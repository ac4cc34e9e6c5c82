"""Every kernel by name: what it computes, with what, and how it is launched.

    from gpu_kernels import registry
    launch = registry.launch("numba_flash2", batch=4, heads=16, seq_len=4096, head_dim=64)
    launch.plan()              # flashsim's plan for exactly this launch (same tiles, N, d, ...)
    launch.grid, launch.threads, launch.static_smem, launch.dynamic_smem
    launch.launches()          # every kernel launch it makes: kernel, grid, threads, smem
    O, L = launch.run(Q, K, V) # device arrays

Each ``Kernel`` says its algorithm and pass, backend, dtypes, head dimensions, tile rule
(one of the tile policy's rules in ``gpu_kernels.common``), thread layout and shared-memory
formula, and where its launch differs from flashsim's loop nest (``unlike_plan``: kernel
name -> (the nest's launch it replaces, why)). Adding a kernel is one entry here and one
module with ``configure(B, H, N, d, *, causal, block_rows, block_cols, ...) -> Launch``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from numbers import Integral

from .common import KernelInputError, Launch, check_flag, check_shape, flashsim_dtype


@dataclass(frozen=True)
class Kernel:
    name: str
    algorithm: str               # flashsim's algorithm: standard, flash1, flash2
    backend: str                 # numba or cupy
    module_name: str             # the module (under gpu_kernels) with ``configure``
    dtypes: tuple                # flashsim's names: fp32, fp16, bf16
    head_dims: tuple | None      # the d it takes (None: 1 <= d <= max_head_dim)
    tile_rule: str               # how B_r, B_c are chosen when not given
    threads: str                 # the thread layout of a block
    shared_memory: str           # bytes of shared memory per block
    pass_: str = "fwd"           # fwd or bwd
    configure_name: str = "configure"
    cu_file: str | None = None
    max_head_dim: int | None = None
    options: tuple = ()          # keyword options ``launch`` passes on to ``configure``
    unlike_plan: dict = field(default_factory=dict)

    def module(self):
        return importlib.import_module(f"gpu_kernels.{self.module_name}")

    def launch(self, *, batch: int, heads: int, seq_len: int, head_dim: int, dtype=None,
               causal: bool = False, block_rows=None, block_cols=None, **options) -> Launch:
        """The configured launch for (batch, heads, seq_len, head_dim): checked (shape, dtype,
        d, tiles, options; KernelInputError) before anything touches a GPU."""
        check_flag(causal, "causal")
        B, H, N, d = check_shape((batch, heads, seq_len, head_dim), self.head_dims,
                                 self.max_head_dim)
        dtype = self.dtypes[0] if dtype is None else flashsim_dtype(dtype)
        if dtype not in self.dtypes:
            raise KernelInputError(f"{self.name} takes {', '.join(self.dtypes)}, not {dtype}")
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise KernelInputError(f"{self.name} has no option {', '.join(unknown)}; it takes "
                                   f"{', '.join(self.options) or 'none'}")
        for name, value in (("block_rows", block_rows), ("block_cols", block_cols)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)
                                      or value < 1):
                raise KernelInputError(f"{name} must be a positive integer, got {value!r}")
        if "dtype" in self.options:
            options["dtype"] = dtype
        configure = getattr(self.module(), self.configure_name)
        return configure(B, H, N, d, causal=causal, block_rows=block_rows, block_cols=block_cols,
                         **options)


FP32_CUDA_CORES = "256 threads, one warp per row of the Q block"
NUMBA_LAYOUT = ("TR x TC threads, thread (tr, tc) owning RM x CN of S_ij and RM x DN of O_i "
                "(numba.common.Tiling, chosen by choose_tiling unless threads=(TR, TC))")

KERNELS = {k.name: k for k in (
    Kernel("numba_standard", "standard", "numba", "numba.standard", ("fp32",), None,
           "flashsim's SRAM rule at 48 KiB (sram_rule)", NUMBA_LAYOUT + "; softmax: up to 128 "
           "threads per row", "kernel 1: 4 (Q_i^T + K_j^T), kernel 3: 4 (P_ij^T + V_j) with "
           "odd-chunk row strides (Tiling.shared_words); kernel 2: 4 N dynamic + 8 NT",
           max_head_dim=128, options=("threads",),
           unlike_plan={"row_softmax_fits": (1, "one row per block where flashsim's kernel 2 "
                                                "holds R rows: the same bytes"),
                        "row_softmax_stream": (1, "one row per block, read twice, where "
                                                  "flashsim streams B_r x B_c tiles: the same "
                                                  "bytes")}),
    Kernel("numba_flash1", "flash1", "numba", "numba.flash1", ("fp32",), None,
           "flashsim.fastest_blocks with the thread layout's score (fastest_rule)", NUMBA_LAYOUT,
           "4 (Q_i^T + K_j^T + V_j + P~_ij^T + 2 B_r' TC) words (Tiling.shared_words)",
           max_head_dim=128, options=("threads",),
           unlike_plan={"fill_flat": (0, "line 2's O = 0, l = 0, m = -inf as three fills"),
                        "flash1_step": (0, "one launch per K/V block j, one thread block per "
                                           "(Q block i, head), where flashsim's nest runs one "
                                           "block per head: the same loads and stores")}),
    Kernel("numba_flash2", "flash2", "numba", "numba.flash2", ("fp32",), None,
           "flashsim.fastest_blocks with the thread layout's score (fastest_rule)", NUMBA_LAYOUT,
           "4 (Q_i^T + K_j^T + V_j + P_ij^T + B_r' TC) words (Tiling.shared_words)",
           max_head_dim=128, options=("threads",)),
    Kernel("numba_flash2_bwd", "flash2", "numba", "numba.backward", ("fp32",), None,
           "the largest of 64, 32, 16, 8 whose tiles fit 48 KiB (largest_rule)",
           "256 threads (threads=, a power of two), elements e = t, t + 256, ...",
           "4 (2 B_c (d|1) + 2 B_r (d|1) + 2 B_r (B_c|1) + 2 B_r), (n|1): n rounded up to odd",
           pass_="bwd", configure_name="configure_flash2", options=("threads",),
           unlike_plan={"flash2_bwd_preprocess": (0, "16 rows per block where flashsim's "
                                                     "preprocessing loop has B_r: the same bytes")}),
    Kernel("numba_standard_bwd", "standard", "numba", "numba.backward", ("fp32",), None,
           "flashsim standard's 64 x 64, halved until it fits 48 KiB (largest_rule)",
           "256 threads (threads=, a power of two), elements e = t, t + 256, ...",
           "4 max((B_r + B_c)(d|1), B_r ((B_c|1) + (d|1)), B_c ((B_r|1) + (d|1)), threads)",
           pass_="bwd", configure_name="configure_standard", options=("threads", "rows_per_block"),
           unlike_plan={"softmax_bwd_rows": (2, "rows_per_block whole rows per block, held in "
                                                "registers (N <= 4096), where flashsim holds R "
                                                "rows of its SRAM: the same bytes")}),
    Kernel("cupy_standard", "standard", "cupy", "cupy.standard", ("fp32",), None,
           "flashsim's SRAM rule at 48 KiB (sram_rule; sram= to change M)",
           FP32_CUDA_CORES + "; kernels 1 and 3: one S_ij or O_i entry per thread",
           "kernel 1: 4 (B_r d + d (B_c + 1)), kernel 2: 4 R (N + 2) dynamic or 4 (B_r B_c + "
           "2 B_r), kernel 3: 4 (B_r B_c + B_c d + B_r d)", cu_file="standard.cu",
           max_head_dim=None, options=("sram",)),
    Kernel("cupy_flash1", "flash1", "cupy", "cupy.flash1", ("fp32",), None,
           "flashsim's SRAM rule at 48 KiB (sram_rule; sram= to change M)", FP32_CUDA_CORES,
           "4 (d (B_c + 1) + B_c d + 2 B_r d + B_r B_c + 2 B_r)", cu_file="flash1.cu",
           options=("sram",)),
    Kernel("cupy_flash2", "flash2", "cupy", "cupy.flash2", ("fp32",), None,
           "flashsim's SRAM rule at 48 KiB (sram_rule; sram= to change M)", FP32_CUDA_CORES,
           "4 (2 B_r d + 2 B_r + d (B_c + 1) + B_c d + B_r B_c)", cu_file="flash2.cu",
           options=("sram",)),
    Kernel("cupy_flash2_tc", "flash2", "cupy", "cupy.flash2_tc", ("fp16", "bf16"), (64, 128),
           "the measured table CONFIGS per d (table_rule)",
           "32 B_r / WARP_M threads: one warp per 16 query rows (32 from version 5 on)",
           "(B_r + 2 stages B_c) (d, or d + 8 before v3) 2, dynamic (smem_bytes)",
           cu_file="flash2_tc.cu", options=("dtype", "version", "min_blocks")),
    Kernel("cupy_flash3", "flash2", "cupy", "cupy.flash3", ("fp16", "bf16"), (64, 128, 256),
           "B_r = 128, B_c from the table CONFIGS per d (128; 64 at d = 256)",
           "256 threads (two consumer warpgroups of 64 query rows), 384 from version 3 on "
           "(a producer warpgroup beside them)",
           "1024 + 2 B_r d + 4 stages B_c d + 8 (1 + 3 stages), dynamic (smem_bytes)",
           cu_file="flash3.cu", options=("dtype", "version", "stages")),
)}


def get(name: str) -> Kernel:
    """The registry entry ``name``."""
    if name not in KERNELS:
        raise KernelInputError(f"no kernel {name!r}: choose one of {', '.join(KERNELS)}")
    return KERNELS[name]


def launch(name: str, **kw) -> Launch:
    """``get(name).launch(**kw)``."""
    return get(name).launch(**kw)


def find(algorithm: str, backend: str, dtype: str = "fp32", pass_: str = "fwd") -> Kernel:
    """The first entry that runs ``algorithm``'s ``pass_`` on ``backend`` in ``dtype``."""
    dtype = flashsim_dtype(dtype)
    for k in KERNELS.values():
        if (k.algorithm, k.backend, k.pass_) == (algorithm, backend, pass_) and dtype in k.dtypes:
            return k
    raise KernelInputError(f"no {backend} kernel runs {algorithm} ({pass_}) in {dtype}; the "
                           f"kernels: {', '.join(KERNELS)}")
