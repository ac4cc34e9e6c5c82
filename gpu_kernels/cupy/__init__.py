"""CUDA C++ kernels (``gpu_kernels/cuda/*.cu``) loaded through CuPy's RawModule: one module
per kernel file, each with ``configure(B, H, N, d, ...) -> Launch`` and ``compile_variants()``.
Call them through ``gpu_kernels.attention(..., backend="cupy")`` or ``gpu_kernels.registry``."""
