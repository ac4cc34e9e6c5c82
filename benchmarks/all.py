"""Everything measured on a GPU in one command: the GPU tests, then every GPU benchmark.

    python -m benchmarks.all --out DIR            # about 8 minutes on the H200
    python -m benchmarks.all --out DIR --quick    # fewer points: about 4 minutes
    python -m benchmarks.all --out DIR --ncu      # also the Nsight Compute sweep (needs ncu)
    python -m benchmarks.all --out DIR --cpu      # also the CPU benchmarks (core_speed,
                                                  # slider_latency: they time this host's CPU)

Run from the repository root. The steps, in order, each its own process with a time limit
(``--scale`` multiplies the limits and the scripts' deadlines):

    sm_placement   python -m benchmarks.sm_placement         -> DIR/sm_placement.json
    numba_h200     python -m benchmarks.numba_h200 --explore 1 -> DIR/numba_h200.json
    cupy_h200      python -m benchmarks.cupy_h200            -> DIR/cupy_h200.json
    backward_h200  python -m benchmarks.backward_h200        -> DIR/backward_h200.json
    decode_h200    python -m benchmarks.decode_h200          -> DIR/decode_h200.json (--decode
                                                                or --ncu: its 4 minutes do not
                                                                fit the default 10)
    ncu_sweep      python -m benchmarks.ncu_sweep run        -> DIR/ncu_h200.json, raw CSV (--ncu)
    sfu_check      python -m benchmarks.sfu_check run        -> DIR/sfu_h200.json (--ncu)
    measure_all    python -m benchmarks.measure_all --no-tests -> DIR/measure_h200.json (--ncu)
    core_speed, slider_latency                               -> DIR/*.json (--cpu)
    gpu_tests      FLASHSIM_REAL_GPU=1 pytest -m gpu tests   -> DIR/gpu_tests.xml (JUnit)

ring_attention needs two GPUs and runs on its own (its docstring has the command), as does
hopper_h200 (the Hopper kernel's versions beside PyTorch: about six minutes by itself) and
masks_h200 (its mask path beside flex_attention and SDPA: about five minutes).
The limits add up to 560 s without --ncu and --cpu, so the whole run fits one 10-minute
command. Should the GPU tests need longer, run ``--no-tests`` in one call and the tests
(``FLASHSIM_REAL_GPU=1 python -m pytest -m gpu -o addopts=""``) in another.

Each step's output goes to DIR/logs/STEP.log; DIR/all.json lists every step's command,
exit status, seconds and the files it wrote, with the provenance. A step that fails or runs
out of time does not stop the others. Then, to commit: copy the JSON files into
flashsim/measured/data/ and run ``python -m flashsim.measured.validation`` (after a new
ncu sweep) and ``python docs/make_measurements.py``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

from benchmarks.common import Progress, parser, write_json
from gpu_kernels import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps(args) -> list[tuple[str, list[str], float, dict]]:
    """(name, argv, time limit in seconds, extra environment) of each step to run."""
    py, out, k = sys.executable, args.out, args.scale

    def bench(name, *extra, limit):
        return (name, [py, "-m", f"benchmarks.{name}", *extra, "--out", out], limit * k, {})

    quick = args.quick
    out_steps = [
        bench("sm_placement", limit=30),
        bench("numba_h200", *(["--quick"] if quick else ["--explore", "1"]),
              "--deadline-s", str((40 if quick else 85) * k), limit=70 if quick else 120),
        bench("cupy_h200", *(["--sweep-n", "4096", "--fp32-n", "1024", "--no-eager"] if quick else []),
              "--deadline-s", str((50 if quick else 100) * k), limit=80 if quick else 140),
        bench("backward_h200", "--deadline-s", str((30 if quick else 45) * k),
              limit=60 if quick else 80),
    ]
    if getattr(args, "decode", False) or args.ncu:
        out_steps.append(bench("decode_h200", *(["--quick"] if quick else []),
                               "--deadline-s", str((60 if quick else 200) * k),
                               limit=120 if quick else 270))
    if args.ncu:
        out_steps.append(("ncu_sweep", [py, "-m", "benchmarks.ncu_sweep", "run", "--out", out]
                          + (["--quick"] if quick else []), 1800 * k, {}))
        out_steps.append(("sfu_check", [py, "-m", "benchmarks.sfu_check", "run", "--out", out]
                          + (["--quick"] if quick else []), 240 * k, {}))
        # flashsim measure --all --ncu (its GPU tests run in gpu_tests below)
        out_steps.append(bench("measure_all", "--no-tests", limit=240))
    if args.cpu:
        out_steps += [bench("core_speed", limit=120), bench("slider_latency", limit=300)]
    # last: a test run cut short by its limit costs no measurement (and finds the kernels
    # the benchmarks compiled in CuPy's cache)
    out_steps.append(("gpu_tests", [py, "-m", "pytest", "-m", "gpu", "-o", "addopts=", "-q", "-p",
                                    "no:cacheprovider",
                                    f"--junitxml={os.path.join(out, 'gpu_tests.xml')}", "tests"],
                      190 * k, {"FLASHSIM_REAL_GPU": "1"}))
    return out_steps


def run_step(name: str, argv: list[str], limit: float, env_extra: dict, log_dir: str) -> dict:
    """Run one step in its own process group, killed (all of it) at ``limit`` seconds."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    log = os.path.join(log_dir, f"{name}.log")
    t0 = time.time()
    print(f"[{name}] {' '.join(argv)} (limit {limit:.0f} s)", flush=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
            status = "ok" if rc == 0 else f"exit status {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            status = f"killed after {limit:.0f} s"
    seconds = round(time.time() - t0, 1)
    with open(log) as f:
        tail = f.read()[-1500:]
    print(f"[{name}] {status} in {seconds} s\n{tail[-600:]}", flush=True)
    return {"step": name, "command": " ".join(argv), "returncode": rc, "status": status,
            "seconds": seconds, "limit_s": limit, "log": os.path.relpath(log, ROOT)
            if log.startswith(ROOT) else log}


def main(argv=None) -> int:
    ap = parser(__doc__, out_required=True)
    ap.add_argument("--quick", action="store_true", help="fewer points in every benchmark")
    ap.add_argument("--ncu", action="store_true", help="also the Nsight Compute sweep (slow)")
    ap.add_argument("--cpu", action="store_true", help="also the CPU benchmarks")
    ap.add_argument("--decode", action="store_true", help="also the decode benchmark (4 minutes)")
    ap.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every time limit and deadline by this")
    args = ap.parse_args(argv)
    log_dir = os.path.join(args.out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    t0 = time.time()
    results = []
    for name, step_argv, limit, env in Progress(steps(args), quiet=args.quiet,
                                                desc="benchmarks.all"):
        if name == "gpu_tests" and args.no_tests:
            continue
        if name == "gpu_tests" and importlib.util.find_spec("pytest") is None:
            results.append({"step": name, "status": "skipped: pytest is not installed here",
                            "returncode": None})
            print(f"[{name}] skipped: pytest is not installed here", flush=True)
            continue
        results.append(run_step(name, step_argv, limit, env, log_dir))
    written = sorted(f for f in os.listdir(args.out) if f != "logs"
                     and os.path.getmtime(os.path.join(args.out, f)) >= t0)
    summary = {"provenance": harness.provenance(), "seconds": round(time.time() - t0, 1),
               "steps": results, "files": written}
    write_json(args.out, "all.json", summary)
    print(f"\n{'step':<16}{'status':<28}{'seconds':>8}")
    for r in results:
        print(f"{r['step']:<16}{r['status']:<28}{r.get('seconds', 0):>8}")
    print(f"total {summary['seconds']} s; wrote {', '.join(written)} and all.json in {args.out}")
    return 0 if all(r["returncode"] in (0, None) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
