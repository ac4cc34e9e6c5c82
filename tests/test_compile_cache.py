"""gpu_kernels/compile_cache.json: what the compile checks read of each compile (ptxas logs,
facts of numba's PTX, linker logs), committed under the hash of the compile's inputs and
compiler so that CI need not compile ~190 variants on every run (gpu_kernels/compile.py).

A compile the file lacks still runs in its test; these tests make a forgotten refresh
visible and recompute a sample whatever the hashes say.
"""

from __future__ import annotations

import pytest
from _checks import stale_compiles

from gpu_kernels import compile as cuda_compile
from gpu_kernels.cupy.common import read_source


def test_the_cache_holds_every_compile_ci_checks():
    reason = stale_compiles()
    if reason:
        pytest.fail(reason)


def test_a_sample_of_logs_is_what_nvrtc_gives_now():
    """The first variant of each .cu file, compiled now: ptxas reports what the committed log
    says (were an input missing from the key, a stale entry would show here)."""
    pytest.importorskip("cuda.core")
    if cuda_compile.stale()[0]:
        pytest.skip("the cache is stale (the test above says why)")
    first = {}
    for cu_file, defines, _dyn, _hot in cuda_compile.cached_variants():
        first.setdefault(cu_file, defines)
    assert len(first) >= 6
    for cu_file, defines in first.items():
        args = (read_source(cu_file), defines)
        kw = dict(arch=cuda_compile.arch_for(cu_file, defines), name=cu_file)
        _, now = cuda_compile.compile_cubin(*args, **kw)
        stored = cuda_compile.ptxas_log(*args, **kw)
        assert cuda_compile.parse_ptxas_log(now) == cuda_compile.parse_ptxas_log(stored), cu_file
