"""The schedule model: phases from the loop nest's counts, timelines that respect their
dependencies and resources, the closed forms of the simple cases, and the comparisons with
the FlashAttention-3 paper's ablation and with our kernel's versions."""

import json
from importlib import resources

import pytest

from flashsim.cli import main
from flashsim.errors import FlashsimError
from flashsim.hardware import schedules as sc
from flashsim.hardware.presets import gpu


def test_phases_use_the_nest_counts_and_the_unit_rates():
    ph = sc.phases(128, 128, 128, "h100")
    assert ph.flops == 4 * 128 * 128 * 128
    assert ph.exps == 128 * 128 + 128                        # P_ij and one alpha per row
    assert ph.other_ops == 4 * 128 * 128 + (3 + 128) * 128 - 128
    assert ph.gemm0 == ph.gemm1 == 2 * 128 ** 3 / 4096
    assert ph.softmax == (128 * 128 + 128) / 16              # SFU-bound at this d
    assert ph.load_bytes == 2 * 128 * 128 * 2
    # the FlashAttention-3 paper's "exponential can take 50% of the cycle" at d = 128
    assert ph.softmax / (ph.gemm0 + ph.gemm1) == pytest.approx(0.5, abs=0.01)
    assert sc.phases(128, 128, 128, "h100", "fp8").gemm0 == ph.gemm0 / 2


def _free_memory(d=128, block_cols=128, gpu_name="h100"):
    return sc.phases(d, 128, block_cols, gpu_name, l2_bandwidth=1e30)   # loads take no time


@pytest.mark.parametrize("d", [64, 128, 256])
def test_sequential_is_the_sum_of_the_phases(d):
    ph, T = _free_memory(d), 9
    tl = sc.timeline(ph, T, "sequential", "producer")
    assert tl.cycles == pytest.approx(T * (ph.gemm0 + ph.softmax + ph.gemm1) + ph.finish)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_overlapped_schedules_approach_their_bounds(d):
    ph, T = _free_memory(d), 40
    G, S = ph.gemm0 + ph.gemm1, ph.softmax
    pp = sc.timeline(ph, T, "pingpong", "producer").cycles
    assert T * max(G, S) <= pp <= T * max(G, S) + G + S + ph.finish
    intra = sc.timeline(ph, T, "intra", "producer").cycles
    per = ph.gemm0 + max(ph.gemm1, S)
    assert T * per <= intra + 1e-9 and intra <= T * per + G + S + ph.finish
    seq = sc.timeline(ph, T, "sequential", "producer").cycles
    assert pp < seq and intra < seq


def test_blocking_loads_add_to_every_block():
    ph, T = sc.phases(64, 128, 64, "h200"), 8
    blocking = sc.timeline(ph, T, "sequential", "blocking").cycles
    free = sc.timeline(_free_memory(64, 64, "h200"), T, "sequential", "producer").cycles
    q = ph.load * 128 / (2 * 64)
    assert blocking == pytest.approx(free + T * ph.load + 2 * q)
    with pytest.raises(FlashsimError):
        sc.timeline(ph, T, "pingpong", "blocking")


@pytest.mark.parametrize("schedule", sc.SCHEDULES)
@pytest.mark.parametrize("loads", ["prefetch", "double", "producer"])
def test_timelines_respect_dependencies_and_resources(schedule, loads):
    tl = sc.timeline(sc.phases(128, 128, 128, "h100"), 5, schedule, loads, stages=2)
    end = {t.name: t.end for t in tl.tasks}
    for t in tl.tasks:
        assert all(t.start >= end[d] - 1e-9 for d in t.deps)
    for r in sc.RESOURCES:
        spans = sorted((t.start, t.end) for t in tl.tasks if t.resource == r)
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))
    assert all(0 < u <= 1 for u in tl.utilisation().values())
    assert {t.name for t in tl.tasks} >= {f"g1.0.{j}" for j in range(5)}


@pytest.mark.parametrize("schedule", sc.SCHEDULES)
@pytest.mark.parametrize("loads", sc.LOADS)
def test_cycles_by_blocks_equals_one_timeline_per_length(schedule, loads):
    if loads == "blocking" and schedule != "sequential":
        return
    for d, Bc in ((64, 64), (128, 128)):
        ph = sc.phases(d, 128, Bc, "h200")
        got = sc.cycles_by_blocks(ph, 10, schedule, loads, stages=2)
        want = [sc.timeline(ph, n, schedule, loads, stages=2).cycles for n in range(1, 11)]
        assert got == pytest.approx(want)


def test_stages_must_fit_in_shared_memory():
    assert sc.max_stages(128, 128, 128, gpu("h100").sram_per_block) == 3
    sc.launch_seconds(1024, 128, schedule="pingpong", loads="producer", stages=3, gpu="h100")
    with pytest.raises(FlashsimError, match="do not fit"):
        sc.launch_seconds(1024, 128, schedule="pingpong", loads="producer", stages=4,
                          gpu="h100")


