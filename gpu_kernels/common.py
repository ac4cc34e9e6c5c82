"""What every kernel in gpu_kernels shares, whatever its backend (numba or CuPy).

* ``KernelInputError``: the one error a kernel raises for bad input, before any launch
  (a ``flashsim.FlashsimError``, hence a ``ValueError``).
* Input checks: ``describe(x)`` reads shape, dtype and contiguity of a NumPy array, a CuPy
  array, a PyTorch CUDA tensor or any CUDA Array Interface object (a numba device array)
  without touching a GPU; ``check_qkv`` validates Q, K, V of shape (B, H, N, d) or (N, d).
* The tile policy: how each kernel picks B_r (``block_rows``) and B_c (``block_cols``) when
  the caller does not. Four rules, each named by the registry entry that uses it:
  ``sram_rule`` (flashsim's block rule for an SRAM of M bytes), ``fastest_rule``
  (flashsim's ``fastest_blocks`` with the kernel's own efficiency), ``table_rule`` (a
  measured table per head dimension) and ``largest_rule`` (the largest candidate that fits).
* ``Launch``: one configured launch of one kernel: its shape, tiles, threads, shared memory,
  the kernel launches it makes (``launches()``), and flashsim's plan for exactly that
  launch (``plan()``). Each backend subclasses it with ``run``.

Nothing here imports numba or CuPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from flashsim.errors import FlashsimError
from flashsim.hardware.presets import DEFAULT_GPU
from flashsim.units import cdiv

__all__ = ["KernelInputError", "cdiv", "describe", "check_qkv", "Inputs", "dtype_name",
           "flashsim_dtype", "planned", "sram_rule", "fastest_rule", "table_rule",
           "largest_rule", "KernelLaunch", "Launch", "SHARED_DEFAULT", "SHARED_OPTIN",
           "GRID_Y_LIMIT", "Result"]

SHARED_DEFAULT = 48 * 1024     # bytes of shared memory a block gets without the opt-in
SHARED_OPTIN = 227 * 1024      # the most a block may opt in to on sm_90
GRID_Y_LIMIT = 65535           # batch x heads travel in gridDim.y

# flashsim's dtype names and the array libraries' names for them
_ARRAY_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_FLASHSIM_NAMES = {v: k for k, v in _ARRAY_NAMES.items()}


class KernelInputError(FlashsimError):
    """An input that a kernel cannot take; raised before anything is launched."""


def dtype_name(dtype) -> str:
    """The array name ("float32", "float16", "bfloat16") of ``dtype``: a flashsim name
    (fp32, fp16, bf16), an array name, a NumPy dtype or a torch dtype."""
    text = str(dtype).removeprefix("torch.")
    text = _ARRAY_NAMES.get(text, text)
    if text not in _FLASHSIM_NAMES:
        raise KernelInputError(f"dtype {dtype!r} is not one the kernels take: "
                               f"{', '.join(_ARRAY_NAMES)}")
    return text


def flashsim_dtype(dtype) -> str:
    """flashsim's name (fp32, fp16, bf16) of ``dtype``."""
    return _FLASHSIM_NAMES[dtype_name(dtype)]


# --------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class ArrayInfo:
    """What a kernel needs to know of an array before it touches it."""
    kind: str            # "numpy", "cupy", "torch" or "cuda" (another CUDA array)
    shape: tuple
    dtype: str           # "float32", "float16", "bfloat16", or another NumPy name
    contiguous: bool     # C order
    device: int | None   # the GPU it lives on (None: host, or not known)


def describe(x, name: str) -> ArrayInfo:
    """Kind, shape, dtype, C-contiguity and device of ``x``; KernelInputError for anything
    that is not an array a kernel can take (lists, CPU tensors, ...)."""
    module = type(x).__module__
    if module.startswith("numpy") and hasattr(x, "flags"):
        return ArrayInfo("numpy", tuple(x.shape), str(x.dtype), bool(x.flags.c_contiguous), None)
    if module.startswith("cupy"):
        return ArrayInfo("cupy", tuple(x.shape), str(x.dtype), bool(x.flags.c_contiguous),
                         int(x.device.id))
    if module.startswith("torch"):
        if not x.is_cuda:
            raise KernelInputError(f"{name} is a PyTorch tensor on {x.device}; move it to the GPU")
        return ArrayInfo("torch", tuple(x.shape), str(x.dtype).removeprefix("torch."),
                         bool(x.is_contiguous()), int(x.device.index))
    if module.startswith("numba") and hasattr(x, "is_c_contiguous"):   # numba device array
        return ArrayInfo("cuda", tuple(x.shape), str(x.dtype), bool(x.is_c_contiguous()), None)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return ArrayInfo("cuda", tuple(cai["shape"]), _typestr_name(cai["typestr"]),
                         _cai_contiguous(cai), None)
    raise KernelInputError(f"{name} must be a NumPy array, a CuPy array, a PyTorch CUDA tensor "
                           f"or a CUDA device array, got {type(x).__name__}")


