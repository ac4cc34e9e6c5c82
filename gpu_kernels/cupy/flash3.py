"""FlashAttention-3-style forward for Hopper, fp16 / bf16 (``cuda/flash3.cu``, sm_90a).

    Q, K, V, O: (B, H, N, d) float16 or bfloat16, d in {64, 128, 256}; L: (B, H, N) float32,
    the natural-log logsumexp of each row of tau Q K^T.

wgmma (SS for S = Q K^T, RS for O += P V) with fp32 accumulation and fp32 softmax statistics;
any N (ragged last blocks are masked); causal is top-left aligned (query r sees keys <= r).
The header of the .cu file lists the versions (``version=1..4``): v1 cp.async loads, v2 TMA
loads (tensor maps made here with ``cuda.bindings``), v3 a producer warpgroup and setmaxnreg,
v4 ping-pong and intra-warpgroup overlap. Tiles: B_r = 128 (two consumer warpgroups of 64
rows), B_c from ``CONFIGS`` (128, or 64 at d = 256). Threads: 256 (v1, v2) or 384 (v3, v4).
Shared memory (dynamic): ``smem_bytes``.

CuPy compiles RawModule code for the plain sm_90 target, which has no wgmma, so this loader
compiles the file itself with NVRTC for sm_90a (``gpu_kernels.compile.compile_cubin``) and
loads the cubin through ``cupy.RawModule(path=...)``.

Masks (``mask=``, v3 only): a flashsim mask (a spec such as ``sliding:1024``, a
``flashsim.masks.Mask``, or FlashMask's four vectors (LTS, LTE, UTS, UTE) as a tuple), one
mask for every (batch, head). The host classifies the tiles with ``Mask.classify`` (FlashMask's
per-key-block minima and maxima) and hands the kernel the list of non-skipped tiles of each
query block (``tile_list``) and the column vectors (``column_vectors``); the kernel built with
MASK = 1 loads and multiplies only the listed tiles and masks the partial ones in registers.
A row that sees no key gets O = 0 and L = -inf. One registry entry (``cupy_flash3``) with a
``mask=`` option rather than a second entry: the same file, loader, tiles and launch, as
``flex_attention`` takes ``block_mask=`` beside its unmasked call.

Tiles against flashsim's default rule: they differ; its rule for this placement (S, P and
O in the registers of the launch's warps, H200 preset) takes larger square tiles than the
kernel's B_r = 128 (two warpgroups of wgmma's 64 rows) by B_c = 128 (64 at d = 256).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from ..common import KernelInputError, Result, dtype_name
from . import common
from .common import LOG2E, output, read_source
from .flash2_tc import TcLaunch, checked_choice

ALGORITHM = "flash2"          # the same loop nest as FlashAttention-2; other instructions
CU_FILE = "flash3.cu"
ARCH = "sm_90a"
HOT = ("flash3_fwd",)
HEAD_DIMS = (64, 128, 256)
VERSIONS = (1, 2, 3, 4)
BLOCK_R = 128
CONSUMER_WARPS = 8            # S_ij, P_ij and O_i live in the registers of these warps
# VERSION 3 by default: on the H200 the fastest at most of the FA2 paper's configurations and
# close to the fastest at the rest (hopper_h200.json, 2026-12-02; docs/hopper_kernel.md
# gives the counts); v4's ping-pong measured slower.
CONFIGS = {
    64: {"BLOCK_R": BLOCK_R, "BLOCK_C": 128, "KV_STAGES": 2, "VERSION": 3},
    128: {"BLOCK_R": BLOCK_R, "BLOCK_C": 128, "KV_STAGES": 2, "VERSION": 3},
    256: {"BLOCK_R": BLOCK_R, "BLOCK_C": 64, "KV_STAGES": 2, "VERSION": 3},
}
SMEM_LIMIT = 227 * 1024
# Tensor maps travel as __grid_constant__ parameters (CuPy passes a one-element structured
# array by value); should CuPy refuse that, the loader switches to the TMAP_GLOBAL build once.
# FLASHSIM_FLASH3_TMAP=global starts with that build (the benchmark tries both).
TMAP_BY_VALUE = os.environ.get("FLASHSIM_FLASH3_TMAP") != "global"


def threads(version: int) -> int:
    """Threads per block: two consumer warpgroups, plus the producer warpgroup from v3 on."""
    return 128 * (2 + (version >= 3))


def smem_bytes(d: int, block_cols: int, stages: int) -> int:
    """Dynamic shared memory of one block (SMEM_BYTES in the .cu file): 1024 bytes to align
    the tiles, Q_i (B_r x d), K_j and V_j in every stage (B_c x d each), 8-byte mbarriers."""
    return 1024 + BLOCK_R * d * 2 + 2 * stages * block_cols * d * 2 + 8 * (1 + 3 * stages)


_MACROS = {"block_rows": "BLOCK_R", "block_cols": "BLOCK_C", "version": "VERSION", "stages": "KV_STAGES"}


def defines(d: int, dtype: str, **config) -> dict[str, int]:
    """The compile-time constants: CONFIGS[d] with the given ones (by macro or argument name)."""
    c = dict(CONFIGS[d])
    c.update({_MACROS.get(k, k): v for k, v in config.items() if v is not None})
    return {"HEAD_DIM": d, "IS_BF16": int(dtype_name(dtype) == "bfloat16"), **c}


# ---------------------------------------------------------------- compiling and loading

def cubin(defines_items: tuple) -> tuple[bytes, str]:
    """(cubin, ptxas log) of flash3.cu with these constants, for sm_90a (no GPU needed)."""
    return common.cubin(CU_FILE, defines_items, ARCH)


def ptxas_log(defines: dict[str, int]) -> str:
    """ptxas' log of :func:`cubin`'s compile of these constants, read from
    ``compile_cache.json`` when it holds it (then nothing is compiled)."""
    from ..compile import ptxas_log as log_of

    return log_of(read_source(CU_FILE), dict(sorted(defines.items())), arch=ARCH, name=CU_FILE)


@functools.lru_cache(maxsize=None)
def get_kernel(defines_items: tuple, dynamic_smem: int):
    """The loaded ``cupy.RawKernel`` flash3_fwd with these constants, shared memory opted in."""
    return common.get_kernel(CU_FILE, "flash3_fwd", dict(defines_items), dynamic_smem, arch=ARCH)


# ---------------------------------------------------------------- tensor maps (TMA)

def tensor_map(x, d: int, N: int, BH: int, box_rows: int, bf16: bool):
    """CUtensorMap of a (B, H, N, d) fp16/bf16 CuPy array seen as the 3-D tensor (d, N, B*H):
    boxes of 64 columns x ``box_rows`` rows x 1 head, 128-byte swizzle (the layout the
    kernel's wgmma descriptors read), rows past N filled with zeros (common.tensor_map)."""
    return common.tensor_map(x.data.ptr, (d, N, BH), (d * 2, N * d * 2), (64, box_rows, 1), bf16)


# ---------------------------------------------------------------- masks (MASK = 1)

MASK_VERSION = 3              # the mask path is built on v3 (producer + two consumers)
MASK_HEAD_DIMS = (64, 128)    # compiled and checked for masks (d = 256 runs but is not listed)
CONSUMER_ROWS = 64            # rows of one consumer warpgroup: the element-mask flags' unit


def tile_list(mask, block_rows: int = BLOCK_R, block_cols: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(kv_indptr (T_r + 1,), kv_entries (nnz,)) int32: for query block i, entries
    kv_indptr[i] .. kv_indptr[i + 1] - 1 are its non-skipped key blocks j in ascending order,
    each written 4 j + f0 + 2 f1, f_w = 1 where consumer warpgroup w's 64 rows of the tile need
    the element mask. Tiles from ``mask.classify(block_rows, block_cols)`` (FlashMask's test
    on per-key-block minima and maxima); f_w from the same test at 64-row blocks (for a
    block-sparse mask every listed tile is whole: f_w = 0)."""
    from flashsim.masks import FULL, SKIP

    tiles = mask.classify(block_rows, block_cols)                      # (T_r, T_c)
    Tr, Tc = tiles.shape
    per = block_rows // CONSUMER_ROWS
    if mask.lts is None:
        flags = np.zeros((Tr, per, Tc), dtype=np.int64)
    else:
        half = mask.classify(CONSUMER_ROWS, block_cols) != FULL         # (T_r', T_c)
        pad = np.zeros((Tr * per - half.shape[0], Tc), dtype=bool)     # rows past N: no flag
        flags = np.concatenate([half, pad]).reshape(Tr, per, Tc).astype(np.int64)
    code = 4 * np.arange(Tc)[None, :] + sum(flags[:, w] << w for w in range(per))
    keep = tiles != SKIP
    indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    return indptr, code[keep].astype(np.int32)      # row-major: i ascending, then j


def column_vectors(mask) -> np.ndarray:
    """(N, 4) int32: FlashMask's LTS, LTE, UTS, UTE per key column (one int4 per column, as
    the kernel reads them); a block-sparse mask hides no element inside its tiles."""
    if mask.lts is None:
        n = mask.n
        return np.tile(np.array([n, n, 0, 0], dtype=np.int32), (n, 1))
    return np.stack([mask.lts, mask.lte, mask.uts, mask.ute], axis=1).astype(np.int32)


def checked_mask(mask, N: int, d: int, causal: bool, version):
    """The flashsim Mask for ``mask=`` (a spec, a Mask of this N, or FlashMask's four vectors
    (LTS, LTE, UTS, UTE), each (N,)), or KernelInputError."""
    from flashsim.masks import MaskError, from_vectors, parse

    if d not in MASK_HEAD_DIMS:
        raise KernelInputError(f"masks run at head dimension d in {MASK_HEAD_DIMS}, not d = {d}")
    if causal:
        raise KernelInputError("give causal=True or a mask, not both (mask='causal' is the causal "
                               "mask through FlashMask's vectors)")
    if version is not None and version != MASK_VERSION:
        raise KernelInputError(f"masks run on version {MASK_VERSION} of the Hopper kernel, not "
                               f"version {version}")
    try:
        if isinstance(mask, (tuple, list)):           # FlashMask's (LTS, LTE, UTS, UTE)
            if len(mask) != 4:
                raise MaskError(f"FlashMask vectors are four (LTS, LTE, UTS, UTE), got {len(mask)}")
            mask = from_vectors(*mask)
        return parse(mask, N)
    except MaskError as exc:
        raise KernelInputError(str(exc)) from exc


# ---------------------------------------------------------------- the launch

@dataclass
class Flash3Launch(TcLaunch):
    CU_FILE = CU_FILE
    KERNEL = "flash3_fwd"
    DEFINES = staticmethod(defines)
    PLAN_WARPS = staticmethod(lambda launch: CONSUMER_WARPS)
    stages: int = 2
    mask: object = None       # a flashsim.masks.Mask (None: no mask; causal as before)

    def tuning(self) -> dict[str, int]:
        return {"stages": self.stages, **({"MASK": 1} if self.mask is not None else {})}

    def plan_record(self) -> dict:
        return dict(super().plan_record(), stages=self.stages,
                    **({"mask": self.mask.spec} if self.mask is not None else {}))

    def mask_arrays(self):
        """(kv_indptr, kv_entries, column vectors) on the device, made once per launch."""
        import cupy

        if "mask" not in self.workspace:
            indptr, entries = tile_list(self.mask, self.block_rows, self.block_cols)
            self.workspace["mask"] = (cupy.asarray(indptr), cupy.asarray(entries if len(entries) else
                                                                         np.zeros(1, np.int32)),
                                      cupy.asarray(column_vectors(self.mask)))
        return self.workspace["mask"]

    def compiled(self, tmap_global: int = 0):
        """The loaded kernel (``kernel`` is the launch's name field, "cupy_flash3");
        ``tmap_global``: the build that reads its tensor maps from global memory."""
        D = self.defines()
        if tmap_global:
            D["TMAP_GLOBAL"] = 1
        return get_kernel(tuple(sorted(D.items())), self.dynamic_smem)

    def run(self, Q, K, V, out=None, lse=None) -> Result:
        """Q, K, V: (B, H, N, d) fp16/bf16 CuPy arrays or torch tensors -> Result(O like Q,
        L (B, H, N) float32) as CuPy arrays; ``out`` / ``lse``: preallocated O and L."""
        import cupy

        global TMAP_BY_VALUE
        q, k, v = self.inputs(Q, K, V)
        O = output(out, "out", tuple(q.shape), dtype_name(self.dtype), like=q)
        L = output(lse, "lse", tuple(q.shape[:-1]), "float32")
        (kl,) = self.launches()
        args = (q, k, v, O, L, cupy.int32(self.N), cupy.float32(self.tau * LOG2E), cupy.int32(self.causal))
        if self.mask is not None:
            args += self.mask_arrays()
        launch = dict(shared_mem=kl.dynamic_smem)
        if self.version == 1:                 # v1 loads with cp.async and takes no tensor maps
            self.compiled()(kl.grid, (kl.threads,), args, **launch)
            return Result(O, L)
        bf16 = self.dtype == "bf16"
        maps = (tensor_map(q, self.d, self.N, self.BH, self.block_rows, bf16),
                tensor_map(k, self.d, self.N, self.BH, self.block_cols, bf16),
                tensor_map(v, self.d, self.N, self.BH, self.block_cols, bf16))
        if TMAP_BY_VALUE:
            try:
                self.compiled()(kl.grid, (kl.threads,), args + maps, **launch)
                return Result(O, L)
            except TypeError:                 # CuPy refused the struct, before any launch
                TMAP_BY_VALUE = False
        import numpy as np

        self.workspace["tensor_maps"] = buf = cupy.asarray(np.concatenate([m.view(np.uint64) for m in maps]))
        self.compiled(1)(kl.grid, (kl.threads,), args + (buf,), **launch)
        return Result(O, L)


def configure(B: int, H: int, N: int, d: int, *, dtype: str = "fp16", causal: bool = False,
              block_rows=None, block_cols=None, version=None, stages=None, mask=None) -> Flash3Launch:
    """The launch for (B, H, N, d): CONFIGS[d] unless B_c, ``version`` or ``stages`` are given;
    checked against what the kernel can run before anything is compiled. ``mask``: a flashsim
    mask spec or Mask (v3; see the module docstring)."""
    dtype = checked_choice(version, d, dtype, VERSIONS, HEAD_DIMS, "the Hopper kernel")
    if mask is not None:
        mask = checked_mask(mask, N, d, causal, version)
        version = MASK_VERSION
    D = defines(d, dtype, block_rows=block_rows, block_cols=block_cols, version=version, stages=stages)
    Br, Bc, st = D["BLOCK_R"], D["BLOCK_C"], D["KV_STAGES"]
    if Br != BLOCK_R or Bc not in (64, 128) or st not in (2, 3):
        raise KernelInputError(f"the Hopper kernel takes block_rows = {BLOCK_R}, block_cols 64 or 128 "
                               f"and 2 or 3 stages, got {Br}, {Bc}, {st}")
    smem = smem_bytes(d, Bc, st)
    if smem > SMEM_LIMIT:
        raise KernelInputError(f"d = {d}, block_cols = {Bc}, {st} stages need {smem} bytes of shared "
                               f"memory, above the {SMEM_LIMIT} a block can have")
    from flashsim.algorithms import ALGORITHMS
    from flashsim.hardware.presets import DEFAULT_GPU, gpu

    need = ALGORITHMS[ALGORITHM].working_set_bytes(Br, Bc, d, 2)
    sram = None if need <= gpu(DEFAULT_GPU).sram_per_block else need
    launch = Flash3Launch("cupy_flash3", ALGORITHM, B, H, N, d, dtype, causal, Br, Bc,
                          threads(D["VERSION"]), 0, smem, sram, version=D["VERSION"], stages=st,
                          mask=mask)
    launch.plan()             # flashsim accepts it (raises KernelInputError if not)
    return launch


def compile_variants():
    """(file, defines, dynamic smem, hot kernels) that CI compiles: every version at every d,
    fp16 and bf16, at CONFIGS' tiles; the TMA versions' TMAP_GLOBAL build (fp16, d = 128); the
    mask path (MASK = 1, v3) at d = 64 and 128, fp16 and bf16."""
    out = []
    for d in HEAD_DIMS:
        for dtype in ("fp16", "bf16"):
            for v in VERSIONS:
                D = defines(d, dtype, version=v)
                out.append((CU_FILE, D, smem_bytes(d, D["BLOCK_C"], D["KV_STAGES"]), HOT))
    for v in VERSIONS[1:]:
        D = dict(defines(128, "fp16", version=v), TMAP_GLOBAL=1)
        out.append((CU_FILE, D, smem_bytes(128, D["BLOCK_C"], D["KV_STAGES"]), HOT))
    for d in MASK_HEAD_DIMS:
        for dtype in ("fp16", "bf16"):
            D = dict(defines(d, dtype, version=MASK_VERSION), MASK=1)
            out.append((CU_FILE, D, smem_bytes(d, D["BLOCK_C"], D["KV_STAGES"]), HOT))
    return out
