"""The backward passes: real gradients against float64, exact traffic against closed forms."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flashsim
from flashsim import FlashsimError, reference
from flashsim.algorithms import BACKWARD
from flashsim.cli import main

from _checks import assert_count_is_closed_form, assert_grid_reaches_the_hard_cases

ALGS = ["standard", "flash1", "flash2"]


def _inputs(shape, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape) for _ in range(4))     # Q, K, V, dO


def _max_err(got, want):
    return max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))


# --------------------------------------------------------------------------------------
# The reference itself


@pytest.mark.parametrize("causal", [False, True])
def test_reference_gradients_match_finite_differences(causal):
    """phi = sum(O o dO): each reference gradient against central differences of phi."""
    Q, K, V, dO = _inputs((7, 3), seed=2)
    grads = reference.attention_backward(Q, K, V, dO, causal)

    def phi(Q, K, V):
        return float((reference.attention(Q, K, V, causal) * dO).sum())

    h = 1e-6
    for which, grad in enumerate(grads):
        num = np.zeros_like(grad)
        for idx in np.ndindex(grad.shape):
            args = [Q.copy(), K.copy(), V.copy()]
            args[which][idx] += h
            up = phi(*args)
            args[which][idx] -= 2 * h
            num[idx] = (up - phi(*args)) / (2 * h)
        assert np.abs(grad).max() > 1e-2                  # not trivially zero
        assert np.max(np.abs(num - grad)) <= 1e-7


# --------------------------------------------------------------------------------------
# Gradients


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pass_", ["bwd", "fwd+bwd"])
@pytest.mark.parametrize("N,d,Br,Bc", [(97, 16, 16, 24), (45, 8, 7, 13), (64, 8, 64, 64),
                                       (33, 5, 32, 8)])
def test_gradients_match_float64_reference(alg, causal, pass_, N, d, Br, Bc):
    Q, K, V, dO = _inputs((2, N, d))
    p = flashsim.plan(alg, N, d, batch=2, block_rows=Br, block_cols=Bc, causal=causal,
                      sram="1MiB", pass_=pass_)
    grads, rep = p.run(Q, K, V, dO=dO)
    assert isinstance(grads, flashsim.Gradients)
    assert _max_err(grads, reference.attention_backward(Q, K, V, dO, causal)) <= 1e-9
    assert np.max(np.abs(rep.hbm["O"] - reference.attention(Q, K, V, causal))) <= 1e-9
    assert not any(np.isnan(g).any() for g in grads)


@pytest.mark.parametrize("passes", [("scale",), ("mask",), ("scale", "mask"), ("mask", "scale")])
@pytest.mark.parametrize("causal", [False, True])
def test_standard_extra_passes_have_their_own_backward(passes, causal):
    Q, K, V, dO = _inputs((40, 8), seed=4)
    p = flashsim.plan("standard", 40, 8, sram="1MiB", extra_passes=passes, causal=causal,
                      block_rows=16, block_cols=16, pass_="bwd")
    grads, rep = p.run(Q, K, V, dO=dO)
    assert _max_err(grads, reference.attention_backward(Q, K, V, dO, causal)) <= 1e-9
    names = [n for n in rep.per_tensor if n.startswith("dS")]
    assert len(names) == 1 + len(passes)                   # one gradient matrix per pass
    for name in names:
        assert rep.per_tensor[name]["write_bytes"] == 40 * 40 * 4
    if "scale" in passes:   # dS (before the scale) is tau times d(S_scaled)
        assert np.allclose(rep.hbm["dS"], rep.hbm["dS_scaled"] / np.sqrt(8), rtol=0, atol=1e-12)


def test_standard_softmax_backward_streams_twice_when_rows_do_not_fit():
    # A row of P and one of dP: 2 * 300 * 4 + 4 = 2404 B > M = 2048 B.
    Q, K, V, dO = _inputs((300, 8), seed=6)
    p = flashsim.plan("standard", 300, 8, sram="2KiB", block_rows=8, block_cols=8,
                      causal=True, pass_="bwd")
    assert BACKWARD["standard"].softmax_bwd_rows(300, p.sram_bytes, 4) == 0
    grads, rep = p.run(Q, K, V, dO=dO)
    assert _max_err(grads, reference.attention_backward(Q, K, V, dO, True)) <= 1e-9
    assert rep.per_tensor["P"]["read_bytes"] == 3 * 300 * 300 * 4
    assert rep.per_tensor["dP"]["read_bytes"] == 2 * 300 * 300 * 4
    assert rep.per_tensor == p.closed_form().per_tensor


@pytest.mark.parametrize("alg", ["flash1", "flash2"])
def test_huge_logits_with_a_moving_maximum(alg):
    """Logits up to ~1e3 whose row maximum moves past the first block: P recomputed from
    the saved statistics must not overflow."""
    N, d = 96, 8
    Q, K, V, dO = _inputs((N, d), seed=3)
    K = K + np.linspace(0, 3, N)[:, None]
    Q = Q * 400.0
    S = Q @ K.T / np.sqrt(d)
    assert np.abs(S).max() > 1e3                          # the test reaches the hard path
    assert np.argmax(S, axis=1).max() > 32
    for causal in (False, True):
        ref = reference.attention_backward(Q, K, V, dO, causal)
        assert max(np.abs(g).max() for g in ref) > 1e-2   # gradients are not all ~0
        p = flashsim.plan(alg, N, d, block_rows=16, block_cols=16, causal=causal,
                          sram="1MiB", pass_="bwd")
        grads, _ = p.run(Q, K, V, dO=dO)
        assert _max_err(grads, ref) <= 1e-9


def test_flash2_D_and_the_fp16_accumulator():
    Q, K, V, dO = _inputs((50, 8), seed=5)
    p = flashsim.plan("flash2", 50, 8, dtype="fp16", block_rows=16, block_cols=16,
                      causal=True, sram="1MiB", pass_="bwd")
    grads, rep = p.run(Q, K, V, dO=dO)
    O = reference.attention(Q, K, V, True)
    assert np.max(np.abs(rep.hbm["D"] - (dO * O).sum(axis=-1, keepdims=True))) <= 1e-12
    assert np.max(np.abs(rep.hbm["dQ_acc"] - grads.dQ)) == 0
    assert _max_err(grads, reference.attention_backward(Q, K, V, dO, True)) <= 1e-9
    # fp32 accumulator: 4 bytes whatever the data type; dQ itself written once in fp16.
    t = rep.per_tensor
    assert t["dQ"] == {"read_bytes": 0, "write_bytes": 50 * 8 * 2}
    assert t["dQ_acc"]["read_bytes"] % (8 * 4) == 0 and t["dK"]["write_bytes"] == 50 * 8 * 2


# --------------------------------------------------------------------------------------
# Traffic: counted == closed form, values engine == count-only engine

SHAPES = [
    (64, 16, 16, 16), (100, 16, 16, 32), (97, 8, 12, 20), (33, 4, 32, 8), (40, 8, 64, 64),
    (17, 3, 5, 7), (128, 32, 32, 16), (50, 10, 1, 7), (31, 5, 31, 1), (129, 16, 64, 32),
]
CASES = [(alg, pass_, *shape, causal) for alg, pass_, shape, causal
         in itertools.product(ALGS, ["bwd", "fwd+bwd"], SHAPES, [False, True])]


def _plan(alg, N, d, Br, Bc, causal, pass_="bwd", **kw):
    return flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal,
                         sram=kw.pop("sram", "1MiB"), batch=2, heads=3, pass_=pass_, **kw)


@pytest.mark.parametrize("alg,pass_,N,d,Br,Bc,causal", CASES)
def test_count_equals_closed_form(alg, pass_, N, d, Br, Bc, causal):
    assert_count_is_closed_form(_plan(alg, N, d, Br, Bc, causal, pass_))


def test_grid_has_at_least_50_shapes_with_ragged_and_causal():
    assert_grid_reaches_the_hard_cases([(N, Br, Bc, c) for _, _, N, _, Br, Bc, c in CASES])


@settings(max_examples=60, deadline=None)
@given(alg=st.sampled_from(ALGS), N=st.integers(1, 300), d=st.integers(1, 64),
       Br=st.integers(1, 80), Bc=st.integers(1, 80), causal=st.booleans(),
       dtype=st.sampled_from(["fp32", "fp16"]), pass_=st.sampled_from(["bwd", "fwd+bwd"]))
def test_count_equals_closed_form_random(alg, N, d, Br, Bc, causal, dtype, pass_):
    p = flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, sram="4MiB",
                      dtype=dtype, pass_=pass_)
    assert p.count().per_tensor == p.closed_form().per_tensor
    assert p.count().flops == p.closed_form().flops


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pass_", ["bwd", "fwd+bwd"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_values_run_counts_what_count_only_counts(alg, causal, pass_, dtype):
    p = _plan(alg, 70, 8, 16, 24, causal, pass_, dtype=dtype)
    Q, K, V, dO = _inputs((2, 3, 70, 8), seed=1)
    _, ran = p.run(Q, K, V, dO=dO)
    counted = p.count()
    assert ran.per_tensor == counted.per_tensor
    assert ran.flops == counted.flops
    assert ran.sram_peak_bytes == counted.sram_peak_bytes == sum(b for _, b in p.working_set())


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
def test_fwd_plus_bwd_is_the_sum_of_the_two_reports(alg, causal):
    parts = [_plan(alg, 90, 8, 16, 32, causal, pass_).count() for pass_ in ("fwd", "bwd")]
    both = _plan(alg, 90, 8, 16, 32, causal, "fwd+bwd").count()
    for name, t in both.per_tensor.items():
        for key in ("read_bytes", "write_bytes"):
            assert t[key] == sum(r.per_tensor.get(name, {}).get(key, 0) for r in parts)
    assert both.flops == parts[0].flops + parts[1].flops
    assert both.sram_peak_bytes == max(r.sram_peak_bytes for r in parts)


def test_dq_read_modify_write_is_counted_per_tile():
    """N = 64, B_r = B_c = 16, d = 8, fp32, no mask: T_c = 4 K/V blocks each read and write
    all of dQ (64 x 8 x 4 B = 2 KiB), plus dQ's zeroing: counted by hand."""
    for alg in ("flash1", "flash2"):
        t = flashsim.plan(alg, 64, 8, block_rows=16, block_cols=16, sram="1MiB",
                          pass_="bwd").count().per_tensor
        assert t["dQ"] == {"read_bytes": 4 * 2048, "write_bytes": 4 * 2048 + 2048}
        assert t["Q"]["read_bytes"] == t["dO"]["read_bytes"] - (2048 if alg == "flash2" else 0)
        assert t["K"]["read_bytes"] == t["dK"]["write_bytes"] == 2048
    # Causal, 4 x 4 tiles: K/V block j meets 4 - j Q blocks: 10 tiles of 16 rows.
    t = flashsim.plan("flash2", 64, 8, block_rows=16, block_cols=16, sram="1MiB",
                      causal=True, pass_="bwd").count().per_tensor
    assert t["dQ"]["read_bytes"] == 10 * 16 * 8 * 4


