"""``flashsim predict``: one launch of one registered kernel, from its configuration alone.

Occupancy is computed from the registry's compiled registers and shared memory, and must be
what Nsight Compute reported for every launch of the held-out sweep (today's sources); the
registry's table must be what the datasets say; the stated efficiencies must be the fit on
the calibration points; every registered kernel answers; bad input ends with one line on
stderr and exit status 2 (the contract of tests/test_cli_contract.py)."""

import contextlib
import functools
import io
import json
import math
import subprocess
import sys

import pytest
from _checks import stale_predictions
from hypothesis import HealthCheck, given, settings, strategies as st

from flashsim import predict as P
from flashsim.cli import main
from flashsim.hardware.presets import gpu
from flashsim.measured import validation
from gpu_kernels import registry


def _launch(pt):
    c = pt["plan"]
    return registry.launch(pt["kernel"], batch=pt["batch"], heads=pt["heads"], seq_len=pt["N"],
                           head_dim=pt["d"], dtype=c["dtype"], causal=pt["causal"],
                           block_rows=c["block_rows"], block_cols=c["block_cols"],
                           **validation.launch_options(pt))


@functools.lru_cache(maxsize=None)
def _launch_pairs(dataset):
    out = []
    for pt in validation.load(dataset)["points"]:
        launch = _launch(pt)
        kls = launch.launches()
        assert len(kls) == len(pt["launches"]), pt["kernel"]
        out += [(pt, launch, kl, row) for kl, row in zip(kls, pt["launches"])]
    return out


def test_blocks_per_sm_is_what_nsight_reported_at_every_heldout_launch():
    """Computed, not read: registers, threads and shared memory through the cc 9.0 rules
    give ncu's occupancy (the least of its four limits) at every launch of the sweep."""
    g = gpu("h200")
    n = 0
    for pt, launch, kl, row in _launch_pairs(validation.HELDOUT):
        regs, static = registry.compiled(pt["kernel"], kl.kernel, launch.d, launch.block_rows,
                                         launch.block_cols, launch.causal, kl.threads)
        occ = P.occupancy(kl.threads, regs, static + kl.dynamic_smem, g)
        assert occ["blocks_per_sm"] == validation.blocks_per_sm(row), (pt["kernel"], kl.kernel)
        assert occ["limits"]["registers"] == row["launch__occupancy_limit_registers"]
        assert occ["limits"]["warps"] == row["launch__occupancy_limit_warps"]
        n += 1
    assert n > 100


def test_the_registry_states_the_registers_and_shared_memory_the_gpu_built():
    """Each compiled variant's entry is what ncu reported: the held-out sweep's (today's
    sources) where it ran the variant, else the in-sample dataset's (parts included)."""
    seen = {}
    for dataset in (validation.DATASET, validation.HELDOUT):     # held-out last: it wins
        for pt, launch, kl, row in _launch_pairs(dataset):
            key = (pt["kernel"], kl.kernel, launch.d, launch.block_rows, launch.block_cols,
                   launch.causal, kl.threads)
            seen[key] = (int(row["launch__registers_per_thread"]),
                         int(row["launch__shared_mem_per_block_static"]))
            assert int(row["launch__shared_mem_per_block_dynamic"]) == kl.dynamic_smem
    table = {(k,) + key: v for k, rows in registry.compiled_table().items() for key, v in rows.items()}
    assert {key: table.get(key) for key in seen} == seen
    # every entry of the measured kernels was measured (a later kernel brings its own)
    assert {key for key in table if key[0] in {k[0] for k in seen}} == set(seen)


def test_occupancy_limits_by_hand():
    g = gpu("h200")
    # 255 registers x 256 threads: 8 warps of 8192 registers fill the SM's 64K: one block
    assert P.occupancy(256, 255, 65536, g)["blocks_per_sm"] == 1
    # 176 registers x 64 threads: 5632 per warp, 11 warps -> 8 (units of 4): 4 blocks
    assert P.occupancy(64, 176, 16384, g)["limits"]["registers"] == 4
    # shared memory: 228 KiB over (47288 + 1 KiB reserved) = 4 blocks
    assert P.occupancy(256, 32, 47288, g)["limits"]["shared_mem"] == 4
    assert P.occupancy(256, None, 0, g)["blocks_per_sm"] == 8            # warps: 64 / 8


