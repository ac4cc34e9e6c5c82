"""Predictions beside hardware counters: the model held against the committed H200 data.

``benchmarks/ncu_sweep.py`` measured each kernel of ours with Nsight Compute and stored
only measurements and each point's configuration. Everything predicted is computed here by
:func:`flashsim.predict.predict` from that configuration alone (kernel, shape, dtype, mask,
tiles): occupancy from the registry's compiled registers and shared memory, the L2 model
(:mod:`flashsim.hardware.l2`), the time model (:mod:`flashsim.hardware.timing`). No counter
of a point enters its prediction.

Two datasets, one path. ``ncu_h200.json`` (107 points, one recipe: 16k tokens, hidden size
2048, N a power of two) and ``ncu_h200_heldout.json`` (the 72 launches that
:mod:`flashsim.measured.heldout` drew, each marked ``calibration`` or ``heldout`` before any
model change). A kernel profiled later on its own comes as a part of each (``PARTS``:
``ncu_h200_cupy_flash3.json``, the Hopper kernel at the same recipe with d = 256 too, 36
points, and ``ncu_h200_heldout_cupy_flash3.json``, its 12 draws); :func:`load` appends a
dataset's parts, so the in-sample set is 143 points and the held-out sweep 84. Constants
may be fitted on the in-sample and calibration points, never on the held-out ones: the one
number per compiled kernel (kernel, d) is its compute efficiency, stated in
``flashsim.predict.EFFICIENCY`` and fitted here (:func:`efficiencies`) at one reference
point of the in-sample set (no mask, default tiles, N = 4096 or the largest N below it).
:func:`split_summaries` gives the targets per split (of one kernel, with ``kernel``).

A kernel Nsight Compute never profiled has only harness-timed points (``TIMED``: numba's
FlashAttention, a launch per K/V block, in ``cupy_h200.json``'s FA2-paper configurations and
at ``flashsim measure``'s default shape in ``measure_h200.json``). :func:`timed_points` reads
them; the same rule picks one calibration point per (kernel, d) among the
``cupy_h200.json`` ones, and every other point is held out (:func:`timed_rows`).

Predictions take minutes to compute (causal points' blocks do not run in lockstep, so the
L2 model steps through every one), so ``python -m flashsim.measured.validation`` stores
them beside each dataset (``ncu_h200_predictions.json``, ``ncu_h200_heldout_predictions.json``)
with the SHA-256 of exactly what they are a pure function of: the dataset, the flashsim
modules this one imports and the kernel package that configures the launches (:func:`inputs`;
an edit to the CLI or a view leaves the copies fresh). A test fails at once, naming the
changed inputs, when a hash is stale (run this module again: it says how many rows moved),
and recomputes a sample of points on every run; the notebook and docs read the stored copies.
"""

from __future__ import annotations

import ast
import hashlib
import json
import pathlib

import numpy as np

from .. import predict as _predict
from ..hardware import timing as _timing
from ..hardware.l2 import SECTOR
from ..hardware.presets import DEFAULT_GPU, gpu as _gpu
from ..plan import plan as _plan
from . import path

# Points where a target is missed, with the reason as far as we can tell. Tests hold this
# list exact: every other point must meet its target, and every point here must still miss
# it (a model that improves must shrink the list).
_F3_LONG_KV = ("the L2 holds less of a head's K and V than the model's LRU: at d = 256 one "
               "head's K and V take N d 4 bytes (8 MiB at N = 8192, 16 MiB at 16384), the "
               "first wave's 132 blocks stream those of two or three heads, and the DRAM reads "
               "exceed the model's (its reuse of K/V in L2 is ideal). The same shortfall issue "
               "13 reports at N = 32768, d = 128; under the mask half the K/V is read and the "
               "causal points hold. Hypothesis: the H200's two L2 partitions.")
_F3_BLOCK_START = ("one block per SM (168 registers x 384 threads fill the register file), so "
                   "nothing hides a block's start (Q and the first K/V stage through TMA before "
                   "the first wgmma) and end (O written) behind another block's MMAs; at N = 512 "
                   "a block runs 4 K/V steps (fewer under the mask) against 32 at the N = 4096 "
                   "point whose efficiency is used, so that fixed cost weighs more than one "
                   "efficiency per kernel can say. The time model has no per-block term yet.")
