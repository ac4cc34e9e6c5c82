"""The decode kernel (gpu_kernels/cuda/decode.cu, loaded by gpu_kernels/cupy/decode.py).

Without a GPU: every variant CI registers compiles for sm_90 (NVRTC through cuda.core) with
its registers, shared memory and spills printed into the log; no spills, shared memory within
the opt-in limit and equal to the loader's formula; the header lists the versions; the split
heuristic is FlashAttention's rule; every launch covers its rows, keys and splits; bad input
raises KernelInputError (one line) before anything touches a GPU; the correctness rule fails
a wrong output; and both kernels, emulated statement for statement in NumPy on the launch's
own argument tuples (grid, layouts, block table, split ranges, masks, merges, combine), match
the float64 reference.

On a GPU (``@pytest.mark.gpu``): ragged batches, contiguous and paged caches (page sizes
1, 16, 64 and one that divides nothing), q_len 1 to 16 under the causal mask, GQA groups
1, 4, 8, 32, one split and several, fp16 and bf16, d = 64 and 128: O within flash-attention's
rule of the float64 reference (2 x a plain same-dtype implementation's error), L within
1e-3 + 1e-5 |L|; outputs fully written; NaN in the cache refused with nothing written.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

import flashsim
import gpu_kernels
from flashsim.algorithms import flashdecoding
from flashsim.units import cdiv
from gpu_kernels import KernelInputError, registry
from gpu_kernels.cupy import decode
from gpu_kernels.cupy.common import KERNEL_DIR, read_source
from gpu_kernels.harness import round_to

# ------------------------------------------------------------------ compile checks (no GPU)


@pytest.fixture(scope="module")
def resources(request):
    pytest.importorskip("cuda.core")
    from gpu_kernels import compile as cuda_compile

    rows = []
    for cu_file, defines, dyn, _hot in decode.compile_variants():
        rows.extend(cuda_compile.compile_variant(cu_file, defines, dyn))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + cuda_compile.format_table(rows))
    return rows


def test_every_variant_compiles_for_sm90(resources):
    variants = decode.compile_variants()
    assert len(resources) == 2 * len(variants)           # decode_split and decode_combine each
    assert {r.kernel for r in resources} == set(decode.HOT)
    pages = {int(re.search(r"PAGE_SIZE=(\d+)", r.variant).group(1)) for r in resources}
    assert pages == set(decode.COMPILED_PAGE_SIZES)
    assert all(r.registers > 0 for r in resources)


def test_no_spills_and_shared_memory_within_limits(resources):
    from gpu_kernels.compile import SMEM_LIMIT_OPTIN

    for r in resources:
        assert not r.spills and r.stack_frame == 0, r
        # the variant's dynamic shared memory is decode_split's; decode_combine launches without
        assert (r.smem if r.kernel == "decode_split" else r.static_smem) <= SMEM_LIMIT_OPTIN, r
        # static shared memory: v3's combine, its weights w_s[MAX_SPLITS], the warps' partial
        # rows part[4][d] and red[4] (fp32); v4's, part[4][d] and each warp's max and sum
        # (red_m[4], red_l[4]); each plus at most 128 bytes of alignment; v9's decode_split,
        # its STAGES mbarriers (configure counts MBARRIER_SMEM); none elsewhere
        d = int(re.search(r"HEAD_DIM=(\d+)", r.variant).group(1))
        combine = r.kernel == "decode_combine" and re.search(r"COMBINE=([34])\b", r.variant)
        tma = r.kernel == "decode_split" and "TMA=1" in r.variant
        words = (decode.MAX_SPLITS + 4 * d + 4 if combine.group(1) == "3" else 4 * d + 8) if combine else 0
        want = ((4 * words, 4 * words + 128) if combine else (8 * decode.WGMMA_TILES[1], decode.MBARRIER_SMEM)
                if tma else (0, 0))
        assert want[0] <= r.static_smem <= want[1], r


def test_wgmma_is_not_serialized():
    """ptxas serializes a kernel's wgmma (its notes C7514, C7515, C7518: "wgmma.mma_async
    instructions are serialized") where other instructions may touch the accumulators before
    the wait: v11's softmax beside P V would then run after it. (It did, with the ping-pong's
    arrive placed after P V's issue; v23's first draft, its S waited for across the loop's back
    edge, drew C7515.)"""
    pytest.importorskip("cuda.core")
    from gpu_kernels import compile as cuda_compile

    src = read_source("decode.cu")
    logs = {cuda_compile.variant_label(defs): cuda_compile.ptxas_log(
                src, defs, arch=cuda_compile.arch_for(f, defs), name=f)
            for f, defs, _, _ in decode.compile_variants() if defs["WGMMA"]}
    assert any("OVERLAP=1" in v for v in logs) and any("TURN_PV=1" in v for v in logs)
    assert [v for v, log in logs.items() if "are serialized" in log] == []


def register_blocks(r, threads: int) -> int:
    """Blocks of ``threads`` that the registers ptxas gave kernel ``r`` let share an SM, by
    flashsim.predict.occupancy (the rule Nsight Compute's occupancy limits are held to)."""
    from flashsim.hardware.presets import gpu
    from flashsim.predict import occupancy

    return occupancy(threads, r.registers, 0, gpu("h200"))["limits"]["registers"]


def test_resident_blocks_are_what_the_split_heuristic_counts(resources):
    """The split heuristic counts blocks_per_sm resident blocks: the registers ptxas gave
    (``register_blocks``; NUM_WARPS warps a block) must allow that many, and
    two fit an SM in the default configuration at d = 128."""
    for r in resources:
        if r.kernel != "decode_split":
            continue
        d = int(re.search(r"HEAD_DIM=(\d+)", r.variant).group(1))
        w = int(re.search(r"NUM_WARPS=(\d+)", r.variant).group(1))
        wg = int(re.search(r"WGMMA=(\d+)", r.variant).group(1))
        assert decode.blocks_per_sm(r.dynamic_smem, d, w, wg) <= register_blocks(r, 32 * w), r
        if d == 128 and f"BLOCK_C={decode.BLOCK_C} STAGES={decode.STAGES[128]} NUM_WARPS=4" in r.variant:
            assert decode.blocks_per_sm(r.dynamic_smem, d) == 2, r


def test_the_one_round_combine_shares_an_sm_with_as_many_blocks_as_v3(resources):
    """decode_combine v4 holds its loads in registers; bounded, as many of its 128-thread
    blocks fit an SM as of v3's at the same d (a first build without the bound fitted half)."""
    for d in decode.HEAD_DIMS:
        combines = [r for r in resources if r.kernel == "decode_combine" and f"HEAD_DIM={d} " in r.variant]
        v3 = [register_blocks(r, decode.COMBINE_THREADS) for r in combines if "COMBINE=3" in r.variant]
        v4 = [register_blocks(r, decode.COMBINE_THREADS) for r in combines if "COMBINE=4" in r.variant]
        assert v3 and v4 and min(v4) >= min(v3), (d, v3, v4)


def test_smem_formula_is_the_kernels():
    src = read_source("decode.cu")
    assert "#define SMEM_BYTES ((BLOCK_R * HEAD_DIM + 2 * STAGES * KV_TILE_ELEMS) * 2)" in src
    assert "#define BLOCK_R (16 * ROW_WARPS)" in src and "#define KV_TILE_ELEMS (BLOCK_C * HEAD_DIM)" in src
    for d in decode.HEAD_DIMS:
        for rw in (1, 2, 4):
            assert decode.smem_bytes(d, rw) == (16 * rw * d + 2 * decode.STAGES[d] * decode.BLOCK_C * d) * 2


def test_file_compiles_alone_and_lists_its_versions():
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_cubin

    src = read_source("decode.cu")
    cubin, _ = compile_cubin(src, {}, name="decode.cu")
    for name in decode.HOT:
        assert name.encode() in cubin
    header = src.split("#ifndef")[0]
    assert [int(v) for v in re.findall(r"\(v(\d+)\)", header)] == list(decode.VERSIONS)
    for word in ("m_i", "l_i", "alpha", "B_c", "B_r"):
        assert word in header, word


def test_includes_common_and_repeats_none_of_it():
    common = open(f"{KERNEL_DIR}/common.cuh").read()
    helpers = set(re.findall(r"__device__ __forceinline__ \w+\s+(\w+)\(", common))
    raw = open(f"{KERNEL_DIR}/decode.cu").read()
    assert '#include "common.cuh"' in raw
    assert not set(re.findall(r"__device__ __forceinline__ \w+\s+(\w+)\(", raw)) & helpers


# ------------------------------------------------------------------ the launch (no GPU)

@pytest.mark.parametrize("blocks", [1, 8, 29, 64, 66, 67, 200, 2048])
@pytest.mark.parametrize("n_tiles", [1, 7, 64, 512, 2048])
def test_one_wave_splits_are_the_fewest_with_the_shortest_longest_split(blocks, n_tiles):
    """v4's rule against a brute force: among the split counts whose blocks fit one wave of
    the slots (and at most one split per tile; 1 always qualifies), the shortest longest
    split ceil(n_tiles / S), and of those the fewest splits."""
    slots = 132
    fits = [x for x in range(1, decode.MAX_SPLITS + 1)
            if x == 1 or (blocks * x <= slots and x <= n_tiles)]
    longest = min(cdiv(n_tiles, x) for x in fits)
    assert decode.one_wave_splits(blocks, slots, n_tiles) == min(
        x for x in fits if cdiv(n_tiles, x) == longest)


def test_split_rules_at_one_kv_head_group_per_sm():
    """B = 1, kv_heads 8, 32k keys, 4 stages (one block per SM): FlashAttention-2's rule
    (flashsim's, the "fa2" rule) takes 14 splits, 37 tiles in the longest; the wave rule and
    the default "sm" rule 16 splits of 32 tiles; a given count is kept."""
    assert decode.SPLIT_RULES["fa2"] is flashdecoding.num_splits_heuristic
    kw = dict(kv_lens=[32768], stages=4)
    assert decode.configure(1, 32, 8, 128, **kw, split_rule="fa2").splits == 14
    assert decode.configure(1, 32, 8, 128, **kw, split_rule="wave").splits == 16
    default = decode.configure(1, 32, 8, 128, **kw)
    assert (default.splits, default.split_rule) == (16, "sm")
    given = decode.configure(1, 32, 8, 128, **kw, splits=5)
    assert (given.splits, given.split_rule) == (5, "given")
    with pytest.raises(KernelInputError, match="split_rule"):
        decode.configure(1, 32, 8, 128, **kw, split_rule="FA2 ")


@pytest.mark.parametrize("B,kvh,n,wave,sm", [(1, 8, 32768, 32, 16), (1, 8, 4096, 32, 16),
                                            (1, 32, 32768, 8, 4), (8, 8, 32768, 4, 2),
                                            (8, 32, 32768, 1, 1), (64, 8, 4096, 1, 1)])
def test_sm_rule_fills_each_sm_once(B, kvh, n, wave, sm):
    """At 3 stages two 4-warp blocks fit an SM (decode.blocks_per_sm): the wave rule fills both
    slots, the default "sm" rule (v8) one block per SM, half the splits; where the (sequence,
    KV head) blocks alone fill half the SMs, both take 1. The splits' blocks fit the SMs."""
    kw = dict(kv_lens=[n] * B, stages=3)
    assert decode.blocks_per_sm(decode.smem_bytes(128, 1, 64, 3), 128, 4) == 2
    assert decode.configure(B, 32, kvh, 128, **kw, split_rule="wave").splits == wave
    launch = decode.configure(B, 32, kvh, 128, **kw)
    assert (launch.splits, launch.split_rule) == (sm, "sm")
    assert launch.splits == 1 or B * kvh * launch.splits <= 132


@pytest.mark.parametrize("B,kvh,n,wave,sm", [(1, 8, 32768, 32, 16), (8, 8, 32768, 4, 2),
                                            (1, 32, 4096, 8, 4), (64, 8, 4096, 1, 1)])
@pytest.mark.parametrize("P", [1, 16, 64])
def test_paged_cache_takes_the_wave_rule(B, kvh, n, wave, sm, P):
    """Over a paged cache the defaults (v12) fill both resident slots of an SM, the wave rule,
    where a contiguous cache keeps the "sm" rule's one block an SM; a rule given is kept."""
    bt = np.arange(B * cdiv(n, P), dtype=np.int32).reshape(B, -1)
    paged = dict(kv_lens=[n] * B, page_size=P, block_table=bt, num_pages=bt.size)
    launch = decode.configure(B, 32, kvh, 128, **paged)
    assert (launch.splits, launch.split_rule) == (wave, "wave")
    assert decode.configure(B, 32, kvh, 128, kv_lens=[n] * B).splits == sm
    assert decode.configure(B, 32, kvh, 128, **paged, split_rule="sm").splits == sm
    assert decode.default_version(P) == "v12" and decode.default_version(0) == "v26"


@pytest.mark.parametrize("q_len", [1, 4, 16])
@pytest.mark.parametrize("kv_heads", [32, 8, 4, 1])
def test_launch_covers_every_row_once(q_len, kv_heads):
    """Row chunks x 16 ROW_WARPS rows cover q_len x group packed rows, with less than one
    chunk to spare; the grid is (chunks, splits, B kv_heads); the combine launch runs iff
    1 < splits <= 32 (above 32, in one wave, the splits merge in decode_split, v7); from 32 rows v5
    (wgmma: 1 KiB more shared memory), one warpgroup's 64-row blocks up to 64 rows, 8 warps'
    128-row blocks above."""
    launch = decode.configure(3, 32, kv_heads, 128, kv_lens=[100, 5000, 70000], q_len=q_len)
    rows = q_len * 32 // kv_heads
    assert launch.rows == rows and launch.block_rows == 16 * launch.row_warps
    assert launch.chunks * launch.block_rows >= rows > (launch.chunks - 1) * launch.block_rows
    assert launch.wgmma == (rows >= 32)
    assert decode.default_variant(rows) == ("v5" if rows > 64 else "v5_w4" if rows >= 32 else "v4")
    assert launch.warps == (8 if rows > 64 else 4)
    assert launch.row_warps == (1 if rows <= 16 else 2 if rows < 32 else 4 if rows <= 64 else 8)
    split, *combine = launch.launches()
    assert split.grid == (launch.chunks, launch.splits, 3 * kv_heads)
    assert split.threads == 32 * launch.warps + (128 if launch.producer else 0)   # v17's producer
    assert launch.producer == (rows > 64 and launch.tma and not launch.fused)
    wgmma_tiles = (decode.WGMMA_TILES[0], decode.TURN_PV_STAGES if launch.turn_pv else decode.WGMMA_TILES[1])
    assert (launch.block_cols, launch.stages) == (wgmma_tiles if launch.wgmma else (64, 3))   # v23: 3 stages
    assert split.dynamic_smem == decode.smem_bytes(128, launch.row_warps, launch.block_cols,
                                                   launch.stages, launch.wgmma)
    assert len(combine) == (1 < launch.splits <= 32) and launch.fused == (launch.splits > 32)
    for s in (1, 5, 40):
        one = decode.configure(3, 32, kv_heads, 128, kv_lens=[100, 5000, 70000], q_len=q_len, splits=s)
        fits = 3 * kv_heads * one.chunks * s <= 132 * decode.blocks_per_sm(
            one.dynamic_smem, 128, one.warps, one.wgmma)
        assert one.splits == s and one.fused == (s > 32 and fits)
        assert len(one.launches()) == (2 if s > 1 and not one.fused else 1)


def test_kernel_split_ranges_cover_every_tile_once():
    """The kernel's balanced split of T_c tiles (t_begin = s T_c / S): every tile in exactly one
    split, in order, for any T_c and S (empty splits where T_c < S)."""
    for T_c in (1, 2, 7, 64, 513):
        for S in (1, 2, 3, 29, 128):
            ranges = [(s * T_c // S, (s + 1) * T_c // S) for s in range(S)]
            assert [t for a, b in ranges for t in range(a, b)] == list(range(T_c))
    src = read_source("decode.cu")
    assert "t_begin = (int)((long long)split * T_c / num_splits)" in src
    assert "t_end = (int)((long long)(split + 1) * T_c / num_splits)" in src


def test_registry_entries():
    contiguous, paged = registry.get("cupy_decode"), registry.get("cupy_decode_paged")
    assert (contiguous.algorithm, paged.algorithm) == ("flashdecoding", "paged")
    bt = np.arange(8).reshape(2, 4)
    lp = paged.launch(batch=2, heads=8, kv_heads=2, head_dim=64, kv_lens=[60, 64], page_size=16,
                      block_table=bt, num_pages=8)
    assert lp.kernel == "cupy_decode_paged" and lp.defines()["PAGE_SIZE"] == 16
    lc = contiguous.launch(batch=2, heads=8, kv_heads=2, head_dim=64, kv_lens=[60, 64])
    assert lc.defines()["PAGE_SIZE"] == 0 and lc.kv_bytes == 2 * (60 + 64) * 2 * 64 * 2
    _refused(paged.launch, batch=2, heads=8, kv_heads=2, head_dim=64, kv_lens=[6, 6], match="page_size")
    _refused(contiguous.launch, batch=2, heads=8, kv_heads=2, head_dim=64, kv_lens=[6, 6],
             page_size=16, block_table=bt, num_pages=8, match="contiguous")
    _refused(registry.get, "cupy_decode9", match="no kernel")


PLANNED = [
    # B, H, kv_heads, kv_lens, q_len, page, variant (decode.VARIANTS), splits
    (8, 32, 8, [32768] * 8, 1, 0, "v2", None),
    (1, 32, 1, [32768], 4, 0, "v2", None),              # 128 rows, one 8-warp block
    (1, 32, 1, [32768], 4, 0, "v1", None),              # 128 rows, two 64-row chunks
    (2, 16, 1, [65, 300], 16, 0, "v2", 3),              # 256 rows: chunks of 128, causal edge
    (3, 32, 4, [100, 3000, 70000], 1, 16, "v2", None),  # ragged, paged
    (2, 32, 32, [513, 77], 1, 1, "v1", 4),
    (2, 32, 8, [129, 4000], 4, 64, "v2_w8", None),
]


@pytest.mark.parametrize("B,H,kvh,lens,q_len,page,variant,splits", PLANNED, ids=str)
def test_plan_is_flashsims_for_exactly_this_launch(B, H, kvh, lens, q_len, page, variant, splits):
    """launch.plan() is flashsim's plan of the same step: the same algorithm, B_c, splits,
    B_r (the rows a block computes) and page size, and the plan's K/V bytes equal the bytes
    decode_split's index arithmetic reads (kv_bytes_read; with chunks, once per chunk)."""
    name = "cupy_decode_paged" if page else "cupy_decode"
    kw = {}
    if page:
        need = sum(-(-n // page) for n in lens)
        bt = np.random.default_rng(0).permutation(need + 5)[:need]
        table = np.full((B, max(-(-n // page) for n in lens)), -1, np.int32)
        i = 0
        for b, n in enumerate(lens):
            table[b, :-(-n // page)] = bt[i:i + -(-n // page)]
            i += -(-n // page)
        kw = dict(page_size=page, block_table=table, num_pages=need + 5)
    launch = registry.get(name).launch(batch=B, heads=H, kv_heads=kvh, head_dim=128, kv_lens=lens,
                                       q_len=q_len, splits=splits, **kw, **decode.VARIANTS[variant])
    plan = launch.plan()
    assert plan.algorithm == launch.algorithm == ("paged" if page else "flashdecoding")
    assert (plan.block_cols, plan.splits, plan.block_rows) == (launch.block_cols, launch.splits,
                                                               launch.plan_block_rows)
    assert plan.page_size == (page or None) and plan.kv_lens == tuple(lens)
    assert plan.group_rows // plan.block_rows == launch.chunks
    assert plan.count().kv_bytes == launch.kv_bytes_read()
    assert launch.kv_bytes_read() >= launch.kv_bytes
    assert (launch.kv_bytes_read() == launch.kv_bytes) == (launch.chunks == 1)


def test_registry_launch_takes_the_plans_names():
    """registry.get('cupy_decode').launch(...) in flashsim.plan's decode names, kv_len for a
    uniform batch; one clear error for both or neither of kv_len, kv_lens."""
    entry = registry.get("cupy_decode")
    a = entry.launch(batch=8, heads=32, kv_heads=8, head_dim=128, kv_len=32768, dtype="bf16")
    b = decode.configure(8, 32, 8, 128, kv_lens=[32768] * 8, dtype="bf16")
    assert a.defines() == b.defines() and a.launches() == b.launches() and a.kv_lens == b.kv_lens
    assert entry.launch(batch=2, heads=4, head_dim=64, kv_len=10).kv_heads == 4
    _refused(entry.launch, batch=2, heads=4, head_dim=64, match="kv_len")
    _refused(entry.launch, batch=2, heads=4, head_dim=64, kv_len=5, kv_lens=[5, 5], match="both")
    _refused(entry.launch, batch=2, heads=4, head_dim=64, kv_len=5, dtype="fp32", match="fp32")
    _refused(entry.launch, batch=2, heads=4, head_dim=64, kv_len=5, warps=6, match="warps")
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[100], q_len=4, stages=2, wgmma=0, warps=8,
             match="merge")
    assert decode.configure(1, 32, 1, 128, kv_lens=[100], q_len=4, stages=2).wgmma == 1  # no merge
    assert decode.configure(1, 32, 1, 128, kv_lens=[100], q_len=4).arch() == decode.WGMMA_ARCH
    assert decode.configure(1, 32, 8, 128, kv_lens=[100], q_len=4).arch() is None     # CuPy's
    w4 = decode.configure(1, 32, 1, 128, kv_lens=[100], q_len=1, wgmma=1, warps=4)
    assert (w4.row_warps, w4.block_rows, w4.chunks, w4.launches()[0].threads) == (4, 64, 1, 128)
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[100], q_len=4, wgmma=True, match="wgmma")
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[100], q_len=4, wgmma=1, block_cols=32,
             match="64 or 128")
    assert decode.configure(1, 32, 1, 128, kv_lens=[100], q_len=4, stages=2, warps=4).stages == 2
    for q_len in (1, 2):                 # 32, 64 rows on mma.sync: 8 warps' merge needs 3 stages
        kw = dict(kv_lens=[100], q_len=q_len, wgmma=0)
        two = decode.configure(1, 32, 1, 128, stages=2, **kw)
        assert (two.warps, decode.configure(1, 32, 1, 128, **kw).warps) == (4, 8)
    _refused(decode.configure(1, 8, 1, 128, kv_lens=[100], page_size=48, block_table=[[0, 1, 2]],
                              num_pages=3).plan, match="page_size")


def test_fused_merge_only_where_the_grid_is_one_wave():
    """v7 waits for other blocks, so it runs only where the whole grid is resident: fused=None
    takes it there (and drops the combine launch), keeps v6's launch elsewhere, and fused=1
    beyond one wave is refused before any launch."""
    v7 = decode.VARIANTS["v7"]
    one = decode.configure(1, 32, 8, 128, kv_lens=[32768], **v7)
    assert (one.fused, one.pdl, [k.kernel for k in one.launches()]) == (1, 0, ["decode_split"])
    assert one.defines()["FUSED"] == 1 and one.splits * 8 <= 132 * 2
    assert one.plan().fused_combine and not decode.configure(1, 32, 8, 128, kv_lens=[32768]).fused
    assert decode.configure(64, 32, 8, 128, kv_lens=[4096] * 64, **v7).fused == 0   # no splits
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[32768], splits=128, fused=1, match="one wave")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[32768], fused=True, match="fused")
    for kvh, ql, n in ((1, 1, 32768), (1, 1, 4096), (1, 4, 32768), (8, 4, 32768), (8, 1, 131072),
                       (32, 1, 32768)):                  # the defaults: v7 above 32 splits
        d = decode.configure(1, 32, kvh, 128, kv_lens=[n], q_len=ql)
        assert d.fused == (d.splits > 32) == bool(decode.default_fused(d.splits)), (kvh, ql, n)
        assert d.pdl == (not d.fused) and d.splits > 1
    many = decode.configure(1, 32, 1, 128, kv_lens=[32768], splits=128, block_cols=64, stages=4,
                            wgmma=1, warps=4, sm_count=64)          # 128 blocks > 64 SMs x 1
    assert (many.fused, many.pdl, len(many.launches())) == (0, 1, 2)


def test_kv_lens_by_value_where_v18_takes_it():
    """v18: the kv_lens by value (KV_LENS_ARG) by default over a contiguous cache of at most
    KV_LENS_MAX sequences, as a structured one-element array the kernel reads as KvLens; not on
    pages (v12) nor beyond the parameter's slots; v17 and earlier read them from memory."""
    lens = [37, 300, 129]
    d = decode.configure(3, 32, 8, 128, kv_lens=lens)
    assert d.kv_lens_arg == 1 and d.defines()["KV_LENS_ARG"] == 1
    v = decode.kv_lens_value(d.kv_lens)
    assert v.shape == (1,) and v.nbytes == 4 * decode.KV_LENS_MAX
    assert v["n"][0][:3].tolist() == lens and not v["n"][0][3:].any()
    paged = decode.configure(1, 32, 8, 128, kv_lens=[20], page_size=16, block_table=[[0, 1]], num_pages=2)
    assert paged.kv_lens_arg == 0 and "KV_LENS_ARG" not in paged.defines()
    big = decode.KV_LENS_MAX + 1
    assert decode.configure(big, 32, 8, 128, kv_lens=[20] * big).kv_lens_arg == 0
    _refused(decode.configure, big, 32, 8, 128, kv_lens=[20] * big, kv_lens_arg=1, match="kv_lens_arg")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], kv_lens_arg=2, match="kv_lens_arg")
    for name, kw in decode.VARIANTS.items():
        want = 1 if name in ("v18", "v21", "v23", "v26") else 0
        assert decode.configure(3, 32, 8, 128, kv_lens=lens, **kw).kv_lens_arg == want, name


def test_stagger_needs_the_producer():
    """v19 (STAGGER): an option of v17's producer, off by default, refused without it."""
    d = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, stagger=1)
    assert (d.producer, d.stagger, d.defines()["STAGGER"]) == (1, 1, 1)
    assert decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4).stagger == 0
    _refused(decode.configure, 8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, stagger=1, producer=0,
             match="stagger")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], stagger=1, match="stagger")      # mma.sync
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], q_len=4, stagger=2, match="stagger")


