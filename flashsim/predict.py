"""One launch of one registered kernel, predicted from its configuration alone.

    from flashsim.predict import predict
    predict("cupy_flash2", batch=2, heads=4, seq_len=5000, head_dim=64, gpu="h200")

What goes in: the kernel's own launch (``gpu_kernels.registry``: its tiles, grid, threads,
shared memory, and the registers its compiled code uses), the GPU preset, and one stated
number per compiled kernel, its compute efficiency (``EFFICIENCY``). Nothing is read from a
measurement of the launch being predicted. What comes out: the tiles, each launch's
occupancy (resident blocks per SM, from the SM's limits below), the two-level bytes, the L2
model's request and DRAM bytes, and the time model's seconds.

**Occupancy** (CUDA Occupancy Calculator for compute capability 9.0, as Nsight Compute's
``launch__occupancy_limit_*`` report it): blocks per SM is the least of

* ``MAX_BLOCKS_PER_SM`` = 32;
* warps: ``MAX_WARPS_PER_SM`` = 64 / warps per block;
* registers: each warp is given ``registers x 32`` rounded up to ``REGISTER_UNIT`` = 256;
  the SM's 64K registers hold ``floor(64K / that)`` warps, rounded down to a multiple of
  ``WARP_UNIT`` = 4 (the four schedulers' register files), over warps per block;
* shared memory: the SM's 228 KiB over (static + dynamic + ``RESERVED_SHARED`` = 1 KiB the
  runtime keeps per block).

**Efficiency**, one per compiled kernel (kernel, d: head dimension and tiles are
compile-time constants): predicted compute time at full peak over measured time at one
calibration point per (kernel, d) (``flashsim.measured.validation.efficiencies``; no mask,
default tiles, the largest N <= 4096 of the 107-point dataset; for ``numba_flash1``, which
Nsight Compute never profiled, of its harness-timed points in ``cupy_h200.json``,
``validation.TIMED``). A d never measured takes the nearest measured d of the same kernel,
and says so; a kernel never measured gets no time (``predicted_time_s`` None), not a guess.
A kernel whose thread layout follows its tiles (numba's FlashAttention: ``choose_tiling``)
says how much of an SM's issue rate a layout turns into FLOPs (``Launch.issue_rate``); its
efficiency is scaled by that over the layout at its reference launch (N = ``REFERENCE_N``,
default tiles), so tiles the reference never ran keep the kernel's own account of them
(``issue_rate_factor`` in the output). Latency hiding: ``timing.CUDA_CORE_RATES``.

No GPU library is imported here. The numba kernels' launch rule (``choose_tiling``) lives
in ``gpu_kernels.numba``, which imports numba (CPU-side, no device needed) when one of
those kernels is asked for.
"""

from __future__ import annotations

from .errors import FlashsimError
from .hardware import l2 as _l2, timing
from .hardware.presets import gpu as _gpu
from .nest import launches as _nest_launches

MAX_BLOCKS_PER_SM = 32
MAX_WARPS_PER_SM = 64
REGISTER_UNIT = 256           # registers are given to a warp in units of 256
WARP_UNIT = 4                 # ... and warps to the four schedulers' register files
RESERVED_SHARED = 1024        # bytes of shared memory the runtime keeps per block (cc 9.0)
REFERENCE_N = 4096            # the efficiencies' reference launches: N <= this, default tiles

# {(kernel, d): fraction of the SMs' peak}: fitted by validation.efficiencies on the
# calibration points only (numba_flash1: on its harness-timed points, validation.TIMED);
# tests/test_predict.py holds these equal to the fit.
EFFICIENCY = {
    ('cupy_flash1', 64): 0.05924192850672414,
    ('cupy_flash1', 128): 0.05992081882581965,
    ('cupy_flash2', 64): 0.12528977930093343,
    ('cupy_flash2', 128): 0.08317835703986631,
    ('cupy_flash2_tc', 64): 0.24651765633582653,
    ('cupy_flash2_tc', 128): 0.2752017077923028,
    ('cupy_flash3', 64): 0.47152279126084284,
    ('cupy_flash3', 128): 0.6063028889050507,
    ('cupy_flash3', 256): 0.6570728578057304,
    ('cupy_standard', 64): 0.11390377850735153,
    ('cupy_standard', 128): 0.12874639202094232,
    ('numba_flash1', 64): 0.2132227076775649,
    ('numba_flash1', 128): 0.151477064994695,
    ('numba_flash2', 64): 0.40017060456400166,
    ('numba_flash2', 128): 0.2771118671068559,
    ('numba_standard', 64): 0.2326341493915804,
    ('numba_standard', 128): 0.24956317493569824,
}


class PredictError(FlashsimError):
    """A launch flashsim predict cannot answer for (no GPU preset given, ...)."""


