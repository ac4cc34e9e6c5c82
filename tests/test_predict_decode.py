"""The decode kernels in ``flashsim predict`` and ``flashsim measure`` (flashsim/predict_decode.py).

Without a GPU: the prediction is flashsim's plan of exactly the launch the loader configures
(its splits, packed rows, B_c, pages), its bytes equal to the closed forms of docs/decode.md;
every bad input is one line on stderr and exit status 2; ``flashsim measure --all`` lists the
decode kernels and still exits 2 with one line; the check ``measure_decode`` runs passes the
reference and fails a wrong output. On a GPU (``-m gpu``): ``flashsim measure`` runs a decode
kernel as a user runs it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _checks import measured_in_a_process
from hypothesis import HealthCheck, given, settings, strategies as st

from flashsim import cli, measure
from flashsim.algorithms.kvcache import split_geometry
from flashsim.hardware import l2
from flashsim.nest import launches as nest_launches
from flashsim.predict import PredictError, predict
from flashsim.predict_decode import predict_decode
from flashsim.units import cdiv
from gpu_kernels import registry
from gpu_kernels.common import Result
from gpu_kernels.cupy import decode

# (kernel, batch, heads, kv_heads, q_len, kv_lens, page size, splits): MHA, GQA, MQA; ragged;
# q_len > 1; pages that divide B_c and pages it divides; one split and many; row chunks
CASES = [
    ("cupy_decode", 8, 32, 8, 1, [32768] * 8, None, None),
    ("cupy_decode", 1, 32, 8, 1, [32768], None, None),
    ("cupy_decode", 2, 32, 32, 4, [4096, 4096], None, 1),
    ("cupy_decode", 3, 32, 1, 4, [100, 3000, 517], None, 7),
    ("cupy_decode", 2, 64, 1, 4, [1000, 70], None, None),          # 256 rows: chunks
    ("cupy_decode_paged", 8, 32, 8, 1, [32768] * 8, 16, None),
    ("cupy_decode_paged", 3, 32, 8, 4, [100, 3000, 517], 1, None),
    ("cupy_decode_paged", 2, 16, 4, 16, [4000, 129], 128, 3),        # B_c divides P
    ("cupy_decode_paged", 2, 8, 8, 1, [64, 65], 64, 2),
    ("cupy_decode", 1, 32, 1, 1, [32768], None, None),             # 128 splits merged in the split (v7)
]


def launch_of(kernel, B, H, kvh, q_len, lens, page, splits, d=128):
    kw = dict(page_size=page) if page else {}
    return registry.get(kernel).launch(batch=B, heads=H, kv_heads=kvh, head_dim=d, kv_lens=lens,
                                       q_len=q_len, dtype="fp16", splits=splits, **kw)


def predicted(kernel, B, H, kvh, q_len, lens, page, splits, d=128):
    return predict_decode(kernel, batch=B, heads=H, kv_heads=kvh, q_len=q_len, kv_lens=lens,
                          head_dim=d, dtype="fp16", page_size=page, splits=splits, gpu="h200")


@pytest.mark.parametrize("case", CASES)
def test_prediction_is_flashsims_plan_of_the_kernels_own_launch(case):
    kernel, B, H, kvh, q_len, lens, page, splits = case
    r = predicted(*case)
    launch = launch_of(*case)
    p = launch.plan("h200")
    S = launch.splits
    rep = p.count()
    # the launch as the loader configures it
    assert r["splits"] == launch.splits == p.splits
    assert (r["block_rows"], r["block_cols"]) == (launch.plan_block_rows, launch.block_cols)
    phases = len(nest_launches(p.nest()))
    kernels = launch.launches() * (phases if launch.fused else 1)   # v7: decode_split runs both
    assert [x["grid"] for x in r["launches"]] == [list(x.grid) for x in kernels]
    assert [x["launched"] for x in r["launches"]] == [i == 0 or not launch.fused for i in range(phases)]
    assert p.fused_combine == bool(launch.fused) and launch.fused == (S > 32)
    assert r["launches"][0]["blocks_per_sm"] == decode.blocks_per_sm(
        launch.dynamic_smem, launch.d, launch.warps, launch.wgmma)
    assert r["plan"] == launch.plan_record()
    # the counted bytes: the plan's, and its closed forms
    assert r["two_level_bytes"] == rep.hbm_bytes == p.closed_form().hbm_bytes
    assert r["kv_bytes"] == rep.kv_bytes == launch.kv_bytes_read()
    assert r["kv_bytes"] == 2 * launch.chunks * sum(lens) * kvh * 128 * 2
    G, S = q_len * H // kvh, launch.splits
    S_b = [split_geometry(n, launch.block_cols, S)[2] for n in lens]
    # each split writes fp32 O and logsumexp of the group's rows, the combine reads them back
    assert r["partial_bytes"] == (0 if S == 1 else
                                  sum(2 * kvh * s * G * (128 + 1) * 4 for s in S_b))
    Bc = launch.block_cols
    table = sum(4 * kvh * launch.chunks * (cdiv(n, page) if Bc % page == 0 else cdiv(n, Bc))
                for n in lens) if page else 0
    assert r["block_table_bytes"] == table
    # the L2 model at the kernel's resident blocks, and the memory-bound time on its bytes
    labels = [x.label for x in nest_launches(p.nest())]
    rep.l2 = l2.simulate(p.engine_view(), blocks_per_sm={
        lab: x["blocks_per_sm"] for lab, x in zip(labels, r["launches"])})
    assert (r["dram_read_bytes"], r["dram_write_bytes"]) == (rep.l2.dram_read_bytes,
                                                             rep.l2.dram_write_bytes)
    assert (r["l2_read_bytes"], r["l2_write_bytes"]) == (rep.l2.l2_read_bytes,
                                                         rep.l2.l2_write_bytes)
    assert r["predicted_time_s"] == sum(x.seconds for x in p.predict(l2=rep.l2)) > 0
    assert r["dram_read_bytes"] >= r["kv_bytes"] // launch.chunks   # the cache comes from DRAM
    json.dumps(r)


def test_page_table_is_a_pool_of_distinct_pages():
    bt, pages = decode.page_table([100, 3000, 1], 16, np.random.default_rng(0))
    need = [7, 188, 1]
    assert pages == sum(need) + 3 and bt.shape == (3, 189) and bt.dtype == np.int32
    used = np.concatenate([bt[b, :k] for b, k in enumerate(need)])
    assert len(set(used.tolist())) == len(used) and used.min() >= 0 and used.max() < pages
    assert all((bt[b, k:] == -1).all() for b, k in enumerate(need))
    a = registry.get("cupy_decode_paged").launch(batch=3, heads=8, head_dim=64,
                                                 kv_lens=[100, 3000, 1], page_size=16)
    assert np.array_equal(a.block_table, bt) and a.num_pages == pages    # seed 0, every time


def test_measure_spec_builds_the_same_launch_again():
    for case in CASES:
        launch = launch_of(*case)
        kw = measure.spec(launch)
        again = registry.get(kw.pop("kernel")).launch(**kw)
        assert again.plan_record() == launch.plan_record()
        assert again.kv_lens == launch.kv_lens and again.launches() == launch.launches()
        if launch.page_size:
            assert np.array_equal(again.block_table, launch.block_table)
        assert measure.predict(launch) == dict(predicted(*case), plan=launch.plan_record())


@pytest.mark.parametrize("variant", sorted(decode.VARIANTS))
def test_a_variant_is_predicted_as_its_configure_keywords_build_it(variant):
    """--variant NAME: the launch of decode.VARIANTS[NAME]'s keywords, with explicit --splits
    and --block-cols over the variant's; measure.spec builds that launch again."""
    for kvh, q_len, lens in ((8, 1, [4096]), (1, 4, [32768, 517])):
        kw = dict(batch=len(lens), heads=32, kv_heads=kvh, head_dim=128, kv_lens=lens, q_len=q_len)
        launch = registry.get("cupy_decode").launch(**kw, **decode.VARIANTS[variant])
        r = predict_decode("cupy_decode", **kw, gpu="h200", variant=variant)
        assert r["variant"] == variant and r["plan"] == launch.plan_record()
        assert [x["grid"] for x in r["launches"] if x["launched"]] == [list(x.grid) for x in launch.launches()]
        spec = measure.spec(launch)
        again = registry.get(spec.pop("kernel")).launch(**spec)
        assert again.defines() == launch.defines() and again.launches() == launch.launches()
        forced = predict_decode("cupy_decode", **kw, gpu="h200", variant=variant, splits=3)
        assert forced["splits"] == 3 and forced["plan"]["combine"] == launch.combine


