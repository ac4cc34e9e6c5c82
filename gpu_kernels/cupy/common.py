"""What the CuPy RawModule kernels share: loading the CUDA C++ of ``gpu_kernels/cuda/``,
taking CuPy arrays or PyTorch CUDA tensors without copies, and launching.

* ``read_source(name)``: the text of ``gpu_kernels/cuda/<name>`` with ``#include "x.cuh"``
  lines replaced by the header's text (so CuPy's compile cache, keyed by the source text,
  sees a changed header; NVRTC needs no include path for our own headers).
* ``get_kernel(file, name, defines, dynamic_smem)``: compile (once per process and per set
  of compile-time constants; CuPy also keeps a disk cache) and return a ``cupy.RawKernel``.
* ``as_cupy(x)``: a CuPy view of a CuPy array, a PyTorch CUDA tensor (no copy; DLPack across
  streams) or another CUDA array (CUDA Array Interface, no copy); ``output`` / ``wrap_like``:
  result buffers and results handed back in the caller's framework.
* ``CupyLaunch``: a ``Launch`` whose ``run`` takes those arrays, checks them against the
  launch before anything runs, and launches through ``launch_kernel``.
* ``tensor_map(...)``: a CUtensorMap for the TMA unit (tma.cuh), passed to a kernel by value.

CuPy is imported inside functions only, so importing this module needs no GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import tempfile

from ..common import KernelInputError, KernelLaunch, Launch, describe

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda")
LOG2E = 1.4426950408889634
# Options for NVRTC through CuPy (CuPy adds -arch=sm_XX for the current device itself).
BASE_OPTIONS = ("-std=c++17",)
_INCLUDE = re.compile(r'^#include "([\w.]+\.cuh)"(?:[ \t]*//.*)?[ \t]*$', re.M)


def read_source(name: str) -> str:
    """``gpu_kernels/cuda/<name>`` with our own headers pasted in place of their #include."""
    with open(os.path.join(KERNEL_DIR, name), encoding="utf-8") as f:
        text = f.read()
    return _INCLUDE.sub(lambda m: read_source(m.group(1)) + f'#line {_line_after(text, m)} "{name}"',
                        text)


def _line_after(text: str, match) -> int:
    """The line number (1-based) of the line after ``match`` in ``text``."""
    return text.count("\n", 0, match.end()) + 2


def compile_options(defines: dict[str, int]) -> tuple[str, ...]:
    return BASE_OPTIONS + tuple(f"-D{k}={int(v)}" for k, v in defines.items())


@functools.lru_cache(maxsize=None)
def _module(cu_file: str, defines_items: tuple):
    import cupy

    return cupy.RawModule(code=read_source(cu_file), options=compile_options(dict(defines_items)))


