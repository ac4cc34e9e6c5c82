"""How one thread block of a FlashAttention-2 forward spends its cycles on one SM, under the
schedules FlashAttention-2 and -3 use: which unit works when, and how long the block takes.

Each K/V block j costs four phases, in cycles of one SM (``phases``):

    gemm0    S_ij = Q_i K_j^T on the tensor cores        2 B_r B_c d / (tensor FLOPs per clock)
    softmax  the online softmax on the special-function   max(exponentials / (SFU per clock),
             units (exponentials) and the fp32 units       other ops / (fp32 per clock))
             (max, subtract, sum, the O_i rescale)
    gemm1    O_i += P_ij V_j on the tensor cores          as gemm0
    load     K_j and V_j into shared memory               2 B_c d b / (bytes per clock per SM)

with the counts of the loop nest itself (the flash2 Compute ops of one tile: exponentials
B_r B_c + B_r, operations 5 B_r B_c + (3 + d) B_r) and the per-clock rates of the GPU preset.
Loads come from the L2 (every Q block of a head re-reads the same K, V), at the time model's
L2 bandwidth shared by the SMs (``flashsim.hardware.timing.Efficiency.l2_bandwidth``).

Three resources, each doing one thing at a time: ``tensor`` (the tensor cores), ``softmax``
(the special-function and fp32 units), ``memory`` (the block's share of the L2). A schedule
is a list of tasks in the order the kernel issues them, each with the tasks it waits for;
every resource serves its tasks in that order (``simulate``). Schedules (``SCHEDULES``):

    sequential      FlashAttention-2: gemm0, softmax, gemm1, one after the other. All warps of
                    the block move together (a barrier per K/V block keeps them in step), so
                    nothing overlaps but the loads
    pingpong        FlashAttention-3, Section 3.1: two warp groups of B_r / 2 rows; barriers
                    order the tensor cores so that warp group 1's GEMMs (gemm1 of block j,
                    gemm0 of block j + 1) run while warp group 2 does its softmax, and back
    intra           FlashAttention-3, Section 3.2 (Algorithm 2): one warp group issues
                    gemm0 of block j + 1, then gemm1 of block j, and runs the softmax of
                    block j + 1 while gemm1 of block j is on the tensor cores
    pingpong+intra  both: FlashAttention-3 as released

and loads (``LOADS``):

    blocking        load K_j, V_j, wait, compute (our kernel's v1): no overlap
    prefetch        cp.async with one buffer each for K and V (FlashAttention-2, our v2, v3,
                    v5): V_j loads during gemm0 and the softmax, K_{j+1} during gemm1
    double          K and V double-buffered by the compute warps (our v4): K_{j+1}, V_{j+1}
                    load during all of block j
    producer        warp specialisation (FlashAttention-3, Algorithm 1): a producer warp
                    fills a circular buffer of ``stages`` K/V stages, each released when its
                    gemm1 is done; the stages must fit in shared memory with Q_i

A unit-throughput model: each phase runs at its unit's full rate, overlap is perfect where
the schedule allows it and absent where it does not. Latencies, issue slots, register
pressure and the partial overlap that warps find on their own are outside it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import FlashsimError
from ..nest import Ctx, Loop, count_scope
from .presets import GPU, gpu as _gpu
from .timing import Efficiency, busiest_sm

SCHEDULES = ("sequential", "pingpong", "intra", "pingpong+intra")
LOADS = ("blocking", "prefetch", "double", "producer")
RESOURCES = ("tensor", "softmax", "memory")


@dataclass(frozen=True)
class Phases:
    """Cycles of one K/V block for the whole thread block (B_r rows), and their counts."""
    gemm0: float
    softmax: float
    gemm1: float
    load: float
    exps: int
    other_ops: int
    flops: int
    load_bytes: int
    finish: float           # O_i / l_i and the logsumexp, after the loop
    block_rows: int
    block_cols: int
    head_dim: int

    def scaled(self, rows_fraction: float) -> "Phases":
        """The phases of a warp group holding ``rows_fraction`` of the rows (pingpong)."""
        f = rows_fraction
        return Phases(self.gemm0 * f, self.softmax * f, self.gemm1 * f, self.load,
                      round(self.exps * f), round(self.other_ops * f), round(self.flops * f),
                      self.load_bytes, self.finish * f, round(self.block_rows * f),
                      self.block_cols, self.head_dim)


@functools.lru_cache(maxsize=64)
def tile_counts(head_dim: int, block_rows: int, block_cols: int) -> dict:
    """Matmul FLOPs, exponentials and non-matmul operations of one full B_r x B_c tile of
    the flash2 forward, counted by the loop nest's engine (``count_scope`` over the inner
    loop's body with both blocks full)."""
    from ..plan import plan as _plan
    n = max(block_rows, block_cols)
    p = _plan("flash2", n, head_dim, block_rows=block_rows, block_cols=block_cols,
              sram=1 << 30, dtype="fp16")
    nest = p.nest()
    outer = nest.body[0]
    inner = next(op for op in outer.body if isinstance(op, Loop))
    ctx = Ctx()
    ctx.loops.update({"i": outer, "j": inner})
    ctx.idx.update({"i": 0, "j": 0})
    c = count_scope(inner.body, nest.tensors, ctx)
    return {"flops": c.flops, "exps": c.exp_ops, "nonmatmul": c.nonmatmul_flops,
            "load_bytes": sum(c.read.values())}


