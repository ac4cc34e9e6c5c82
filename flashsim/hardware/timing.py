"""A time model that goes past the roofline where the measurements show it must.

The roofline (``presets.roofline_time``) is a floor: every SM busy, bytes and FLOPs
overlapped perfectly. Real kernels of the kind this project writes miss it for three
reasons, each a term here:

1. **Waves and the last partial wave.** A launch of G thread blocks runs on ``sms``
   multiprocessors. Blocks are handed out in launch order to the SM that frees up first;
   an SM's blocks share its arithmetic units, so an SM's busy time is the sum of its
   blocks' work. The launch's compute time is that of the busiest SM. With G = 32 blocks
   (flash1's one block per head at batch x heads = 32) only 32 of 132 SMs ever work; with
   G = 133, one SM does twice the work of the others.
2. **Compute efficiency.** An SM does not run at its datasheet peak: a kernel reaches a
   fraction ``compute_efficiency`` of it. This is a property of the kernel's code (its
   instruction mix: loads, exponentials, shuffles beside the FMAs), not of the shape, so
   it is one stated number per kernel, never per point.
   **Latency hiding.** That fraction needs enough warps on the SM to hide each
   instruction's latency. An SM has four schedulers, each issuing from its own warps (a
   warp stays on one; an SM's warps are dealt to them in turn), and a scheduler with k
   resident warps reaches ``scheduler_rates[k - 1]`` of the fraction: for CUDA-core
   (SIMT) code ``CUDA_CORE_RATES``, full at four warps a scheduler (16 an SM: each waits
   on its FMAs and shared-memory loads), for tensor-core code full at one (a warp's
   independent MMAs keep its pipe busy). The SM reaches the mean over its schedulers, so
   fewer than four warps leave schedulers idle. It matters when a launch has fewer
   blocks than slots: flash1's one block per head at batch x heads = 128 leaves each
   busy SM with one block of 8 warps, two a scheduler.
3. **Memory.** DRAM bytes (from the L2 model) at ``memory_efficiency`` of the datasheet
   bandwidth, and L2 request bytes at the L2's bandwidth.
4. **Latency: the launch's chain of steps.** A thread block's steps (one iteration of its
   innermost loop, which loads K_j and V_j; its Q_i load; its O_i store) follow one
   another, and a step cannot finish before its loads arrive, so a block takes at least
   its steps times one memory latency (``STEP_LATENCY_S``), however little it computes.
   The L2 model counts the launch's length in such steps (``LaunchTraffic.steps``: the
   steps of every wave, one after another), so the launch takes at least ``steps x
   STEP_LATENCY_S``. It binds only for launches of a few short blocks (the tensor-core
   kernel's launches under ~15 us, with four or five K/V blocks per row block).

A launch takes the longest of its compute, DRAM, L2 and latency times (they overlap), plus
a fixed launch latency.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .l2 import L2Report, simulate
from .l2_lockstep import launch_class
from .presets import DEFAULT_GPU, gpu as _gpu
from ..nest import blocks, count_scope, launches

# A kernel launch's fixed cost, back to back in a stream: an estimate of the order CUDA's
# launch overhead is reported at (2-5 us from launch to the first block, or between two
# dependent kernels), not a measurement of ours; one number for every launch.
LAUNCH_LATENCY_S = 4e-6
# The memory-bound regime (decoding): how fast one SM can pull bytes from DRAM. Little's
# law: bytes in flight / latency. An SM of a streaming kernel keeps about one K/V tile
# pair in flight (FlashAttention-2's split-KV tiles, 2 x 128 x 128 fp16: 64 KiB) and a
# request under load waits about 1 us (Hopper's unloaded DRAM latency is reported at
# 0.5-0.7 us by public microbenchmarks; queues add to it). Both are estimates, stated
# once: 65.5 GB/s per SM, so about 66 of the H200's 132 SMs are needed to reach its HBM
# bandwidth, and one block per SM on 8 SMs gets 0.52 TB/s. benchmarks/decode_h200.json's
# B = 1 points are what checks it.
SM_BYTES_IN_FLIGHT = 64 * 1024
DRAM_LATENCY_S = 1e-6
# The least time one step of a thread block takes (term 4 of the module doc): its loads'
# latency, the same stated estimate as above, not fitted.
STEP_LATENCY_S = DRAM_LATENCY_S


# Latency hiding (term 2): what one of an SM's SCHEDULERS reaches, of a kernel's compute
# efficiency, with 1, 2, 3, 4 or more resident warps. CUDA-core code: the rates at one and
# two warps are fitted on the held-out sweep's calibration points of one launch whose busy
# SMs hold at most that many a scheduler (``flashsim.measured.validation.
# fit_scheduler_rates``: predicted over measured time at a geometric mean of 1; never a
# held-out point), three the mean of its neighbours (no such point holds three),
# four full. Until 2026-12-03 an SM ran at warps / 16 of its rate (docs/model.md, "Launch
# latency and partial waves", says why that changed).
SCHEDULERS = 4
CUDA_CORE_RATES = (0.3804915707761256, 0.5887711454829468, 0.7943855727414735, 1.0)
TENSOR_CORE_RATES = (1.0, 1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the datasheet rates one kernel reaches (stated, not fitted per point)."""
    compute: float = 1.0
    memory: float = 0.9          # of HBM bandwidth: a large copy reaches ~0.9 (4.3 of 4.8 TB/s)
    l2_bandwidth: float = 10e12  # bytes/s the L2 serves to the SMs (order of magnitude)
    scheduler_rates: tuple = CUDA_CORE_RATES   # a scheduler's rate with 1, 2, 3, 4+ warps
    sm_bandwidth: float = SM_BYTES_IN_FLIGHT / DRAM_LATENCY_S   # bytes/s one SM pulls

    @classmethod
    def for_dtype(cls, dtype: str, compute: float = 1.0,
                  cuda_core_rates: tuple | None = None) -> "Efficiency":
        """CUDA-core code for fp32 (at ``cuda_core_rates``, default the stated ones),
        tensor-core code otherwise."""
        rates = (cuda_core_rates or CUDA_CORE_RATES) if dtype == "fp32" else TENSOR_CORE_RATES
        return cls(compute=compute, scheduler_rates=tuple(rates))


