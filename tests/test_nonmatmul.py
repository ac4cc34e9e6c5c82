"""Work outside the matmuls: exponentials and non-matmul operations, counted by the loop
nests' Compute ops (three engines) and held equal to each algorithm's closed form; the
exponentials also equal what the NumPy code really exponentiates."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flashsim
from flashsim.cli import main

ALGS = ["standard", "flash1", "flash2"]
PASSES = ["fwd", "bwd", "fwd+bwd"]
SHAPES = [(64, 16, 16, 16), (100, 16, 16, 32), (97, 8, 12, 20), (33, 4, 32, 8),
          (17, 3, 5, 7), (50, 10, 1, 7), (31, 5, 31, 1), (129, 16, 64, 32)]


def _plan(alg, N, d, Br, Bc, causal, pass_="fwd", sram="4MiB", passes=()):
    return flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, sram=sram,
                         pass_=pass_, extra_passes=passes, batch=2, heads=3)


@pytest.mark.parametrize("alg,pass_,shape,causal",
                         list(itertools.product(ALGS, PASSES, SHAPES, [False, True])))
def test_count_equals_closed_form(alg, pass_, shape, causal):
    p = _plan(alg, *shape, causal, pass_)
    counted, formula = p.count(), p.closed_form()
    assert counted.exp_ops == formula.exp_ops
    assert counted.nonmatmul_flops == formula.nonmatmul_flops
    assert counted.nonmatmul_flops > counted.exp_ops or alg == "standard" and pass_ == "bwd"


@pytest.mark.parametrize("passes", [(), ("scale",), ("mask",), ("scale", "mask")])
@pytest.mark.parametrize("sram", ["1MiB", "6KiB"])   # 6 KiB: the softmax streams tiles twice
@pytest.mark.parametrize("pass_", PASSES)
def test_standard_passes_and_streaming_match_closed_form(passes, sram, pass_):
    p = flashsim.plan("standard", 500, 8, block_rows=32, block_cols=32, sram=sram,
                      extra_passes=passes, pass_=pass_)
    assert p.count().exp_ops == p.closed_form().exp_ops
    assert p.count().nonmatmul_flops == p.closed_form().nonmatmul_flops


@settings(max_examples=60, deadline=None)
@given(alg=st.sampled_from(ALGS), pass_=st.sampled_from(PASSES), N=st.integers(1, 300),
       d=st.integers(1, 64), Br=st.integers(1, 80), Bc=st.integers(1, 80),
       causal=st.booleans())
def test_count_equals_closed_form_random(alg, pass_, N, d, Br, Bc, causal):
    p = flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, sram="4MiB",
                      pass_=pass_)
    assert p.count().exp_ops == p.closed_form().exp_ops
    assert p.count().nonmatmul_flops == p.closed_form().nonmatmul_flops


class _ExpCounter:
    """np.exp that also counts the elements it exponentiates."""

    def __init__(self, exp):
        self.exp, self.n = exp, 0

    def __call__(self, x, *args, **kw):
        self.n += np.size(x)
        return self.exp(x, *args, **kw)


@pytest.mark.parametrize("alg,sram", [("standard", "1MiB"), ("standard", "2500"),
                                      ("flash1", "1MiB"), ("flash2", "1MiB")])
@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("causal", [False, True])
def test_exponentials_are_the_ones_the_code_evaluates(monkeypatch, alg, sram, pass_, causal):
    """Run with values while counting the elements np.exp really sees: the declared count
    of every Compute, summed by the engines, must equal it (and so must the closed form)."""
    N, d, Br, Bc = (70, 4, 16, 24) if sram == "1MiB" else (700, 4, 8, 8)
    p = flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, sram=sram,
                      pass_=pass_, batch=1, heads=2)
    if alg == "standard":      # 2500 B: a row of S does not fit, the softmax streams tiles
        assert (p.softmax_rows == 0) == (sram == "2500")
    rng = np.random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal((2, N, d)) for _ in range(4))
    counter = _ExpCounter(np.exp)
    monkeypatch.setattr(np, "exp", counter)
    if pass_ == "fwd":
        _, rep = p.run(Q, K, V)
    else:
        _, rep = p.run(Q, K, V, dO=dO)
    monkeypatch.undo()
    assert counter.n == rep.exp_ops == p.closed_form().exp_ops
    assert rep.nonmatmul_flops == p.count().nonmatmul_flops


def test_one_tile_by_hand():
    """FlashAttention-2, N = 4, d = 2, one 4 x 4 tile: 16 exponentials of P plus 4 alphas;
    operations 5 x 16 (tau, max, subtract, exp, sum) + (3 + 2) x 4 (alpha's subtract and
    exp, l_i's product, O_i's rescale) + (2 + 2) x 4 (O_i / l_i, log, +) = 116."""
    rep = flashsim.plan("flash2", 4, 2, block_rows=4, block_cols=4, sram="1MiB").count()
    assert (rep.exp_ops, rep.nonmatmul_flops) == (20, 116)
    rep = flashsim.plan("flash1", 4, 2, block_rows=4, block_cols=4, sram="1MiB").count()
    assert (rep.exp_ops, rep.nonmatmul_flops) == (16 + 8, 5 * 16 + (9 + 8) * 4)
    rep = flashsim.plan("standard", 4, 2, block_rows=4, block_cols=4, sram="1MiB").count()
    assert (rep.exp_ops, rep.nonmatmul_flops) == (16, 6 * 16)


@settings(max_examples=80, deadline=None)
@given(N=st.integers(1, 400), d=st.integers(1, 128), Br=st.integers(1, 96),
       Bc=st.integers(1, 96), causal=st.booleans(), pass_=st.sampled_from(PASSES))
def test_flash1_does_more_non_matmul_work_than_flash2_with_the_same_tiles(N, d, Br, Bc, causal,
                                                                           pass_):
    """FlashAttention-2's first change (Dao 2023, Section 3.1.1): rescale O_i by diag(l_i)^-1
    once, at the end, and keep one statistic. With the same tiles every shape gains."""
    one, two = (flashsim.plan(a, N, d, block_rows=Br, block_cols=Bc, causal=causal,
                              sram="8MiB", pass_=pass_).count() for a in ("flash1", "flash2"))
    assert one.nonmatmul_flops > two.nonmatmul_flops
    assert one.exp_ops >= two.exp_ops


@pytest.mark.parametrize("N", [64, 500, 1024, 4096, 16384])
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_flash1_more_than_flash2_with_each_default_tiles(N, d, causal, dtype):
    one, two = (flashsim.plan(a, N, d, causal=causal, dtype=dtype, gpu="h100").count()
                for a in ("flash1", "flash2"))
    assert one.nonmatmul_flops > two.nonmatmul_flops


def test_io_json_and_table_show_the_counts(capsys):
    code = main(["io", "-a", "flash2", "-N", "256", "-d", "64", "--block-rows", "64",
                 "--block-cols", "64", "--sram", "1MiB", "--json", "--heads", "2"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    # 2 heads x (256^2 elements + 256 rows x 4 tiles)
    assert d["exp_ops"] == 2 * (256 * 256 + 256 * 4)
    assert d["nonmatmul_flops"] == 2 * (5 * 256 * 256 + 67 * 256 * 4 + 66 * 256)
    main(["io", "-a", "flash1", "-N", "256", "-d", "64", "--sram", "1MiB"])
    out = capsys.readouterr().out
    assert "exponentials" in out and "non-matmul ops" in out