def test_q_first_where_v21_takes_it():
    """v21 (QFIRST): the defaults on wgmma over a contiguous cache (one warpgroup and two, with
    v7's merge too), not on pages (v12) nor on mma.sync, where asking for it is refused; v1-v18
    keep Q_i's loads after the tiles'."""
    for kvh, ql, kw in ((1, 4, {}), (1, 1, {}), (1, 4, dict(fused=1, splits=4))):
        d = decode.configure(8, 32, kvh, 128, kv_lens=[32768] * 8, q_len=ql, **kw)
        assert (d.wgmma, d.q_first, d.defines()["QFIRST"]) == (1, 1, 1), (kvh, ql, kw)
    paged = decode.configure(1, 32, 1, 128, kv_lens=[20], q_len=4, page_size=16, block_table=[[0, 1]],
                             num_pages=2)
    assert (paged.wgmma, paged.q_first) == (1, 0) and "QFIRST" not in paged.defines()
    assert decode.configure(1, 32, 1, 128, kv_lens=[20], q_len=4, page_size=16, block_table=[[0, 1]],
                            num_pages=2, q_first=1).q_first == 1
    assert decode.configure(8, 32, 8, 128, kv_lens=[32768] * 8).q_first == 0           # mma.sync
    for name, kw in decode.VARIANTS.items():
        want = 1 if name in ("v21", "v23", "v26") else 0
        assert decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, **kw).q_first == want, name
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], q_first=1, match="q_first")      # mma.sync
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], q_first=2, match="q_first")