def test_fa3_ablation_rows():
    """The model against the paper's Table 2 (H100, 4 x 16 heads, N = 8448, d = 128). The
    model puts FlashAttention-3 first, as measured, and the configuration without any
    GEMM-softmax overlap slower; it does not see why the configuration without warp
    specialisation is the slowest of the three (notebook 09 says why)."""
    rows = {r["configuration"]: r for r in sc.fa3_ablation()}
    fa3 = rows["FlashAttention-3"]
    assert all(fa3["predicted_ms"] <= r["predicted_ms"] for r in rows.values())
    assert all(fa3["measured_ms"] <= r["measured_ms"] for r in rows.values())
    seq = rows["No GEMM-Softmax Pipelining, Warp-Specialization"]
    assert seq["predicted_ms"] > 1.3 * fa3["predicted_ms"]
    assert seq["measured_ms"] > 1.1 * fa3["measured_ms"]
    assert fa3["predicted_tflops"] == pytest.approx(4 * 8448 ** 2 * 128 * 64 /
                                                    fa3["predicted_ms"] / 1e9)


def test_kernel_versions_v1_is_slower_than_the_overlapped_loads():
    """v1 (blocking loads) against v2, v3 (one buffer each, cp.async) and v4 (two): slower
    at all 8 measured points, as predicted. v5 differs from v3 in registers, not in its
    schedule; at d = 128 it spills (64 bytes of local memory in the data) and is measured
    slower than v1 at one point: what this model cannot see."""
    data = json.loads(resources.files("flashsim.measured").joinpath(
        "data/cupy_h200.json").read_text())
    rows = sc.kernel_versions(data)
    points = {(r["d"], r["N"], r["causal"]) for r in rows}
    assert len(points) == 8 and len(rows) == 40
    for p in points:
        at = {r["version"]: r for r in rows if (r["d"], r["N"], r["causal"]) == p}
        for key in ("predicted_ms", "measured_ms"):
            assert at[1][key] > max(at[v][key] for v in (2, 3, 4))
        assert at[1]["predicted_ms"] > at[5]["predicted_ms"]
        assert at[2]["predicted_ms"] == at[3]["predicted_ms"] == at[5]["predicted_ms"]
    spill = data["kernel_resources"]["d=128 BLOCK_R=128 BLOCK_C=64 VERSION=5 MIN_BLOCKS=1"]
    assert spill["local_bytes"] > 0


def test_flash3_versions_as_schedules():
    """The Hopper kernel's versions as the model reads them: v1 and v2 the same schedule
    (TMA moves the same bytes), v4's ping-pong + intra faster than v3. The H200 says v4 is
    slower (hopper_h200.json, docs/hopper_kernel.md says why): this model's miss, held."""
    from gpu_kernels.cupy import flash3
    assert set(sc.FLASH3_VERSIONS) == set(flash3.VERSIONS)
    data = json.loads(resources.files("flashsim.measured").joinpath(
        "data/hopper_h200.json").read_text())
    assert sc.step_gains(data["points"]) == data["step_gains"]     # the benchmark's own
    small = {"configs": data["configs"],
             "points": [p for p in data["points"] if p["impl"].startswith("cupy_flash3_v")
                        and p["N"] == 1024 and p["d"] == 64]}
    rows = sc.flash3_versions(small)
    assert len(rows) == 2 * len(flash3.VERSIONS)
    gains = {(g["causal"], g["step"]): g["geomean_gain"] for g in sc.step_gains(rows)}
    for causal in (False, True):
        assert gains[(causal, "v1 -> v2")] == 1.0
        assert gains[(causal, "v3 -> v4")] > 1.2
    measured = {(g["d"], g["causal"], g["step"]): g["geomean_gain"] for g in data["step_gains"]}
    assert all(v < 1 for (_, _, step), v in measured.items() if step == "v3 -> v4")


def test_io_schedule_option(capsys):
    # FlashAttention-3's 128 x 128 tiles hold S_ij and O_i in two consumer warp groups'
    # registers; the presets' register budget is FlashAttention-2's four warps, so the
    # two-level placement here
    code = main(["io", "-a", "flash2", "-N", "2048", "-d", "128", "--dtype", "fp16",
                 "--block-rows", "128", "--block-cols", "128", "--gpu", "h100",
                 "--placement", "two-level",
                 "--schedule", "pingpong+intra", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["schedule"]["schedule"] == "pingpong+intra"
    assert d["schedule"]["phase_cycles"]["softmax"] == (128 * 128 + 128) / 16
    assert d["schedule"]["predicted_time_s"] > 0
    assert main(["io", "-a", "flash1", "-N", "256", "-d", "64", "--dtype", "fp16",
                 "--schedule", "sequential"]) == 2
    assert "flash2 forward" in capsys.readouterr().err
    assert main(["io", "-a", "flash2", "-N", "256", "-d", "64", "--schedule", "intra"]) == 2
    assert main(["io", "-a", "flash2", "-N", "256", "-d", "64", "--dtype", "fp16",
                 "--schedule", "intra", "--loads", "blocking"]) == 2
    assert "blocking" in capsys.readouterr().err
