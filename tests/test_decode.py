"""Decoding (flashsim.decode): counted == closed form, values == float64, the time model's
memory-bound regime, and one clear error for each bad input."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flashsim
from flashsim import decode
from flashsim.algorithms import flashdecoding, paged
from flashsim.cli import answer

# (algorithm, kv_lens, q_len, heads, kv_heads, page_size): ragged batches, q_len > 1,
# group sizes 1/4/8/32, page sizes that do not divide kv_len, tiles that do not either.
LENS = [(100,), (37, 37), (5, 300, 77), (64,)]
GROUPS = [(4, 4), (8, 2), (8, 1), (32, 1)]
GRID = []
for lens, (h, kvh), q in itertools.product(LENS, GROUPS, [1, 3, 16]):
    if q > min(lens):
        continue
    GRID += [("flash2", lens, q, h, kvh, None, 1), ("flashdecoding", lens, q, h, kvh, None, 3),
             ("paged", lens, q, h, kvh, 8, 2)]
GRID += [("paged", (100, 3), 1, 4, 2, 32, "auto"), ("paged", (129,), 2, 4, 4, 1, 4),
         ("flashdecoding", (1000,), 1, 8, 8, None, "auto")]


def _plan(alg, lens, q, h, kvh, page, splits, **kw):
    return flashsim.plan(alg, q_len=q, kv_lens=list(lens), head_dim=8, heads=h,
                         kv_heads=kvh, page_size=page, splits=splits, block_cols=16,
                         dtype="fp16", **kw)


def assert_counts_match(p):
    c, f = p.count(), p.closed_form()
    assert c.per_tensor == f.per_tensor
    assert (c.flops, c.exp_ops, c.nonmatmul_flops) == (f.flops, f.exp_ops, f.nonmatmul_flops)
    assert (c.sram_peak_bytes, c.register_peak_bytes) == (f.sram_peak_bytes,
                                                          f.register_peak_bytes)
    return c


def test_grid_reaches_the_hard_cases():
    assert len(GRID) >= 50
    assert any(len(set(lens)) > 1 for _, lens, *_ in GRID)                 # ragged
    assert {h // kvh for _, _, _, h, kvh, *_ in GRID} >= {1, 4, 8, 32}
    assert any(p and any(n % p for n in lens) for _, lens, _, _, _, p, _ in GRID)
    assert any(q > 1 for _, _, q, *_ in GRID)


@pytest.mark.parametrize("case", GRID)
def test_count_equals_closed_form(case):
    assert_counts_match(_plan(*case))


@settings(max_examples=40, deadline=None)
@given(alg=st.sampled_from(["flash2", "flashdecoding", "paged", "mla"]),
       lens=st.lists(st.integers(16, 400), min_size=1, max_size=4),
       q=st.integers(1, 16), g=st.sampled_from([1, 2, 4, 8]), kvh=st.integers(1, 3),
       page=st.sampled_from([1, 2, 4, 16, 32, 64]), splits=st.integers(1, 9),
       Bc=st.sampled_from([8, 16, 32]), pack=st.booleans())
def test_count_equals_closed_form_random(alg, lens, q, g, kvh, page, splits, Bc, pack):
    kw = dict(q_len=q, kv_lens=lens, block_cols=Bc, dtype="bf16")
    if alg == "mla":
        kw.update(heads=g * kvh, latent_dim=16, rope_dim=4, splits=splits)
    else:
        kw.update(heads=g * kvh, kv_heads=kvh, head_dim=8, gqa_pack=pack,
                  splits=1 if alg == "flash2" else splits,
                  page_size=page if alg == "paged" else None)
    assert_counts_match(flashsim.plan(alg, **kw))


VALUE_CASES = [
    dict(algorithm="flash2", q_len=1, kv_len=90, heads=8, kv_heads=2, batch=2),
    dict(algorithm="flash2", q_len=3, kv_len=90, heads=8, kv_heads=2, batch=2, gqa_pack=False),
    dict(algorithm="flashdecoding", q_len=4, kv_len=150, heads=8, kv_heads=2, batch=2, splits=3),
    dict(algorithm="flashdecoding", q_len=2, kv_lens=[5, 150, 77], heads=4, kv_heads=1,
         splits=4),
    dict(algorithm="flashdecoding", q_len=16, kv_len=40, heads=32, kv_heads=1, splits="auto"),
    dict(algorithm="paged", q_len=2, kv_lens=[5, 150, 77], heads=4, kv_heads=1, splits=4,
         page_size=8),
    dict(algorithm="paged", q_len=1, kv_len=100, heads=4, kv_heads=4, batch=2, splits=2,
         page_size=32),
    dict(algorithm="mla", q_len=2, kv_len=120, heads=8, latent_dim=32, rope_dim=8, splits=3),
    dict(algorithm="mla", q_len=1, kv_lens=[1, 70], heads=4, latent_dim=32, rope_dim=8,
         splits=2, page_size=16),               # paged latent cache: V is its first 32 columns
    dict(algorithm="flashdecoding", q_len=5, kv_lens=[9, 40], heads=6, kv_heads=3, splits=2,
         causal=False),
]


@pytest.mark.parametrize("kw", VALUE_CASES)
def test_values_equal_the_float64_reference(kw):
    if kw["algorithm"] != "mla":
        kw = {**kw, "head_dim": 16}
    p = flashsim.plan(block_cols=16, **kw)
    Q, K, V, table = decode.random_inputs(p, seed=1)
    K = K * 4                                        # running maxima that change per tile
    O, rep = p.run(Q, K, V, block_table=table)
    ref = p.reference(Q, K, V, block_table=table)
    assert O.shape == (p.batch, p.heads, p.q_len, p.v_dim)
    assert np.max(np.abs(O - ref)) < 1e-12
    assert rep.per_tensor == p.count().per_tensor


def test_the_reference_masks_the_last_rows_causally():
    """Row m of q_len sees keys <= n - q_len + m: the first row must not see the last key."""
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((1, 1, 2, 4)), rng.standard_normal((1, 1, 5, 4)), \
        rng.standard_normal((1, 1, 5, 4))
    V2 = V.copy()
    V2[..., 4, :] += 100.0
    a = flashsim.reference.attention_kv(Q, K, V)
    b = flashsim.reference.attention_kv(Q, K, V2)
    assert np.allclose(a[..., 0, :], b[..., 0, :]) and not np.allclose(a[..., 1, :], b[..., 1, :])


def test_flashdecoding_is_at_least_4x_faster_than_flash2_at_batch_1():
    """The issue's target: B = 1, H = 32, kv_heads = 8, kv_len = 32k, d = 128, fp16: eight
    blocks without splits use 8 of 132 SMs, whose bandwidth caps the launch."""
    shape = dict(q_len=1, kv_len=32768, head_dim=128, heads=32, kv_heads=8, batch=1,
                 dtype="fp16", gpu="h200")
    fd = flashsim.plan("flashdecoding", splits="auto", **shape)
    f2 = flashsim.plan("flash2", **shape)
    assert fd.splits > 1 and len(f2.predict()) == 1 and len(fd.predict()) == 2
    assert f2.predict_seconds() >= 4 * fd.predict_seconds()
    # the K/V bytes are the same: the gain is occupancy, not traffic
    assert fd.count().kv_bytes == f2.count().kv_bytes == 2 * 8 * 32768 * 128 * 2


def test_waves_and_launch_latency_in_the_time_model():
    from flashsim.hardware import timing
    big = flashsim.plan("flash2", q_len=1, kv_len=4096, head_dim=128, heads=32, kv_heads=8,
                        batch=64, dtype="fp16")
    (launch,) = big.predict()
    assert launch.blocks == 512                          # 64 x 8: every SM busy, HBM-bound
    eff = timing.Efficiency.for_dtype("fp16")
    assert launch.dram_s == pytest.approx(big.count().requested_bytes
                                          / (big.gpu.hbm_bandwidth * eff.memory))
    assert launch.seconds == pytest.approx(launch.dram_s + 2 * timing.STEP_LATENCY_S
                                           + timing.LAUNCH_LATENCY_S)    # fill, drain, launch
    loads = big.occupancy()[0][1]
    assert len(loads) == 132 and min(loads) >= 3
    small = flashsim.plan("flash2", q_len=1, kv_len=4096, head_dim=128, heads=32,
                          kv_heads=8, batch=1, dtype="fp16")
    assert sum(n > 0 for n in small.occupancy()[0][1]) == 8


def test_an_l2_of_dirty_lines_is_written_back_as_the_step_evicts_it():
    """A step that starts from an L2 holding another kernel's lines, ``dirty_bytes`` of them
    dirty (a benchmark's flush by writing): each byte a launch brings in evicts one of them,
    dirty in that share, until none are left; the DRAM time carries the write-back."""
    from flashsim.hardware import timing
    assert timing.dirty_write_back([10, 20, 100], 30, 100) == [3, 6, 21]
    assert timing.dirty_write_back([500], 30, 100) == [30] and timing.dirty_write_back([5], 0, 100) == [0]
    shape = dict(q_len=1, head_dim=128, heads=32, kv_heads=1, dtype="fp16", gpu="h200", splits=16)
    big = flashsim.plan("flashdecoding", kv_len=32768, batch=8, **shape)    # 134 MB past the L2
    l2, eff = big.gpu.l2_bytes, timing.Efficiency.for_dtype("fp16")
    clean, dirty = big.predict(), big.predict(dirty_bytes=l2 // 2)
    assert dirty[0].dram_s - clean[0].dram_s == pytest.approx(
        (l2 // 2) / (big.gpu.hbm_bandwidth * eff.memory), rel=1e-6)
    assert dirty[1].dram_s == clean[1].dram_s           # nothing of the flush's left for the combine
    small = flashsim.plan("flashdecoding", kv_len=4096, batch=8, **shape)    # 17 MB: within it
    (a, _), (c, _) = small.predict(), small.predict(dirty_bytes=l2 // 2)
    assert a.dram_s > small.occupancy()[0][2][0] / eff.sm_bandwidth        # bound by HBM
    assert c.dram_s == pytest.approx(1.5 * a.dram_s, rel=1e-6)    # half of what it brings in
    with pytest.raises(flashsim.FlashsimError, match="dirty_bytes"):
        big.predict(dirty_bytes=-1)
    with pytest.raises(flashsim.FlashsimError, match="dirty_bytes"):
        big.predict(dirty_bytes=l2 + 1)


@pytest.mark.parametrize("algorithm", ["flashdecoding", "paged"])
def test_fused_combine_saves_one_launch_latency_and_no_byte(algorithm):
    """The combine run by the split launch's blocks (the decode kernel's v7): the same nest,
    so the same counts, and the same launch times but the combine's latency; refused where
    there is no combine to fuse."""
    from flashsim.hardware import timing
    shape = dict(q_len=1, kv_lens=[32768, 700], head_dim=128, heads=32, kv_heads=1, dtype="fp16",
                 gpu="h200", splits=16)
    two, one = (flashsim.plan(algorithm, fused_combine=f, **shape) for f in (False, True))
    c1, c2 = one.count(), two.count()
    assert (c1.per_tensor, c1.hbm_bytes, c1.flops) == (c2.per_tensor, c2.hbm_bytes, c2.flops)
    a, b = two.predict(), one.predict()
    assert [x.launched for x in a] == [True, True] and [x.launched for x in b] == [True, False]
    assert b[0].seconds == a[0].seconds and b[1].dram_s == a[1].dram_s
    assert b[1].fill_drain_s == a[1].fill_drain_s == 2 * timing.STEP_LATENCY_S   # the merge's own
    assert two.predict_seconds() - one.predict_seconds() == pytest.approx(timing.LAUNCH_LATENCY_S)
    with pytest.raises(flashsim.FlashsimError, match="no combine"):
        flashsim.plan("flash2", q_len=1, kv_len=100, head_dim=64, fused_combine=True)
    with pytest.raises(flashsim.FlashsimError, match="fused_combine"):
        flashsim.plan(algorithm, q_len=1, kv_len=100, head_dim=64, fused_combine=1)


def test_splits_heuristic_is_flashattentions():
    assert flashdecoding.num_splits_heuristic(240, 264, 256) == 1        # >= 0.8 of slots
    s = flashdecoding.num_splits_heuristic(8, 264, 256)
    assert 8 * s / 264 >= 0.85 and s == 29
    assert flashdecoding.num_splits_heuristic(1, 264, 3) == 3           # capped by tiles


def test_pack_gqa_reads_the_cache_once_per_group():
    shape = dict(q_len=1, kv_len=1000, head_dim=64, heads=32, kv_heads=8, dtype="fp16")
    packed = flashsim.plan("flash2", **shape).count()
    per_head = flashsim.plan("flash2", gqa_pack=False, **shape).count()
    assert per_head.kv_bytes == 4 * packed.kv_bytes == 4 * 2 * 8 * 1000 * 64 * 2


def test_mla_defaults_are_deepseek_v3s():
    p = flashsim.plan("mla", q_len=1, kv_len=32768, heads=128, dtype="bf16")
    assert (p.head_dim, p.v_dim, p.kv_heads, p.block_rows) == (576, 512, 1, 64)
    # the latent cache per token: 576 bf16 = 1,152 B against MHA's 2 x 128 x 128 x 2
    assert p.count().kv_bytes == 2 * 32768 * 576 * 2          # two Q tiles of 64 heads
    from flashsim.algorithms import mla
    assert mla.cache_bytes_per_token("mla", 128, 128, 1, 2) == 1152
    assert mla.cache_bytes_per_token("mha", 128, 128, 128, 2) == 65536


def test_paged_table_traffic_and_fragmentation():
    base = dict(q_len=1, kv_len=1000, head_dim=64, heads=8, kv_heads=8, dtype="fp16",
                splits=1, block_cols=64)
    contiguous = flashsim.plan("flashdecoding", **base).count()
    for P in (1, 16, 64, 128):
        rep = flashsim.plan("paged", page_size=P, **base).count()
        table = rep.per_tensor["block_table"]["read_bytes"]
        entries = -(-1000 // P) if 64 % P == 0 else -(-1000 // 64)
        assert table == 8 * 4 * entries
        assert rep.kv_bytes == contiguous.kv_bytes              # pages change no K/V bytes
    f = paged.fragmentation([100, 3000, 17], 16, row_bytes=10)
    assert f["paged"] == (112 + 3008 + 32) * 10 and f["contiguous"] == 3 * 3000 * 10
    assert f["paged_waste"] < f["contiguous_waste"]


def test_cli_json_has_the_decode_fields():
    d = json.loads(answer(["io", "-a", "flashdecoding", "--q-len", "1", "--kv-len", "4096",
                           "-d", "128", "--heads", "32", "--kv-heads", "8", "--dtype",
                           "fp16", "--json"]))
    for key in ("kv_bytes", "predicted_time_s", "dram_bytes", "requested_bytes", "splits",
                "q_len", "kv_len", "kv_heads", "launches"):
        assert key in d, key
    assert d["kv_bytes"] == 2 * 8 * 4096 * 128 * 2
    text = answer(["io", "-a", "mla", "--q-len", "1", "--kv-len", "32768", "--heads", "128",
                   "--dtype", "bf16"])
    assert "predicted time" in text and "KV" in text
    d = json.loads(answer(["io", "-a", "paged", "--q-len", "2", "--kv-lens", "100,3000,5",
                           "-d", "64", "--heads", "8", "--kv-heads", "2", "--page-size",
                           "16", "--verify", "--json", "--gqa-schedule", "per-head"]))
    assert d["max_abs_error"] < 1e-12 and d["kv_lens"] == [100, 3000, 5]


# -- bad input: one clear error, nothing built -------------------------------------------
BAD = [
    (dict(heads=32, kv_heads=5), "multiple of kv_heads"),
    (dict(q_len=9, kv_len=8), "q_len (9) is more than"),
    (dict(algorithm="paged", page_size=0), "page_size"),
    (dict(kv_lens=[10, 20], batch=3), "kv_lens gives 2 sequences but batch is 3"),
    (dict(algorithm="flash2", splits=4), "flashdecoding"),
    (dict(algorithm="paged", page_size=48, block_cols=64), "divide block_cols"),
    (dict(kv_lens=[10, 0]), "kv_lens"),
]


@pytest.mark.parametrize("kw,words", BAD)
def test_bad_configurations_raise_one_error(kw, words):
    args = dict(algorithm="flashdecoding", q_len=1, head_dim=16, heads=8, kv_heads=2)
    args.update(kw)
    if "kv_lens" not in args:
        args.setdefault("kv_len", 64)
    with pytest.raises(flashsim.FlashsimError) as e:
        flashsim.plan(**args)
    assert words in str(e.value) and "\n" not in str(e.value)


def _paged():
    p = flashsim.plan("paged", q_len=1, kv_lens=[20, 9], head_dim=8, heads=2, page_size=4,
                      block_cols=8, splits=1)
    return p, decode.random_inputs(p)


def test_a_block_table_past_the_cache_is_refused():
    p, (Q, K, V, table) = _paged()
    table[1, 0] = K.shape[0]
    with pytest.raises(flashsim.FlashsimError, match="past the cache"):
        p.run(Q, K, V, block_table=table)


def test_a_block_table_repeating_a_page_is_refused():
    p, (Q, K, V, table) = _paged()
    table[1, 1] = table[0, 0]
    with pytest.raises(flashsim.FlashsimError, match="more than once"):
        p.run(Q, K, V, block_table=table)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_in_the_cache_is_refused(bad):
    p = flashsim.plan("flashdecoding", q_len=1, kv_len=32, head_dim=8, heads=2, splits=2,
                      block_cols=8)
    Q, K, V, _ = decode.random_inputs(p)
    V[0, 1, 5, 2] = bad
    with pytest.raises(flashsim.FlashsimError, match="NaN or Inf"):
        p.run(Q, K, V)
    pp, (Q, K, V, table) = _paged()
    K[table[0, 0], 0, 1, 0] = bad
    with pytest.raises(flashsim.FlashsimError, match="NaN or Inf"):
        pp.run(Q, K, V, block_table=table)


MLA_GRID = [((100,), 1, 8), ((37, 200), 3, 16), ((64,), 16, 4)]


@pytest.mark.parametrize("lens,q,heads", MLA_GRID)
def test_mla_count_equals_closed_form(lens, q, heads):
    p = flashsim.plan("mla", q_len=q, kv_lens=list(lens), heads=heads, latent_dim=32,
                      rope_dim=8, splits=3, block_cols=16)
    c = assert_counts_match(p)
    assert c.per_tensor["KV" if len(set(lens)) == 1 else "KV[0]"]["read_bytes"] > 0


@pytest.mark.parametrize("case", GRID[::7])
def test_the_engines_agree_on_decode_nests(case):
    """The fast count against its oracle, and the L2 model's folding against stepping."""
    from flashsim import nest
    from flashsim.hardware import l2
    p = _plan(*case)
    fast, oracle = nest.count(p.nest()), nest.count_leaves(p.nest())
    assert (fast.read, fast.write, fast.flops, fast.transfers) == \
        (oracle.read, oracle.write, oracle.flops, oracle.transfers)
    auto = l2.simulate(p.engine_view()).to_dict()
    steps = l2.simulate(p.engine_view(), method="steps").to_dict()
    assert auto == steps


