"""The tile search finds a tile that fits whenever one exists (brute force as the oracle),
for every algorithm, pass and dtype, keeps each algorithm's own rule where that fits, and
says why when nothing fits."""

import dataclasses
import itertools

import pytest
from hypothesis import given, settings, strategies as st

import flashsim
from flashsim.algorithms import standard
from flashsim.plan import search_tiles, working_set_bytes

ALGS = ["standard", "flash1", "flash2"]
PASSES = ["fwd", "bwd", "fwd+bwd"]


def fits_some(alg, N, d, dtype, sram, pass_, rows=None, cols=None) -> bool:
    """Brute force: does any B_r x B_c (1..N each, or the given side) fit in M?"""
    M = flashsim.parse_size(sram)
    base = dataclasses.replace(flashsim.plan(alg, N, d, dtype=dtype, sram="1TiB", pass_=pass_),
                               sram_bytes=M)
    if alg == "standard":     # the softmax kernel's whole rows follow M
        base = dataclasses.replace(base, softmax_rows=standard.softmax_rows(N, M, base.elem_bytes))
    for Br, Bc in itertools.product([rows] if rows else range(1, N + 1),
                                    [cols] if cols else range(1, N + 1)):
        p = dataclasses.replace(base, block_rows=Br, block_cols=Bc)
        if working_set_bytes(p) <= M:
            return True
    return False


@settings(max_examples=80, deadline=None)
@given(alg=st.sampled_from(ALGS), pass_=st.sampled_from(PASSES),
       dtype=st.sampled_from(["fp32", "fp16", "bf16"]), N=st.integers(1, 16),
       d=st.integers(1, 200), sram=st.integers(1, 40_000),
       side=st.sampled_from([None, "rows", "cols"]), given_=st.integers(1, 20))
def test_a_tile_is_found_whenever_one_fits(alg, pass_, dtype, N, d, sram, side, given_):
    kw = {} if side is None else {f"block_{side}": given_}
    try:
        p = flashsim.plan(alg, N, d, dtype=dtype, sram=sram, pass_=pass_, **kw)
    except flashsim.SramOverflowError:
        assert not fits_some(alg, N, d, dtype, sram, pass_,
                             rows=min(given_, N) if side == "rows" else None,
                             cols=min(given_, N) if side == "cols" else None)
        return
    assert working_set_bytes(p) <= sram
    if side is not None:
        assert getattr(p, f"block_{side}") == min(given_, N)


def test_flash1s_rule_no_longer_gives_up_at_small_sram():
    """The issue's case: the paper's rule stops at B_c = 0 while 1 x 1 needs 2068 B."""
    p = flashsim.plan("flash1", 4096, 128, sram="3KiB")
    assert working_set_bytes(p) <= 3 * 1024 and p.block_rows >= 1 and p.block_cols >= 1
    with pytest.raises(flashsim.SramOverflowError, match="even 1 x 1 blocks need 2068 B"):
        flashsim.plan("flash1", 4096, 128, sram=2067)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("sram", ["48KiB", "100KiB", "227KiB"])
def test_each_algorithms_own_rule_is_kept_where_it_fits(alg, pass_, sram):
    from flashsim.algorithms import ALGORITHMS, BACKWARD
    module = ALGORITHMS[alg] if pass_ == "fwd" else BACKWARD[alg]
    p = flashsim.plan(alg, 4096, 64, sram=sram, pass_=pass_)
    assert (p.block_rows, p.block_cols) == module.default_blocks(4096, 64, p.sram_bytes, 4)


def test_search_is_generic_over_a_predicate():
    """Any monotone fits(B_r, B_c), e.g. a register limit on top of shared memory."""
    fits = lambda r, c: r * c <= 300 and r <= 12          # noqa: E731
    assert search_tiles(fits, 100, (64, 64)) == (12, 12)
    assert search_tiles(fits, 100, (64, 64), block_rows=5) == (5, 60)
    assert search_tiles(fits, 100, (10, 20)) == (10, 20)
