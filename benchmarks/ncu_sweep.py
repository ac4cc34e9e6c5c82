"""Hardware counters for every kernel of ours over a sweep, to hold the model against.

On the GPU machine, from the repository root:

    python -m benchmarks.ncu_sweep run --out DIR
    python -m benchmarks.ncu_sweep run --out DIR --heldout    # the held-out launches

runs the sweep once under Nsight Compute (``ncu --clock-control none``, its default cache
control: L2 flushed and invalidated before every profiled kernel) and writes
``$OUT/ncu_h200.json`` (``--heldout``: ``ncu_h200_heldout.json``, the launches of
``flashsim.measured.heldout``, calibration and held-out alike, each with its ``split``): for
each point (kernel family, algorithm, N, d, batch, heads,
causal, dtype, the tiles it used) the launches it made, each with the counters

    dram__bytes_read.sum, dram__bytes_write.sum        bytes that crossed DRAM
    lts__t_sectors_srcunit_tex_op_read.sum / _write    32-byte L2 sectors the SMs asked for
    gpu__time_duration.sum                             kernel time
    launch__* (grid, block, registers, shared memory, occupancy limits)

Measured values are written as ncu printed them and never edited. The model's predictions
are not stored: ``flashsim.measured.validation`` computes them from the points' configurations.

``workload`` is the program ncu profiles: it checks each kernel on small inputs against
the float64 reference first, then runs each point once inside the NVTX range ``m``,
separated by a tiny marker kernel so that each profiled row can be assigned to its point.
Each point's launch comes from ``gpu_kernels.registry`` (its "plan": the launch's
``plan_record()``, from which ``flashsim.measured.validation`` rebuilds flashsim's plan).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import write_json
from gpu_kernels import harness, ncu, registry

TOTAL_TOKENS, HIDDEN = 16384, 2048
METRICS = ncu.COUNTERS + [
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
    "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
]
# Where the SMs' requests go before L2 (L1 hits never reach it) and what L2 itself hit:
# recorded when this ncu knows the metric (checked against ``ncu --query-metrics``).
OPTIONAL_METRICS = [
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_miss.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
    "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
    # Hopper's L2 request coalescer merges reads of one sector by several SMs in flight
    # at once: what it merged never reaches the L2 slices
    "lrc__request_sectors_op_read_coalescable.sum",
    "lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum",
    "lrc__lrc2xbar_sectors_op_read.sum",
    "lrc__xbar2lrc_requests_op_read.sum",
]


def sweep(quick: bool = False, heldout: bool = False, kernels=None) -> list[dict]:
    """The points of ``sweep_all`` whose kernel is in ``kernels`` (all when None)."""
    return [p for p in sweep_all(quick, heldout) if kernels is None or p["kernel"] in kernels]


def sweep_all(quick: bool = False, heldout: bool = False) -> list[dict]:
    """The points: (kernel, N, d, causal, tiles). Batch and heads as the FA2 paper: 16k
    tokens in total, hidden size 2048. ``quick``: a handful, to try the harness.
    ``heldout``: the launches drawn by ``flashsim.measured.heldout`` instead (``quick``: the
    first of each kernel)."""
    if heldout:
        from flashsim.measured import heldout as drawn
        pts = drawn.draw()
        return [p for k, p in enumerate(pts) if not quick or k % drawn.PER_KERNEL == 0]
    if quick:
        return [dict(p) for p in sweep_all() if p["N"] == 1024 and p["d"] == 64
                and "experiment" not in p and not p["causal"]]
    pts = []
    Ns = (512, 1024, 2048, 4096, 8192, 16384)
    for d in (64, 128):
        for N in Ns:
            for causal in (False, True):
                pts.append(dict(kernel="cupy_flash2", N=N, d=d, causal=causal))
                pts.append(dict(kernel="cupy_flash2_tc", N=N, d=d, causal=causal))
                pts.append(dict(kernel="numba_flash2", N=N, d=d, causal=causal))
            if N <= 8192:
                pts.append(dict(kernel="cupy_standard", N=N, d=d, causal=False))
                pts.append(dict(kernel="numba_standard", N=N, d=d, causal=False))
            if N <= 2048:
                # flash1 runs one block per head; numba_flash1 is left out: it launches
                # once per K/V block j, parallel over Q blocks, a schedule flashsim's
                # flash1 does not describe (each block reloads K_j, V_j).
                pts.append(dict(kernel="cupy_flash1", N=N, d=d, causal=False))
    # The FlashAttention paper's block-size experiment (its Figure 2, middle: N = 1024,
    # d = 64), on our kernels, batch x heads as above, block sizes swept.
    for Br in (16, 32, 48, 64):
        pts.append(dict(kernel="numba_flash2", N=1024, d=64, causal=False,
                        block_rows=Br, block_cols=16, experiment="block_size"))
    for bm, bn in ((64, 32), (64, 64), (128, 32), (128, 64), (128, 128)):
        pts.append(dict(kernel="cupy_flash2_tc", N=1024, d=64, causal=False,
                        block_rows=bm, block_cols=bn, experiment="block_size"))
    # The Hopper kernel (issue 19) at its default version, the FA2 paper's configurations
    # with d = 256 too; profiled on their own (``--kernels cupy_flash3``) after the rest.
    for d in (64, 128, 256):
        for N in Ns:
            for causal in (False, True):
                pts.append(dict(kernel="cupy_flash3", N=N, d=d, causal=causal))
    for p in pts:
        p["batch"] = TOTAL_TOKENS // p["N"] if p["N"] <= TOTAL_TOKENS else 1
        p["heads"] = HIDDEN // p["d"]
    return pts


# ------------------------------------------------------------------ the workload (on the GPU)
class Runner:
    """Builds the launch for one point (``gpu_kernels.registry``) and its inputs."""

    def __init__(self):
        import cupy

        self.cp = cupy
        self.mark = ncu.Marker()

    def inputs(self, p, dtype):
        cp = self.cp
        rng = cp.random.default_rng(p["N"] * 1000 + p["d"])
        shape = (p["batch"], p["heads"], p["N"], p["d"])
        return tuple(rng.standard_normal(shape, dtype=cp.float32).astype(dtype) for _ in range(3))

    def launcher(self, p):
        """(fn that launches the point's kernels once, dict of the plan it follows)."""
        entry = registry.get(p["kernel"])
        launch = entry.launch(batch=p["batch"], heads=p["heads"], seq_len=p["N"], head_dim=p["d"],
                              causal=p["causal"], block_rows=p.get("block_rows"),
                              block_cols=p.get("block_cols"))
        # numba kernels take the CuPy arrays as they are (CUDA Array Interface, no copy)
        Q, K, V = self.inputs(p, self.cp.float16 if launch.dtype == "fp16" else self.cp.float32)
        return (lambda: launch.run(Q, K, V)), launch.plan_record()


def check_correctness(runner, heldout: bool = False, kernels=None) -> list[dict]:
    """Every kernel on small ragged inputs against the float64 reference, before profiling."""
    import numpy as np

    import flashsim
    out = []
    for k in sorted({p["kernel"] for p in sweep(heldout=heldout, kernels=kernels)}):
        for causal in (False, True):
            p = dict(kernel=k, N=200, d=64, causal=causal, batch=2, heads=2)
            try:
                fn, _ = runner.launcher(p)
            except ImportError as e:
                out.append(dict(kernel=k, causal=causal, skipped=str(e)))
                continue
            O = fn().O
            O = np.asarray(runner.cp.asarray(O).get(), dtype=np.float64).reshape(2, 2, 200, 64)
            half = registry.get(k).dtypes[0] == "fp16"
            Q, K, V = (np.asarray(x.get(), np.float64) for x in runner.inputs(
                p, runner.cp.float16 if half else runner.cp.float32))
            ref = flashsim.reference.attention(Q, K, V, causal)
            verdict = harness.max_error_rule(float(np.max(np.abs(O - ref))), 2e-2 if half else 1e-4)
            err, ok = verdict["max_abs_error"], verdict["ok"]
            out.append(dict(kernel=k, causal=causal, max_abs_error=err, ok=ok))
            print(f"check {k:16s} causal={causal!s:5s} max|O-ref| = {err:.2e} "
                  f"{'ok' if ok else 'FAILED'}", flush=True)
    return out


def workload(manifest_path: str, quick: bool, heldout: bool = False, kernels=None) -> None:
    """One point at a time (inputs freed after each, so the largest fit): build, warm up
    outside the profiled range, then inside it a marker and exactly one run."""
    import cupy

    runner = Runner()
    manifest = {"correctness": check_correctness(runner, heldout, kernels), "points": [], "skipped": []}
    bad = {c["kernel"] for c in manifest["correctness"] if c.get("ok") is False}
    for p in sweep(quick, heldout, kernels):
        if p["kernel"] in bad:
            manifest["skipped"].append(dict(p, reason="failed its correctness check"))
            continue
        try:
            fn, plan = runner.launcher(p)
            fn()                       # compile and warm up outside the profiled range
            cupy.cuda.runtime.deviceSynchronize()
        except Exception as e:         # noqa: BLE001 - record and go on: absent, not estimated
            manifest["skipped"].append(dict(p, reason=f"{type(e).__name__}: {e}"))
            fn = None
        if fn is not None:
            entry = dict(p, plan=plan)
            manifest["points"].append(entry)
            cupy.cuda.nvtx.RangePush(ncu.RANGE)
            runner.mark()
            try:
                fn()
                cupy.cuda.runtime.deviceSynchronize()
            except Exception as e:     # noqa: BLE001
                entry["error"] = f"{type(e).__name__}: {e}"
            cupy.cuda.nvtx.RangePop()
        fn = None
        ncu.free_device_memory()
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


# ------------------------------------------------------------------ the driver
def known_metrics(out_dir: str) -> list[str]:
    """``METRICS`` plus the optional ones this ncu lists for the GPU (the full list is
    kept in ``ncu_query_metrics.txt``)."""
    q = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True)
    with open(os.path.join(out_dir, "ncu_query_metrics.txt"), "w") as f:
        f.write(q.stdout)
    names = {ln.split()[0] for ln in q.stdout.splitlines() if ln.strip()}
    return METRICS + [m for m in OPTIONAL_METRICS if m.rsplit(".", 1)[0] in names]


