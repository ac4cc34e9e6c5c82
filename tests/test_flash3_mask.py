"""The Hopper kernel's mask path (flash3.cu with MASK = 1, ``cupy_flash3`` with ``mask=``).

Without a GPU: the masked v3 compiles for sm_90a at d = 64 and 128, fp16 and bf16, without
spills (registers and shared memory into the test log, as test_flash3 does); its PTX reads the
column vectors; the tile list the host hands the kernel lists exactly flashsim's non-skipped
tiles, with the element-mask flags of flashsim's 64-row classification, and holds against the
dense mask (an unlisted tile hides every element, an unflagged one hides none); bad masks are
refused with one KernelInputError before anything is compiled.

The kernel's loop run in NumPy (float64) on the host's list equals the reference for every family.

On a GPU (``@pytest.mark.gpu``): causal, sliding:W, document (causal within), prefix and a
mask with rows that see no key, on ragged N = 97, 1025, 4097, d = 64 and 128, fp16 and bf16,
against the float64 reference with the dense mask (flash-attention's rule, as test_flash3) and
L against the float64 logsumexp (-inf for a row that sees nothing, whose O is 0).
"""

from __future__ import annotations

import numpy as np
import pytest

from flashsim import masks
from benchmarks.masks_h200 import FAMILIES as BENCH_FAMILIES
from benchmarks.masks_h200 import check_mask, check_masked, no_key_rows
from gpu_kernels import KernelInputError, registry
from gpu_kernels.cupy import flash3

FAMILIES = ("causal", "sliding:{w}", "document:{docs}:causal", "prefix:{p}")


