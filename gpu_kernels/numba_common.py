"""What the numba.cuda kernels share: the numba import, input checks, tiling, traffic.

Every numba import in ``gpu_kernels`` goes through this module, so the NumPy work-around
below is decided once. Importing it touches no GPU: kernels are compiled on first use.

The register-tiled micro-kernel (used by ``numba_standard``, ``numba_flash1`` and
``numba_flash2`` for every tile product). A block of TR x TC threads computes a
B_r x B_c tile of S_ij and a B_r x d tile of O_i. Thread (tr, tc) owns RM rows and CN
columns of S_ij and DN columns of O_i, in chunks of VR (VC, VD) consecutive indices:

    its a-th row is  own(tr*VR, TR*VR, VR, a) = tr*VR + TR*VR*(a // VR) + a % VR

and likewise for columns. The sub-tiles live in ``cuda.local.array``s indexed only by
loop counters over compile-time constants, so they are registers. Operands come from
shared memory: Q_i and P_ij transposed (Q_i^T[k, r], P_ij^T[c, r]) and K_j transposed
(K_j^T[k, c]), V_j as is, so that in the inner loops (``while k < d``: S += Q_i^T[k, rows]
x K_j^T[k, cols]; ``while c < B_c``: O += P_ij^T[c, rows] x V_j[c, cols]) a thread's
chunk is one aligned 16-byte load (LDS.128) and the loop body is loads and FMAs only.
Shared rows are padded to an odd number of chunks so the rows a warp touches together
start in different banks.

Three details make the compiler produce that loop (checked with ``compile_ptx`` and the
SASS): the per-thread bases are ``uint32`` (numba emits negative-index wraparound code for
signed indices it cannot prove non-negative, which also blocks load vectorisation), the
arrays are declared 16-byte aligned, and the tile is padded to B_r' = TR RM, B_c' = TC CN,
d' = TC DN so no index is clamped (padded Q, K, V entries are zero; padded columns of
S_ij are masked; padded rows and O columns are never stored).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy

# numba-cuda 0.30.4 refers to numpy.row_stack, which NumPy 2.5 removed (it was an alias of
# vstack), so with NumPy >= 2.5 the first kernel compile fails with AttributeError
# (NVIDIA/numba-cuda#907; the package is in maintenance mode and will not fix it). Restore
# the alias before numba is imported. This is the only NumPy work-around in the project.
ROW_STACK_RESTORED = not hasattr(numpy, "row_stack")     # recorded in benchmark provenance
if ROW_STACK_RESTORED:
    numpy.row_stack = numpy.vstack

import numba  # noqa: E402  (must follow the work-around)
from numba import cuda, float32, int32, uint32  # noqa: E402

__all__ = ["cuda", "float32", "int32", "uint32", "SHARED_LIMIT", "NEG_INF", "ALIGN", "cdiv", "own",
           "Tiling", "choose_tiling", "check_tiling", "Launch", "check_inputs",
           "to_device_3d", "plan_blocks", "run_api", "shape4", "fill"]

SHARED_LIMIT = 48 * 1024     # bytes of static shared memory a numba kernel may use per block
MAX_HEAD_DIM = 128
WORD = 4                     # bytes per fp32 element
NEG_INF = numpy.float32(-numpy.inf)    # a float32 constant inside kernels
# Shared tiles are declared 16-byte aligned so that chunk loads vectorise. The CUDA
# simulator refuses any alignment argument (and alignment means nothing there): None.
ALIGN = None if numba.config.ENABLE_CUDASIM else 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@cuda.jit(device=True, inline="always")
def own(first, group, vec, a):
    """The a-th index a thread owns: chunks of ``vec`` consecutive indices, the first at
    ``first``, chunks ``group`` apart."""
    return first + group * (a // vec) + a % vec


# --------------------------------------------------------------------------------------
# Inputs


def _is_device(x) -> bool:
    return cuda.devicearray.is_cuda_ndarray(x) or hasattr(x, "__cuda_array_interface__")


def _shape_of(x, name: str) -> tuple:
    if isinstance(x, numpy.ndarray) or _is_device(x):
        return tuple(x.shape)
    raise TypeError(f"{name} must be a numpy array or a CUDA device array, "
                    f"got {type(x).__name__}")


def check_inputs(Q, K, V) -> tuple[int, int, int, int]:
    """Validate Q, K, V and return (batch, heads, N, d).

    Q, K, V: float32, C-contiguous, all on the host (numpy) or all on the device, shape
    (N, d) or (B, H, N, d), the same shape, 1 <= d <= 128.
    """
    shapes = [_shape_of(x, name) for name, x in (("Q", Q), ("K", K), ("V", V))]
    if len({_is_device(x) for x in (Q, K, V)}) != 1:
        raise TypeError("Q, K, V must all be numpy arrays or all be device arrays")
    for name, x, shape in zip("QKV", (Q, K, V), shapes):
        if numpy.dtype(x.dtype) != numpy.float32:
            raise TypeError(f"{name} has dtype {numpy.dtype(x.dtype)}; these kernels take "
                            "float32")
        if len(shape) not in (2, 4):
            raise ValueError(f"{name} has shape {shape}; expected (N, d) or (B, H, N, d)")
        if 0 in shape:
            raise ValueError(f"{name} has shape {shape}; every dimension must be at least 1")
        if not _is_c_contiguous(x):
            raise ValueError(f"{name} is not C-contiguous; pass a contiguous copy")
    if not shapes[0] == shapes[1] == shapes[2]:
        raise ValueError(f"Q, K, V shapes differ: {shapes[0]}, {shapes[1]}, {shapes[2]}")
    shape = shapes[0]
    B, H = (1, 1) if len(shape) == 2 else shape[:2]
    N, d = shape[-2:]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head dimension d = {d} is not supported; these kernels take "
                         f"d <= {MAX_HEAD_DIM}")
    if B * H > 65535:
        raise ValueError(f"batch x heads = {B * H} exceeds the grid's y limit of 65535")
    return B, H, N, d


def _is_c_contiguous(x) -> bool:
    if isinstance(x, numpy.ndarray):
        return x.flags.c_contiguous
    if cuda.devicearray.is_cuda_ndarray(x):
        return x.is_c_contiguous()
    cai = x.__cuda_array_interface__
    if cai.get("strides") is None:
        return True
    expect, stride = [], numpy.dtype(cai["typestr"]).itemsize
    for n in reversed(cai["shape"]):
        expect.append(stride)
        stride *= n
    expect.reverse()
    return all(s == e for s, e, n in zip(cai["strides"], expect, cai["shape"]) if n > 1)


def to_device_3d(x, heads: int, N: int, d: int):
    """``x`` as a device array of shape (batch*heads, N, d): copied if on the host, a view
    otherwise."""
    if isinstance(x, numpy.ndarray):
        return cuda.to_device(x.reshape(heads, N, d))
    if not cuda.devicearray.is_cuda_ndarray(x):
        x = cuda.as_cuda_array(x)
    return x.reshape(heads, N, d)


def shape4(shape) -> tuple[int, int, int, int]:
    """(B, H, N, d) from (N, d) or (B, H, N, d)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 2:
        return (1, 1) + shape
    if len(shape) == 4:
        return shape
    raise ValueError(f"shape {shape}: expected (N, d) or (B, H, N, d)")