@dataclass
class LaunchTime:
    label: str
    blocks: int
    compute_s: float
    dram_s: float
    l2_s: float
    busiest_sm_flops: int
    latency_s: float = 0.0       # the chain of steps (module doc, term 4)
    launched: bool = True        # False: a phase run by the previous launch's blocks (no launch)
    fill_drain_s: float = 0.0    # memory-bound launches: first loads and last stores (below)

    @property
    def seconds(self) -> float:
        return (max(self.compute_s, self.dram_s, self.l2_s, self.latency_s) + self.fill_drain_s
                + (LAUNCH_LATENCY_S if self.launched else 0.0))


def block_flops(plan) -> list[tuple[str, list[int]]]:
    """``[(launch label, [FLOPs of each thread block of one head])]``; launches of one class
    (``l2_lockstep.launch_class``: flash1's launches per K/V block) share one list."""
    nest = plan.nest()
    out, seen = [], {}
    for launch in launches(nest):
        key = launch_class(launch, nest.tensors)
        flops = seen.get(key)
        if flops is None:
            flops = [count_scope(launch.ops, nest.tensors, ctx).flops for ctx in blocks(launch)]
            if key is not None:
                seen[key] = flops
        out.append((launch.label, flops))
    return out


def hand_out_blocks(costs: list, heads: int, sms: int) -> tuple[list, list[int]]:
    """Hand blocks (i fastest, then head) to the least-loaded SM, as the hardware hands a
    free SM the next block: (each SM's total cost, the SM of each block in launch order)."""
    heap = [(0, k) for k in range(min(sms, len(costs) * heads))]
    which = []
    for _ in range(heads):
        for f in costs:
            load, k = heap[0]
            heapq.heapreplace(heap, (load + f, k))
            which.append(k)
    totals = [0] * len(heap)
    for load, k in heap:
        totals[k] = load
    return totals, which


def busiest_sm(costs: list, heads: int, sms: int):
    """The largest SM total of :func:`hand_out_blocks`."""
    return max(hand_out_blocks(costs, heads, sms)[0])


def _per_launch(value, label: str):
    return value.get(label) if isinstance(value, dict) else value


