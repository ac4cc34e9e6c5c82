"""A third level: an L2 cache between the SMs' SRAM and DRAM, and the blocks that share it.

The two-level model counts what SRAM asks of the level below. On a real GPU those requests
go to an L2 cache (60 MB on an H200) shared by every SM, and only its misses and
write-backs reach DRAM. Whether a re-read hits depends on what ran at the same time, so
this model needs a schedule, read from the same loop nest as everything else:

* **Launches.** Each top-level loop marked ``parallel`` is one kernel launch whose
  iterations are thread blocks; a run of top-level loops without it is one launch with one
  block per head (flash1, as the original FlashAttention kernel); a top-level loop marked
  ``launch_per_iteration`` is one launch per iteration (flash1 as the numba kernel runs it:
  a launch per K/V block). Each launch starts with a clean, empty L2, as Nsight Compute's
  default cache control makes it (and as the measurements it is compared with were taken);
  so launches that make the same requests renamed are simulated once
  (``l2_lockstep.launch_class``).
* **Waves.** ``SMs x blocks_per_sm`` blocks are resident at once; blocks start in launch
  order (``blockIdx.x`` = the Q block fastest, then the head), and a finished block's slot
  goes to the next block at once. Resident blocks advance in step: at every step each one
  performs the loads and stores of one iteration of its innermost loop. Requests for the
  same tile in the same step are merged (the L2 sees one miss), as concurrent misses to one
  line are.
* **The cache.** Capacity in bytes, LRU replacement over tiles, write-back and
  write-allocate: a store makes its tile dirty in L2 without reading DRAM; a dirty tile
  reaches DRAM when it is evicted, or earlier, when its home half of the L2 has turned
  over (``_LRU``: the H200's L2 is two halves; a dirty line lives only in its home half,
  which sees every line read but about half the stores). Dirty tiles still in L2 when
  the kernel ends are not DRAM writes *of that kernel* (Nsight's counters stop at the
  kernel's end); they are reported apart.
* **Sectors.** Every tile's requests are the 32-byte sectors it touches, row by row: the
  L2 request bytes are the two-level bytes rounded up to sectors. The cache holds, and
  DRAM moves, the sectors a tile owns (those whose first byte lies in it): a sector two
  neighbouring tiles share is one line, read or written back once (``_sectors``).

What it leaves out, each a reason a prediction can miss:

* **Between the SMs and the L2.** The model's L2 requests are what the SMs ask for, and on
  the H200 that count is exact (Nsight's L1 request sectors equal it at every measured
  point). Two things stand between those requests and the L2 slices, and both depend on
  timing that a step model does not have: L1 hits (a co-resident block on the same SM read
  the sector a moment before; the numba kernels' padded tiles re-read clamped rows) and
  Hopper's L2 request coalescer, which merges reads of one sector by several SMs that are in
  flight at once. Blocks of one head stream the same K_j, V_j almost together, so without a
  mask the coalescer removes a large share of FlashAttention-2's read requests; under a
  causal mask the blocks drift apart and it removes little. ``flashsim.measured.validation`` reads
  both from the counters and shows they account for the difference.
* What the two halves do to lines that are only read (data used by SMs on both sides may
  be held twice, which lowers the useful capacity: the 107 points refute halving it),
  hashing and set conflicts (LRU here is fully associative, so a re-read either always
  hits or always misses, where the counters show a gradual change with the footprint),
  and prefetching.

The schedule itself was measured (``benchmarks/sm_placement.py``): the first
SMs x blocks-per-SM blocks start together in launch order, consecutive blocks on different
SMs.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from ..errors import FlashsimError
from ..nest import Ctx, Load, Loop, Store, blocks, count_scope, launches, loop_range, span
from .presets import DEFAULT_GPU, gpu as _gpu

SECTOR = 32


@dataclass
class LaunchTraffic:
    """One kernel launch: what the SMs asked of L2 and what reached DRAM."""
    label: str
    blocks: int
    l2_read_bytes: int = 0
    l2_write_bytes: int = 0
    dram_read_bytes: int = 0
    dram_write_bytes: int = 0
    dirty_at_end_bytes: int = 0
    steps: int = 0            # global steps: the length of the launch in block-steps


def _over_launches(name: str) -> property:
    """A report's total of one of its launches' fields."""
    return property(lambda self: sum(getattr(x, name) for x in self.launches))


@dataclass
class L2Report:
    """The L2 model's prediction for a whole plan (all launches, all batch x heads)."""
    l2_bytes: int
    blocks_per_sm: int
    sms: int
    launches: list = field(default_factory=list)

    l2_read_bytes = _over_launches("l2_read_bytes")
    l2_write_bytes = _over_launches("l2_write_bytes")
    dram_read_bytes = _over_launches("dram_read_bytes")
    dram_write_bytes = _over_launches("dram_write_bytes")
    dirty_at_end_bytes = _over_launches("dirty_at_end_bytes")

    def to_dict(self) -> dict:
        return {
            "l2_bytes": self.l2_bytes, "blocks_per_sm": self.blocks_per_sm, "sms": self.sms,
            "l2_read_bytes": self.l2_read_bytes, "l2_write_bytes": self.l2_write_bytes,
            "dram_read_bytes": self.dram_read_bytes, "dram_write_bytes": self.dram_write_bytes,
            "dirty_at_end_bytes": self.dirty_at_end_bytes,
            "launches": [vars(x).copy() for x in self.launches],
        }


