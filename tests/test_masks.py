"""Masks, sparsity and dropout (issue 16): tiles classified from FlashMask's vectors, skipped
tiles counted as nothing, closed forms held equal, values equal to the float64 reference."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flashsim
from flashsim import masks, nest, reference
from flashsim.algorithms import standard
from flashsim.algorithms._common import block_extent

# Every family, on N = 53 (ragged against every tile below).
N = 53
FAMILIES = ["causal", "sliding:1", "sliding:7", "sliding:53", "document:20,33",
            "document:5,17,31", "document:9,14,30:causal", "prefix:11", "padding:40",
            "blocksparse:0.3:0", "blocksparse:1:4", "blocksparse:0.01:2"]
TILES = [(8, 8), (16, 5), (7, 12), (53, 53), (1, 9)]


def _plan(alg, spec, Br, Bc, n=N, **kw):
    return flashsim.plan(alg, n, 8, block_rows=Br, block_cols=Bc, sram="4MiB", mask=spec,
                         batch=2, **kw)


def _same(a, b):
    assert a.per_tensor == b.per_tensor
    assert (a.flops, a.exp_ops, a.nonmatmul_flops) == (b.flops, b.exp_ops, b.nonmatmul_flops)


# -- the classification ----------------------------------------------------------------
@pytest.mark.parametrize("spec", FAMILIES)
@pytest.mark.parametrize("Br,Bc", TILES)
def test_tile_classes_agree_with_the_dense_mask(spec, Br, Bc):
    m = masks.parse(spec, N)
    dense, classes = m.dense(Br, Bc), m.classify(Br, Bc)
    for i in range(classes.shape[0]):
        for j in range(classes.shape[1]):
            tile = dense[i * Br:(i + 1) * Br, j * Bc:(j + 1) * Bc]
            if classes[i, j] == masks.SKIP:
                assert not tile.any()               # skipped: nothing visible
            elif classes[i, j] == masks.FULL:
                assert tile.all()                   # full: nothing masked
    assert (classes != masks.SKIP).any()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), Br=st.integers(1, 12), Bc=st.integers(1, 12),
       data=st.data())
def test_classes_are_safe_for_any_vectors(n, Br, Bc, data):
    """Random FlashMask vectors: a skipped tile hides every element, a full one none."""
    def ranges():
        a = np.array(data.draw(st.lists(st.integers(0, n), min_size=n, max_size=n)))
        b = np.array(data.draw(st.lists(st.integers(0, n), min_size=n, max_size=n)))
        return np.minimum(a, b), np.maximum(a, b)
    (lts, lte), (uts, ute) = ranges(), ranges()
    m = masks.from_vectors(lts, lte, uts, ute)
    dense, classes = m.dense(), m.classify(Br, Bc)
    r, c = np.arange(n)[:, None], np.arange(n)[None, :]
    hidden = ((r >= lts) & (r < lte)) | ((r >= uts) & (r < ute))
    assert (dense == ~hidden).all()
    for i, j in zip(*np.nonzero(classes == masks.SKIP)):
        assert not dense[i * Br:(i + 1) * Br, j * Bc:(j + 1) * Bc].any()
    for i, j in zip(*np.nonzero(classes == masks.FULL)):
        assert dense[i * Br:(i + 1) * Br, j * Bc:(j + 1) * Bc].all()


def test_conventions_of_each_family():
    n = 10
    d = masks.sliding(n, 3).dense()
    assert d[5].nonzero()[0].tolist() == [3, 4, 5]        # the W keys before r, r included
    d = masks.document(n, [4, 6]).dense()
    assert d[:4, :4].all() and not d[:4, 4:].any() and d[4:, 4:].all()
    assert (masks.document(n, [4, 6], True).dense() == (d & np.tri(n, dtype=bool))).all()
    d = masks.prefix(n, 4).dense()
    assert d[:, :4].all() and (d[:, 4:] == np.tri(n, dtype=bool)[:, 4:]).all()
    assert (masks.causal(n).dense() == np.tri(n, dtype=bool)).all()
    assert not masks.padding(n, 7).dense()[:, 7:].any()
    p = masks.blocksparse(64, 0.25, 3).pattern(8, 8)
    assert p.sum() == 16                                  # exactly s T_r T_c tiles


# -- causal through FlashMask's vectors counts as causal=True --------------------------
@pytest.mark.parametrize("pass_", ["fwd", "bwd", "fwd+bwd"])
@pytest.mark.parametrize("n,Br,Bc", [(64, 16, 16), (97, 12, 20), (33, 32, 8), (17, 5, 7),
                                     (129, 64, 32), (50, 1, 7)])
def test_causal_mask_counts_exactly_as_the_causal_flag(pass_, n, Br, Bc):
    kw = dict(block_rows=Br, block_cols=Bc, sram="4MiB", pass_=pass_, batch=2, heads=3)
    flag = flashsim.plan("flash2", n, 8, causal=True, **kw)
    via = flashsim.plan("flash2", n, 8, mask="causal", **kw)
    _same(via.count(), flag.count())
    _same(via.count(), flag.closed_form())              # the existing formulas: the oracle


@pytest.mark.parametrize("causal", [False, True])
def test_causal_mask_at_the_h200_tiles_and_long_n(causal):
    n = 16384
    flag = flashsim.plan("flash2", n, 128, dtype="fp16", causal=causal, pass_="fwd+bwd")
    via = flashsim.plan("flash2", n, 128, dtype="fp16", pass_="fwd+bwd",
                        mask="causal" if causal else "padding:16384")
    _same(via.count(), flag.closed_form())


def test_standard_with_a_mask_adds_the_dense_mask_and_nothing_else():
    """A dense causal mask reads the mask and, where the softmax streams without a mask
    pass, every tile of S: the causal flag's fused softmax skips the tiles above the
    diagonal (2 V b bytes of S in place of 2 N^2 b), and nothing else differs."""
    for passes in [(), ("mask",)]:
        for sram in ["1MiB", "6KiB"]:            # whole rows, then rows that do not fit
            kw = dict(block_rows=32, block_cols=32, sram=sram, extra_passes=passes)
            plain = flashsim.plan("standard", 2000, 8, causal=True, **kw)
            masked = flashsim.plan("standard", 2000, 8, mask="causal", **kw)
            assert (masked.softmax_rows == 0) == (sram == "6KiB")
            skips = sram == "6KiB" and not passes
            V = standard.streamed(plain)[0]
            assert (V < 2000**2) == (not passes)      # the mask pass: the softmax reads all
            plain, masked = plain.count().per_tensor, masked.count().per_tensor
            reads = 2 if skips else 1
            assert masked.pop("mask") == {"read_bytes": reads * 2000**2, "write_bytes": 0}
            if skips:
                assert masked["S"]["read_bytes"] == 2 * 2000**2 * 4
                assert plain["S"]["read_bytes"] == 2 * V * 4
                plain["S"] = masked["S"]
            assert masked == plain


# -- counted == closed form, engines agree ---------------------------------------------
@pytest.mark.parametrize("alg", ["flash2", "standard"])
@pytest.mark.parametrize("spec", FAMILIES)
@pytest.mark.parametrize("pass_", ["fwd", "bwd", "fwd+bwd"])
def test_counted_equals_closed_form_and_the_oracle_engine(alg, spec, pass_):
    for Br, Bc in TILES[:3]:
        for dropout in (0.0, 0.25):
            p = _plan(alg, spec, Br, Bc, pass_=pass_, dropout=dropout)
            counted = p.count()
            _same(counted, p.closed_form())
            c, leaves = nest.count(p.nest()), nest.count_leaves(p.nest())
            assert (c.read, c.write, c.flops, c.sram_peak) == (
                leaves.read, leaves.write, leaves.flops, leaves.sram_peak)


def _sliding_kv_rows(n, W, Br, Bc):
    """Sliding window, written from the definition: Q block i of rows [r0, r1) sees keys
    [max(0, r0 - W + 1), r1 - 1], so K/V blocks floor(that / B_c) .. floor((r1 - 1) / B_c)."""
    total = 0
    for i in range(-(-n // Br)):
        r0, r1 = i * Br, min((i + 1) * Br, n)
        lo, hi = max(0, r0 - W + 1) // Bc, (r1 - 1) // Bc
        total += min((hi + 1) * Bc, n) - lo * Bc
    return total


@pytest.mark.parametrize("n,W,Br,Bc", [(53, 7, 8, 8), (100, 1, 16, 5), (1000, 128, 64, 64),
                                       (1000, 999, 32, 48), (777, 50, 13, 17)])
def test_sliding_window_closed_form(n, W, Br, Bc):
    p = flashsim.plan("flash2", n, 16, block_rows=Br, block_cols=Bc, sram="4MiB",
                      mask=f"sliding:{W}")
    assert p.count().per_tensor["K"]["read_bytes"] == _sliding_kv_rows(n, W, Br, Bc) * 16 * 4


@pytest.mark.parametrize("density", [0.05, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("n,B", [(1024, 64), (1000, 64)])
def test_block_sparse_io_is_proposition_4(density, n, B):
    """Proposition 4: the IO of block-sparse FlashAttention is Theta(N d + N^2 d^2 s / M):
    here exactly Q and O once, K and V once per non-zero tile of the pattern (s T_r T_c
    tiles), so with B_c dividing N K reads s T_r N d b."""
    d, b = 16, 4
    p = flashsim.plan("flash2", n, d, block_rows=B, block_cols=B, sram="4MiB",
                      mask=f"blocksparse:{density}:7")
    t = p.count().per_tensor
    pattern = p.mask.pattern(B, B)
    widths = block_extent(np.arange(pattern.shape[1]), B, n)
    assert t["K"]["read_bytes"] == t["V"]["read_bytes"] == int((pattern @ widths).sum()) * d * b
    assert t["Q"]["read_bytes"] == t["O"]["write_bytes"] == n * d * b
    Tr = -(-n // B)
    s = pattern.mean()
    assert s == pytest.approx(density, abs=0.5 / pattern.size)
    if n % B == 0:
        assert t["K"]["read_bytes"] == round(s * Tr * n) * d * b
    dense = flashsim.plan("flash2", n, d, block_rows=B, block_cols=B, sram="4MiB").count()
    assert p.count().flops == pytest.approx(s * dense.flops, rel=0.5 / pattern.size + 1e-12) \
        or n % B


def test_skipped_tiles_do_no_flops():
    p = _plan("flash2", "document:5,17,31", 8, 8)
    keep = p.mask.classify(8, 8) != masks.SKIP
    r, c = block_extent(np.arange(keep.shape[0]), 8, N), block_extent(np.arange(keep.shape[1]), 8, N)
    area = int((np.outer(r, c) * keep).sum())
    assert p.count().flops == 2 * 4 * 8 * area           # batch 2, 4 d per element


def test_sliding_window_1024_at_16k_moves_the_window_fraction_of_kv():
    """Issue 16's done-when: W = 1024 at N = 16384 moves within 5% of (W + block) / N of the
    unmasked K/V reads, on the H200 preset with FlashAttention-2's tiles (128 x 128 at d = 64,
    128 x 64 at d = 128), which divide W. (The preset's default 144 x 144 tiles at d = 64 do
    not: a window then straddles one more K/V block about as often as not, 7% over; see
    docs/masks.md.)"""
    n, W = 16384, 1024
    for d, Br, Bc in ((64, 128, 128), (128, 128, 64)):
        kw = dict(dtype="fp16", block_rows=Br, block_cols=Bc)
        full = flashsim.plan("flash2", n, d, **kw)
        win = flashsim.plan("flash2", n, d, mask=f"sliding:{W}", **kw)
        kv = lambda p: sum(p.count().per_tensor[t]["read_bytes"] for t in ("K", "V"))
        ratio = kv(win) / kv(full)
        expect = (W + win.block_cols) / n
        assert abs(ratio / expect - 1) < 0.05, (d, ratio, expect)


# -- values ----------------------------------------------------------------------------
@pytest.mark.parametrize("alg", ["flash2", "standard"])
@pytest.mark.parametrize("spec", FAMILIES)
def test_values_equal_the_reference_forward_and_backward(alg, spec):
    rng = np.random.default_rng(3)
    Q, K, V, dO = (3 * rng.standard_normal((2, N, 8)) for _ in range(4))
    for (Br, Bc), dropout in zip(TILES[:3], (0.0, 0.2, 0.0)):
        p = _plan(alg, spec, Br, Bc, dropout=dropout, dropout_seed=11)
        ref = masks.reference_args(p)
        O, rep = p.run(Q, K, V)
        assert np.abs(O - reference.attention(Q, K, V, **ref)).max() < 1e-12
        assert rep.per_tensor == p.count().per_tensor
        b = _plan(alg, spec, Br, Bc, dropout=dropout, dropout_seed=11, pass_="fwd+bwd")
        grads, _ = b.run(Q, K, V, dO=dO)
        for got, want in zip(grads, reference.attention_backward(Q, K, V, dO, **ref)):
            assert np.abs(got - want).max() < 1e-11


def test_a_row_that_sees_nothing_gives_zero():
    m = masks.from_vectors(np.zeros(6, int), np.full(6, 6), np.zeros(6, int),
                           np.zeros(6, int))          # every key hidden from every query
    p = flashsim.plan("flash2", 6, 4, sram="1MiB", block_rows=2, block_cols=2, mask=m)
    assert p.count().per_tensor["K"]["read_bytes"] == 0
    O, _ = p.run(*(np.ones((6, 4)) for _ in range(3)))
    assert (O == 0).all()


def test_dropout_is_reproduced_from_the_seed_and_differs_across_seeds():
    a = masks.dropout_scale(1, 0.3, (0, 64), (0, 64))
    assert (a == masks.dropout_scale(1, 0.3, (0, 64), (0, 64))).all()
    assert (a[10:20, 5:9] == masks.dropout_scale(1, 0.3, (10, 20), (5, 9))).all()  # by offset
    assert (a != masks.dropout_scale(2, 0.3, (0, 64), (0, 64))).any()
    assert abs((a == 0).mean() - 0.3) < 0.03 and set(np.unique(a)) == {0.0, 1 / 0.7}


# -- what dropout and a mask cost to carry ---------------------------------------------
def test_dropout_bytes_standard_against_fused():
    n, d, b = 512, 16, 2
    kw = dict(block_rows=32, block_cols=32, sram="1MiB", dtype="fp16", pass_="fwd+bwd")
    base = flashsim.plan("standard", n, d, **kw).count().per_tensor
    drop = flashsim.plan("standard", n, d, dropout=0.1, **kw).count().per_tensor
    assert drop["Z"] == {"read_bytes": n * n, "write_bytes": n * n}     # stored, read back
    assert drop["P_drop"] == {"read_bytes": 2 * n * n * b, "write_bytes": n * n * b}
    assert drop["dP_drop"] == {"read_bytes": n * n * b, "write_bytes": n * n * b}
    assert drop["P"]["read_bytes"] == base["P"]["read_bytes"] - n * n * b
    fa = flashsim.plan("flash2", n, d, **kw)
    assert fa.count().per_tensor == flashsim.plan("flash2", n, d, dropout=0.1,
                                                  **kw).count().per_tensor


def test_mask_carry_cost_dense_against_vectors():
    for n in (1024, 16384):
        assert masks.dense_mask_bytes(n) == n * n
        assert masks.flashmask_bytes(n) == 16 * n
        m = masks.sliding(n, 128)
        assert sum(v.size for v in (m.lts, m.lte, m.uts, m.ute)) * 4 == masks.flashmask_bytes(n)
    p = flashsim.plan("standard", 1024, 16, sram="1MiB", mask="sliding:128")
    assert p.count().per_tensor["mask"]["read_bytes"] == masks.dense_mask_bytes(1024)


def test_padding_waste_against_varlen_packing():
    w = masks.padding_waste([100, 300, 200, 400])
    assert w["padded_tokens"] == 1600 and w["packed_tokens"] == 1000
    assert w["padded_scores"] == 4 * 400**2
    assert w["packed_scores"] == 100**2 + 300**2 + 200**2 + 400**2
    assert w["token_waste"] == pytest.approx(0.375)
    assert w["cu_seqlens"].tolist() == [0, 100, 400, 600, 1000]
    assert masks.padding_waste([64, 64])["score_waste"] == 0
    # packed into one sequence, a document mask does the varlen work tile by tile
    p = flashsim.plan("flash2", 1000, 16, block_rows=100, block_cols=100, sram="4MiB",
                      mask="document:100,300,200,400")
    assert p.count().flops == 4 * 16 * w["packed_scores"]


# -- the L2 model and time read the masked nest too -------------------------------------
def test_l2_model_runs_on_a_masked_plan():
    from flashsim.hardware import l2
    p = flashsim.plan("flash2", 4096, 64, dtype="fp16", mask="sliding:512")
    run = l2.simulate(p)
    dense = l2.simulate(flashsim.plan("flash2", 4096, 64, dtype="fp16"))
    l2_reads = sum(t.l2_read_bytes for t in run.launches)
    assert l2_reads == p.count().hbm_read_bytes          # what SRAM requests reaches L2
    assert l2_reads < sum(t.l2_read_bytes for t in dense.launches)
    assert 0 < run.dram_read_bytes <= dense.dram_read_bytes
