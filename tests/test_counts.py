"""Counted traffic equals the closed forms, exactly, for every algorithm and shape."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flashsim
from flashsim import nest, reference

from _checks import assert_count_is_closed_form, assert_grid_reaches_the_hard_cases

ALGS = ["standard", "flash1", "flash2"]

# (N, d, B_r, B_c): square, ragged in one or both blocks, blocks larger than N, 1-wide.
SHAPES = [
    (64, 16, 16, 16), (100, 16, 16, 32), (97, 8, 12, 20), (33, 4, 32, 8), (40, 8, 64, 64),
    (17, 3, 5, 7), (128, 32, 32, 16), (50, 10, 1, 7), (31, 5, 31, 1), (129, 16, 64, 32),
]


def _plan(alg, N, d, Br, Bc, causal, passes=()):
    return flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal,
                         sram="1MiB", extra_passes=passes, batch=2, heads=3)


CASES = [(alg, *shape, causal) for alg, shape, causal
         in itertools.product(ALGS, SHAPES, [False, True])]


@pytest.mark.parametrize("alg,N,d,Br,Bc,causal", CASES)
def test_count_equals_closed_form(alg, N, d, Br, Bc, causal):
    assert_count_is_closed_form(_plan(alg, N, d, Br, Bc, causal))


def test_grid_has_at_least_50_shapes_with_ragged_and_causal():
    assert_grid_reaches_the_hard_cases([(N, Br, Bc, c) for _, N, _, Br, Bc, c in CASES])


@pytest.mark.parametrize("passes", [(), ("scale",), ("mask",), ("scale", "mask"), ("mask", "scale")])
@pytest.mark.parametrize("sram", ["1MiB", "6KiB"])   # 6 KiB: a row of S does not fit
def test_standard_passes_and_row_fit_match_closed_form(passes, sram):
    p = flashsim.plan("standard", 2000, 8, block_rows=32, block_cols=32, sram=sram,
                      extra_passes=passes)
    assert (p.softmax_rows == 0) == (sram == "6KiB")
    assert p.count().per_tensor == p.closed_form().per_tensor


# Tiles smaller than a row of S: the softmax streams (ragged N, B_r != B_c, 1-wide tiles).
STREAMED = [(100, 2, 4, 6), (97, 1, 5, 7), (130, 2, 8, 8), (64, 1, 4, 8), (33, 1, 3, 4),
            (200, 2, 8, 12), (150, 3, 1, 7), (77, 2, 5, 3), (61, 1, 7, 2), (129, 2, 16, 4)]


@pytest.mark.parametrize("N,d,Br,Bc", STREAMED)
@pytest.mark.parametrize("causal", [False, True])
def test_streaming_softmax_matches_closed_form_and_reference(N, d, Br, Bc, causal):
    """Rows of S that do not fit: the softmax streams tiles, and under the causal mask reads
    only those with a visible element (stores P = 0 for the rest): counts, non-matmul work
    and values over the ragged grid."""
    p = flashsim.plan("standard", N, d, block_rows=Br, block_cols=Bc, causal=causal,
                      sram=4 * N + 7, batch=2, heads=3)
    assert p.softmax_rows == 0
    assert_count_is_closed_form(p)
    counted, formula = p.count(), p.closed_form()
    assert (counted.exp_ops, counted.nonmatmul_flops) == (formula.exp_ops,
                                                          formula.nonmatmul_flops)
    skipped = causal and any((j + 1) * Bc <= i * Br for i in range(-(-N // Br))
                             for j in range(-(-N // Bc)))
    assert (counted.per_tensor["S"]["read_bytes"] < 6 * 2 * N * N * 4) == skipped
    rng = np.random.default_rng(N)
    Q, K, V = (rng.standard_normal((2, 3, N, d)) for _ in range(3))
    O, _ = p.run(Q, K, V)
    np.testing.assert_allclose(O, reference.attention(Q, K, V, causal=causal), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(alg=st.sampled_from(ALGS), N=st.integers(1, 300), d=st.integers(1, 64),
       Br=st.integers(1, 80), Bc=st.integers(1, 80), causal=st.booleans())
def test_count_equals_closed_form_random(alg, N, d, Br, Bc, causal):
    p = flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, sram="4MiB")
    assert p.count().per_tensor == p.closed_form().per_tensor
    assert p.count().flops == p.closed_form().flops


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
def test_values_run_counts_what_count_only_counts(alg, causal):
    """The stepping engine (with values) and the summing engine agree byte for byte."""
    p = _plan(alg, 70, 8, 16, 24, causal)
    rng = np.random.default_rng(1)
    Q, K, V = (rng.standard_normal((2, 3, 70, 8)) for _ in range(3))
    _, ran = p.run(Q, K, V)
    counted = p.count()
    assert ran.per_tensor == counted.per_tensor
    assert ran.flops == counted.flops
    assert ran.sram_peak_bytes == counted.sram_peak_bytes == sum(b for _, b in p.working_set())


def test_causal_skips_tiles():
    for alg in ("flash1", "flash2"):
        full, causal = _plan(alg, 256, 16, 32, 32, False), _plan(alg, 256, 16, 32, 32, True)
        assert causal.count().flops < full.count().flops
        assert causal.count().hbm_bytes < full.count().hbm_bytes
    # 8 x 8 blocks, causal: 36 tiles of 64 are visited.
    p = _plan("flash2", 256, 16, 32, 32, True)
    assert p.count().flops == 2 * 3 * 36 * 4 * 32 * 32 * 16


def test_byte_totals_scale_with_batch_and_heads():
    one = flashsim.plan("flash2", 128, 16, sram="64KiB").count()
    many = flashsim.plan("flash2", 128, 16, sram="64KiB", batch=3, heads=5).count()
    assert many.hbm_bytes == 15 * one.hbm_bytes
    assert many.flops == 15 * one.flops
    assert many.sram_peak_bytes == one.sram_peak_bytes


@pytest.mark.parametrize("dtype,b", [("fp32", 4), ("fp16", 2), ("bf16", 2)])
def test_dtype_sets_bytes_but_statistics_stay_fp32(dtype, b):
    p = flashsim.plan("flash2", 64, 16, dtype=dtype, block_rows=16, block_cols=16, sram="1MiB")
    t = p.count().per_tensor
    assert t["Q"]["read_bytes"] == 64 * 16 * b
    assert t["L"]["write_bytes"] == 64 * 4


def test_trace_walks_the_same_loads_as_the_count():
    p = flashsim.plan("flash2", 40, 4, block_rows=16, block_cols=16, causal=True, sram="1MiB")
    loads = [e for e in p.trace() if e["op"] == "load"]
    # Q blocks of 16, 16, 8 rows see 1, 2 and 3 K/V blocks: 3 Q loads + 2 * 6 K/V loads.
    assert [e["tensor"] for e in loads].count("Q") == 3
    assert [e["tensor"] for e in loads].count("K") == 6
    assert sum(e["bytes"] for e in loads) == p.count().hbm_read_bytes
    assert loads[-1]["rows"] == (32, 40) and loads[-1]["blocks"] == {"i": 2, "j": 2}


def test_working_set_names_the_buffers():
    names = [n for n, _ in flashsim.plan("flash1", 256, 32, sram="1MiB").working_set()]
    assert names == ["K_j", "V_j", "Q_i", "O_i", "l_i", "m_i", "S_ij", "mt_ij", "lt_ij"]
    assert isinstance(flashsim.plan("flash1", 256, 32, sram="1MiB").nest(), nest.Nest)


def _fields(c):
    return c.read, c.write, c.flops, c.sram_peak


@settings(max_examples=80, deadline=None)
@given(alg=st.sampled_from(ALGS), pass_=st.sampled_from(["fwd", "bwd", "fwd+bwd"]),
       N=st.integers(1, 300), d=st.integers(1, 40), Br=st.integers(1, 90),
       Bc=st.integers(1, 90), causal=st.booleans(), dtype=st.sampled_from(["fp32", "fp16"]),
       passes=st.sampled_from([(), ("scale",), ("mask", "scale")]))
def test_folded_count_equals_the_leaf_summing_engine(alg, pass_, N, d, Br, Bc, causal,
                                                     dtype, passes):
    """count() counts each class of equal iterations once; count_leaves() (the earlier
    engine) steps every outer iteration and sums innermost loops with NumPy."""
    p = flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, dtype=dtype,
                      pass_=pass_, sram="64MiB",
                      extra_passes=passes if alg == "standard" else ())
    assert _fields(nest.count(p.nest())) == _fields(nest.count_leaves(p.nest()))


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
def test_four_million_tokens_count_equals_closed_form(alg, causal):
    """N = 2^22 with the H200's default tiles: no N-sized arrays, one class per loop (and
    one bound evaluation per block under the mask), the same numbers as the formulas."""
    p = flashsim.plan(alg, 2**22, 128, gpu="h200", causal=causal)
    counted, formula = p.count(), p.closed_form()
    assert counted.per_tensor == formula.per_tensor and counted.flops == formula.flops


# -- flash1, version 2: a launch per K/V block (the numba kernel's schedule) -------------
@pytest.mark.parametrize("N,d,Br,Bc", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_flash1_launch_per_kv_block_count_equals_closed_form(N, d, Br, Bc, causal, dtype):
    """Every thread block loads K_j and V_j: K and V cross tiles(j) times per K/V block
    (T_r without a mask) where one block per head reads them once; nothing else moves."""
    from flashsim.algorithms._common import kv_block_reach

    kw = dict(block_rows=Br, block_cols=Bc, causal=causal, dtype=dtype, sram="1MiB",
              batch=2, heads=3)
    two, one = (flashsim.plan("flash1", N, d, kv_launches=v, **kw) for v in (True, False))
    assert_count_is_closed_form(two)
    counted, first = two.count().per_tensor, one.count().per_tensor
    _, tiles, c = kv_block_reach(two)
    for t in ("K", "V"):
        assert counted[t]["read_bytes"] == 2 * 3 * int((c * tiles).sum()) * d * two.elem_bytes
        if not causal:
            assert counted[t]["read_bytes"] == -(-N // Br) * first[t]["read_bytes"]
    assert {k: v for k, v in counted.items() if k not in "KV"} == \
        {k: v for k, v in first.items() if k not in "KV"}
    assert (two.count().flops, two.count().exp_ops, two.count().nonmatmul_flops) == \
        (two.closed_form().flops, two.closed_form().exp_ops, two.closed_form().nonmatmul_flops)


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 300), d=st.integers(1, 64), Br=st.integers(1, 80),
       Bc=st.integers(1, 80), causal=st.booleans(), dtype=st.sampled_from(["fp32", "fp16"]))
def test_flash1_launch_per_kv_block_closed_form_random(N, d, Br, Bc, causal, dtype):
    p = flashsim.plan("flash1", N, d, block_rows=Br, block_cols=Bc, causal=causal,
                      dtype=dtype, sram="4MiB", kv_launches=True)
    assert p.count().per_tensor == p.closed_form().per_tensor
    assert _fields(nest.count(p.nest())) == _fields(nest.count_leaves(p.nest()))


@pytest.mark.parametrize("causal", [False, True])
def test_flash1_launch_per_kv_block_runs_the_same_values(causal):
    """Both versions are Algorithm 1 line for line: the same O, l, m to the last bit."""
    rng = np.random.default_rng(2)
    Q, K, V = (rng.standard_normal((2, 70, 8)) for _ in range(3))
    kw = dict(block_rows=16, block_cols=24, causal=causal, sram="1MiB", batch=2)
    (O1, r1), (O2, r2) = (flashsim.plan("flash1", 70, 8, kv_launches=v, **kw).run(Q, K, V)
                          for v in (False, True))
    assert np.array_equal(O1, O2) and np.array_equal(r1.hbm["l"], r2.hbm["l"])
    assert r2.per_tensor == flashsim.plan("flash1", 70, 8, kv_launches=True, **kw).count().per_tensor


def test_kv_launches_is_flash1s_alone():
    with pytest.raises(flashsim.FlashsimError, match="flash1"):
        flashsim.plan("flash2", 64, 16, kv_launches=True)
    with pytest.raises(flashsim.FlashsimError, match="True or False"):
        flashsim.plan("flash1", 64, 16, kv_launches="yes")