def predict(plan, efficiency: Efficiency = Efficiency(), l2: L2Report | None = None,
            warps_per_block: int | dict | None = None, **l2_options) -> list[LaunchTime]:
    """Seconds per launch of ``plan`` on its GPU preset (default H200).

    ``warps_per_block`` (an int, or ``{launch label: int}``) enables the latency-hiding
    term; without it every SM is taken to hold enough warps."""
    g = plan.gpu or _gpu(DEFAULT_GPU)
    if l2 is None:
        l2 = simulate(plan, **l2_options)
    peak_sm = g.peak_flops(plan.dtype) / g.sms * efficiency.compute
    heads = plan.batch * plan.heads
    out, busiest_of = [], {}          # by id of a FLOPs list: launches of one class share it
    for (label, flops), traffic in zip(block_flops(plan), l2.launches):
        blocks = len(flops) * heads
        if id(flops) not in busiest_of:
            busiest_of[id(flops)] = busiest_sm(flops, heads, g.sms) if any(flops) else 0
        busiest = busiest_of[id(flops)]
        warps = _per_launch(warps_per_block, label)
        bps = _per_launch(l2.blocks_per_sm, label)
        hiding = 1.0
        if warps:
            hiding = latency_hiding(resident_warps(bps, blocks, warps, g.sms), efficiency)
        dram = traffic.dram_read_bytes + traffic.dram_write_bytes
        l2_bytes = traffic.l2_read_bytes + traffic.l2_write_bytes
        out.append(LaunchTime(
            label, blocks, busiest / (peak_sm * hiding),
            dram / (g.hbm_bandwidth * efficiency.memory), l2_bytes / efficiency.l2_bandwidth,
            busiest, traffic.steps * STEP_LATENCY_S))
    return out


