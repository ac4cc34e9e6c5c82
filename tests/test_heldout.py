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