KNOWN_MISSES = {
    "dram": {
        ("cupy_flash3", 8192, 256, False, 128, 64): _F3_LONG_KV,
        ("cupy_flash3", 16384, 256, False, 128, 64): _F3_LONG_KV,
    },
    "time": {
        ("numba_flash2", 1024, 64, False, 16, 16):
            "block-size experiment: 16x16 tiles do more shared-memory loads and index "
            "arithmetic per FLOP than the 64x32 code whose efficiency is used, so the kernel "
            "runs slower than one efficiency per kernel predicts; the kernel's own issue "
            "rate for the layout (predict's issue_rate_factor) accounts for part of it.",
        # (at d = 64 the launch's chain of steps, issue 13's time mechanism, now binds)
        ("cupy_flash3", 512, 128, True, 128, 128): _F3_BLOCK_START,
    },
    # L2 requests: every other point that misses 15 % must come within it once the
    # counters' L1 hits, coalescer merges and store requests are used (filtered_l2_error)
    "l2": {
        ("cupy_flash2_tc", 1024, 64, False, 128, 128):
            "register spills: at B_r = B_c = 128, d = 64 the kernel needs more than "
            "255 registers and ptxas spills to local memory (tests/test_cupy_kernels.py "
            "checks), whose traffic reaches the L2 as requests that are no global load or "
            "store of the model's.",
    },
}

# Timed points (``TIMED``) whose time ratio misses 1.5x, by (kernel, batch, heads, N, d,
# causal), with the reason; tests hold this list exact as they hold KNOWN_MISSES.
TIMED_KNOWN_MISSES = {
    ("numba_flash1", 2, 8, 2048, 64, False):
        "host-bound launches: at 16 heads each of the 43 flash1_step kernels runs for less "
        "time than numba's Python-side launch of the next one takes, so the GPU waits on the "
        "host between launches and the harness's events time the host's launch rate. The "
        "time model has a launch latency back to back in a stream, not the launcher's; the "
        "kernels' own time (Nsight Compute's, in the same file) is what it predicts "
        "(docs/model.md generates both ratios). cupy_h200.json's points have 8 to 64 times "
        "the heads: each launch runs several times longer than its launch takes the host, "
        "which keeps ahead.",
}

DATASET = path("ncu_h200.json")
PREDICTIONS = path("ncu_h200_predictions.json")
HELDOUT = path("ncu_h200_heldout.json")              # flashsim.measured.heldout's launches
HELDOUT_PREDICTIONS = path("ncu_h200_heldout_predictions.json")
# Kernels profiled on their own after a dataset was committed (``benchmarks.ncu_sweep run
# --kernels K`` writes NAME_K.json beside NAME.json): a dataset is its file and these parts
PARTS = ("cupy_flash3",)
REFERENCE_N = _predict.REFERENCE_N
# Harness-timed points (median time, no counters) of kernels Nsight Compute never profiled:
# a dataset of two files, its fit on the first file's points only
TIMED = (path("cupy_h200.json"), path("measure_h200.json"))
TIMED_PREDICTIONS = path("timed_h200_predictions.json")
TIMED_KERNELS = {"numba_flash1_fp32": "numba_flash1"}     # cupy_h200.json's impl -> kernel
SRAM_OPTION = ("cupy_standard", "cupy_flash1", "cupy_flash2")   # their configure takes sram=
PLAN_OPTIONS = ("version", "stages")   # compile-time choices a point's plan record states


def parts(dataset=DATASET) -> list[pathlib.Path]:
    """The files of ``dataset``: its own, then each committed part (``PARTS`` order); a
    dataset of several files (``TIMED``) is those files."""
    if isinstance(dataset, tuple):
        return [pathlib.Path(p) for p in dataset]
    p = pathlib.Path(dataset)
    return [p] + [q for k in PARTS if (q := p.with_name(f"{p.stem}_{k}.json")).exists()]


def load(path=DATASET) -> dict:
    """``path`` with the points of its parts after its own (its provenance; each part keeps
    its own in its file, where ``flashsim.measured.load`` reads it)."""
    with open(path) as f:
        data = json.load(f)
    for part in parts(path)[1:]:
        with open(part) as f:
            data["points"] = data["points"] + json.load(f)["points"]
    return data