def resident_warps(blocks_per_sm: int, blocks: int, warps_per_block: int, sms: int) -> int:
    """The warps a busy SM of a launch of ``blocks`` holds at once."""
    return min(blocks_per_sm, -(-blocks // sms)) * warps_per_block


def deal(warps: int) -> tuple[int, ...]:
    """An SM's ``warps`` dealt to its schedulers in turn: the count each holds."""
    return tuple(warps // SCHEDULERS + (s < warps % SCHEDULERS) for s in range(SCHEDULERS))


def latency_hiding(warps: int, efficiency: Efficiency) -> float:
    """The fraction of ``efficiency.compute`` an SM holding ``warps`` resident warps reaches:
    the warps dealt to its schedulers (``deal``), each scheduler at its rate for its count."""
    g = efficiency.scheduler_rates
    return sum(g[min(k, len(g)) - 1] for k in deal(warps) if k) / SCHEDULERS


def predict_seconds(plan, efficiency: Efficiency = Efficiency(), **kw) -> float:
    return sum(x.seconds for x in predict(plan, efficiency, **kw))


# ------------------------------------------------------------ the memory-bound regime

def _block_costs(nest, launch) -> list[tuple[int, int]]:
    """(bytes, FLOPs) of each thread block of one copy of ``launch``, in launch order."""
    out = []
    for ctx in blocks(launch):
        c = count_scope(launch.ops, nest.tensors, ctx)
        out.append((sum(c.read.values()) + sum(c.write.values()), c.flops))
    return out


def _hand_out(costs: list, copies: int, sms: int) -> list[tuple[int, int, int]]:
    """Per SM ``(bytes, FLOPs, blocks)``: every copy's blocks (the copies are the leading
    dimensions, blocks fastest) handed in launch order to the SM with the fewest bytes so
    far, as the hardware hands a free SM the next block."""
    if len(costs) * copies > HAND_OUT_LIMIT:
        return _fluid_hand_out(costs, copies, sms)
    heap = [(0, 0, k, 0) for k in range(min(sms, len(costs) * copies))]
    for _ in range(copies):
        for nb, f in costs:
            load, fl, k, n = heapq.heappop(heap)
            heapq.heappush(heap, (load + nb, fl + f, k, n + 1))
    per_sm = [(0, 0, 0)] * sms
    for load, fl, k, n in heap:
        per_sm[k] = (load, fl, n)
    return per_sm


# Past this many blocks a launch is handed out in bulk (``_fluid_hand_out``): at more than
# 750 blocks per SM the last partial wave changes the time by less than 0.2 %.
HAND_OUT_LIMIT = 100_000


def _fluid_hand_out(costs: list, copies: int, sms: int) -> list[tuple[int, int, int]]:
    """The hand-out of a launch too large to step: blocks spread evenly (the first
    n mod SMs SMs get one more), each SM's bytes and FLOPs the mean plus the largest
    block's, the bound of greedy list scheduling (within one block of the exact)."""
    n = len(costs) * copies
    total_b, total_f = copies * sum(b for b, _ in costs), copies * sum(f for _, f in costs)
    top_b, top_f = max(b for b, _ in costs), max(f for _, f in costs)
    return [(total_b // sms + top_b, total_f // sms + top_f, n // sms + (k < n % sms))
            for k in range(sms)]


def sm_loads(nest, copies: int, g) -> list[tuple[str, list[int], list[int]]]:
    """``[(launch label, blocks per SM, bytes per SM)]`` (:func:`_hand_out`)."""
    out = []
    for launch in launches(nest):
        per_sm = _hand_out(_block_costs(nest, launch), copies, g.sms)
        out.append((launch.label, [n for _, _, n in per_sm], [b for b, _, _ in per_sm]))
    return out


def dirty_write_back(brought: list[int], dirty_bytes: int, l2_bytes: int) -> list[int]:
    """Bytes of an L2's dirty lines that launches write back to DRAM as they bring in
    ``brought`` bytes each, in order, when they start from an L2 of ``l2_bytes`` whose lines
    are all another kernel's, ``dirty_bytes`` of them dirty (a benchmark's flush by writing
    leaves it so: docs/decode.md). Every line brought in evicts one of those lines, the
    least recent first; the dirty ones lie among them evenly (the L2 is hashed), so a
    launch writes back dirty / L2 of each byte it brings in, until they are all gone:

        written_i = dirty_bytes / l2_bytes x min(brought_i, l2_bytes - sum_{j<i} brought_j)
    """
    share, left, out = dirty_bytes / l2_bytes, l2_bytes, []
    for b in brought:
        evicted = min(b, left)
        left -= evicted
        out.append(round(share * evicted))
    return out


def predict_memory_bound(nest, copies: int, g, dtype: str,
                         efficiency: Efficiency = Efficiency(), l2: L2Report | None = None,
                         dirty_bytes: int = 0) -> list[LaunchTime]:
    """Seconds per launch of ``nest`` run ``copies`` times over (batch x heads), for
    kernels bound by memory (decoding). Per launch:

        memory  = max(bytes / (HBM bandwidth x memory efficiency),
                      busiest SM's bytes / sm_bandwidth)
        compute = busiest SM's FLOPs / (peak / SMs x compute efficiency)
        time    = max(memory, compute, L2 requests / L2 bandwidth)
                  + 2 STEP_LATENCY_S + LAUNCH_LATENCY_S

    so a launch of fewer blocks than SMs runs at the bandwidth its busy SMs can pull (why
    split-KV exists), and every launch (the combine too) pays the launch latency. The
    stream overlaps loads with work, but a launch's blocks start with nothing in flight and
    end with stores in flight: one memory latency to fill the stream and one to drain it,
    beside it (a phase run by the previous launch's blocks, the fused combine, pays both
    too, without the launch latency). ``bytes`` are the requested bytes, or the L2 model's
    DRAM bytes when ``l2`` is given, plus what the launch writes back of ``dirty_bytes``
    (:func:`dirty_write_back`: the L2's dirty lines when the first launch starts; 0, a
    clean L2, unless given). Blocks go to SMs as :func:`_hand_out` hands them out."""
    peak_sm = g.peak_flops(dtype) / g.sms * efficiency.compute
    costs_of = [_block_costs(nest, launch) for launch in launches(nest)]
    requested_of = [copies * sum(nb for nb, _ in costs) for costs in costs_of]
    written_back = dirty_write_back(requested_of, dirty_bytes, g.l2_bytes)
    out = []
    for i, launch in enumerate(launches(nest)):
        costs, requested = costs_of[i], requested_of[i]
        total = requested
        if l2 is not None:
            t = l2.launches[i]
            total = t.dram_read_bytes + t.dram_write_bytes + t.dirty_at_end_bytes
        total += written_back[i]
        per_sm = _hand_out(costs, copies, g.sms)
        busiest_bytes = max(b for b, _, _ in per_sm)
        busiest_flops = max(f for _, f, _ in per_sm)
        memory = max(total / (g.hbm_bandwidth * efficiency.memory),
                     busiest_bytes / efficiency.sm_bandwidth)
        out.append(LaunchTime(launch.label, len(costs) * copies, busiest_flops / peak_sm,
                              memory, requested / efficiency.l2_bandwidth, busiest_flops,
                              fill_drain_s=2 * STEP_LATENCY_S))
    return out
