"""Online softmax: the trace's last step is softmax (and softmax . V) to float64 precision,
the merge is associative, and the 3 / 4 / 3 accesses per element come out of the counter."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flashsim import FlashsimError
from flashsim.algorithms import online_softmax as osm


def reference_softmax(x):
    """float64, max subtracted: written here, independently of the module under test."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def moving_max(n, seed=0, scale=1.0, offset=0.0):
    """Logits whose running maximum rises again and again: a trend plus noise."""
    rng = np.random.default_rng(seed)
    return offset + scale * (np.linspace(0, 6, n) + rng.standard_normal(n))


def max_changes_after_first_block(steps):
    return sum(s.max_changed for s in steps[1:])


# (N, block): ragged (N % block != 0), exact, block 1 (the element-by-element recurrence),
# one block larger than N.
SHAPES = [(37, 8), (100, 7), (64, 16), (33, 1), (5, 9), (1000, 64), (129, 32)]


@pytest.mark.parametrize("n,block", SHAPES)
def test_last_step_is_softmax_when_the_max_moves_between_blocks(n, block):
    x = moving_max(n, seed=n)
    v = np.random.default_rng(1).standard_normal((n, 3))
    steps = osm.trace(x, block, v)
    if len(steps) > 2:
        assert max_changes_after_first_block(steps) >= 2      # the rescaling path is taken
    y_ref = reference_softmax(x)
    assert np.max(np.abs(steps[-1].y - y_ref)) <= 1e-12
    assert np.max(np.abs(steps[-1].output - y_ref @ v)) <= 1e-12


@pytest.mark.parametrize("n,block", SHAPES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_last_step_is_softmax_with_logits_up_to_1e4(n, block, sign):
    # Magnitudes near 1e4, the maximum still rising block by block by a few units.
    x = sign * 1e4 + moving_max(n, seed=n + 7, scale=2.0)
    assert np.abs(x).max() > 9e3
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        naive_ok = np.isfinite(np.exp(x)).all() and np.exp(x).sum() > 0
    assert not naive_ok                                       # e^x overflows or underflows
    v = np.random.default_rng(2).standard_normal(n)
    steps = osm.trace(x, block, v)
    y_ref = reference_softmax(x)
    assert np.max(np.abs(steps[-1].y - y_ref)) <= 1e-12
    assert abs(steps[-1].output - y_ref @ v) <= 1e-12


@pytest.mark.parametrize("n,block", [(37, 8), (100, 7), (10, 3), (1001, 64)])
def test_lengths_that_do_not_divide_the_block(n, block):
    assert n % block
    x = moving_max(n, seed=3, scale=3.0)
    x[-1] = x.max() + 5.0                  # the maximum sits in the short last block
    v = np.random.default_rng(4).standard_normal((n, 4))
    steps = osm.trace(x, block, v)
    assert len(steps) == -(-n // block)
    assert steps[-1].hi - steps[-1].lo == n % block
    assert steps[-1].max_changed
    y_ref = reference_softmax(x)
    assert np.max(np.abs(steps[-1].y - y_ref)) <= 1e-12
    assert np.max(np.abs(steps[-1].output - y_ref @ v)) <= 1e-12


def test_every_step_follows_the_recurrence_and_is_the_prefix_softmax():
    x = moving_max(50, seed=11, scale=4.0)
    v = np.random.default_rng(5).standard_normal((50, 2))
    m_old, l_old = -np.inf, 0.0
    for s in osm.trace(x, 6, v):
        xb = x[s.lo:s.hi]
        assert s.m_old == m_old and s.l_old == l_old
        assert s.m_new == max(m_old, xb.max())
        assert s.alpha == pytest.approx(np.exp(m_old - s.m_new), rel=1e-15, abs=0)
        assert s.l == pytest.approx(s.alpha * l_old + np.exp(xb - s.m_new).sum(), rel=1e-14)
        prefix = reference_softmax(x[:s.hi])
        assert np.max(np.abs(s.y - prefix)) <= 1e-12
        assert np.max(np.abs(s.output - prefix @ v[:s.hi])) <= 1e-12
        m_old, l_old = s.m_new, s.l


def test_first_step_has_nothing_to_rescale():
    s = osm.trace([3.0, 1.0, 2.0], 2)[0]
    assert s.m_old == -np.inf and s.alpha == 0.0 and s.l_old == 0.0 and s.o is None


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 200), block=st.integers(1, 40), scale=st.sampled_from([1.0, 30.0, 1e3]),
       offset=st.sampled_from([0.0, 1e4, -1e4]), seed=st.integers(0, 10**6))