def run(out_dir: str, quick: bool, heldout: bool = False, kernels=None) -> None:
    os.makedirs(out_dir, exist_ok=True)
    name = ("ncu_h200_heldout" if heldout else "ncu_h200") + "".join(f"_{k}" for k in kernels or ())
    manifest = os.path.join(out_dir, f"{name}_manifest.json")
    metrics = known_metrics(out_dir)
    env, root = ncu.child_env(), ncu.ROOT

    def command(metrics):
        cmd = ncu.command(metrics, [sys.executable, "-m", "benchmarks.ncu_sweep", "workload",
                                    "--manifest", manifest])
        return (cmd + ["--quick"] * quick + ["--heldout"] * heldout
                + (["--kernels", ",".join(kernels)] if kernels else []))
    cmd = command(metrics)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0 and len(metrics) > len(METRICS):
        print(proc.stderr[-2000:])
        print("ncu failed with the optional metrics; again without them", flush=True)
        metrics = METRICS
        cmd = command(metrics)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    with open(os.path.join(out_dir, f"{name}_raw.csv"), "w") as f:
        f.write(proc.stdout)
    with open(os.path.join(out_dir, f"{name}_stderr.txt"), "w") as f:
        f.write(proc.stderr[-200000:])
    print(proc.stderr[-3000:])
    if proc.returncode != 0:
        raise SystemExit(f"ncu exited {proc.returncode}")
    with open(manifest) as f:
        man = json.load(f)
    points = ncu.assign(ncu.parse_csv(proc.stdout, metrics), man["points"])
    prov = harness.provenance(extra={
        "sms": harness.gpu_info().get("sm_count"),
        "ncu": ncu.version(),
        "ncu_command": " ".join(cmd)})
    data = {"provenance": prov, "metrics": metrics, "correctness": man["correctness"],
            "skipped": man.get("skipped", []), "points": points}
    write_json(out_dir, f"{name}.json", data)
    print(f"{len(points)} points, {sum(len(p['launches']) for p in points)} launches")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workload")
    w.add_argument("--manifest", required=True)
    w.add_argument("--quick", action="store_true")
    w.add_argument("--heldout", action="store_true")
    w.add_argument("--kernels", type=lambda t: t.split(","), default=None)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--quick", action="store_true", help="a handful of points")
    r.add_argument("--heldout", action="store_true",
                   help="the held-out launches of flashsim.measured.heldout")
    r.add_argument("--kernels", type=lambda t: t.split(","), default=None,
                   help="only these kernels (comma-separated); the file is named after them")
    a = ap.parse_args()
    if a.cmd == "workload":
        workload(a.manifest, a.quick, a.heldout, a.kernels)
    else:
        run(a.out, a.quick, a.heldout, a.kernels)


if __name__ == "__main__":
    main()
