"""How fast the simulator answers (issue 2's targets), recorded as data.

    python -m benchmarks.core_speed [--out DIR]     # writes DIR/core_speed.json

Targets: count-only flash2 at N = 65536, d = 128, B_r = B_c = 64 under 1 s; flash2 with
values at N = 4096, d = 64 under 2 s; 200 SRAM sizes through the closed forms under 50 ms.
Each figure is the median of several runs after one warm-up (``harness.wall_median_s``:
the host's clock; nothing here runs on a GPU).
"""

from __future__ import annotations

import numpy as np

import flashsim
from benchmarks.common import parser, write_json
from gpu_kernels.harness import provenance, wall_median_s as median_seconds

PACKAGES = ("numpy",)


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
    doc = {"provenance": provenance(PACKAGES), "results": results}
    print("wrote", write_json(args.out, "core_speed.json", doc, indent=2))


if __name__ == "__main__":
    main()