def test_trace_matches_softmax_for_any_shape(n, block, scale, offset, seed):
    rng = np.random.default_rng(seed)
    x = offset + scale * rng.standard_normal(n)
    v = rng.standard_normal((n, 2))
    last = osm.trace(x, block, v)[-1]
    y_ref = reference_softmax(x)
    assert np.max(np.abs(last.y - y_ref)) <= 1e-12
    assert np.max(np.abs(last.output - y_ref @ v)) <= 1e-12


def test_masked_entries_and_fully_masked_blocks():
    x = np.array([-np.inf, -np.inf, -np.inf, 1.0, -np.inf, 3.0, 2.0])
    steps = osm.trace(x, 3, np.arange(7.0))
    assert steps[0].m_new == -np.inf and steps[0].l == 0.0    # nothing seen yet
    finite = np.isfinite(x)
    y_ref = np.zeros(7)
    y_ref[finite] = reference_softmax(x[finite])
    assert np.max(np.abs(steps[-1].y - y_ref)) <= 1e-12
    assert np.max(np.abs(osm.online_softmax(x) - y_ref)) <= 1e-12
    assert np.max(np.abs(osm.safe_softmax(x) - y_ref)) <= 1e-12


@pytest.mark.parametrize("bad", [[-np.inf, -np.inf], [1.0, np.nan], [np.inf, 0.0], []])
def test_bad_logits_are_refused(bad):
    with pytest.raises(FlashsimError):
        osm.trace(np.array(bad, dtype=float), 2)


def test_bad_block_and_v_are_refused():
    with pytest.raises(FlashsimError):
        osm.trace([1.0, 2.0], 0)
    with pytest.raises(FlashsimError):
        osm.trace([1.0, 2.0], 1, v=np.ones((3, 2)))


# ---------------------------------------------------------------- whole-row versions

def test_online_normalizer_is_max_and_shifted_sum():
    x = moving_max(300, seed=8, scale=50.0)
    m, l = osm.online_normalizer(x)
    assert m == x.max()
    assert l == pytest.approx(np.exp(x - x.max()).sum(), rel=1e-13)


def test_naive_overflows_where_safe_and_online_do_not():
    x = np.array([1000.0, 1001.0, 999.0])
    assert np.isnan(osm.naive_softmax(x)).all()
    assert np.max(np.abs(osm.online_softmax(x) - reference_softmax(x))) <= 1e-15
    assert np.max(np.abs(osm.safe_softmax(x) - reference_softmax(x))) <= 1e-15
    small = moving_max(20, seed=9)
    assert np.max(np.abs(osm.naive_softmax(small) - reference_softmax(small))) <= 1e-15


def test_batched_rows():
    X = np.stack([moving_max(40, seed=s, scale=100.0) for s in range(4)])
    ref = np.stack([reference_softmax(r) for r in X])
    assert np.max(np.abs(osm.online_softmax(X) - ref)) <= 1e-12


# ---------------------------------------------------------------------------- merge

def _split_states(x, v, cuts):
    edges = [0, *cuts, len(x)]
    return [osm.state_of(x[a:b], v[a:b]) for a, b in zip(edges, edges[1:])]