def test_the_stated_efficiency_is_the_fit_on_a_calibration_point():
    """One reference point on every run (the fastest kernel to simulate); all under slow."""
    pts = [p for p in validation.load()["points"] if p["kernel"] == "cupy_flash2_tc"
           and p["d"] == 64]
    fit = validation.efficiencies(pts)
    assert math.isclose(fit[("cupy_flash2_tc", 64)], P.EFFICIENCY[("cupy_flash2_tc", 64)],
                        rel_tol=1e-12)


def test_every_stated_efficiency_is_the_fit():
    """The fits stored beside the in-sample predictions and the timed points' predictions,
    which the current inputs produced (else this fails at once, as the dataset test does:
    refitting takes minutes)."""
    fit = {}
    for dataset, predictions in ((validation.DATASET, validation.PREDICTIONS),
                                 (validation.TIMED, validation.TIMED_PREDICTIONS)):
        reason = stale_predictions(dataset, predictions)
        if reason:
            pytest.fail(reason)
        with open(predictions) as f:
            fit.update({(k, d): e for k, d, e in json.load(f)["fitted_efficiencies"]})
    assert fit.keys() == P.EFFICIENCY.keys()
    for k, v in fit.items():
        assert math.isclose(v, P.EFFICIENCY[k], rel_tol=1e-12), k


def test_the_stated_scheduler_rates_are_the_fit_on_the_calibration_points():
    """timing.CUDA_CORE_RATES: fitted on the held-out sweep's calibration points only (the
    fit stored beside its predictions, which the current inputs produced)."""
    from flashsim.hardware import timing
    reason = stale_predictions(validation.HELDOUT, validation.HELDOUT_PREDICTIONS)
    if reason:
        pytest.fail(reason)
    with open(validation.HELDOUT_PREDICTIONS) as f:
        fit = json.load(f)["fitted_scheduler_rates"]
    assert len(fit) == len(timing.CUDA_CORE_RATES) == timing.SCHEDULERS
    for a, b in zip(fit, timing.CUDA_CORE_RATES):
        assert math.isclose(a, b, rel_tol=1e-12)
    assert 0 < fit[0] < fit[1] < fit[2] < fit[3] == 1.0
    assert math.isclose(fit[2], (fit[1] + 1) / 2)       # no point of the fit holds three