# --------------------------------------------------------------------------------------
# Tiles and threads


def plan_blocks(algorithm: str, N: int, d: int, *, causal: bool = False, batch: int = 1,
                heads: int = 1, block_rows=None, block_cols=None, gpu: str = "h200",
                arrays=None):
    """flashsim's plan for this launch, fp32.

    The flash kernels keep S_ij and O_i in registers and pad their shared-memory rows, so
    flashsim's rule for an SRAM of M bytes (which holds every buffer there) is not what
    these kernels can hold; and they are bound by arithmetic, so the tiles with the fewest
    bytes are not the fastest. Blocks left as None are flashsim's ``fastest_blocks``: the
    multiples of 16 with the shortest roofline time, each tile's compute rate scaled by
    ``_score`` of the best thread layout that fits 48 KiB and the registers. The plan is
    then made with the SRAM the model needs for those tiles (the counted traffic of flash1
    and flash2 does not depend on M once the tiles are fixed); the kernel's own
    shared-memory check (``check_shared``) is the one that binds. Standard attention's
    kernels hold what flashsim's model holds: its rule at 48 KiB."""
    import flashsim
    from flashsim.algorithms import ALGORITHMS

    def plan(sram, Br, Bc):
        return flashsim.plan(algorithm, seq_len=N, head_dim=d, dtype="fp32", sram=sram,
                             gpu=gpu, batch=batch, heads=heads, causal=causal,
                             block_rows=Br, block_cols=Bc)
    if algorithm == "standard":
        return plan(SHARED_LIMIT, block_rows, block_cols)
    if block_rows is None or block_cols is None:
        block_rows, block_cols = default_blocks(algorithm, N, d, causal, block_rows,
                                                block_cols, tuple(arrays or ()))
    need = ALGORITHMS[algorithm].working_set_bytes(block_rows, block_cols, d, WORD)
    return plan(max(SHARED_LIMIT, need), block_rows, block_cols)


