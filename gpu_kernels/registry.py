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

import functools
import importlib
import json
import os
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
           unlike_plan={"fill_flat": (0, "line 2's O = 0, l = 0, m = -inf as three flat "
                                         "fills, where flashsim's launch 0 stores O_i, l_i, "
                                         "m_i from one block per Q block: the same bytes")}),
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
           cu_file="flash3.cu", options=("dtype", "version", "stages", "mask")),
)}


@dataclass(frozen=True)
class DecodeKernel:
    """A decode-step kernel (issue 14): one step of q_len new tokens against a KV cache, so
    its launch is shaped by (batch, heads, kv_heads, head_dim, kv_lens, q_len, page size), not
    by (batch, heads, seq_len, head_dim); ``launch(**kw)`` is its module's ``configure``.
    Apart from ``KERNELS`` (whose tests hold every entry to flashsim's square-attention
    plan) until flashsim has the ``flashdecoding`` and ``paged`` algorithms."""
    name: str
    algorithm: str               # flashsim's algorithm: flashdecoding or paged
    backend: str
    module_name: str
    dtypes: tuple
    head_dims: tuple
    split_rule: str              # how the KV length is split across blocks
    threads: str
    shared_memory: str
    paged: bool
    cu_file: str = "decode.cu"

    def module(self):
        return importlib.import_module(f"gpu_kernels.{self.module_name}")

    def launch(self, *, batch: int, heads: int, head_dim: int, kv_heads=None, kv_len=None,
               kv_lens=None, q_len: int = 1, dtype=None, **options) -> Launch:
        """The configured launch in flashsim.plan's decode names: ``kv_len`` (every sequence)
        or ``kv_lens`` (one each), ``kv_heads`` (default ``heads``), ``dtype`` (default the
        first of ``dtypes``); ``options`` go to ``configure`` (page_size, block_table,
        num_pages, splits, causal, block_cols, stages, warps, combine, page_prefetch).
        ``page_size`` without ``block_table`` and ``num_pages``: the pool and table of
        ``decode.page_table`` with seed 0 (what ``flashsim predict`` and ``flashsim measure``
        configure: the bytes do not depend on where the pages lie)."""
        if self.paged and options.get("page_size") is None:
            raise KernelInputError(f"{self.name} needs page_size, block_table and num_pages")
        if not self.paged and options.get("page_size") is not None:
            raise KernelInputError(f"{self.name} reads a contiguous cache; use cupy_decode_paged")
        if (kv_len is None) == (kv_lens is None):
            raise KernelInputError(f"{self.name}: give kv_len (every sequence) or kv_lens (one "
                                   "per sequence), not " + ("both" if kv_len is not None else "neither"))
        if kv_lens is None:
            if isinstance(batch, bool) or not isinstance(batch, Integral) or batch < 1:
                raise KernelInputError(f"batch must be an integer >= 1, got {batch!r}")
            kv_lens = [kv_len] * batch
        dtype = self.dtypes[0] if dtype is None else flashsim_dtype(dtype)
        if dtype not in self.dtypes:
            raise KernelInputError(f"{self.name} takes {', '.join(self.dtypes)}, not {dtype}")
        module = self.module()
        if self.paged and options.get("block_table") is None and options.get("num_pages") is None:
            import numpy as np

            page = options["page_size"]
            if isinstance(page, bool) or not isinstance(page, Integral) or page < 1:
                raise KernelInputError(f"page_size must be an integer >= 1, got {page!r}")
            lens = module.host_values(kv_lens, "kv_lens").reshape(-1)
            if lens.dtype.kind not in "iu" or lens.size == 0 or (lens < 1).any():
                raise KernelInputError(f"kv_lens must be integers >= 1, got {lens.tolist()[:8]}")
            options["block_table"], options["num_pages"] = module.page_table(
                lens.tolist(), page, np.random.default_rng(0))
        return module.configure(batch, heads, heads if kv_heads is None else kv_heads,
                                       head_dim, kv_lens=kv_lens, q_len=q_len, dtype=dtype,
                                       **options)


_DECODE_SPLITS = ("FlashAttention's num_splits_heuristic over the blocks resident at once "
                  "(splits= overrides)")
_DECODE_THREADS = ("128 threads: 4 warps = ROW_WARPS (16 packed query rows each) x KEY_WARPS "
                   "(a slice of every K/V tile each)")
_DECODE_SMEM = "(16 ROW_WARPS + 2 STAGES B_c) d 2, dynamic (decode.smem_bytes)"
DECODE_KERNELS = {k.name: k for k in (
    DecodeKernel("cupy_decode", "flashdecoding", "cupy", "cupy.decode", ("fp16", "bf16"), (64, 128),
                 _DECODE_SPLITS, _DECODE_THREADS, _DECODE_SMEM, paged=False),
    DecodeKernel("cupy_decode_paged", "paged", "cupy", "cupy.decode", ("fp16", "bf16"), (64, 128),
                 _DECODE_SPLITS, _DECODE_THREADS, _DECODE_SMEM, paged=True),
)}


def get(name: str) -> Kernel:
    """The registry entry ``name`` (a decode entry from ``DECODE_KERNELS`` too)."""
    if name in DECODE_KERNELS:
        return DECODE_KERNELS[name]
    if name not in KERNELS:
        raise KernelInputError(f"no kernel {name!r}: choose one of "
                               f"{', '.join([*KERNELS, *DECODE_KERNELS])}")
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


# What each compiled variant holds per thread block, as ptxas built it for the H200 and
# Nsight Compute reported it: compiled_h200.json beside this file (measured, so data; its
# note says where from). Head dimension and tiles are compile-time constants (numba also
# specialises on the mask), so each (launch kernel, d, B_r, B_c, causal, threads) is its own
# code. Dynamic shared memory is each launch's own (KernelLaunch.dynamic_smem). Local NVRTC
# builds differ by a few registers (python -m gpu_kernels.compile); the GPU's are stated.
COMPILED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compiled_h200.json")


@functools.cache
def compiled_table() -> dict:
    """{entry: {(launch kernel, d, B_r, B_c, causal, threads): (registers, static shared
    bytes)}} from ``compiled_h200.json``."""
    with open(COMPILED_FILE) as f:
        rows = json.load(f)["rows"]
    out: dict = {}
    for r in rows:
        key = (r["kernel"], r["d"], r["block_rows"], r["block_cols"], r["causal"], r["threads"])
        out.setdefault(r["entry"], {})[key] = (r["registers"], r["static_smem"])
    return out


def compiled(name: str, kernel: str, d: int, block_rows: int, block_cols: int, causal: bool,
             threads: int):
    """``(registers per thread, static shared bytes)`` of one compiled launch of entry
    ``name``, or None when that variant was never built on the GPU (the mask's other
    setting is taken when only it was: the CUDA C++ kernels take the mask at run time)."""
    table = compiled_table().get(name, {})
    for c in (causal, not causal):
        got = table.get((kernel, d, block_rows, block_cols, c, threads))
        if got is not None:
            return got
    return None
