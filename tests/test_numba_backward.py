"""numba.cuda backward kernels: the CUDA simulator here (tiny sizes, 1 to 4 blocks per
launch), a compile check for sm_90, and the real GPU when there is one.

Tolerance (flash-attention's rule for its backward tests): a kernel's error against the
float64 reference may be at most twice the error of a plain float32 NumPy implementation
of the same formulas from the same float32 inputs (for FA2's backward: P = exp(S - L),
D = rowsum(dO o O); for the standard one: the softmax backward from P), plus twice the
float32 rounding of the reference's own values.
"""

import re

import numpy as np
import pytest
from _checks import numba_compiled

from flashsim import reference

from gpu_kernels import KernelInputError

pytest.importorskip("numba")
nb = pytest.importorskip("gpu_kernels.numba.backward")
T = np.swapaxes


def _inputs(shape, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(4))


def _scores32(Q, K, causal):
    S = np.float32(1 / np.sqrt(Q.shape[-1])) * (Q @ T(K, -1, -2))
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], bool)), S, np.float32(-np.inf))
    return S


def _plain_forward(Q, K, V, causal):
    P = np.exp(_scores32(Q, K, causal) - _scores32(Q, K, causal).max(-1, keepdims=True))
    return {"O": (P / P.sum(-1, keepdims=True)) @ V}


def _plain_backward(Q, K, V, dO, P, D):
    tau = np.float32(1 / np.sqrt(Q.shape[-1]))
    dS = P * (dO @ T(V, -1, -2) - D)
    return {"dQ": tau * (dS @ K), "dK": tau * (T(dS, -1, -2) @ Q), "dV": T(P, -1, -2) @ dO}


def _plain_flash2(Q, K, V, dO, O, L, causal):
    P = np.exp(_scores32(Q, K, causal) - L[..., None])
    return _plain_backward(Q, K, V, dO, P, (dO * O).sum(-1, keepdims=True))


def _plain_standard(Q, K, V, dO, P):
    dP = dO @ T(V, -1, -2)
    return _plain_backward(Q, K, V, dO, P, (P * dP).sum(-1, keepdims=True))


def _check(got: dict, base: dict, Q, K, V, dO, causal):
    ref = dict(zip(("O", "dQ", "dK", "dV"), (reference.attention(Q, K, V, causal),)
                   + reference.attention_backward(Q, K, V, dO, causal)))
    for name, value in got.items():
        err = np.abs(value - ref[name]).max()
        rounding = np.abs((ref[name].astype(np.float32) + np.float32(0.3) - np.float32(0.3))
                          - ref[name]).max()
        tol = 2 * np.abs(base[name] - ref[name]).max() + 2 * rounding
        assert err <= tol, (name, err, tol)
        assert np.abs(ref[name]).max() > 0.1            # the check is not trivial


def _saved(Q, K, V, causal):
    """O, P, L from the float64 reference, rounded to float32: the forward's outputs."""
    L = reference.logsumexp(Q, K, causal)
    S = (Q.astype(np.float64) @ T(K, -1, -2)) / np.sqrt(Q.shape[-1])
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], bool)), S, -np.inf)
    return (reference.attention(Q, K, V, causal).astype(np.float32),
            np.exp(S - L).astype(np.float32), L[..., 0].astype(np.float32))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape,Br,Bc", [((20, 8), 8, 8),          # ragged: 3 K/V blocks
                                         ((1, 2, 16, 8), 8, 8),    # 2 heads x 2 blocks
                                         ((24, 8), 16, 8)])        # B_r != B_c
