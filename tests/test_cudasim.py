"""The simulator's thread blocks as tests/_cudasim.py runs them keep numba's rule: a
barrier opens when every live thread of the block waits at it, ``syncthreads_count`` counts
the block, and a thread's exception aborts the block and is raised naming the thread. Each
check runs under numba's own BlockManager too, so the two are held to the same results."""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM:
    pytest.skip("the simulator is off (FLASHSIM_REAL_GPU=1)", allow_module_level=True)

from numba.cuda.simulator import kernel as sim  # noqa: E402

THREADS = 32


@pytest.fixture(params=["_cudasim", "numba"])
def manager(request, monkeypatch):
    assert sim.BlockManager.__module__ == "_cudasim"       # tests/conftest.py installed it
    if request.param == "numba":
        monkeypatch.setattr(sim, "BlockManager", sim.BlockManager.__mro__[1])
    return request.param


@cuda.jit
def rotate(out, rounds):
    """Each round every thread writes its value to shared memory and takes its right
    neighbour's: correct only if each barrier waits for the whole block. Threads past
    ``out``'s length end first (the barrier then counts the others)."""
    buf = cuda.shared.array(THREADS, np.int64)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    if i >= out.shape[0]:
        return
    n = min(THREADS, out.shape[0] - cuda.blockIdx.x * THREADS)
    v = i
    for _ in range(rounds):
        buf[t] = v
        cuda.syncthreads()
        v = buf[(t + 1) % n]
        cuda.syncthreads()
    out[i] = v


def test_barriers_wait_for_the_whole_block(manager):
    out = np.zeros(2 * THREADS + 5, np.int64)
    rotate[3, THREADS](out, 3)
    want = [b * THREADS + (t + 3) % n for b, n in enumerate((THREADS, THREADS, 5))
            for t in range(n)]
    assert out.tolist() == want


@cuda.jit
def count_odd(out):
    out[cuda.threadIdx.x] = cuda.syncthreads_count(cuda.threadIdx.x % 2)


def test_syncthreads_count_counts_the_block(manager):
    out = np.zeros(THREADS, np.int64)
    count_odd[1, THREADS](out)
    assert (out == THREADS // 2).all()


@cuda.jit
def fail_in_thread_3(out):
    if cuda.threadIdx.x == 3:
        out[out.shape[0] + 1] = 1          # out of bounds: the simulator raises
    cuda.syncthreads()
    out[cuda.threadIdx.x] = 1


def test_an_exception_aborts_the_block_and_names_the_thread(manager):
    out = np.zeros(THREADS, np.int64)
    with pytest.raises(IndexError, match=r"tid=\[3, 0, 0\] ctaid=\[0, 0, 0\]"):
        fail_in_thread_3[1, THREADS](out)