def _spec(family: str, N: int) -> str:
    """A family's spec at N: window N/5, three unequal documents, prefix N/3 (all ragged)."""
    docs = ",".join(map(str, (N // 2 + 3, N // 3, N - (N // 2 + 3) - N // 3)))
    return family.format(w=max(1, N // 5), docs=docs, p=max(1, N // 3))


# ------------------------------------------------------------------ compile checks (no GPU)

def _mask_variants():
    return [v for v in flash3.compile_variants() if v[1].get("MASK")]


def test_mask_variants_compile_for_sm90a_without_spills(request):
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import SMEM_LIMIT_OPTIN, compile_variant, format_table

    rows = []
    for cu_file, defines, dyn, _hot in _mask_variants():
        rows += compile_variant(cu_file, defines, dyn)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\nflash3.cu MASK=1 for sm_90a\n" + format_table(rows))
    assert sorted((int(r.variant.split("HEAD_DIM=")[1].split()[0]), "IS_BF16=1" in r.variant)
                  for r in rows) == [(d, bf) for d in flash3.MASK_HEAD_DIMS for bf in (False, True)]
    for r in rows:
        assert r.kernel == "flash3_fwd" and 0 < r.registers <= 168, r
        assert not r.spills and r.stack_frame == 0, r
        assert r.smem <= SMEM_LIMIT_OPTIN, r


def test_mask_ptx_reads_the_column_vectors_and_the_list():
    pytest.importorskip("cuda.core")
    from tests.test_flash3 import _ptx

    ptx = _ptx(dict(flash3.defines(128, "fp16", version=3), MASK=1))
    assert "ld.global.nc.v4.s32" in ptx           # one int4 (LTS, LTE, UTS, UTE) a column
    assert "cp.async.bulk.tensor.3d" in ptx and "setmaxnreg.inc.sync.aligned.u32 240" in ptx


def test_mask_needs_version_3_at_compile_time():
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_cubin
    from gpu_kernels.cupy.common import read_source

    with pytest.raises(RuntimeError, match="MASK needs VERSION 3"):
        compile_cubin(read_source(flash3.CU_FILE), dict(flash3.defines(64, "fp16", version=4), MASK=1),
                      arch=flash3.ARCH, name=flash3.CU_FILE)


# ------------------------------------------------------------------ the tile list (no GPU)

def _decode(indptr, entries):
    """{i: [(j, flag of warpgroup 0, flag of warpgroup 1)]} from the CSR list."""
    return {i: [(e >> 2, e & 1, (e >> 1) & 1) for e in entries[indptr[i]:indptr[i + 1]]]
            for i in range(len(indptr) - 1)}


@pytest.mark.parametrize("N", [97, 1025, 4097])
@pytest.mark.parametrize("family", FAMILIES + ("document:{docs}", "nokey"))
def test_tile_list_is_flashsims_classification(family, N):
    mask = no_key_rows(N) if family == "nokey" else masks.parse(_spec(family, N), N)
    Br, Bc = flash3.BLOCK_R, 128
    indptr, entries = flash3.tile_list(mask, Br, Bc)
    tiles = mask.classify(Br, Bc)
    half = mask.classify(64, Bc)
    dense = mask.dense()
    listed = _decode(indptr, entries)
    assert indptr[0] == 0 and len(indptr) == tiles.shape[0] + 1
    for i, row in listed.items():
        js = [j for j, *_ in row]
        assert js == list(np.flatnonzero(tiles[i] != masks.SKIP)), (i, js)   # ascending
        for j, *flags in row:
            for w, f in enumerate(flags):
                r0 = 2 * i + w
                want = r0 < half.shape[0] and half[r0, j] != masks.FULL
                assert f == want, (i, j, w)
                block = dense[64 * r0:64 * r0 + 64, Bc * j:Bc * j + Bc]
                if not f:                     # unflagged: the warpgroup hides nothing here
                    assert block.all(), (i, j, w)
            if tiles[i, j] == masks.FULL:
                assert flags == [0, 0]
        for j in set(range(tiles.shape[1])) - set(js):     # unlisted: every element hidden
            assert not dense[Br * i:Br * i + Br, Bc * j:Bc * j + Bc].any(), (i, j)
    # the model's count of computed tiles is the list's length
    assert len(entries) == int((tiles != masks.SKIP).sum())


def _kernel_loop(Q, K, V, indptr, entries, cols, Br=128, Bc=128):
    """flash3.cu's MASK = 1 consumers in NumPy (float64), line for line: per query block i and
    consumer warpgroup w (64 rows), the listed key blocks j only; mask_cols where the block
    passes N or the entry's flag for w is set; the online softmax; a row with l_i = 0 writes
    O = 0 and L = -inf."""
    N, d = Q.shape
    O, L = np.zeros((N, d)), np.zeros(N)
    tau = 1 / np.sqrt(d)
    for i in range(len(indptr) - 1):
        for w in range(Br // 64):
            r0 = i * Br + w * 64
            rows = np.arange(r0, r0 + 64)
            if r0 >= N:
                continue
            Qw = Q[np.minimum(rows, N - 1)]
            o, m_i, l_i = np.zeros((64, d)), np.full(64, -np.inf), np.zeros(64)
            for entry in entries[indptr[i]:indptr[i + 1]]:
                j = entry >> 2
                c = np.arange(j * Bc, j * Bc + Bc)
                Kj, Vj = (np.where((c < N)[:, None], X[np.minimum(c, N - 1)], 0.0) for X in (K, V))
                S = Qw @ Kj.T * tau
                if j * Bc + Bc > N or (entry >> w) & 1:                      # mask_cols
                    v = np.where((c < N)[:, None], cols[np.minimum(c, N - 1)], [0, N, 0, 0])
                    r = rows[:, None]
                    hidden = ((r >= v[:, 0]) & (r < v[:, 1])) | ((r >= v[:, 2]) & (r < v[:, 3]))
                    S = np.where(hidden, -np.inf, S)
                m_new = np.maximum(m_i, S.max(axis=1))                        # softmax_step
                m_use = np.where(np.isneginf(m_new), 0.0, m_new)
                alpha = np.exp(m_i - m_use)
                P = np.exp(S - m_use[:, None])
                l_i = l_i * alpha + P.sum(axis=1)
                o = o * alpha[:, None] + P @ Vj
                m_i = m_new
            keep = rows < N
            inv = np.where(l_i > 0, 1 / np.where(l_i > 0, l_i, 1), 0.0)     # the epilogue
            O[rows[keep]] = (o * inv[:, None])[keep]
            with np.errstate(divide="ignore"):
                L[rows[keep]] = (m_i + np.log(l_i))[keep]
    return O, L


@pytest.mark.parametrize("N", [97, 333, 1025])
@pytest.mark.parametrize("family", BENCH_FAMILIES + ("nokey", "document:{docs}"))
def test_kernel_loop_in_numpy_equals_the_reference(family, N):
    """The kernel's algorithm (list, flags, column mask, online softmax, empty rows) run in
    float64 on the host's tile list equals flashsim.reference with the dense mask."""
    import flashsim

    mask = check_mask(family, N) if family in BENCH_FAMILIES + ("nokey",) else masks.parse(_spec(family, N), N)
    rng = np.random.default_rng(N)
    Q, K, V = (rng.standard_normal((N, 64)) for _ in range(3))
    O, L = _kernel_loop(Q, K, V, *flash3.tile_list(mask), flash3.column_vectors(mask))
    dense = mask.dense()
    np.testing.assert_allclose(O, flashsim.reference.attention(Q, K, V, mask=dense), atol=1e-12)
    L_ref = flashsim.reference.logsumexp(Q, K, mask=dense)[:, 0]
    assert (np.isneginf(L) == np.isneginf(L_ref)).all() and np.isneginf(L).any() == (family == "nokey")
    np.testing.assert_allclose(L[np.isfinite(L_ref)], L_ref[np.isfinite(L_ref)], atol=1e-12)


def test_block_sparse_tiles_are_listed_whole():
    mask = masks.parse("blocksparse:0.3:1", 1025)
    indptr, entries = flash3.tile_list(mask)
    assert len(entries) == int(mask.pattern(128, 128).sum()) and not (entries & 3).any()
    assert (flash3.column_vectors(mask) == [1025, 1025, 0, 0]).all()


def test_column_vectors_are_flashmasks_in_int4_order():
    mask = masks.parse("sliding:7", 50)
    cols = flash3.column_vectors(mask)
    assert cols.dtype == np.int32 and cols.shape == (50, 4) and cols.flags.c_contiguous
    for k, v in enumerate((mask.lts, mask.lte, mask.uts, mask.ute)):
        assert (cols[:, k] == v).all()


def test_masked_launch_is_v3_with_the_mask_in_its_plan():
    launch = registry.launch("cupy_flash3", batch=1, heads=4, seq_len=1000, head_dim=64,
                             mask="sliding:100")
    assert launch.version == 3 and launch.defines()["MASK"] == 1 and launch.causal is False
    assert launch.plan().mask == masks.parse("sliding:100", 1000)
    assert launch.plan_record()["mask"] == "sliding:100"
    assert "MASK" not in registry.launch("cupy_flash3", batch=1, heads=1, seq_len=64,
                                         head_dim=64).defines()
    vectors = tuple(getattr(masks.causal(1000), k) for k in ("lts", "lte", "uts", "ute"))
    given = masks.from_vectors(*vectors)
    assert registry.launch("cupy_flash3", batch=1, heads=1, seq_len=1000, head_dim=128,
                           mask=given).mask is given
    assert registry.launch("cupy_flash3", batch=1, heads=1, seq_len=1000, head_dim=128,
                           mask=vectors).mask == given


@pytest.mark.parametrize("kw, match", [
    (dict(mask="causal", causal=True), "not both"),
    (dict(mask="sliding:64", version=4), "version 3"),
    (dict(mask="sliding:64", head_dim=256), "d in"),
    (dict(mask="sliding:0"), "sliding window W must be a positive"),
    (dict(mask="document:100,100"), "sum to 200, not N = 256"),
    (dict(mask="prefix:999"), "more than N"),
    (dict(mask="diagonal"), "unknown mask"),
    (dict(mask=masks.causal(100)), "for N = 100, not N = 256"),
    (dict(mask=3), "mask must be a spec"),
    (dict(mask=(np.full(256, 9), np.full(256, 3), np.zeros(256, int), np.zeros(256, int))), "inverted"),
    (dict(mask=(np.full(256, 300), np.full(256, 300), np.zeros(256, int), np.zeros(256, int))),
     "out of range"),
    (dict(mask=(np.zeros(256, int),) * 3), "four"),
])
def test_bad_masks_are_refused_before_compiling(kw, match):
    args = {**dict(batch=1, heads=1, seq_len=256, head_dim=64), **kw}
    with pytest.raises(KernelInputError, match=match):
        registry.launch("cupy_flash3", **args)



# ------------------------------------------------------------------ the benchmark's model (no GPU)

@pytest.mark.parametrize("family", BENCH_FAMILIES)
def test_benchmark_masks_useful_work_and_tile_fractions(family):
    from benchmarks.masks_h200 import mask_spec, tile_fractions, visible_pairs

    N = 1000
    mask = masks.parse(mask_spec(family, N, window=100), N)
    assert visible_pairs(mask) == int(mask.dense().sum())
    f = tile_fractions(mask)
    t = mask.classify(128, 128)
    assert f["tiles"] == 64 and f["non_skipped_fraction"] == (t != masks.SKIP).mean()
    assert f["partial_fraction"] == (t == masks.PARTIAL).mean()
    indptr, entries = flash3.tile_list(mask)
    assert f["mask_input_bytes"] == indptr.nbytes + entries.nbytes + flash3.column_vectors(mask).nbytes
    assert mask_spec("document", 8192) == "document:2048,2048,2048,2048:causal"


def test_predicted_ratio_is_fraction_plus_partial_overhead():
    from benchmarks.masks_h200 import MASK_OPS, predicted_ratio
    from flashsim.hardware.presets import gpu

    hw = gpu("h200")
    frac = {"tiles": 128 * 128, "non_skipped_fraction": 0.25, "partial_fraction": 0.125}
    got = predicted_ratio(frac, unmasked_s=0.004, heads=32)
    t_tile = 0.004 * hw.sms / (128 * 128 * 32)
    kappa = MASK_OPS * 128 * 128 / (hw.fp32_ops_per_clk_sm * hw.tensor_clock_hz) / t_tile
    assert got["partial_overhead_kappa"] == pytest.approx(kappa)
    assert got["predicted_ratio"] == pytest.approx(0.25 + 0.125 * kappa)
    assert 0 < kappa < 1


def test_benchmark_table_reads_the_points(capsys):
    from types import SimpleNamespace

    from benchmarks.masks_h200 import MaskBench

    base = {"d": 64, "N": 16384, "mask": "sliding:1024"}
    pts = [{**base, "impl": "cupy_flash3_mask", "time_ms": 0.5, "non_skipped_fraction": 0.07,
            "partial_fraction": 0.01, "time_ratio": 0.1, "predicted_ratio": 0.08},
           {**base, "impl": "torch_flex", "time_ms": 0.47},
           {**base, "impl": "cupy_flash3", "mask": "none", "time_ms": 5.0}]
    bench = SimpleNamespace(results={"points": pts})
    MaskBench.table(bench)
    (row,) = bench.results["table"]
    assert row["ours_ms"] == 0.5 and row["flex_ms"] == 0.47 and row["sdpa_mask_ms"] is None
    assert "sliding:1024" in capsys.readouterr().out


# ------------------------------------------------------------------ on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", flash3.MASK_HEAD_DIMS)
@pytest.mark.parametrize("N", [97, 1025, 4097])
@pytest.mark.parametrize("family", BENCH_FAMILIES + ("nokey",))
def test_masked_kernel_matches_float64_reference(family, N, d, dtype):
    """benchmarks.masks_h200.check_masked: O within flash-attention's rule of the float64
    reference with the dense mask, L within 1e-5 of the float64 logsumexp, rows without keys
    O = 0 and L = -inf."""
    from tests.test_flash3 import _hopper_or_skip

    _, torch = _hopper_or_skip()
    mask = check_mask(family, N)
    verdict = check_masked(torch, mask, d, dtype, seed=N + d)
    assert verdict["ok"], verdict
    assert (verdict["rows_without_keys"] > 0) == (family == "nokey")