def test_pingpong_with_the_producer():
    """v22: v17's producer with strict ping-pong turns (PINGPONG beside PRODUCER), asked for;
    the defaults keep the ping-pong off beside the producer, pingpong alone keeps v9."""
    d = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, producer=1, pingpong=1)
    assert (d.producer, d.pingpong, d.defines()["PRODUCER"], d.defines()["PINGPONG"]) == (1, 1, 1, 1)
    assert decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4).pingpong == 0
    v9 = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, pingpong=1)
    assert (v9.producer, v9.pingpong) == (0, 1)
    _refused(decode.configure, 8, 32, 1, 128, kv_lens=[32768] * 8, q_len=1, producer=1, pingpong=1,
             match="pingpong")                                         # one warpgroup


def test_turn_pv_where_v23_takes_it():
    """v23 (TURN_PV, 3 stages, the ping-pong on): the defaults where the producer feeds two
    warpgroups more than TURN_PV_MIN_TILES tiles a split (B 64 MQA at 32k: 128; B 8 at 36k: 18),
    not at 16 (B 8 at 32k), one warpgroup, pages or v7's merge (B 1: 128 splits), nor where
    stages or the ping-pong are given; asked for, it runs at 2 stages too, beside the producer's
    ping-pong only (v24 with v20's overlap). Of VARIANTS only v23 and v26 take it (v26's one
    warpgroup chunks pinned off here: their own test)."""
    mqa4 = dict(heads=32, kv_heads=1, head_dim=128, q_len=4)
    for B, n, want in ((64, 32768, 1), (8, 36864, 1), (8, 32768, 0), (1, 131072, 0), (8, 2048, 0)):
        d = decode.configure(B, **mqa4, kv_lens=[n] * B, short_chunks=0)
        tiles = cdiv(cdiv(n, d.block_cols), d.splits)
        assert (tiles > decode.TURN_PV_MIN_TILES and d.producer) == bool(want), (B, n)
        assert (d.turn_pv, d.pingpong, d.stages) == ((1, 1, 3) if want else (0, 0 if d.producer else 1, 2)), (B, n)
        assert d.defines().get("TURN_PV", 0) == want and d.defines()["STAGES"] == d.stages
        assert d.dynamic_smem == decode.smem_bytes(128, 8, 128, d.stages, wgmma=1) <= decode.SHARED_OPTIN
    pages = dict(page_size=16, block_table=np.arange(64 * 2048).reshape(64, 2048), num_pages=64 * 2048)
    for kw in (dict(q_len=1), dict(stages=2), dict(pingpong=0), pages):
        d = decode.configure(64, 32, 1, 128, kv_lens=[32768] * 64, **{"q_len": 4, **kw})
        assert d.turn_pv == 0 and "TURN_PV" not in d.defines(), kw
    two = decode.configure(64, **mqa4, kv_lens=[32768] * 64, producer=1, pingpong=1, turn_pv=1, stages=2)
    assert (two.turn_pv, two.stages, two.producer) == (1, 2, 1)
    v24 = decode.configure(64, **mqa4, kv_lens=[32768] * 64, producer=1, pingpong=1, turn_pv=1, overlap=1,
                           stages=3)                              # v24: the turns with v20's overlap
    assert {k: v24.defines()[k] for k in ("TURN_PV", "OVERLAP", "PINGPONG", "PRODUCER")} == dict.fromkeys(
        ("TURN_PV", "OVERLAP", "PINGPONG", "PRODUCER"), 1)
    _refused(decode.configure, 64, **mqa4, kv_lens=[32768] * 64, producer=1, pingpong=1, overlap=1, stages=3,
             match="overlap")                                     # v20 with v22's turns: not without v23's
    for name, kw in decode.VARIANTS.items():
        d = decode.configure(64, **mqa4, kv_lens=[32768] * 64, **kw)
        assert d.turn_pv == (name in ("v23", "v26")), name
    _refused(decode.configure, 64, **mqa4, kv_lens=[32768] * 64, turn_pv=1, producer=0, match="turn_pv")
    _refused(decode.configure, 64, **mqa4, kv_lens=[32768] * 64, turn_pv=1, producer=1, pingpong=0,
             match="turn_pv")
    _refused(decode.configure, 64, **mqa4, kv_lens=[32768] * 64, turn_pv=2, match="turn_pv")


