"""Launch configurations the model was never fitted to: drawn at random, split before use.

The 107-point dataset (``ncu_h200.json``) follows one recipe: 16k tokens in total, hidden
size 2048, N a power of two, full waves of thread blocks. A model tuned there can fail
elsewhere, so this module draws other launches — any batch and heads, N not a multiple of
any tile and up to 65536, grids smaller than one wave, both head dimensions, causal or
not — for every kernel, with a fixed seed per kernel, and splits each kernel's draws into a
*calibration* set (the only points any constant of the model may be fitted on) and a
*held-out* set (the points it is judged on). The draw is a pure function of its seeds:

    configs = draw()                      # [{kernel, split, batch, heads, N, d, causal}, ...]

``heldout_configs.json`` is that list, committed before any change to the model, and a
test requires the committed file to equal ``draw()``, so the split cannot move after the
fact. Adding a kernel adds its own draws and leaves every other kernel's unchanged.

Each draw is kept small enough to profile under Nsight Compute in a few seconds: its
estimated kernel time (FLOPs at a rough rate for the kernel's family, scaled down when
the grid does not fill the SMs) stays under ``TIME_BUDGET_S``, and standard attention's
N x N matrices stay under ``STANDARD_BYTES``.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..hardware.presets import DEFAULT_GPU, gpu as _gpu
from ..units import cdiv

SEED = 20261201
PER_KERNEL = 12            # draws per kernel
CALIBRATION = 4            # of which calibration; the rest are held out
BELOW_ONE_WAVE = 3         # draws per kernel forced to a grid smaller than the SM count
LONG = 3                   # draws per kernel forced to N >= LONG_N
LONG_N = 8192
TIME_BUDGET_S = 0.05
STANDARD_BYTES = 8 * 2**30
N_RANGE = (200, 65536)

# kernel: (dtype bytes, rough FLOP/s of the whole GPU, causal supported, rows per block,
#          one block per head (flash1's original schedule))
KERNELS = {
    "numba_standard": (4, 15e12, True, 64, False),
    "numba_flash2": (4, 20e12, True, 32, False),
    "cupy_standard": (4, 15e12, True, 64, False),
    "cupy_flash1": (4, 20e12, False, 32, True),
    "cupy_flash2": (4, 15e12, True, 32, False),
    "cupy_flash2_tc": (2, 250e12, True, 128, False),
    "cupy_flash3": (2, 450e12, True, 128, False),     # drawn 2026-12-02, before its fit
}


def _estimate_s(kernel: str, B: int, H: int, N: int, d: int, causal: bool) -> float:
    _, rate, _, rows, per_head = KERNELS[kernel]
    sms = _gpu(DEFAULT_GPU).sms
    flops = 4 * B * H * N * N * d / (2 if causal else 1)
    blocks = B * H if per_head else B * H * cdiv(N, rows)
    return flops / (rate * min(1.0, blocks / sms))


def _fits(kernel: str, B: int, H: int, N: int, d: int, causal: bool) -> bool:
    if kernel.endswith("standard") and 2 * B * H * N * N * 4 > STANDARD_BYTES:
        return False
    return _estimate_s(kernel, B, H, N, d, causal) <= TIME_BUDGET_S


def _ragged(rng, lo: int, hi: int) -> int:
    """log-uniform in [lo, hi], moved off every multiple of 16 (no tile divides it)."""
    n = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    if n % 16 == 0:
        n += int(rng.integers(1, 16))
    return min(n, hi - 1)


def draw_kernel(kernel: str) -> list[dict]:
    """The ``PER_KERNEL`` configurations of one kernel, the first ``CALIBRATION`` of them
    (in a random order) marked calibration."""
    rng = np.random.default_rng([SEED, zlib.crc32(kernel.encode())])
    _, _, causal_ok, rows, per_head = KERNELS[kernel]
    sms = _gpu(DEFAULT_GPU).sms
    out: list[dict] = []
    tries = 0
    while len(out) < PER_KERNEL:
        tries += 1
        small = len(out) < BELOW_ONE_WAVE
        # a long draw that no batch fits within the time budget (flash1's one block per
        # head) gives up after a while and is drawn like the rest
        long = BELOW_ONE_WAVE <= len(out) < BELOW_ONE_WAVE + LONG and tries < 1000
        d = int(rng.choice((64, 128)))
        causal = bool(causal_ok and rng.random() < 0.5)
        B = int(rng.choice((1, 2, 3, 4, 8)))
        H = int(rng.choice((1, 2, 4, 8, 16, 32)))
        lo, hi = N_RANGE
        if small:
            hi = 4096
        elif long:
            lo = LONG_N
        N = _ragged(rng, lo, hi)
        blocks = B * H if per_head else B * H * cdiv(N, rows)
        if small and blocks >= sms:
            continue
        if not _fits(kernel, B, H, N, d, causal):
            continue
        out.append({"kernel": kernel, "batch": B, "heads": H, "N": N, "d": d,
                    "causal": causal})
        tries = 0
    order = rng.permutation(PER_KERNEL)
    for rank, k in enumerate(order):
        out[k]["split"] = "calibration" if rank < CALIBRATION else "heldout"
    return out


def draw(kernels=None) -> list[dict]:
    """Every kernel's draws, kernels in ``KERNELS`` order."""
    return [c for k in (kernels or KERNELS) for c in draw_kernel(k)]


def main() -> None:
    import json

    from . import path
    out = {"note": "Drawn by `python -m flashsim.measured.heldout` (seed "
                   f"{SEED}); the split was fixed before any model change.",
           "configs": draw()}
    path("heldout_configs.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