def test_flash2_backward_matches_reference(shape, Br, Bc, causal):
    Q, K, V, dO = _inputs(shape, seed=len(shape) + Br)
    O, _, L = _saved(Q, K, V, causal)
    dQ, dK, dV = nb.flash2_backward(Q, K, V, O, L, dO, causal=causal, block_rows=Br,
                                    block_cols=Bc, threads=32)
    _check({"dQ": dQ, "dK": dK, "dV": dV}, _plain_flash2(Q, K, V, dO, O, L, causal),
           Q, K, V, dO, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_standard_forward_and_backward_match_reference(causal):
    Q, K, V, dO = _inputs((20, 8), seed=7)
    O, P, L = nb.standard_forward(Q, K, V, causal=causal, block_rows=8, threads=32,
                                  rows_per_block=10)
    _check({"O": O}, _plain_forward(Q, K, V, causal), Q, K, V, dO, causal)
    assert np.abs(L - reference.logsumexp(Q, K, causal)[:, 0]).max() <= 1e-5
    assert np.all(P[np.triu_indices(20, 1)] == 0) if causal else np.all(P > 0)
    dQ, dK, dV = nb.standard_backward(Q, K, V, P, dO, causal=causal, block_rows=8,
                                      block_cols=8, threads=32, rows_per_block=10)
    _check({"dQ": dQ, "dK": dK, "dV": dV}, _plain_standard(Q, K, V, dO, P),
           Q, K, V, dO, causal)
    # flash2's backward from the standard forward's O and L: the saved tensors it needs.
    g = nb.flash2_backward(Q, K, V, O, L, dO, causal=causal, block_rows=8, block_cols=8,
                           threads=32)
    _check(dict(zip(("dQ", "dK", "dV"), g)), _plain_flash2(Q, K, V, dO, O, L, causal),
           Q, K, V, dO, causal)


@pytest.mark.parametrize("algorithm", ["flash2", "standard"])
@pytest.mark.parametrize("causal", [False, True])
def test_predicted_traffic_is_flashsim_backward_with_the_launch_tiles(algorithm, causal):
    launch = nb.configure(algorithm, (2, 3, 1000, 64), causal=causal)
    p = launch.plan()
    assert (p.pass_, p.block_rows, p.block_cols) == ("bwd", launch.block_rows, launch.block_cols)
    rep = p.count()
    assert rep.per_tensor == p.closed_form().per_tensor
    assert rep.per_tensor["K"]["read_bytes"] == (6 * 1000 * 64 * 4 if algorithm == "flash2"
                                                 else rep.per_tensor["V"]["read_bytes"])
    assert rep.predicted_time_s > 0
    if algorithm == "flash2":
        assert launch.block_rows == launch.block_cols == 32
        assert nb.flash2_bwd_shared_bytes(32, 32, 64) <= nb.SHARED_LIMIT
    else:
        assert launch.block_rows == 64 and "P" in rep.per_tensor


def test_bad_configurations_are_refused():
    with pytest.raises(KernelInputError, match="power of two"):
        nb.configure("flash2", (64, 16), threads=48)
    with pytest.raises(KernelInputError, match="shared memory"):
        nb.configure("flash2", (64, 128), block_rows=64, block_cols=64)
    with pytest.raises(KernelInputError, match="flash2 or standard"):
        nb.configure("flash1", (64, 16))
    with pytest.raises(KernelInputError, match="registers"):
        nb.configure("standard", (8192, 64))
    Q = np.ones((16, 4))                                    # float64
    with pytest.raises(KernelInputError, match="float32"):
        nb.flash2_backward(Q, Q, Q, Q, Q[:, 0], Q, threads=32)
    for exc in (ValueError, KernelInputError):              # one error type, still a ValueError
        with pytest.raises(exc):
            nb.configure("flash2", (64, 16), threads=48)


def test_kernels_compile_for_sm90_within_48_KiB_without_spills():
    """numba's NVVM makes PTX and cuda.core's linker assembles it for sm_90: what a real
    launch would compile, checked without a GPU, outside the simulator. The kernels are the
    configurations the H200 benchmark launches (gpu_kernels.compile.NUMBA_BACKWARD); the
    linker's logs come from gpu_kernels/compile_cache.json, or, for a kernel changed since
    it was written, from a compile in a separate process."""
    pytest.importorskip("cuda.core")
    from gpu_kernels import compile as cuda_compile

    rows = cuda_compile.numba_backward()
    logs = numba_compiled("backward", {r["key"] for r in rows})
    for r in rows:
        name, log = r["kernel"], logs[r["key"]]
        regs, smem = map(int, re.search(r"used (\d+) registers.*?(\d+) bytes smem", log).groups())
        spills = re.search(r"(\d+) bytes spill stores", log)
        spills = int(spills.group(1)) if spills else 0
        # ptxas counts the 1 KiB that sm_90 reserves in every block's shared memory
        assert 0 < regs <= 255 and smem - 1024 <= nb.SHARED_LIMIT, (name, regs, smem)
        assert spills == 0, (name, spills)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_on_a_real_gpu(causal):
    from numba import config, cuda
    if config.ENABLE_CUDASIM or not cuda.is_available():
        pytest.skip("needs a real CUDA GPU (run with FLASHSIM_REAL_GPU=1)")
    Q, K, V, dO = _inputs((2, 2, 300, 64), seed=11)
    O, P, L = nb.standard_forward(Q, K, V, causal=causal)
    _check({"O": O}, _plain_forward(Q, K, V, causal), Q, K, V, dO, causal)
    g = nb.flash2_backward(Q, K, V, O, L, dO, causal=causal)
    _check(dict(zip(("dQ", "dK", "dV"), g)), _plain_flash2(Q, K, V, dO, O, L, causal),
           Q, K, V, dO, causal)
    g = nb.standard_backward(Q, K, V, P, dO, causal=causal)
    _check(dict(zip(("dQ", "dK", "dV"), g)), _plain_standard(Q, K, V, dO, P),
           Q, K, V, dO, causal)
