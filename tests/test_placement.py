"""Registers as a level: where each buffer lives, the two on-chip budgets, the default tiles
they give on the GPU presets, and the paper's two-level model kept by name."""

import itertools
import json

import numpy as np
import pytest

import flashsim
from flashsim import FlashsimError
from flashsim.algorithms import ALGORITHMS, BACKWARD
from flashsim.cli import main
from flashsim.errors import SramOverflowError

ALGS = list(ALGORITHMS)
SHAPES = [(64, 16, 16, 16), (100, 24, 32, 16), (203, 64, 48, 80), (256, 128, 64, 64)]


def _placed(alg, N, d, Br, Bc, causal=False, pass_="fwd", dtype="fp16", passes=()):
    return flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, causal=causal, dtype=dtype,
                         gpu="h200", sram="1MiB", pass_=pass_, extra_passes=passes)


@pytest.mark.parametrize("alg,shape,pass_,dtype", list(itertools.product(
    ALGS, SHAPES, ["fwd", "bwd"], ["fp16", "fp32"])))
def test_placed_peaks_equal_their_formulas(alg, shape, pass_, dtype):
    """The nest's shared and register peaks (walked, counted, and summed from the working
    sets) equal each algorithm's ``placed_bytes`` formula."""
    N, d, Br, Bc = shape
    p = _placed(alg, N, d, Br, Bc, pass_=pass_, dtype=dtype)
    assert p.placement == "registers"
    module = (ALGORITHMS if pass_ == "fwd" else BACKWARD)[alg]
    b = p.elem_bytes
    shared, regs = module.placed_bytes(min(Br, N), min(Bc, N), d, b)
    counted = p.count()
    ws, rs = sum(x for _, x in p.working_set()), sum(x for _, x in p.register_set())
    assert counted.sram_peak_bytes == ws and counted.register_peak_bytes == rs
    assert regs == rs
    if alg == "standard" and pass_ == "fwd":        # kernel 2 holds whole rows (or streams)
        R = p.softmax_rows
        assert ws == max(shared, R * (N * b + 8))
    elif alg == "standard":
        R = module.softmax_bwd_rows(N, p.sram_bytes, b)
        matmul = b * max(Br * Bc + Br * d, Br * d + Bc * d, Br * Bc + Bc * d)
        assert ws == max(matmul, R * (2 * N * b + 4) if R else shared)
    else:
        assert ws == shared


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
def test_values_and_counts_agree_on_both_levels(alg, causal):
    rng = np.random.default_rng(3)
    Q, K, V, dO = (rng.standard_normal((2, 70, 8)) for _ in range(4))
    p = flashsim.plan(alg, 70, 8, batch=2, block_rows=16, block_cols=24, causal=causal,
                      gpu="h200", pass_="fwd+bwd")
    _, ran = p.run(Q, K, V, dO=dO)
    counted, formula = p.count(), p.closed_form()
    assert ran.sram_peak_bytes == counted.sram_peak_bytes == formula.sram_peak_bytes
    assert ran.register_peak_bytes == counted.register_peak_bytes \
        == formula.register_peak_bytes > 0
    # the same traffic as the two-level model with the same tiles: placement moves no byte
    two = flashsim.plan(alg, 70, 8, batch=2, block_rows=16, block_cols=24, causal=causal,
                        gpu="h200", pass_="fwd+bwd", placement="two-level")
    assert two.count().per_tensor == counted.per_tensor
    assert two.count().register_peak_bytes == 0


def test_trace_says_where_each_buffer_lives():
    levels = {r["buf"]: r["level"] for r in _placed("flash2", 64, 16, 32, 32).trace()
              if r["op"] in ("load", "alloc")}
    assert levels == {"Q_i": "smem", "K_j": "smem", "V_j": "smem", "O_i": "registers",
                      "m_i": "registers", "l_i": "registers", "S_ij": "registers",
                      "L_i": "registers"}
    two = flashsim.plan("flash2", 64, 16, sram="64KiB").trace()
    assert {r["level"] for r in two if r["op"] in ("load", "alloc")} == {"smem"}
    # an fp32 accumulator of fp16 data takes 4 bytes an element in registers
    o = next(r for r in _placed("flash2", 64, 16, 32, 32).trace() if r["buf"] == "O_i")
    assert o["bytes"] == 32 * 16 * 4


# ------------------------------------------------------------------ the default tiles

REAL = {128: (128, 64), 64: (128, 128)}     # FlashAttention-2's forward tiles, fp16, sm80/90


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("d", [64, 128])
def test_default_tiles_are_the_real_kernels_within_a_factor_of_two(gpu, d):
    p = flashsim.plan("flash2", 4096, d, dtype="fp16", gpu=gpu)
    for got, real in zip((p.block_rows, p.block_cols), REAL[d]):
        assert real / 2 <= got <= real * 2, (p.block_rows, p.block_cols)
    g = flashsim.GPUS[gpu]
    shared, regs = ALGORITHMS["flash2"].placed_bytes(p.block_rows, p.block_cols, d, 2)
    assert shared <= g.sram_per_block and regs <= g.register_bytes_per_block
    # the largest multiple of 16: 16 more overflows the registers (not shared memory)
    B = p.block_rows + 16
    shared, regs = ALGORITHMS["flash2"].placed_bytes(B, B, d, 2)
    assert regs > g.register_bytes_per_block and shared <= g.sram_per_block
    # the paper's two-level rule on the same preset fills 227 KiB with everything
    two = flashsim.plan("flash2", 4096, d, dtype="fp16", gpu=gpu, placement="two-level")
    assert two.block_rows > 1.3 * p.block_rows