def phases(head_dim: int, block_rows: int, block_cols: int, gpu: str | GPU = "h200",
           dtype: str = "fp16", l2_bandwidth: float | None = None) -> Phases:
    """The four phases of one K/V block, in cycles of one SM (see the module docstring).
    ``dtype`` "fp8" doubles the tensor rate on Hopper (the exponentials stay as they are)."""
    g = _gpu(gpu) if isinstance(gpu, str) else gpu
    if dtype not in ("fp16", "bf16", "fp8"):
        raise FlashsimError(f"schedules model fp16, bf16 or fp8 tensor cores, not {dtype!r}")
    tensor = g.tensor_fp8_flops_per_clk_sm if dtype == "fp8" else g.tensor_flops_per_clk_sm
    if not tensor:
        raise FlashsimError(f"{g.name} has no {dtype} tensor-core rate in its preset")
    c = tile_counts(head_dim, block_rows, block_cols)
    b = 1 if dtype == "fp8" else 2
    load_bytes = c["load_bytes"] // 2 * b      # K_j and V_j (the count is fp16's)
    bw = Efficiency().l2_bandwidth if l2_bandwidth is None else l2_bandwidth
    per_clk = bw / (g.sms * g.tensor_clock_hz)
    other = c["nonmatmul"] - c["exps"]
    return Phases(gemm0=c["flops"] / 2 / tensor,
                  softmax=max(c["exps"] / g.sfu_ops_per_clk_sm, other / g.fp32_ops_per_clk_sm),
                  gemm1=c["flops"] / 2 / tensor, load=load_bytes / per_clk,
                  exps=c["exps"], other_ops=other, flops=c["flops"], load_bytes=load_bytes,
                  finish=block_rows * (head_dim + 2) / g.fp32_ops_per_clk_sm,
                  block_rows=block_rows, block_cols=block_cols, head_dim=head_dim)


@dataclass
class Task:
    name: str
    resource: str
    duration: float
    deps: tuple = ()
    unit: int = 0           # warp group (0 or 1); -1 for the producer / shared loads
    block: int = 0          # K/V block j
    start: float = 0.0
    end: float = 0.0


@dataclass
class Timeline:
    """The tasks of one thread block with their start and end cycles."""
    tasks: list
    schedule: str
    loads: str
    stages: int
    phases: Phases
    cycles: float = 0.0
    busy: dict = field(default_factory=dict)

    def utilisation(self) -> dict:
        """Fraction of the block's cycles each resource is busy."""
        return {r: self.busy.get(r, 0.0) / self.cycles for r in RESOURCES}


def simulate(tasks: list) -> float:
    """Start every task as soon as its dependencies are done and its resource is free,
    each resource serving tasks in list order (the kernel's issue order)."""
    free = {r: 0.0 for r in RESOURCES}
    done: dict[str, float] = {}
    for t in tasks:
        missing = [d for d in t.deps if d not in done]
        if missing:            # pragma: no cover - the builders list tasks in a valid order
            raise FlashsimError(f"task {t.name} waits for {missing}, not issued before it")
        t.start = max([free[t.resource]] + [done[d] for d in t.deps])
        t.end = t.start + t.duration
        free[t.resource] = t.end
        done[t.name] = t.end
    return max(t.end for t in tasks)