def launch_options(pt: dict) -> dict:
    """The options of a point's configure call beyond shape, dtype, mask and tiles, from its
    plan record: the CUDA C++ fp32 kernels' SRAM, and the version and K/V stages the
    tensor-core kernels were profiled at (so a later default cannot move a prediction)."""
    from gpu_kernels import registry

    c, takes = pt["plan"], registry.get(pt["kernel"]).options
    out = {"sram": c["sram"]} if pt["kernel"] in SRAM_OPTION and c.get("sram") else {}
    return out | {k: c[k] for k in PLAN_OPTIONS if k in takes and c.get(k) is not None}


def point_plan(pt: dict):
    c = pt["plan"]
    sram = {"sram": c["sram"]} if c.get("sram") else {}
    return _plan(c["algorithm"], pt["N"], pt["d"], batch=pt["batch"], heads=pt["heads"],
                 dtype=c["dtype"], gpu=DEFAULT_GPU, block_rows=c["block_rows"],
                 block_cols=c["block_cols"], causal=pt["causal"],
                 kv_launches=c.get("kv_launches", False), **sram)


def blocks_per_sm(launch: dict) -> int:
    """Resident blocks per SM as Nsight Compute reported them (its occupancy limits): only
    to check ``flashsim.predict.occupancy``, which computes them from the registry."""
    limits = [launch.get(f"launch__occupancy_limit_{k}")
              for k in ("blocks", "registers", "shared_mem", "warps")]
    return int(min(x for x in limits if x))


L1 = "l1tex__t_sectors_pipe_lsu_mem_global_op_"
LRC_MERGED = "lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum"


def measured(pt: dict) -> dict:
    """Counters summed over a point's launches, in bytes (sectors x 32) and seconds. Besides
    the L2 requests: what the SMs asked of memory before L1 (``sm_read_bytes``: global loads
    and cp.async copies), what L1 served (``l1_hit_read_bytes``) and what Hopper's L2
    request coalescer merged before the L2 slices (``lrc_merged_read_bytes``).
    ``sm_read_bytes`` is None where the SMs made no such load at all: a kernel that loads
    through the tensor memory accelerator (TMA: ``cupy_flash3``) passes neither pipe, so
    these counters do not see what it asked for (the coalescer's still do)."""
    ls = pt["launches"]

    def sectors(metric):
        vals = [x.get(metric) for x in ls]
        return None if any(v is None for v in vals) else SECTOR * sum(vals)

    out = {
        "dram_read_bytes": sum(x["dram__bytes_read.sum"] for x in ls),
        "dram_write_bytes": sum(x["dram__bytes_write.sum"] for x in ls),
        "l2_read_bytes": sectors("lts__t_sectors_srcunit_tex_op_read.sum"),
        "l2_write_bytes": sectors("lts__t_sectors_srcunit_tex_op_write.sum"),
        "time_s": 1e-9 * sum(x["gpu__time_duration.sum"] for x in ls),
        "sm_read_bytes": None, "l1_hit_read_bytes": None, "lrc_merged_read_bytes": None,
        "sm_write_bytes": None,
    }
    ld, gsts = sectors(L1 + "ld.sum"), sectors(L1 + "ldgsts_cache_access.sum")
    if ld is not None:
        out["sm_read_bytes"] = (ld + (gsts or 0)) or None
        out["sm_write_bytes"] = sectors(L1 + "st.sum")
        out["l1_hit_read_bytes"] = sectors(L1 + "ld_lookup_hit.sum")
        out["lrc_merged_read_bytes"] = sectors(LRC_MERGED)
    return out


def _configuration(pt: dict) -> dict:
    """A point's configuration as ``flashsim.predict`` takes it (kernel, shape, dtype, mask,
    tiles, :func:`launch_options`, the GPU): nothing from its counters."""
    c = pt["plan"]
    return dict(kernel=pt["kernel"], batch=pt["batch"], heads=pt["heads"], seq_len=pt["N"],
                head_dim=pt["d"], dtype=c["dtype"], causal=pt["causal"],
                block_rows=c["block_rows"], block_cols=c["block_cols"], gpu=DEFAULT_GPU,
                **launch_options(pt))


def predict_point(pt: dict, efficiency: float | None = None,
                  scheduler_rates: tuple | None = None) -> dict:
    """``flashsim.predict.predict`` for a point's configuration, no work limit."""
    return _predict.predict(**_configuration(pt), efficiency=efficiency, work_limit=None,
                            scheduler_rates=scheduler_rates)