def test_register_budget_from_the_preset():
    g = flashsim.GPUS["h200"]
    assert g.register_bytes_per_block == 4 * 32 * 255 * 4 == 130560
    assert g.register_bytes_per_sm == 65536 * 4
    for key, x in flashsim.GPUS.items():
        assert x.register_source and x.l1_shared_per_sm >= x.sram_per_sm > x.sram_per_block
    # the paper's "192 KB of SRAM per SM" on an A100 is its L1 + shared memory, and its
    # "about 20 MB" that over 108 SMs
    a100 = flashsim.GPUS["a100-80gb"]
    assert a100.l1_shared_per_sm == 192 * 1024
    assert 20e6 < a100.sms * a100.l1_shared_per_sm < 21.5e6


def test_overflow_of_either_level_is_refused_with_the_breakdown():
    with pytest.raises(SramOverflowError) as e:
        flashsim.plan("flash2", 4096, 128, dtype="fp16", gpu="h200", block_rows=128,
                      block_cols=128)
    msg = str(e.value)
    assert "registers" in msg and "O_i 65536" in msg and "S_ij 65536" in msg
    assert "shared memory" not in msg                # that level fits
    with pytest.raises(SramOverflowError) as e:
        flashsim.plan("flash2", 4096, 128, dtype="fp16", gpu="h200", sram="32KiB",
                      block_rows=64, block_cols=64)
    assert "shared memory" in str(e.value) and "K_j 16384" in str(e.value)
    # the tiles of FlashAttention-2's d = 128 kernel fit both levels; the two-level model
    # takes them too, since its one budget is M = 227 KiB
    ok = flashsim.plan("flash2", 4096, 128, dtype="fp16", gpu="h200", block_rows=128,
                       block_cols=64).count()
    assert ok.register_peak_bytes == 4 * (128 * 64 + 128 * 128) + 8 * 128


def test_placement_names_and_defaults():
    assert flashsim.plan("flash2", 256, 64).placement == "registers"          # default preset
    assert flashsim.plan("flash2", 256, 64, gpu="h100", sram="100KiB").placement == "registers"
    assert flashsim.plan("flash2", 256, 64, sram="100KiB").placement == "two-level"
    with pytest.raises(FlashsimError, match="GPU preset"):
        flashsim.plan("flash2", 256, 64, sram="100KiB", placement="registers")
    with pytest.raises(FlashsimError, match="placement"):
        flashsim.plan("flash2", 256, 64, placement="l1")


def test_theorem2_on_the_two_level_rule_by_name():
    """The paper's rule, asked for by name on a GPU preset: doubling M halves flash1's
    traffic (Theorem 2's 1/M), and the tiles are the module's own rule."""
    def f1(m):
        p = flashsim.plan("flash1", 16384, 64, dtype="fp16", gpu="h200", sram=m,
                          placement="two-level")
        assert (p.block_rows, p.block_cols) == ALGORITHMS["flash1"].default_blocks(
            16384, 64, p.sram_bytes, 2)
        return p.count().requested_bytes
    ratio = f1(256 * 1024) / f1(128 * 1024)
    assert 0.45 < ratio < 0.6


def test_l2_blocks_per_sm_follow_both_levels():
    from flashsim.hardware import l2
    p = flashsim.plan("flash2", 2048, 128, dtype="fp16", gpu="h200")
    rep = l2.simulate(p)
    g = p.gpu
    assert rep.blocks_per_sm == min(g.sram_per_sm // p.count().sram_peak_bytes,
                                    g.register_bytes_per_sm // p.count().register_peak_bytes)


# ------------------------------------------------------------------ the CLI

def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("d", [128, 64])
def test_cli_json_reports_both_peaks_and_real_tiles(capsys, d):
    out = _json(capsys, "io", "-a", "flash2", "-N", "4096", "-d", str(d), "--dtype", "fp16",
                "--gpu", "h200", "--json")
    assert out["placement"] == "registers"
    for got, real in zip((out["block_rows"], out["block_cols"]), REAL[d]):
        assert real / 2 <= got <= real * 2
    assert 0 < out["smem_peak_bytes"] <= out["sram_bytes"]
    assert 0 < out["register_peak_bytes"] <= out["register_budget_bytes"] == 130560
    # named for what they are, with the L2 model's DRAM bytes beside
    assert out["requested_bytes"] == out["hbm_bytes"]
    assert out["dram_bytes"] < out["requested_bytes"]
    two = _json(capsys, "io", "-a", "flash2", "-N", "4096", "-d", str(d), "--dtype", "fp16",
                "--gpu", "h200", "--placement", "two-level", "--json")
    assert two["placement"] == "two-level" and two["register_peak_bytes"] == 0
    assert two["smem_peak_bytes"] == two["sram_peak_bytes"] <= two["sram_bytes"]