def _typestr_name(typestr: str) -> str:
    import numpy

    return str(numpy.dtype(typestr))


def _cai_contiguous(cai: dict) -> bool:
    """C order, from the CUDA Array Interface (strides None means C order)."""
    if cai.get("strides") is None:
        return True
    expect, stride = [], int(cai["typestr"][2:])
    for n in reversed(cai["shape"]):
        expect.append(stride)
        stride *= n
    expect.reverse()
    return all(s == e for s, e, n in zip(cai["strides"], expect, cai["shape"]) if n > 1)


@dataclass(frozen=True)
class Inputs:
    """Validated Q, K, V: the caller's shape read as (B, H, N, d), the dtype, where they live."""
    B: int
    H: int
    N: int
    d: int
    dtype: str           # array name: "float32", "float16" or "bfloat16"
    kind: str            # as ``ArrayInfo.kind``
    shape: tuple         # the caller's shape: (N, d) or (B, H, N, d)

    @property
    def BH(self) -> int:
        return self.B * self.H


def check_qkv(Q, K, V, *, dtypes=("float32", "float16", "bfloat16"), head_dims=None,
              max_head_dim: int | None = None) -> Inputs:
    """Validate Q, K, V and read their shape (B, H, N, d) (an (N, d) input is B = H = 1).

    The same kind of array for all three (all host or all on the GPU), the same shape and
    dtype, a dtype in ``dtypes``, C order, d in ``head_dims`` (or at most ``max_head_dim``),
    B * H within the grid's y limit. Raises KernelInputError, one line, before any work."""
    infos = [describe(x, n) for x, n in ((Q, "Q"), (K, "K"), (V, "V"))]
    if len({i.kind == "numpy" for i in infos}) != 1:
        raise KernelInputError("Q, K, V must all be host (NumPy) arrays or all be GPU arrays, "
                               f"got {', '.join(i.kind for i in infos)}")
    for info, n in zip(infos, "QKV"):
        if len(info.shape) not in (2, 4):
            raise KernelInputError(f"{n} has shape {info.shape}; expected 4 dimensions "
                                   "(B, H, N, d) or 2 (N, d)")
        if 0 in info.shape:
            raise KernelInputError(f"{n} has shape {info.shape}; every dimension must be at least 1")
        if info.dtype not in dtypes:
            raise KernelInputError(f"{n} has dtype {info.dtype}; this kernel takes {', '.join(dtypes)}")
    if len({i.dtype for i in infos}) != 1:
        raise KernelInputError(f"Q, K, V dtypes differ: {', '.join(i.dtype for i in infos)}")
    if len({i.shape for i in infos}) != 1:
        raise KernelInputError(f"Q, K, V shapes differ: {', '.join(str(i.shape) for i in infos)}")
    for info, n in zip(infos, "QKV"):
        if not info.contiguous:
            raise KernelInputError(f"{n} is not C-contiguous; pass a contiguous copy "
                                   "(.contiguous() / ascontiguousarray)")
    if len({i.device for i in infos}) != 1:
        raise KernelInputError(f"Q, K, V are on different GPUs: {[i.device for i in infos]}")
    shape = infos[0].shape
    B, H = (1, 1) if len(shape) == 2 else shape[:2]
    N, d = shape[-2:]
    if head_dims is not None and d not in head_dims:
        raise KernelInputError(f"head dimension d = {d} is not supported; this kernel takes d in "
                               f"{tuple(head_dims)}")
    if max_head_dim is not None and d > max_head_dim:
        raise KernelInputError(f"head dimension d = {d} is not supported; this kernel takes "
                               f"d <= {max_head_dim}")
    if B * H > GRID_Y_LIMIT:
        raise KernelInputError(f"B * H = {B * H} exceeds the grid's y limit of {GRID_Y_LIMIT}")
    return Inputs(int(B), int(H), int(N), int(d), infos[0].dtype, infos[0].kind, shape)


def check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise KernelInputError(f"{name} must be True or False, got {value!r}")
    return value


