"""The L2 model for lockstep launches, fast: the same numbers as stepping every block.

:mod:`flashsim.hardware.l2` steps through every thread block's program (``_simulate``);
its memory and time grow with the number of (Q block, K/V block) pairs, N^2. This module
gives the same :class:`~flashsim.hardware.l2.LaunchTraffic`, field for field, for the
launches where every block of a head runs the same number of steps: no loop inside the
launch has a ``start``/``stop`` bound (no causal skipping), or the launch is one block per
head. Then the schedule is **waves**: ``slots`` consecutive blocks start together, run in
lockstep and end together, and the next ``slots`` blocks start. A wave's steps are walked
once for all its blocks (shared tiles once per head, each block's own tiles per block),
with no per-block program in memory.

Two facts make it fast, and neither is an approximation:

1. **Equivariance.** The cache only compares keys. Rename every key by a bijection phi
   (here a translation: shift the row or column offset of the tiles indexed by one loop
   variable by a whole number of blocks, or shift the head), apply phi to the state and to
   the requests, and the simulation runs the same way: same hits, same misses, same
   bytes, and the renamed final state.
2. **Periodic requests.** Iteration k + p of a loop over full blocks makes exactly the
   requests of iteration k renamed by the shift of p blocks, when nothing inside the loop
   has a bound (the ranges inside do not move), each tensor dimension indexed by the loop
   variable is indexed by nothing else in the launch, and p blocks move a tile by a whole
   number of 32-byte sectors (so its sector bytes do not change). The same holds for a
   wave and the wave p waves later inside one head's full blocks, and for a wave and the
   one that starts at the same place of a later head.

So when the state (the LRU order of (key, bytes, dirty)) at iteration k, written relative
to k, equals the state at iteration k - p written relative to k - p, every later period
up to the last full block repeats the last one: its DRAM and L2 bytes and steps are added
m times at once and the state is renamed by m periods. It happens as soon as the cache
has turned over once inside the loop (everything in it was touched in this loop), which
takes about ``capacity / bytes per iteration`` iterations; the check is made at
exponentially spaced iterations, so it costs O(log) state comparisons.

The same renaming makes **launches of one loop of launches** (``Loop.launch_per_iteration``:
flash1's version 2, a launch per K/V block j) repeat. Each launch starts from a clean L2, so
two launches j and j' whose thread blocks are the same, whose block of j has the same extent
and whose tiles indexed by j sit at the same place in their 32-byte sectors (j = j' modulo
the period above), and where nothing else indexes those dimensions, make the same requests
renamed: the same traffic, field for field (:func:`launch_class`). T_c launches are then
simulated as a few: one for the full blocks of each sector phase, one for the ragged last.

``tests/test_l2.py`` holds this engine equal to the stepping one over a grid of shapes
(ragged N, fp16 rows that straddle sectors, several heads per wave, several waves per
head, caches from one tile to everything).
"""

from __future__ import annotations

from collections import OrderedDict
from math import gcd

from ..errors import FlashsimError
from ..nest import Load, Loop, Store, full_blocks, has_bounds, loop_range, span
from .l2 import note_request

SECTOR = 32


def launch_class(launch, tensors: dict) -> tuple | None:
    """A key that two launches of one loop of launches share exactly when one makes the
    other's requests renamed (module doc): the same label and ops, the same thread blocks,
    and for each outer loop the same block extent and sector phase. None for a launch of
    the nest's top level, or where a dimension its outer index selects is also selected
    otherwise, or a loop inside has bounds (then each launch stands alone)."""
    if not launch.outer or has_bounds(launch.ops):
        return None
    dims = _dims(launch.ops, {})
    ctx = launch.context()
    key: list = [launch.label, id(launch.ops)]
    for loop, k in launch.outer:
        shifts = []
        for (tensor, axis), used in dims.items():
            if loop.var not in used:
                continue
            if used != {loop.var}:
                return None
            t = tensors[tensor]
            shifts.append(loop.block * (t.cols if axis == 0 else 1) * t.elem_bytes)
        key += [k % _period(shifts), ctx.extent(loop.var)]
    if launch.loop is not None:
        ctx.loops[launch.var] = launch.loop
        key.append(tuple(loop_range(launch.loop, ctx)))
    return tuple(key)


def applies(launch) -> bool:
    """Whether every block of ``launch`` (of every head) runs the same steps in lockstep."""
    return launch.loop is None or not has_bounds(launch.ops)


