"""The numba.cuda kernels (gpu_kernels/numba/*.py) against the float64 reference, called
through ``gpu_kernels.attention(..., backend="numba")``.

Without a GPU (CI) the kernels run under numba's CUDA simulator (tests/conftest.py sets
NUMBA_ENABLE_CUDASIM=1), which is slow, so the shapes are tiny: one to four blocks each
way, with ragged N, a causal mask, and logits near 1e4 whose running maximum changes from
one K/V block to the next. Every kernel compiles for sm_90: what the checks read of its PTX
comes from gpu_kernels/compile_cache.json, or from a compile in a separate process without
the simulator for a kernel changed since the file was written. The ``gpu`` tests repeat the
checks at real sizes on a GPU (run with FLASHSIM_REAL_GPU=1) and skip cleanly elsewhere.

Tolerance (flash-attention's rule): a kernel's max error against the float64 reference
may be at most twice that of a plain fp32 NumPy implementation of the same formula, plus
two fp32 ulps of the output's magnitude (so that a baseline that happens to be exact does
not demand exactness).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _checks import numba_compiled

import flashsim
import gpu_kernels
from gpu_kernels import KernelInputError
from gpu_kernels.numba import flash1 as numba_flash1
from gpu_kernels.numba import flash2 as numba_flash2
from gpu_kernels.numba import standard as numba_standard
from gpu_kernels.numba.common import cuda, numba

MODULES = {"standard": numba_standard, "flash1": numba_flash1, "flash2": numba_flash2}


def attention(alg, Q, K, V, **kw):
    """O by the numba kernel of ``alg``, checked to come back as the caller gave Q."""
    res = gpu_kernels.attention(Q, K, V, algorithm=alg, backend="numba", **kw)
    assert isinstance(res, gpu_kernels.Result)
    return res.O


def configure(alg, shape, **kw):
    """The numba launch for inputs of ``shape`` ((N, d) or (B, H, N, d))."""
    B, H, N, d = (1, 1) + tuple(shape) if len(shape) == 2 else tuple(shape)
    return MODULES[alg].configure(B, H, N, d, **kw)
SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
EPS32 = float(np.finfo(np.float32).eps)


def fp32_baseline(Q, K, V, causal):
    """softmax(Q K^T / sqrt(d)) V computed plainly in float32 (the error baseline)."""
    Q, K, V = (np.asarray(x, np.float32) for x in (Q, K, V))
    S = (Q @ np.swapaxes(K, -1, -2)) * np.float32(1 / np.sqrt(Q.shape[-1]))
    if causal:
        n = S.shape[-1]
        S = np.where(np.tril(np.ones((n, n), bool)), S, np.float32(-np.inf))
    P = np.exp(S - S.max(-1, keepdims=True))
    return (P / P.sum(-1, keepdims=True)) @ V


def assert_close(O, Q, K, V, causal):
    ref = flashsim.reference.attention(Q, K, V, causal=causal)
    base = np.abs(fp32_baseline(Q, K, V, causal) - ref).max()
    err = np.abs(np.asarray(O, np.float64) - ref).max()
    tol = 2 * base + 2 * EPS32 * np.abs(ref).max()
    assert np.isfinite(O).all()
    assert err <= tol, f"max error {err:.3g} > {tol:.3g} (fp32 baseline {base:.3g})"


def random_qkv(shape, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def big_logits(shape, block_cols, seed=0):
    """Q, K, V with tau Q K^T near 1e4 (9999.5 .. 1e4 + a few), rising along the keys so
    that every row's running maximum grows from one K/V block to the next, while the
    softmax stays spread over several keys (not one-hot)."""
    Q, K, V = random_qkv(shape, seed)
    N, d = shape[-2:]
    Q, K = 0.5 * Q, 0.5 * K
    tau = 1 / np.sqrt(d)
    Q[..., 0] = 100.0
    K[..., 0] = (1e4 / (100 * tau)) + 0.25 / (100 * tau) * np.arange(N)
    S = (Q.astype(np.float64) @ np.swapaxes(K, -1, -2)) * tau
    # the test is meaningful: logits reach 1e4 and the last block's max beats the first's
    assert np.abs(S).max() > 9.9e3
    assert (S[..., :block_cols].max(-1) < S[..., -block_cols:].max(-1)).all()
    return Q.astype(np.float32), K.astype(np.float32), V


# (shape, block_rows, block_cols, causal, threads): one to four blocks each way
CASES = {
    "ragged": ((1, 2, 37, 12), 16, 16, False, None),
    "ragged-causal-odd-threads": ((1, 1, 33, 16), 16, 16, True, (3, 5)),
    "2d-rectangular-causal": ((20, 8), 8, 16, True, None),
    "flashsim-default-tiles": ((1, 1, 24, 16), None, None, False, None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("alg", list(MODULES))
def test_matches_reference(alg, case):
    shape, Br, Bc, causal, threads = CASES[case]
    Q, K, V = random_qkv(shape)
    O, L = gpu_kernels.attention(Q, K, V, algorithm=alg, backend="numba", causal=causal,
                                 block_rows=Br, block_cols=Bc, threads=threads)
    assert isinstance(O, np.ndarray) and O.shape == shape and O.dtype == np.float32
    assert_close(O, Q, K, V, causal)
    if alg == "standard":
        assert L is None
    else:   # the logsumexp: FA2's output, FA1's m + log l
        assert isinstance(L, np.ndarray) and L.shape == shape[:-1]
        L_ref = flashsim.reference.logsumexp(Q, K, causal=causal)[..., 0]
        np.testing.assert_allclose(L, L_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("alg", list(MODULES))
def test_logits_near_1e4(alg, causal):
    Q, K, V = big_logits((1, 1, 32, 16), block_cols=16)
    O = attention(alg, Q, K, V, causal=causal, block_rows=16, block_cols=16)
    assert_close(O, Q, K, V, causal)


def test_device_arrays_in_device_array_out():
    Q, K, V = random_qkv((1, 1, 20, 8), seed=3)
    dQ, dK, dV = (cuda.to_device(x) for x in (Q, K, V))
    O = attention("flash2", dQ, dK, dV, block_rows=8, block_cols=8)
    assert cuda.devicearray.is_cuda_ndarray(O) and tuple(O.shape) == Q.shape
    assert_close(O.copy_to_host(), Q, K, V, False)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_streaming_version(causal):
    """Kernel 2 streams S twice when a row does not fit in shared memory (N > 12032); run
    that version on a small S directly."""
    rng = np.random.default_rng(5)
    BH, N = 1, 20
    S = (rng.standard_normal((BH, N, N)) * 30).astype(np.float32)
    P = cuda.device_array((BH, N, N), np.float32)
    NT = numba_standard.softmax_threads(N)
    numba_standard.softmax_kernel(NT, False, causal)[(N, BH), NT](cuda.to_device(S), P, N)
    S64 = S.astype(np.float64)
    if causal:
        S64 = np.where(np.tril(np.ones((N, N), bool)), S64, -np.inf)
    ref = np.exp(S64 - S64.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    assert np.abs(P.copy_to_host() - ref).max() <= 8 * EPS32


# --------------------------------------------------------------------------------------
# Launch configuration: flashsim's tiles, flashsim's traffic, and input validation


@pytest.mark.parametrize("alg", list(MODULES))
@pytest.mark.parametrize("d", [64, 128])
def test_default_tiles_and_predicted_traffic_are_flashsims(alg, d):
    """Standard attention takes flashsim's tiles for 48 KiB of SRAM; the flash kernels take
    flashsim's fastest tiles for their thread layouts (no neighbouring tile that fits has a
    shorter roofline time at its layout's score), and the prediction is flashsim's count
    for those tiles, of the algorithm's version the kernel runs (flash1: a launch per K/V
    block, so K and V are read by every block; the tile rule ranks tiles as for version 1,
    whose bytes differ only in K and V)."""
    from gpu_kernels.numba.common import _score, choose_tiling

    gpu = flashsim.GPUS["h200"]
    shape = (2, 3, 1000, d)
    for causal in (False, True):
        launch = configure(alg, shape, causal=causal)
        Br, Bc = launch.block_rows, launch.block_cols
        assert launch.static_smem <= 48 * 1024
        if alg == "standard":
            p = flashsim.plan(alg, seq_len=1000, head_dim=d, dtype="fp32", sram=48 * 1024,
                              batch=2, heads=3, causal=causal)
            assert (Br, Bc) == (p.block_rows, p.block_cols)
        else:
            assert Br % 16 == 0 and Bc % 16 == 0

            def time(r, c):
                tl = choose_tiling(r, c, d, MODULES[alg].ARRAYS)
                if tl is None:
                    return None
                rep = flashsim.plan(alg, seq_len=1000, head_dim=d, sram="1GiB", causal=causal,
                                    block_rows=r, block_cols=c).count()
                return flashsim.roofline_time(
                    rep.hbm_bytes, rep.flops / _score(tl, MODULES[alg].ARRAYS), gpu, "fp32")
            best = time(Br, Bc)
            for r, c in [(Br + 16, Bc), (Br, Bc + 16), (Br - 16, Bc), (Br, Bc - 16)]:
                t = time(r, c) if min(r, c) > 0 else None
                assert t is None or t >= best, (r, c)
            p = flashsim.plan(alg, seq_len=1000, head_dim=d, sram="1GiB", batch=2, heads=3,
                              causal=causal, block_rows=Br, block_cols=Bc,
                              **launch.PLAN_OPTIONS)
        rep = gpu_kernels.predicted_traffic(shape, algorithm=alg, backend="numba", causal=causal)
        want = p.count()
        assert rep.per_tensor == want.per_tensor and rep.flops == want.flops
        assert (rep.plan.block_rows, rep.plan.block_cols) == (Br, Bc)
        assert rep.predicted_time_s > 0


def test_predicted_traffic_follows_given_tiles():
    """64 x 32 tiles at d = 64: flashsim's model (which also holds O_i and S_ij in SRAM)
    needs more than 48 KiB, the kernel (registers for those) does not; the prediction is
    flashsim's count for exactly those tiles."""
    launch = configure("flash2", (1, 4, 512, 64), block_rows=64, block_cols=32)
    assert launch.static_smem <= 48 * 1024
    rep = gpu_kernels.predicted_traffic((1, 4, 512, 64), algorithm="flash2", backend="numba",
                                        block_rows=64, block_cols=32)
    want = flashsim.plan("flash2", seq_len=512, head_dim=64, sram="1MiB", heads=4,
                         block_rows=64, block_cols=32).count()
    assert rep.per_tensor == want.per_tensor and rep.plan.block_rows == 64