def check_shape(shape, head_dims=None, max_head_dim: int | None = None):
    """(B, H, N, d) from a shape (N, d) or (B, H, N, d) of positive integers."""
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise KernelInputError(f"shape {shape!r}: expected (N, d) or (B, H, N, d)") from None
    if len(shape) not in (2, 4) or min(shape) < 1:
        raise KernelInputError(f"shape {shape}: expected (N, d) or (B, H, N, d) of positive sizes")
    B, H, N, d = (1, 1) + shape if len(shape) == 2 else shape
    if head_dims is not None and d not in head_dims:
        raise KernelInputError(f"head dimension d = {d} is not supported; this kernel takes d in "
                               f"{tuple(head_dims)}")
    if max_head_dim is not None and not 1 <= d <= max_head_dim:
        raise KernelInputError(f"head dimension d = {d} is not supported; these kernels take "
                               f"1 <= d <= {max_head_dim}")
    if B * H > GRID_Y_LIMIT:
        raise KernelInputError(f"B * H = {B * H} exceeds the grid's y limit of {GRID_Y_LIMIT}")
    return B, H, N, d


# --------------------------------------------------------------------------------------
# The tile policy


def planned(algorithm: str, N: int, d: int, **kw):
    """``flashsim.plan(algorithm, N, d, **kw)``, its errors (tiles that do not fit, ...)
    raised as KernelInputError."""
    import flashsim

    try:
        return flashsim.plan(algorithm, seq_len=N, head_dim=d, **kw)
    except KernelInputError:
        raise
    except FlashsimError as exc:
        raise KernelInputError(str(exc)) from exc


def sram_rule(algorithm: str, N: int, d: int, *, dtype: str = "fp32", sram: int = SHARED_DEFAULT,
              causal: bool = False, block_rows=None, block_cols=None, pass_: str = "fwd"):
    """flashsim's block rule for an SRAM of ``sram`` bytes (given tiles: checked to fit).
    Returns the plan; its ``block_rows``, ``block_cols`` (and ``softmax_rows``) are the tiles."""
    return planned(algorithm, N, d, dtype=dtype, sram=sram, causal=causal,
                   block_rows=block_rows, block_cols=block_cols, pass_=pass_)


def fastest_rule(algorithm: str, N: int, d: int, efficiency, *, causal: bool = False,
                 block_rows=None, block_cols=None) -> tuple[int, int]:
    """flashsim's ``fastest_blocks``: the multiples of 16 with the shortest roofline time,
    each at the fraction of peak ``efficiency(B_r, B_c)`` the kernel expects (0: cannot run)."""
    import flashsim

    try:
        return flashsim.fastest_blocks(algorithm, N, d, efficiency, causal=causal,
                                       block_rows=block_rows, block_cols=block_cols)
    except FlashsimError as exc:
        raise KernelInputError(str(exc)) from exc


def table_rule(table: dict, d: int, block_rows=None, block_cols=None) -> tuple[int, int]:
    """(B_r, B_c) from a measured table ``{d: (B_r, B_c)}``; given tiles override it."""
    if d not in table:
        raise KernelInputError(f"no tiles for d = {d}: the table has d in {tuple(table)}")
    Br, Bc = table[d]
    return (Br if block_rows is None else int(block_rows), Bc if block_cols is None else int(block_cols))


def largest_rule(candidates, fits) -> int:
    """The largest of ``candidates`` for which ``fits(B)`` holds (square tiles B x B)."""
    for B in sorted(candidates, reverse=True):
        if fits(B):
            return B
    raise KernelInputError(f"no tile of {tuple(candidates)} fits")


# --------------------------------------------------------------------------------------
# One configured launch