def test_short_chunks_where_v26_takes_it():
    """v26: where two warpgroups would run splits of at most CHUNKS_MAX_TILES tiles (MQA at
    q_len 4: B 1 and 8 at 4k, B 1 at 32k), the defaults run one warpgroup on each 64-row chunk:
    the very launch warps=4, wgmma=1 gives; not on longer splits, pages, at 64 rows or fewer,
    nor where warps, wgmma, splits, stages or the two warpgroups' options are given. Asked for
    where it cannot run, refused. Of VARIANTS only v26 takes it."""
    mqa4 = dict(heads=32, kv_heads=1, head_dim=128, q_len=4)
    for B, n, want in ((1, 4096, 1), (8, 4096, 1), (1, 32768, 1), (2, 16384, 1), (8, 32768, 0),
                       (1, 131072, 0), (64, 4096, 0)):
        two = decode.configure(B, **mqa4, kv_lens=[n] * B, short_chunks=0)
        d = decode.configure(B, **mqa4, kv_lens=[n] * B)
        assert (cdiv(cdiv(n, two.block_cols), two.splits) <= decode.CHUNKS_MAX_TILES) == bool(want), (B, n)
        assert d.short_chunks == want, (B, n)
        if want:
            same = decode.configure(B, **mqa4, kv_lens=[n] * B, warps=4, wgmma=1)
            assert (d.warps, d.wgmma, d.chunks, d.producer, d.pingpong) == (4, 1, 2, 0, 0)
            assert (d.defines(), d.splits, d.launches()) == (same.defines(), same.splits, same.launches())
            assert decode.configure(B, **mqa4, kv_lens=[n] * B, **d.options()).short_chunks == 1
        else:
            assert (d.warps, d.chunks) == (8, 1)
    pages = dict(page_size=16, block_table=np.arange(256).reshape(1, 256), num_pages=256)
    for kw in (pages, dict(warps=8), dict(wgmma=1), dict(splits=32), dict(stages=2), dict(pingpong=1),
               dict(producer=1), dict(q_len=2)):
        d = decode.configure(1, 32, 1, 128, kv_lens=[4096], **{"q_len": 4, **kw})
        assert d.short_chunks == 0, kw
    for name, kw in decode.VARIANTS.items():
        assert decode.configure(1, **mqa4, kv_lens=[4096], **kw).short_chunks == (name == "v26"), name
    assert decode.configure(1, **mqa4, kv_lens=[32768], short_chunks=1).warps == 4    # asked for
    for bad in (dict(q_len=2), dict(warps=8), dict(wgmma=0), dict(short_chunks=2), dict(short_chunks=True)):
        _refused(decode.configure, 1, 32, 1, 128, kv_lens=[4096], **{"q_len": 4, "short_chunks": 1, **bad},
                 match="short_chunks")


def test_tree_softmax_on_wgmma():
    """v25 (TREE_SOFTMAX): an option of the wgmma loop (one warpgroup and two), off by default,
    refused on mma.sync."""
    for ql in (1, 4):
        d = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=ql, tree_softmax=1)
        assert (d.wgmma, d.tree_softmax, d.defines()["TREE_SOFTMAX"]) == (1, 1, 1)
        assert "TREE_SOFTMAX" not in decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=ql).defines()
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], tree_softmax=1, match="tree_softmax")   # mma.sync
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], tree_softmax=2, match="tree_softmax")


def test_overlap_with_the_producer():
    """v20: v17's producer with v11's overlap (3 stages); overlap alone keeps v11's loop."""
    d = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, producer=1, overlap=1, stages=3)
    df = d.defines()
    assert (d.producer, d.overlap, d.stages, df["PRODUCER"], df["OVERLAP"], df["STAGES"]) == (1, 1, 3, 1, 1, 3)
    v11 = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, overlap=1, stages=3)
    assert (v11.producer, v11.overlap, v11.pingpong) == (0, 1, 1)
    _refused(decode.configure, 8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, producer=1, overlap=1,
             match="overlap")                                          # 2 stages: V_j has none to spare


def test_producer_where_v17_takes_it():
    """v17 (a producer warp): the TMA loop only, without the ping-pong (off by default with it),
    v11's overlap or v7's merge (its default fused is then 0); a warp beside one warpgroup, a
    warpgroup beside two, in the launch's threads and the .cu file's PRODUCER. The default
    where two warpgroups read by TMA and do not merge in decode_split; not at one warpgroup,
    on pages or where v7 merges (above 32 splits)."""
    for ql, threads in ((1, 128 + 32), (4, 256 + 128)):
        d = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=ql, producer=1)
        assert (d.producer, d.tma, d.pingpong, d.fused, d.threads) == (1, 1, 0, 0, threads), ql
        assert d.launches()[0].threads == threads and d.defines()["PRODUCER"] == 1
        v9 = decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=ql, producer=0)
        assert "PRODUCER" not in v9.defines() and v9.pingpong == (ql == 4)
    for kw, want in ((dict(q_len=4), 1), (dict(q_len=1), 0), (dict(q_len=4, kv_lens=[32768]), 0),
                     (dict(q_len=4, page_size=16, block_table=[[0, 1]], num_pages=2, kv_lens=[20]), 0),
                     (dict(q_len=4, pingpong=1), 0), (dict(q_len=4, overlap=1, stages=3), 0)):
        d = decode.configure(len(kw.get("kv_lens", [20] * 8)), 32, 1, 128,
                             **{"kv_lens": [20] * 8, "short_chunks": 0, **kw})        # two warpgroups
        assert d.producer == want and d.pingpong == (kw["q_len"] == 4 and not want), kw
    assert decode.configure(1, 32, 1, 128, kv_lens=[32768], producer=1).fused == 0   # 128 splits
    assert decode.configure(1, 32, 1, 128, kv_lens=[32768]).fused == 1               # (v7's rule)
    assert decode.configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, **decode.VARIANTS["v17"]).producer == 1
    for bad, match in ((dict(page_size=16, block_table=[[0, 1]], num_pages=2), "producer"),
                       (dict(tma=0), "producer"), (dict(pingpong=1, overlap=1, stages=3, q_len=4), "producer"),
                       (dict(overlap=1), "overlap"), (dict(fused=1, splits=4), "fused"),
                       (dict(producer=2), "producer"), (dict(producer=True), "producer")):
        _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], **{"producer": 1, **bad}, match=match)
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], producer=1, match="producer")   # mma.sync


def test_tma_and_ping_pong_where_v9_takes_them():
    """v9's defaults: the TMA unit's copies wherever the wgmma loop reads a contiguous cache,
    cp.async for pages and for the mma.sync loop; the ping-pong wherever a block has two
    warpgroups. Either asked for where it cannot run is refused before any launch."""
    for kvh, ql, page, want in ((1, 4, None, (1, 8, 1, 1)), (1, 1, None, (1, 4, 1, 0)),
                                (1, 4, 16, (1, 8, 0, 1)), (8, 1, None, (0, 4, 0, 0)),
                                (8, 4, None, (0, 4, 0, 0)), (2, 16, None, (1, 8, 1, 1))):
        paged = dict(page_size=page, block_table=[[0, 1]], num_pages=2) if page else {}
        d = decode.configure(1, 32, kvh, 128, kv_lens=[20], q_len=ql, producer=0, **paged)   # v9
        assert (d.wgmma, d.warps, d.tma, d.pingpong) == want, (kvh, ql, page)
        assert (d.defines()["TMA"], d.defines()["PINGPONG"]) == want[2:]
    for kvh, ql, page, want in ((1, 1, None, 1), (2, 2, None, 1), (1, 1, 16, 0), (8, 4, None, 0),
                                (1, 4, None, 0)):            # v16: 32 rows on one warpgroup, contiguous
        paged = dict(page_size=page, block_table=[[0, 1]], num_pages=2) if page else {}
        assert decode.configure(1, 32, kvh, 128, kv_lens=[20], q_len=ql, **paged).half_rows == want
    for name, kw in decode.VARIANTS.items():                  # the versions before v16 keep v9's rows
        if name not in ("v16", "v17", "v18", "v21", "v23", "v26"):
            assert decode.configure(1, 32, 1, 128, kv_lens=[20], **kw).half_rows == 0, name
    for old in ("v5", "v5_w4", "v6", "v7", "v8"):         # the earlier versions keep cp.async
        d = decode.configure(1, 32, 1, 128, kv_lens=[20], q_len=4, **decode.VARIANTS[old])
        assert d.tma == d.pingpong == 0, old
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], q_len=4, page_size=16,
             block_table=[[0, 1]], num_pages=2, tma=1, match="tma")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], tma=1, match="tma")     # mma.sync
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], pingpong=1, match="two warpgroups")
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], q_len=4, pingpong=2, match="pingpong")
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], q_len=4, tma=True, match="tma")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], tmap_prefetch=1, match="tmap_prefetch")
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], tmap_prefetch=True, match="tmap_prefetch")
    assert decode.configure(1, 32, 1, 128, kv_lens=[20], tmap_prefetch=1).defines()["TMAP_PREFETCH"] == 1
    assert decode.configure(1, 32, 1, 128, kv_lens=[20], half_rows=1).defines()["HALF_ROWS"] == 1
    assert decode.configure(1, 32, 2, 128, kv_lens=[20], q_len=2, half_rows=1).half_rows == 1   # 32 rows
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], q_len=2, half_rows=1, match="64 rows")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], half_rows=1, match="wgmma 0")
    _refused(decode.configure, 1, 32, 1, 128, kv_lens=[20], half_rows=1, wgmma=0, match="half_rows")


def test_l2_hints_reach_the_defines_only_when_asked():
    """v13's hints are defines only when given (the builds without them keep their cache keys)
    and change nothing else of the launch; other values are refused."""
    plain = decode.configure(1, 32, 8, 128, kv_lens=[20])
    assert "L2_PREFETCH" not in plain.defines() and "EVICT_FIRST" not in plain.defines()
    for kvh in (32, 1):                                       # mma.sync, and wgmma by TMA
        h = decode.configure(1, 32, kvh, 128, kv_lens=[20], l2_prefetch=256, evict_first=1)
        assert (h.defines()["L2_PREFETCH"], h.defines()["EVICT_FIRST"]) == (256, 1)
        assert {k: v for k, v in h.defines().items() if k not in ("L2_PREFETCH", "EVICT_FIRST")} \
            == decode.configure(1, 32, kvh, 128, kv_lens=[20]).defines()
    assert decode.configure(1, 32, 1, 128, kv_lens=[20], evict_first=1).defines()["L2_PREFETCH"] == 0
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], l2_prefetch=32, match="l2_prefetch")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], evict_first=True, match="evict_first")
    _refused(decode.configure, 1, 32, 8, 128, kv_lens=[20], evict_first=2, match="evict_first")