def _one_line_error(exc_type, fn, *args, **kw):
    with pytest.raises(exc_type) as info:
        fn(*args, **kw)
    assert str(info.value) and "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("alg", list(MODULES))
def test_inputs_are_validated(alg):
    """Bad input: one KernelInputError (a FlashsimError, a ValueError), one line, before any
    launch."""
    def att(*args, **kw):
        return attention(alg, *args, **kw)
    Q, K, V = random_qkv((1, 1, 8, 4))
    for exc in (KernelInputError, flashsim.FlashsimError, ValueError):
        _one_line_error(exc, att, Q.astype(np.float64), K, V)
    _one_line_error(KernelInputError, att, Q.tolist(), K, V)
    _one_line_error(KernelInputError, att, cuda.to_device(Q), K, V)
    _one_line_error(KernelInputError, att, Q[0], K[0], V[0])                  # 3-D
    _one_line_error(KernelInputError, att, Q, K[..., :6, :], V)               # shapes differ
    _one_line_error(KernelInputError, att, np.swapaxes(Q, -1, -2), K, V)      # not contiguous
    big = np.zeros((8, 129), np.float32)
    assert "d = 129" in _one_line_error(KernelInputError, att, big, big, big)
    _one_line_error(KernelInputError, att, Q, K, V, causal="yes")
    _one_line_error(KernelInputError, att, Q, K, V, threads=4)
    _one_line_error(KernelInputError, att, Q, K, V, threads=(64, 64))         # 4096 threads
    _one_line_error(KernelInputError, att, Q, K, V, block_rows=0)
    _one_line_error(KernelInputError, att, Q, K, V, version=2)                # not an option here
    # tiles whose working set does not fit 48 KiB (flashsim's check, a ValueError)
    _one_line_error(ValueError, configure, alg, (4096, 128), block_rows=128, block_cols=128)
    _one_line_error(KernelInputError, configure, alg, (4096, 128), block_rows=128,
                    block_cols=128)