def test_merge_of_any_split_equals_the_whole():
    x = moving_max(90, seed=12, scale=200.0)
    v = np.random.default_rng(6).standard_normal((90, 3))
    whole = osm.state_of(x, v)
    for cuts in ([45], [1], [89], [10, 50, 70], [30, 31, 32, 60]):
        parts = _split_states(x, v, cuts)
        left = parts[0]
        for p in parts[1:]:
            left = osm.merge(left, p)
        right = parts[-1]
        for p in reversed(parts[:-1]):
            right = osm.merge(p, right)
        for s in (left, right):
            assert s.m == whole.m
            assert s.l == pytest.approx(whole.l, rel=1e-13)
            assert np.max(np.abs(s.output - reference_softmax(x) @ v)) <= 1e-12


def test_merge_is_associative_commutative_with_an_identity():
    rng = np.random.default_rng(7)
    a, b, c = (osm.state_of(rng.standard_normal(5) * 10 + k, rng.standard_normal(5))
               for k in (0.0, 40.0, 20.0))
    ab_c, a_bc = osm.merge(osm.merge(a, b), c), osm.merge(a, osm.merge(b, c))
    assert ab_c.m == a_bc.m
    assert ab_c.l == pytest.approx(a_bc.l, rel=1e-14)
    assert ab_c.o == pytest.approx(a_bc.o, rel=1e-13)
    ba = osm.merge(b, a)
    assert ba.l == pytest.approx(osm.merge(a, b).l, rel=1e-15)
    empty = osm.State(-np.inf, 0.0, 0.0)
    assert osm.merge(empty, a) == osm.State(a.m, a.l, a.o)


def test_trace_state_equals_merged_blocks():
    """The trace is a left fold of merge over the blocks."""
    x = moving_max(45, seed=13, scale=5.0)
    v = np.random.default_rng(8).standard_normal(45)
    state = osm.State(-np.inf, 0.0, 0.0)
    for s in osm.trace(x, 10, v):
        state = osm.merge(state, osm.state_of(x[s.lo:s.hi], v[s.lo:s.hi]))
        assert state.m == s.m_new
        assert state.l == pytest.approx(s.l, rel=1e-14)
        assert state.o == pytest.approx(s.o, rel=1e-13, abs=1e-300)


# ----------------------------------------------------- memory accesses, from the counter

@pytest.mark.parametrize("n,block", [(4096, 64), (1000, 7), (33, 64), (1, 1)])
def test_accesses_per_element_are_3_4_3(n, block):
    got = {k: osm.accesses_per_element(k, n, block=block) for k in osm.KINDS}
    assert got == {"naive": 3.0, "safe": 4.0, "online": 3.0}


@pytest.mark.parametrize("kind", osm.KINDS)
def test_nests_compute_softmax_and_count_what_they_move(kind):
    rng = np.random.default_rng(10)
    X = rng.standard_normal((3, 70)) * 5
    y, moved = osm.run_nest(kind, X, block=16)
    ref = np.stack([reference_softmax(r) for r in X])
    assert np.max(np.abs(y - ref)) <= 1e-12
    from flashsim.nest import count
    counted = count(osm.nest(kind, 70, rows=3, block=16))
    assert moved == {"read_bytes": counted.read["x"], "write_bytes": counted.write["y"]}
    passes = {"naive": 2, "safe": 3, "online": 2}[kind]
    assert moved == {"read_bytes": passes * 3 * 70 * 4, "write_bytes": 3 * 70 * 4}


def test_nest_naive_overflows_online_does_not():
    x = 1e4 + moving_max(50, seed=14)
    y_naive, _ = osm.run_nest("naive", x, block=8)
    y_online, _ = osm.run_nest("online", x, block=8)
    assert not np.isfinite(y_naive).all()
    assert np.max(np.abs(y_online - reference_softmax(x))) <= 1e-12


def test_unknown_kind_is_refused():
    with pytest.raises(FlashsimError):
        osm.nest("fast", 10)
