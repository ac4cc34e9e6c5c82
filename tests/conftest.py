"""Test set-up shared by every test file.

numba's CUDA simulator must be chosen before numba is first imported, so it is set here:
without a GPU (CI, laptops) numba kernels run under ``NUMBA_ENABLE_CUDASIM=1``, with its
thread blocks waiting at ``syncthreads()`` instead of polling (``_cudasim.py``). On a GPU
machine, run with ``FLASHSIM_REAL_GPU=1`` to use the real device instead. Nothing here asks
the hardware anything.
"""

import os

if os.environ.get("FLASHSIM_REAL_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    import _cudasim

    _cudasim.install()

# Property tests (hypothesis): random examples on a developer's machine, a fixed sequence in CI
# (CI=true), so a CI failure reproduces on a rerun and a pass does not depend on the draw.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI", "").lower() in ("1", "true"):
    settings.load_profile("ci")