def test_square_predict_sends_decode_kernels_to_their_own():
    with pytest.raises(PredictError, match="predict_decode"):
        predict("cupy_decode", seq_len=100, head_dim=128, gpu="h200")
    with pytest.raises(PredictError, match="not a decode kernel"):
        predict_decode("cupy_flash2", kv_len=100, head_dim=64, gpu="h200")


# ------------------------------------------------------------------ the CLI
def call(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def one_error_line(*args) -> str:
    code, out, err = call(*args)
    assert code == 2 and out == "" and "Traceback" not in err, (args, code, out, err)
    assert len(err.splitlines()) == 1 and err.startswith("flashsim: error: "), err
    return err


DECODE = ["predict", "--kernel", "cupy_decode", "--batch", "8", "--heads", "32", "--kv-heads",
          "8", "--q-len", "1", "--kv-len", "32768", "--head-dim", "128", "--dtype", "fp16",
          "--gpu", "h200"]


def test_cli_answers_with_the_api_prediction():
    code, out, err = call(*DECODE, "--json")
    assert code == 0 and err == ""
    assert json.loads(out) == json.loads(json.dumps(predicted(
        "cupy_decode", 8, 32, 8, 1, [32768] * 8, None, None)))
    code, out, _ = call(*DECODE)
    assert code == 0 and "decode_split" in out and "decode_combine" in out
    assert "kv_bytes" in out and "predicted_time_s" in out
    # MQA at B = 1: 128 splits merged in decode_split (v7), one launch line and the merge after it
    mqa = dict(zip(DECODE[1::2], DECODE[2::2]), **{"--batch": "1", "--kv-heads": "1"})
    code, out, _ = call("predict", *[w for kv in mqa.items() for w in kv])
    assert code == 0 and "decode_combine" not in out and out.count("decode_split") == 1
    assert "then the combine in the same blocks, no launch of its own" in out
    # a ragged batch takes its batch from --kv-lens; the paged kernel's page defaults to 16
    code, out, _ = call("predict", "--kernel", "cupy_decode_paged", "--heads", "8",
                        "--kv-lens", "100,3000", "-d", "64", "--splits", "auto", "--gpu",
                        "h200", "--json")
    r = json.loads(out)
    assert code == 0 and (r["batch"], r["kv_lens"], r["page_size"]) == (2, [100, 3000], 16)


@pytest.mark.parametrize("args,words", [
    (["--kv-len", "100", "--heads", "6", "--kv-heads", "4"], "not divisible"),
    (["--kv-len", "3", "--q-len", "4"], "q_len = 4 > kv_len = 3"),
    (["--kv-len", "100", "--q-len", "17"], "1 to 16"),
    (["--kv-len", "100", "--seq-len", "100"], "--seq-len is for the square kernels"),
    (["--kv-len", "100", "--block-rows", "16"], "--block-rows"),
    (["--kv-len", "100", "--page-size", "16"], "use cupy_decode_paged"),
    (["--kv-len", "100", "--kv-lens", "3,4"], "not both"),
    (["--q-len", "1"], "--kv-len"),
    (["--kv-len", "100", "-d", "96"], "d = 96"),
    (["--kv-len", "100", "--dtype", "fp32"], "fp32"),
    (["--kv-len", "100", "--splits", "0"], "--splits"),
    (["--kv-len", "100", "--splits", "129"], "--splits"),
    (["--kv-len", "100", "--causal", "--no-causal"], "contradict"),
    (["--kv-lens", "100,0"], "kv_lens"),
    (["--kv-lens", "100,200", "--batch", "3"], "the batch has 3"),
    (["--kv-len", "100", "--batch", "70000"], "grid's z limit"),
])
def test_bad_decode_input_is_one_line_and_exit_2(args, words):
    base = ["predict", "--kernel", "cupy_decode", "-d", "128", "--gpu", "h200"]
    assert words in one_error_line(*base, *args)


@pytest.mark.parametrize("args,words", [
    (["--kernel", "cupy_decode_paged", "--kv-len", "100", "-d", "128", "--page-size", "0"],
     "--page-size"),
    (["--kernel", "cupy_decode_paged", "--kv-len", "100", "-d", "128", "--page-size", "48"],
     "page_size (48)"),
    (["--kernel", "cupy_decode", "--kv-len", "100", "-d", "128"], "--gpu"),
    (["--kernel", "cupy_flash2", "-N", "100", "-d", "64", "--q-len", "1"], "--q-len is a decode"),
    (["--kernel", "cupy_flash2", "-N", "100", "-d", "64", "--kv-heads", "1"], "decode option"),
    (["--kernel", "cupy_flash2", "-d", "64"], "--seq-len"),
    (["--kernel", "cupy_flash2", "-N", "100", "-d", "64", "--variant", "v7"], "--variant is a decode"),
    (["--kernel", "cupy_decode", "--kv-len", "100", "-d", "128", "--variant", "v99"], "one of v1, v2"),
    (["--kernel", "cupy_decode", "--kv-len", "100", "-d", "128", "--gqa-schedule", "pack"],
     "unrecognized"),
])
def test_other_refusals(args, words):
    if "--gpu" not in args and words != "--gpu":
        args = args + ["--gpu", "h200"]
    assert words in one_error_line("predict", *args)


@settings(max_examples=30, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(kernel=st.sampled_from(sorted(registry.DECODE_KERNELS) + ["cupy_flash2"]),
       lens=st.sampled_from(["--kv-len", "--kv-lens"]),
       n=st.sampled_from(["1", "17", "300", "0", "-5", "1e3", "x", "40,70", "5,"]),
       extra=st.lists(st.sampled_from(["--q-len", "4", "16", "--kv-heads", "8", "3", "--heads",
                                       "32", "--splits", "auto", "5", "--page-size", "16", "1",
                                       "--batch", "2", "--json", "--no-causal", "-d", "64",
                                       "--dtype", "bf16", "-N", "--block-cols", "32"]),
                      max_size=6))
def test_every_decode_predict_input_gets_an_answer_or_one_error_line(kernel, lens, n, extra):
    args = ["predict", "--kernel", kernel, lens, n, "-d", "128", "--gpu", "h200"] + extra
    code, out, err = call(*args)
    assert code in (0, 2) and "Traceback" not in err, (args, err)
    if code == 2:
        assert out == "" and len(err.splitlines()) == 1, (args, err)
    elif "--json" in args:
        json.loads(out)


def test_predict_imports_no_gpu_library_for_a_decode_kernel():
    code = ("import sys; from flashsim.cli import main; "
            "assert main(['predict', '--kernel', 'cupy_decode_paged', '--kv-len', '3000', "
            "'--heads', '8', '-d', '128', '--gpu', 'h200']) == 0; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'numba', "
            "'triton')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   stdout=subprocess.DEVNULL)


# ------------------------------------------------------------------ flashsim measure
def test_measure_all_lists_the_decode_kernels_at_their_default_shape():
    args = cli.build_parser().parse_args(["measure", "--all"])
    launches, skipped = measure._launches(args)
    assert skipped == []
    assert [x.kernel for x in launches][-2:] == list(registry.DECODE_KERNELS)
    shape = measure.DEFAULT_DECODE_SHAPE
    for x in launches[-2:]:
        assert (x.batch, x.heads, x.kv_heads, x.q_len, x.N, x.d, x.dtype) == (
            shape["batch"], shape["heads"], shape["kv_heads"], shape["q_len"],
            shape["kv_len"], shape["head_dim"], "fp16")
        assert set(x.kv_lens) == {shape["kv_len"]}
    assert (launches[-2].page_size, launches[-1].page_size) == (0, shape["page_size"])
    # with --all the decode flags go to the decode kernels, --seq-len and tiles to the others
    args = cli.build_parser().parse_args(["measure", "--all", "--kv-len", "4096", "--page-size",
                                          "64", "--block-cols", "32", "-N", "300"])
    launches, _ = measure._launches(args)
    assert [(x.N, x.block_cols, x.page_size) for x in launches[-2:]] == [(4096, 64, 0),
                                                                        (4096, 64, 64)]
    assert all(x.N == 300 for x in launches[:-2])


def test_measure_refuses_before_looking_for_a_gpu(capsys):
    for args, words in ((["--kernel", "cupy_decode", "-N", "100"], "--seq-len"),
                        (["--kernel", "cupy_flash2", "--kv-len", "100"], "decode option"),
                        (["--kernel", "cupy_decode", "--kv-len", "10", "--q-len", "11"], "q_len"),
                        (["--kernel", "cupy_decode", "--kv-heads", "5"], "not divisible")):
        assert words in one_error_line("measure", *args)


def test_measure_without_a_gpu_is_one_line(capsys):
    import gpu_kernels

    if gpu_kernels.gpu_available():
        pytest.skip("a GPU is present: this is the no-GPU path")
    assert "simulator" in one_error_line("measure", "--all")        # numba's kernels first
    assert "no NVIDIA GPU" in one_error_line("measure", "--kernel", "cupy_decode_paged")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-m", "flashsim.cli", "measure", "--all"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert (p.returncode, p.stdout) == (2, "") and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize("page,dtype", [(0, "fp16"), (16, "bf16"), (1, "fp16")])
def test_the_check_passes_the_reference_and_fails_a_wrong_output(page, dtype):
    """``decode.device_check`` (what measure_decode holds our kernel to) on host arrays: the
    float64 reference's own output passes, one wrong element of a checked row fails, and so
    does a row never written (NaN)."""
    kernel = "cupy_decode_paged" if page else "cupy_decode"
    launch = registry.get(kernel).launch(batch=3, heads=8, kv_heads=2, head_dim=64,
                                         kv_lens=[5, 40, 130], q_len=4, dtype=dtype,
                                         **({"page_size": page} if page else {}))
    rng = np.random.default_rng(page)
    cache = ((launch.num_pages, page) if page else (3, 130)) + (2, 64)
    q, k, v = (decode.storage(rng.standard_normal(s).astype(np.float32), dtype)
               for s in ((3, 4, 8, 64), cache, cache))
    check = decode.device_check(launch, q, k, v)
    assert decode.checked_pairs(launch) == [(0, 0), (2, 1)]
    O, L = np.full((3, 4, 8, 64), np.nan), np.full((3, 8, 4), np.nan)
    k_rows, v_rows = launch.used_rows(k), launch.used_rows(v)
    for b, kvh, qi, ref, L_ref in decode.reference_rows(
            launch, decode.to_float32(q), [decode.to_float32(x) for x in k_rows],
            [decode.to_float32(x) for x in v_rows]):
        O[b, qi, 4 * kvh:4 * kvh + 4] = ref.ref
        L[b, 4 * kvh:4 * kvh + 4, qi] = L_ref
    verdict = check(Result(O, L))
    assert verdict["ok"] and verdict["pairs_checked"] == [[0, 0], [2, 1]]
    bad = O.copy()
    bad[2, 3, 7, 5] += 0.5                                # the last row of the last pair
    assert not check(Result(bad, L))["ok"]
    unwritten = O.copy()
    unwritten[0, 0, 0, 0] = np.nan
    assert not check(Result(unwritten, L))["ok"]


def test_table_has_a_line_per_decode_kernel_and_its_shape():
    launch = launch_of(*CASES[5])
    pred = measure.predict(launch)
    row = {"kernel": launch.kernel, "config": dict(measure.spec(launch), pass_="fwd"),
           "tiles": {"block_rows": 16, "block_cols": 64}, "check_ok": True,
           "measured": {"time_s": 3e-4, "tbps": 3.5, "dram_read_bytes": pred["dram_read_bytes"],
                        "dram_write_bytes": 0, "l2_read_bytes": 1, "l2_write_bytes": 1},
           "predicted": pred}
    text = measure.format_rows([row], [])
    line = text.splitlines()[1].split()
    assert line[:4] == ["cupy_decode_paged", "fp16", "16x64", "ok"] and "1.00x" in line
    assert "decode: B = 8, H = 32, kv_heads = 8, q_len = 1, kv_len = 32768, d = 128, pages " \
           "of 16" in text


def test_ncu_spec_of_a_decode_launch_is_json():
    spec = measure.spec(launch_of(*CASES[6]))
    assert json.loads(json.dumps(spec)) == spec and spec["kv_lens"] == [100, 3000, 517]


# ------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kernel,extra", [
    ("cupy_decode", ["--kv-lens", "100,3000,517", "--q-len", "4"]),
    ("cupy_decode_paged", ["--kv-len", "32768", "--batch", "8", "--page-size", "16"]),
])
def test_measure_a_decode_kernel_on_the_gpu(kernel, extra):
    """``flashsim measure`` as a user runs it (its own process, the simulator off): checked
    against the float64 reference, timed, predicted; with ncu on PATH, DRAM reads that cover
    the K/V cache (ncu flushes the L2 before every profiled kernel)."""
    import gpu_kernels

    if not gpu_kernels.gpu_available():
        pytest.skip("no CUDA device")
    row, with_ncu = measured_in_a_process("--kernel", kernel, "--heads", "32", "--kv-heads", "8",
                                          "--head-dim", "128", *extra)
    assert row["kernel"] == kernel and row["pairs_checked"]
    assert row["measured"]["tbps"] > 0 and row["predicted"]["kv_bytes"] > 0
    if with_ncu:       # the K/V cache comes from DRAM (ncu flushes the L2 before each kernel)
        assert row["measured"]["dram_read_bytes"] >= row["predicted"]["kv_bytes"]


def test_the_docs_predict_commands_answer():
    """Every ``$ flashsim predict`` line of README.md and docs/decode.md runs (exit 0)."""
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    lines = [ln.split("$ flashsim ", 1)[1].split("#")[0] for doc in ("README.md", "docs/decode.md")
             for ln in (root / doc).read_text().splitlines() if ln.startswith("$ flashsim predict")]
    assert len(lines) >= 3
    for ln in lines:
        code, out, err = call(*shlex.split(ln))
        assert code == 0 and out and err == "", (ln, err)


@pytest.mark.parametrize("kernel,dtype", [("cupy_decode", "bf16"), ("cupy_decode_paged", "fp16")])
def test_device_inputs_are_the_cache_the_launch_reads(monkeypatch, kernel, dtype):
    """``decode.device_inputs`` (measure_decode's and the ncu child's inputs), with NumPy in
    CuPy's place (the same Generator calls): q and a cache of the launch's layout, stored in its
    dtype, that its check reads through the block table."""
    monkeypatch.setattr(decode, "_cupy", lambda: np)
    kw = {"page_size": 16} if kernel.endswith("paged") else {}
    launch = registry.get(kernel).launch(batch=2, heads=8, kv_heads=2, head_dim=64,
                                         kv_lens=[40, 130], q_len=2, dtype=dtype, **kw)
    q, k, v = decode.device_inputs(launch, seed=1)
    cache = (launch.num_pages, 16) if kw else (2, 130)
    assert q.shape == (2, 2, 8, 64) and k.shape == v.shape == cache + (2, 64)
    assert q.dtype == k.dtype == (np.float16 if dtype == "fp16" else np.int16)
    assert launch.cache_shape_ok(k.shape) is None
    assert [r.shape for r in launch.used_rows(k)] == [(40, 2, 64), (130, 2, 64)]
    assert 0.9 < decode.to_float32(k).std() < 1.1 and not np.array_equal(k, v)


def test_measure_passes_a_decode_launch_as_measure_decode_takes_it(monkeypatch):
    """measure_launch's call of gpu_kernels.measure_decode binds to its real signature (on the
    H200 a mismatch made `flashsim measure --all` skip both decode kernels); the fake stops
    right after binding, so no GPU is needed."""
    import inspect

    import gpu_kernels
    from flashsim import cli, measure

    real = inspect.signature(gpu_kernels.measure_decode)

    class Bound(Exception):
        pass

    def fake(*a, **kw):
        raise Bound(real.bind(*a, **kw).arguments)

    monkeypatch.setattr(gpu_kernels, "measure_decode", fake)
    args = cli.build_parser().parse_args(
        ["measure", "--kernel", "cupy_decode_paged", "--kv-len", "32768", "--batch", "8",
         "--heads", "32", "--kv-heads", "8", "-d", "128", "--page-size", "16"])
    (launch,), _ = measure._launches(args)
    with pytest.raises(Bound) as got:
        measure.measure_launch(launch)
    bound = got.value.args[0]
    assert bound["kernel_name"] == "cupy_decode_paged" and bound["options"]["page_size"] == 16