def predicted(pt: dict, efficiency: float | None = None) -> dict:
    """The model's numbers for one point (``efficiency`` None: the stated one)."""
    r = predict_point(pt, efficiency)
    return {
        "dram_read_bytes": r["dram_read_bytes"], "dram_write_bytes": r["dram_write_bytes"],
        "dirty_at_end_bytes": r["dirty_at_end_bytes"],
        "l2_read_bytes": r["l2_read_bytes"], "l2_write_bytes": r["l2_write_bytes"],
        "two_level_bytes": r["two_level_bytes"],
        "time_s": r["predicted_time_s"], "compute_s": r["compute_s"],
    }


def measured_time(pt: dict) -> float:
    """A point's measured seconds: the harness's median for a timed point, else Nsight
    Compute's kernel time summed over its launches."""
    return pt["time_s"] if "time_s" in pt else measured(pt)["time_s"]


def reference_points(points: list[dict]) -> dict:
    """``{(kernel, d): point}``: the calibration point of each compiled kernel among
    ``points``: no mask, default tiles, the largest N <= ``REFERENCE_N``."""
    refs: dict = {}
    for pt in points:
        if pt["causal"] or "experiment" in pt or pt["N"] > REFERENCE_N:
            continue
        key = (pt["kernel"], pt["d"])
        if key not in refs or pt["N"] > refs[key]["N"]:
            refs[key] = pt
    return refs


def efficiencies(points: list[dict]) -> dict:
    """``{(kernel, d): efficiency}``: predicted compute time at full peak over measured time
    at the reference point (at most 1). ``flashsim.predict.EFFICIENCY`` states the fit on
    the in-sample dataset and, for the kernels only timed, on ``cupy_h200.json``'s points
    (calibration data)."""
    return {key: min(1.0, predicted(pt, 1.0)["compute_s"] / measured_time(pt))
            for key, pt in reference_points(points).items()}