class Budget:
    """Work the simulation may do (cache accesses and state comparisons, by the line)
    before it stops with a FlashsimError: a stated limit instead of a run without end."""

    def __init__(self, limit: int | None):
        self.limit, self.used = (float("inf") if limit is None else limit), 0

    def spend(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise FlashsimError(
                f"the L2 model stopped at its limit of {self.limit:,} cache accesses: the "
                "schedule does not repeat soon enough to be folded (small tiles or many "
                "heads at this N); use larger blocks, a smaller N or fewer heads, or leave "
                "out --gpu/--l2 (the two-level counts need no cache model)")

    def reserve(self, n: int, label: str, why: str) -> None:
        """Claim ``n`` accesses for a launch that is stepped block by block, before
        stepping it (``why`` it cannot be folded, for the message)."""
        self.check(n, label, why)
        self.used += n

    def check(self, n: int, label: str, why: str) -> None:
        """Raise if ``n`` more accesses would pass the limit (claims nothing)."""
        if self.used + n > self.limit:
            raise FlashsimError(
                f"the L2 model would step through {n:,} tile requests one by one for "
                f"'{label}' ({why}), more than its limit of {self.limit:,}; use a smaller "
                "N, larger blocks or fewer heads, or leave out --gpu/--l2 (the two-level "
                "counts need no cache model)")


def _period(shift_bytes: list[int]) -> int:
    """The fewest periods after which every shift is a whole number of sectors."""
    p = 1
    for s in shift_bytes:
        q = SECTOR // gcd(s, SECTOR)
        p = p * q // gcd(p, q)
    return p


def _dims(ops: tuple, out: dict) -> dict:
    """``{(tensor, axis): {vars}}`` over every load and store in ``ops`` (axis 0: rows,
    1: columns; the var None for a whole dimension)."""
    for op in ops:
        if isinstance(op, (Load, Store)):
            out.setdefault((op.tensor, 0), set()).add(op.rows)
            out.setdefault((op.tensor, 1), set()).add(op.cols)
        elif isinstance(op, Loop):
            _dims(op.body, out)
    return out


class _Engine:
    def __init__(self, launch, tensors: dict, traffic, capacity: int, sizes: dict,
                 budget: Budget):
        from .l2 import _LRU, _sectors
        self.sectors = _sectors
        self.launch, self.tensors, self.t, self.sizes, self.budget = (
            launch, tensors, traffic, sizes, budget)
        self.lru = _LRU(capacity, traffic)
        self.rd = self.wr = 0
        self.ctx = launch.context()
        self.pvar = launch.var
        if launch.loop is not None:
            self.ctx.loops[self.pvar] = launch.loop
        self.dims = _dims(launch.ops, {})
        self.period: dict = {}              # id(loop) -> (p, {tensor: (dr, dc)}) or None
        self._plan_loops(launch.ops)

    def may_record(self, since: int) -> bool:
        """Whether writing out the state now costs at most a quarter of the simulation done
        since ``since`` (the budget spent when this loop last wrote it out), so that
        comparisons add at most about half to the work."""
        return self.budget.used - since >= 4 * len(self.lru)

    # -- which loops repeat, and by how much a block moves each tensor ----------------
    def _unit(self, var: str, block: int):
        """``(period, {tensor: (row shift, col shift)})`` for one block of ``var``, or None
        when a dimension indexed by ``var`` is also indexed otherwise (no translation)."""
        unit, shifts = {}, []
        for (tensor, axis), used in self.dims.items():
            if var not in used:
                continue
            if used != {var}:
                return None
            t = self.tensors[tensor]
            dr, dc = unit.get(tensor, (0, 0))
            if axis == 0:
                dr = block
                shifts.append(block * t.cols * t.elem_bytes)
            else:
                dc = block
                shifts.append(block * t.elem_bytes)
            unit[tensor] = (dr, dc)
        return _period(shifts), unit

    def _plan_loops(self, ops: tuple) -> None:
        for op in ops:
            if isinstance(op, Loop):
                ok = not has_bounds(op.body) and op.var != self.pvar
                self.period[id(op)] = self._unit(op.var, op.block) if ok else None
                self._plan_loops(op.body)

    # -- the state, written relative to a position -----------------------------------
    def canonical(self, dh: int, unit: dict, k: int) -> list:
        """The cache's lines in LRU order, heads counted from ``dh`` and each tensor's
        offsets from ``k`` times its ``unit`` shift."""
        self.budget.spend(len(self.lru))
        out = []
        for part in self.lru.state():
            for (h, tensor, r, c), (nb, dirty, w) in part.items():
                s = unit.get(tensor)
                if s is not None:
                    r -= k * s[0]
                    c -= k * s[1]
                out.append((h - dh, tensor, r, c, nb, dirty, w))
            out.append(None)                # where the recent lines end
        return out

    def counters(self) -> tuple:
        t = self.t
        return (t.dram_read_bytes, t.dram_write_bytes, self.rd, self.wr, t.steps)

    def skip(self, m: int, before: tuple, dh: int, unit: dict, k: int) -> None:
        """Add ``m`` more periods like the one since ``before``, and rename the state by
        ``m`` periods: heads by ``m dh``, offsets by ``m k`` unit shifts."""
        now = self.counters()
        d = [m * (a - b) for a, b in zip(now, before)]
        t = self.t
        t.dram_read_bytes += d[0]
        t.dram_write_bytes += d[1]
        self.rd += d[2]
        self.wr += d[3]
        t.steps += d[4]
        self.budget.spend(len(self.lru))
        parts = []
        for part in self.lru.state():
            lines = OrderedDict()
            for (h, tensor, r, c), line in part.items():
                s = unit.get(tensor)
                if s is not None:
                    r += m * k * s[0]
                    c += m * k * s[1]
                lines[(h + m * dh, tensor, r, c)] = line
            parts.append(lines)
        self.lru.recent, self.lru.older = parts

    # -- one wave: the launch's ops walked once for all its blocks -------------------
    def run(self, ops: tuple, groups: list) -> None:
        cur: list = []
        for op in ops:
            if isinstance(op, (Load, Store)):
                cur.append(op)
            elif isinstance(op, Loop):
                if cur:
                    self.step(cur, groups)
                    cur = []
                self.loop(op, groups)
        if cur:
            self.step(cur, groups)

    def loop(self, op: Loop, groups: list) -> None:
        ctx = self.ctx
        ctx.loops[op.var] = op
        rng = loop_range(op, ctx)
        info = self.period.get(id(op))
        k, stop = rng.start, rng.stop
        if info is None:
            for k in rng:
                ctx.idx[op.var] = k
                self.run(op.body, groups)
        else:
            p, unit = info
            full_end = min(stop, full_blocks(op))
            pending = None                  # (k, canonical state, counters), compared at k + p
            since = self.budget.used
            while k < stop:
                if pending is not None and k == pending[0] + p:
                    if self.canonical(0, unit, k) == pending[1]:
                        # iterations k-p .. k-1 were full blocks and the state repeated:
                        # every later period of full blocks repeats them (module doc)
                        m = (full_end - k) // p
                        self.skip(m, pending[2], 0, unit, p)
                        k += m * p
                        full_end = -1                     # nothing left to fold
                    pending = None
                elif pending is None and k + p <= full_end and self.may_record(since):
                    pending = (k, self.canonical(0, unit, k), self.counters())
                    since = self.budget.used
                if k >= stop:
                    break
                ctx.idx[op.var] = k
                self.run(op.body, groups)
                k += 1
        ctx.idx.pop(op.var, None)
        ctx.loops.pop(op.var)

    def step(self, ops: list, groups: list) -> None:
        """One step of every block in the wave: the requests of ``ops``, shared tiles once
        per head and each block's own tiles, merged and sent through the LRU exactly as
        ``l2._simulate`` and ``l2._LRU.access`` do."""
        ctx, tensors, sizes, sectors = self.ctx, self.tensors, self.sizes, self.sectors
        pvar = self.pvar
        shared, private = [], []
        srb = swb = 0
        for op in ops:
            t = tensors[op.tensor]
            write = isinstance(op, Store)
            if pvar is not None and pvar in (op.rows, op.cols):
                rows = None if op.rows == pvar else span(ctx, op.rows, t.rows)
                cols = None if op.cols == pvar else span(ctx, op.cols, t.cols)
                private.append((op.tensor, t.cols, t.elem_bytes, write, rows, cols))
                continue
            rows, cols = span(ctx, op.rows, t.rows), span(ctx, op.cols, t.cols)
            # A tile's sectors depend on where its first byte falls in a sector, its rows
            # and its row length (each row starts t.cols * b bytes after the last).
            size_key = (op.tensor, (rows[0] * t.cols + cols[0]) * t.elem_bytes % SECTOR,
                        rows[1] - rows[0], cols[1] - cols[0])
            sz = sizes.get(size_key)
            if sz is None:
                sz = sizes[size_key] = sectors(rows, cols, t.cols, t.elem_bytes)
            nb = sz[0]                      # requested; the cache holds the owned sz[1]
            shared.append((op.tensor, rows[0], cols[0], sz[1], write))
            if write:
                swb += nb
            else:
                srb += nb
        # This step's requests: key -> [bytes, read, written]; the first request of a key
        # fixes its place (a block's shared tiles, then its own, block after block).
        reqs: dict = {}
        rd = wr = 0
        for h, members, owns in groups:
            for tensor, r0, c0, nb, write in shared:
                note_request(reqs, (h, tensor, r0, c0), nb, write)
            rd += len(members) * srb
            wr += len(members) * swb
            if not private:
                continue
            for own in owns:
                for tensor, width, b, write, rows, cols in private:
                    rows = own if rows is None else rows
                    cols = own if cols is None else cols
                    size_key = (tensor, (rows[0] * width + cols[0]) * b % SECTOR,
                                rows[1] - rows[0], cols[1] - cols[0])
                    sz = sizes.get(size_key)
                    if sz is None:
                        sz = sizes[size_key] = sectors(rows, cols, width, b)
                    note_request(reqs, (h, tensor, rows[0], cols[0]), sz[1], write)
                    nb = sz[0]
                    if write:
                        wr += nb
                    else:
                        rd += nb
        self.rd += rd
        self.wr += wr
        self.t.steps += 1
        self.budget.spend(len(reqs))
        access = self.lru.access
        for key, (nb, r, w) in reqs.items():
            # a step loads before it stores (l2._LRU.access: write-back, write-allocate)
            if r:
                access(key, nb, False)
            if w:
                access(key, nb, True)


def simulate_launch(launch, tensors: dict, heads: int, slots: int, capacity: int,
                    sizes: dict, budget: Budget):
    """One lockstep launch (``applies(launch)``), as ``l2._simulate`` would run it."""
    from .l2 import LaunchTraffic
    ctx = launch.context()
    if launch.loop is not None:
        ctx.loops[launch.var] = launch.loop
        idxs = loop_range(launch.loop, ctx)
    else:
        idxs = range(1)
    G = len(idxs)
    t = LaunchTraffic(launch.label, G * heads)
    if G == 1 and 1 < heads <= slots:       # l2._simulate's symmetry: one head, 1/heads
        one = simulate_launch(launch, tensors, 1, 1, capacity // heads, sizes, budget)
        for name in ("l2_read_bytes", "l2_write_bytes", "dram_read_bytes",
                     "dram_write_bytes", "dirty_at_end_bytes"):
            setattr(t, name, heads * getattr(one, name))
        t.steps = one.steps
        return t
    e = _Engine(launch, tensors, t, capacity, sizes, budget)
    total, S = G * heads, slots
    complete_end = total // S * S           # the waves before this point have S blocks
    # Folding waves inside a head needs the shift of the blocks' own tiles (None when a
    # dimension they index is also indexed otherwise); folding heads needs only the head.
    if launch.loop is not None:
        wave_unit = e._unit(launch.var, launch.loop.block)
        nfull = max(0, min(idxs.stop, full_blocks(launch.loop)) - idxs.start)
    else:
        wave_unit, nfull = (1, {}), 1
    unit = {} if wave_unit is None else wave_unit[1]
    pending = None                          # (g, state, counters, head): a full wave
    by_offset: dict = {}                    # a head's first recorded wave start, by offset
    stored, last_h, since = 0, -1, 0
    g = 0
    while g < total:                        # g: the wave's first block, counted over heads
        h, i = divmod(g, G)
        full_wave = wave_unit is not None and i + S <= nfull   # S full blocks of head h
        if pending is not None and (not full_wave or pending[3] != h
                                    or g - pending[0] > wave_unit[0] * S):
            pending = None                  # only waves inside one head's full blocks
        if pending is not None and g - pending[0] == wave_unit[0] * S:
            period = g - pending[0]         # waves of one head's full blocks repeat
            if e.canonical(h, unit, i) == pending[1]:
                m = (nfull - i) // period
                if m:
                    e.skip(m, pending[2], 0, unit, period)
                    g += m * period
                    pending = None
                    continue
            pending = None
        if g < complete_end and e.may_record(since):
            canon = e.canonical(h, unit, i)
            since = budget.used
            if h != last_h:                 # the first state written out in head h
                old = by_offset.get(i)
                if old is not None and old[1] == canon:
                    period = g - old[0]     # whole heads: every wave repeats, heads renamed
                    m = (complete_end - g) // period
                    if m:
                        e.skip(m, old[2], period // G, {}, 0)
                        g += m * period
                        by_offset.clear()
                        stored, last_h, pending = 0, -1, None
                        continue
                if stored + len(canon) <= 2_000_000:
                    by_offset[i] = (g, canon, e.counters())
                    stored += len(canon)
                last_h = h
            if full_wave and pending is None:
                pending = (g, canon, e.counters(), h)
        end = min(g + S, total)
        groups = []
        B = launch.loop.block if launch.loop is not None else 0
        X = launch.loop.extent if launch.loop is not None else 0
        for hh in range(h, (end - 1) // G + 1):
            lo, hi = max(g, hh * G) - hh * G, min(end, (hh + 1) * G) - hh * G
            members = [idxs[x] for x in range(lo, hi)]
            owns = [(k * B, min(k * B + B, X)) for k in members] if B else []
            groups.append((hh, members, owns))
        e.run(launch.ops, groups)
        g = end
    t.l2_read_bytes, t.l2_write_bytes = e.rd, e.wr
    t.dirty_at_end_bytes = e.lru.dirty_bytes()
    return t
