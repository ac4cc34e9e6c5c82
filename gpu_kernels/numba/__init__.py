"""numba.cuda kernels in fp32, one module per algorithm (``standard``, ``flash1``, ``flash2``)
and the backward passes (``backward``); ``common`` holds the thread layout and the
register-tiled device functions they are written with. Each module's ``configure(...)``
returns a Launch; call them through ``gpu_kernels.attention(..., backend="numba")`` or
``gpu_kernels.registry``. Importing a module imports numba (no GPU is touched)."""