def scheduler_counts(pt: dict) -> list[tuple[int, ...]]:
    """Per launch of a point's prediction, the resident warps each of a busy SM's
    schedulers holds (``timing.latency_hiding``'s deal)."""
    sms = _gpu(DEFAULT_GPU).sms
    return [_timing.deal(_timing.resident_warps(row["blocks_per_sm"], int(np.prod(row["grid"])),
                                                row["threads"] // 32, sms))
            for row in _predict.launch_rows(**_configuration(pt))]


def fit_scheduler_rates(points: list[dict]) -> tuple:
    """``timing.CUDA_CORE_RATES`` from ``points`` (the held-out sweep's calibration points):
    the rate of a scheduler holding k = 1, 2, 3 warps, k in turn, from the CUDA-core points
    of one launch whose busy SMs' schedulers hold at most k warps and some exactly k (the
    lower rates fitted before): the rate at which their predicted times over the measured
    ones have a geometric mean of 1 (bisection). A k no point holds takes the mean of its
    neighbours' rates; four warps or more: 1. Only kernels whose efficiency was read off a
    launch at full rate (four warps a scheduler) count: where the reference launch itself
    holds fewer (cupy flash1's block per head), its efficiency already carries that rate,
    and its points cannot tell one from the other."""
    refs = reference_points(load(DATASET)["points"])
    one = []
    for pt in points:
        if pt["plan"]["dtype"] != "fp32":
            continue
        ref = refs.get((pt["kernel"], pt["d"]))
        if ref is None or min(min(c) for c in scheduler_counts(ref)) < _timing.SCHEDULERS:
            continue
        counts = scheduler_counts(pt)
        if len(counts) == 1 and max(counts[0]) < _timing.SCHEDULERS:
            one.append((pt, max(counts[0])))
    rates = [None, None, None, 1.0]
    for k in (1, 2, 3):
        pts = [pt for pt, m in one if m == k]
        if not pts:
            continue
        lo, hi = 0.01, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            # rates above k never matter at these points: any value will do
            g = tuple(mid if r is None else r for r in rates[:k - 1] + [mid] + rates[k:])
            log_ratio = np.mean([np.log(predict_point(pt, scheduler_rates=g)["predicted_time_s"]
                                        / measured_time(pt)) for pt in pts])
            lo, hi = (mid, hi) if log_ratio > 0 else (lo, mid)      # too slow: a higher rate
        rates[k - 1] = (lo + hi) / 2
    for k in (1, 2, 3):
        if rates[k - 1] is None:
            below = rates[k - 2] if k > 1 else 0.0
            rates[k - 1] = (below + next(r for r in rates[k:] if r is not None)) / 2
    return tuple(rates)


def timed_points(dataset=TIMED) -> list[dict]:
    """The harness-timed points of ``TIMED_KERNELS`` as points :func:`predicted` takes, in
    file order: kernel, shape, mask, the plan record of the launch the harness ran (its
    default tiles; ``measure_h200.json`` states its own), ``time_s`` (the median), ``source``
    (the file) and ``split``: ``calibration`` for the :func:`reference_points` of the first
    file's points, ``heldout`` for every other point."""
    from gpu_kernels import registry

    first, *rest = parts(dataset)
    with open(first) as f:
        pts = [dict(kernel=TIMED_KERNELS[p["impl"]], N=p["N"], d=p["d"], batch=p["B"],
                    heads=p["H"], causal=p["causal"], dtype=p["dtype"],
                    time_s=1e-3 * p["time_ms"], source=first.name)
               for p in json.load(f)["points"] if p["impl"] in TIMED_KERNELS]
    refs = [id(p) for p in reference_points(pts).values()]
    for p in pts:
        p["split"] = "calibration" if id(p) in refs else "heldout"
    for file in rest:                       # flashsim measure's rows: all held out
        with open(file) as f:
            rows = [r for r in json.load(f)["rows"]
                    if r["kernel"] in TIMED_KERNELS.values() and r.get("measured", {}).get("time_s")]
        pts += [dict(kernel=r["kernel"], N=r["config"]["seq_len"], d=r["config"]["head_dim"],
                     batch=r["config"]["batch"], heads=r["config"]["heads"],
                     causal=r["config"]["causal"], dtype=r["config"]["dtype"],
                     time_s=r["measured"]["time_s"], source=file.name, split="heldout",
                     tiles=r["tiles"]) for r in rows]
    for p in pts:
        tiles = p.pop("tiles", {"block_rows": None, "block_cols": None})
        p["plan"] = registry.launch(p["kernel"], batch=p["batch"], heads=p["heads"],
                                    seq_len=p["N"], head_dim=p["d"], dtype=p.pop("dtype"),
                                    causal=p["causal"], **tiles).plan_record()
    return pts


def timed_key(pt: dict) -> tuple:
    """A timed point's key in ``TIMED_KNOWN_MISSES``: kernel, batch, heads, N, d, causal."""
    return (pt["kernel"], pt["batch"], pt["heads"], pt["N"], pt["d"], pt["causal"])


def timed_rows(dataset=TIMED, predictions=TIMED_PREDICTIONS) -> list[dict]:
    """The timed points with their stored predictions (:func:`store_timed`) and the time
    ratio predicted / measured."""
    with open(predictions) as f:
        stored = json.load(f)["rows"]
    pts = timed_points(dataset)
    if len(pts) != len(stored):
        raise RuntimeError("stored timed predictions do not match the points: rerun "
                           "python -m flashsim.measured.validation")
    return [{"point": pt, **row, "time_ratio": row["predicted"]["time_s"] / pt["time_s"]}
            for pt, row in zip(pts, stored)]


def compare(data: dict | None = None) -> list[dict]:
    """One row per measured point: configuration, measured, predicted."""
    data = data or load()
    rows = []
    for pt in (p for p in data["points"] if p["launches"]):
        e = _predict.efficiency_for(pt["kernel"], pt["d"])[0]
        rows.append({"point": pt, "efficiency": e, "measured": measured(pt),
                     "predicted": predicted(pt, e)})
    return rows


def _imports(f: pathlib.Path, package: list[str]) -> list[str]:
    """The flashsim modules the file ``f`` (in ``package``) imports, at its top or inside
    functions (a lazy import is an input too)."""
    out = []
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) + 1 - node.level] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out += [mod] + [f"{mod}.{a.name}" for a in node.names]   # "from x import module"
    return [m for m in out if m.split(".")[0] == "flashsim"]