def test_probe_is_the_same_launch_with_stamps():
    """``probe()``: the same kernels, tiles, splits and defines but TIMELINE, its own buffers;
    a launch that is not a probe has no stamps to read."""
    for kvh, kw in ((8, {}), (1, {}), (1, dict(decode.VARIANTS["v7"])), (8, dict(phased=1))):
        launch = decode.configure(8, 32, kvh, 128, kv_lens=[32768] * 8, **kw)
        probe = launch.probe()
        assert probe.defines() == {**launch.defines(), "TIMELINE": 1} and "TIMELINE" not in launch.defines()
        assert probe.launches() == launch.launches() and probe.options() == launch.options()
        assert probe.workspace is not launch.workspace and probe.timeline == 1
        _refused(launch.stamps, match="not built as a probe")


# ------------------------------------------------------------------ bad input (no GPU)

def _refused(fn, *args, match=None, **kw):
    with pytest.raises(KernelInputError, match=match) as info:
        fn(*args, **kw)
    assert isinstance(info.value, flashsim.FlashsimError) and "\n" not in str(info.value)


def test_bad_layouts_are_refused_before_any_launch():
    c = decode.configure
    bt = np.arange(8, dtype=np.int32).reshape(2, 4)
    _refused(c, 2, 30, 8, 128, kv_lens=[10, 10], match="not divisible by kv_heads")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 3], q_len=4, match="q_len = 4 > kv_len = 3")
    c(2, 32, 8, 128, kv_lens=[10, 3], q_len=4, causal=False)       # no mask: no such limit
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10], page_size=0, block_table=bt, num_pages=8,
             match="page_size must be an integer >= 1")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 64], page_size=16, block_table=bt, num_pages=7,
             match="past the cache of 7 pages")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 64], page_size=16, block_table=[[0, 1, 2, 3], [4, 5, 6, -1]],
             num_pages=8, match="past the cache")
    _refused(c, 2, 32, 8, 128, kv_lens=[20, 64], page_size=16, block_table=[[0, 1, 2, 3], [4, 5, 1, 7]],
             num_pages=8, match="repeats page 1")
    c(2, 32, 8, 128, kv_lens=[10, 64], page_size=16, block_table=[[0, 1, 2, 3], [4, 5, 6, 7]],
      num_pages=8)                        # unused entries (1, 2, 3 of row 0) are not read
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 80], page_size=16, block_table=bt, num_pages=8,
             match="needs 5 pages")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10, 10], match="3 entries; the batch has 2")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 0], match=">= 1")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10], page_size=16, match="needs block_table")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10], block_table=bt, match="give page_size")
    _refused(c, 2, 32, 8, 96, kv_lens=[10, 10], match="d = 96")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10], dtype="fp32", match="fp16 or bf16")
    _refused(c, 2, 32, 8, 128, kv_lens=[20, 20], q_len=17, match="1 to 16")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10], splits=0, match="splits")
    _refused(c, 2, 32, 8, 128, kv_lens=[10, 10], splits=500, match="at most")
    _refused(c, 70000, 32, 8, 128, kv_lens=[10] * 70000, match="z limit")


def test_a_kernel_alone_must_be_one_of_the_steps():
    """run(only=...) names one of the step's launches, or nothing is touched (the arrays
    are never looked at)."""
    one = decode.configure(2, 32, 8, 128, kv_lens=[100, 100], splits=1)
    two = decode.configure(2, 32, 8, 128, kv_lens=[4000, 4000], splits=4)
    assert [kl.kernel for kl in two.launches()] == ["decode_split", "decode_combine"]
    with pytest.raises(KernelInputError, match="this step launches decode_split$"):
        one.run(None, None, None, only="decode_combine")
    with pytest.raises(KernelInputError, match="decode_split, decode_combine"):
        two.run(None, None, None, only="combine")


def test_decode_attention_checks_values_on_the_host_first():
    """NumPy inputs: shapes, the layout and NaN/Inf in the used cache rows are refused before
    anything is copied to a GPU (there is none here: a copy would raise a CUDA error)."""
    f = gpu_kernels.decode_attention
    q = np.zeros((2, 1, 8, 64), np.float16)
    k = np.zeros((2, 40, 2, 64), np.float16)
    k_nan = k.copy()
    k_nan[1, 20, 1, 3] = np.nan
    _refused(f, q, k_nan, k, [30, 30], match="k_cache holds NaN or Inf in the rows of sequence 1")
    _refused(f, q, k, np.full_like(k, np.nan), [30, 30], match="v_cache holds NaN")
    _refused(f, np.full_like(q, np.inf), k, k, [30, 30], match="q holds NaN")
    try:                                        # NaN past kv_len is never read: not refused
        f(q, k_nan, k, [20, 20])                # (here: no GPU to copy to, a CUDA error)
    except Exception as exc:  # noqa: BLE001
        assert not isinstance(exc, KernelInputError), exc
    _refused(f, q, k, k, [30, 50], match="capacity")
    k3 = np.zeros((2, 40, 3, 64), np.float16)
    _refused(f, q, k3, k3, [30, 30], match="not divisible")
    _refused(f, q.astype(np.float32), k, k, [30, 30], match="float32")
    _refused(f, q, k, k, [30], match="1 entries; the batch has 2")
    pages = np.zeros((6, 16, 2, 64), np.float16)
    pages[5, 3, 0, 0] = np.inf
    _refused(f, q, pages, pages, [30, 20], block_table=[[0, 1], [2, 5]], match="sequence 1")
    _refused(f, q, pages, pages, [30, 20], block_table=[[0, 1], [2, 6]], match="past the cache of 6")


def test_correctness_rule_fails_a_wrong_output():
    rng = np.random.default_rng(0)
    launch = decode.configure(2, 8, 2, 64, kv_lens=[5, 130], q_len=4)
    q = round_to(rng.standard_normal((2, 4, 8, 64)), "fp16")
    ks = [round_to(rng.standard_normal((n, 2, 64)), "fp16") for n in (5, 130)]
    vs = [round_to(rng.standard_normal((n, 2, 64)), "fp16") for n in (5, 130)]
    refs = decode.reference_rows(launch, q, ks, vs)
    assert len(refs) == 2 * 2 * 4
    O = np.zeros((2, 4, 8, 64))
    L = np.zeros((2, 8, 4))
    for b, kvh, qi, ref, L_ref in refs:
        O[b, qi, 4 * kvh:4 * kvh + 4] = ref.ref
        L[b, 4 * kvh:4 * kvh + 4, qi] = L_ref
    assert decode.check_rows(launch, refs, O, L)["ok"]
    bad = O.copy()
    bad[1, 3, 7, 5] += 1.0                               # one element of the last row
    assert not decode.check_rows(launch, refs, bad, L)["ok"]
    assert not decode.check_rows(launch, refs, O, L + 0.01)["ok"]
    unmasked = decode.reference_rows(launch, q, ks, vs, causal=False)
    assert not decode.check_rows(launch, unmasked, O)["ok"]   # the mask matters at q_len 4


@pytest.mark.parametrize("page", [0, 1, 16, 48])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_cases_hold_each_sequences_rows_where_the_kernel_reads_them(page, dtype):
    """random_case (the GPU tests' and the sanitizer's inputs): the rows the launch reads
    through its block table (used_rows) are each sequence's rows, and every slot the kernel
    must not read holds NaN, which check_finite does not see."""
    lens = [1, 47, 130]
    case = decode.random_case(np.random.default_rng(page), 3, 8, 2, 64, lens, 1, page, dtype)
    launch = decode.configure(3, 8, 2, 64, **case["configure"])
    for cache, rows in ((case["k_cache"], case["rows_k"]), (case["v_cache"], case["rows_v"])):
        got = [decode.to_float32(r) for r in launch.used_rows(cache)]
        assert all(np.array_equal(a, b) for a, b in zip(got, rows))
        assert np.isnan(decode.to_float32(cache)).sum() == cache.size - sum(lens) * 2 * 64
    launch.check_finite(case["q"], case["k_cache"], case["v_cache"])


# ------------------------------------------------------------------ the kernels' arithmetic, emulated

def _values(x, bf16):
    return decode.to_float32(x.view(np.int16) if bf16 else x).reshape(-1)


def _memory(x):
    """The memory an array's pointer points at, flat from its first element, as the kernel
    sees it (a view's strides are the kernel's to apply)."""
    base = x
    while isinstance(base.base, np.ndarray):
        base = base.base
    assert base.flags.c_contiguous
    start = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // x.itemsize
    return base.reshape(-1)[start:]


