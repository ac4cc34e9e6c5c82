"""Shared plumbing for the CuPy RawModule kernels in ``gpu_kernels/cuda/``.

* ``read_source(name)``: the text of ``gpu_kernels/cuda/<name>``.
* ``get_kernel(file, name, defines)``: compile (once per process and per set of compile-time
  constants; CuPy also keeps a disk cache) and return a ``cupy.RawKernel``.
* ``as_cupy(x)`` / ``check_qkv(...)``: accept CuPy arrays or PyTorch CUDA tensors (through
  DLPack, no copy), validate dtype, shape (B, H, N, d), contiguity and d before any launch.
* ``output(...)`` / ``wrap_like(...)``: result buffers (new, or the caller's, checked) and
  results handed back in the caller's framework (no copy).

CuPy is imported inside functions only, so importing this module needs no GPU.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda")
LOG2E = 1.4426950408889634
# Options for NVRTC through CuPy (CuPy adds -arch=sm_XX for the current device itself).
BASE_OPTIONS = ("-std=c++17",)


class KernelInputError(ValueError):
    """An input that a kernel cannot take; raised before anything is launched."""


def read_source(name: str) -> str:
    with open(os.path.join(KERNEL_DIR, name), encoding="utf-8") as f:
        return f.read()


def compile_options(defines: dict[str, int]) -> tuple[str, ...]:
    return BASE_OPTIONS + tuple(f"-D{k}={int(v)}" for k, v in defines.items())


@functools.lru_cache(maxsize=None)
def _module(cu_file: str, defines_items: tuple):
    import cupy

    return cupy.RawModule(code=read_source(cu_file), options=compile_options(dict(defines_items)))


def get_kernel(cu_file: str, name: str, defines: dict[str, int], dynamic_smem: int = 0):
    """The compiled ``cupy.RawKernel`` ``name`` of ``cu_file`` with these constants.

    ``dynamic_smem`` above 48 KB raises the kernel's dynamic shared-memory limit (opt-in).
    """
    kernel = _module(cu_file, tuple(sorted(defines.items()))).get_function(name)
    if dynamic_smem > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < dynamic_smem:
        kernel.max_dynamic_shared_size_bytes = dynamic_smem
    return kernel


def kernel_resources(kernel) -> dict[str, int]:
    """Registers, local memory and static shared memory of a loaded kernel (from the driver)."""
    return {"registers": int(kernel.num_regs), "local_bytes": int(kernel.local_size_bytes),
            "static_smem": int(kernel.shared_size_bytes)}


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def as_cupy(x, name: str):
    """(CuPy view of ``x``, dtype name): ``x`` is a CuPy array, or a CUDA tensor from PyTorch
    taken through DLPack without a copy. bfloat16 tensors travel as int16 (CuPy need not know
    bfloat16: the kernels only see the bits), so the dtype name is returned beside the view."""
    import cupy

    if isinstance(x, cupy.ndarray):
        return x, str(x.dtype)
    if _is_torch(x):
        import torch

        if not x.is_cuda:
            raise KernelInputError(f"{name} is a PyTorch tensor on {x.device}; move it to the GPU")
        x = x.detach()
        dtype = str(x.dtype).removeprefix("torch.")
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)
        return cupy.from_dlpack(x), dtype
    raise KernelInputError(f"{name} must be a cupy.ndarray or a torch.Tensor on the GPU, "
                           f"got {type(x).__name__}")


@dataclass(frozen=True)
class Inputs:
    """Validated Q, K, V as CuPy arrays, with the shape (B, H, N, d) and where they came from."""
    q: object
    k: object
    v: object
    B: int
    H: int
    N: int
    d: int
    dtype: str       # logical dtype: "float32", "float16" or "bfloat16"
    was_torch: bool


def check_qkv(Q, K, V, *, dtypes: tuple[str, ...], head_dims: tuple[int, ...] | None = None) -> Inputs:
    """Validate Q, K, V of shape (B, H, N, d); raise KernelInputError before any launch."""
    import cupy

    was_torch = _is_torch(Q)
    got = [as_cupy(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V"))]
    (q, qdt), (k, kdt), (v, vdt) = got
    for (a, dt), n in zip(got, "QKV"):
        if a.ndim != 4:
            raise KernelInputError(f"{n} has shape {tuple(a.shape)}; expected 4 dimensions (B, H, N, d)")
        if dt not in dtypes:
            raise KernelInputError(f"{n} has dtype {dt}; this kernel takes {', '.join(dtypes)}")
    if not qdt == kdt == vdt:
        raise KernelInputError(f"Q, K, V dtypes differ: {qdt}, {kdt}, {vdt}")
    if not q.shape == k.shape == v.shape:
        raise KernelInputError(f"Q, K, V shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    for a, n in zip((q, k, v), "QKV"):
        if not a.flags.c_contiguous:
            raise KernelInputError(f"{n} is not C-contiguous (strides {a.strides}); "
                                   f"call .contiguous() / cupy.ascontiguousarray first")
        if a.device.id != cupy.cuda.Device().id:
            raise KernelInputError(f"{n} is on GPU {a.device.id} but the current device is "
                                   f"{cupy.cuda.Device().id}")
    B, H, N, d = (int(s) for s in q.shape)
    if min(B, H, N, d) < 1:
        raise KernelInputError(f"empty input of shape {(B, H, N, d)}")
    if head_dims is not None and d not in head_dims:
        raise KernelInputError(f"head dimension d = {d} is not supported; this kernel takes d in {head_dims}")
    if B * H > 65535:
        raise KernelInputError(f"B * H = {B * H} exceeds the grid's y limit of 65535")
    return Inputs(q, k, v, B, H, N, d, qdt, was_torch)


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


def wrap_like(x, was_torch: bool, dtype: str | None = None):
    """Return ``x`` in the caller's framework: a torch tensor (DLPack, no copy) for torch
    callers, reinterpreted as bfloat16 when ``dtype`` says so; else the CuPy array."""
    if was_torch:
        import torch

        t = torch.from_dlpack(x)
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return x


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tau(d: int) -> float:
    return 1.0 / math.sqrt(d)
