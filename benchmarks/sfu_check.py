"""Special-function instructions of our tensor-core kernel, counted by Nsight Compute,
against flashsim's exponential count (``exp_ops``, one warp instruction per 32 lanes).

On the GPU machine, from the repository root (ncu, nvcc and cuobjdump on PATH or in
/usr/local/cuda/bin):

    python -m benchmarks.sfu_check run --out $OUT

1. asks ``ncu --query-metrics`` which of the candidate metrics exist (``CANDIDATES``) and
   keeps every line that mentions the XU pipe or MUFU (``query_matches``);
2. compiles the kernel's variants with nvcc and counts MUFU / F2FP / conversion opcodes in
   ``cuobjdump -sass`` (static: per variant, what one pass over the code holds);
3. checks every point's output against a float32 reference (outside the profiler);
4. runs ``workload`` under ``ncu --clock-control none --kernel-name flash2_tc_fwd``: one
   launch per point, in order, so the i-th profiled launch is the i-th point;
5. writes ``$OUT/sfu_h200.json`` (provenance, metrics found, static SASS counts, the raw
   values as ncu printed them, the per-opcode counts parsed from them) and
   ``$OUT/sfu_h200_raw.csv``, and prints the comparison.

    python -m benchmarks.sfu_check compare flashsim/measured/data/sfu_h200.json

prints the comparison of a committed file (``flashsim.measured.sfu.compare``); the test
``tests/test_sfu.py`` holds it within 10% when the file is committed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys

from gpu_kernels.cupy import flash2_tc as tc
from gpu_kernels.cupy.common import KERNEL_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Metrics tried (kept when ``ncu --query-metrics`` lists their base name; the sass__* ones
# are never listed and are tried anyway). The per-opcode counts (warp-level executed
# instructions by SASS opcode, the InstructionStats section's) separate MUFU (the special-
# function unit) from the rest of the XU pipe, which on Hopper also runs some conversions.
CANDIDATES = [
    "sass__inst_executed_per_opcode",
    "smsp__inst_executed_pipe_xu.sum",
    "sm__inst_executed_pipe_xu.sum",
    "smsp__pipe_xu_cycles_active.sum",
    "smsp__inst_executed.sum",
    "gpu__time_duration.sum",
    "launch__grid_size",
    "launch__block_size",
]
KERNEL = "flash2_tc_fwd"
PER_OPCODE = "sass__inst_executed_per_opcode"


def points(quick: bool = False) -> list[dict]:
    """Shapes that are whole multiples of the tiles (the kernel computes full tiles, the
    model real rows), each at the default configuration, and v1 at two of them: the
    count must not depend on the version."""
    out = []
    for d in (64, 128):
        for N in ((1024,) if quick else (1024, 4096)):
            for causal in (False, True):
                c = tc.CONFIGS[d]
                out.append(dict(N=N, d=d, batch=1, heads=4, causal=causal,
                                block_rows=c["BLOCK_R"], block_cols=c["BLOCK_C"],
                                version=c["VERSION"]))
        if not quick:
            c = tc.CONFIGS[d]
            out.append(dict(N=4096, d=d, batch=1, heads=4, causal=False,
                            block_rows=c["BLOCK_R"], block_cols=c["BLOCK_C"], version=1))
    return out


def _launch(p, Q, K, V):
    """(O, L) of one launch of the tensor-core kernel at point ``p``."""
    launch = tc.configure(p["batch"], p["heads"], p["N"], p["d"], dtype="fp16",
                          causal=p["causal"], block_rows=p["block_rows"],
                          block_cols=p["block_cols"], version=p["version"])
    return launch.run(Q, K, V)


def _inputs(p):
    import cupy as cp
    rng = cp.random.default_rng(p["N"] * 10 + p["d"])
    shape = (p["batch"], p["heads"], p["N"], p["d"])
    return tuple(rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)
                 for _ in range(3))


def check(pts: list[dict]) -> list[dict]:
    """Each point's O against softmax(Q K^T / sqrt(d)) V in float32, before profiling."""
    import cupy as cp
    out = []
    for p in pts:
        Q, K, V = _inputs(p)
        O, _ = _launch(p, Q, K, V)
        q, k, v = (x.astype(cp.float32) for x in (Q, K, V))
        S = q @ cp.swapaxes(k, -1, -2) / p["d"] ** 0.5
        if p["causal"]:
            S = cp.where(cp.tril(cp.ones((p["N"], p["N"]), bool)), S, -cp.inf)
        P = cp.exp(S - S.max(-1, keepdims=True))
        ref = (P @ v) / P.sum(-1, keepdims=True)
        err = float(cp.abs(O.astype(cp.float32) - ref).max())
        out.append(dict(p, max_abs_err=err, ok=err <= 1e-2))
    return out