@functools.lru_cache(maxsize=256)
def default_blocks(algorithm: str, N: int, d: int, causal: bool, block_rows, block_cols,
                   arrays: tuple) -> tuple[int, int]:
    """(B_r, B_c): flashsim's fastest tiles for a kernel with shared ``arrays`` whose
    compute rate is ``_score`` of its best thread layout (see ``plan_blocks``)."""
    import flashsim

    def efficiency(Br, Bc):
        # the unpadded arrays are a lower bound on shared memory: a quick no first
        words = {"Q": Br * d, "K": Bc * d, "V": Bc * d, "P": Bc * Br, "rows": Br}
        if WORD * sum(words[a] for a in arrays) > SHARED_LIMIT:
            return 0.0
        tl = choose_tiling(Br, Bc, d, arrays)
        return 0.0 if tl is None else _score(tl, arrays)

    return flashsim.fastest_blocks(algorithm, N, d, efficiency, causal=causal,
                                   block_rows=block_rows, block_cols=block_cols)


def _vec(n: int) -> int:
    """Chunk width for n owned indices: 4 (one 16-byte shared load), 2, or 1."""
    return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1


def odd_stride(n: int, vec: int) -> int:
    """Row stride in words for a row of n words read in chunks of ``vec``: a multiple of
    ``vec`` (chunks stay aligned) with an odd number of chunks (rows that a warp touches
    together start in different banks)."""
    s = cdiv(n, vec) * vec
    return s if (s // vec) % 2 else s + vec


@dataclass(frozen=True)
class Tiling:
    """How TR x TC threads cover a B_r x B_c tile of S_ij and the B_r x d tile of O_i:
    thread (tr, tc) owns RM rows, CN columns of S_ij and DN columns of O_i."""
    B_r: int
    B_c: int
    d: int
    TR: int
    TC: int
    RM: int
    CN: int
    DN: int

    @property
    def threads(self) -> int:
        return self.TR * self.TC

    @property
    def padded(self) -> tuple[int, int, int]:
        """(B_r', B_c', d'): the tile as the threads cover it."""
        return self.TR * self.RM, self.TC * self.CN, self.TC * self.DN

    def constants(self) -> dict:
        """The compile-time constants a kernel reads."""
        Br_p, Bc_p, d_p = self.padded
        VR, VC, VD = _vec(self.RM), _vec(self.CN), _vec(self.DN)
        return dict(
            B_r=self.B_r, B_c=self.B_c, d=self.d, TR=self.TR, TC=self.TC, NT=self.threads,
            RM=self.RM, CN=self.CN, DN=self.DN, VR=VR, VC=VC, VD=VD,
            Br_p=Br_p, Bc_p=Bc_p, d_p=d_p,
            RG=self.TR * VR, CG=self.TC * VC, KG=self.TC * VD,     # chunk-to-chunk steps
            QS=odd_stride(Br_p, VR),        # row stride of Q_i^T and P_ij^T (B_r' words)
            KS=odd_stride(Bc_p, VC),        # row stride of K_j^T (B_c' words)
        )

    def shared_words(self, arrays) -> int:
        """Words of shared memory for the named arrays: ``Q`` (Q_i^T), ``K`` (K_j^T),
        ``V`` (V_j), ``P`` (P_ij^T), ``rows`` (one row statistic per thread column)."""
        c = self.constants()
        Br_p, Bc_p, d_p = self.padded
        size = {"Q": d_p * c["QS"], "K": d_p * c["KS"], "V": Bc_p * d_p,
                "P": Bc_p * c["QS"], "rows": Br_p * self.TC}
        return sum(size[a] for a in arrays)


def _score(tl: Tiling, arrays) -> float:
    """Estimated fraction of an SM's fp32 FMA rate doing useful work with this tiling.

    Per K/V block a thread issues d' (RM/VR + CN/VC) shared loads for d' RM CN FMAs in
    S_ij = Q_i K_j^T (when K is among ``arrays``) and B_c' (RM/VR + DN/VD) loads for
    B_c' RM DN FMAs in P_ij V_j (when V is); an SM issues four warp-wide FMAs, or one
    shared load, per cycle. Padding is waste; too few resident warps (shared memory and a
    rough register count bound the blocks per SM) leave latency unhidden."""
    c = tl.constants()
    Br_p, Bc_p, d_p = tl.padded
    rows = tl.RM // c["VR"]
    loads = fmas = useful = 0
    regs = 40 + tl.RM
    if "K" in arrays:
        loads += d_p * (rows + tl.CN // c["VC"])
        fmas += d_p * tl.RM * tl.CN
        useful += tl.B_r * tl.B_c * tl.d
        regs += tl.RM * tl.CN + tl.CN
    if "V" in arrays:
        loads += Bc_p * (rows + tl.DN // c["VD"])
        fmas += Bc_p * tl.RM * tl.DN
        useful += tl.B_r * tl.B_c * tl.d
        regs += tl.RM * tl.DN + tl.DN
    smem = WORD * tl.shared_words(arrays)
    if regs > 240 or smem > SHARED_LIMIT:
        return -1.0
    warps = cdiv(tl.threads, 32)
    cycles = warps * max(fmas / 4, loads, (fmas + loads) / 4)
    blocks = min(32, (228 * 1024) // (smem + 1024),
                 65536 // (cdiv(regs, 8) * 8 * warps * 32))
    return useful / 128 / cycles * min(1.0, blocks * warps / 16)


def choose_tiling(B_r: int, B_c: int, d: int, arrays=("Q", "K", "V", "P", "rows")):
    """The tiling with the best ``_score`` (None if nothing fits in 48 KiB)."""
    best, best_score = None, 0.0
    for TR in range(1, min(B_r, 32) + 1):
        for TC in range(1, min(max(B_c, d), 32) + 1):
            NT = TR * TC
            if NT > 256 or (NT < 32 and NT < B_r * B_c // 16):
                continue
            for RM in {cdiv(B_r, TR), cdiv(B_r, 4 * TR) * 4}:
                for CN in {cdiv(B_c, TC), cdiv(B_c, 4 * TC) * 4}:
                    for DN in {cdiv(d, TC), cdiv(d, 4 * TC) * 4}:
                        tl = Tiling(B_r, B_c, d, TR, TC, RM, CN, DN)
                        score = _score(tl, arrays)
                        if score > best_score:
                            best, best_score = tl, score
    return best


def check_tiling(threads, B_r: int, B_c: int, d: int, arrays) -> Tiling:
    """``choose_tiling``'s choice for None; else (TR, TC) or a Tiling, validated."""
    if threads is None:
        tl = choose_tiling(B_r, B_c, d, arrays)
        if tl is None:
            raise ValueError(f"no thread layout fits B_r={B_r}, B_c={B_c}, d={d} in "
                             f"{SHARED_LIMIT} B of shared memory")
        return tl
    if isinstance(threads, Tiling):
        tl = threads
        if (tl.B_r, tl.B_c, tl.d) != (B_r, B_c, d):
            raise ValueError(f"tiling is for (B_r={tl.B_r}, B_c={tl.B_c}, d={tl.d}), the "
                             f"launch for (B_r={B_r}, B_c={B_c}, d={d})")
    elif (isinstance(threads, tuple) and len(threads) == 2
          and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in threads)):
        TR, TC = threads
        tl = Tiling(B_r, B_c, d, TR, TC, cdiv(B_r, TR), cdiv(B_c, TC), cdiv(d, TC))
    else:
        raise TypeError(f"threads must be (TR, TC) or a Tiling, got {threads!r}")
    Br_p, Bc_p, d_p = tl.padded
    if min(tl.TR, tl.TC, tl.RM, tl.CN, tl.DN) < 1:
        raise ValueError(f"tiling {tl} has a zero or negative count")
    if tl.threads > 1024:
        raise ValueError(f"{tl.TR} x {tl.TC} = {tl.threads} threads exceed 1024 per block")
    if Br_p < B_r or Bc_p < B_c or d_p < d:
        raise ValueError(f"tiling {tl} does not cover the tile")
    return tl


def check_shared(algorithm: str, tl: Tiling, arrays) -> int:
    need = WORD * tl.shared_words(arrays)
    if need > SHARED_LIMIT:
        raise ValueError(f"{algorithm}: B_r={tl.B_r}, B_c={tl.B_c}, d={tl.d} with threads "
                         f"({tl.TR}, {tl.TC}) need {need} B of shared memory per block; numba "
                         f"kernels get {SHARED_LIMIT} B (use smaller block_rows/block_cols)")
    return need


# --------------------------------------------------------------------------------------
# One launch: its shape, tiles and threads, and what flashsim predicts for it


@dataclass
class Launch:
    """Everything that fixes one launch of one algorithm; ``run`` is each module's.

    Inside ``run`` Q, K, V are device arrays of shape (batch*heads, N, d)."""
    algorithm: str
    batch: int
    heads: int
    N: int
    d: int
    block_rows: int
    block_cols: int
    tiling: Tiling
    causal: bool
    shared_bytes: int

    def __post_init__(self):
        self.workspace = {}   # device buffers kept between calls (S, P; l, m; L)

    @property
    def tau(self) -> float:
        return 1.0 / math.sqrt(self.d)

    @property
    def flops(self) -> int:
        """4 B H N^2 d: both matmuls without a mask (the convention for TFLOP/s)."""
        return 4 * self.batch * self.heads * self.N * self.N * self.d

    def plan(self, gpu: str = "h200"):
        """flashsim's plan for exactly this launch."""
        return plan_blocks(self.algorithm, self.N, self.d, causal=self.causal,
                           batch=self.batch, heads=self.heads, block_rows=self.block_rows,
                           block_cols=self.block_cols, gpu=gpu)

    def predicted_traffic(self, gpu: str = "h200"):
        """flashsim's Report for exactly this launch (same B_r, B_c, N, d, batch, heads,
        causal; fp32; the SRAM those tiles need); its ``predicted_time_s`` is the roofline on
        ``gpu``."""
        return self.plan(gpu).count()

    def buffer(self, name: str, shape: tuple):
        """A float32 device buffer kept for the next call of this launch."""
        buf = self.workspace.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape):
            buf = cuda.device_array(shape, dtype=numpy.float32)
            self.workspace[name] = buf
        return buf

    def grid(self) -> tuple[int, int]:
        """(Q blocks, batch*heads): one thread block per Q block and head."""
        return cdiv(self.N, self.block_rows), self.batch * self.heads


def configure_launch(cls, algorithm: str, shape, arrays, *, causal=False, block_rows=None,
                     block_cols=None, threads=None):
    """A validated launch: tiles from flashsim unless given (``plan_blocks``), threads from
    ``choose_tiling`` unless given, shared memory checked against 48 KiB."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    B, H, N, d = shape4(shape)
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dimension d = {d} is not supported; these kernels take "
                         f"1 <= d <= {MAX_HEAD_DIM}")
    p = plan_blocks(algorithm, N, d, causal=causal, batch=B, heads=H,
                    block_rows=block_rows, block_cols=block_cols, arrays=arrays)
    tl = check_tiling(threads, p.block_rows, p.block_cols, d, arrays)
    need = check_shared(algorithm, tl, arrays)
    return cls(algorithm, B, H, N, d, p.block_rows, p.block_cols, tl, causal, need)


def run_api(module, Q, K, V, *, causal=False, block_rows=None, block_cols=None, threads=None):
    """The body of each module's ``attention``: check, configure, move, run, return O in
    the caller's shape, on the caller's side (numpy in, numpy out)."""
    B, H, N, d = check_inputs(Q, K, V)
    launch = module.configure((B, H, N, d), causal=causal, block_rows=block_rows,
                              block_cols=block_cols, threads=threads)
    Q3, K3, V3 = (to_device_3d(x, B * H, N, d) for x in (Q, K, V))
    O3 = launch.run(Q3, K3, V3)
    if isinstance(Q, numpy.ndarray):
        return O3.copy_to_host().reshape(Q.shape)
    return O3.reshape(tuple(Q.shape))


@functools.lru_cache(maxsize=None)
def _fill_kernel():
    def fill_flat(x, value):
        """x[:] = value for a flat array."""
        e = cuda.grid(1)
        stride = cuda.gridsize(1)
        while e < x.shape[0]:
            x[e] = value
            e += stride
    return cuda.jit(fill_flat)


def fill(x, value: float) -> None:
    """Set every element of the contiguous device array ``x`` to ``value`` (FA1's
    initialisation of O, l, m; the L2 flush between timed repeats)."""
    flat = x.reshape(x.size)
    _fill_kernel()[min(cdiv(x.size, 256), 4096), 256](flat, numpy.float32(value))