# --------------------------------------------------------------------------------------
# What the model says about the backward


def test_only_standard_moves_n_by_n_matrices():
    N, d = 512, 64
    std = flashsim.plan("standard", N, d, sram="100KiB", pass_="bwd").count().per_tensor
    assert std["P"]["read_bytes"] == 2 * N * N * 4 and std["dS"]["read_bytes"] == 2 * N * N * 4
    assert std["dP"]["write_bytes"] == std["dS"]["write_bytes"] == N * N * 4
    square = {n for n, t in flashsim.plan("standard", N, d, pass_="bwd").nest().tensors.items()
              if t.cols == N}
    assert square == {"P", "dP", "dS"}
    for alg in ("flash1", "flash2"):     # nothing wider than d (or 1, for statistics)
        tensors = flashsim.plan(alg, N, d, sram="100KiB", pass_="bwd").nest().tensors
        assert {t.cols for t in tensors.values()} == {1, d}


def test_recomputation_costs_flops_and_saves_bytes():
    N, d = 4096, 64
    rep = {alg: flashsim.plan(alg, N, d, sram="100KiB", dtype="fp16",
                              pass_="fwd+bwd").count() for alg in ALGS}
    assert rep["standard"].flops == 12 * N * N * d             # 2 + 4 matmuls
    for alg in ("flash1", "flash2"):
        assert rep[alg].flops == 14 * N * N * d                # S_ij recomputed
        assert rep[alg].hbm_bytes < rep["standard"].hbm_bytes / 2