def workload(manifest: str) -> None:
    """What ncu profiles: one launch of flash2_tc_fwd per point, in order."""
    import cupy as cp
    with open(manifest) as f:
        pts = json.load(f)["points"]
    for p in pts:
        Q, K, V = _inputs(p)
        _launch(p, Q, K, V)
        cp.cuda.Device().synchronize()


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/local/cuda/bin/{name}",) if os.path.exists(p)), None)


def query(out_dir: str) -> tuple[list[str], list[str]]:
    """(candidate metrics this ncu lists, every query line mentioning xu / mufu / opcode)."""
    q = subprocess.run([_tool("ncu") or "ncu", "--query-metrics"], capture_output=True,
                       text=True)
    with open(os.path.join(out_dir, "ncu_query_metrics.txt"), "w") as f:
        f.write(q.stdout + q.stderr)
    names = {ln.split()[0] for ln in q.stdout.splitlines() if ln.strip()}
    found = [m for m in CANDIDATES if m.split(".")[0] in names]
    matches = [ln.strip() for ln in q.stdout.splitlines()
               if re.search(r"pipe_xu|mufu|per_opcode", ln, re.I)]
    return found, matches


def static_sass(pts: list[dict], out_dir: str) -> dict:
    """Opcode counts of each variant's SASS (nvcc -cubin, cuobjdump -sass)."""
    nvcc, cuobjdump = _tool("nvcc"), _tool("cuobjdump")
    if not (nvcc and cuobjdump):
        return {"error": "nvcc or cuobjdump not found"}
    src = os.path.join(KERNEL_DIR, tc.CU_FILE)
    out = {}
    for p in pts:
        D = tc.defines(p["d"], "fp16", version=p["version"], block_rows=p["block_rows"],
                       block_cols=p["block_cols"])
        label = " ".join(f"{k}={v}" for k, v in D.items())
        if label in out:
            continue
        cubin = os.path.join(out_dir, f"flash2_tc_{len(out)}.cubin")
        cmd = [nvcc, "-cubin", "-arch=sm_90", "-std=c++17", "-I", KERNEL_DIR, "-o", cubin, src] + \
            [f"-D{k}={v}" for k, v in D.items()]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            out[label] = {"error": r.stderr[-2000:]}
            continue
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
        ops = re.findall(r"\b(MUFU\.[A-Z0-9]+|F2FP\.[A-Z0-9._]+|I2F[A-Z0-9.]*|F2I[A-Z0-9.]*)",
                         sass)
        counts: dict[str, int] = {}
        for o in ops:
            counts[o] = counts.get(o, 0) + 1
        out[label] = counts
    return out


