"""``flashsim measure`` (flashsim/measure.py) and the Nsight Compute plumbing it shares with
benchmarks/ncu_sweep.py (gpu_kernels/ncu.py).

Without a GPU (here and in CI): every way of having nothing to measure on — no GPU, numba's
CUDA simulator (never a GPU), no ``gpu`` extra — and every bad input ends with exit status 2,
one line on stderr, nothing on stdout; inputs are checked before the GPU is looked for; the
prediction is flashsim's for exactly the launch, at the efficiency the committed dataset
states; the ncu parser reads the committed raw CSV back into the committed dataset; one
launch goes through the whole row pipeline under the simulator with an explicit harness.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import types

import pytest
from _checks import measured_in_a_process

from flashsim import cli, measure, measured
from flashsim.measured import validation
from gpu_kernels import harness, ncu, registry

SMALL = ["--seq-len", "40", "--head-dim", "16", "--batch", "1", "--heads", "2"]


def run(capsys, *argv):
    code = cli.main(["measure", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(capsys, *argv, match: str) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), (code, out, err)
    assert err.count("\n") == 1 and err.startswith("flashsim: error: "), err
    assert "Traceback" not in err and match in err, err


def gpu_here() -> bool:
    import gpu_kernels

    return gpu_kernels.gpu_available()


# ------------------------------------------------------------------ nothing to measure on
def test_the_simulator_is_not_a_gpu(capsys):
    # tests/conftest.py turns the simulator on: numba's kernels would "run" on the CPU
    from gpu_kernels.numba.common import numba

    assert numba.config.ENABLE_CUDASIM
    assert_refused(capsys, "--kernel", "numba_flash2", match="simulator")
    assert_refused(capsys, "--all", match="simulator")


def test_no_gpu_cupy_kernel(capsys):
    if gpu_here():
        pytest.skip("a GPU is present: this is the no-GPU path")
    assert_refused(capsys, "--kernel", "cupy_flash2", *SMALL, match="no NVIDIA GPU")


def test_no_gpu_real_process():
    """As a user runs it: a fresh process, the simulator off, no GPU."""
    if gpu_here():
        pytest.skip("a GPU is present: this is the no-GPU path")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    for kernel in ("numba_flash2", "cupy_flash2_tc"):
        p = subprocess.run([sys.executable, "-m", "flashsim.cli", "measure", "--kernel", kernel],
                           capture_output=True, text=True, env=env, timeout=120)
        assert (p.returncode, p.stdout) == (2, ""), (p.returncode, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and "no NVIDIA GPU" in p.stderr, p.stderr


@pytest.mark.parametrize("module,kernel", [("cupy", "cupy_flash2"),
                                           ("gpu_kernels.numba.common", "numba_flash2")])
def test_without_the_gpu_extra(capsys, monkeypatch, module, kernel):
    monkeypatch.setitem(sys.modules, module, None)      # import fails as if not installed
    assert_refused(capsys, "--kernel", kernel, match="needs the gpu extra")


def test_bad_input_is_refused_before_the_gpu_is_looked_for(capsys):
    assert_refused(capsys, "--kernel", "nope", match="unknown 'nope'")
    assert_refused(capsys, match="--kernel NAME or --all")
    assert_refused(capsys, "--all", "--kernel", "numba_flash2", match="--kernel NAME or --all")
    assert_refused(capsys, "--kernel", "cupy_flash2_tc", "--head-dim", "96", match="d = 96")
    assert_refused(capsys, "--kernel", "numba_flash2", "--dtype", "fp16", match="fp16")
    assert_refused(capsys, "--kernel", "numba_flash2", "-N", "0", match="--seq-len")
    assert_refused(capsys, "--kernel", "numba_flash2", "--repeats", "0", match="--repeats")
    assert_refused(capsys, "--all", "--dtype", "bf16", "--head-dim", "96",
                   match="no registered kernel runs this configuration")
    # the float64 reference of one head at N = 2^20 (8 TiB): refused before anything runs
    assert_refused(capsys, "--kernel", "cupy_flash2", "-N", str(2**20), match="host memory")


def test_all_skips_kernels_without_the_dtype():
    args = cli.build_parser().parse_args(["measure", "--all", "--dtype", "FP16"])
    launches, skipped = measure._launches(args)
    assert [x.kernel for x in launches] == ["cupy_flash2_tc", "cupy_flash3", *registry.DECODE_KERNELS]
    forward = [k for k, e in registry.KERNELS.items() if e.pass_ == "fwd"]
    assert sorted(s["kernel"] for s in skipped) == sorted(set(forward) - {"cupy_flash2_tc", "cupy_flash3"})
    assert all("fp16" in s["skipped"] for s in skipped)


def test_all_runs_every_forward_kernel_at_the_default_shape():
    """And every decode kernel at its own (tests/test_predict_decode.py)."""
    args = cli.build_parser().parse_args(["measure", "--all"])
    launches, skipped = measure._launches(args)
    assert skipped == []
    forward = [k for k, e in registry.KERNELS.items() if e.pass_ == "fwd"]
    assert [x.kernel for x in launches] == forward + list(registry.DECODE_KERNELS)
    for x in launches[:len(forward)]:
        assert (x.batch, x.heads, x.N, x.d) == (2, 8, 2048, 64)
        assert x.dtype == registry.get(x.kernel).dtypes[0]


def test_ncu_missing(monkeypatch):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    with pytest.raises(ncu.NcuError, match="not on PATH"):
        ncu.profile([{"kernel": "numba_flash2", "batch": 1, "heads": 1, "seq_len": 16,
                      "head_dim": 16}])


def test_flashsim_does_not_import_gpu_kernels():
    code = ("import sys, flashsim, flashsim.cli, flashsim.measure; "
            "print([m for m in sys.modules if m.split('.')[0] in "
            "('gpu_kernels', 'numba', 'cupy', 'tqdm')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------ the prediction
@pytest.mark.parametrize("kernel,causal", [("numba_flash2", False), ("cupy_flash2_tc", True),
                                           ("numba_standard", False), ("numba_flash1", True)])
def test_prediction_is_flashsim_predicts_for_that_launch(kernel, causal):
    from flashsim import predict as fp
    from flashsim.hardware import l2

    launch = registry.launch(kernel, batch=2, heads=3, seq_len=300, head_dim=64, causal=causal)
    got = measure.predict(launch)
    assert got == dict(fp.predict(kernel, batch=2, heads=3, seq_len=300, head_dim=64,
                                  dtype=launch.dtype, causal=causal, gpu="h200"),
                       plan=launch.plan_record())
    assert got["two_level_bytes"] == launch.predicted_traffic().requested_bytes
    # the L2 model on the kernel's own occupancy: its request bytes do not depend on it
    rep = l2.simulate(launch.plan())
    assert (got["l2_read_bytes"], got["l2_write_bytes"]) == (rep.l2_read_bytes, rep.l2_write_bytes)
    assert got["predicted_time_s"] > 0 and got["efficiency"] == fp.efficiency_for(kernel, 64)[0]


def test_no_stated_efficiency_means_no_predicted_time():
    launch = registry.launch("numba_flash2_bwd", batch=1, heads=2, seq_len=64, head_dim=16)
    got = measure.predict(launch)
    assert got["predicted_time_s"] is None and "no calibration point" in got["efficiency_source"]


def test_numba_flash1_is_predicted_launch_by_launch():
    """Its plan is flashsim's flash1 with a launch per K/V block (the kernel's own launches):
    line 2's launch, then one row for the T_c launches of flash1_step, each timed."""
    launch = registry.launch("numba_flash1", batch=2, heads=8, seq_len=2048, head_dim=64)
    got = measure.predict(launch)
    assert got["plan"]["kv_launches"] and got["predicted_time_s"] > 0
    T_c = -(-2048 // launch.block_cols)
    assert [(x["kernel"], x["count"]) for x in got["launches"]] == [("fill_flat", 1),
                                                                    ("flash1_step", T_c)]
    assert got["launches"][1]["grid"] == list(launch.launches()[3].grid)


# ------------------------------------------------------------------ the counters
@pytest.mark.parametrize("name", [p.stem for d in (validation.DATASET, validation.HELDOUT)
                                  for p in validation.parts(d)])
def test_ncu_parser_reads_the_committed_csv_back_into_the_dataset(name):
    if not validation.path(f"{name}_raw.csv").exists():
        pytest.skip(f"no {name}_raw.csv committed")
    data = measured.load(f"{name}.json")                  # the file alone, not its parts
    raw = validation.path(f"{name}_raw.csv").read_text()
    points = [{k: v for k, v in p.items() if k != "launches"} for p in data["points"]]
    got = ncu.assign(ncu.parse_csv(raw, data["metrics"]), points)
    assert got == data["points"]


def test_ncu_parser_refuses_other_units():
    lines = validation.path("ncu_h200_raw.csv").read_text().splitlines()
    table = [i for i, ln in enumerate(lines) if ln.startswith('"')]
    header, units = (next(csv.reader([lines[i]])) for i in table[:2])
    units[header.index("dram__bytes_write.sum")] = "Mbyte"
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerow(units)
    lines[table[1]] = out.getvalue().strip()
    with pytest.raises(ncu.NcuError, match="dram__bytes_write.sum in 'Mbyte'"):
        ncu.parse_csv("\n".join(lines), ncu.COUNTERS)


def test_counters_go_into_measured(monkeypatch):
    pt = validation.load()["points"][0]
    monkeypatch.setattr(ncu, "profile", lambda specs: [pt["launches"]] * len(specs))
    launch = registry.launch(pt["kernel"], batch=pt["batch"], heads=pt["heads"],
                             seq_len=pt["N"], head_dim=pt["d"])
    rows = [{"check_ok": True, "measured": {"time_s": 1.0}}, {"check_ok": False, "measured": {}}]
    measure.add_counters(rows, [launch, launch])
    want = validation.measured(pt)
    assert rows[0]["measured"]["dram_read_bytes"] == want["dram_read_bytes"]
    assert rows[0]["measured"]["l2_write_bytes"] == want["l2_write_bytes"]
    assert rows[0]["measured"]["ncu_time_s"] == want["time_s"]
    assert rows[1]["measured"] == {}                  # a failed check is not profiled


def test_ncu_failure_is_recorded_not_raised(monkeypatch):
    def fail(specs):
        raise ncu.NcuError("ncu exited 1: ERR_NVGPUCTRPERM")
    monkeypatch.setattr(ncu, "profile", fail)
    rows = [{"check_ok": True, "measured": {"time_s": 1.0}}]
    measure.add_counters(rows, [registry.launch("numba_flash2", batch=1, heads=1, seq_len=64,
                                                head_dim=64)])
    assert rows[0]["ncu_error"].endswith("ERR_NVGPUCTRPERM")
    assert "dram_read_bytes" not in rows[0]["measured"]


def test_ncu_command_is_the_one_asked_for():
    cmd = ncu.command(ncu.COUNTERS, ["python3", "prog.py"])
    assert cmd[:6] == ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", "m/"]
    assert cmd[cmd.index("--metrics") + 1] == (
        "dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,"
        "lts__t_sectors_srcunit_tex_op_write.sum,gpu__time_duration.sum")
    assert "--csv" in cmd and cmd[-2:] == ["python3", "prog.py"]
    assert "NUMBA_ENABLE_CUDASIM" not in ncu.child_env()


# ------------------------------------------------------------------ one row, end to end
@pytest.fixture(scope="module")
def simulated_row():
    """numba_flash2 checked and 'timed' under the simulator (its times mean nothing): the
    row pipeline with an explicit harness; the command itself refuses the simulator."""
    h = harness.Harness("numba", flush=False, warmup=0, min_repeats=1, max_repeats=1)
    launch = registry.launch("numba_flash2", batch=1, heads=2, seq_len=40, head_dim=16)
    return measure.measure_launch(launch, repeats=1, harness=h), launch


def test_numba_flash1_prints_predicted_beside_measured():
    """The numba FlashAttention kernel (a launch per K/V block) through the row pipeline
    under the simulator: its line has a predicted time and a ratio, not '-'."""
    h = harness.Harness("numba", flush=False, warmup=0, min_repeats=1, max_repeats=1)
    launch = registry.launch("numba_flash1", batch=1, heads=1, seq_len=40, head_dim=16)
    row = measure.measure_launch(launch, repeats=1, harness=h)
    assert row["check_ok"] and row["predicted"] == measure.predict(launch)
    line = measure.format_rows([row], []).splitlines()[1].split()
    assert line[0] == "numba_flash1" and line[3] == "ok"
    assert float(line[5]) == pytest.approx(row["predicted"]["predicted_time_s"] * 1e3, abs=1e-4)
    assert line[6].endswith("x")


def test_row_has_the_check_and_both_sides(simulated_row):
    row, launch = simulated_row
    assert row["check_ok"] and row["max_error"] <= row["bound"]
    assert row["config"]["seq_len"] == 40 and row["tiles"]["block_rows"] == launch.block_rows
    assert "time_s" in row["measured"] and "dram_read_bytes" not in row["measured"]
    assert row["predicted"] == measure.predict(launch)
    json.dumps(row)


def test_table_has_one_line_per_kernel(simulated_row):
    row, _ = simulated_row
    failed = dict(row, check_ok=False)
    broken = {"kernel": "cupy_flash2", "config": row["config"], "check_ok": False,
              "error": "CUDADriverError: launch failed"}
    text = measure.format_rows([row, failed, broken], [{"kernel": "x", "skipped": "why"}])
    lines = text.splitlines()
    assert lines[0].startswith("kernel") and "DRAM MB" in lines[0]
    assert lines[1].split()[:4] == ["numba_flash2", "fp32", f"{row['tiles']['block_rows']}x"
                                    f"{row['tiles']['block_cols']}", "ok"]
    assert lines[2].split()[3] == "FAILED" and "could not run" in lines[3]
    assert "add --ncu" in text and "x: skipped: why" in text
    untimed = dict(row, predicted={k: v for k, v in row["predicted"].items()
                                   if k != "predicted_time_s"})
    untimed["predicted"]["efficiency_source"] = "no efficiency stated: test"
    assert "numba_flash2: no efficiency stated: test" in measure.format_rows([untimed], [])


def test_answer_json_and_exit_status(simulated_row, monkeypatch):
    row, launch = simulated_row
    monkeypatch.setattr(measure, "run", lambda args: ([row], []))
    args = types.SimpleNamespace(json=True, all=False)
    out = measure.answer(args)
    assert json.loads(out) == json.loads(json.dumps(row)) and out.exit_status == 0
    monkeypatch.setattr(measure, "run", lambda args: ([row, dict(row, check_ok=False)], []))
    out = measure.answer(types.SimpleNamespace(json=True, all=True))
    assert len(json.loads(out)) == 2 and out.exit_status == 1


def test_progress_bar_only_on_a_terminal(monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert measure.Progress([1], desc="x").disable                  # pytest's stderr: no TTY
    monkeypatch.setattr(sys, "stderr", Tty())
    assert measure.Progress([1], quiet=True, desc="x").disable
    stdout = sys.stdout
    seen = []
    for i in measure.Progress([1, 2, 3], desc="points"):
        print(f"point {i}")
        seen.append(i)
    assert seen == [1, 2, 3] and sys.stdout is stdout               # printing restored
    assert capsys.readouterr().out == "point 1\npoint 2\npoint 3\n"  # every line, unchanged
    assert "points" in sys.stderr.getvalue()                         # the bar, on stderr
    bar = measure.Progress(total=2, desc="by hand")
    bar.update()
    bar.close()
    assert sys.stdout is stdout and "by hand" in sys.stderr.getvalue()
    monkeypatch.setitem(sys.modules, "tqdm", None)              # a GPU image without tqdm
    assert list(measure.Progress([4, 5], desc="none")) == [4, 5]
    bar = measure.Progress(total=2, desc="none")
    bar.update()
    bar.close()
    assert "none" not in sys.stderr.getvalue() and sys.stdout is stdout


# ------------------------------------------------------------------ the GPU script's CPU side
def test_measure_all_without_a_gpu_writes_nothing(tmp_path, capsys):
    from benchmarks import measure_all

    assert measure_all.main(["--out", str(tmp_path), "--no-tests", "--quiet"]) == 2
    assert list(tmp_path.iterdir()) == [] and "simulator" in capsys.readouterr().err


def test_measure_all_writes_rows_with_provenance(tmp_path, monkeypatch, simulated_row):
    from benchmarks import measure_all

    row, _ = simulated_row
    asked = []

    def fake_run(args):
        asked.append(args)
        return [row], [{"kernel": "cupy_flash2_tc", "skipped": "takes fp16, bf16"}]
    monkeypatch.setattr(measure, "run", fake_run)
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)       # no ncu here
    assert measure_all.main(["--out", str(tmp_path), "--no-tests", "--quiet"]) == 0
    assert asked[0].all and not asked[0].ncu          # ncu asked for but absent: left out
    data = json.loads((tmp_path / measure_all.NAME).read_text())
    assert data["rows"] == json.loads(json.dumps([row])) and data["skipped"][0]["kernel"]
    assert data["command"] == "flashsim measure --all --json"
    assert "ncu is not on PATH" in data["notes"][0]
    for key in ("date", "git_commit", "packages", "gpu"):
        assert key in data["provenance"]
    monkeypatch.setattr(measure, "run", lambda args: ([dict(row, check_ok=False)], []))
    assert measure_all.main(["--out", str(tmp_path), "--no-tests", "--quiet"]) == 1


# ------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
def test_measure_on_the_gpu(kernel="cupy_flash2_tc"):
    """The command as a user runs it (its own process, the simulator off): checked, timed,
    predicted; with ncu on PATH, counters whose DRAM reads cover Q, K and V at least once
    (ncu flushes the L2 before every profiled kernel). One kernel: benchmarks/measure_all.py
    runs every one through the same code."""
    if not gpu_here():
        pytest.skip("no CUDA device")
    B, H, N, d = 2, 4, 1000, 64
    row, with_ncu = measured_in_a_process("--kernel", kernel, "--batch", str(B), "--heads",
                                          str(H), "--seq-len", str(N), "--head-dim", str(d))
    assert row["kernel"] == kernel
    if with_ncu:
        elem = 2 if row["config"]["dtype"] in ("fp16", "bf16") else 4
        assert row["measured"]["dram_read_bytes"] >= 3 * B * H * N * d * elem
        # K and V are requested once per Q block: the SMs ask the L2 for more than DRAM sends
        assert row["measured"]["l2_read_bytes"] > row["measured"]["dram_read_bytes"]