def test_theorem5_doubling_M_about_halves_flash1_backward_passes():
    """Beyond the compulsory 5 N d b (K, V read; dK, dV written; dQ zeroed), Algorithm 4
    makes T_c passes over Q, O, dO and dQ: doubling M about halves them."""
    N, d = 8192, 64
    sizes = ["512KiB", "1MiB", "2MiB", "4MiB"]
    plans = [flashsim.plan("flash1", N, d, sram=m, pass_="bwd") for m in sizes]
    assert all(p.block_rows == d for p in plans)     # B_c grows with M, B_r stays d
    passes = [p.count().hbm_bytes - 5 * N * d * 4 for p in plans]
    for small, big in zip(passes, passes[1:]):
        assert 0.4 < big / small < 0.6, big / small


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("sram", ["8KiB", "48KiB", "100KiB", "227KiB"])
@pytest.mark.parametrize("d", [16, 64, 128])
def test_backward_default_blocks_fit_and_formula_matches_nest(alg, sram, d):
    p = flashsim.plan(alg, 2048, d, sram=sram, pass_="bwd")
    ws = sum(b for _, b in p.working_set())
    assert ws <= p.sram_bytes
    module = BACKWARD[alg]
    formula = module.working_set_bytes(p.block_rows, p.block_cols, d, 4)
    if alg == "standard":
        R = module.softmax_bwd_rows(2048, p.sram_bytes, 4)
        matmul = 4 * (p.block_rows * d + p.block_cols * d + p.block_rows * p.block_cols)
        assert ws == max(matmul, R * (2 * 2048 * 4 + 4) if R else formula)
    else:
        assert ws == formula
    if alg == "flash2":   # the largest multiple of 16 that fits
        assert module.working_set_bytes(p.block_rows + 16, p.block_rows + 16, d, 4) > p.sram_bytes


