"""The model's claims: Theorem 2, the compulsory floor, block rules, presets, bad input."""

import numpy as np
import pytest

import flashsim
from flashsim import FlashsimError, SramOverflowError, parse_size
from flashsim.algorithms import ALGORITHMS

N, D = 4096, 64


def test_theorem2_doubling_M_about_halves_flash1_traffic():
    # From 128 KiB up, B_r = d and B_c = ceil(M / 4d) grows with M (below that B_r < d).
    sizes = [parse_size(s) for s in ("128KiB", "256KiB", "512KiB", "1MiB")]
    traffic = [flashsim.plan("flash1", N, D, sram=m).count().hbm_bytes for m in sizes]
    for small, big in zip(traffic, traffic[1:]):
        assert 0.45 < big / small < 0.6, big / small


def test_standard_traffic_does_not_depend_on_M():
    counts = {flashsim.plan("standard", N, D, sram=m).count().hbm_bytes
              for m in ("64KiB", "100KiB", "228KiB", "1MiB", "16MiB")}
    assert len(counts) == 1


@pytest.mark.parametrize("alg", list(ALGORITHMS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sram", ["16KiB", "100KiB", "1MiB", "64MiB"])
def test_no_algorithm_goes_below_the_compulsory_floor(alg, causal, sram):
    rep = flashsim.plan(alg, 1000, 64, sram=sram, causal=causal, dtype="fp16").count()
    t = rep.per_tensor
    nd = 1000 * 64 * 2
    for name in "QKV":
        assert t[name]["read_bytes"] >= nd
    assert t["O"]["write_bytes"] >= nd
    assert rep.hbm_bytes >= 4 * nd


def test_flash_beats_standard_by_a_wide_margin():
    # The paper's setting: fp16, M about 100 KB.
    std = flashsim.plan("standard", N, D, sram="100KiB", dtype="fp16").count().hbm_bytes
    for alg in ("flash1", "flash2"):
        hbm = flashsim.plan(alg, N, D, sram="100KiB", dtype="fp16").count().hbm_bytes
        assert hbm < std / 4


def test_flash1_default_blocks_follow_the_paper_when_they_fit():
    # M = 1 MiB fp32 = 262144 elements: B_c = ceil(M / 4d) = 1024, B_r = min(B_c, d) = 64.
    p = flashsim.plan("flash1", 8192, 64, sram="1MiB")
    assert (p.block_rows, p.block_cols) == (64, 1024)
    # M = 100 KiB: the rule gives B_c = 100, whose working set (with S_ij and the
    # statistics, which the rule leaves out) overflows, so B_c shrinks to the largest fit.
    f = ALGORITHMS["flash1"].working_set_bytes
    q = flashsim.plan("flash1", 8192, 64, sram="100KiB")
    assert f(64, 100, 64, 4) > 102400
    assert q.block_rows == 64 and q.block_cols < 100
    assert f(64, q.block_cols, 64, 4) <= 102400 < f(64, q.block_cols + 1, 64, 4)


@pytest.mark.parametrize("alg", list(ALGORITHMS))
@pytest.mark.parametrize("sram", ["8KiB", "48KiB", "100KiB", "227KiB"])
@pytest.mark.parametrize("d", [16, 64, 128])
def test_default_blocks_fit_and_formula_matches_nest(alg, sram, d):
    p = flashsim.plan(alg, 2048, d, sram=sram)
    ws = sum(b for _, b in p.working_set())
    assert ws <= p.sram_bytes
    formula = ALGORITHMS[alg].working_set_bytes(p.block_rows, p.block_cols, d, 4)
    if alg == "standard":   # the softmax kernel may set the peak
        assert ws == max(formula, p.softmax_rows * (2048 * 4 + 8))
    else:
        assert ws == formula


def test_flash2_blocks_are_the_largest_multiple_of_16_that_fits():
    p = flashsim.plan("flash2", 4096, 64, sram="100KiB")
    f = ALGORITHMS["flash2"].working_set_bytes
    assert p.block_rows == p.block_cols and p.block_rows % 16 == 0
    assert f(p.block_rows + 16, p.block_rows + 16, 64, 4) > 100 * 1024


def test_presets_and_roofline():
    for key, g in flashsim.GPUS.items():
        assert g.source and g.sms > 0 and g.sram_per_block > 0 and g.l2_bytes > 0
        assert g.peak_tensor_fp16 > g.peak_fp32 or key == "rtx4090" and g.peak_tensor_fp16 > 0
    rep = flashsim.plan("flash2", N, D, gpu="h200").count()
    g = flashsim.GPUS["h200"]
    assert rep.plan.sram_bytes == g.sram_per_block
    assert rep.predicted_time_s == max(rep.hbm_bytes / g.hbm_bandwidth, rep.flops / g.peak_fp32)
    assert flashsim.plan("flash2", N, D, sram="100KiB").count().predicted_time_s is None


@pytest.mark.parametrize("text,value", [("100KiB", 102400), ("228KB", 228000), ("1MiB", 2**20),
                                        ("65536", 65536), ("48K", 49152), ("1.5KiB", 1536),
                                        ("0.5KiB", 512), ("1TiB", 2**40), ("1.000001MB", 1000001),
                                        ("64 KiB", 65536), (2**40, 2**40)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text,words", [
    ("1" * 300, "too large"), ("1" * 30 + "KiB", "more than the limit"), ("1.0000001MB", "whole"),
    ("１KiB", "cannot read"), ("1_000", "cannot read"), ("1e5", "cannot read"), (True, "not a size"),
    (1.5, "not a size"), ("0KiB", "positive"), (-5, "positive"), (2**40 + 1, "limit")])
def test_sizes_are_read_exactly_or_refused(text, words):
    """No float on the way: a 30-digit size is compared exactly with the limit, 1.0000001 MB
    is 1000000.1 bytes (not whole), and only ASCII digits count."""
    with pytest.raises(FlashsimError, match=words):
        parse_size(text)


@pytest.mark.parametrize("kwargs,words", [
    (dict(seq_len=0), "seq_len"), (dict(seq_len=-5), "seq_len"), (dict(head_dim=2.5), "head_dim"),
    (dict(seq_len=True), "seq_len"), (dict(dtype="fp8"), "dtype"), (dict(gpu="tpu"), "GPU"),
    (dict(sram="12 parsecs"), "size"), (dict(sram="0KiB"), "positive"),
    (dict(sram="0.5B"), "whole"), (dict(block_rows=0), "block_rows"),
    (dict(extra_passes=("scale",), algorithm="flash2"), "standard"),
    (dict(extra_passes=("dropout",), algorithm="standard"), "dropout"),
    (dict(algorithm="flash3"), "algorithm"),
])
def test_bad_input_is_one_clear_error(kwargs, words):
    args = dict(algorithm="flash2", seq_len=64, head_dim=16) | kwargs
    with pytest.raises(FlashsimError, match=words):
        flashsim.plan(args.pop("algorithm"), args.pop("seq_len"), args.pop("head_dim"), **args)


def test_tiles_too_big_for_sram_are_refused_with_a_breakdown():
    with pytest.raises(SramOverflowError, match=r"SRAM.*Q_i 16384.*K_j") as e:
        flashsim.plan("flash2", 1024, 64, block_rows=64, block_cols=64, sram="32KiB")
    assert "M = 32768 B" in str(e.value)
    with pytest.raises(SramOverflowError, match="SRAM"):
        flashsim.plan("flash2", 1024, 4096, sram="16KiB")


def test_bad_arrays_are_refused_before_anything_runs():
    p = flashsim.plan("flash2", 8, 4, sram="1MiB")
    good = np.ones((8, 4))
    bad = good.copy()
    bad[3, 1] = np.nan
    with pytest.raises(FlashsimError, match="NaN or Inf"):
        p.run(good, bad, good)
    with pytest.raises(FlashsimError, match="shape"):
        p.run(good, np.ones((8, 5)), good)
    with pytest.raises(FlashsimError, match="heads"):
        p.run(*(np.ones((2, 8, 4)),) * 3)
    with pytest.raises(FlashsimError, match="real numbers"):
        p.run(good, good.astype(complex), good)


# --------------------------------------------------------------------------------------
# fastest_blocks: a kernel's own notion of what it can run, ranked by flashsim's counts

def _brute_fastest(alg, N, d, eff, causal=False, dtype="fp32"):
    """Every candidate through the counting engine (not the closed form): the reference."""
    gpu = flashsim.GPUS["h200"]
    best = None
    for Br in sorted({min(B, N) for B in range(16, 257, 16)}):
        for Bc in sorted({min(B, N) for B in range(16, 257, 16)}):
            e = eff(Br, Bc)
            if not e:
                continue
            rep = flashsim.plan(alg, seq_len=N, head_dim=d, sram="1GiB", causal=causal,
                                dtype=dtype, block_rows=Br, block_cols=Bc).count()
            t = max(rep.hbm_bytes / gpu.hbm_bandwidth, rep.flops / (gpu.peak_flops(dtype) * e))
            key = (t, rep.hbm_bytes, -Br * Bc, -Br)
            if best is None or key < best[0]:
                best = (key, (Br, Bc))
    return best[1]


@pytest.mark.parametrize("alg", ["flash1", "flash2"])
@pytest.mark.parametrize("causal", [False, True])
def test_fastest_blocks_is_the_brute_force_minimum(alg, causal):
    # a kernel that runs tiles up to 8192 elements and likes wide ones
    def eff(Br, Bc):
        return 0.0 if Br * Bc > 8192 else 1.0 / (1.0 + 32.0 / Bc + 16.0 / Br)
    got = flashsim.fastest_blocks(alg, 1000, 64, eff, causal=causal)
    assert got == _brute_fastest(alg, 1000, 64, eff, causal)


def test_fastest_blocks_ties_go_to_fewer_bytes_then_the_larger_tile():
    # compute-bound at a flat efficiency: every tile takes the same time, so FA2 takes the
    # largest B_r (K and V read T_r times) and then the widest B_c; FA1 the widest B_c
    assert flashsim.fastest_blocks("flash2", 4096, 64, lambda r, c: 1.0) == (256, 256)
    r, c = flashsim.fastest_blocks("flash1", 4096, 64, lambda r, c: 1.0 if r <= 32 else 0)
    assert (r, c) == (32, 256)


def test_fastest_blocks_fixed_dimension_and_refusals():
    assert flashsim.fastest_blocks("flash2", 512, 64, lambda r, c: 1.0, block_cols=16)[1] == 16
    assert flashsim.fastest_blocks("flash2", 40, 64, lambda r, c: 1.0) == (40, 40)
    with pytest.raises(SramOverflowError):
        flashsim.fastest_blocks("flash2", 512, 64, lambda r, c: 0.0)
    with pytest.raises(FlashsimError):
        flashsim.fastest_blocks("standard", 512, 64, lambda r, c: 1.0)


def test_a_launch_takes_at_least_its_chain_of_steps():
    """The time model's latency term: a launch of a few short blocks (one wave, a handful
    of K/V blocks each) cannot end before its steps, one memory latency each, however
    little it computes; a long launch is bound by its compute, not by the chain."""
    from flashsim.hardware import l2, timing
    short = flashsim.plan("flash2", 256, 64, batch=1, heads=2, dtype="fp16", gpu="h200",
                          block_rows=128, block_cols=64)
    rep = l2.simulate(short, blocks_per_sm=1)
    (t,) = timing.predict(short, timing.Efficiency.for_dtype("fp16", 0.25), l2=rep)
    assert rep.launches[0].steps == 4 + 2          # Q_i; four K/V blocks; O_i
    assert t.latency_s == rep.launches[0].steps * timing.STEP_LATENCY_S > t.compute_s
    assert t.seconds == t.latency_s + timing.LAUNCH_LATENCY_S
    long = flashsim.plan("flash2", 4096, 128, batch=4, heads=16, dtype="fp16", gpu="h200",
                         block_rows=128, block_cols=64)
    (t,) = timing.predict(long, timing.Efficiency.for_dtype("fp16", 0.25), blocks_per_sm=2)
    assert t.compute_s > 2 * t.latency_s > 0
    assert t.seconds == t.compute_s + timing.LAUNCH_LATENCY_S


@pytest.mark.parametrize("causal", [False, True])
def test_a_launch_per_kv_block_is_timed_launch_by_launch(causal, monkeypatch):
    """flash1 as numba's kernel runs it: line 2's launch, then T_c launches of one block per
    (Q block, head). Every launch pays the launch latency, the blocks' FLOPs add up to the
    count's, the launches of one class (the same blocks renamed) are timed as one is, and
    spread over the SMs it computes far faster than one block per head."""
    from flashsim.hardware import timing
    kw = dict(batch=2, heads=8, block_rows=32, block_cols=48, gpu="h200", causal=causal)
    two = flashsim.plan("flash1", 2048, 64, kv_launches=True, **kw)
    eff = timing.Efficiency.for_dtype("fp32", 0.2)
    got = timing.predict(two, eff, blocks_per_sm=5, warps_per_block=4)
    assert len(got) == 1 + -(-2048 // 48)
    flops = timing.block_flops(two)
    assert 16 * sum(sum(f) for _, f in flops) == two.count().flops
    assert all(t.seconds >= timing.LAUNCH_LATENCY_S for t in got)
    monkeypatch.setattr(timing, "launch_class", lambda launch, tensors: None)
    assert timing.predict(two, eff, blocks_per_sm=5, warps_per_block=4) == got
    one = flashsim.plan("flash1", 2048, 64, **kw)
    (alone,) = timing.predict(one, eff, blocks_per_sm=5, warps_per_block=4)
    assert sum(t.compute_s for t in got) < alone.compute_s / 10