def emulate_decode_split(D: dict, grid: tuple, args: tuple) -> None:
    """decode.cu's decode_split, statement for statement at block and warp level in NumPy
    (the mma fragments aside): the same grid, indices, tile split, masks, online softmax per
    key warp (P rounded to the input dtype before P V, as pack2 does), merge and writes into
    the flat arrays the kernel gets. Its output must pass the same reference check."""
    d, bf16, P, rw, B_c = (D[k] for k in ("HEAD_DIM", "IS_BF16", "PAGE_SIZE", "ROW_WARPS", "BLOCK_C"))
    (Q, K, V, O, L, O_part, L_part, bt, kv_lens, batch, q_len, group, kv_heads, max_pages,
     kv_batch_stride, kv_row_stride, kv_head_stride, num_splits, causal, scale_log2, _) = args
    dt = "bf16" if bf16 else "fp16"
    Qf, Kf, Vf = (_values(x, bf16) for x in (Q, _memory(K), _memory(V)))
    Of, Lf, Opf, Lpf, btf = (x.reshape(-1) for x in (O, L, O_part, L_part, bt))
    KEY_WARPS, B_r = D["NUM_WARPS"] // rw, 16 * rw
    KW = B_c // KEY_WARPS
    H, R, NR = kv_heads * group, q_len * group, batch * q_len * kv_heads * group
    for z in range(grid[2]):
        b, kvh = divmod(z, int(kv_heads))
        for split in range(grid[1]):
            for chunk in range(grid[0]):
                row0, kv_len = chunk * B_r, int(kv_lens[b])
                shift = kv_len - q_len if causal else kv_len - 1
                T_c = -(-kv_len // B_c)
                t_begin, t_end = split * T_c // num_splits, (split + 1) * T_c // num_splits
                Qs = np.zeros((B_r, d), np.float32)
                limit = np.zeros(B_r, np.int64)
                for r in range(B_r):
                    pr = row0 + r
                    if pr < R:
                        qi, hg = divmod(pr, group)
                        base = ((b * q_len + qi) * H + kvh * group + hg) * d
                        Qs[r] = Qf[base:base + d]
                    limit[r] = min(kv_len - 1, shift + (pr // group if causal else 0))
                m = np.full((KEY_WARPS, B_r), -np.inf, np.float32)
                l = np.zeros((KEY_WARPS, B_r), np.float32)
                o = np.zeros((KEY_WARPS, B_r, d), np.float32)
                for j in range(t_begin, t_end):
                    for wn in range(KEY_WARPS):
                        key0 = j * B_c + wn * KW
                        Kt, Vt = np.zeros((KW, d), np.float32), np.zeros((KW, d), np.float32)
                        for c in range(KW):
                            p = key0 + c
                            if p < kv_len:
                                if P == 0:
                                    off = b * kv_batch_stride + p * kv_row_stride + kvh * kv_head_stride
                                else:
                                    page = int(btf[b * max_pages + p // P])
                                    off = (page * kv_batch_stride + p % P * kv_row_stride
                                           + kvh * kv_head_stride)
                                Kt[c], Vt[c] = Kf[off:off + d], Vf[off:off + d]
                        S = Qs @ Kt.T
                        if key0 + KW - 1 > shift:
                            S[(key0 + np.arange(KW))[None, :] > limit[:, None]] = -np.inf
                        with np.errstate(invalid="ignore"):
                            m_new = np.maximum(m[wn], S.max(1) * np.float32(scale_log2))
                            m_use = np.where(m_new == -np.inf, np.float32(0), m_new)
                            alpha = np.exp2(m[wn] - m_use)
                            Pij = np.exp2(S * np.float32(scale_log2) - m_use[:, None])
                        l[wn] = l[wn] * alpha + Pij.sum(1)
                        m[wn] = m_new
                        o[wn] = o[wn] * alpha[:, None] + round_to(Pij, dt) @ Vt
                M = np.fmax.reduce(m, axis=0)
                with np.errstate(invalid="ignore"):
                    a = np.where(m == -np.inf, np.float32(0), np.exp2(m - M[None]))
                lsum = (a * l).sum(0)
                osum = (a[:, :, None] * o).sum(0)
                for r in range(B_r):
                    pr = row0 + r
                    if pr >= R:
                        continue
                    inv = 1 / lsum[r] if lsum[r] > 0 else 0.0
                    lse = (M[r] + np.log2(lsum[r])) * np.log(2) if lsum[r] > 0 else -np.inf
                    qi, h = pr // group, kvh * group + pr % group
                    orow = (b * q_len + qi) * H + h
                    if num_splits == 1:
                        Of[orow * d:(orow + 1) * d] = decode.storage(osum[r] * inv, dt).view(Of.dtype)
                        Lf[(b * H + h) * q_len + qi] = lse
                    else:
                        Opf[(split * NR + orow) * d:(split * NR + orow + 1) * d] = osum[r] * inv
                        Lpf[split * NR + orow] = lse
    if D["FUSED"] and num_splits > 1:      # v7: every block has arrived; each merges its units
        for z in range(grid[2]):
            b, kvh = divmod(z, int(kv_heads))
            for chunk in range(grid[0]):
                row0 = chunk * B_r
                for split in range(grid[1]):
                    for u in range(split, min(B_r, R - row0) * (d // 32), num_splits):
                        pr, col = row0 + u // (d // 32), (u % (d // 32)) * 32
                        qi, h = pr // group, kvh * group + pr % group
                        _merge_row(D, Opf, Lpf, Of, Lf, (b * q_len + qi) * H + h, NR, num_splits, H,
                                   q_len, slice(col, col + 32))


def _merge_row(D, Opf, Lpf, Of, Lf, orow, NR, num_splits, H, q_len, cols=slice(None)):
    """The (m, l) merge of output row ``orow``'s splits, columns ``cols`` (and L with the first
    columns): decode_combine's, and v7's for its work units. COMBINE 1 skips an empty split's
    O_s; the others read it (written as zeros) with weight 0."""
    d, bf16, skip = D["HEAD_DIM"], D["IS_BF16"], D["COMBINE"] == 1 and not D["FUSED"]
    ls = np.array([Lpf[s * NR + orow] for s in range(num_splits)])
    lmax = np.fmax.reduce(ls)
    acc, total = np.zeros(d, np.float32)[cols], np.float32(0)
    for s in range(num_splits):
        if ls[s] == -np.inf and skip:
            continue
        w = np.float32(0) if ls[s] == -np.inf else np.exp(ls[s] - lmax)
        total += w
        acc += w * Opf[(s * NR + orow) * d:(s * NR + orow + 1) * d][cols]
    inv = 1 / total if total > 0 else 0.0
    Of[orow * d:(orow + 1) * d][cols] = decode.storage(acc * inv, "bf16" if bf16 else "fp16").view(Of.dtype)
    if cols.start in (None, 0):
        h, qi, b = orow % H, (orow // H) % q_len, orow // (H * q_len)
        Lf[(b * H + h) * q_len + qi] = lmax + np.log(total) if total > 0 else -np.inf


def emulate_decode_combine(D: dict, grid: tuple, args: tuple) -> None:
    """decode.cu's decode_combine in NumPy: one output row at a time (COMBINE 1, 2: four rows
    per block; 3: one), ``_merge_row``."""
    O_part, L_part, O, L, NR, num_splits, H, q_len = args
    Opf, Lpf, Of, Lf = (x.reshape(-1) for x in (O_part, L_part, O, L))
    for orow in range(min(grid[0] * (1 if D["COMBINE"] == 3 else 4), NR)):
        _merge_row(D, Opf, Lpf, Of, Lf, orow, NR, num_splits, H, q_len)


EMULATED = [
    # H, kv_heads, d, kv_lens, q_len, page, dtype, splits, variant (decode.VARIANTS)
    (4, 2, 64, [37, 130], 1, 0, "fp16", 1, "v1"),
    (4, 2, 64, [37, 130], 4, 0, "fp16", 3, "v1"),
    (8, 2, 64, [65, 200], 16, 16, "bf16", None, "v1"),       # 64 rows: 4 row warps
    (32, 1, 64, [70, 9], 1, 1, "fp16", 2, "v1"),              # 32 rows: 2 row warps
    (8, 1, 64, [100], 16, 64, "fp16", 2, "v1"),               # 128 rows: 2 chunks
    (8, 8, 64, [1, 64, 129], 1, 48, "bf16", 7, "v1"),         # more splits than tiles
    (8, 8, 64, [1, 64, 129], 1, 48, "bf16", 7, "v2"),         # v2's combine, empty splits
    (32, 1, 64, [70, 300], 4, 0, "fp16", 40, "v2"),           # 128 rows, 8 warps, one chunk
    (32, 1, 64, [70, 9], 1, 1, "fp16", 2, "v2_w8"),           # 32 rows: 2 row x 4 key warps
    (8, 1, 64, [100], 16, 16, "bf16", 3, "v2_w8"),            # 128 rows: 8 row warps
    (16, 1, 64, [90], 16, 0, "fp16", 2, "v2_w8"),             # 256 rows: 2 chunks of 128
    (8, 8, 64, [1, 64, 129], 1, 48, "bf16", 7, "v3"),         # v3's combine, empty splits
    (32, 1, 64, [70, 300], 1, 0, "fp16", 9, "v3_w8"),         # a row's splits over 4 warps
    (8, 8, 64, [1, 64, 129], 1, 48, "bf16", 7, "v7"),         # v7: merged in decode_split, empty splits
    (8, 2, 64, [37, 130], 4, 0, "fp16", 3, "v7"),             # 16 rows x 2 units over 3 splits
    (32, 1, 64, [70, 300], 4, 0, "fp16", 40, "v7"),           # 128 rows (wgmma, 8 warps)
]


@pytest.mark.parametrize("H,kvh,d,lens,q_len,page,dtype,splits,variant", EMULATED, ids=str)
def test_emulated_kernels_match_float64_reference(H, kvh, d, lens, q_len, page, dtype, splits,
                                                  variant):
    """The launch's own argument tuples (kernel_args), run through the emulation with every
    output and workspace entry poisoned: the grid, the layouts, the block table, the split
    ranges, the masks, the merges and the combine give the reference's answer."""
    case = decode.random_case(np.random.default_rng(len(lens) + q_len), len(lens), H, kvh, d, lens,
                              q_len, page, dtype)
    launch = decode.configure(len(lens), H, kvh, d, splits=splits, **case["configure"],
                              **decode.VARIANTS[variant])
    _emulate_and_check(launch, case)


@pytest.mark.parametrize("H,kvh,d,lens,q_len,page,dtype,splits,variant", [
    (8, 2, 64, [37, 130], 4, 0, "fp16", 3, "v3"),
    (8, 2, 64, [65, 200], 1, 16, "bf16", None, "v2"),
    (32, 4, 64, [70, 9], 1, 48, "fp16", 2, "v1"),
], ids=str)
def test_emulated_head_major_cache_gives_the_token_major_answer(H, kvh, d, lens, q_len, page, dtype,
                                                                 splits, variant):
    """A cache stored head-major, (B, kv_heads, capacity, d) or pages (num_pages, kv_heads, P,
    d), passed as its transposed view: the kernel's strides read the same values, so the
    emulated output equals the token-major cache's bit for bit (and the reference)."""
    outs = []
    for head_major in (False, True):
        case = decode.random_case(np.random.default_rng(7), len(lens), H, kvh, d, lens, q_len, page,
                                  dtype, head_major=head_major)
        assert case["k_cache"].flags.c_contiguous != head_major
        launch = decode.configure(len(lens), H, kvh, d, splits=splits, **case["configure"],
                                  **decode.VARIANTS[variant])
        outs.append(_emulate_and_check(launch, case))
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*outs))


def test_cache_strides_are_checked():
    """Any strides with d contiguous run; what the kernel cannot read is refused by name."""
    x = np.zeros((2, 4, 16, 3, 64), np.float16)                # (B, kv_heads, n, 3, d) storage
    assert decode.cache_strides(x[:, :, :, 0].transpose(0, 2, 1, 3), "k_cache") == \
        (4 * 16 * 3 * 64, 3 * 64, 16 * 3 * 64)
    assert decode.cache_strides(np.zeros((2, 16, 4, 64), np.float16), "k_cache") == (4096, 256, 64)
    one = np.lib.stride_tricks.as_strided(np.zeros(16 * 64, np.float16), (1, 16, 1, 64), (2, 128, 6, 2))
    assert decode.cache_strides(one, "k_cache") == (0, 64, 0)   # size-1 dimensions: never stepped
    with pytest.raises(KernelInputError, match="k_cache's last dimension"):
        decode.cache_strides(np.zeros((2, 4, 64, 16), np.float16).transpose(0, 1, 3, 2), "k_cache")
    with pytest.raises(KernelInputError, match="multiple of 8"):
        decode.cache_strides(np.zeros((2, 16, 4, 68), np.float16)[..., :64], "v_cache")
    with pytest.raises(KernelInputError, match="non-negative"):
        decode.cache_strides(np.zeros((2, 16, 4, 64), np.float16)[:, ::-1], "k_cache")
    with pytest.raises(KernelInputError, match="16-byte"):
        decode.cache_strides(np.zeros((2 * 16 * 4 * 64 + 8,), np.float16)[1:2 * 16 * 4 * 64 + 1]
                             .reshape(2, 16, 4, 64), "k_cache")


def test_sanitizer_cases_pass_under_emulation():
    """Every tiny launch the GPU run's compute-sanitizer step makes (every variant), emulated
    here first: each matches the float64 reference."""
    from benchmarks.decode_h200 import case_options, tiny_cases

    for i, (H, kvh, d, lens, q_len, page, dtype, splits, tiles) in enumerate(tiny_cases()):
        layout, tiles = case_options(tiles)
        probe = tiles.pop("probe", False)             # run_case's: the same launch, stamped
        case = decode.random_case(np.random.default_rng(i), len(lens), H, kvh, d, lens, q_len, page,
                                  dtype, **layout)
        launch = decode.configure(len(lens), H, kvh, d, splits=splits, **case["configure"], **tiles)
        _emulate_and_check(launch.probe() if probe else launch, case)


def _emulate_and_check(launch, case):
    lens, (_, q_len, H, d) = launch.kv_lens, case["q"].shape
    page, dtype = launch.page_size, launch.dtype
    B, rows = len(lens), len(lens) * q_len * H
    O = np.full(case["q"].shape, np.nan, np.float32).astype(case["q"].dtype) if dtype == "fp16" \
        else np.full(case["q"].shape, 0x7FC0, np.int16)
    L = np.full((B, H, q_len), np.nan, np.float32)
    O_part = np.full((launch.splits, rows, d), np.nan, np.float32)
    L_part = np.full((launch.splits, rows), np.nan, np.float32)
    bt = launch.block_table if page else np.zeros((B, 1), np.int32)
    args = launch.kernel_args(np, case["q"], case["k_cache"], case["v_cache"], O, L,
                              *((O_part, L_part) if launch.splits > 1 else (O, L)), bt,
                              np.asarray(lens, np.int32), None)
    run = {"decode_split": emulate_decode_split, "decode_combine": emulate_decode_combine}
    for kl, a in zip(launch.launches(), args):
        run[kl.kernel](launch.defines(), kl.grid, a)
    Of = decode.to_float32(O)
    assert np.isfinite(Of).all() and np.isfinite(L).all()
    refs = decode.reference_rows(launch, case["q_values"], case["rows_k"], case["rows_v"])
    verdict = decode.check_rows(launch, refs, Of, L)
    assert verdict["ok"], (launch.plan_record(), verdict)
    return Of, L


# ------------------------------------------------------------------ on the GPU

def _cupy_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
        if int(cupy.cuda.Device().compute_capability) < 80:
            pytest.skip("needs sm_80 or newer (mma.sync bf16, cp.async)")
    except Exception as exc:  # no driver, no device
        pytest.skip(f"no usable CUDA device ({exc})")
    return cupy


def _run_and_check(cupy, B, H, kvh, d, lens, q_len, page, dtype, splits=None, seed=0):
    case = decode.random_case(np.random.default_rng(seed), B, H, kvh, d, lens, q_len, page, dtype)
    launch, verdict = decode.run_case(case, H, kvh, splits)
    assert verdict["ok"], verdict
    return launch


GPU_CASES = [
    # B, H, kv_heads, d, kv_lens, q_len, page, dtype, splits
    (2, 4, 2, 128, [37, 130], 1, 0, "fp16", 1),
    (2, 4, 2, 128, [37, 130], 1, 0, "fp16", 3),
    (3, 32, 8, 128, [1000, 64, 4100], 1, 0, "fp16", None),
    (3, 32, 8, 128, [1000, 64, 4100], 4, 16, "fp16", None),
    (2, 32, 32, 128, [513, 77], 1, 1, "fp16", 4),
    (2, 32, 1, 128, [300, 2000], 1, 64, "fp16", None),                 # MQA: 32 rows
    (1, 32, 1, 128, [700], 4, 0, "fp16", 5),                           # 128 rows: 2 chunks
    (2, 16, 2, 128, [40, 333], 16, 16, "bf16", 2),                     # q_len 16, 128 rows
    (2, 32, 8, 128, [129, 4000], 4, 48, "bf16", None),                 # page size 48
    (3, 8, 8, 64, [1, 64, 129], 1, 1, "fp16", 2),
    (2, 32, 4, 64, [65, 1900], 4, 64, "bf16", None),
    (2, 8, 1, 64, [50, 17], 16, 0, "fp16", 1),                         # 128 rows, 1 split
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,kvh,d,lens,q_len,page,dtype,splits", GPU_CASES, ids=str)
def test_kernel_matches_float64_reference(B, H, kvh, d, lens, q_len, page, dtype, splits):
    cupy = _cupy_or_skip()
    launch = _run_and_check(cupy, B, H, kvh, d, lens, q_len, page, dtype, splits)
    if splits is not None:
        assert launch.splits == splits


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(decode.VARIANTS))
def test_every_variant_the_benchmark_times(variant):
    """Each configuration of decode.VARIANTS, as the benchmark runs it, on MQA/GQA, q_len 1 and
    4, contiguous and paged, one split and many."""
    _cupy_or_skip()
    for B, H, kvh, lens, q_len, page, splits in ((2, 32, 1, [300, 2000], 1, 0, None),
                                                 (1, 32, 1, [700], 4, 0, 9),
                                                 (2, 32, 8, [129, 4000], 4, 16, None),
                                                 (1, 32, 1, [5000], 4, 64, 1),
                                                 (2, 16, 1, [90, 20], 16, 0, 2)):
        if page and decode.VARIANTS[variant].get("phased"):   # v14: a contiguous cache only
            continue
        case = decode.random_case(np.random.default_rng(q_len), B, H, kvh, 128, lens, q_len, page, "fp16")
        launch, verdict = decode.run_case(case, H, kvh, splits, **decode.VARIANTS[variant])
        assert verdict["ok"], (launch.plan_record(), verdict)


@pytest.mark.gpu
@pytest.mark.parametrize("kvh,lens,q_len,kw", [(8, [129, 4000], 1, {}), (1, [300, 2000], 1, {}),
                                               (1, [300, 9000], 4, dict(decode.VARIANTS["v9"], splits=60)),
                                               (2, [37, 300], 1, dict(splits=40)),
                                               (8, [129, 4000], 1, dict(phased=1)),
                                               (1, [300, 2000], 1, dict(tmap_prefetch=1)),
                                               (1, [300, 2000], 1, dict(half_rows=1))], ids=str)
def test_probe_stamps_every_block_and_leaves_the_output(kvh, lens, q_len, kw):
    """A probe writes the same bits as its launch; every block of decode_split stamps an SM,
    entry <= first tile <= loop end <= exit on the global timer, and waits at most its cycles;
    a block without tiles (more splits than tiles) stamps no first tile."""
    cupy = _cupy_or_skip()
    case = decode.random_case(np.random.default_rng(q_len), len(lens), 32, kvh, 128, lens, q_len, 0, "fp16")
    launch = decode.configure(len(lens), 32, kvh, 128, **case["configure"], **kw)
    probe = launch.probe()
    q, k, v = decode.device_case(case)
    outs = [(r.O.get(), r.L.get()) for r in (launch.run(q, k, v), probe.run(q, k, v))]
    assert all(np.array_equal(a, b) for a, b in zip(*outs))
    st = probe.stamps()
    n_sm = cupy.cuda.Device().attributes["MultiProcessorCount"]
    assert len(st["sm"]) == np.prod(launch.launches()[0].grid) and (st["sm"] < n_sm).all()
    tiles = st["first_tile_ns"] > 0
    T_c = -(-np.asarray(lens) // launch.block_cols)
    splits = np.arange(launch.splits)
    want = np.concatenate([np.repeat((splits + 1) * t // launch.splits > splits * t // launch.splits,
                                     launch.chunks) for t in T_c for _ in range(kvh)])
    assert (tiles == want).all()                  # blockIdx.x (chunk) fastest, then split, then z
    assert (st["entry_ns"] > 0).all() and (st["entry_ns"] <= st["exit_ns"]).all()
    assert (st["entry_ns"][tiles] <= st["first_tile_ns"][tiles]).all()
    assert (st["first_tile_ns"][tiles] <= st["loop_end_ns"][tiles]).all()
    assert (st["loop_end_ns"] <= st["exit_ns"]).all()
    assert (st["wait_clk"] >= 0).all() and (st["wait_clk"] <= st["exit_clk"] - st["entry_clk"]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", decode.TUNING[1:], ids=str)
def test_tuning_tiles(tiles):
    """The tiles the benchmark's tuning step may choose for the whole table."""
    _cupy_or_skip()
    for lens, q_len, page in (([37, 300], 4, 0), ([1000, 64], 1, 16), ([129, 700], 16, 1)):
        case = decode.random_case(np.random.default_rng(q_len), 2, 32, 8, 128, lens, q_len, page, "fp16")
        _, verdict = decode.run_case(case, 32, 8, 3, block_cols=tiles[0], stages=tiles[1])
        assert verdict["ok"], (lens, q_len, page, verdict)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["v4", "v5_w4", "v5"])
def test_head_major_cache_gives_the_token_major_output(variant):
    """PyTorch's (B, kv_heads, n, d) cache and FlashInfer's "HND" pages, passed as transposed
    views: the same bits out as the token-major cache (the kernel only reads at other
    offsets), and the reference's answer."""
    _cupy_or_skip()
    H, kvh = (32, 4) if variant == "v4" else (64, 2)
    for lens, q_len, page in (([37, 3000], 1, 0), ([1000, 64], 4, 16), ([129, 700], 1, 1)):
        outs = []
        for head_major in (False, True):
            case = decode.random_case(np.random.default_rng(q_len), 2, H, kvh, 128, lens, q_len, page,
                                      "fp16", head_major=head_major)
            launch = decode.configure(2, H, kvh, 128, **case["configure"], **decode.VARIANTS[variant])
            q, k, v = decode.device_case(case)
            assert k.flags.c_contiguous != head_major or page == 1    # pages of 1: the same either way
            res = launch.run(q, k, v)
            outs.append((res.O.get(), res.L.get()))
            _, verdict = decode.run_case(case, H, kvh, None, **decode.VARIANTS[variant])
            assert verdict["ok"], (lens, q_len, page, head_major, verdict)
        assert all(np.array_equal(a, b) for a, b in zip(*outs)), (lens, q_len, page)


@pytest.mark.gpu
@pytest.mark.parametrize("H,kvh,lens,q_len", [(32, 8, [2500, 300], 1), (32, 1, [32768], 1),
                                              (32, 1, [9000, 70], 4)], ids=str)
def test_fused_merge_repeats_bit_for_bit_and_leaves_its_counters_zero(H, kvh, lens, q_len):
    """v7's blocks meet at counters that each launch must leave zero (or the next would not
    wait, or wait forever): three runs of one launch, the same bits each time, the counters
    zero after each, and the reference's answer."""
    cupy = _cupy_or_skip()
    case = decode.random_case(np.random.default_rng(3), len(lens), H, kvh, 128, lens, q_len, 0, "fp16")
    launch = decode.configure(len(lens), H, kvh, 128, **case["configure"], **decode.VARIANTS["v7"])
    assert launch.fused and launch.splits > 1
    q, k, v = decode.device_case(case)
    outs = []
    for _ in range(3):
        res = launch.run(q, k, v)
        outs.append((res.O.get(), res.L.get()))
        assert int(cupy.count_nonzero(launch.workspace["counters"])) == 0
    assert all(np.array_equal(outs[0][i], o[i]) for o in outs[1:] for i in (0, 1))
    _, verdict = decode.run_case(case, H, kvh, None, **decode.VARIANTS["v7"])
    assert verdict["ok"], verdict


@pytest.mark.gpu
def test_splits_give_the_same_output_as_one():
    """Split-KV and the combine change only the rounding: every split count within the rule,
    up to more splits than tiles (empty splits)."""
    cupy = _cupy_or_skip()
    for s in (1, 2, 7, 40):
        _run_and_check(cupy, 2, 32, 8, 128, [2500, 300], 1, 16, "fp16", splits=s, seed=s)


@pytest.mark.gpu
def test_the_steps_kernels_one_by_one_give_the_steps_output():
    """--overheads times a step's kernels alone: the split kernel, then the combine, each
    by run(only=...) into the same buffers, write what the whole step writes."""
    cupy = _cupy_or_skip()
    case = decode.random_case(np.random.default_rng(5), 2, 32, 8, 128, [3000, 900], 1, 0, "fp16")
    launch = decode.configure(2, 32, 8, 128, **case["configure"], splits=6)
    assert not launch.fused and len(launch.launches()) == 2
    q, k, v = decode.device_case(case)
    whole = launch.run(q, k, v)
    O, L = whole.O.get(), whole.L.get()
    res = launch.run(q, k, v, out=cupy.zeros_like(whole.O), lse=cupy.zeros_like(whole.L),
                     only="decode_split")
    assert not np.array_equal(res.O.get(), O)            # the split kernel writes partials only
    res = launch.run(q, k, v, out=res.O, lse=res.L, only="decode_combine")
    assert np.array_equal(res.O.get(), O) and np.array_equal(res.L.get(), L)


@pytest.mark.gpu
def test_nan_in_the_cache_is_refused_on_the_device_and_nothing_written():
    cupy = _cupy_or_skip()
    launch = decode.configure(1, 8, 2, 64, kv_lens=[30])
    q = cupy.zeros((1, 1, 8, 64), cupy.float16)
    k = cupy.zeros((1, 32, 2, 64), cupy.float16)
    k[0, 31] = cupy.nan                                     # past kv_len: not read
    out = cupy.full(q.shape, 7, cupy.float16)
    launch.run(q, k, k, out=out, check_finite=True)
    k[0, 12, 1, 0] = cupy.inf
    out[...] = 7
    with pytest.raises(KernelInputError, match="k_cache holds NaN or Inf"):
        launch.run(q, k, cupy.zeros_like(k), out=out, check_finite=True)
    assert bool((out == 7).all())


@pytest.mark.gpu
def test_decode_attention_with_torch_tensors():
    _cupy_or_skip()
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 4, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 100, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 100, 2, 128, device="cuda", dtype=torch.bfloat16)
    O, L = gpu_kernels.decode_attention(q, k, v, torch.tensor([100, 57], dtype=torch.int32))
    assert isinstance(O, torch.Tensor) and O.dtype == torch.bfloat16 and O.shape == q.shape
    assert L.shape == (2, 8, 4) and L.dtype == torch.float32
    # PyTorch's own answer for sequence 1 (57 keys, bottom-right causal): same within bf16
    import torch.nn.functional as F

    qf, kf, vf = q[1:].float().transpose(1, 2), k[1:, :57].float().transpose(1, 2), v[1:, :57].float().transpose(1, 2)
    mask = torch.ones(4, 57, dtype=torch.bool, device="cuda").tril(57 - 4)
    ref = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, enable_gqa=True)
    assert (O[1:].float().transpose(1, 2) - ref).abs().max().item() < 3e-2


@pytest.mark.gpu
def test_torch_tensors_are_viewed_in_place_on_cupys_stream():
    """as_cupy on a torch tensor on the stream CuPy launches on: a view over the tensor's own
    pointer and strides (a transposed view, an offset slice, bf16's bits as int16) that
    reads the tensor's values; on another stream it goes through DLPack, with the same view."""
    cupy = _cupy_or_skip()
    torch = pytest.importorskip("torch")
    from gpu_kernels.cupy.common import as_cupy

    base = torch.randn(3, 40, 4, 64, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    for x in (base, base.transpose(1, 2), base[1:, 5:30], base.to(torch.bfloat16)[:, ::2]):
        bits = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        for stream in (None, side):
            with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                a, dt = as_cupy(x, "x")
            assert a.data.ptr == x.data_ptr() and dt == str(x.dtype).removeprefix("torch.")
            assert a.shape == x.shape and a.strides == tuple(st * x.element_size() for st in x.stride())
            assert np.array_equal(cupy.asnumpy(a), bits.cpu().numpy())


@pytest.mark.gpu
def test_a_step_on_torch_tensors_on_any_stream_gives_the_same_bits():
    """One launch (split kernel and combine by programmatic dependent launch, and v7's
    cooperative merge) run on torch tensors: on the default stream, on a side stream
    shared with CuPy (its own launch configurations), and on a side stream of PyTorch's
    alone (DLPack orders the two); every run writes the bits of the run on CuPy arrays."""
    cupy = _cupy_or_skip()
    torch = pytest.importorskip("torch")
    case = decode.random_case(np.random.default_rng(9), 2, 32, 8, 128, [3000, 900], 1, 0, "fp16")
    for variant in ("v6", "v7"):
        launch = decode.configure(2, 32, 8, 128, **case["configure"], splits=6, **decode.VARIANTS[variant])
        q, k, v = decode.device_case(case)
        want = launch.run(q, k, v)
        want = want.O.get(), want.L.get()
        tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
        side = torch.cuda.Stream()
        for stream, shared in ((None, False), (side, True), (side, False)):
            O, L = torch.full_like(tq, 7), torch.zeros((2, 32, 1), device="cuda")
            with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
                with cupy.cuda.ExternalStream(side.cuda_stream) if shared else contextlib.nullcontext():
                    launch.run(tq, tk, tv, out=O, lse=L)
            torch.cuda.synchronize()
            assert np.array_equal(O.cpu().numpy(), want[0]), (variant, stream, shared)
            assert np.array_equal(L.cpu().numpy(), want[1]), (variant, stream, shared)


# ------------------------------------------------------------------ the benchmark's plan (no GPU)

def test_benchmark_points_are_the_issues_grid():
    from benchmarks import decode_h200 as bench

    full, quick = bench.grid_points(False), bench.grid_points(True)
    assert full[:len(bench.REFERENCE_POINTS)] == bench.REFERENCE_POINTS == quick
    grid = {(B, kvh, n, q) for B in (1, 8, 64) for kvh in (32, 8, 1) for n in (4096, 32768, 131072)
            for q in (1, 4)}
    fits = {p for p in grid if 2 * p[0] * p[2] * p[1] * 128 * 2 <= 40e9}
    assert set(full) == fits and len(full) == len(set(full))
    assert grid - fits == {(64, 32, 131072, 1), (64, 32, 131072, 4)}        # 137 GB of K/V
    for P in bench.PAGES:
        assert P in decode.COMPILED_PAGE_SIZES
    names = [c[:8] for c in bench.tiny_cases()]
    assert {c[5] for c in names} == {0, 1, 16, 64} and {c[4] for c in names} >= {1, 4, 16}


def test_every_rounds_candidate_configures_and_differs_somewhere():
    """Each interleaved-rounds mode (bench.ROUND_SETS): every candidate configures at every one
    of its points, and each two candidates of a mode launch differently at one point or more;
    a candidate that named the defaults of its time ("v18" as {} once v21 became the default)
    would otherwise time the same launch twice and call it a comparison."""
    from benchmarks import decode_h200 as bench

    assert set(bench.ROUND_SETS) <= set(bench.MODES)
    for mode, (_, _, points, candidates, *_) in bench.ROUND_SETS.items():
        launches = {}
        for label, kw in candidates:
            for B, kvh, n, ql in points:
                lc = decode.configure(B, bench.H, kvh, bench.D, kv_lens=[n] * B, q_len=ql, **kw)
                launches.setdefault(label, []).append((tuple(sorted(lc.defines().items())), lc.splits))
        labels = list(launches)
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                assert launches[a] != launches[b], (mode, a, b)


def test_overhead_points_are_grid_points_with_and_without_splits():
    from benchmarks import decode_h200 as bench

    points = bench.OVERHEAD_POINTS + bench.OVERHEAD_PROFILE_POINTS
    assert set(points) <= set(bench.grid_points(False)) and len(set(bench.OVERHEAD_POINTS)) == 12
    kernels = {len(decode.configure(B, 32, kvh, 128, kv_lens=[n] * B, q_len=ql).launches())
               for B, kvh, n, ql in bench.OVERHEAD_POINTS}
    assert kernels == {1, 2}            # steps with a combine launch and steps without


def test_splits_sweep_times_both_rules_and_their_neighbours():
    """--splits-sweep: the grid's points where splits are chosen (B in {1, 8}, fewer blocks
    than half a wave), each at both rules' split counts, one either side, a second wave and
    the powers of two, within 1 .. min(MAX_SPLITS, tiles)."""
    from benchmarks import decode_h200 as bench

    points = bench.sweep_points()
    assert points and set(points) <= set(bench.grid_points(False))
    assert {(B, kvh) for B, kvh, _, _ in points} == {(1, 32), (1, 8), (1, 1), (8, 8), (8, 1)}
    for B, kvh, n, ql in points:
        tiles = cdiv(n, decode.BLOCK_C)
        rules = {r: decode.configure(B, 32, kvh, 128, kv_lens=[n] * B, q_len=ql, split_rule=r).splits
                 for r in decode.SPLIT_RULES}
        S = bench.sweep_splits(rules, tiles)
        assert S == sorted(set(S)) and 1 == S[0] and S[-1] <= min(decode.MAX_SPLITS, tiles)
        assert set(rules.values()) <= set(S) and {1, 2, 4, 8} <= set(S)