@functools.lru_cache(maxsize=None)
def cubin(cu_file: str, defines_items: tuple, arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of ``cu_file`` with these constants for ``arch`` (NVRTC through
    ``gpu_kernels.compile``; no GPU needed): for targets CuPy's own compile does not pick,
    such as sm_90a (wgmma)."""
    from ..compile import compile_cubin

    return compile_cubin(read_source(cu_file), dict(defines_items), arch=arch, name=cu_file)


def cubin_path(cu_file: str, defines: dict[str, int], arch: str) -> str:
    """:func:`cubin` written to a file (CuPy loads modules from files), named by its hash."""
    data, _ = cubin(cu_file, tuple(sorted(defines.items())), arch)
    folder = os.path.join(tempfile.gettempdir(), "flashsim-cubin")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha256(data).hexdigest()[:32] + ".cubin")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


@functools.lru_cache(maxsize=None)
def _cubin_module(cu_file: str, defines_items: tuple, arch: str):
    import cupy

    return cupy.RawModule(path=cubin_path(cu_file, dict(defines_items), arch))


def get_kernel(cu_file: str, name: str, defines: dict[str, int], dynamic_smem: int = 0,
               arch: str | None = None):
    """The compiled ``cupy.RawKernel`` ``name`` of ``cu_file`` with these constants; ``arch``
    (e.g. "sm_90a"): compiled for that target by :func:`cubin`, else by CuPy for the device.

    ``dynamic_smem`` above 48 KB raises the kernel's dynamic shared-memory limit (opt-in).
    """
    items = tuple(sorted(defines.items()))
    module = _module(cu_file, items) if arch is None else _cubin_module(cu_file, items, arch)
    kernel = module.get_function(name)
    if dynamic_smem > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < dynamic_smem:
        kernel.max_dynamic_shared_size_bytes = dynamic_smem
    return kernel


def kernel_resources(kernel) -> dict[str, int]:
    """Registers, local memory and static shared memory of a loaded kernel (from the driver)."""
    return {"registers": int(kernel.num_regs), "local_bytes": int(kernel.local_size_bytes),
            "static_smem": int(kernel.shared_size_bytes)}


# The CuPy dtype a torch tensor of each dtype is viewed as (bfloat16's bits as int16)
_TORCH_VIEW_DTYPES = {"float16": "float16", "bfloat16": "int16", "float32": "float32",
                      "int32": "int32", "int64": "int64", "int16": "int16", "uint8": "uint8"}


def as_cupy(x, name: str):
    """(CuPy view of ``x``, dtype name): ``x`` is a CuPy array, a CUDA tensor from PyTorch
    (no copy), or another CUDA array (its CUDA Array Interface). bfloat16 tensors travel as
    int16 (CuPy need not know bfloat16: the kernels only see the bits), so the dtype name is
    returned beside the view. Host arrays are refused.

    A tensor on the stream CuPy launches on (both on the default stream, say) is viewed over
    its own pointer, shape and strides (``_torch_view``); otherwise through DLPack, which
    makes CuPy's stream wait for PyTorch's: its stream checks run in PyTorch's Python for
    every tensor, and a decode step takes five (decode_host_issue_ab_h200.json)."""
    import cupy

    if isinstance(x, cupy.ndarray):
        return x, str(x.dtype)
    info = describe(x, name)
    if info.kind == "torch":
        import torch

        view = _TORCH_VIEW_DTYPES.get(info.dtype)
        if view is not None and _torch_stream(torch, info.device) == cupy.cuda.get_current_stream().ptr:
            return _torch_view(cupy, x, info, view), info.dtype
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)
        return cupy.from_dlpack(x), info.dtype
    if info.kind == "cuda":
        return cupy.asarray(x), info.dtype
    raise KernelInputError(f"{name} must be a cupy.ndarray or a torch.Tensor on the GPU, "
                           f"got {type(x).__name__}")


def _torch_stream(torch, device: int) -> int:
    """PyTorch's current stream on ``device``, as a CUDA stream handle."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # what Triton calls: no Python objects
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _torch_view(cupy, x, info, dtype: str):
    """A CuPy array over torch tensor ``x``'s memory (its pointer, shape and strides; ``x``
    kept alive by the view), of CuPy dtype ``dtype`` (``x``'s item size)."""
    item = x.element_size()
    shape, strides = tuple(x.shape), tuple(st * item for st in x.stride())
    # the bytes the view spans from its first element (strides are not negative in torch)
    size = 0 if 0 in shape else item + sum((n - 1) * st for n, st in zip(shape, strides))
    mem = cupy.cuda.UnownedMemory(x.data_ptr(), size, x, info.device)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0), strides)


def output(x, name: str, shape: tuple, dtype: str, like=None):
    """A result buffer: ``x`` if given (checked: CuPy array or torch tensor of this shape and
    dtype, C-contiguous), else a new CuPy array (``like``'s storage type, or ``dtype``)."""
    import cupy

    if x is None:
        return cupy.empty_like(like) if like is not None else cupy.empty(shape, dtype=dtype)
    a, dt = as_cupy(x, name)
    if tuple(a.shape) != tuple(shape) or dt != dtype or not a.flags.c_contiguous:
        raise KernelInputError(f"{name} must be a C-contiguous {dtype} array of shape {tuple(shape)}, "
                               f"got {dt} {tuple(a.shape)}")
    return a


def wrap_like(x, kind: str, dtype: str | None = None):
    """``x`` (a CuPy array) in the caller's framework ``kind``: a torch tensor (DLPack, no
    copy; bfloat16 when ``dtype`` says so), a NumPy array (copied to the host), a numba
    device array (no copy) or the CuPy array itself."""
    if kind == "torch":
        import torch

        t = torch.from_dlpack(x)
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t
    if kind == "numpy":
        return x.get()
    if kind == "cuda":
        from numba import cuda

        return cuda.as_cuda_array(x)
    return x