def test_backward_blocks_are_used_by_both_passes():
    p = flashsim.plan("flash2", 4096, 64, sram="100KiB", pass_="fwd+bwd")
    f = flashsim.plan("flash2", 4096, 64, sram="100KiB")
    assert p.block_rows < f.block_rows          # the backward's working set is larger
    fwd_part = flashsim.plan("flash2", 4096, 64, sram="100KiB", block_rows=p.block_rows,
                             block_cols=p.block_cols).count()
    assert p.count().per_tensor["L"]["write_bytes"] == fwd_part.per_tensor["L"]["write_bytes"]


# --------------------------------------------------------------------------------------
# Bad input, the CLI


def test_bad_backward_calls_are_clear_errors():
    good = np.ones((8, 4))
    with pytest.raises(FlashsimError, match="pass"):
        flashsim.plan("flash2", 8, 4, sram="1MiB", pass_="backward")
    bwd = flashsim.plan("flash2", 8, 4, sram="1MiB", pass_="bwd")
    with pytest.raises(FlashsimError, match="needs dO"):
        bwd.run(good, good, good)
    with pytest.raises(FlashsimError, match="dO is for"):
        flashsim.plan("flash2", 8, 4, sram="1MiB").run(good, good, good, dO=good)
    bad = good.copy()
    bad[0, 0] = np.inf
    with pytest.raises(FlashsimError, match="dO contains NaN or Inf"):
        bwd.run(good, good, good, dO=bad)
    with pytest.raises(FlashsimError, match="shape"):
        bwd.run(good, good, good, dO=np.ones((8, 5)))
    with pytest.raises(FlashsimError, match="SRAM"):
        flashsim.plan("flash2", 1024, 64, block_rows=64, block_cols=64, sram="64KiB",
                      pass_="bwd")


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [[], ["--causal"]])
def test_cli_verify_covers_output_and_gradients(capsys, alg, causal):
    code = main(["io", "-a", alg, "-N", "203", "-d", "24", "--sram", "64KiB", "--block-rows",
                 "24", "--block-cols", "40", "--verify", "--json", "--heads", "2",
                 "--pass", "fwd+bwd", *causal])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    d = json.loads(out)
    assert d["pass"] == "fwd+bwd"
    assert set(d["max_abs_error_by_tensor"]) == {"O", "dQ", "dK", "dV"}
    assert d["max_abs_error"] == max(d["max_abs_error_by_tensor"].values()) <= 1e-9
    assert d["per_tensor"]["dQ"]["write_bytes"] > 0


