"""How fast the simulator answers (issues 2 and 18's targets), recorded as data.

    python -m benchmarks.core_speed [--out DIR]     # writes DIR/core_speed.json

In-process targets (issue 2): count-only flash2 at N = 65536, d = 128, B_r = B_c = 64 under
1 s; flash2 with values at N = 4096, d = 64 under 2 s; 200 SRAM sizes through the closed
forms under 50 ms. Each figure is the median of several runs after one warm-up.

CLI targets (issue 18), each a fresh ``python -m flashsim.cli`` process under
``/usr/bin/time -v`` with its address space limited to 4 GiB: wall seconds, CPU seconds
(user + system) and peak resident memory, the exit status and the lines on stderr. The
million-token L2 model under 10 s and 1 GB, count-only at N = 2^22 under 2 s, standard
attention's L2 model at N = 65536 under 10 s, and every input the issue listed ending with
exit status 0 or 2 (one stderr line) within 30 s. The machine's load average is stored
with the numbers: wall time on a shared machine is longer than on a quiet one, CPU time
much less so.
"""

from __future__ import annotations

import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile

import numpy as np

import flashsim
from benchmarks.common import Progress, parser, write_json
from gpu_kernels.harness import provenance, wall_median_s as median_seconds

PACKAGES = ("numpy",)
MEMORY_LIMIT = 4 * 2**30

