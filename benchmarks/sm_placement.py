"""Which SM runs which thread block, and when: the schedule an L1/L2 model must assume.

    python -m benchmarks.sm_placement --out DIR

A probe kernel records, for every block, the SM it ran on (``%smid``) and its start and end
on the global timer (``%globaltimer``, ns). Its grid is laid out as the attention kernels'
(``blockIdx.x`` = the Q block, ``blockIdx.y`` = the head); dynamic shared memory is sized so
that ``k`` blocks fit on an SM at once, as the kernels' occupancy limits do. Each block
spins for a fixed time (``uniform``) or for a time that grows with ``blockIdx.x``
(``causal``: block i of a causal FA2 kernel does i + 1 steps). Writes
``$OUT/sm_placement.json``: the raw per-block records and, per configuration, the blocks
that shared an SM at the start.
"""

from __future__ import annotations

import sys

from benchmarks.common import parser, write_json
from gpu_kernels import harness

SOURCE = r"""
extern "C" __global__ void probe(unsigned* sm, unsigned long long* start,
                                 unsigned long long* stop, long long base_ns, long long step_ns) {
    extern __shared__ float pad[];
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const long long spin = base_ns + step_ns * (long long)blockIdx.x;
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < spin);
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        const size_t b = blockIdx.x + (size_t)gridDim.x * blockIdx.y;
        pad[0] = (float)s;                       // keep the shared allocation
        sm[b] = s; start[b] = t0; stop[b] = t;
    }
}
"""

CONFIGS = [  # (name, grid x (Q blocks), grid y (heads), blocks per SM, base ns, step ns)
    ("uniform", 16, 256, 1, 20000, 0),
    ("uniform", 16, 256, 2, 20000, 0),
    ("uniform", 16, 256, 4, 20000, 0),
    ("uniform", 16, 256, 6, 20000, 0),
    ("uniform", 64, 64, 4, 20000, 0),
    ("uniform", 512, 8, 4, 20000, 0),
    ("causal", 16, 256, 4, 2000, 2000),
    ("causal", 64, 64, 4, 2000, 500),
]


def run(out_dir: str) -> None:
    import cupy

    dev = cupy.cuda.Device(0)
    smem_per_sm = dev.attributes["MaxSharedMemoryPerMultiprocessor"]
    kern = cupy.RawKernel(SOURCE, "probe")
    kern.max_dynamic_shared_size_bytes = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    results = []
    for name, gx, gy, k, base, step in CONFIGS:
        n = gx * gy
        # k blocks per SM: each takes just over 1/(k+1) of the SM's shared memory
        smem = smem_per_sm // (k + 1) + 1024 if k > 1 else smem_per_sm // 2 + 1024
        sm = cupy.zeros(n, dtype=cupy.uint32)
        t0 = cupy.zeros(n, dtype=cupy.uint64)
        t1 = cupy.zeros(n, dtype=cupy.uint64)
        for _ in range(2):          # the second run is recorded
            kern((gx, gy), (128,), (sm, t0, t1, cupy.int64(base), cupy.int64(step)),
                 shared_mem=smem)
        cupy.cuda.runtime.deviceSynchronize()
        sm_h, t0_h, t1_h = sm.get().tolist(), t0.get(), t1.get()
        origin = int(t0_h.min())
        results.append(dict(
            config=name, grid=[gx, gy], blocks_per_sm_target=k, dynamic_smem=smem,
            base_ns=base, step_ns=step, sm=sm_h,
            start_ns=(t0_h - origin).tolist(), stop_ns=(t1_h - origin).tolist()))
        first = sorted(range(n), key=lambda b: t0_h[b])[:8]
        print(f"{name:8s} grid=({gx},{gy}) k={k}: first blocks {first} on SMs "
              f"{[sm_h[b] for b in first]}", flush=True)
    prov = harness.provenance(extra={"sms": dev.attributes["MultiProcessorCount"],
                                     "smem_per_sm": smem_per_sm})
    print("wrote", write_json(out_dir, "sm_placement.json",
                              {"provenance": prov, "source": SOURCE, "runs": results}, indent=None))


def main(argv=None) -> int:
    run(parser(__doc__).parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
