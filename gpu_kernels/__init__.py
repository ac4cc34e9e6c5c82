"""GPU kernels that run flashsim's algorithms with the same tiles.

numba.cuda kernels (fp32, readable Python) live in ``numba_*.py``; CUDA C++ kernels for
CuPy's RawModule live in ``cuda/*.cu`` with their loaders in ``cupy_*.py``.
Nothing here touches a GPU at import time: each module imports numba or CuPy lazily.
"""