def _up(byte: int) -> int:
    """The index of the first sector that starts at or after ``byte``."""
    return -(-byte // SECTOR)


def _sectors(rows: tuple[int, int], cols: tuple[int, int], width: int, b: int) -> tuple[int, int]:
    """``(touched, owned)``: bytes of the 32-byte sectors a tile touches in a row-major
    (rows x width) matrix, and of those whose first byte lies inside the tile (each sector
    of a matrix is owned by exactly one tile of any tiling that covers it, so a sector
    two neighbouring tiles share is counted once)."""
    (r0, r1), (c0, c1) = rows, cols
    if c0 == 0 and c1 == width:                      # whole rows: one contiguous range
        lo, hi = r0 * width * b, r1 * width * b
        return ((hi - 1) // SECTOR - lo // SECTOR + 1) * SECTOR, (_up(hi) - _up(lo)) * SECTOR
    # Row r starts at byte (r width + c0) b; its sectors depend on that start mod 32, which
    # repeats every q rows: sum one period of rows, times the whole periods, plus the rest.
    q = SECTOR // math.gcd(width * b, SECTOR)
    length = (c1 - c0) * b

    def row(r: int) -> tuple[int, int]:
        start = (r * width + c0) * b
        end = start + length
        return (end - 1) // SECTOR - start // SECTOR + 1, _up(end) - _up(start)

    def total(rs) -> tuple[int, int]:
        t = o = 0
        for r in rs:
            a, c = row(r)
            t, o = t + a, o + c
        return t, o

    n = r1 - r0
    pt, po = total(range(r0, r0 + min(q, n)))
    if n <= q:
        return pt * SECTOR, po * SECTOR
    rt, ro = total(range(r0, r0 + n % q))
    return ((n // q) * pt + rt) * SECTOR, ((n // q) * po + ro) * SECTOR


def _sector_bytes(rows: tuple[int, int], cols: tuple[int, int], width: int, b: int) -> int:
    """Bytes of the 32-byte sectors a tile touches in a row-major (rows x width) matrix."""
    return _sectors(rows, cols, width, b)[0]


def block_steps(ops: tuple, tensors: dict, ctx: Ctx, private_var: str | None, sizes: dict,
             intern: dict) -> list:
    """A block's steps: ``[(shared, private, read_bytes, write_bytes)]``. A step is one
    iteration of an innermost loop, or a run of loads/stores between loops; its requests are
    ``(key, owned_sector_bytes, is_write)`` (what the cache holds and DRAM moves) and its
    read and write bytes the sectors the requests touch (what the L2 is asked for).
    ``private`` requests depend on the block's own index (``private_var``); ``shared`` ones
    do not, and equal tuples are one object (``intern``), so blocks asking for the same
    tiles in one step are merged by identity."""
    steps: list = []
    cur_s: list = []
    cur_p: list = []
    touched = [0, 0]                    # this step's requested bytes: read, written

    def flush():
        nonlocal cur_s, cur_p
        if cur_s or cur_p:
            shared = tuple(cur_s)
            shared = intern.setdefault(shared, shared)
            step = (shared, tuple(cur_p), touched[0], touched[1])
            if not cur_p:               # the same for every block: kept once
                step = intern.setdefault(("step",) + step, step)
            steps.append(step)
            cur_s, cur_p = [], []
            touched[:] = [0, 0]

    def visit(body: tuple):
        for op in body:
            if isinstance(op, (Load, Store)):
                t = tensors[op.tensor]
                rows, cols = span(ctx, op.rows, t.rows), span(ctx, op.cols, t.cols)
                key = (op.tensor, rows[0], cols[0])
                sz = sizes.get((op.tensor, rows, cols))
                if sz is None:
                    sz = sizes[(op.tensor, rows, cols)] = _sectors(
                        rows, cols, t.cols, t.elem_bytes)
                write = isinstance(op, Store)
                touched[write] += sz[0]
                req = (key, sz[1], write)
                private = private_var is not None and private_var in (op.rows, op.cols)
                (cur_p if private else cur_s).append(req)
            elif isinstance(op, Loop):
                flush()
                ctx.loops[op.var] = op
                for i in loop_range(op, ctx):
                    ctx.idx[op.var] = i
                    visit(op.body)
                    flush()
                ctx.idx.pop(op.var, None)
                ctx.loops.pop(op.var)

    visit(ops)
    flush()
    return steps


class _LRU:
    """Fully associative LRU over tiles, write-back, write-allocate, and a dirty line's
    home half (module doc, "Dirty lines"): the lines in LRU order are split in two, the
    ``recent`` ones (their weight, 2 bytes per byte of a line only read and 1 per byte of a
    line written, at most the capacity) and the ``older`` ones, all clean. A dirty line
    that falls out of ``recent`` is written back to DRAM and stays, clean. Which lines are
    held, and so every DRAM read, is the plain LRU's: the split decides only when a dirty
    line's bytes reach DRAM. A line is ``[bytes, dirty, weight]``."""

    READ_WEIGHT, WRITTEN_WEIGHT = 2, 1

    def __init__(self, capacity: int, traffic: LaunchTraffic):
        self.capacity, self.t = capacity, traffic
        self.recent: OrderedDict = OrderedDict()
        self.older: OrderedDict = OrderedDict()
        self.used = 0               # bytes of both parts
        self.weight = 0             # weight of ``recent``

    def __len__(self) -> int:
        return len(self.recent) + len(self.older)

    def access(self, key, nbytes: int, write: bool) -> None:
        recent = self.recent
        line = recent.get(key)
        if line is not None:
            recent.move_to_end(key)
        else:
            line = self.older.pop(key, None)
            if line is not None:
                recent[key] = line
                self.weight += line[0] * line[2]
        if line is None:
            if not write:
                self.t.dram_read_bytes += nbytes
            w = self.WRITTEN_WEIGHT if write else self.READ_WEIGHT
            recent[key] = [nbytes, write, w]
            self.used += nbytes
            self.weight += nbytes * w
        elif write:
            line[1] = True
            if line[2] != self.WRITTEN_WEIGHT:
                self.weight -= line[0] * (line[2] - self.WRITTEN_WEIGHT)
                line[2] = self.WRITTEN_WEIGHT
        cap = self.capacity
        while self.weight > cap and recent:          # out of its home half: written back
            k, old = recent.popitem(last=False)
            self.weight -= old[0] * old[2]
            if old[1]:
                self.t.dram_write_bytes += old[0]
                old[1] = False
            self.older[k] = old
        while self.used > cap and (self.older or recent):      # out of the L2
            if self.older:
                _, old = self.older.popitem(last=False)
            else:
                _, old = recent.popitem(last=False)
                self.weight -= old[0] * old[2]
                if old[1]:
                    self.t.dram_write_bytes += old[0]
            self.used -= old[0]

    def dirty_bytes(self) -> int:
        return sum(line[0] for line in self.recent.values() if line[1])

    def state(self) -> tuple:
        """Both parts, in order: what a later state must equal to repeat this one."""
        return self.recent, self.older


def note_request(step_keys: dict, k, nb: int, write: bool) -> None:
    """Merge one request into this step's: a tile read and written in one step (flash1's
    O_i) is read from DRAM first if it misses, then made dirty."""
    seen = step_keys.get(k)
    if seen is None:
        step_keys[k] = [nb, not write, write]
    elif write:
        seen[2] = True
    else:
        seen[1] = True


def _simulate(label: str, programs: list, heads: int, slots: int, capacity: int) -> LaunchTraffic:
    """Run one launch: ``programs[i]`` is block i's steps (the same for every head; keys get
    the head prepended). Blocks start in launch order (i fastest, then head)."""
    nblocks = len(programs)
    t = LaunchTraffic(label, nblocks * heads)
    # Symmetry: with one block per head and every head resident at once, all heads step
    # together on disjoint data, so one head with 1/heads of the cache behaves the same.
    if nblocks == 1 and heads <= slots and heads > 1:
        one = _simulate(label, programs, 1, 1, capacity // heads)
        for name in ("l2_read_bytes", "l2_write_bytes", "dram_read_bytes",
                     "dram_write_bytes", "dirty_at_end_bytes"):
            setattr(t, name, heads * getattr(one, name))
        t.steps = one.steps
        return t
    lru = _LRU(capacity, t)
    pending = ((h, i) for h in range(heads) for i in range(nblocks))
    groups: list = []           # [head, [steps of each resident block], position]
    free = slots
    exhausted = False
    rd = wr = 0
    while True:
        if free and not exhausted:
            started: dict = {}
            while free:
                nxt = next(pending, None)
                if nxt is None:
                    exhausted = True
                    break
                h, i = nxt
                started.setdefault(h, []).append(programs[i])
                free -= 1
            groups += [[h, members, 0] for h, members in started.items()]
        if not groups:
            break
        t.steps += 1
        step_keys: dict = {}
        merged: set = set()
        alive = []
        for g in groups:
            h, members, pos = g
            still = []
            for m in members:
                shared, private, rb, wb = m[pos]
                rd += rb
                wr += wb
                if shared and (h, id(shared)) not in merged:
                    merged.add((h, id(shared)))
                    for key, nb, w in shared:
                        note_request(step_keys, (h,) + key, nb, w)
                for key, nb, w in private:
                    note_request(step_keys, (h,) + key, nb, w)
                if len(m) > pos + 1:
                    still.append(m)
            free += len(members) - len(still)
            if still:
                g[1], g[2] = still, pos + 1
                alive.append(g)
        groups = alive
        for k, (nb, r, w) in step_keys.items():
            if r:                       # a step loads before it stores
                lru.access(k, nb, False)
            if w:
                lru.access(k, nb, True)
    t.l2_read_bytes, t.l2_write_bytes = rd, wr
    t.dirty_at_end_bytes = lru.dirty_bytes()
    return t


# The most work one call may do: cache accesses (after folding, see l2_lockstep) plus
# state comparisons by the line. One costs 2-5 us of CPU here: at most about 15 s.
WORK_LIMIT = 3_000_000


def simulate(plan, *, l2_bytes: int | None = None, sms: int | None = None,
             blocks_per_sm: int | dict | None = None, method: str = "auto",
             work_limit: int | None = WORK_LIMIT, budget=None) -> L2Report:
    """Predict L2 request bytes and DRAM bytes for ``plan`` on its GPU preset.

    ``l2_bytes`` and ``sms`` default to the plan's GPU preset. ``blocks_per_sm`` (resident
    blocks per SM, an int or ``{launch label: int}``) defaults to what the plan's SRAM
    working set allows in the SM's shared memory (and, when the plan places buffers in
    registers, what its register part allows in the SM's register file), at most 32.

    ``method="steps"`` steps through every block's program (the definition, kept as the
    oracle); ``"auto"`` gives the same numbers, folding repeated waves and iterations of
    lockstep launches (:mod:`flashsim.hardware.l2_lockstep`). Either stops with a
    FlashsimError, before returning anything, past ``work_limit`` cache accesses (None:
    no limit; or the limit of ``budget``, an ``l2_lockstep.Budget`` several calls share).
    """
    from . import l2_lockstep
    g = plan.gpu or _gpu(DEFAULT_GPU)
    cap = g.l2_bytes if l2_bytes is None else l2_bytes
    n_sms = g.sms if sms is None else sms
    if cap <= 0 or n_sms <= 0:
        raise FlashsimError("L2 size and SM count must be positive")
    if method not in ("auto", "steps"):
        raise FlashsimError(f"unknown method {method!r}: choose auto or steps")
    nest = plan.nest()
    heads = plan.batch * plan.heads
    if blocks_per_sm is None:
        ws = sum(b for _, b in plan.working_set())
        regs = sum(b for _, b in plan.register_set())
        default_bps = max(1, min(32, g.sram_per_sm // max(ws, 1),
                                 g.register_bytes_per_sm // max(regs, 1)))
    report = L2Report(cap, default_bps if blocks_per_sm is None else blocks_per_sm, n_sms)
    sizes: dict = {}                    # tile -> (touched, owned) bytes (l2_lockstep keys its own)
    intern: dict = {}
    budget = budget if budget is not None else l2_lockstep.Budget(work_limit)
    # Blocks out of lockstep (a causal mask) are stepped request by request: each such
    # launch claims its tile loads and stores (counted without values, nest.count_scope)
    # from the budget, all of them before anything is simulated, so that a run the limit
    # would stop is refused up front.
    why = ("method='steps'" if method == "steps" else
           "a causal mask keeps its blocks out of lockstep, so nothing folds")
    plan_launches, stepped = list(launches(nest)), {}
    for i, launch in enumerate(plan_launches):
        if not (method == "auto" and l2_lockstep.applies(launch)):
            scope = (launch.loop,) if launch.loop is not None else launch.ops
            stepped[i] = heads * count_scope(scope, nest.tensors, launch.context()).transfers
    if len(stepped) > 1:
        budget.check(sum(stepped.values()), f"{len(stepped)} launches", why)
    done: dict = {}                     # launch class -> its traffic (method "auto")
    for i, launch in enumerate(plan_launches):
        if isinstance(blocks_per_sm, dict):
            bps = blocks_per_sm[launch.label]
        else:
            bps = default_bps if blocks_per_sm is None else blocks_per_sm
        key = l2_lockstep.launch_class(launch, nest.tensors) if method == "auto" else None
        if key is not None and key in done:
            report.launches.append(replace(done[key]))
            continue
        if method == "auto" and l2_lockstep.applies(launch):
            report.launches.append(l2_lockstep.simulate_launch(
                launch, nest.tensors, heads, n_sms * bps, cap, sizes, budget))
            if key is not None:
                done[key] = report.launches[-1]
            continue
        budget.reserve(stepped[i], launch.label, why)
        programs = [block_steps(launch.ops, nest.tensors, ctx, launch.var, sizes, intern)
                    for ctx in blocks(launch)]
        report.launches.append(_simulate(launch.label, programs, heads, n_sms * bps, cap))
    return report