# (what, argv, wall-seconds target, peak-memory target in bytes or None, exit statuses)
CLI = [
    ("L2 model, flash2, N = 2^20, d = 128, H200",
     "io -a flash2 -N 1048576 -d 128 --gpu h200 --json", 10, 2**30, (0,)),
    ("count-only flash2, N = 2^22, d = 128 (H200's M)",
     "io -a flash2 -N 4194304 -d 128 --json", 2, None, (0,)),
    ("count-only flash2 causal fwd+bwd, N = 2^22, d = 128",
     "io -a flash2 -N 4194304 -d 128 --causal --pass fwd+bwd --json", 10, None, (0,)),
    ("L2 model, standard, N = 65536, d = 64, H200",
     "io -a standard -N 65536 -d 64 --gpu h200", 10, None, (0,)),
    ("compare with the L2 model, N = 2^20, d = 128, H200",
     "compare -N 1048576 -d 128 --gpu h200 --json", 30, None, (0,)),
    *(("issue 18: " + what, args, 30, None, (status,)) for what, args, status in [
        ("N of 200 digits", "io -a flash2 -N " + "1" * 200 + " -d 64", 2),
        ("--sram of 200 digits with a unit",
         "io -a flash2 -N 64 -d 64 --sram " + "1" * 200 + "KiB", 2),
        ("--l2 of 200 digits", "io -a flash2 -N 64 -d 64 --l2 " + "1" * 200, 2),
        ("--batch of 200 digits", "io -a flash2 -N 64 -d 64 --batch " + "1" * 200, 2),
        ("--verify --seed -1", "io -a flash2 -N 64 -d 64 --verify --seed -1", 2),
        ("--verify at N = 32768 (was killed at 24 GB)", "io -a flash2 -N 32768 -d 64 --verify", 2),
        ("L2 model at N = 2^20, d = 128 (died after 7 minutes)",
         "io -a flash2 -N 1048576 -d 128 --gpu h200", 0),
        ("N = 10^9 (hung)", "io -a flash2 -N 1000000000 -d 64", 2),
        ("standard, N = 100000, 1 KiB of SRAM (hung)",
         "io -a standard -N 100000 -d 64 --sram 1KiB", 0),
        ("N = 10^12 (wrong words)", "io -a flash2 -N 1000000000000 -d 64", 2),
        ("flash1 at 3 KiB (said no tile fits)", "io -a flash1 -N 4096 -d 128 --sram 3KiB", 0),
    ]),
    ("L2 model under a causal mask past its limit (one clear error)",
     "io -a flash2 -N 1048576 -d 128 --gpu h200 --causal", 30, None, (2,)),
]


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(args: str) -> dict:
    """One fresh process under /usr/bin/time -v: wall, CPU, peak RSS, status, stderr."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        cmd = ["/usr/bin/time", "-v", "-o", timing.name, sys.executable, "-m", "flashsim.cli",
               *args.split()]
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
        r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_limit, env=env,
                           timeout=300)
        report = timing.read()
    own_err = r.stderr

    def field(name):
        return re.search(re.escape(name) + r": (.*)", report).group(1).strip()

    h, m, s = ([0, 0] + field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":"))[-3:]
    return {
        "exit_status": int(field("Exit status")),
        "wall_s": 3600 * int(h) + 60 * int(m) + float(s),
        "cpu_s": float(field("User time (seconds)")) + float(field("System time (seconds)")),
        "peak_rss_bytes": 1024 * int(field("Maximum resident set size (kbytes)")),
        "stderr_lines": len(own_err.splitlines()),
        "stdout_bytes": len(r.stdout),
        "stderr": own_err.strip()[:300],
    }


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((4096, 64)) for _ in range(3))
    big = flashsim.plan("flash2", 65536, 128, block_rows=64, block_cols=64, sram="1MiB")
    values = flashsim.plan("flash2", 4096, 64, block_rows=64, block_cols=64, sram="1MiB")
    sizes = np.unique(np.geomspace(16 * 1024, 1024 * 1024, 200).astype(int))

    def sweep():
        for m in sizes:
            flashsim.plan("flash1", 4096, 64, sram=int(m)).closed_form()

    results = [
        {"what": "count-only flash2, N=65536, d=128, B_r=B_c=64", "target_s": 1.0,
         "seconds": median_seconds(big.count, 5)},
        {"what": "flash2 with float64 values, N=4096, d=64, B_r=B_c=64", "target_s": 2.0,
         "seconds": median_seconds(lambda: values.run(Q, K, V), 3)},
        {"what": f"{len(sizes)} SRAM sizes (16 KiB to 1 MiB) through flash1's closed form "
                 "with default blocks, N=4096, d=64", "target_s": 0.05,
         "seconds": median_seconds(sweep, 5)},
    ]
    for r in results:
        r["met"] = r["seconds"] < r["target_s"]
        print(f"{r['seconds'] * 1e3:9.1f} ms  (target {r['target_s'] * 1e3:.0f} ms)  {r['what']}")
    cli = []
    for what, args, target_s, target_mem, statuses in Progress(CLI, quiet=args.quiet,
                                                                desc="core_speed CLI"):
        load = os.getloadavg()[0]
        m = run_cli(args)
        m.update({"what": what, "argv": "flashsim " + args if len(args) < 200 else
                  "flashsim " + args[:60] + "...", "target_wall_s": target_s,
                  "target_peak_rss_bytes": target_mem, "expected_exit": list(statuses),
                  "load_average_1min_before": load})
        m["met"] = (m["exit_status"] in statuses and m["wall_s"] < target_s
                    and (target_mem is None or m["peak_rss_bytes"] < target_mem)
                    and (m["exit_status"] == 0 or (m["stderr_lines"] == 1
                                                   and m["stdout_bytes"] == 0)))
        cli.append(m)
        print(f"{m['wall_s']:7.2f} s wall {m['cpu_s']:7.2f} s cpu "
              f"{m['peak_rss_bytes'] / 2**20:7.1f} MiB  exit {m['exit_status']}  "
              f"{'ok ' if m['met'] else 'MISS'} {what}")
    doc = {"provenance": provenance(PACKAGES, extra={"cpus": os.cpu_count(),
                                                    "cli_memory_limit_bytes": MEMORY_LIMIT}),
           "results": results, "cli": cli}
    print("wrote", write_json(args.out, "core_speed.json", doc, indent=2))


if __name__ == "__main__":
    main()