def parse_csv(text: str, metrics: list[str]) -> list[dict]:
    """Rows of ``ncu --csv --page raw``: one per profiled launch, values as printed."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], rows[2:]
    out = []
    for r in body:
        rec = dict(zip(header, r))
        vals = {}
        for m in metrics:
            v = rec.get(m)
            if v is None:
                continue
            try:
                vals[m] = float(v.replace(",", ""))
            except ValueError:
                vals[m] = v            # an instanced metric: kept as printed
        out.append({"kernel_name": rec.get("Kernel Name"), "metrics": vals})
    return out


def per_opcode(raw) -> dict:
    """``{OPCODE: count}`` from an instanced value as ncu prints it ("MUFU: 123; FFMA:
    456" and the like); empty when the text holds no such pairs."""
    if not isinstance(raw, str):
        return {}
    pairs = re.findall(r"([A-Z][A-Z0-9_.]*)\s*[:=]?\s*\(?\s*([0-9][0-9,]*(?:\.[0-9]+)?)", raw)
    return {k: float(v.replace(",", "")) for k, v in pairs}


def run(out_dir: str, quick: bool) -> None:
    from gpu_kernels.harness import provenance
    from flashsim.measured import sfu

    os.makedirs(out_dir, exist_ok=True)
    pts = points(quick)
    found, matches = query(out_dir)
    print("metrics found:", found, flush=True)
    sass = static_sass(pts, out_dir)
    checked = check(pts)
    bad = [c for c in checked if not c["ok"]]
    if bad:
        raise SystemExit(f"wrong results, nothing profiled: {bad}")
    manifest = os.path.join(out_dir, "manifest.json")
    with open(manifest, "w") as f:
        json.dump({"points": pts}, f)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def command(metrics):
        instances = ["--print-metric-instances", "details"] if PER_OPCODE in metrics else []
        return [_tool("ncu") or "ncu", "--clock-control", "none", "--kernel-name", KERNEL,
                "--metrics", ",".join(metrics), "--csv", "--page", "raw", *instances,
                sys.executable, "-m", "benchmarks.sfu_check", "workload", "--manifest", manifest]
    # sass__* metrics come from another provider and are not in --query-metrics' list:
    # ask for the per-opcode counts anyway, and do without them if this ncu refuses
    if PER_OPCODE not in found:
        found = found + [PER_OPCODE]
    cmd = command(found)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode and PER_OPCODE in found:
        print(proc.stderr[-2000:])
        print(f"ncu refused the metrics; again without {PER_OPCODE}", flush=True)
        found = [m for m in found if m != PER_OPCODE]
        cmd = command(found)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    with open(os.path.join(out_dir, "sfu_h200_raw.csv"), "w") as f:
        f.write(proc.stdout)
    with open(os.path.join(out_dir, "sfu_stderr.txt"), "w") as f:
        f.write(proc.stderr[-200000:])
    if proc.returncode:
        print(proc.stderr[-3000:])
        raise SystemExit(f"ncu exited {proc.returncode}")
    rows = parse_csv(proc.stdout, found)
    if len(rows) != len(pts):
        raise SystemExit(f"{len(rows)} profiled launches for {len(pts)} points")
    for p, r, c in zip(pts, rows, checked):          # the same order throughout
        p["metrics"] = r["metrics"]
        p["per_opcode"] = per_opcode(r["metrics"].get(PER_OPCODE))
        p["max_abs_err"] = c["max_abs_err"]
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(0)
    ncu_version = subprocess.run([_tool("ncu") or "ncu", "--version"], capture_output=True,
                                 text=True).stdout.strip().splitlines()
    name = props["name"]
    data = {
        "provenance": provenance(("numpy", "cupy-cuda13x"), {
            "gpu": name.decode() if isinstance(name, bytes) else name,
            "sms": props["multiProcessorCount"], "ncu": ncu_version[-1] if ncu_version else None,
            "ncu_command": " ".join(cmd),
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion()}),
        "method": "one launch per point under ncu --clock-control none --kernel-name "
                  f"{KERNEL}; outputs checked against float32 first (max |err| <= 1e-2)",
        "metrics_found": found, "query_matches": matches, "static_sass": sass,
        "points": pts,
    }
    with open(os.path.join(out_dir, "sfu_h200.json"), "w") as f:
        json.dump(data, f, indent=1)
    print(sfu.format_rows(sfu.compare(data)))


def compare_file(path: str) -> None:
    from flashsim.measured import sfu
    with open(path) as f:
        data = json.load(f)
    rows = sfu.compare(data)
    print(sfu.format_rows(rows))
    print("all within 10%" if all(r["within"] for r in rows) else "NOT all within 10%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--quick", action="store_true", help="N = 1024 only")
    w = sub.add_parser("workload")
    w.add_argument("--manifest", required=True)
    c = sub.add_parser("compare")
    c.add_argument("path")
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.out, a.quick)
    elif a.cmd == "workload":
        workload(a.manifest)
    else:
        compare_file(a.path)


if __name__ == "__main__":
    main()
