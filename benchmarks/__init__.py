"""Scripts that measure, each run as a module from the repository root:

    python -m benchmarks.all --out DIR            # the GPU tests and every GPU benchmark
    python -m benchmarks.NAME --out DIR           # one of them

Every GPU script checks each launch against a float64 reference before timing it with the
one harness (``gpu_kernels.harness``: CUDA events, warm-up, a 2 x L2 flush before each
repeat, the median) and writes DIR/NAME.json with ``harness.provenance()``. DIR defaults to
the committed data folder (``flashsim/measured/data/``, linked as ``benchmarks/results``).
"""