def test_cli_tables_and_bad_pass(capsys):
    assert main(["io", "-a", "flash1", "-N", "300", "-d", "16", "--pass", "bwd",
                 "--verify"]) == 0
    out, _ = capsys.readouterr()
    assert "flash1 bwd" in out and "max |dK - dK_ref|" in out and "dQ" in out
    assert main(["compare", "-N", "256", "-d", "32", "--pass", "bwd", "--json"]) == 0
    algs = json.loads(capsys.readouterr()[0])["compare"]
    assert [a["pass"] for a in algs] == ["bwd"] * 3
    assert "softmax_bwd_rows" in algs[0]
    code = main(["io", "-a", "flash2", "-N", "64", "-d", "8", "--pass", "both"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "--pass" in err


# --------------------------------------------------------------------------------------
# Notebook 07's logic: flashsim.views.backward

from flashsim.views import backward as recomputation, widgets  # noqa: E402


def test_saved_for_backward_is_what_the_forward_leaves_for_the_backward():
    N, d, heads = 256, 32, 6
    expect = {"standard": {"P": N * N * 2}, "flash1": {"O": N * d * 2, "l": 4 * N, "m": 4 * N},
              "flash2": {"O": N * d * 2, "L": 4 * N}}
    for alg, saved in expect.items():
        p = flashsim.plan(alg, N, d, batch=2, heads=3, dtype="fp16", sram="1MiB",
                          pass_="fwd+bwd")
        assert p.saved_for_backward() == {k: heads * v for k, v in saved.items()}


def test_fwd_bwd_rows_add_up_to_the_fwd_plus_bwd_plan():
    rows = recomputation.fwd_bwd_rows(512, 64, batch=2, heads=4, dtype="fp16", gpu="h100",
                                      causal=True, extra_passes=("scale",))
    assert [r["algorithm"] for r in rows] == list(ALGS)
    for r in rows:
        p = flashsim.plan(r["algorithm"], 512, 64, batch=2, heads=4, dtype="fp16", gpu="h100",
                          causal=True, extra_passes=tuple(r["extra_passes"]), pass_="fwd+bwd")
        rep = p.count()
        assert (r["hbm_bytes"], r["flops"]) == (rep.hbm_bytes, rep.flops)
        assert r["time_s"] == rep.predicted_time_s
        assert r["fwd_flops"] + r["bwd_flops"] == rep.flops
    assert rows[0]["extra_passes"] == ["scale"] and rows[1]["extra_passes"] == []
    assert "kept for backward" in recomputation.format_rows(rows)


def test_memory_view_grows_as_n_squared_against_n():
    v = recomputation.memory_view(seq_len=2048, sizes=(256, 512, 1024))
    assert list(v["sizes"]) == [256, 512, 1024, 2048]
    s, f = v["saved"]["standard"], v["saved"]["flash2"]
    assert np.all(s[1:] == 4 * s[:-1]) and np.all(f[1:] == 2 * f[:-1])
    assert all(np.all(np.diff(t) > 0) for t in v["time"].values())
    assert v["rows"][0]["algorithm"] == "standard" and v["capacity_bytes"] == 141e9


def test_figure2_quotes_the_paper_and_counts_the_same_shape():
    fig = recomputation.figure2()
    v2, neurips = fig["papers"]          # both published versions, each under its own name
    assert v2["standard"]["hbm_rw_gb"] == 40.3 and v2["flash"]["hbm_rw_gb"] == 4.4
    assert "arXiv:2205.14135v2" in v2["source"]
    assert neurips["standard"]["hbm_rw_gb"] == 35.3 and neurips["flash"]["runtime_ms"] == 11.7
    rows = {r["algorithm"]: r for r in fig["rows"]}
    N, d, BH = 1024, 64, 64 * 16
    assert rows["standard"]["flops"] == 12 * N * N * d * BH
    assert rows["standard +scale,mask"]["hbm_bytes"] > rows["standard"]["hbm_bytes"]
    text = recomputation.format_figure2(fig)
    assert "40.3" in text and "4.4" in text and "flash1" in text


def test_measurements_absent_or_consistent_with_the_model(tmp_path):
    assert recomputation.measurements(tmp_path / "none.json") == []
    assert "no H200 measurements" in recomputation.format_measurements([])
    points = recomputation.measurements()
    for p in points:
        assert p["time_ms"] > 0 and p["max_abs_err"]
        if p["impl"].startswith("numba_"):     # the stored prediction is today's model's
            alg = p["impl"].split("_")[1]
            rep = flashsim.plan(alg, p["N"], p["d"], batch=p["batch"], heads=p["heads"],
                                dtype="fp32", gpu="h200", causal=p["causal"],
                                block_rows=p["block_rows"], block_cols=p["block_cols"],
                                pass_="bwd").count()
            assert rep.hbm_bytes == p["flashsim_hbm_bytes"]
            assert rep.predicted_time_s * 1e3 == pytest.approx(p["roofline_time_ms"], rel=1e-12)
    if points:
        assert "numba_flash2_bwd" in recomputation.format_measurements(points)


def test_recomputation_panel_follows_its_slider():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("matplotlib")
    panel = widgets.recomputation_panel(seq_len=512, batch=1, heads=1)
    assert panel.view["seq_len"] == 512
    panel.controls["seq_len"].value = 4096
    assert panel.view["seq_len"] == 4096 and panel.error is None
