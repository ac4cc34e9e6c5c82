"""GPU kernels that run flashsim's algorithms with the same tiles.

numba.cuda kernels (fp32, readable Python) live in ``numba_*.py``; CUDA C++ kernels for
CuPy's RawModule live in ``cuda/*.cu`` with their loaders in ``cupy_*.py``.
Nothing here touches a GPU at import time: each module imports numba or CuPy lazily.
"""


def gpu_available() -> bool:
    """Asked only when called (never at import): is a CUDA GPU usable through CuPy?"""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no"
        return False