def test_shared_memory_budget_is_checked():
    """Tiles that flashsim's model accepts (B_r = B_c = 32, d = 64) with a thread layout
    that pads them to 56 x 56 x 84: the padded shared arrays exceed 48 KiB."""
    from gpu_kernels.numba.common import Tiling
    threads = Tiling(32, 32, 64, TR=7, TC=7, RM=8, CN=8, DN=12)
    msg = _one_line_error(KernelInputError, configure, "flash2", (4096, 64), block_rows=32,
                          block_cols=32, threads=threads)
    assert "shared memory" in msg and "49152" in msg


# --------------------------------------------------------------------------------------
# Every kernel compiles for sm_90: the launches of gpu_kernels.compile.NUMBA_FORWARD, each
# kernel's PTX facts read from gpu_kernels/compile_cache.json, or, for a kernel changed since
# it was written, compiled in a separate process (compile_ptx cannot run under the
# simulator).


@pytest.fixture(scope="module")
def compiled():
    from gpu_kernels import compile as cuda_compile

    rows = cuda_compile.numba_forward()
    facts = numba_compiled("forward", {r["key"] for r in rows})
    out = []
    for r in rows:
        launch = r["launch"]
        tl = launch.tiling if isinstance(launch.tiling, tuple) else (launch.tiling,) * 2
        want = {"scores": 4 * tl[0].shared_words(numba_standard.ARRAYS_QK),
                "weighted_sum": 4 * tl[1].shared_words(numba_standard.ARRAYS_PV),
                "row_softmax_fits": 8 * numba_standard.softmax_threads(4096),
                "row_softmax_stream": 8 * numba_standard.softmax_threads(4096),
                "fill_flat": 0}
        out.append(dict(alg=r["alg"], kernel=r["kernel"], shape=r["shape"], causal=r["causal"],
                        **facts[r["key"]], want_smem=want.get(r["kernel"], launch.static_smem)))
    return out