def sources(module: str = f"{__package__}.validation") -> list[pathlib.Path]:
    """The flashsim source files that importing ``module`` runs: its own, every flashsim
    module it imports (transitively, read from the source, not from what this process has
    imported) and the ``__init__.py`` of each package on the way. Exactly what the stored
    predictions can depend on, so that an edit elsewhere (the CLI, a view) leaves them fresh.
    (Named, not ``__name__``: run as ``python -m`` this module is ``__main__``.)"""
    root = pathlib.Path(__file__).resolve().parents[1]
    seen: set[pathlib.Path] = set()
    todo = [module]
    while todo:
        parts = todo.pop().split(".")
        for k in range(1, len(parts) + 1):    # importing a.b.c runs a, a.b and a.b.c
            name, where = parts[:k], root.joinpath(*parts[1:k])
            if k > 1 and where.with_suffix(".py").is_file():
                f, package = where.with_suffix(".py"), name[:-1]
            else:
                f, package = where / "__init__.py", name
            if f.is_file() and f not in seen:
                seen.add(f)
                todo += _imports(f, package)
    return sorted(seen)


def inputs(dataset=DATASET) -> dict[str, str]:
    """``{path: SHA-256}`` of everything the stored predictions of ``dataset`` are a pure
    function of: the dataset's files (:func:`parts`), the source files of :func:`sources`
    (paths relative to the flashsim package) and every Python and JSON file of ``gpu_kernels`` (the registry's
    launches, tile rules and compiled resources, which ``flashsim.predict`` reads)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    # compile_cache.json is left out: it records compiles for the tests, predict never reads it
    kernels = sorted(p for p in (root.parent / "gpu_kernels").rglob("*")
                     if p.suffix in (".py", ".json") and p.name != "compile_cache.json")
    return {f.relative_to(root.parent if f in kernels else root).as_posix():
            hashlib.sha256(f.read_bytes()).hexdigest()
            for f in [*parts(dataset), *sources(), *kernels]}


def inputs_sha256(dataset=DATASET, *, files: dict[str, str] | None = None) -> str:
    """One SHA-256 over :func:`inputs` of ``dataset`` (or ``files``: path and hash of each,
    in path order)."""
    files = inputs(dataset) if files is None else files
    return hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(files.items()))
                          .encode()).hexdigest()


def stored_rows(dataset=DATASET, predictions=PREDICTIONS) -> list[dict]:
    """``compare()`` as stored by ``python -m flashsim.measured.validation`` (fast, for notebooks)."""
    with open(predictions) as f:
        stored = json.load(f)
    data = load(dataset)
    pts = [p for p in data["points"] if p["launches"]]
    if len(pts) != len(stored["rows"]):
        raise RuntimeError("stored predictions do not match the dataset: rerun "
                           "python -m flashsim.measured.validation")
    return [{"point": pt, "measured": measured(pt), **row}
            for pt, row in zip(pts, stored["rows"])]


def point_key(pt: dict) -> tuple:
    c = pt["plan"]
    return (pt["kernel"], pt["N"], pt["d"], pt["causal"], c["block_rows"], c["block_cols"])


def errors(row: dict) -> dict:
    """Relative errors (DRAM and L2 bytes, read plus write) and the time ratio of one row."""
    m, p = row["measured"], row["predicted"]

    def both(d, level):
        return d[f"{level}_read_bytes"] + d[f"{level}_write_bytes"]

    return {"dram": abs(both(p, "dram") / both(m, "dram") - 1),
            "l2": abs(both(p, "l2") / both(m, "l2") - 1),
            "time_ratio": p["time_s"] / m["time_s"]}


def filtered_l2_error(row: dict) -> float | None:
    """The L2-request error with what stands between the SMs and the L2 taken from the
    counters: the model's read requests (which are what the SMs asked for) less the
    measured L1 hits and coalescer merges, plus the store requests the SMs made (a kernel
    that writes a sector in several pieces makes several requests for it). Small when those
    are why the model misses; None without those counters."""
    m, p = row["measured"], row["predicted"]
    if None in (m["l1_hit_read_bytes"], m["lrc_merged_read_bytes"], m["sm_write_bytes"]):
        return None
    pred = (p["l2_read_bytes"] - m["l1_hit_read_bytes"] - m["lrc_merged_read_bytes"]
            + m["sm_write_bytes"])
    return abs(pred / (m["l2_read_bytes"] + m["l2_write_bytes"]) - 1)


def l2_miss_reason(row: dict) -> str:
    """What a point's own counters say about its L2 requests."""
    m, p = row["measured"], row["predicted"]
    sm = m["sm_read_bytes"]
    stores = f"store requests {m['sm_write_bytes'] / p['l2_write_bytes']:.2f}x the model's written sectors"
    if sm is None:          # TMA loads: no L1 request counter saw them
        return (f"loads through TMA (no SM read request counted); the coalescer merged "
                f"{m['lrc_merged_read_bytes'] / p['l2_read_bytes']:.1%} of the model's read "
                f"requests; {stores}")
    return (f"SM read requests {sm / p['l2_read_bytes']:.3f}x the model's; L1 served "
            f"{m['l1_hit_read_bytes'] / sm:.1%} and the coalescer merged "
            f"{m['lrc_merged_read_bytes'] / sm:.1%} of them; {stores}")


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def write_error(row: dict) -> float:
    """Relative error of the DRAM write bytes (0 when both are 0)."""
    m, p = row["measured"]["dram_write_bytes"], row["predicted"]["dram_write_bytes"]
    return abs(p / m - 1) if m else (0.0 if p == 0 else float("inf"))