class Result(NamedTuple):
    """What a forward kernel returns: O (B, H, N, d) and, where the kernel has it, the
    logsumexp L = m + log l of each row of tau Q K^T (B, H, N), float32; else None."""
    O: object
    L: object = None


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch that a ``Launch.run`` makes: the kernel, its grid and block.

    ``step`` is the index of the launch of flashsim's loop nest that this kernel runs with
    the same thread blocks (``flashsim.nest.launches(plan.nest())``); None for a launch the
    nest does not have as such (a fill, one block per row where the nest has R rows): the
    registry entry says why."""
    kernel: str
    grid: tuple
    threads: int
    dynamic_smem: int = 0
    step: str | None = None

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)


@dataclass
class Launch:
    """Everything that fixes one launch of one kernel; ``run`` is the backend's.

    ``grid`` and ``threads`` are those of the main kernel (``MAIN``: kernel 1 of standard
    attention, the step kernel of numba's FlashAttention, ...), ``static_smem`` and
    ``dynamic_smem`` the most any of its kernels takes; ``launches()`` lists every kernel
    launch. ``sram`` is the M of flashsim's plan (None: the GPU preset's). Shapes inside
    ``run``: (B, H, N, d) or (B*H, N, d) device arrays."""
    kernel: str
    algorithm: str
    batch: int
    heads: int
    N: int
    d: int
    dtype: str                   # flashsim's name: fp32, fp16, bf16
    causal: bool
    block_rows: int
    block_cols: int
    threads: int
    static_smem: int
    dynamic_smem: int
    sram: int | None
    pass_: str = "fwd"
    workspace: dict = field(default_factory=dict, repr=False)   # buffers kept between calls

    @property
    def BH(self) -> int:
        return self.batch * self.heads

    @property
    def tau(self) -> float:
        return 1.0 / math.sqrt(self.d)

    @property
    def flops(self) -> int:
        """4 B H N^2 d: both matmuls without a mask (the convention for TFLOP/s)."""
        return 4 * self.BH * self.N * self.N * self.d

    @property
    def grid(self) -> tuple:
        """The main kernel's grid."""
        return self.main_launch().grid

    MAIN = None     # the main kernel's name (None: the only kernel)
    # Warps whose registers the plan may count on (None: the preset's 4). A kernel that
    # keeps S_ij and O_i in registers across more warps sets it (launch -> warps).
    PLAN_WARPS = None
    # flashsim.plan options that pick the algorithm's version this kernel runs (numba's
    # FlashAttention: {"kv_launches": True}, a launch per K/V block)
    PLAN_OPTIONS = {}

    def main_launch(self) -> KernelLaunch:
        """The first launch of the main kernel (``MAIN``)."""
        return next(k for k in self.launches() if self.MAIN in (None, k.kernel))

    def launches(self) -> list[KernelLaunch]:
        raise NotImplementedError

    def logsumexp(self):
        """L of the last ``run`` where the kernel leaves it elsewhere than in its Result
        (FlashAttention's l and m); None where it has none."""
        return None

    def issue_rate(self) -> float | None:
        """The kernel's own estimate of how much of an SM's issue rate its thread layout
        turns into useful FLOPs (relative units), where the layout varies with the tiles;
        None where one rate holds for every launch of the compiled kernel. ``flashsim
        predict`` scales the kernel's stated efficiency by this over its value at the
        efficiency's reference launch."""
        return None

    def plan(self, gpu: str = DEFAULT_GPU):
        """flashsim's plan for exactly this launch: same algorithm (and version:
        ``PLAN_OPTIONS``), pass, N, d, batch, heads, dtype, causal mask (or the launch's
        ``mask``, where it has one) and tiles; M = ``sram`` (the preset's when None); the
        roofline time (``count().predicted_time_s``) on ``gpu``."""
        return planned(self.algorithm, self.N, self.d, batch=self.batch, heads=self.heads,
                       dtype=self.dtype, sram=self.sram, gpu=gpu, causal=self.causal,
                       block_rows=self.block_rows, block_cols=self.block_cols, pass_=self.pass_,
                       **self.PLAN_OPTIONS,
                       **({"warps": self.PLAN_WARPS(self)} if self.PLAN_WARPS else {}),
                       **({"mask": self.mask} if getattr(self, "mask", None) is not None else {}))

    def predicted_traffic(self, gpu: str = DEFAULT_GPU):
        """flashsim's Report for exactly this launch (``plan(gpu).count()``)."""
        return self.plan(gpu).count()

    def plan_record(self) -> dict:
        """The plan's configuration as stored beside measurements (enough to rebuild it)."""
        return dict(algorithm=self.algorithm, dtype=self.dtype, block_rows=self.block_rows,
                    block_cols=self.block_cols, sram=self.sram,
                    gpu=None if self.sram else DEFAULT_GPU, **self.PLAN_OPTIONS)

    def check_shape_of(self, info: ArrayInfo, name: str) -> None:
        """An array given to ``run`` has this launch's shape and dtype."""
        want = {(self.batch, self.heads, self.N, self.d), (self.BH, self.N, self.d)}
        if self.BH == 1:
            want.add((self.N, self.d))
        if info.shape not in want:
            raise KernelInputError(f"{name} has shape {info.shape}; this launch is for "
                                   f"(B, H, N, d) = {(self.batch, self.heads, self.N, self.d)}")
        if info.dtype != dtype_name(self.dtype) and not (
                self.dtype == "bf16" and info.dtype == "int16"):
            raise KernelInputError(f"{name} has dtype {info.dtype}; this launch is for {self.dtype}")
