"""Benchmarks re-run on the same GPU agree with the datasets they repeat, point by point,
within run-to-run noise (issue 11: the move to one harness changed no measured number)."""

import pytest

from flashsim.measured import reruns


def test_every_rerun_shares_points_with_its_dataset():
    names = reruns.available()
    assert names, "no re-run committed"
    for name in names:
        c = reruns.compare(name)
        assert c["points"] == min(c["committed_points"], c["rerun_points"]) > 0, name


@pytest.mark.parametrize("name", reruns.available())
def test_a_rerun_moves_time_and_bytes_only_within_noise(name):
    c = reruns.compare(name)
    lo, med, hi = c["time_ratio"]
    assert 0.95 <= med <= 1.05 and 0.85 <= lo and hi <= 1.25, c
    for q in ("dram_read_ratio", "dram_write_ratio"):
        if c.get(q):
            lo, med, hi = c[q]
            assert 0.99 <= med <= 1.01 and 0.95 <= lo and hi <= 1.05, (q, c)