def summary(rows: list[dict]) -> dict:
    """The issue's targets, computed on ``rows``: worst relative errors and time ratios."""
    errs = [errors(r) for r in rows]
    writes = [write_error(r) for r in rows]
    dram = [e["dram"] for e in errs]
    l2 = [e["l2"] for e in errs]
    ratio = [e["time_ratio"] for e in errs]
    sm = [abs(r["predicted"]["l2_read_bytes"] / r["measured"]["sm_read_bytes"] - 1)
          for r in rows if r["measured"]["sm_read_bytes"]]
    filtered = [e for e in map(filtered_l2_error, rows) if e is not None]
    return {
        "points": len(rows),
        "dram_worst_rel_error": max(dram), "dram_within_10pct": sum(e <= 0.10 for e in dram),
        "dram_write_within_15pct": sum(e <= 0.15 for e in writes),
        "l2_worst_rel_error": max(l2), "l2_within_15pct": sum(e <= 0.15 for e in l2),
        "sm_read_points": len(sm), "sm_read_worst_rel_error": max(sm, default=None),
        "l2_after_l1_coalescer_stores_within_15pct": sum(e <= 0.15 for e in filtered),
        "l2_after_l1_coalescer_stores_worst_rel_error": max(filtered, default=None),
        "time_ratio_min": min(ratio), "time_ratio_max": max(ratio),
        "time_within_1_5x": sum(1 / 1.5 <= x <= 1.5 for x in ratio),
        "time_spearman": spearman([r["predicted"]["time_s"] for r in rows],
                                  [r["measured"]["time_s"] for r in rows]),
    }


SPLITS = ("in-sample", "calibration", "heldout")


def split_summaries(in_sample: list[dict], heldout: list[dict], kernel: str | None = None) -> dict:
    """``summary`` of the in-sample points, the held-out sweep's calibration points and its
    held-out points (the ones no constant was fitted on); of ``kernel``'s points only when
    given."""
    if kernel:
        in_sample, heldout = ([r for r in rows if r["point"]["kernel"] == kernel]
                              for rows in (in_sample, heldout))
    return {"in-sample": summary(in_sample),
            **{s: summary([r for r in heldout if r["point"]["split"] == s])
               for s in SPLITS[1:]}}


# The held-out targets (issue 13): (label, summary key, fraction of points required)
HELDOUT_TARGETS = (("DRAM bytes within 10 %", "dram_within_10pct", 0.95),
                   ("DRAM write bytes within 15 %", "dram_write_within_15pct", 0.90),
                   ("time within 1.5x", "time_within_1_5x", 0.95),
                   ("L2 request bytes within 15 %", "l2_within_15pct", 0.80))


def summary_table(summaries: dict) -> list[list[str]]:
    """Rows ``[target, then 'k / n' per split]`` for ``split_summaries``' result, the last
    column the held-out target."""
    rows = []
    for label, key, frac in HELDOUT_TARGETS:
        rows.append([label] + [f"{s[key]} / {s['points']}" for s in summaries.values()]
                    + [f">= {frac:.0%}"])
    return rows


def stored_split_summaries(kernel: str | None = None) -> dict:
    """``split_summaries`` of the stored predictions of both datasets (fast)."""
    return split_summaries(stored_rows(), stored_rows(HELDOUT, HELDOUT_PREDICTIONS), kernel)


