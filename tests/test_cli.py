"""The CLI: tables, JSON, verification, and one-line errors with exit status 2."""

import json
import subprocess
import sys

import pytest

from flashsim.cli import main

KEYS = {"algorithm", "seq_len", "head_dim", "batch", "heads", "dtype", "sram_bytes",
        "block_rows", "block_cols", "hbm_read_bytes", "hbm_write_bytes", "hbm_bytes",
        "flops", "per_tensor", "sram_peak_bytes"}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_io_json_has_every_field(capsys):
    code, out, err = run(capsys, "io", "--algorithm", "flash2", "--seq-len", "1000",
                         "--head-dim", "64", "--batch", "2", "--heads", "3", "--dtype",
                         "fp16", "--gpu", "h100", "--json")
    assert code == 0 and err == ""
    d = json.loads(out)
    assert KEYS <= d.keys()
    assert d["predicted_time_s"] > 0 and d["gpu"] == "NVIDIA H100 SXM"
    assert d["hbm_bytes"] == sum(t["read_bytes"] + t["write_bytes"]
                                 for t in d["per_tensor"].values())
    assert d["per_tensor"]["Q"]["read_bytes"] == 2 * 3 * 1000 * 64 * 2


@pytest.mark.parametrize("alg", ["standard", "flash1", "flash2"])
@pytest.mark.parametrize("causal", [[], ["--causal"]])
def test_verify_is_exact_for_ragged_sizes(capsys, alg, causal):
    code, out, _ = run(capsys, "io", "-a", alg, "-N", "203", "-d", "24", "--sram", "20KiB",
                       "--block-rows", "24", "--block-cols", "40", "--verify", "--json",
                       "--heads", "2", *causal)
    assert code == 0
    assert json.loads(out)["max_abs_error"] <= 1e-10


def test_io_table_and_compare_table(capsys):
    code, out, _ = run(capsys, "io", "-a", "standard", "-N", "512", "-d", "64",
                       "--sram", "100KiB", "--extra-passes", "scale,mask")
    assert code == 0 and "S_scaled" in out and "S_masked" in out
    # the two-level count named for what it is; --sram alone: no preset, no DRAM line
    assert "requested by SRAM from the level below" in out and "requested (r+w)" in out
    assert "HBM bytes" not in out and "DRAM" not in out
    code, out, _ = run(capsys, "compare", "-N", "512", "-d", "64", "--causal")
    assert code == 0
    assert all(a in out for a in ("standard", "flash1", "flash2"))


def test_compare_json_and_gpus(capsys):
    code, out, _ = run(capsys, "compare", "-N", "256", "-d", "32", "--json", "--verify")
    algs = json.loads(out)["compare"]
    assert [a["algorithm"] for a in algs] == ["standard", "flash1", "flash2"]
    assert all(a["max_abs_error"] <= 1e-10 for a in algs)
    code, out, _ = run(capsys, "gpus")
    assert code == 0 and "h200" in out and "source" in out


@pytest.mark.parametrize("argv,words", [
    (["io", "-a", "flash2", "-N", "0", "-d", "64"], "positive"),
    (["io", "-a", "flash2", "-N", "1.5", "-d", "64"], "whole number"),
    (["io", "-a", "flash9", "-N", "64", "-d", "64"], "choose one of standard, flash1"),
    (["io", "-a", "flash2", "-N", "64", "-d", "64", "--dtype", "fp64"], "choose one of fp32"),
    (["io", "-a", "flash2", "-N", "64", "-d", "64", "--gpu", "v100"], "choose one of a100"),
    (["io", "-a", "flash2", "-N", "64", "-d", "64", "--sram", "lots"], "size"),
    (["io", "-a", "flash2", "-N", "1024", "-d", "64", "--sram", "8KiB",
      "--block-rows", "64", "--block-cols", "64"], "SRAM"),
    (["io", "-a", "flash1", "-N", "64", "-d", "64", "--extra-passes", "scale"], "standard"),
    (["io", "-N", "64", "-d", "64"], "required"),
    ([], "required"),
])
def test_bad_input_one_line_exit_2(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_console_script_exit_status_from_a_real_process():
    bad = subprocess.run([sys.executable, "-m", "flashsim.cli", "io", "-a", "flash2",
                          "-N", "-3", "-d", "8"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1
    good = subprocess.run([sys.executable, "-m", "flashsim.cli", "io", "-a", "flash2",
                           "-N", "64", "-d", "8", "--json"], capture_output=True, text=True)
    assert good.returncode == 0 and json.loads(good.stdout)["seq_len"] == 64


def test_gpu_preset_adds_the_three_level_dram_bytes(capsys):
    code, out, _ = run(capsys, "io", "-a", "flash2", "-N", "1024", "-d", "64", "--batch", "2",
                       "--heads", "8", "--gpu", "h200", "--json")
    d = json.loads(out)
    assert code == 0 and d["l2_bytes"] == 60 * 2**20
    # L2 requests are the two-level bytes; the L2 keeps K and V for the re-reads.
    assert d["l2_request_read_bytes"] == d["hbm_read_bytes"]
    assert d["dram_read_bytes"] == 3 * 2 * 8 * 1024 * 64 * 4 < d["hbm_read_bytes"]
    assert d["dram_write_bytes"] + d["dram_dirty_at_end_bytes"] == d["hbm_write_bytes"]
    # One head whose 171 Q blocks need two waves of 132, and an L2 far smaller than its
    # K and V: the second wave's re-reads miss.
    args = ["io", "-a", "flash2", "-N", "8192", "-d", "64", "--sram", "64KiB",
            "--blocks-per-sm", "1", "--json"]
    code, out, _ = run(capsys, *args, "--l2", "64KiB")
    tiny = json.loads(out)
    code, out, _ = run(capsys, *args, "--l2", "60MiB")
    big = json.loads(out)
    assert tiny["blocks_per_sm"] == 1 and tiny["block_rows"] == 48
    assert big["dram_read_bytes"] == 3 * 8192 * 64 * 4 < tiny["dram_read_bytes"]
    code, out, _ = run(capsys, "io", "-a", "flash2", "-N", "256", "-d", "64", "--sram", "64KiB")
    assert "DRAM" not in out          # an SRAM size alone: the two-level model, no preset
    code, out, _ = run(capsys, "io", "-a", "flash2", "-N", "256", "-d", "64")
    assert "DRAM bytes" in out        # the default preset applies: DRAM stands beside


def test_bad_l2_size_is_one_line(capsys):
    code, out, err = run(capsys, "io", "-a", "flash2", "-N", "64", "-d", "8", "--l2", "lots")
    assert code == 2 and out == "" and err.count("\n") == 1 and "size" in err