def tensor_map(ptr: int, dims: tuple, strides: tuple, box: tuple, bf16: bool, l2_promotion: int = 256):
    """CUtensorMap of an fp16/bf16 tensor at device address ``ptr``: ``dims`` innermost first
    (the first contiguous), ``strides`` the byte strides of the others (multiples of 16), boxes
    of ``box`` elements (the first: 64 = 128 bytes, as the 128-byte swizzle takes), the
    swizzle the kernels' tiles use (tma.cuh), elements past ``dims`` filled with zeros.
    Returned as a one-element NumPy array of a 128-byte structured dtype, which CuPy passes by
    value (CuPy's examples/custom_struct): a __grid_constant__ TensorMap parameter."""
    import numpy as np
    from cuda.bindings import driver

    T = driver.CUtensorMapDataType
    dt = T.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 if bf16 else T.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t      # the binding takes no plain ints
    err, tmap = driver.cuTensorMapEncodeTiled(
        dt, len(dims), int(ptr), [u64(n) for n in dims], [u64(n) for n in strides],
        [u32(n) for n in box], [u32(1)] * len(dims),
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        getattr(driver.CUtensorMapL2promotion, {0: "CU_TENSOR_MAP_L2_PROMOTION_NONE"}.get(
            l2_promotion, f"CU_TENSOR_MAP_L2_PROMOTION_L2_{l2_promotion}B")),
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled(dims {dims}, strides {strides}, box {box}) failed: {err}")
    words = np.array([int(w) for w in tmap.opaque], dtype=np.uint64)
    return words.view(np.dtype([("opaque", np.uint64, (16,))]))     # shape (1,): passed as a struct


class CupyLaunch(Launch):
    """A Launch of a CUDA C++ kernel through CuPy. Subclasses give ``CU_FILE``,
    ``defines()``, ``launches()`` and ``run``."""

    CU_FILE = ""

    def defines(self) -> dict[str, int]:
        raise NotImplementedError

    def inputs(self, Q, K, V):
        """CuPy views of Q, K, V, checked against this launch (shape, dtype, C order)."""
        out = []
        for x, name in ((Q, "Q"), (K, "K"), (V, "V")):
            a, dt = as_cupy(x, name)
            self.check_shape_of(dataclasses.replace(describe(a, name), dtype=dt), name)
            if not a.flags.c_contiguous:
                raise KernelInputError(f"{name} is not C-contiguous; pass a contiguous copy")
            out.append(a)
        return out

    def arch(self) -> str | None:
        """The target this launch's kernels compile for (``get_kernel``'s ``arch``); None:
        CuPy's for the device."""
        return None

    def launch_kernel(self, kl: KernelLaunch, args: tuple) -> None:
        """Launch ``kl`` (one of ``launches()``) of this file with these constants."""
        kernel = get_kernel(self.CU_FILE, kl.kernel, self.defines(), kl.dynamic_smem, self.arch())
        kernel(kl.grid, (kl.threads,), args, shared_mem=kl.dynamic_smem)


# --------------------------------------------------------------------------------------
# The fp32 CUDA-core kernels (standard.cu, flash1.cu, flash2.cu): one thread layout, tiles
# from flashsim's SRAM rule for SRAM bytes of shared memory

SRAM = 48 * 1024        # the shared memory per block the fp32 kernels are planned for
NUM_THREADS = 256       # threads per block of every fp32 kernel


class Fp32Launch(CupyLaunch):
    """A launch of one of the fp32 files: compile-time constants d, B_r, B_c, threads."""

    def defines(self) -> dict[str, int]:
        return fp32_defines(self.d, self.block_rows, self.block_cols)

    def run_fused(self, Q, K, V, stats: tuple):
        """Launch the one kernel of a fused file (flash1.cu, flash2.cu) with arguments
        (Q, K, V, O, *stats, N, tau, causal): returns O and the row statistics ``stats``
        names, each (B, H, N) float32 (CuPy)."""
        import cupy

        q, k, v = self.inputs(Q, K, V)
        O = cupy.empty_like(q)
        rows = {n: cupy.empty((self.batch, self.heads, self.N), dtype=cupy.float32) for n in stats}
        (kl,) = self.launches()
        self.launch_kernel(kl, (q, k, v, O, *rows.values(), cupy.int32(self.N),
                                cupy.float32(self.tau), cupy.int32(self.causal)))
        return O, rows


def fp32_defines(d: int, block_rows: int, block_cols: int) -> dict[str, int]:
    return {"HEAD_DIM": d, "BLOCK_R": block_rows, "BLOCK_C": block_cols, "NUM_THREADS": NUM_THREADS}


def fp32_plan(algorithm: str, B: int, H: int, N: int, d: int, *, causal: bool, block_rows, block_cols,
              sram: int = SRAM):
    """The fp32 kernels' tile rule: flashsim's plan for an SRAM of ``sram`` bytes (the
    tile policy's ``sram_rule``); given tiles must fit there too."""
    from ..common import sram_rule

    return sram_rule(algorithm, N, d, dtype="fp32", sram=int(sram), causal=causal,
                     block_rows=block_rows, block_cols=block_cols)


def fp32_configure(cls, kernel: str, algorithm: str, shared_bytes, B: int, H: int, N: int, d: int,
                   *, causal: bool = False, block_rows=None, block_cols=None, sram: int = SRAM):
    """The launch of a fused fp32 kernel: tiles from ``fp32_plan``, static shared memory
    ``shared_bytes(d, B_r, B_c)``, NUM_THREADS threads."""
    p = fp32_plan(algorithm, B, H, N, d, causal=causal, block_rows=block_rows,
                  block_cols=block_cols, sram=sram)
    return cls(kernel, algorithm, B, H, N, d, "fp32", causal, p.block_rows, p.block_cols,
               NUM_THREADS, shared_bytes(d, p.block_rows, p.block_cols), 0, p.sram_bytes)


def fp32_variants(cu_file: str, algorithm: str, hot: tuple, head_dims=(64, 128)) -> list:
    """(file, defines, dynamic smem, hot kernels) that CI compiles: the plans at N = 4096."""
    out = []
    for d in head_dims:
        p = fp32_plan(algorithm, 1, 1, 4096, d, causal=False, block_rows=None, block_cols=None)
        out.append((cu_file, fp32_defines(d, p.block_rows, p.block_cols), 0, hot))
    return out
