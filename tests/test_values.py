"""Every algorithm computes softmax(QK^T / sqrt(d)) V to float64 precision."""

import numpy as np
import pytest

import flashsim
from flashsim import reference

ALGS = ["standard", "flash1", "flash2"]


def _inputs(shape, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape) * s for s in (scale, 1.0, 1.0))


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N,d,Br,Bc", [(97, 16, 16, 24), (64, 8, 64, 64), (45, 32, 7, 13)])
def test_matches_float64_reference(alg, causal, N, d, Br, Bc):
    Q, K, V = _inputs((2, N, d))
    p = flashsim.plan(alg, N, d, batch=2, block_rows=Br, block_cols=Bc, causal=causal,
                      sram="1MiB")
    O, rep = p.run(Q, K, V)
    ref = reference.attention(Q, K, V, causal=causal)
    assert np.max(np.abs(O - ref)) <= 1e-10
    assert not np.isnan(O).any()


@pytest.mark.parametrize("alg", ALGS)
def test_huge_logits_with_a_moving_maximum(alg):
    """Logits up to ~1e4 whose running maximum rises block after block: a naive exp
    overflows, the online rescaling must not."""
    N, d = 96, 8
    Q, K, V = _inputs((N, d), seed=3)
    K = K + np.linspace(0, 3, N)[:, None]            # later keys score higher
    Q = Q * 400.0
    S = Q @ K.T / np.sqrt(d)
    assert np.abs(S).max() > 1e3                     # the test reaches the hard path
    assert np.argmax(S, axis=1).max() > 32           # the max moves past the first block
    for causal in (False, True):
        p = flashsim.plan(alg, N, d, block_rows=16, block_cols=16, causal=causal, sram="1MiB")
        O, _ = p.run(Q, K, V)
        assert np.max(np.abs(O - reference.attention(Q, K, V, causal))) <= 1e-10


def test_flash2_logsumexp_and_flash1_statistics():
    Q, K, V = _inputs((50, 8), seed=5)
    L_ref = reference.logsumexp(Q, K, causal=True)
    _, rep = flashsim.plan("flash2", 50, 8, block_rows=16, block_cols=16, causal=True,
                           sram="1MiB").run(Q, K, V)
    assert np.max(np.abs(rep.hbm["L"] - L_ref)) <= 1e-10
    _, rep = flashsim.plan("flash1", 50, 8, block_rows=16, block_cols=16, causal=True,
                           sram="1MiB").run(Q, K, V)
    assert np.max(np.abs(rep.hbm["m"] + np.log(rep.hbm["l"]) - L_ref)) <= 1e-10


def test_standard_writes_S_and_P_to_hbm():
    Q, K, V = _inputs((40, 8))
    _, rep = flashsim.plan("standard", 40, 8, sram="1MiB", extra_passes=("scale", "mask"),
                           causal=True).run(Q, K, V)
    S = Q @ K.T
    assert np.allclose(rep.hbm["S"], S, rtol=0, atol=1e-12)
    assert np.allclose(rep.hbm["S_scaled"], S / np.sqrt(8), rtol=0, atol=1e-12)
    assert np.isneginf(rep.hbm["S_masked"][0, 1])
    assert np.allclose(rep.hbm["P"].sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_two_pass_softmax_when_rows_do_not_fit():
    Q, K, V = _inputs((2000, 8))      # a row of S is 8000 B: more than M = 6144 B
    p = flashsim.plan("standard", 2000, 8, block_rows=32, block_cols=32, sram="6KiB", causal=True)
    assert p.softmax_rows == 0
    O, _ = p.run(Q, K, V)
    assert np.max(np.abs(O - reference.attention(Q, K, V, True))) <= 1e-10