def test_every_kernel_compiles_for_sm90(compiled):
    names = {(r["alg"], r["kernel"]) for r in compiled}
    assert names >= {("standard", "scores"), ("standard", "row_softmax_fits"),
                     ("standard", "row_softmax_stream"), ("standard", "weighted_sum"),
                     ("flash1", "flash1_step"), ("flash1", "fill_flat"),
                     ("flash2", "flash2_forward")}
    for r in compiled:
        assert r["target"], r
        assert not r["local"], f"{r}: a per-thread array spilled to local memory"
        assert r["f64"] == 0, f"{r}: float64 arithmetic in an fp32 kernel"


def test_shared_memory_is_what_the_launch_says(compiled):
    """The static shared memory in the PTX is the launch's formula (Tiling.shared_words; the
    softmax's reduction arrays, its row being dynamic)."""
    for r in compiled:
        assert r["smem"] == r["want_smem"], r


def test_tile_products_use_16_byte_shared_loads(compiled):
    """At flashsim's d = 64 tiles the micro-kernel's operand loads are vectorised."""
    for r in compiled:
        if r["shape"][-1] == 64 and r["kernel"] in ("scores", "weighted_sum",
                                                     "flash1_step", "flash2_forward"):
            assert r["vec4"] > 0, r


# --------------------------------------------------------------------------------------
# Real GPU: the same checks at real sizes (FLASHSIM_REAL_GPU=1 on a machine with a GPU)


def _need_gpu():
    if SIMULATOR or os.environ.get("FLASHSIM_REAL_GPU") != "1" or not cuda.is_available():
        pytest.skip("needs a real CUDA GPU and FLASHSIM_REAL_GPU=1")


@pytest.mark.gpu
@pytest.mark.parametrize("alg", list(MODULES))
@pytest.mark.parametrize("N,d,causal", [(1000, 64, False), (1000, 64, True),
                                        (2048, 128, False), (777, 128, True)])
def test_gpu_matches_reference(alg, N, d, causal):
    _need_gpu()
    Q, K, V = random_qkv((2, 2, N, d), seed=N + d)
    O = attention(alg, Q, K, V, causal=causal)
    assert_close(O, Q, K, V, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("alg", list(MODULES))
def test_gpu_logits_near_1e4(alg):
    _need_gpu()
    launch = configure(alg, (1, 2, 1000, 64), causal=True)
    Q, K, V = big_logits((1, 2, 1000, 64), block_cols=launch.block_cols)
    O = attention(alg, Q, K, V, causal=True)
    assert_close(O, Q, K, V, True)


@pytest.mark.skipif(not SIMULATOR, reason="the CUDA simulator's shared memory")
def test_simulated_shared_array_is_one_per_block_under_a_race():
    """A block's threads that all reach one ``cuda.shared.array`` line first must share one
    array. numba-cuda's simulator looks the line up and stores a new array in two steps; a
    lookup that lets other threads in between (forced here) gave each thread its own array.
    gpu_kernels.numba.common makes the two steps one, under a lock."""
    import threading
    import time

    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    class SlowLookup(dict):
        def get(self, key, default=None):
            res = super().get(key, default)
            time.sleep(0.002)                 # every other thread runs meanwhile
            return res

    shared = FakeCUDAShared(0)
    shared._allocations = SlowLookup()
    got, start = [], threading.Barrier(8)

    def thread():
        start.wait()
        got.append(shared.array((4,), np.float32))
    threads = [threading.Thread(target=thread) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({id(a) for a in got}) == 1