@st.composite
def decode_argv(draw):
    """A decode command with each option present or not, values mostly in range."""
    args = ["io", "-a", draw(st.sampled_from(["flash2", "flashdecoding", "paged", "mla",
                                              "PAGED"]))]
    small = st.integers(-1, 70).map(str) | st.sampled_from(["auto", "x", "", "1e3", "0"])
    for opt in ("--q-len", "--kv-len", "--kv-heads", "--heads", "--splits", "--page-size",
                "--batch", "-d", "--block-cols"):
        if draw(st.booleans()):
            args += [opt, draw(small)]
    if draw(st.booleans()):
        args += ["--kv-lens", draw(st.sampled_from(["10,20", "5", "0,3", "a,b", "40,,2",
                                                    "64,64,64"]))]
    for flag in ("--no-causal", "--causal", "--verify", "--json"):
        if draw(st.booleans()):
            args.append(flag)
    if draw(st.booleans()):
        args += ["--gqa-schedule", draw(st.sampled_from(["pack", "per-head", "PACK", "?"]))]
    return args


@settings(max_examples=60, deadline=20_000)
@given(args=decode_argv())
def test_decode_commands_answer_or_end_with_one_line(args):
    import contextlib
    import io
    from flashsim.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    assert code in (0, 2) and "Traceback" not in err.getvalue()
    if code == 2:
        assert out.getvalue() == "" and len(err.getvalue().splitlines()) == 1
    elif "--json" in args:
        json.loads(out.getvalue())