def max_stages(head_dim: int, block_rows: int, block_cols: int, sram: int, b: int = 2) -> int:
    """K/V stages (one K_j and one V_j each) that fit in ``sram`` bytes beside Q_i."""
    return max(0, (sram - block_rows * head_dim * b) // (2 * block_cols * head_dim * b))


def _load_deps(loads: str, j: int, which: str, units: int, intra: bool, stages: int) -> list:
    """What the load of K_j (``which`` "K") or V_j ("V") waits for: its buffer to be free
    (the GEMM that read the block it replaces) and, for loads the compute warps issue, the
    point of the program where they issue it."""
    def every(name, jj):
        return [f"{name}.{u}.{jj}" for u in range(units)] if jj >= 0 else []

    if loads == "blocking":                  # after the block before is done, K then V
        return every("g1", j - 1) if which == "K" else [f"K{j}"]
    if loads == "prefetch":                  # one buffer each (FlashAttention-2, our v2)
        if which == "V":
            return every("g1", j - 1)
        if j == 0:
            return []
        # our kernel waits for V_{j-1} after the softmax, then issues K_j into K_{j-1}'s
        # buffer; a pipelined (intra) loop can issue it once gemm0 has read K_{j-1}
        return every("g0", j - 1) if intra else every("s", j - 1) + [f"V{j - 1}"]
    if loads == "double":                    # two buffers each, issued a block ahead (v4)
        if which == "K":
            return every("g0", j - 2) + ([f"V{j - 1}"] if j else [])
        return every("g1", j - 2) + [f"K{j}"]
    return every("g0" if which == "K" else "g1", j - stages)    # producer, s stages each


def timeline(ph: Phases, kv_blocks: int, schedule: str = "sequential",
             loads: str = "prefetch", stages: int = 2) -> Timeline:
    """The thread block's tasks for ``kv_blocks`` K/V blocks under ``schedule`` and
    ``loads``, simulated. Q_i's load comes first, O_i's normalisation and store last
    (outside the main loop, as in every kernel). Loads are issued in the order K_0, V_0,
    K_1, V_1, ..., each as soon as what it waits for has been issued."""
    if schedule not in SCHEDULES:
        raise FlashsimError(f"unknown schedule {schedule!r}: choose from {', '.join(SCHEDULES)}")
    if loads not in LOADS:
        raise FlashsimError(f"unknown loads {loads!r}: choose from {', '.join(LOADS)}")
    if kv_blocks < 1:
        raise FlashsimError(f"kv_blocks must be at least 1, got {kv_blocks}")
    if loads == "producer" and stages < 1:
        raise FlashsimError(f"a producer needs at least one stage, got {stages}")
    if loads == "blocking" and schedule != "sequential":
        raise FlashsimError("blocking loads stop every warp: only the sequential schedule "
                            "issues them")
    T = kv_blocks
    units = 2 if schedule.startswith("pingpong") else 1
    part = ph.scaled(1 / units) if units == 2 else ph
    intra = schedule.endswith("intra")
    tasks: list[Task] = []
    issued: set = set()
    q_cycles = ph.load * ph.block_rows / (2 * ph.block_cols)          # Q_i: B_r d b bytes
    pending = [(w, j) for j in range(T) for w in ("K", "V")]
    deps_of = {f"{w}{j}": ["Q"] + _load_deps(loads, j, w, units, intra, stages)
               for w, j in pending}

    def add(name, resource, duration, deps=(), unit=0, block=0):
        for d in deps:
            if d not in issued:          # a load not issued yet: issue the ones before it
                flush(until=d)
        tasks.append(Task(name, resource, duration, tuple(deps), unit, block))
        issued.add(name)
        flush()

    def flush(until=None):
        while pending:
            w, j = pending[0]
            name = f"{w}{j}"
            if until != name and not all(d in issued for d in deps_of[name]):
                return
            if not all(d in issued for d in deps_of[name]):   # pragma: no cover
                raise FlashsimError(f"load {name} waits for work issued after its use")
            pending.pop(0)
            tasks.append(Task(name, "memory", ph.load / 2, tuple(deps_of[name]), -1, j))
            issued.add(name)
            if name == until:
                return

    def g0(u, j):
        return f"g0.{u}.{j}"

    def g1(u, j):
        return f"g1.{u}.{j}"

    def sm(u, j):
        return f"s.{u}.{j}"

    add("Q", "memory", q_cycles, unit=-1)
    for j in range(T + 1):
        for u in range(units):
            wait = [f"K{j}"] + ([f"V{j}"] if loads == "blocking" else [])
            if intra:         # Algorithm 2: gemm0 of j, gemm1 of j - 1, softmax of j
                if j < T:
                    add(g0(u, j), "tensor", part.gemm0,
                        wait + ([sm(u, j - 1)] if j else []) +
                        ([g1(u, j - 2)] if j >= 2 else []), u, j)
                if j:
                    add(g1(u, j - 1), "tensor", part.gemm1, [sm(u, j - 1), f"V{j - 1}"],
                        u, j - 1)
            else:             # gemm1 of j - 1, then gemm0 of j (pingpong's GEMM pair)
                if j:
                    add(g1(u, j - 1), "tensor", part.gemm1, [sm(u, j - 1), f"V{j - 1}"],
                        u, j - 1)
                if j < T:
                    add(g0(u, j), "tensor", part.gemm0,
                        wait + ([g1(u, j - 1)] if j else []), u, j)
            if j < T:
                add(sm(u, j), "softmax", part.softmax, [g0(u, j)], u, j)
    add("finish", "softmax", ph.finish, [g1(u, T - 1) for u in range(units)], -1, T - 1)
    add("O", "memory", q_cycles, ["finish"], -1, T - 1)
    tl = Timeline(tasks, schedule, loads, stages, ph)
    tl.cycles = simulate(tasks)
    for t in tasks:
        tl.busy[t.resource] = tl.busy.get(t.resource, 0.0) + t.duration
    return tl


def cycles_by_blocks(ph: Phases, max_blocks: int, schedule: str = "sequential",
                     loads: str = "prefetch", stages: int = 2) -> np.ndarray:
    """``c[n - 1]`` = ``timeline(ph, n, ...).cycles`` for every n = 1 .. ``max_blocks``.

    Sequential: from one timeline of ``max_blocks`` blocks. Its tasks are listed block after
    block and start in list order, so the tasks of blocks before n start and end as they
    would if the thread block stopped at n; it would then end with the normalisation after
    its last gemm1 and O_i's store after its last load. The overlapped schedules list
    gemm0 of block n before gemm1 of block n - 1 (or one warp group's tasks between the
    other's), so there each n gets its own timeline."""
    if schedule != "sequential":
        return np.array([timeline(ph, n, schedule, loads, stages).cycles
                         for n in range(1, max_blocks + 1)])
    tl = timeline(ph, max_blocks, schedule, loads, stages)
    g1 = np.zeros(max_blocks)
    load = np.zeros(max_blocks)
    q_end = 0.0
    for t in tl.tasks:
        if t.name.startswith("g1."):
            g1[t.block] = max(g1[t.block], t.end)
        elif t.resource == "memory" and t.name not in ("Q", "O"):
            load[t.block] = max(load[t.block], t.end)
        elif t.name == "Q":
            q_end = t.end
    q_cycles = ph.load * ph.block_rows / (2 * ph.block_cols)
    memory_free = np.maximum(np.maximum.accumulate(load), q_end)
    return np.maximum(g1 + ph.finish, memory_free) + q_cycles


@functools.lru_cache(maxsize=128)
def _cycles_by_blocks(ph, max_blocks, schedule, loads, stages):
    return cycles_by_blocks(ph, max_blocks, schedule, loads, stages)


def launch_seconds(seq_len: int, head_dim: int, *, batch: int = 1, heads: int = 1,
                   causal: bool = False, block_rows: int = 128, block_cols: int = 128,
                   schedule: str = "sequential", loads: str = "prefetch", stages: int = 2,
                   gpu: str = "h200", dtype: str = "fp16", blocks_per_sm: int = 1) -> dict:
    """Predicted seconds of one forward launch: every Q block is a thread block, handed to
    the SM that frees up first (``blocks_per_sm`` at a time share an SM's units, so an SM's
    time is the sum of its blocks' cycles); the launch takes as long as its busiest SM."""
    g = _gpu(gpu)
    ph = phases(head_dim, block_rows, block_cols, g, dtype)
    if loads == "producer":
        fit = max_stages(head_dim, block_rows, block_cols, g.sram_per_block,
                         1 if dtype == "fp8" else 2)
        if stages > fit:
            raise FlashsimError(f"{stages} K/V stages of {block_cols} x {head_dim} do not fit "
                                f"beside Q_i in {g.sram_per_block} B of shared memory "
                                f"(at most {fit})")
    T_r, T_c = math.ceil(seq_len / block_rows), math.ceil(seq_len / block_cols)
    blocks = [min(T_c, (min((i + 1) * block_rows, seq_len) - 1) // block_cols + 1)
              if causal else T_c for i in range(T_r)]
    cycles = _cycles_by_blocks(ph, max(blocks), schedule, loads, stages)
    per_block = [float(cycles[n - 1]) for n in blocks]
    busiest = busiest_sm(per_block, batch * heads, g.sms * blocks_per_sm) * blocks_per_sm
    seconds = busiest / g.tensor_clock_hz
    flops = 4 * seq_len * seq_len * head_dim * batch * heads / (2 if causal else 1)
    return {"seconds": seconds, "tflops": flops / seconds / 1e12, "phases": ph,
            "cycles_per_block": max(per_block)}


# --------------------------------------------------------------------- compared with data
# The FlashAttention-3 paper's ablation (Table 2) read as schedules of this model: "GEMM-
# softmax pipelining" is Section 3.2's two-stage (intra-warpgroup) pipelining, and pingpong
# is the warp-specialised kernel's (Section 3.1: "from 570 TFLOPS to 620-640 TFLOPS"): the
# configuration without pipelining is sequential with a producer; without warp
# specialisation, the compute warps issue their own loads two stages ahead.
FA3_ABLATION = {
    "FlashAttention-3": ("pingpong+intra", "producer"),
    "No GEMM-Softmax Pipelining, Warp-Specialization": ("sequential", "producer"),
    "GEMM-Softmax Pipelining, No Warp-Specialization": ("intra", "double"),
}
# FlashAttention-3's tiles for the forward at head dimension 128 (the paper's kernel:
# B_r = 128 rows in two consumer warp groups of 64, B_c = 128, two K/V stages).
FA3_TILES = {"block_rows": 128, "block_cols": 128, "stages": 2}


def fa3_ablation(gpu: str = "h100") -> list[dict]:
    """The paper's Table 2 configurations, predicted, beside the measured rows."""
    from ..measured.papers import FLASHATTENTION3_TABLE2 as T2
    c = T2["config"]
    rows = []
    for measured in T2["rows"]:
        schedule, loads = FA3_ABLATION[measured["configuration"]]
        p = launch_seconds(c["seq_len"], c["head_dim"], batch=c["batch"], heads=c["heads"],
                           schedule=schedule, loads=loads, gpu=gpu,
                           block_rows=FA3_TILES["block_rows"],
                           block_cols=FA3_TILES["block_cols"], stages=FA3_TILES["stages"])
        rows.append({"configuration": measured["configuration"], "schedule": schedule,
                     "loads": loads, "predicted_ms": p["seconds"] * 1e3,
                     "predicted_tflops": p["tflops"], "measured_ms": measured["time_ms"],
                     "measured_tflops": measured["tflops"]})
    return rows


# Our tensor-core kernel's versions (gpu_kernels/cuda/flash2_tc.cu) as schedules: every
# version has a barrier per K/V block (sequential compute); they differ in their loads. v3
# changes v2's shared-memory layout and v5 its rows per warp, neither of which this model
# sees, so they predict as v2.
KERNEL_VERSIONS = {1: "blocking", 2: "prefetch", 3: "prefetch", 4: "double", 5: "prefetch"}


def kernel_versions(measured: dict, gpu: str = "h200") -> list[dict]:
    """Predicted against measured times of the tensor-core kernel's versions at the tiles
    of the sweep (``cupy_h200.json``'s "tuning" rows with B_r = 128, B_c = 64)."""
    out = []
    for row in measured["tuning"]:
        cfg = dict(kv.split("=") for kv in row["config"].split())
        if (cfg["BLOCK_R"], cfg["BLOCK_C"]) != ("128", "64"):
            continue
        v = int(cfg["VERSION"])
        batch_heads = measured["configs"]["total_tokens"] // row["N"] * \
            measured["configs"]["hidden"] // row["d"]
        p = launch_seconds(row["N"], row["d"], batch=batch_heads, causal=row["causal"],
                           block_rows=128, block_cols=64, schedule="sequential",
                           loads=KERNEL_VERSIONS[v], gpu=gpu)
        out.append({"version": v, "d": row["d"], "N": row["N"], "causal": row["causal"],
                    "loads": KERNEL_VERSIONS[v], "predicted_ms": p["seconds"] * 1e3,
                    "measured_ms": row["time_ms"]})
    return out


# The Hopper kernel's versions (gpu_kernels/cuda/flash3.cu) as (schedule, loads), read as the
# FlashAttention-3 ablation above is: v1 and v2 keep both consumer warpgroups in step with a
# barrier per K/V block and have the compute warps load two stages ahead (v1 by cp.async,
# v2 by one thread's TMA copies: the same schedule to this model); v3's producer warpgroup
# fills the K/V stages; v4 adds ping-pong and intra-warpgroup overlap. v3's two consumer
# warpgroups no longer share a barrier per block, so they may overlap one's softmax with
# the other's GEMMs on their own: overlap outside this model, which gives v3 none.
FLASH3_VERSIONS = {1: ("sequential", "double"), 2: ("sequential", "double"),
                   3: ("sequential", "producer"), 4: ("pingpong+intra", "producer")}


def flash3_versions(measured: dict, gpu: str = "h200") -> list[dict]:
    """Predicted points beside the measured ones of the Hopper kernel's versions
    (``hopper_h200.json``'s ``cupy_flash3_vK`` points, at its recorded tiles and stages), in
    the points' own schema (impl, d, N, causal, tflops) plus ``measured_tflops``."""
    tiles = measured["configs"]["kernel_configs"]
    out = []
    for p in measured["points"]:
        if not p["impl"].startswith("cupy_flash3_v"):
            continue
        schedule, loads = FLASH3_VERSIONS[int(p["impl"].rsplit("_v", 1)[1])]
        c = tiles[str(p["d"])]
        r = launch_seconds(p["N"], p["d"], batch=p["B"] * p["H"], causal=p["causal"],
                           block_rows=c["BLOCK_R"], block_cols=c["BLOCK_C"], schedule=schedule,
                           loads=loads, stages=c["KV_STAGES"], gpu=gpu)
        out.append({"impl": p["impl"], "d": p["d"], "N": p["N"], "causal": p["causal"],
                    "tflops": r["tflops"], "measured_tflops": p["tflops"]})
    return out


def step_gains(points: list[dict], versions=tuple(FLASH3_VERSIONS)) -> list[dict]:
    """Each step's gain per (d, causal): the geometric mean over N of the TFLOP/s of
    ``cupy_flash3_v{v}`` over ``cupy_flash3_v{v - 1}`` at the same point, for measured points
    (``hopper_h200.json``) and predicted ones (:func:`flash3_versions`) alike."""
    pts = {(p["impl"], p["d"], p["N"], p["causal"]): p["tflops"] for p in points}

    def name(v):
        return f"cupy_flash3_v{v}"

    gains = []
    for d, c in sorted({(d, c) for (_, d, _, c) in pts}):
        for v in versions[1:]:
            r = [pts[(name(v), d, N, c)] / pts[(name(v - 1), d, N, c)]
                 for (i, dd, N, cc) in pts if (i, dd, cc) == (name(v), d, c)
                 and (name(v - 1), d, N, c) in pts]
            if r:
                gains.append({"d": d, "causal": c, "step": f"v{v - 1} -> v{v}", "points": len(r),
                              "geomean_gain": math.exp(sum(map(math.log, r)) / len(r))})
    return gains
