"""numba's CUDA simulator with a thread block that waits instead of polling (tests only).

The simulator runs each CUDA thread as a Python thread. To learn that every thread of a
block has reached ``syncthreads()``, numba-cuda's ``BlockManager.run`` polls the threads
in a loop that holds the GIL the threads need (numba-cuda 0.30, simulator/kernel.py; its
docstring lists the polling as a place to optimise). Here a thread that reaches
``syncthreads()`` or ends says so under one condition variable, and the last one opens the
barrier. The rule is the simulator's: the barrier opens when every live thread waits at
it; a thread's exception aborts the others and is raised with the thread and block named.
Measured here: standard attention through the numba kernels at N = 37, two heads,
17 s -> 2 s; six such launches 35 s -> 8 s. tests/test_cudasim.py holds the rule.
"""

from __future__ import annotations

import threading

import numpy as np


def install() -> bool:
    """Make the simulator's kernels run their blocks with :class:`BlockManager`; False (and
    nothing changed) if this numba has no simulator of the shape this code knows."""
    try:
        from numba.cuda.simulator import kernel
    except ImportError:
        return False
    if not (hasattr(kernel, "BlockManager") and hasattr(kernel.BlockThread, "syncthreads")):
        return False

    class BlockThread(kernel.BlockThread):
        def run(self):
            try:
                super().run()          # keeps an exception in self.exception
            finally:
                self._manager.leave(self)

        def syncthreads(self):
            self._manager.wait_at_barrier(self)

    class BlockManager(kernel.BlockManager):
        def run(self, grid_point, *args):
            self._cv = threading.Condition()
            self._arrived = self._generation = 0
            self._failed = None

            def target():
                self._f(*args)

            threads = [BlockThread(target, self, grid_point, p, self._debug)
                       for p in np.ndindex(*self._block_dim)]
            self._live = len(threads)
            for t in threads:
                t.start()
            with self._cv:
                while self._live and self._failed is None:
                    self._cv.wait()
                if self._failed is not None:      # abort the others, raise the first
                    for t in threads:
                        t.abort = True
                    self._cv.notify_all()
                    raise self._failed.exception[0].with_traceback(self._failed.exception[1])

        def leave(self, thread):
            with self._cv:
                self._live -= 1
                if thread.exception and self._failed is None:
                    self._failed = thread
                self._open_if_all_wait()
                self._cv.notify_all()             # the manager waits for the last thread

        def wait_at_barrier(self, thread):
            with self._cv:
                if thread.abort:
                    raise RuntimeError("abort flag set on syncthreads call")
                generation = self._generation
                self._arrived += 1
                self._open_if_all_wait()
                while generation == self._generation and not thread.abort:
                    self._cv.wait()
                if thread.abort:
                    raise RuntimeError("abort flag set on syncthreads clear")

        def _open_if_all_wait(self):
            # not after a thread failed: the manager aborts the waiting threads instead
            if self._failed is None and self._live and self._arrived == self._live:
                self._arrived = 0
                self._generation += 1
                self._cv.notify_all()

    kernel.BlockManager = BlockManager     # FakeCUDAKernel looks it up at each launch
    return True