def test_latency_hiding_deals_warps_to_the_schedulers():
    """An SM's warps go to its four schedulers in turn; each runs at its rate for its
    count, the SM at their mean: idle schedulers below four warps, full from four a
    scheduler (CUDA cores) or one (tensor cores)."""
    from flashsim.hardware import timing
    cuda, tc = timing.Efficiency.for_dtype("fp32"), timing.Efficiency.for_dtype("fp16")
    g = timing.CUDA_CORE_RATES
    h = timing.latency_hiding
    assert [h(w, tc) for w in (1, 2, 3, 4, 8, 64)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert h(2, cuda) == g[0] / 2 and h(4, cuda) == g[0] and h(8, cuda) == g[1]
    assert h(6, cuda) == (2 * g[1] + 2 * g[0]) / 4
    assert h(15, cuda) == (3 * g[3] + g[2]) / 4 and h(16, cuda) == h(48, cuda) == 1.0
    assert all(h(w, cuda) <= h(w + 1, cuda) for w in range(64))
    given = timing.Efficiency.for_dtype("fp32", 1.0, (0.5, 0.75, 0.9, 1.0))
    assert h(4, given) == 0.5 and h(12, given) == 0.9


def test_the_issue_rate_scales_the_efficiency_by_the_kernels_own_layout():
    """numba's FlashAttention picks a thread layout per tile (choose_tiling): a tile whose
    layout issues fewer useful FMAs a cycle gets that share of the kernel's efficiency,
    relative to its reference launch (1 there); kernels with one layout keep it."""
    from gpu_kernels.numba.common import choose_tiling, issue_rate
    from gpu_kernels.numba.flash2 import ARRAYS
    entry = registry.get("numba_flash2")
    ref = entry.launch(batch=1, heads=1, seq_len=P.REFERENCE_N, head_dim=64)
    assert P.issue_rate_factor(entry, ref) == 1.0
    small = entry.launch(batch=1, heads=1, seq_len=1024, head_dim=64, block_rows=16,
                         block_cols=16)
    want = issue_rate(choose_tiling(16, 16, 64, ARRAYS)) / issue_rate(ref.tiling)
    assert P.issue_rate_factor(entry, small) == want < 1
    r = P.predict("numba_flash2", seq_len=1024, head_dim=64, block_rows=16, block_cols=16,
                  gpu="h200")
    assert r["issue_rate_factor"] == want
    assert f"x {want:.3f}, this thread layout's issue rate" in P.format_prediction(r)
    default = P.predict("numba_flash2", seq_len=1024, head_dim=64, gpu="h200")
    assert "issue rate" not in P.format_prediction(default)
    for name in ("cupy_flash2", "numba_standard", "cupy_flash2_tc"):
        e = registry.get(name)
        assert P.issue_rate_factor(e, e.launch(batch=1, heads=1, seq_len=300, head_dim=64)) == 1


def test_the_timed_kernels_efficiency_is_the_fit_on_its_calibration_points():
    """numba_flash1 has harness-timed points only: the same rule (no mask, default tiles,
    the largest N <= 4096) on cupy_h200.json's points picks one per d, N = 2048 without
    the mask; the other points, and measure_h200.json's, are held out. Refitted here."""
    pts = validation.timed_points()
    cal = [p for p in pts if p["split"] == "calibration"]
    assert [(p["source"], p["N"], p["d"], p["causal"]) for p in cal] == \
        [("cupy_h200.json", 2048, 64, False), ("cupy_h200.json", 2048, 128, False)]
    assert len(pts) - len(cal) == 11 and {p["source"] for p in pts} == \
        {"cupy_h200.json", "measure_h200.json"}
    fit = validation.efficiencies([p for p in pts if p["source"] == "cupy_h200.json"])
    assert fit.keys() == {("numba_flash1", 64), ("numba_flash1", 128)}
    for k, v in fit.items():
        assert math.isclose(v, P.EFFICIENCY[k], rel_tol=1e-12), k


@pytest.fixture(scope="module")
def timed_rows():
    reason = stale_predictions(validation.TIMED, validation.TIMED_PREDICTIONS)
    if reason:
        pytest.fail(reason)
    return validation.timed_rows()


def test_timed_points_are_within_1_5x_but_the_known_misses(timed_rows):
    """Every held-out timed point within 1.5x of its measured median, except the listed
    ones (which must still miss); the calibration points are fitted, so within 2 %."""
    misses = {validation.timed_key(r["point"]) for r in timed_rows
              if not 1 / 1.5 <= r["time_ratio"] <= 1.5}
    assert misses == set(validation.TIMED_KNOWN_MISSES)
    for r in timed_rows:
        if r["point"]["split"] == "calibration":
            assert abs(r["time_ratio"] - 1) < 0.02, validation.timed_key(r["point"])


def test_a_timed_prediction_is_recomputed_on_every_run(timed_rows):
    """Whatever the hash says, the cheapest timed point (measure_h200.json's) is predicted
    again with the stored efficiency and must give the stored numbers."""
    r = timed_rows[-1]
    assert r["point"]["source"] == "measure_h200.json"
    again = validation.predicted(r["point"], r["efficiency"])
    assert again.keys() == r["predicted"].keys()
    for key, value in again.items():
        assert math.isclose(r["predicted"][key], value, rel_tol=1e-12), key


@pytest.mark.parametrize("name", sorted(registry.KERNELS))
def test_every_registered_kernel_answers(name):
    k = registry.KERNELS[name]
    r = P.predict(name, batch=1, heads=2, seq_len=200, head_dim=64, dtype=k.dtypes[0],
                  gpu="h200")
    assert r["launches"] and all(x["blocks_per_sm"] >= 1 for x in r["launches"])
    assert r["l2_read_bytes"] >= r["dram_read_bytes"] > 0
    assert r["two_level_bytes"] > 0
    if r["predicted_time_s"] is None:                 # no calibration point: said so
        assert name not in {key[0] for key in P.EFFICIENCY}
    else:
        assert r["predicted_time_s"] > 0


def test_an_unmeasured_head_dim_takes_the_nearest_and_says_so():
    r = P.predict("cupy_flash2", seq_len=300, head_dim=96, gpu="h200")
    assert r["efficiency"] == P.EFFICIENCY[("cupy_flash2", 64)]
    assert "d = 64" in r["efficiency_source"]


def test_predict_imports_no_gpu_library_for_a_cuda_cxx_kernel():
    code = ("import sys; from flashsim.predict import predict; "
            "predict('cupy_flash2_tc', seq_len=300, head_dim=64, dtype='fp16', gpu='h200'); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'numba', "
            "'triton')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def call(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def one_error_line(args):
    code, out, err = call(args)
    assert code == 2 and out == "" and "Traceback" not in err, (args, err)
    assert len(err.splitlines()) == 1 and err.startswith("flashsim: error: "), err
    return err


BASE = ["predict", "--kernel", "cupy_flash2", "-N", "300", "-d", "64"]


def test_cli_prints_the_kernels_tiles_occupancy_bytes_and_time():
    code, out, err = call(BASE + ["--gpu", "h200", "--json"])
    assert code == 0 and err == ""
    r = json.loads(out)
    for key in ("block_rows", "block_cols", "launches", "two_level_bytes", "l2_read_bytes",
                "dram_read_bytes", "dram_write_bytes", "predicted_time_s"):
        assert key in r
    code, out, _ = call(BASE + ["--gpu", "h200"])
    assert code == 0 and "blocks/SM" in out and "predicted_time_s" in out


@pytest.mark.parametrize("args,words", [
    (["predict", "--kernel", "nope", "-N", "300", "-d", "64", "--gpu", "h200"], "no kernel"),
    (BASE, "--gpu"),
    (BASE + ["--gpu", "h200", "--block-rows", "4096", "--block-cols", "4096"], "SRAM"),
    (["predict", "--kernel", "cupy_flash2_tc", "-N", "300", "-d", "64", "--dtype", "fp16",
      "--block-rows", "7", "--block-cols", "3", "--gpu", "h200"], "multiple"),
    (["predict", "--kernel", "cupy_flash2_tc", "-N", "300", "-d", "96", "--gpu", "h200"], ""),
    (BASE + ["--gpu", "h200", "--dtype", "fp16"], "fp32"),
    (BASE + ["--gpu", "nogpu"], "nogpu"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    assert words in one_error_line(args)


@settings(max_examples=40, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(kernel=st.sampled_from(sorted(registry.KERNELS) + ["CUPY_FLASH2", "", "x"]),
       N=st.sampled_from(["1", "33", "200", "0", "-5", "1e3", "x"]),
       d=st.sampled_from(["8", "64", "128", "0", "300"]),
       extra=st.lists(st.sampled_from(["--causal", "--json", "--block-rows", "16",
                                       "--block-cols", "0", "--dtype", "bf16", "--gpu",
                                       "h200", "a100-40gb"]), max_size=4))
def test_every_predict_input_gets_an_answer_or_one_error_line(kernel, N, d, extra):
    args = ["predict", "--kernel", kernel, "-N", N, "-d", d, "--batch", "1"] + extra
    code, out, err = call(args)
    assert code in (0, 2) and "Traceback" not in err, (args, err)
    if code == 2:
        assert out == "" and len(err.splitlines()) == 1, (args, err)
    elif "--json" in args:
        json.loads(out)
