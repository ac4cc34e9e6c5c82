"""The held-out launches: drawn by a fixed seed, split before any model change, and kept
exactly as drawn (the committed file is the draw, so the split cannot move)."""

import collections

from flashsim import measured
from flashsim.measured import heldout


def test_committed_configs_are_the_draw():
    assert measured.load("heldout_configs.json")["configs"] == heldout.draw()


def test_every_kernel_has_calibration_and_heldout_points_outside_the_107_point_recipe():
    configs = heldout.draw()
    split = collections.Counter((c["kernel"], c["split"]) for c in configs)
    for k in heldout.KERNELS:
        assert split[(k, "calibration")] == heldout.CALIBRATION
        assert split[(k, "heldout")] == heldout.PER_KERNEL - heldout.CALIBRATION
    assert all(c["N"] % 16 for c in configs)                  # no tile divides N
    assert max(c["N"] for c in configs) > 32768
    assert any(c["causal"] for c in configs) and not all(c["causal"] for c in configs)
    # grids smaller than one wave of the H200's 132 SMs, for every kernel
    small = {c["kernel"] for c in configs if c["batch"] * c["heads"] * -(-c["N"] // 128) < 132}
    assert small == set(heldout.KERNELS)


def test_adding_a_kernel_leaves_the_others_draws_alone():
    assert heldout.draw(["cupy_flash2"]) == [c for c in heldout.draw()
                                             if c["kernel"] == "cupy_flash2"]


def test_the_ncu_sweep_profiles_exactly_the_drawn_launches():
    from benchmarks import ncu_sweep
    assert ncu_sweep.sweep(heldout=True) == heldout.draw()
    quick = ncu_sweep.sweep(quick=True, heldout=True)
    assert [c["kernel"] for c in quick] == list(heldout.KERNELS)


# -- the model on the held-out sweep: stored predictions recomputed, targets per split ----

import json  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
from _checks import stale_predictions  # noqa: E402

from flashsim.measured import validation  # noqa: E402


def _stored() -> dict:
    with open(validation.HELDOUT_PREDICTIONS) as f:
        return json.load(f)


def _same(stored_row, row):
    assert stored_row["efficiency"] == row["efficiency"]
    for key, value in row["predicted"].items():
        assert math.isclose(stored_row["predicted"][key], value, rel_tol=1e-12), key


@pytest.fixture(scope="module")
def heldout_rows():
    """The stored rows, which the current inputs produced (else the tests fail at once, as
    the in-sample dataset's do: recomputing every row takes minutes)."""
    reason = stale_predictions(validation.HELDOUT, validation.HELDOUT_PREDICTIONS)
    if reason:
        pytest.fail(reason)
    return validation.stored_rows(validation.HELDOUT, validation.HELDOUT_PREDICTIONS)


def test_stored_heldout_predictions_are_what_flashsim_predict_computes(heldout_rows):
    stored = _stored()
    assert len(stored["rows"]) == len(heldout_rows) == len(heldout.draw())
    assert stored["summary"] == validation.summary(heldout_rows)
    for split, s in stored["summary_by_split"].items():
        assert s == validation.summary([r for r in heldout_rows if r["point"]["split"] == split])


def test_a_sample_of_heldout_predictions_is_recomputed_on_every_run():
    """The smallest point of every kernel and split, whatever the hash says."""
    pts = [p for p in validation.load(validation.HELDOUT)["points"] if p["launches"]]
    stored = _stored()["rows"]
    smallest: dict = {}
    for k, pt in enumerate(pts):
        key = (pt["kernel"], pt["split"])
        size = pt["N"] ** 2 * pt["batch"] * pt["heads"]
        if key not in smallest or size < smallest[key][1]:
            smallest[key] = (k, size)
    assert len(smallest) == 2 * len(heldout.KERNELS)
    for k, _ in smallest.values():
        _same(stored[k], {"efficiency": stored[k]["efficiency"],
                          "predicted": validation.predicted(pts[k], stored[k]["efficiency"])})


def test_every_split_is_summarised_and_the_heldout_points_fitted_nothing(heldout_rows):
    """No constant is fitted on a held-out point: the efficiencies are flashsim.predict's
    stated ones (fitted on the in-sample points), the same for every split."""
    from flashsim import predict
    for r in heldout_rows:
        assert r["efficiency"] == predict.efficiency_for(r["point"]["kernel"], r["point"]["d"])[0]
    table = validation.summary_table(validation.split_summaries(validation.stored_rows(),
                                                                heldout_rows))
    assert [row[0] for row in table] == [t[0] for t in validation.HELDOUT_TARGETS]


# The held-out figures of the six kernels the sweep was drawn for, after issue 13's model
# changes (owned sectors, the dirty line's home half, the chain of steps; then the streaming
# softmax reading only the tiles a causal mask leaves visible, as both kernels do: 43 -> 44
# DRAM; then the SM's schedulers and the kernel's issue rate for its layout in the time
# model, two rates fitted on calibration points: 41 -> 48 time): each change was made
# without fitting anything to these points. Held exact, as validation.KNOWN_MISSES is: a
# change that moves a figure either way must say so here.
ISSUE_13_FLOOR = {"dram_within_10pct": 44, "dram_write_within_15pct": 30,
                  "time_within_1_5x": 48, "l2_within_15pct": 24}
SIX = ("numba_standard", "numba_flash2", "cupy_standard", "cupy_flash1", "cupy_flash2",
       "cupy_flash2_tc")


def test_the_heldout_figures_are_issue_13s(heldout_rows):
    rows = [r for r in heldout_rows
            if r["point"]["split"] == "heldout" and r["point"]["kernel"] in SIX]
    assert len(rows) == 48
    s = validation.summary(rows)
    assert {k: s[k] for k in ISSUE_13_FLOOR} == ISSUE_13_FLOOR
