"""An algorithm's loop nest, described once, and the engines that read it.

Each algorithm in ``flashsim.algorithms`` builds a :class:`Nest`: the tensors that live in
HBM, and a tree of loops whose leaves say which tile is loaded into SRAM, what is computed
on the tiles in SRAM, and which tile is stored back, in order. Everything else reads that
one description:

* :func:`execute` runs it with real values (NumPy arrays, any leading batch dimensions) and
  counts every byte that crosses between HBM and SRAM, by tensor and direction;
* :func:`count` gives the same counts without the arithmetic, for N up to 2^22 in about a
  second (iterations with equal counts are counted once; see :func:`count_scope`), and
  :func:`count_leaves`, the earlier engine, stays beside it as an oracle;
* :func:`walk` yields the steps in order, which is what the notebooks draw and what a GPU
  kernel with the same tiles should do.

A loop runs over the blocks of one index: ``Loop("i", block=B_r, extent=N)`` visits
``i = 0 .. ceil(N / B_r) - 1`` and block ``i`` covers rows ``i*B_r`` up to
``min((i+1)*B_r, N)``; the last block may be short (ragged). A tile names the loop
variables that select its rows and columns; ``None`` means the whole dimension.
Buffers live in SRAM from the op that creates them to the end of the loop iteration
(or nest) in which they were created.

**Where a buffer lives.** In the paper's two-level model every buffer is in SRAM, one budget
of M bytes. A real kernel splits its on-chip storage in two: *shared memory* (what threads
of a block share: the tiles loaded from HBM, here Q_i, K_j, V_j) and the *registers* of its
threads (what each thread computes on: the S_ij tile, the O_i accumulator, m_i, l_i). Each
Load and Alloc says where its buffer lives (``level``, shared memory unless it says
``"registers"``) and, if it differs from the op's, its ``width`` there in bytes per element
(4 for an fp32 accumulator of fp16 data). An algorithm writes its nest with every buffer in
SRAM and names its register buffers in a table; :func:`place` marks them, once per pass, so
the forward and backward of one plan can place a buffer of the same name differently. A
nest with no register buffer is the two-level model. The engines keep the two levels
apart: ``Counts.sram_peak`` is the shared-memory peak, ``Counts.register_peak`` the
registers' (0 in the two-level model), and :func:`working_set` takes the level. Traffic
never depends on placement: a load or store moves the HBM tile's bytes wherever it lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Union

import numpy as np

from .errors import SramOverflowError


@dataclass(frozen=True)
class Tensor:
    """A matrix that lives in HBM: ``rows x cols`` elements of ``elem_bytes`` each."""
    name: str
    rows: int
    cols: int
    elem_bytes: int


SMEM, REGISTERS = "smem", "registers"          # the two on-chip levels


@dataclass(frozen=True)
class Load:
    """Copy a tile of ``tensor`` from HBM into SRAM buffer ``buf`` (counted as an HBM read).
    ``level``/``width``: where the buffer lives and its bytes per element there (None: the
    tensor's)."""
    buf: str
    tensor: str
    rows: str | None = None
    cols: str | None = None
    level: str = SMEM
    width: int | None = None


@dataclass(frozen=True)
class Store:
    """Copy SRAM buffer ``buf`` to a tile of ``tensor`` in HBM (counted as an HBM write)."""
    buf: str
    tensor: str
    rows: str | None = None
    cols: str | None = None


@dataclass(frozen=True)
class Alloc:
    """Create SRAM buffer ``buf`` of ``rows`` x ``cols`` elements filled with ``fill``; no HBM
    traffic. ``rows`` is a loop variable (its block's extent); ``cols`` is one too, or a
    number of columns. ``level``/``width`` as for :class:`Load` (None: ``elem_bytes``)."""
    buf: str
    rows: str
    cols: str | int
    elem_bytes: int
    fill: float = 0.0
    level: str = SMEM
    width: int | None = None


@dataclass(frozen=True)
class Compute:
    """Arithmetic on buffers already in SRAM. ``fn(sram, ctx)`` updates ``sram`` in place;
    ``flops(ext)`` counts matmul FLOPs from the extents ``ext(var)`` of the current blocks
    (it must also accept NumPy arrays of extents, for :func:`count`).

    ``exps(ext)`` counts the exponentials ``fn`` evaluates (one per element it exponentiates,
    masked elements of a visited tile included: a kernel computes exp(-inf) = 0 too) and
    ``nonmatmul(ext)`` every other scalar operation outside the matmuls, exponentials
    included (one each for a max, add, subtract, multiply, divide, exp or log; a row
    reduction over c elements folded into a running value costs c; adding a matmul's
    product into its accumulator is matmul work; masking is a select, not an operation).
    The special-function units run the exponentials, the FP32 units the rest."""
    name: str
    fn: Callable[[dict, "Ctx"], None]
    flops: Callable[[Callable], object] | None = None
    exps: Callable[[Callable], object] | None = None
    nonmatmul: Callable[[Callable], object] | None = None


@dataclass(frozen=True)
class Loop:
    """``for var in range(start(ctx), stop(ctx))`` over blocks of ``block`` rows of an
    ``extent``-row dimension. ``start``/``stop`` default to all blocks; causal algorithms
    use them to skip fully masked tiles. ``visit(ctx)``, when given, replaces both: the
    ascending block indices to visit, any subset (a mask that skips tiles in the middle of
    a row: ``flashsim.masks``). ``parallel`` marks a loop whose iterations are
    separate thread blocks on a GPU (a top-level loop is one kernel launch);
    ``launch_per_iteration`` marks a top-level loop each of whose iterations is one kernel
    launch of its body (FlashAttention's j loop as launches ordered in one stream: no block
    of step j + 1 starts before step j ends). The traffic counts depend on neither, the L2
    and time models on both (:func:`launches`)."""
    var: str
    block: int
    extent: int
    body: tuple
    start: Callable[["Ctx"], int] | None = None
    stop: Callable[["Ctx"], int] | None = None
    label: str = ""
    parallel: bool = False
    visit: Callable[["Ctx"], "Visited"] | None = None
    launch_per_iteration: bool = False

    @property
    def blocks(self) -> int:
        return -(-self.extent // self.block)


Op = Union[Load, Store, Alloc, Compute, Loop]


@dataclass(frozen=True)
class Nest:
    """One algorithm's whole schedule: HBM tensors and the ops, in program order."""
    tensors: dict
    body: tuple

    def onchip_bytes(self, op, elems) -> object:
        """Bytes buffer ``op.buf`` (a Load or Alloc) takes on chip for ``elems`` elements."""
        return _onchip(op, elems, self.tensors)[1]


def place(body: tuple, registers: dict) -> tuple:
    """``body`` with the Loads and Allocs of the buffers named in ``registers`` ({buffer:
    bytes per element in registers, or None to keep the op's width}) moved to registers."""
    if not registers:
        return body
    out = []
    for op in body:
        if isinstance(op, (Load, Alloc)) and op.buf in registers:
            op = replace(op, level=REGISTERS, width=registers[op.buf])
        elif isinstance(op, Loop):
            op = replace(op, body=place(op.body, registers))
        out.append(op)
    return tuple(out)


class Ctx:
    """The current block index of every enclosing loop, and the rows each block covers."""

    def __init__(self) -> None:
        self.idx: dict[str, int] = {}
        self.loops: dict[str, Loop] = {}

    def range(self, var: str) -> tuple[int, int]:
        """``(lo, hi)``: the half-open row range of the current block of ``var``."""
        loop, i = self.loops[var], self.idx[var]
        lo = i * loop.block
        return lo, min(lo + loop.block, loop.extent)

    def extent(self, var: str) -> int:
        lo, hi = self.range(var)
        return hi - lo


def span(ctx: Ctx, var: str | None, full: int) -> tuple[int, int]:
    """The half-open range a tile covers along one dimension: the block of ``var``, or the
    whole ``full`` extent when ``var`` is None."""
    return (0, full) if var is None else ctx.range(var)


class Visited(tuple):
    """Ascending block indices a loop visits (from ``Loop.visit``), with a range's
    ``start`` and ``stop`` (the first index, one past the last), so readers written for
    ``[start, stop)`` bounds still find the ends."""

    @property
    def start(self) -> int:
        return self[0] if self else 0

    @property
    def stop(self) -> int:
        return self[-1] + 1 if self else 0


def loop_range(loop: Loop, ctx: Ctx):
    """The block indices ``loop`` visits in context ``ctx`` (its causal bounds applied): a
    range, or the loop's ``visit`` list."""
    if loop.visit is not None:
        return loop.visit(ctx)
    start = 0 if loop.start is None else loop.start(ctx)
    stop = loop.blocks if loop.stop is None else loop.stop(ctx)
    return range(max(start, 0), min(stop, loop.blocks))


@dataclass
class Step:
    """One op as :func:`walk` meets it: the op, the live context, and for loads, stores and
    allocations the rows/cols of the tile and its bytes (a load's or store's: the HBM tile's,
    what crosses; an allocation's: what it takes on chip)."""
    op: Op
    ctx: Ctx
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None
    nbytes: int = 0
    freed: tuple = ()


def walk(nest: Nest) -> Iterator[Step]:
    """Every op in program order (loops unrolled). ``Step.ctx`` is live: copy what you keep.

    After the last op of a scope, a ``Step`` whose ``op`` is the scope's Loop (or None for
    the whole nest) carries ``freed``: the buffers released there.
    """
    ctx = Ctx()
    yield from _walk(nest.body, nest, ctx)


def _walk(ops: tuple, nest: Nest, ctx: Ctx, owner: Loop | None = None) -> Iterator[Step]:
    tensors = nest.tensors
    created: list[str] = []
    for op in ops:
        if isinstance(op, (Load, Store)):
            t = tensors[op.tensor]
            rows, cols = span(ctx, op.rows, t.rows), span(ctx, op.cols, t.cols)
            nbytes = (rows[1] - rows[0]) * (cols[1] - cols[0]) * t.elem_bytes
            if isinstance(op, Load) and op.buf not in created:
                created.append(op.buf)
            yield Step(op, ctx, rows, cols, nbytes)
        elif isinstance(op, Alloc):
            rows = ctx.range(op.rows)
            cols = (0, op.cols) if isinstance(op.cols, int) else ctx.range(op.cols)
            created.append(op.buf)
            yield Step(op, ctx, rows, cols,
                       nest.onchip_bytes(op, (rows[1] - rows[0]) * (cols[1] - cols[0])))
        elif isinstance(op, Compute):
            yield Step(op, ctx)
        elif isinstance(op, Loop):
            ctx.loops[op.var] = op
            for i in loop_range(op, ctx):
                ctx.idx[op.var] = i
                yield from _walk(op.body, nest, ctx, op)
            ctx.idx.pop(op.var, None)
            ctx.loops.pop(op.var)
        else:  # pragma: no cover - a nest is built by our own code
            raise TypeError(f"not an op: {op!r}")
    yield Step(owner, ctx, freed=tuple(created))


@dataclass
class Counts:
    """Bytes by tensor and direction, matmul FLOPs and the on-chip peaks, for one head:
    ``sram_peak`` for shared memory (all of SRAM in the two-level model), ``register_peak``
    for the buffers placed in registers; the work outside the matmuls: exponentials, and
    all non-matmul operations (exponentials included), as :class:`Compute` defines them;
    and the loads and stores performed (``transfers``: tiles moved, not bytes)."""
    read: dict = field(default_factory=dict)
    write: dict = field(default_factory=dict)
    flops: int = 0
    sram_peak: int = 0
    register_peak: int = 0
    exp_ops: int = 0
    nonmatmul_flops: int = 0
    transfers: int = 0

    def add_compute(self, op: "Compute", ext, times=None, mult: int = 1) -> None:
        """Add what ``op`` does with extents ``ext``, ``mult`` times (NumPy arrays over the
        iterations of an innermost loop when ``times`` is their shape, summed)."""
        for attr, fn in (("flops", op.flops), ("exp_ops", op.exps),
                         ("nonmatmul_flops", op.nonmatmul)):
            if fn is not None:
                v = fn(ext)
                if times is not None:
                    v = np.broadcast_to(v, times).sum()
                setattr(self, attr, getattr(self, attr) + mult * int(v))

def execute(nest: Nest, hbm: dict, sram_limit: int | None = None,
            register_limit: int | None = None) -> Counts:
    """Run ``nest`` with values. ``hbm`` maps tensor names to arrays of shape
    ``(..., rows, cols)``; outputs are written into it. Returns the counts for one head
    (the leading batch dimensions share one schedule). A limit, when given, is checked
    after every buffer is created: shared memory against ``sram_limit``, registers
    against ``register_limit``."""
    counts = Counts({n: 0 for n in nest.tensors}, {n: 0 for n in nest.tensors})
    sram: dict[str, np.ndarray] = {}
    sizes: dict[str, dict] = {SMEM: {}, REGISTERS: {}}
    level: dict[str, str] = {}
    for step in walk(nest):
        op = step.op
        if isinstance(op, Load):
            (r0, r1), (c0, c1) = step.rows, step.cols
            sram[op.buf] = hbm[op.tensor][..., r0:r1, c0:c1].copy()
            level[op.buf] = op.level
            sizes[op.level][op.buf] = nest.onchip_bytes(op, (r1 - r0) * (c1 - c0))
            counts.read[op.tensor] += step.nbytes
            counts.transfers += 1
        elif isinstance(op, Store):
            (r0, r1), (c0, c1) = step.rows, step.cols
            hbm[op.tensor][..., r0:r1, c0:c1] = sram[op.buf]
            counts.write[op.tensor] += step.nbytes
            counts.transfers += 1
        elif isinstance(op, Alloc):
            batch = next(iter(hbm.values())).shape[:-2]
            shape = (step.rows[1] - step.rows[0], step.cols[1] - step.cols[0])
            sram[op.buf] = np.full(batch + shape, op.fill)
            level[op.buf] = op.level
            sizes[op.level][op.buf] = nest.onchip_bytes(op, shape[0] * shape[1])
        elif isinstance(op, Compute):
            op.fn(sram, step.ctx)
            counts.add_compute(op, step.ctx.extent)
        if step.freed:
            for buf in step.freed:
                sram.pop(buf, None)
                sizes[level.pop(buf, SMEM)].pop(buf, None)
        elif isinstance(op, (Load, Alloc)):
            counts.sram_peak = max(counts.sram_peak, sum(sizes[SMEM].values()))
            counts.register_peak = max(counts.register_peak, sum(sizes[REGISTERS].values()))
            if sram_limit is not None and counts.sram_peak > sram_limit:
                raise SramOverflowError(
                    f"shared memory holds {counts.sram_peak} B after loading {op.buf}, more "
                    f"than M = {sram_limit} B")
            if register_limit is not None and counts.register_peak > register_limit:
                raise SramOverflowError(
                    f"registers hold {counts.register_peak} B after creating {op.buf}, more "
                    f"than the block's {register_limit} B")
    return counts


def count(nest: Nest) -> Counts:
    """The counts :func:`execute` would give, without values. Iterations whose counts are
    provably equal are counted once and multiplied (see :func:`count_scope`), so the work
    does not grow with the number of tiles where no loop bound depends on an outer index."""
    counts = Counts({n: 0 for n in nest.tensors}, {n: 0 for n in nest.tensors})
    _count(nest.body, nest.tensors, Ctx(), counts, (0, 0), 1)
    return counts


def count_scope(ops: tuple, tensors: dict, ctx: Ctx, counts: Counts | None = None,
                resident: tuple = (0, 0)) -> Counts:
    """Add the counts of ``ops`` run in context ``ctx`` (the enclosing loops' blocks already
    chosen: one thread block of a launch, say) to ``counts`` and return it. ``resident``:
    (shared, register) bytes already held by outer scopes.

    How it stays fast: an iteration's counts depend on its context only through block
    extents (a tile's bytes and a matmul's FLOPs are products of extents) and through the
    ranges of the loops inside it. So the iterations of a loop whose body has no bounded
    (``start``/``stop``) loop fall into two classes, full blocks and the one ragged last
    block, each counted once and multiplied by its size. When the loops directly inside
    are bounded but their own bodies are not, each bound is evaluated per iteration and
    only the number of full and ragged blocks it admits is summed (counts are linear in
    them). Deeper bounds are stepped through iteration by iteration. Peaks are maxima over
    iterations, and a full block holds at least what the ragged one does, so the
    representatives give them too."""
    counts = counts if counts is not None else Counts(
        {n: 0 for n in tensors}, {n: 0 for n in tensors})
    _count(ops, tensors, ctx, counts, resident, 1)
    return counts


def count_leaves(nest: Nest) -> Counts:
    """The earlier count engine, kept as an oracle for :func:`count`: every loop above the
    innermost stepped through, innermost loops summed with NumPy arrays over their
    iterations (so its memory grows with N for each outer iteration)."""
    counts = Counts({n: 0 for n in nest.tensors}, {n: 0 for n in nest.tensors})
    _count_by_leaves(nest.body, nest.tensors, Ctx(), counts, (0, 0))
    return counts


def _onchip(op, elems, tensors: dict):
    """(level index, bytes) of a Load's or Alloc's buffer: 0 for shared memory, 1 for
    registers; ``op.width`` bytes an element, else the op's own width."""
    width = op.width or (op.elem_bytes if isinstance(op, Alloc)
                         else tensors[op.tensor].elem_bytes)
    return int(op.level == REGISTERS), elems * width


def _note_peak(counts: Counts, resident: tuple, held: list) -> None:
    counts.sram_peak = max(counts.sram_peak, int(_most(resident[0] + held[0])))
    counts.register_peak = max(counts.register_peak, int(_most(resident[1] + held[1])))


def _most(x):
    """The largest of ``x``: bytes held, an int, or an array over a loop's iterations (the
    leaf-summing engine's); np.max on an int costs microseconds in the counting hot loop."""
    return x if isinstance(x, (int, np.integer)) else np.max(x)


def _plus(resident: tuple, held: list) -> tuple:
    return (resident[0] + held[0], resident[1] + held[1])


def has_bounds(ops: tuple) -> bool:
    """Whether any loop in ``ops`` (at any depth) has a ``start``, ``stop`` or ``visit``
    bound."""
    for op in ops:
        if isinstance(op, Loop) and (op.start is not None or op.stop is not None
                                     or op.visit is not None or has_bounds(op.body)):
            return True
    return False


def full_blocks(loop: Loop) -> int:
    """Blocks of ``loop`` that have the full ``block`` rows: all but a ragged last one."""
    return loop.extent // loop.block


def _classes(loop: Loop, blocks: range) -> list[tuple[int, int]]:
    """``[(representative index, how many)]``: the iterations in ``blocks`` split into full
    blocks and the ragged last one (whose extent is smaller)."""
    last = loop.blocks - 1
    if not isinstance(blocks, range):       # a visit list: only its last may be ragged
        ragged = bool(blocks) and blocks[-1] == last and last >= full_blocks(loop)
        full = len(blocks) - ragged
        return ([(blocks[0], full)] if full else []) + ([(last, 1)] if ragged else [])
    full = max(0, min(blocks.stop, full_blocks(loop)) - blocks.start)
    out = [(blocks.start, full)] if full > 0 else []
    if last >= full_blocks(loop) and blocks.start <= last < blocks.stop:
        out.append((last, 1))
    return out


def _count(ops: tuple, tensors: dict, ctx: Ctx, counts: Counts, resident: tuple,
           mult: int) -> list:
    """Count ``ops`` in context ``ctx``, ``mult`` times over (that many iterations with the
    same counts), with ``resident`` = (shared, register) bytes already on chip from outer
    scopes; returns the [shared, register] bytes this scope holds at its end."""
    held = [0, 0]
    for op in ops:
        if isinstance(op, (Load, Store)):
            t = tensors[op.tensor]
            rows, cols = span(ctx, op.rows, t.rows), span(ctx, op.cols, t.cols)
            elems = (rows[1] - rows[0]) * (cols[1] - cols[0])
            counts.transfers += mult
            if isinstance(op, Load):
                counts.read[op.tensor] += mult * elems * t.elem_bytes
                level, nb = _onchip(op, elems, tensors)
                held[level] += nb
                _note_peak(counts, resident, held)
            else:
                counts.write[op.tensor] += mult * elems * t.elem_bytes
        elif isinstance(op, Alloc):
            cols = op.cols if isinstance(op.cols, int) else ctx.extent(op.cols)
            level, nb = _onchip(op, ctx.extent(op.rows) * cols, tensors)
            held[level] += nb
            _note_peak(counts, resident, held)
        elif isinstance(op, Compute):
            counts.add_compute(op, ctx.extent, mult=mult)
        elif isinstance(op, Loop):
            ctx.loops[op.var] = op
            blocks = loop_range(op, ctx)
            inner = _plus(resident, held)
            if not has_bounds(op.body):
                for i, n in _classes(op, blocks):
                    ctx.idx[op.var] = i
                    _count(op.body, tensors, ctx, counts, inner, mult * n)
            elif not any(has_bounds(o.body) for o in op.body if isinstance(o, Loop)):
                _count_bounded(op, blocks, tensors, ctx, counts, inner, mult)
            else:
                for i in blocks:
                    ctx.idx[op.var] = i
                    _count(op.body, tensors, ctx, counts, inner, mult)
            ctx.idx.pop(op.var, None)
            ctx.loops.pop(op.var)
    return held


class _Summed:
    """A loop whose range was evaluated per iteration of the loop around it: how many of
    its iterations were full blocks and how many the ragged last one, summed."""

    def __init__(self) -> None:
        self.full = 0
        self.ragged = 0


def _count_bounded(loop: Loop, blocks: range, tensors: dict, ctx: Ctx, counts: Counts,
                   resident: tuple, mult: int) -> None:
    """All iterations of ``loop``, whose directly nested loops have bounds (a causal mask)
    but contain none: per iteration only those bounds are evaluated, and the full and
    ragged blocks they admit summed; the body is then counted once per class of this
    loop's block (full or ragged), each nested loop once per class of its own block,
    multiplied by the sums."""
    inner = [o for o in loop.body if isinstance(o, Loop)]
    sums: dict = {}                         # own class -> [index, iterations, [_Summed]]
    nfull = full_blocks(loop)
    specs = [(o.start, o.stop, full_blocks(o), o.blocks, o.visit) for o in inner]
    for o in inner:
        ctx.loops[o.var] = o
    idx = ctx.idx
    for i in blocks:                        # the hot loop: one per block of ``loop``
        idx[loop.var] = i
        key = i < nfull
        entry = sums.get(key)
        if entry is None:
            entry = sums[key] = [i, 0, [_Summed() for _ in inner]]
        entry[1] += 1
        for (start, stop, nf, nb, visit), s in zip(specs, entry[2]):
            if visit is not None:           # ascending: only the last can be ragged
                v = visit(ctx)
                ragged = int(bool(v) and v[-1] == nb - 1 and nb - 1 >= nf)
                s.full += len(v) - ragged
                s.ragged += ragged
                continue
            lo = 0 if start is None else max(start(ctx), 0)
            hi = nb if stop is None else min(stop(ctx), nb)
            if hi > lo:                     # as loop_range: range(lo, hi)
                full = min(hi, nf) - lo
                if full > 0:
                    s.full += full
                    s.ragged += hi - lo - full
                else:
                    s.ragged += hi - lo
    for o in inner:
        ctx.loops.pop(o.var, None)
    for i, n, summed in sums.values():
        ctx.idx[loop.var] = i
        _count_summed(loop.body, dict(zip(map(id, inner), summed)), tensors, ctx, counts,
                      resident, mult, n)


def _count_summed(ops: tuple, summed: dict, tensors: dict, ctx: Ctx, counts: Counts,
                  resident: tuple, mult: int, n: int) -> None:
    """One class of iterations of a loop body (``n`` of them, each ``mult`` times): its
    own ops counted ``n`` times, each nested loop's full and ragged blocks counted as
    many times as ``summed`` says."""
    held = [0, 0]
    for op in ops:
        if isinstance(op, Loop):
            s = summed[id(op)]
            ctx.loops[op.var] = op
            classes = [(0, s.full)] if s.full else []
            if s.ragged:
                classes.append((op.blocks - 1, s.ragged))
            for i, k in classes:
                ctx.idx[op.var] = i
                _count(op.body, tensors, ctx, counts, _plus(resident, held), mult * k)
            ctx.idx.pop(op.var, None)
            ctx.loops.pop(op.var)
        else:
            h = _count((op,), tensors, ctx, counts, _plus(resident, held), mult * n)
            held = [held[0] + h[0], held[1] + h[1]]


def _count_by_leaves(ops: tuple, tensors: dict, ctx: Ctx, counts: Counts,
                     resident: tuple) -> None:
    """The oracle: outer loops stepped, innermost loops summed with NumPy (the ops
    outside loops counted one at a time, as the engine counts them)."""
    held = [0, 0]
    for op in ops:
        if not isinstance(op, Loop):
            h = _count((op,), tensors, ctx, counts, _plus(resident, held), 1)
            held = [held[0] + h[0], held[1] + h[1]]
        else:
            ctx.loops[op.var] = op
            blocks = loop_range(op, ctx)
            inner = _plus(resident, held)
            if any(isinstance(o, Loop) for o in op.body):
                for i in blocks:
                    ctx.idx[op.var] = i
                    _count_by_leaves(op.body, tensors, ctx, counts, inner)
            elif len(blocks):
                _count_leaf(op, blocks, tensors, ctx, counts, inner)
            ctx.idx.pop(op.var, None)
            ctx.loops.pop(op.var)


def _count_leaf(loop: Loop, blocks: range, tensors: dict, ctx: Ctx, counts: Counts,
                resident: tuple) -> None:
    """All iterations of an innermost loop at once: each extent of ``loop.var`` becomes a
    NumPy array over the iterations and every count is a sum over it."""
    idx = (np.arange(blocks.start, blocks.stop, dtype=np.int64) if isinstance(blocks, range)
           else np.asarray(blocks, dtype=np.int64))
    lo = idx * loop.block
    ext_var = np.minimum(lo + loop.block, loop.extent) - lo

    def ext(var: str):
        return ext_var if var == loop.var else ctx.extent(var)

    def span(var: str | None, full: int):
        return full if var is None else ext(var)

    held = [np.zeros(len(idx), dtype=np.int64), np.zeros(len(idx), dtype=np.int64)]
    for op in loop.body:
        if isinstance(op, (Load, Store)):
            t = tensors[op.tensor]
            elems = np.broadcast_to(span(op.rows, t.rows) * span(op.cols, t.cols), idx.shape)
            counts.transfers += len(idx)
            if isinstance(op, Load):
                counts.read[op.tensor] += int(elems.sum()) * t.elem_bytes
                level, nb = _onchip(op, elems, tensors)
                held[level] = held[level] + nb
                _note_peak(counts, resident, held)
            else:
                counts.write[op.tensor] += int(elems.sum()) * t.elem_bytes
        elif isinstance(op, Alloc):
            cols = op.cols if isinstance(op.cols, int) else ext(op.cols)
            elems = np.broadcast_to(ext(op.rows) * cols, idx.shape)
            level, nb = _onchip(op, elems, tensors)
            held[level] = held[level] + nb
            _note_peak(counts, resident, held)
        elif isinstance(op, Compute):
            counts.add_compute(op, ext, idx.shape)


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a nest: its ops and, when its iterations are thread blocks, the
    parallel loop over them (``loop`` is None for a launch of one block per head).
    ``outer``: ``((Loop, index), ...)``, the iteration of each ``launch_per_iteration`` loop
    around it (empty for a launch of the nest's top level)."""
    label: str
    loop: Loop | None
    ops: tuple
    outer: tuple = ()

    @property
    def var(self) -> str | None:
        return None if self.loop is None else self.loop.var

    def context(self) -> Ctx:
        """A fresh context with the outer loops' indices set (what every block of this launch
        starts from)."""
        return _outer_context(self.outer)


def _outer_context(outer: tuple) -> Ctx:
    ctx = Ctx()
    for loop, k in outer:
        ctx.loops[loop.var] = loop
        ctx.idx[loop.var] = k
    return ctx


def launches(nest: Nest) -> list[Launch]:
    """The kernel launches of ``nest``, in stream order: each top-level loop marked
    ``parallel`` is one launch whose iterations are thread blocks; a run of top-level ops
    without it is one launch with one block per head (flash1, as the original FlashAttention
    kernel); a top-level loop marked ``launch_per_iteration`` gives, for each of its
    iterations k, the launches its body gives by these rules, each with ``outer`` (loop, k)
    (flash1 as the numba kernel runs it: one launch per K/V block). Such launches share
    their label; their position in this list tells them apart."""
    return _launches(nest.body, ())


def _launches(body: tuple, outer: tuple) -> list[Launch]:
    out, run = [], []

    def close():
        if run:
            out.append(Launch(run[0].label if isinstance(run[0], Loop) else "", None,
                              tuple(run), outer))
            run.clear()

    for op in body:
        if isinstance(op, Loop) and op.launch_per_iteration:
            close()
            ctx = _outer_context(outer)
            ctx.loops[op.var] = op
            for k in loop_range(op, ctx):
                out += _launches(op.body, outer + ((op, k),))
        elif isinstance(op, Loop) and op.parallel:
            close()
            out.append(Launch(op.label, op, op.body, outer))
        else:
            run.append(op)
    close()
    return out


def blocks(launch: Launch) -> Iterator[Ctx]:
    """The thread blocks of one head in ``launch``, in launch order: a context whose parallel
    loop index (and outer indices) are set (live: copy what you keep). Read by the L2 and
    the time models."""
    ctx = launch.context()
    if launch.loop is None:
        yield ctx
        return
    ctx.loops[launch.var] = launch.loop
    for i in loop_range(launch.loop, ctx):
        ctx.idx[launch.var] = i
        yield ctx


def working_set(nest: Nest, level: str = SMEM) -> list[tuple[str, int]]:
    """The buffers of ``level`` (``"smem"``, the default, or ``"registers"``) resident at
    that level's peak with full-size blocks, ``[(buf, bytes), ...]``.

    Checked before a plan runs; the peaks that :func:`execute` tracks equal their sums. In
    the two-level model (no register buffer) the shared level is all of SRAM."""
    best: list[tuple[str, int]] = []

    def visit(ops: tuple, outer: list[tuple[str, int]], blocks: dict[str, int]) -> None:
        nonlocal best
        here = list(outer)
        for op in ops:
            if isinstance(op, Load):
                t = nest.tensors[op.tensor]
                r = t.rows if op.rows is None else blocks[op.rows]
                c = t.cols if op.cols is None else blocks[op.cols]
                if op.level == level:
                    here.append((op.buf, nest.onchip_bytes(op, r * c)))
            elif isinstance(op, Alloc):
                cols = op.cols if isinstance(op.cols, int) else blocks[op.cols]
                if op.level == level:
                    here.append((op.buf, nest.onchip_bytes(op, blocks[op.rows] * cols)))
            elif isinstance(op, Loop):
                visit(op.body, here, {**blocks, op.var: min(op.block, op.extent)})
            if sum(b for _, b in here) > sum(b for _, b in best):
                best = list(here)

    visit(nest.body, [], {})
    return best