def occupancy(threads: int, registers: int | None, shared_bytes: int, g) -> dict:
    """Resident blocks per SM and each limit (registers None: not known, no limit)."""
    warps = -(-threads // 32)
    limits = {"blocks": MAX_BLOCKS_PER_SM, "warps": MAX_WARPS_PER_SM // warps,
              "shared_mem": g.sram_per_sm // (shared_bytes + RESERVED_SHARED)}
    if registers:
        per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
        limits["registers"] = (g.registers_per_sm // per_warp) // WARP_UNIT * WARP_UNIT // warps
    return {"blocks_per_sm": max(0, min(limits.values())), "limits": limits}


def efficiency_for(kernel: str, d: int) -> tuple[float | None, str]:
    """The stated efficiency of ``kernel`` at head dimension ``d``, and where it is from."""
    if (kernel, d) in EFFICIENCY:
        return EFFICIENCY[(kernel, d)], f"fitted at d = {d}"
    ds = sorted((k[1] for k in EFFICIENCY if k[0] == kernel), key=lambda x: (abs(x - d), x))
    if not ds:
        return None, "no calibration point for this kernel: no time predicted"
    return EFFICIENCY[(kernel, ds[0])], f"d = {d} never measured: the efficiency at d = {ds[0]}"


def issue_rate_factor(entry, launch) -> float:
    """``launch.issue_rate()`` over the same kernel's at its reference launch (N =
    ``REFERENCE_N``, default tiles, same d and dtype); 1 where the kernel has one rate."""
    rate = launch.issue_rate()
    if rate is None:
        return 1.0
    ref = entry.launch(batch=1, heads=1, seq_len=REFERENCE_N, head_dim=launch.d,
                       dtype=launch.dtype)
    return rate / ref.issue_rate()


def _kernel_launches(entry, launch, n: int) -> list:
    """The kernel launch that runs each of the nest's ``n`` launches, by position (a kernel
    launch's ``step``, or the registry's ``unlike_plan`` index; the last one listed when
    several do, since fills come first). A nest launch is told apart by its position, not
    its label: flash1's launches per K/V block share one."""
    out = [None] * n
    for kl in launch.launches():
        step = kl.step
        if step is None and kl.kernel in entry.unlike_plan:
            step = entry.unlike_plan[kl.kernel][0]
        if step is not None:
            out[step] = kl
    missing = [k for k, kl in enumerate(out) if kl is None]
    if missing:
        raise PredictError(f"{entry.name}: no kernel launch runs the nest's launches {missing}")
    return out


def predict(kernel: str, *, batch: int = 1, heads: int = 1, seq_len: int, head_dim: int, dtype=None,
            causal: bool = False, block_rows=None, block_cols=None, gpu: str | None = None,
            efficiency: float | None = None, work_limit: int | None = _l2.WORK_LIMIT,
            scheduler_rates: tuple | None = None, **options) -> dict:
    """The prediction for one launch of registry kernel ``kernel`` on preset ``gpu``.

    ``efficiency`` overrides the stated one (the fit itself calls this with 1.0), and
    ``scheduler_rates`` the time model's latency hiding (``timing.CUDA_CORE_RATES``'s fit
    calls it with candidates); ``options`` go to the kernel's configure (e.g. ``sram``
    for the CUDA C++ fp32 kernels). Bad names, shapes or tiles raise a FlashsimError
    before any work is done."""
    entry, launch, p, rows = _configured(kernel, gpu, batch=batch, heads=heads,
                                         seq_len=seq_len, head_dim=head_dim, dtype=dtype,
                                         causal=causal, block_rows=block_rows,
                                         block_cols=block_cols, **options)
    bps = {label: r["blocks_per_sm"] for label, r in rows.items()}
    wpb = {label: r["threads"] // 32 for label, r in rows.items()}
    rep = _l2.simulate(p, blocks_per_sm=bps, work_limit=work_limit)
    if efficiency is None:
        efficiency, source = efficiency_for(kernel, launch.d)
    else:
        source = "given"
    factor = issue_rate_factor(entry, launch)
    out = {
        "kernel": kernel, "gpu": gpu, "batch": batch, "heads": heads, "seq_len": launch.N,
        "head_dim": launch.d, "dtype": launch.dtype, "causal": launch.causal,
        "block_rows": launch.block_rows, "block_cols": launch.block_cols,
        "launches": list(rows.values()), "efficiency": efficiency, "efficiency_source": source,
        "issue_rate_factor": factor,
        "two_level_bytes": p.count().hbm_bytes,
        "l2_read_bytes": rep.l2_read_bytes, "l2_write_bytes": rep.l2_write_bytes,
        "dram_read_bytes": rep.dram_read_bytes, "dram_write_bytes": rep.dram_write_bytes,
        "dirty_at_end_bytes": rep.dirty_at_end_bytes,
        "predicted_time_s": None, "compute_s": None,
    }
    if efficiency is not None:
        eff = timing.Efficiency.for_dtype(p.dtype, efficiency * factor, scheduler_rates)
        t = timing.predict(p, eff, l2=rep, warps_per_block=wpb)
        out["predicted_time_s"] = sum(x.seconds for x in t)
        out["compute_s"] = sum(x.compute_s for x in t)
    return out


def launch_rows(kernel: str, *, gpu: str | None = None, **shape) -> list[dict]:
    """``predict``'s ``launches`` (each kernel launch's grid, threads, registers, shared
    memory and occupancy) without the L2 and time models' work; ``shape`` as ``predict``
    takes it."""
    return list(_configured(kernel, gpu, **shape)[3].values())


def _configured(kernel: str, gpu: str | None, *, batch: int = 1, heads: int = 1,
                seq_len: int, head_dim: int, dtype=None, causal: bool = False,
                block_rows=None, block_cols=None, **options) -> tuple:
    """(registry entry, launch, flashsim plan, ``{nest launch label: launch row}``), every
    input checked: one row per label, launches sharing one run one kernel (``count``)."""
    from gpu_kernels import registry

    if gpu is None:
        raise PredictError("flashsim predict needs --gpu NAME (the preset the launch runs on)")
    g = _gpu(gpu)
    if kernel in registry.DECODE_KERNELS:
        raise PredictError(f"{kernel} is a decode kernel: flashsim.predict_decode."
                           "predict_decode answers for it (--q-len, --kv-len)")
    entry = registry.get(kernel)
    launch = entry.launch(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                          dtype=dtype, causal=causal, block_rows=block_rows,
                          block_cols=block_cols, **options)
    p = launch.plan(gpu)
    labels = [x.label for x in _nest_launches(p.nest())]
    runs = _kernel_launches(entry, launch, len(labels))
    rows: dict = {}
    for label, kl in zip(labels, runs):
        if label in rows:
            rows[label]["count"] += 1
            continue
        res = registry.compiled(kernel, kl.kernel, launch.d, launch.block_rows,
                                launch.block_cols, launch.causal, kl.threads)
        regs, static = res if res else (None, launch.static_smem)
        occ = occupancy(kl.threads, regs, static + kl.dynamic_smem, g)
        if occ["blocks_per_sm"] < 1:
            raise PredictError(f"{kernel}: launch {kl.kernel} needs more of an SM than "
                               f"{g.name} has ({occ['limits']})")
        rows[label] = {"label": label, "kernel": kl.kernel, "grid": list(kl.grid), "count": 1,
                       "threads": kl.threads, "registers": regs,
                       "shared_bytes": static + kl.dynamic_smem, **occ}
    return entry, launch, p, rows


def format_prediction(r: dict) -> str:
    """The text ``flashsim predict`` prints."""
    mask = ", causal" if r["causal"] else ""
    lines = [f"{r['kernel']} on {r['gpu']}: B {r['batch']}, H {r['heads']}, N {r['seq_len']}, "
             f"d {r['head_dim']}, {r['dtype']}{mask}; tiles B_r {r['block_rows']} x B_c "
             f"{r['block_cols']}"]
    for x in r["launches"]:
        regs = "?" if x["registers"] is None else x["registers"]
        lim = ", ".join(f"{k} {v}" for k, v in x["limits"].items())
        times = f" (x {x['count']} launches, the first's grid)" if x.get("count", 1) > 1 else ""
        lines.append(f"  {x['kernel']:<22} grid {'x'.join(map(str, x['grid']))}{times}, "
                     f"{x['threads']} threads, {regs} registers, {x['shared_bytes']:,} B shared:"
                     f" {x['blocks_per_sm']} blocks/SM ({lim})")
    lines += [f"two-level bytes     {r['two_level_bytes']:>16,}",
              f"L2 request bytes    {r['l2_read_bytes'] + r['l2_write_bytes']:>16,}"
              f"  (read {r['l2_read_bytes']:,}, write {r['l2_write_bytes']:,})",
              f"dram_read_bytes     {r['dram_read_bytes']:>16,}",
              f"dram_write_bytes    {r['dram_write_bytes']:>16,}"]
    if r["predicted_time_s"] is None:
        lines.append(f"predicted_time_s    none ({r['efficiency_source']})")
    else:
        layout = (f"; x {r['issue_rate_factor']:.3f}, this thread layout's issue rate"
                  if r["issue_rate_factor"] != 1 else "")
        lines.append(f"predicted_time_s    {r['predicted_time_s']:.6g}  (efficiency "
                     f"{r['efficiency']:.4f}, {r['efficiency_source']}{layout})")
    return "\n".join(lines)