def store(dataset, predictions, fit: bool = False) -> dict:
    """Compute and write ``predictions`` for ``dataset`` (with ``fit``, also the efficiency
    fit on its points, so a test can hold ``flashsim.predict.EFFICIENCY`` to it cheaply;
    for a dataset with calibration points, the latency-hiding rates fitted on those,
    ``timing.CUDA_CORE_RATES``'s)."""
    data = load(dataset)
    rows = compare(data)
    fitted = ({"fitted_efficiencies": [[k, d, e] for (k, d), e in sorted(efficiencies(
        [p for p in data["points"] if p["launches"]]).items())]} if fit else {})
    if any(p.get("split") == "calibration" for p in data["points"]):
        fitted["fitted_scheduler_rates"] = list(fit_scheduler_rates(
            [p for p in data["points"] if p.get("split") == "calibration"]))
    files = inputs(dataset)
    out = {"note": f"Computed by `python -m flashsim.measured.validation` from "
                   f"{pathlib.Path(dataset).name}'s configurations through flashsim.predict; "
                   "model output, not measurements.",
           "inputs_sha256": inputs_sha256(files=files),
           "inputs": files,
           "summary": summary(rows),
           **({"summary_by_split": {sp: summary([r for r in rows if r["point"]["split"] == sp])
                                    for sp in SPLITS[1:]}}
              if all("split" in r["point"] for r in rows) else {}),
           **fitted,
           "rows": [{"efficiency": r["efficiency"], "predicted": r["predicted"]} for r in rows]}
    return _write(predictions, out)


def _write(predictions, out: dict) -> dict:
    """Write ``out`` to ``predictions``; returns it with ``changed_rows``: how many of its
    rows differ from the copy stored before."""
    path_ = pathlib.Path(predictions)
    before = json.loads(path_.read_text()) if path_.exists() else {}
    old = before.get("rows", [])
    path_.write_text(json.dumps(out, indent=1) + "\n")
    changed = sum(a != b for a, b in zip(old, out["rows"])) + abs(len(old) - len(out["rows"]))
    return {**out, "changed_rows": changed}


def store_timed(dataset=TIMED, predictions=TIMED_PREDICTIONS) -> dict:
    """Compute and write ``predictions`` for the timed points (:func:`timed_points`), at the
    stated efficiency, with the efficiency fit on their calibration points."""
    pts = timed_points(dataset)
    fit = efficiencies([p for p in pts if p["source"] == parts(dataset)[0].name])
    rows = []
    for pt in pts:
        e = _predict.efficiency_for(pt["kernel"], pt["d"])[0]
        rows.append({"efficiency": e, "predicted": predicted(pt, e)})
    files = inputs(dataset)
    out = {"note": "Computed by `python -m flashsim.measured.validation` from the "
                   f"configurations of {', '.join(p.name for p in parts(dataset))}'s harness-"
                   f"timed {', '.join(TIMED_KERNELS.values())} points through flashsim.predict; "
                   "model output, not measurements.",
           "inputs_sha256": inputs_sha256(files=files), "inputs": files,
           "fitted_efficiencies": [[k, d, e] for (k, d), e in sorted(fit.items())],
           "rows": rows}
    return _write(predictions, out)


def main() -> None:
    for dataset, predictions in ((HELDOUT, HELDOUT_PREDICTIONS), (DATASET, PREDICTIONS)):
        out = store(dataset, predictions, fit=dataset == DATASET)
        print(pathlib.Path(dataset).name)
        for k, v in out["summary"].items():
            print(f"  {k:44s} {v}")
        print(f"  {out['changed_rows']} of {len(out['rows'])} rows differ from the copy stored before")
    out = store_timed()
    print(", ".join(p.name for p in parts(TIMED)) + f" (timed {', '.join(TIMED_KERNELS.values())})")
    for r in timed_rows():
        p = r["point"]
        print(f"  {p['split']:11s} B {p['batch']:>2} H {p['heads']:>2} N {p['N']:>5} d {p['d']:>3} "
              f"causal {p['causal']!s:5}  predicted / measured {r['time_ratio']:.3f}")
    print(f"  {out['changed_rows']} of {len(out['rows'])} rows differ from the copy stored before")


if __name__ == "__main__":
    main()
