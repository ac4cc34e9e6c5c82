"""What the numba.cuda kernels share: the numba import, the thread layout (``Tiling``), the
register-tiled device functions every kernel calls (``tile_ops``), and ``NumbaLaunch``.

Every numba import in ``gpu_kernels`` goes through this module, so the NumPy work-around
below is decided once. Importing it touches no GPU: kernels are compiled on first use.

The register-tiled micro-kernel (``tile_ops``: used by ``standard``, ``flash1`` and ``flash2``
for every tile load and tile product). A block of TR x TC threads computes a
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
import sys
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

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
from ..common import (SHARED_DEFAULT, KernelInputError, KernelLaunch, Launch, cdiv,  # noqa: E402
                      check_flag, check_shape, describe, fastest_rule, sram_rule)

__all__ = ["cuda", "float32", "int32", "uint32", "SHARED_LIMIT", "NEG_INF", "ALIGN", "cdiv", "own",
           "split", "tree",
           "Tiling", "choose_tiling", "check_tiling", "issue_rate", "tile_ops", "NumbaLaunch",
           "configure_launch", "plan_blocks", "fill"]

SHARED_LIMIT = SHARED_DEFAULT  # bytes of static shared memory a numba kernel may use per block
MAX_HEAD_DIM = 128
WORD = 4                     # bytes per fp32 element
NEG_INF = numpy.float32(-numpy.inf)    # a float32 constant inside kernels
# Shared tiles are declared 16-byte aligned so that chunk loads vectorise. The CUDA
# simulator refuses any alignment argument (and alignment means nothing there): None.
ALIGN = None if numba.config.ENABLE_CUDASIM else 16


def _simulator_shared_array(self, shape, dtype, alignment=None):
    """numba-cuda's simulated ``cuda.shared.array``, its one allocation per (file, line) and
    block made under a lock. The simulator runs a block's threads as Python threads, and its
    own method looks the allocation up and stores a new one in two steps: two threads that
    both miss get two arrays, and a block's shared tile silently splits in two (a rare wrong
    answer in the simulated kernel tests; ``tests/test_numba_kernels.py`` forces the race)."""
    from numba.cuda.simulator.kernelapi import numpy_support, types

    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:                 # dynamic shared memory: one buffer, as numba-cuda has it
        return numpy.frombuffer(self._dynshared.data, dtype=dtype,
                                count=self._dynshared_size // dtype.itemsize)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _SHARED_LOCK:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = numpy.empty(shape, dtype)
    return res


if numba.config.ENABLE_CUDASIM:    # the simulator only: compiled kernels never run this
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    _SHARED_LOCK = threading.Lock()
    FakeCUDAShared.array = _simulator_shared_array


@cuda.jit(device=True, inline="always")
def own(first, group, vec, a):
    """The a-th index a thread owns: chunks of ``vec`` consecutive indices, the first at
    ``first``, chunks ``group`` apart."""
    return first + group * (a // vec) + a % vec


@cuda.jit(device=True, inline="always")
def split(e, w):
    """(row, column) of element e of a row-major tile of width w: (e // w, e - (e // w) w)."""
    r = e // w
    return r, e - r * w


@functools.lru_cache(maxsize=None)
def tree(NT: int, op: str):
    """``reduce(red, t)``: red[0] = max (``op="max"``) or sum (``"sum"``) of red[0 .. NT),
    a reduction tree over the NT threads of a block (NT a power of two); every thread calls
    it, and it ends with the block synchronised."""
    is_max = op == "max"

    @cuda.jit(device=True, inline="always")
    def reduce(red, t):
        h = NT // 2
        while h > 0:
            if t < h:
                if is_max:
                    red[t] = max(red[t], red[t + h])
                else:
                    red[t] += red[t + h]
            cuda.syncthreads()
            h //= 2
    return reduce


# --------------------------------------------------------------------------------------
# Tiles (the tile policy's rules, with this backend's numbers) and threads


def plan_blocks(algorithm: str, N: int, d: int, *, causal: bool = False, block_rows=None,
                block_cols=None, arrays=None):
    """(B_r, B_c, M): the tiles of this launch and the SRAM M of flashsim's plan for it, fp32.

    The flash kernels keep S_ij and O_i in registers and pad their shared-memory rows, so
    flashsim's rule for an SRAM of M bytes (which holds every buffer there) is not what
    these kernels can hold; and they are bound by arithmetic, so the tiles with the fewest
    bytes are not the fastest. Blocks left as None follow the tile policy's ``fastest_rule``
    (flashsim's ``fastest_blocks``): the multiples of 16 with the shortest roofline time,
    each tile's compute rate scaled by ``_score`` of the best thread layout that fits 48 KiB
    and the registers. The plan is then made with the SRAM the model needs for those tiles
    (the counted traffic of flash1 and flash2 does not depend on M once the tiles are
    fixed); the kernel's own shared-memory check (``check_shared``) is the one that binds.
    Standard attention's kernels hold what flashsim's model holds: the ``sram_rule`` at 48
    KiB."""
    from flashsim.algorithms import ALGORITHMS

    if algorithm == "standard":
        p = sram_rule(algorithm, N, d, sram=SHARED_LIMIT, causal=causal, block_rows=block_rows,
                      block_cols=block_cols)
        return p.block_rows, p.block_cols, SHARED_LIMIT
    if block_rows is None or block_cols is None:
        block_rows, block_cols = default_blocks(algorithm, N, d, causal, block_rows,
                                                block_cols, tuple(arrays or ()))
    need = ALGORITHMS[algorithm].working_set_bytes(int(block_rows), int(block_cols), d, WORD)
    sram = max(SHARED_LIMIT, need)
    p = sram_rule(algorithm, N, d, sram=sram, causal=causal, block_rows=block_rows,
                  block_cols=block_cols)
    return p.block_rows, p.block_cols, sram


@functools.lru_cache(maxsize=256)
def default_blocks(algorithm: str, N: int, d: int, causal: bool, block_rows, block_cols,
                   arrays: tuple) -> tuple[int, int]:
    """(B_r, B_c): flashsim's fastest tiles for a kernel with shared ``arrays`` whose
    compute rate is ``_score`` of its best thread layout (see ``plan_blocks``)."""

    def efficiency(Br, Bc):
        # the unpadded arrays are a lower bound on shared memory: a quick no first
        words = {"Q": Br * d, "K": Bc * d, "V": Bc * d, "P": Bc * Br, "rows": Br}
        if WORD * sum(words[a] for a in arrays) > SHARED_LIMIT:
            return 0.0
        tl = choose_tiling(Br, Bc, d, arrays)
        return 0.0 if tl is None else _score(tl, arrays)

    return fastest_rule(algorithm, N, d, efficiency, causal=causal, block_rows=block_rows,
                        block_cols=block_cols)


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

    def values(self, names: str) -> tuple:
        """The constants named in ``names`` (space-separated), in that order."""
        c = self.constants()
        return tuple(c[n] for n in names.split())

    def shared_words(self, arrays) -> int:
        """Words of shared memory for the named arrays: ``Q`` (Q_i^T), ``K`` (K_j^T),
        ``V`` (V_j), ``P`` (P_ij^T), ``rows`` (one row statistic per thread column)."""
        c = self.constants()
        Br_p, Bc_p, d_p = self.padded
        size = {"Q": d_p * c["QS"], "K": d_p * c["KS"], "V": Bc_p * d_p,
                "P": Bc_p * c["QS"], "rows": Br_p * self.TC}
        return sum(size[a] for a in arrays)


def issue_rate(tl: Tiling, arrays=("K", "V")) -> float:
    """Estimated fraction of an SM's fp32 FMA rate doing useful work with this tiling, its
    warps' latency hidden (``_score`` without its occupancy factor).

    Per K/V block a thread issues d' (RM/VR + CN/VC) shared loads for d' RM CN FMAs in
    S_ij = Q_i K_j^T (when K is among ``arrays``) and B_c' (RM/VR + DN/VD) loads for
    B_c' RM DN FMAs in P_ij V_j (when V is); an SM issues four warp-wide FMAs, or one
    shared load, per cycle. Padding is waste."""
    return _issue(tl, arrays)[0]


def _issue(tl: Tiling, arrays) -> tuple[float, int]:
    """(``issue_rate``, a rough count of the registers a thread holds)."""
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
    warps = cdiv(tl.threads, 32)
    cycles = warps * max(fmas / 4, loads, (fmas + loads) / 4)
    return useful / 128 / cycles, regs


def _score(tl: Tiling, arrays) -> float:
    """``issue_rate`` times the share of it the resident warps reach: too few of them
    (shared memory and a rough register count bound the blocks per SM) leave latency
    unhidden; -1 for a tiling that does not fit."""
    rate, regs = _issue(tl, arrays)
    smem = WORD * tl.shared_words(arrays)
    if regs > 240 or smem > SHARED_LIMIT:
        return -1.0
    warps = cdiv(tl.threads, 32)
    blocks = min(32, (228 * 1024) // (smem + 1024),
                 65536 // (cdiv(regs, 8) * 8 * warps * 32))
    return rate * min(1.0, blocks * warps / 16)


@functools.lru_cache(maxsize=None)      # a pure function of its arguments, asked again and again
def choose_tiling(B_r: int, B_c: int, d: int, arrays=("Q", "K", "V", "P", "rows")):
    """The tiling with the best ``_score`` (None if nothing fits in 48 KiB); ``arrays`` a
    tuple (the cache's key). Tiling is frozen, so callers share the cached one safely."""
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
            raise KernelInputError(f"no thread layout fits B_r={B_r}, B_c={B_c}, d={d} in "
                             f"{SHARED_LIMIT} B of shared memory")
        return tl
    if isinstance(threads, Tiling):
        tl = threads
        if (tl.B_r, tl.B_c, tl.d) != (B_r, B_c, d):
            raise KernelInputError(f"tiling is for (B_r={tl.B_r}, B_c={tl.B_c}, d={tl.d}), the "
                             f"launch for (B_r={B_r}, B_c={B_c}, d={d})")
    elif (isinstance(threads, tuple) and len(threads) == 2
          and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in threads)):
        TR, TC = threads
        tl = Tiling(B_r, B_c, d, TR, TC, cdiv(B_r, TR), cdiv(B_c, TC), cdiv(d, TC))
    else:
        raise KernelInputError(f"threads must be (TR, TC) or a Tiling, got {threads!r}")
    Br_p, Bc_p, d_p = tl.padded
    if min(tl.TR, tl.TC, tl.RM, tl.CN, tl.DN) < 1:
        raise KernelInputError(f"tiling {tl} has a zero or negative count")
    if tl.threads > 1024:
        raise KernelInputError(f"{tl.TR} x {tl.TC} = {tl.threads} threads exceed 1024 per block")
    if Br_p < B_r or Bc_p < B_c or d_p < d:
        raise KernelInputError(f"tiling {tl} does not cover the tile")
    return tl


def check_shared(algorithm: str, tl: Tiling, arrays) -> int:
    need = WORD * tl.shared_words(arrays)
    if need > SHARED_LIMIT:
        raise KernelInputError(f"{algorithm}: B_r={tl.B_r}, B_c={tl.B_c}, d={tl.d} with threads "
                         f"({tl.TR}, {tl.TC}) need {need} B of shared memory per block; numba "
                         f"kernels get {SHARED_LIMIT} B (use smaller block_rows/block_cols)")
    return need


# --------------------------------------------------------------------------------------
# The device functions every numba kernel is written with


@functools.lru_cache(maxsize=None)
def tile_ops(tiling: Tiling, causal: bool = False):
    """The register-tiled device functions for one thread layout (compile-time constants
    from ``tiling.constants()``), all ``inline="always"``:

    ``load_Q(Q_iT, Q, t, bh, row0, N)``            Q_i^T <- rows row0.. of Q: read B_r d
    ``load_KV(K_jT, V_j, K, V, t, bh, col0, N)``   K_j^T, V_j <- rows col0..: read 2 B_c d
    ``load_K(K_jT, K, t, bh, col0, N)``            K_j^T alone: read B_c d
    ``load_V(V_j, V, t, bh, col0, N)``             V_j alone: read B_c d
    ``load_P(P_ijT, P, t, bh, row0, col0, N)``     P_ij^T <- the (i, j) tile of P: read B_r B_c
    ``qk(S_ij, Q_iT, K_jT, r0, c0, x, y)``         S_ij = Q_i K_j^T on this thread's RM x CN
    ``pv(PV, P_ijT, V_j, r0, k0, x, z)``           PV = P_ij V_j on this thread's RM x DN
    ``scale_mask_rowmax(S_ij, part, t, r0, c0, row0, col0, N, tau)``
        S_ij *= tau, masked entries (past N, past B_c, and above the diagonal when
        ``causal``) -inf; this thread's part of rowmax S_ij into ``part[r, t % TC]``.
    ``origin(t)``                                   (r0, c0, k0): thread t's first row of
        S_ij and O_i, first column of S_ij, first column of O_i (uint32, see above)
    ``flash_tiles()``                               (Q_i^T, K_j^T, V_j, P_ij^T): the shared
        tiles of the flash kernels, 16-byte aligned, padded strides
    ``block_start()``                               (blockIdx.x, blockIdx.y, t, r0, c0, k0)
    ``s_tile(S_ij, part, Q_iT, K_jT, x, y, t, r0, c0, row0, col0, N, tau)``
        ``qk`` then ``scale_mask_rowmax``: S_ij = tau Q_i K_j^T, masked, and this thread's
        part of rowmax S_ij
    ``row_total(part, r, start, is_max)``           a row's statistic from the TC threads'
        parts (``part[r, u]``, one per thread column): max or sum, starting from ``start``

    Loads: thread t copies elements t, t + NT, ... (consecutive threads, consecutive
    addresses), a fixed count per thread from always-valid (clamped) addresses, so the
    compiler issues several global loads before the first store; zeros past N and in the
    padding. Products: n rank-1 updates of the thread's sub-tile from one chunk of each
    operand per step (the loop the module docstring describes)."""
    B_r, B_c, d, TC, NT, RM, CN, DN, VR, VC, VD, Br_p, Bc_p, d_p, RG, CG, KG, QS, KS = \
        tiling.values("B_r B_c d TC NT RM CN DN VR VC VD Br_p Bc_p d_p RG CG KG QS KS")

    load_Q = _loader(B_r, Br_p, d, d_p, NT, transposed=True, straight=False)
    load_kv = _loader(B_c, Bc_p, d, d_p, NT, transposed=True, straight=True)
    load_k = _loader(B_c, Bc_p, d, d_p, NT, transposed=True, straight=False)
    load_v = _loader(B_c, Bc_p, d, d_p, NT, transposed=False, straight=True)
    load_p = _loader(B_r, Br_p, B_c, Bc_p, NT, transposed=True, straight=False)

    @cuda.jit(device=True, inline="always")
    def load_Qi(Q_iT, Q, t, bh, row0, N):
        load_Q(Q_iT, Q_iT, Q, Q, t, bh, row0, 0, N, d)

    @cuda.jit(device=True, inline="always")
    def load_KV(K_jT, V_j, K, V, t, bh, col0, N):
        load_kv(K_jT, V_j, K, V, t, bh, col0, 0, N, d)

    @cuda.jit(device=True, inline="always")
    def load_K(K_jT, K, t, bh, col0, N):
        load_k(K_jT, K_jT, K, K, t, bh, col0, 0, N, d)

    @cuda.jit(device=True, inline="always")
    def load_V(V_j, V, t, bh, col0, N):
        load_v(V_j, V_j, V, V, t, bh, col0, 0, N, d)

    @cuda.jit(device=True, inline="always")
    def load_P(P_ijT, P, t, bh, row0, col0, N):
        load_p(P_ijT, P_ijT, P, P, t, bh, row0, col0, N, N)

    @cuda.jit(device=True, inline="always")
    def scale_mask_rowmax(S_ij, part, t, r0, c0, row0, col0, N, tau):
        for a in range(RM):
            r = own(r0, RG, VR, a)
            row_max = NEG_INF
            for b in range(CN):
                cc = own(c0, CG, VC, b)
                if cc >= B_c or col0 + cc >= N or (causal and col0 + cc > row0 + r):
                    S_ij[a, b] = NEG_INF
                else:
                    S_ij[a, b] *= tau
                row_max = max(row_max, S_ij[a, b])
            part[r, t % TC] = row_max

    @cuda.jit(device=True, inline="always")
    def origin(t):
        return uint32((t // TC) * VR), uint32((t % TC) * VC), uint32((t % TC) * VD)

    @cuda.jit(device=True, inline="always")
    def flash_tiles():
        Q_iT = cuda.shared.array((d_p, QS), float32, alignment=ALIGN)     # Q_i^T  (d, B_r)
        K_jT = cuda.shared.array((d_p, KS), float32, alignment=ALIGN)     # K_j^T  (d, B_c)
        V_j = cuda.shared.array((Bc_p, d_p), float32, alignment=ALIGN)    # V_j    (B_c, d)
        P_ijT = cuda.shared.array((Bc_p, QS), float32, alignment=ALIGN)   # P_ij^T (B_c, B_r)
        return Q_iT, K_jT, V_j, P_ijT

    @cuda.jit(device=True, inline="always")
    def row_total(part, r, start, is_max):
        """``start`` combined with part[r, 0 .. TC): their max (``is_max``) or their sum."""
        acc = start
        for u in range(TC):
            if is_max:
                acc = max(acc, part[r, u])
            else:
                acc += part[r, u]
        return acc

    @cuda.jit(device=True, inline="always")
    def block_start():
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        r0, c0, k0 = origin(t)
        return i, bh, t, r0, c0, k0

    qk = _product(d_p, RM, CN, RG, VR, CG, VC)
    pv = _product(Bc_p, RM, DN, RG, VR, KG, VD)

    @cuda.jit(device=True, inline="always")
    def s_tile(S_ij, part, Q_iT, K_jT, x, y, t, r0, c0, row0, col0, N, tau):
        qk(S_ij, Q_iT, K_jT, r0, c0, x, y)
        scale_mask_rowmax(S_ij, part, t, r0, c0, row0, col0, N, tau)

    return TileOps(load_Qi, load_KV, load_K, load_V, load_P, qk, pv, scale_mask_rowmax, origin,
                   flash_tiles, block_start, s_tile, row_total)


class TileOps(NamedTuple):
    load_Q: object
    load_KV: object
    load_K: object
    load_V: object
    load_P: object
    qk: object
    pv: object
    scale_mask_rowmax: object
    origin: object
    flash_tiles: object
    block_start: object
    s_tile: object
    row_total: object


def _loader(R: int, R_p: int, C: int, C_p: int, NT: int, *, transposed: bool, straight: bool):
    """Copy the R x C tile at (row0, col0) of X (and of Y) of shape (., NR, NC) into shared
    memory: ``X_T[c, r]`` (transposed) and ``Y_s[r, c]`` (straight), R_p x C_p with zeros
    past the edges and in the padding."""
    LOADS, EVEN = cdiv(R_p * C_p, NT), R_p * C_p % NT == 0

    @cuda.jit(device=True, inline="always")
    def load(X_T, Y_s, X, Y, t, bh, row0, col0, NR, NC):
        for s in range(LOADS):
            e = uint32(t) + uint32(NT * s)
            r = e // C_p
            cc = e % C_p
            if EVEN or e < R_p * C_p:
                ok = r < R and row0 + r < NR and cc < C and col0 + cc < NC
                src_r = min(row0 + r, NR - 1)
                src_c = min(col0 + cc, NC - 1)
                x_val = X[bh, src_r, src_c] if transposed else float32(0)
                y_val = Y[bh, src_r, src_c] if straight else float32(0)
                if transposed:
                    X_T[cc, r] = x_val if ok else float32(0)
                if straight:
                    Y_s[r, cc] = y_val if ok else float32(0)
    return load


def _product(n: int, RM: int, CN: int, RG: int, VR: int, CG: int, VC: int):
    """C = A^T B on a thread's RM x CN sub-tile: n rank-1 updates, the a-th row at
    own(r0, RG, VR, a), the b-th column at own(c0, CG, VC, b); ``x``, ``y``: registers for
    one column of A^T's chunk and one row of B's."""

    @cuda.jit(device=True, inline="always")
    def product(C, A, B, r0, c0, x, y):
        for a in range(RM):
            for b in range(CN):
                C[a, b] = 0
        k = 0
        while k < n:
            for a in range(RM):
                x[a] = A[k, own(r0, RG, VR, a)]
            for b in range(CN):
                y[b] = B[k, own(c0, CG, VC, b)]
            for a in range(RM):
                for b in range(CN):
                    C[a, b] += x[a] * y[b]
            k += 1
    return product


# --------------------------------------------------------------------------------------
# One launch of a numba kernel


@dataclass
class NumbaLaunch(Launch):
    """A Launch of numba kernels. Inside ``run`` Q, K, V are device arrays (B*H, N, d).

    ``tiling``: the thread layout (a ``Tiling``; a pair for standard attention's two matmul
    kernels; None for the backward's). ``launched``: the KernelLaunch of every kernel the
    last ``run`` launched, in order (what ``launches()`` promises)."""
    tiling: object = None
    launched: list = field(default_factory=list, repr=False)

    def issue_rate(self) -> float | None:
        """``issue_rate`` of the thread layout of a kernel with one (FlashAttention's); None
        for standard attention's pair and the backward's."""
        return issue_rate(self.tiling) if isinstance(self.tiling, Tiling) else None

    def buffer(self, name: str, shape: tuple):
        """A float32 device buffer kept for the next call of this launch."""
        buf = self.workspace.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape):
            buf = cuda.device_array(shape, dtype=numpy.float32)
            self.workspace[name] = buf
        return buf

    def device(self, x, name: str, shape: tuple | None = None):
        """``x`` as a float32 device array of ``shape`` (default (B*H, N, d)), checked first:
        NumPy arrays are copied to the GPU, device arrays (numba, CuPy, torch) are viewed."""
        shape = (self.BH, self.N, self.d) if shape is None else tuple(shape)
        info = describe(x, name)
        if math.prod(info.shape) != math.prod(shape) or info.dtype != "float32":
            raise KernelInputError(f"{name} has shape {info.shape} and dtype {info.dtype}; this "
                                   f"launch takes float32 arrays of shape {shape}")
        if not info.contiguous:
            raise KernelInputError(f"{name} is not C-contiguous; pass a contiguous copy")
        if info.kind == "numpy":
            return cuda.to_device(x.reshape(shape))
        if not cuda.devicearray.is_cuda_ndarray(x):
            x = cuda.as_cuda_array(x)
        return x.reshape(shape)

    def launch(self, kernel, kl: KernelLaunch, *args) -> None:
        """Launch ``kernel`` as ``kl`` says (grid, threads, dynamic shared memory)."""
        self.launched.append(kl)
        kernel[kl.grid, kl.threads, 0, kl.dynamic_smem](*args)


def configure_launch(cls, kernel: str, algorithm: str, shape, arrays, *, causal=False,
                     block_rows=None, block_cols=None, threads=None):
    """A validated launch: tiles from the tile policy unless given (``plan_blocks``), threads
    from ``choose_tiling`` unless given, shared memory checked against 48 KiB."""
    check_flag(causal, "causal")
    B, H, N, d = check_shape(shape, max_head_dim=MAX_HEAD_DIM)
    Br, Bc, sram = plan_blocks(algorithm, N, d, causal=causal, block_rows=block_rows,
                               block_cols=block_cols, arrays=arrays)
    tl = check_tiling(threads, Br, Bc, d, arrays)
    need = check_shared(algorithm, tl, arrays)
    return cls(kernel, algorithm, B, H, N, d, "fp32", causal, Br, Bc, tl.threads, need, 0, sram,
               tiling=tl)


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


@functools.cache
def _read_kernel():
    def read_flat(x, out):
        """Read every element of a flat array (out[0] written almost never: keeps the loads)."""
        e = cuda.grid(1)
        stride = cuda.gridsize(1)
        acc = 0.0
        while e < x.shape[0]:
            acc += x[e]
            e += stride
        if acc == -1.2345:
            out[0] = acc
    return cuda.jit(read_flat)


def read_all(x) -> None:
    """Read every element of the contiguous device array ``x`` (the harness's clean flush)."""
    kl = fill_launch(x.size)
    _read_kernel()[kl.grid, kl.threads](x.reshape(x.size), cuda.device_array(1, numpy.float32))


def fill_launch(size: int) -> KernelLaunch:
    """The launch that ``fill`` makes for an array of ``size`` elements."""
    return KernelLaunch("fill_flat", (min(cdiv(size, 256), 4096),), 256)


def fill(x, value: float, launch: NumbaLaunch | None = None) -> None:
    """Set every element of the contiguous device array ``x`` to ``value`` (FA1's
    initialisation of O, l, m), recorded in ``launch.launched`` when given."""
    kl = fill_launch(x.size)
    flat = x.reshape(x.size)
    if launch is not None:
        launch.launch(_fill_kernel(), kl, flat, numpy.float32(value))
    else:
        _fill_kernel()[kl.grid, kl.threads](flat, numpy.float32(value))
