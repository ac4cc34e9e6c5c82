"""``flashsim measure --all --ncu`` on the GPU machine, written with its provenance, then the
GPU tests of our kernels from PyTorch and of ``flashsim measure``.

    python -m benchmarks.measure_all --out DIR          # about 2 to 3 minutes on the H200
    python -m benchmarks.measure_all --out DIR --no-tests

Writes DIR/measure_h200.json: ``provenance`` (``gpu_kernels.harness.provenance``, with ncu's
version), ``command`` (the flashsim command it is the output of), ``rows`` (one per
registered forward kernel at flashsim measure's default shape, B = 2, H = 8, N = 2048,
d = 64, each kernel's first dtype, and one per decode kernel at its default decode shape,
B = 8, H = 32, kv_heads = 8, q_len = 1, kv_len = 32768, d = 128, fp16, pages of 16: the
check against the float64 reference, the harness's time, Nsight Compute's DRAM and L2
request bytes and kernel time, and flashsim's prediction for that launch) and ``skipped``.
Without ncu on PATH the counters are left out and a note says so. Commit it as
flashsim/measured/data/measure_h200.json.

Then (unless ``--no-tests``) ``FLASHSIM_REAL_GPU=1 python -m pytest -m gpu
tests/test_torch_api.py tests/test_measure.py tests/test_predict_decode.py``:
gpu_kernels.torch's forward and backward against PyTorch's scaled_dot_product_attention,
and ``flashsim measure`` run as a user runs it (a decode kernel too); the log in
DIR/logs/gpu_tests.log.

Prints the table of ``flashsim measure``; exit status 1 if any check, the ncu run or a test
failed, 2 if there is no GPU to measure on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.common import parser, write_json
from flashsim import cli, measure
from flashsim.errors import FlashsimError
from gpu_kernels import harness, ncu

NAME = "measure_h200.json"
TESTS = ["tests/test_torch_api.py", "tests/test_measure.py", "tests/test_predict_decode.py"]


def measure_all(use_ncu: bool, quiet: bool) -> dict:
    """``flashsim measure --all`` (``--ncu`` when asked and ncu is on PATH), as data."""
    notes = []
    if use_ncu and ncu.executable() is None:
        notes.append("ncu is not on PATH: DRAM and L2 request bytes left out")
        use_ncu = False
    argv = ["measure", "--all"] + (["--ncu"] if use_ncu else []) + (["--quiet"] if quiet else [])
    rows, skipped = measure.run(cli.build_parser().parse_args(argv))
    extra = {"ncu": ncu.version()} if use_ncu else {}
    return {"provenance": harness.provenance(extra=extra),
            "command": "flashsim " + " ".join(a for a in argv if a != "--quiet") + " --json",
            "rows": rows, "skipped": skipped, "notes": notes}


def gpu_tests(out_dir: str) -> dict:
    """The GPU tests of gpu_kernels.torch in a process of their own (the real GPU, never
    numba's simulator); their output in DIR/logs."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["FLASHSIM_REAL_GPU"] = "1"
    os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
    log = os.path.join(out_dir, "logs", "gpu_tests.log")
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-o", "addopts=", "-q",
                             "-p", "no:cacheprovider", "-rs", *TESTS], cwd=root, env=env,
                            stdout=f, stderr=subprocess.STDOUT).returncode
    with open(log) as f:
        last = [ln for ln in f.read().splitlines() if ln.strip()]
    return {"returncode": rc, "seconds": round(time.time() - t0, 1),
            "summary": last[-1] if last else ""}


def main(argv=None) -> int:
    ap = parser(__doc__, out_required=True)
    ap.add_argument("--no-ncu", action="store_true", help="leave Nsight Compute out")
    ap.add_argument("--no-tests", action="store_true", help=f"skip {' and '.join(TESTS)}")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        data = measure_all(not args.no_ncu, args.quiet)
    except FlashsimError as e:
        print(f"measure_all: {e}", file=sys.stderr)
        return 2
    path = write_json(args.out, NAME, data)
    print(measure.format_rows(data["rows"], data["skipped"]))
    print("\n".join(data["notes"]))
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    ok = all(r.get("check_ok") and "ncu_error" not in r for r in data["rows"])
    if not args.no_tests:
        tests = gpu_tests(args.out)
        print(f"GPU tests of {' and '.join(TESTS)}: {tests['summary']} ({tests['seconds']} s)")
        ok = ok and tests["returncode"] == 0
    print(f"total {time.time() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
