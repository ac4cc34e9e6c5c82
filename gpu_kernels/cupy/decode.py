"""Decode attention over a KV cache on tensor cores, fp16 / bf16 (``cuda/decode.cu``):
Flash-Decoding (split-KV and a combine kernel), GQA packing, paged KV through a block table.

    launch = configure(batch=8, heads=32, kv_heads=8, head_dim=128, kv_lens=[32768] * 8,
                       q_len=1, dtype="fp16")                      # contiguous cache
    launch = configure(..., page_size=16, block_table=bt, num_pages=P)   # paged (vLLM)
    O, L = launch.run(q, k_cache, v_cache)                         # many times

Shapes (flash-attention's ``flash_attn_with_kvcache`` and vLLM's "NHD" cache):
    q, O        (batch, q_len, heads, d) fp16/bf16; the q_len new tokens are the last q_len
                positions of each sequence (their keys are already in the cache)
    k/v_cache   contiguous: (batch, capacity, kv_heads, d); paged: (num_pages, page_size,
                kv_heads, d) with block_table (batch, max_pages) int32: page i of sequence b
                holds its tokens i P .. i P + P - 1. At any strides with d contiguous
                (``cache_strides``): a head-major cache, PyTorch SDPA's (batch, kv_heads,
                capacity, d) or FlashInfer's "HND" pages (num_pages, kv_heads, P, d), runs as
                ``cache.transpose(1, 2)``, without a copy
    kv_lens     (batch,) the keys of each sequence (ragged); vLLM's cache_seqlens
    L           (batch, heads, q_len) fp32, natural-log logsumexp of each row of tau Q K^T
Causal (default): query position qi sees keys <= kv_len - q_len + qi (bottom-right aligned).

``configure`` is FlashInfer's ``plan``: it takes the batch layout as host values (kv_lens,
the block table), checks it (KernelInputError: heads not divisible by kv_heads, q_len >
kv_len under causal, page size 0, a block table past the cache or repeating a page, kv_lens
not matching the batch), picks the splits and uploads the layout once; ``run`` launches. The
NaN/Inf check needs the cache's values: ``run(check_finite=True)`` (one extra read of the
used cache on the device, before the launch; off by default on this fast path) and
``gpu_kernels.decode_attention`` (on by default) make it.

Splits (``splits=`` overrides the rule), over the thread blocks that fit the GPU at once:
``split_rule="fa2"``, FlashAttention-2's ``num_splits_heuristic`` (flashsim's, the one
``flashsim -a flashdecoding --splits auto`` takes; until 2026-12-02 this file had a copy
without its step that skips split counts with the same longest split), ``"wave"``
(``one_wave_splits``: fill one wave, equal splits) or ``"sm"`` (the same over the SMs: one
block per SM where two could be resident). Versions (the .cu file's header
describes the kernels): v1 (4 warps, the one-split-at-a-time combine), v2 (``warps=8``: up
to 128 packed rows in one block; ``combine=2``: the combine's loads 32 and 8 splits at a
time), v3 (``combine=3``: one combine block per output row, its 4 warps sharing the splits),
all with the fa2 rule, v4 (v3's kernels, the wave rule) and v5 (``wgmma=1``: decode_split
on Hopper's warpgroup MMA, 128 packed rows a block, compiled for sm_90a; v4 otherwise).
``configure``'s defaults are v4's up to 16 rows a KV head, and v5 from 32 rows
(``default_wgmma``; above 64 rows the mma.sync loop is bound by arithmetic) at its own tiles
(``WGMMA_TILES``): one warpgroup's 64-row blocks up to 64 rows (``wgmma=1, warps=4``: v5_w4),
two warpgroups above (``wgmma_warps``), and with splits, v6: decode_combine launched by
programmatic dependent launch (``pdl=1``, ``launch_ex``; sm_90), so its launch
overlaps decode_split's tail; v7 (``fused=1``): no decode_combine, the splits of a KV head
merge their partials inside decode_split after meeting at a counter (one wave of blocks,
launched cooperatively: ``launch_ex``); v8: v6 or v7 with the splits of the ``"sm"`` rule
(one block per SM where two fit; v4-v7 keep the wave rule's); v9, the defaults since
2026-12-03: v8 whose wgmma loop takes its K/V tiles from the TMA unit over a contiguous cache
(``tma=1``, ``default_tma``; ``launch.tensor_maps``) and, with two warpgroups, lets them take
turns at the tensor cores (``pingpong=1``, ``default_pingpong``); v12, the defaults over a
paged cache since 2026-12-03: v9's kernels with the wave rule's splits
(``default_split_rule``); v13 (``l2_prefetch``, ``evict_first``): L2 hints on the K/V copies,
timed beside the defaults by the benchmark's --l2-hints, not taken by them; v14
(``phased=1``): K and V loaded apart, FlashAttention-2's order, timed by --phased; v15
(``tmap_prefetch=1``): the tensor maps prefetched, timed by --timeline, not taken; v16, the
defaults over a contiguous cache since 2026-12-03: v9 whose one warpgroup puts a KV head's 32
rows (MQA at q_len 1) in the first 8 rows of each warp's 16 (``half_rows=1``,
``default_half_rows``); v17-v26: the comment above ``VARIANTS`` and the .cu file's header (v21
and, on long splits of two warpgroups, v23 the defaults over a contiguous cache since
2026-12-04; v26, a rule here: where two warpgroups would get splits of at most two tiles, one
warpgroup on each 64-row chunk, ``default_short_chunks``).
Where v4 runs with 32 rows or more (``wgmma=0``),
8 warps (``default_warps``: until 2026-12-02 only above 64, where 4 warps would make row
chunks that read K/V once each). ``VARIANTS`` lists what the benchmark times side
by side.
``reference_rows`` / ``check_rows`` are the correctness rule: float64 reference,
flash-attention's 2x bound.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from flashsim.algorithms.flashdecoding import num_splits_heuristic   # FlashAttention-2's rule
from flashsim.decode import GroupShape

from ..common import (SHARED_OPTIN, KernelInputError, KernelLaunch, Result, cdiv, describe, dtype_name,
                      flashsim_dtype)
from .common import LOG2E, CupyLaunch, as_cupy, get_kernel, output

CU_FILE = "decode.cu"
HOT = ("decode_split", "decode_combine")
HEAD_DIMS = (64, 128)
VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25)   # the .cu file's (v12, v26: rules here)
NUM_THREADS = 128                   # v1: 4 warps = ROW_WARPS x KEY_WARPS (v2: warps= 8)
WARPS = (4, 8)                      # NUM_WARPS of decode_split
COMBINES = (1, 2, 3, 4)             # COMBINE: decode_combine's version
COMBINE = 3                         # the default: v3's, one block per output row (v10's v4, one
                                    # round of loads, timed beside it: no faster, docs/decode.md)
COMBINE_THREADS = 128               # decode_combine: 4 warps, one output row each (v3, v4: one
                                    # row per block, the warps sharing its splits)
BLOCK_C = 64                        # B_c: keys per K/V tile
STAGES = {64: 4, 128: 3}            # K/V tiles in flight (cp.async buffers) per d
MAX_Q_LEN = 16
MAX_SPLITS = 128
KV_LENS_MAX = 256                   # v18: sequences whose kv_lens go by value (decode.cu's KvLens)
COMPILED_PAGE_SIZES = (0, 1, 16, 64)   # what CI compiles (any page size compiles on demand)
SM_SHARED = 228 * 1024              # shared memory per SM on sm_90; 1 KiB of it reserved per block
GRID_Z_LIMIT = 65535                # batch x kv_heads travel in gridDim.z
MAX_POOL_PAGES = 2**24              # page_table: pages of one pool (its permutation is built on the host)
WGMMA_ARCH = "sm_90a"               # v5's target (wgmma.cuh)
# v5's (B_c, STAGES) by default: 128-key tiles, two in flight (the benchmark's tuning step
# times these against v5 at mma.sync's tiles; decode_h200.json's "tuning" rows).
WGMMA_TILES = (128, 2)
TUNING_V5 = (WGMMA_TILES, (64, 4), (64, 3))
# TIMELINE's record of a decode_split block, in decode.cu's order (TL_SM ... TL_CLK_WAIT)
TIMELINE_FIELDS = ("sm", "entry_ns", "issued_ns", "first_tile_ns", "loop_end_ns", "exit_ns", "entry_clk",
                   "exit_clk", "wait_clk")
TMA_L2_PROMOTION = 128              # v9's tensor maps: the L2 fetch granularity of a TMA copy
L2_PREFETCH_SIZES = (0, 64, 128, 256)   # v13: the K/V copies' L2 prefetch sizes (0: no hint)
PHASED_BLOCK_C = 128                # v14's B_c by default: cuDNN's decode tile (16 x 128 x 128)
MBARRIER_SMEM = 128                 # v9's static shared memory: STAGES mbarriers (ptxas: 128 bytes)


def row_warps(rows: int, warps: int = 4, block_cols: int = BLOCK_C) -> int:
    """Warps along the packed query rows (16 rows each): 1, 2, 4 (8 with 8 warps); more rows:
    row chunks. At least so many that each key warp keeps 16 keys of a B_c tile."""
    rw = 1
    while 16 * rw < rows and rw < warps:
        rw *= 2
    while rw < warps and block_cols // (warps // rw) < 16:
        rw *= 2
    return rw


def smem_bytes(d: int, rw: int, block_cols: int = BLOCK_C, stages: int | None = None,
               wgmma: int = 0) -> int:
    """Dynamic shared memory of decode_split: Q_i (16 rw x d) and STAGES K_j, V_j tiles, 2-byte
    elements, and (v5) 1 KiB to align the swizzled panels (SMEM_BYTES in the .cu file)."""
    stages = STAGES[d] if stages is None else stages
    return (16 * rw * d + 2 * stages * block_cols * d) * 2 + (1024 if wgmma else 0)


# Resident blocks per SM that the registers allow, per (d, warps) (ptxas: up to 234 per thread
# at d = 128, 170 at d = 64 with 4 warps; 230 at d = 128 with 8; tests/test_decode_kernel.py
# holds it).
REGISTER_BLOCKS = {(64, 4): 3, (128, 4): 2, (64, 8): 1, (128, 8): 1}
# v5 (wgmma) per warps: __launch_bounds__ asks for 2 blocks of one warpgroup, 1 of two.
WGMMA_REGISTER_BLOCKS = {4: 2, 8: 1}


def blocks_per_sm(smem: int, d: int = 128, warps: int = 4, wgmma: int = 0) -> int:
    """Resident decode_split blocks per SM: as its shared memory (1 KiB reserved per block)
    and its registers (REGISTER_BLOCKS; v5: WGMMA_REGISTER_BLOCKS) allow."""
    regs = WGMMA_REGISTER_BLOCKS[warps] if wgmma else REGISTER_BLOCKS[(d, warps)]
    return max(1, min(regs, SM_SHARED // (smem + 1024)))


def one_wave_splits(blocks: int, slots: int, n_tiles: int, max_splits: int = MAX_SPLITS) -> int:
    """v4's splits: as many as one wave of ``slots`` resident blocks holds (at most
    ``max_splits`` and ``n_tiles``), then the fewest that keep the same longest split,
    ceil(n_tiles / S) tiles; 1 where ``blocks`` alone fill half the slots or more.

    Why: a memory-bound launch of one wave lasts as long as its longest split, and each busy
    SM adds its share of HBM bandwidth. FlashAttention-2's rule (``num_splits_heuristic``)
    takes the fewest splits within 85% of the best wave efficiency: at B = 1, kv_heads 8, one
    block per SM, 14 splits leave 20 of 132 SMs idle and make the longest split 37 of 512
    tiles, where 16 splits keep 128 busy with 32 tiles each."""
    top = max(1, min(max_splits, slots // blocks, n_tiles))
    return cdiv(n_tiles, cdiv(n_tiles, top))


# "sm" (v8, the default over a contiguous cache): one_wave_splits over the SMs instead of the
# resident-block slots, one block per SM where two could be resident (configure passes
# sm_count as the slots). Why:
# at B = 1, 4k keys the wave rule's 32 splits of 2 tiles each pay a split's fixed costs (the
# prologue's first loads, the partial's write and the combine's read of it) twice as often as
# 16 splits of 4 (decode_h200.json times v8 beside v6 and v7, which keep the wave rule:
# docs/decode.md's measured lines say where it is faster and where not).
SPLIT_RULES = {"wave": one_wave_splits, "fa2": num_splits_heuristic, "sm": one_wave_splits}


def default_split_rule(page_size) -> str:
    """The rule configure takes when given none: "sm" (v8) over a contiguous cache, "wave"
    (v12) over a paged one. The sweeps over paged caches (decode_splits_p16_h200.json, where
    the rule was chosen, and pages of 1 and 64 held out; docs/decode.md's measured lines) hold
    the rules against each other. The explanation we hold, not measured directly: a paged
    tile's copies wait on its block-table entries (and on the TLB for pages scattered through
    the pool), so one block an SM leaves too few bytes in flight, and a second resident
    block's loads cover the wait."""
    return "wave" if page_size else "sm"


def default_version(page_size) -> str:
    """The version configure's defaults are, as the benchmark's rows name it."""
    return "v12" if page_size else "v26"


def defines(d: int, dtype: str, page_size: int, rw: int, block_cols: int = BLOCK_C,
            stages: int | None = None, warps: int = 4, combine: int = COMBINE,
            page_prefetch: int = 1, wgmma: int = 0, pdl: int = 0, fused: int = 0,
            pingpong: int = 0, tma: int = 0, overlap: int = 0, l2_prefetch: int = 0,
            evict_first: int = 0, phased: int = 0, timeline: int = 0,
            tmap_prefetch: int = 0, half_rows: int = 0, producer: int = 0,
            kv_lens_arg: int = 0, stagger: int = 0, q_first: int = 0,
            turn_pv: int = 0, tree_softmax: int = 0) -> dict[str, int]:
    out = {"HEAD_DIM": d, "IS_BF16": int(dtype_name(dtype) == "bfloat16"), "PAGE_SIZE": page_size,
           "ROW_WARPS": rw, "BLOCK_C": block_cols, "STAGES": STAGES[d] if stages is None else stages,
           "NUM_WARPS": warps, "COMBINE": combine,
           "PAGE_PREFETCH": int(bool(page_prefetch and page_size)), "WGMMA": wgmma, "PDL": pdl,
           "FUSED": fused, "PINGPONG": pingpong, "TMA": tma, "OVERLAP": overlap}
    if l2_prefetch or evict_first:    # v13's hints; absent otherwise, so earlier builds keep their keys
        out |= {"L2_PREFETCH": l2_prefetch, "EVICT_FIRST": evict_first}
    for name, on in (("PHASED", phased), ("TMAP_PREFETCH", tmap_prefetch), ("HALF_ROWS", half_rows),
                     ("PRODUCER", producer), ("KV_LENS_ARG", kv_lens_arg), ("STAGGER", stagger),
                     ("QFIRST", q_first), ("TURN_PV", turn_pv), ("TREE_SOFTMAX", tree_softmax),
                     ("TIMELINE", timeline)):   # v14-v25, the probe
        if on:
            out[name] = 1
    return out



def default_warps(rows: int) -> int:
    """8 warps where a KV head has 32 packed rows or more, else 4 (v1's, measured at 0.9-1.0
    of cuDNN for kv_heads 8, 32: 4 to 16 rows). Above 64 rows 8 warps make one block where
    4 would make row chunks that re-read K/V; at 32 rows (MQA, q_len 1) each of 4 key warps
    takes 16 keys of a tile instead of 2 taking 32, and MQA's q_len = 1 points ran faster so
    at every point of the grid (decode_h200.json of 2026-12-02 04:06 UTC, as committed at
    3b05a93: v3_w8 against v3, the same splits, 1.02-1.16x). configure keeps 4 where 8 warps'
    merge would not fit the K/V buffers (2 stages)."""
    return 8 if rows >= 32 else 4


def merge_bytes(rows: int, warps: int, block_cols: int, d: int) -> int:
    """MERGE_BYTES of the .cu file: the KEY_WARPS partial states (O_i fp32, m_i, l_i) of a
    block's 16 ROW_WARPS rows, which must fit the K/V buffers they reuse."""
    rw = row_warps(rows, warps, block_cols)
    return warps // rw * 16 * rw * (d + 2) * 4


def default_wgmma(rows: int) -> int:
    """v5 where a KV head has 32 packed rows or more. Above 64 rows (MQA or a big group at
    q_len 4: 128 rows x 4 d FLOPs per key byte pair) v2's mma.sync loop is bound by
    arithmetic; at 32 (MQA at q_len 1) one warpgroup's 64-row block (v5_w4) was the fastest
    version at 7 of 9 points of decode_h200.json of 2026-12-02 (as committed at 72b13cf), at
    worst 0.987 of the fastest, and 0.99-1.09x of v4 where both ran."""
    return int(rows >= 32)


def wgmma_warps(rows: int) -> int:
    """v5's warps: two warpgroups (128-row blocks) above 64 rows, else one (64-row blocks)."""
    return 8 if rows > 64 else 4


def default_fused(splits: int) -> int:
    """v7 (the merge in decode_split) where there are more than 32 splits (and they fit one
    wave). Why: v6's combine (v3's: 4 warps a row, 8 loads in flight each) merges 32 splits
    in one round of loads and takes a dependent round more per 32 beyond, where v7 merges in
    one pass; at 32 splits or fewer v7 was the slower of the two more often than not
    (decode_h200.json times both at every point: docs/decode.md's measured lines)."""
    return int(splits > 32)


def default_tma(wgmma: int, page_size) -> int:
    """v9: the wgmma loop's K/V tiles by the TMA unit where the cache is contiguous (a tile
    is one box per 64-column panel; pages would take a box per page)."""
    return int(bool(wgmma) and not page_size)


def default_half_rows(wgmma: int, warps: int, rows: int, page_size) -> int:
    """v16 where one warpgroup of wgmma runs at most 32 rows a KV head over a contiguous cache:
    its 4 warps share the softmax of the 32 rows, where v9 leaves warps 2 and 3 the padding.
    Measured faster than v9 at all 9 MQA points of q_len 1 under both flushes, and at the 5
    held-out points (32 rows a KV head, off the grid, chosen before v16 was timed) at 4 after
    the table's flush and 5 after a clean one, in each of two runs (the median of 4 interleaved
    rounds; decode_half_rows_first_h200.json, decode_half_rows_h200.json, docs/decode.md's
    lines). Paged caches keep v12: not measured there."""
    return int(bool(wgmma) and warps == 4 and rows <= 32 and not page_size)


def kv_lens_value(lens) -> np.ndarray:
    """v18's KvLens parameter: ``lens`` in the first of KV_LENS_MAX int32 slots, as a
    one-element NumPy array of a structured dtype, which CuPy passes by value (as the tensor
    maps, common.tensor_map)."""
    words = np.zeros(KV_LENS_MAX, np.int32)
    words[:len(lens)] = lens
    return words.view(np.dtype([("n", np.int32, (KV_LENS_MAX,))]))


def default_kv_lens_arg(batch: int, page_size) -> int:
    """v18 wherever the batch fits the parameter (KV_LENS_MAX sequences), over a contiguous
    cache (pages keep v12's launch: not measured there). Measured at the table's short MQA and
    MHA steps and held-out points (decode_kv_lens_h200.json, docs/decode.md's lines)."""
    return int(batch <= KV_LENS_MAX and not page_size)


def default_q_first(wgmma: int, page_size) -> int:
    """v21 wherever the loop is wgmma's over a contiguous cache (pages keep v12's launch: not
    timed there). Nsight Compute's samples of v18 (decode_loop_sass_ncu_h200.csv) had the
    consumers waiting to store Q_i behind the K/V tiles; --q-first's interleaved rounds time
    v21 against v18 at the table's short MQA steps and B 8 at 32k, where it was chosen, and at
    held-out points (decode_q_first_h200*.json; docs/decode.md's lines say by how much)."""
    return int(bool(wgmma) and not page_size)


def default_producer(wgmma: int, warps: int, tma: int, fused: int) -> int:
    """v17 where two warpgroups of wgmma read a contiguous cache by TMA and do not merge the
    splits themselves (v7): without a barrier of the whole block a tile, one warpgroup's softmax
    runs beside the other's GEMMs. Measured 1.08-1.15x v9 at the MQA points of q_len 4 with
    long loops (B 8 at 128k, B 64 at 32k and 128k) under both flushes; at short steps (16
    tiles a block or fewer) 0.97-1.00x after the table's flush, 1.02-1.08x after a clean one
    (decode_producer_h200.json); 1.05-1.18x at 7 of 7 held-out long-loop points
    (decode_producer_heldout_h200.json; docs/decode.md's lines)."""
    return int(bool(wgmma) and warps == 8 and bool(tma) and not fused)


def producer_threads(warps: int, producer: int) -> int:
    """v17's threads beside the consumers (PRODUCER_THREADS): a warp beside one warpgroup, a
    warpgroup beside two (ptxas sizes registers by warpgroups; setmaxnreg moves them)."""
    return (128 if warps == 8 else 32) if producer else 0


TURN_PV_STAGES = 3                  # v23's stages by default (its P V frees a stage a turn later)
TURN_PV_MIN_TILES = 16              # v23 by default above this many tiles a split (--turn-pv's calibration)


def default_turn_pv(producer: int, warps: int, overlap: int, tiles_per_split: int) -> int:
    """v23 (at TURN_PV_STAGES) where v17's producer feeds two warpgroups and a split has more
    than TURN_PV_MIN_TILES tiles. Why: its turns let one warpgroup's softmax run beside the
    other's GEMMs in every tile of the loop, but cost at each end of a split (the second
    warpgroup waits for the first's S, the last P V runs alone) and, at 3 stages, a first tile
    that lands later. --turn-pv timed it at the table's MQA points of q_len 4 (calibration,
    decode_turn_pv_h200.json): faster than v21 from 64 tiles a split up, about even at 16 (B 8
    at 32k, B 64 at 4k), slower at 2; --turn-pv-heldout held the rule at points chosen after
    that run (docs/decode.md's lines give the ratios)."""
    return int(bool(producer) and warps == 8 and not overlap and tiles_per_split > TURN_PV_MIN_TILES)


CHUNKS_MAX_TILES = 2                # v26 by default up to this many tiles a split (--chunks-rule's calibration)


def default_short_chunks(wgmma: int, warps: int, page_size, tiles_per_split: int) -> int:
    """v26 where two warpgroups of wgmma would run a contiguous cache in splits of at most
    CHUNKS_MAX_TILES tiles: one warpgroup on each 64-row chunk instead (v9_w4's layout with
    v21's loads), on twice the blocks. Why: such a split has no loop to speak of, so a block's
    time is its prologue and epilogue (Q_i, the first tiles, the partial's write), which a
    64-row block does with half the rows; each chunk reads the K/V again, from the L2 at these
    lengths. --chunks-rule timed it at the table's MQA points of q_len 4 (calibration,
    decode_chunks_rule_h200.json and, with the 3 ms lead, decode_chunks_rule_lead3_h200.json):
    faster at 1 and 2 tiles a split, slower from 8 up, about even at 16 with two splits (B 64
    at 4k); its held-out points hold the rule (docs/decode.md's lines give the ratios)."""
    return int(bool(wgmma) and warps == 8 and not page_size and tiles_per_split <= CHUNKS_MAX_TILES)


def default_pingpong(wgmma: int, warps: int) -> int:
    """v9: the two warpgroups of a 128-row block take turns issuing S (PINGPONG)."""
    return int(bool(wgmma) and warps == 8)


def default_variant(rows: int) -> str:
    """The name in VARIANTS of the split kernel configure's defaults run for a KV head of
    ``rows`` packed rows (v6 launches the combine after it by programmatic dependent launch,
    v7 merges the splits in it)."""
    if not default_wgmma(rows):
        return "v4"
    return "v5" if wgmma_warps(rows) == 8 else "v5_w4"


# The configurations the benchmark times at every point of ours (name -> configure keywords):
# v1 as measured in the first run (4 warps), v2 (its combine, the block-table prefetch;
# default_warps), v3 (v2 with v3's combine), all three with FlashAttention-2's splits, v4
# (v3 with the one-wave splits) and v5 (v4 on wgmma); _w8: 8 warps whatever the rows; v5_w4:
# v5 with one warpgroup, 64-row blocks; v6: default_variant's kernels with decode_combine by
# programmatic dependent launch (configure's defaults at 2 to 32 splits).
# v7: v6's kernels merging the splits in decode_split (fused). v4-v7 take the wave rule's
# splits; v8: the "sm" rule's, v7 above 32 splits (where they fit one wave), v6 up to 32; v9:
# v8 with TMA and the ping-pong where they apply, the defaults; v10: v9 with decode_combine's
# v4 (one round of loads); v9_s3: v9 with 3 stages of 128-key tiles (two tiles in flight, where
# v9's 2 stages have one); v11: v9_s3 with the softmax beside the previous tile's P V (one tile in
# flight, as v9); v9_w4: v9 on one warpgroup's
# wgmma wherever (above 64 rows two 64-row chunks, each streaming the K/V, the second from the
# L2 where the step's K/V fits it, on twice the blocks at half the splits, no ping-pong; below
# 32 rows 64-row blocks of padding where the defaults run mma.sync; between, v9 itself).
# v14: the mma.sync loop with K and V loaded apart (phased), cuDNN's 128-key tile, the wave
# rule's splits (one 32 KB tile in flight a block: both resident slots wanted; --phased's run).
# v16: v9 with v16's rows at 32 (one warpgroup); v17, the defaults over a contiguous cache: v16
# with a producer warp(group) where two warpgroups of wgmma read by TMA without v7's merge
# (``default_producer``; the ping-pong off there; --producer's runs); v18: v17 with the kv_lens
# by value (``default_kv_lens_arg``; --kv-lens' run); v17 takes kv_lens_arg=0. (v19, ``stagger``,
# v20, the producer with the overlap, v22, the producer with strict ping-pong turns, v24, v23 with
# the overlap, and v25, ``tree_softmax``, are options --stagger, --overlap-producer,
# --pingpong-producer, --turn-overlap and --tree-softmax time, not configurations of the table.)
# v21: v18 with Q_i's loads issued before the K/V tiles' (``default_q_first``; --q-first's runs);
# v1-v18 take q_first=0. v23, the defaults over a contiguous cache: v21 with v23's turns at 3
# stages where the producer feeds two warpgroups long splits (``default_turn_pv``; --turn-pv's
# runs); v1-v21 take turn_pv=0. v26, the defaults over a contiguous cache: v23 with one warpgroup
# a 64-row chunk where two warpgroups would get splits of CHUNKS_MAX_TILES tiles or fewer
# (``default_short_chunks``; --chunks-rule's runs); v1-v23 take short_chunks=0. v1-v4 take
# wgmma=0, v1-v5 pdl=0, v1-v6 fused=0, v1-v8 tma=0 and pingpong=0.
VARIANTS = {name: {"producer": 0, "kv_lens_arg": 0, "q_first": 0, "turn_pv": 0, "short_chunks": 0, **kw}
            for name, kw in {   # v1-v16: neither
            "v1": dict(warps=4, combine=1, page_prefetch=0, split_rule="fa2", wgmma=0, pdl=0, fused=0),
            "v2": dict(combine=2, split_rule="fa2", wgmma=0, pdl=0, fused=0),
            "v2_w8": dict(warps=8, combine=2, split_rule="fa2", wgmma=0, pdl=0, fused=0),
            "v3": dict(combine=3, split_rule="fa2", wgmma=0, pdl=0, fused=0),
            "v3_w8": dict(warps=8, combine=3, split_rule="fa2", wgmma=0, pdl=0, fused=0),
            "v4": dict(combine=3, split_rule="wave", wgmma=0, pdl=0, fused=0),
            "v4_w8": dict(warps=8, combine=3, split_rule="wave", wgmma=0, pdl=0, fused=0),
            "v5": dict(warps=8, combine=3, split_rule="wave", wgmma=1, pdl=0, fused=0, tma=0, pingpong=0,
                        half_rows=0),
            "v5_w4": dict(warps=4, combine=3, split_rule="wave", wgmma=1, pdl=0, fused=0, tma=0, pingpong=0,
                           half_rows=0),
            "v6": dict(combine=3, split_rule="wave", pdl=None, fused=0, tma=0, pingpong=0, half_rows=0),
            "v7": dict(combine=3, split_rule="wave", pdl=None, fused=1, tma=0, pingpong=0, half_rows=0),
            "v8": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=0, pingpong=0, half_rows=0),
            "v9": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=0),
            "v9_w4": dict(warps=4, wgmma=1, combine=3, split_rule="sm", pdl=None, fused=None,
                          tma=None, pingpong=None, half_rows=0),
            "v10": dict(combine=4, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=0),
            "v9_s3": dict(wgmma=1, block_cols=128, stages=3, combine=3, split_rule="sm", pdl=None,
                          fused=None, tma=None, pingpong=None, half_rows=0),
            "v11": dict(wgmma=1, block_cols=128, stages=3, overlap=1, combine=3, split_rule="sm",
                        pdl=None, fused=None, tma=None, pingpong=None, half_rows=0),
            "v14": dict(phased=1, wgmma=0, block_cols=PHASED_BLOCK_C, stages=1, combine=3,
                        split_rule="wave", pdl=None, fused=None),
            "v16": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=None),
            "v17": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=None, producer=None),
            "v18": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=None, producer=None, kv_lens_arg=None),
            "v21": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=None, producer=None, kv_lens_arg=None, q_first=None),
            "v23": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=None, producer=None, kv_lens_arg=None, q_first=None, turn_pv=None,
                        stages=None),
            "v26": dict(combine=3, split_rule="sm", pdl=None, fused=None, tma=None, pingpong=None,
                        half_rows=None, producer=None, kv_lens_arg=None, q_first=None, turn_pv=None,
                        stages=None, short_chunks=None)}.items()}


# What the benchmark's tuning step compares (B_c, STAGES) at d = 128; the default first.
TUNING = ((BLOCK_C, STAGES[128]), (64, 2), (64, 4))


@dataclass
class DecodeLaunch(CupyLaunch, GroupShape):
    """One decode step's launch. Launch's N is the longest kv_len, block_rows B_r the packed
    query rows of a block (16 ROW_WARPS), block_cols B_c."""
    CU_FILE = CU_FILE
    MAIN = "decode_split"
    kv_heads: int = 1
    q_len: int = 1
    kv_lens: tuple = ()
    page_size: int = 0               # 0: contiguous cache
    block_table: np.ndarray | None = field(default=None, repr=False)
    num_pages: int | None = None
    splits: int = 1
    chunks: int = 1                  # row chunks per KV head
    row_warps: int = 1
    stages: int = 3                  # K/V tiles in flight
    warps: int = 4                   # NUM_WARPS of decode_split
    combine: int = COMBINE           # decode_combine's version
    page_prefetch: int = 1           # PAGE_PREFETCH: block-table entries one tile ahead
    split_rule: str = "sm"           # how ``splits`` was chosen: SPLIT_RULES, or "given"
    wgmma: int = 0                   # WGMMA: v5's decode_split (sm_90a)
    pdl: int = 0                     # PDL: decode_combine by programmatic dependent launch
    fused: int = 0                   # FUSED: v7, the merge in decode_split (no decode_combine)
    pingpong: int = 0                # PINGPONG: v9, two warpgroups take turns at the tensor cores
    tma: int = 0                     # TMA: v9, K/V tiles by the TMA unit (contiguous cache, wgmma)
    overlap: int = 0                 # OVERLAP: v11, a tile's softmax beside the previous tile's P V
    l2_prefetch: int = 0             # L2_PREFETCH: v13, the L2 prefetch size of the K/V copies (bytes)
    evict_first: int = 0             # EVICT_FIRST: v13, the K/V lines first out of the L2
    phased: int = 0                  # PHASED: v14, K and V loaded apart (FlashAttention-2's order)
    tmap_prefetch: int = 0           # TMAP_PREFETCH: v15, the tensor maps prefetched at entry
    half_rows: int = 0               # HALF_ROWS: v16, <= 32 rows in the first 8 of each warp's 16
    producer: int = 0                # PRODUCER: v17, a producer warp issues the tiles (no block barrier a tile)
    kv_lens_arg: int = 0             # KV_LENS_ARG: v18, the kv_lens by value (a kernel parameter)
    stagger: int = 0                 # STAGGER: v19, the producer's prologue one tile at a time
    q_first: int = 0                 # QFIRST: v21, Q_i's loads issued before any K/V tile's
    turn_pv: int = 0                 # TURN_PV: v23, a warpgroup's turn issues P_j V_j and S_{j+1}
    tree_softmax: int = 0            # TREE_SOFTMAX: v25, a row's max and sum in 4 partial chains
    short_chunks: int = 0            # v26: one warpgroup a 64-row chunk (a rule of configure's)
    timeline: int = 0                # TIMELINE: a probe of where decode_split's time goes (``probe``)

    @property
    def rows(self) -> int:
        """Packed query rows per KV head: q_len x group (flashsim's G)."""
        return self.group_rows

    @property
    def flops(self) -> int:
        """4 d sum_b (rows of b x kv_len of b): both matmuls, without the causal mask."""
        return 4 * self.d * self.q_len * self.heads * sum(self.kv_lens)

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the step must read: 2 (K, V) x sum kv_len x kv_heads x d x 2 bytes."""
        return 2 * sum(self.kv_lens) * self.kv_heads * self.d * 2

    def defines(self) -> dict[str, int]:
        return defines(self.d, self.dtype, self.page_size, self.row_warps, self.block_cols,
                       self.stages, self.warps, self.combine, self.page_prefetch, self.wgmma,
                       self.pdl, self.fused, self.pingpong, self.tma, self.overlap, self.l2_prefetch,
                       self.evict_first, self.phased, self.timeline, self.tmap_prefetch,
                       self.half_rows, self.producer, self.kv_lens_arg, self.stagger, self.q_first,
                       self.turn_pv, self.tree_softmax)

    def arch(self) -> str | None:
        """sm_90a for v5 (wgmma), else CuPy's target for the device."""
        return WGMMA_ARCH if self.wgmma else None

    def launch_kernel(self, kl: KernelLaunch, args: tuple) -> None:
        """As CupyLaunch's; v5 is refused on GPUs other than Hopper and v6 on GPUs before it,
        before launching; v6's combine and v7's split kernel go through ``launch_ex``. The
        kernel is looked up once per device (the workspace keeps it): a step is issued from
        Python, and each lookup costs microseconds."""
        import cupy

        key = ("kernel", kl.kernel, cupy.cuda.runtime.getDevice())
        kernel = self.workspace.get(key)
        if kernel is None:
            cc = cupy.cuda.Device().compute_capability
            if self.wgmma and cc != "90":
                raise KernelInputError(f"v5 (wgmma) runs on compute capability 9.0 (Hopper), this "
                                       f"GPU has {cc[:-1]}.{cc[-1]}: configure with wgmma=0")
            if self.pdl and int(cc) < 90:
                raise KernelInputError(f"v6 (programmatic dependent launch) needs compute capability "
                                       f"9.0 or newer, this GPU has {cc[:-1]}.{cc[-1]}: configure "
                                       "with pdl=0")
            kernel = self.workspace[key] = get_kernel(self.CU_FILE, kl.kernel, self.defines(),
                                                      kl.dynamic_smem, self.arch())
        if (self.pdl and kl.kernel == "decode_combine") or self.fused:
            launch_ex(kernel, kl, args, "cooperative" if self.fused else "programmatic")
        else:
            kernel(kl.grid, (kl.threads,), args, shared_mem=kl.dynamic_smem)

    def launches(self) -> list[KernelLaunch]:
        out = [KernelLaunch("decode_split", (self.chunks, self.splits, self.batch * self.kv_heads),
                            32 * self.warps + producer_threads(self.warps, self.producer),
                            self.dynamic_smem)]
        if self.splits > 1 and not self.fused:
            rows = self.batch * self.q_len * self.heads
            per_block = 1 if self.combine in (3, 4) else COMBINE_THREADS // 32
            out.append(KernelLaunch("decode_combine", (cdiv(rows, per_block),), COMBINE_THREADS))
        return out

    def lens(self) -> dict:
        """The sequences' KV lengths as ``DecodeKernel.launch`` takes them back: ``{"kv_len":
        N}`` when every sequence holds N keys, else ``{"kv_lens": [...]}``."""
        return ({"kv_len": self.N} if len(set(self.kv_lens)) == 1 else
                {"kv_lens": list(self.kv_lens)})

    def kv_bytes_read(self) -> int:
        """K and V bytes decode_split reads, from its index arithmetic: per (sequence, KV head,
        row chunk) the keys p < kv_len of all its T_c = ceil(kv_len / B_c) tiles (the rest are
        zero-filled, not read), 2 (K, V) x d x 2 bytes each: kv_bytes with one chunk, K/V once
        per chunk with more."""
        return 2 * self.chunks * sum(self.kv_lens) * self.kv_heads * self.d * 2

    @property
    def plan_block_rows(self) -> int:
        """The query rows a block computes, as flashsim's B_r: all q_len x group rows of a KV
        head (one chunk), else the chunk's 16 ROW_WARPS."""
        return self.rows if self.chunks == 1 else self.block_rows

    def plan(self, gpu=None):
        """flashsim's plan for exactly this step (``flashdecoding`` or ``paged``): the same
        kv_lens, q_len, heads, kv_heads, d, dtype, causal mask, splits S, B_c, B_r
        (``plan_block_rows``), page size and warps per block. KernelInputError (one line)
        where flashsim's nest cannot tile it (a chunk that does not divide the group's rows, a
        page size that neither divides B_c nor is a multiple of it)."""
        import flashsim
        from flashsim.hardware.presets import DEFAULT_GPU

        from ..common import FlashsimError

        try:
            return flashsim.plan(self.algorithm, q_len=self.q_len, kv_lens=list(self.kv_lens),
                                 heads=self.heads, kv_heads=self.kv_heads, head_dim=self.d,
                                 batch=self.batch, dtype=self.dtype, splits=self.splits,
                                 page_size=self.page_size or None, block_cols=self.block_cols,
                                 block_rows=self.plan_block_rows, causal=self.causal,
                                 warps=self.warps, gpu=gpu or DEFAULT_GPU,
                                 fused_combine=bool(self.fused))   # configure: fused only with splits
        except KernelInputError:
            raise
        except FlashsimError as exc:
            raise KernelInputError(f"{self.kernel}: flashsim has no plan for this launch: {exc}") from exc

    def options(self) -> dict:
        """``configure``'s keywords that build this launch again with its shape: the splits,
        tiles, warps and versions it took (a rule's choice is not made a second time)."""
        return dict(splits=self.splits, block_cols=self.block_cols, stages=self.stages,
                    warps=self.warps, combine=self.combine, page_prefetch=self.page_prefetch,
                    wgmma=self.wgmma, pdl=self.pdl, fused=self.fused, pingpong=self.pingpong,
                    tma=self.tma, overlap=self.overlap, l2_prefetch=self.l2_prefetch,
                    evict_first=self.evict_first, phased=self.phased,
                    tmap_prefetch=self.tmap_prefetch, half_rows=self.half_rows, producer=self.producer,
                    kv_lens_arg=self.kv_lens_arg, stagger=self.stagger, q_first=self.q_first,
                    turn_pv=self.turn_pv, tree_softmax=self.tree_softmax, short_chunks=self.short_chunks)

    def plan_record(self) -> dict:
        return dict(algorithm=self.algorithm, dtype=self.dtype, block_rows=self.block_rows,
                    block_cols=self.block_cols, splits=self.splits, page_size=self.page_size,
                    kv_heads=self.kv_heads, q_len=self.q_len, row_warps=self.row_warps,
                    warps=self.warps, combine=self.combine, stages=self.stages,
                    page_prefetch=self.page_prefetch, wgmma=self.wgmma, fused=self.fused,
                    tma=self.tma, pingpong=self.pingpong, overlap=self.overlap)

    # ------------------------------------------------------------------ inputs
    def cache_shape_ok(self, shape: tuple) -> str | None:
        """None if a K/V cache of ``shape`` fits this launch, else why not."""
        if len(shape) != 4 or shape[2:] != (self.kv_heads, self.d):
            return f"expected 4 dimensions ending in (kv_heads, d) = {(self.kv_heads, self.d)}"
        if self.page_size:
            if shape[:2] != (self.num_pages, self.page_size):
                return f"expected (num_pages, page_size) = {(self.num_pages, self.page_size)} first"
        elif shape[0] != self.batch or shape[1] < self.N:
            return f"expected (batch, capacity >= max kv_len) = ({self.batch}, >= {self.N}) first"
        return None

    def _checked(self, q, k_cache, v_cache):
        dt = dtype_name(self.dtype)
        views = []
        for x, name, want in ((q, "q", (self.batch, self.q_len, self.heads, self.d)),
                              (k_cache, "k_cache", None), (v_cache, "v_cache", None)):
            a, got = as_cupy(x, name)
            if got != dt and not (dt == "bfloat16" and got == "int16"):
                raise KernelInputError(f"{name} has dtype {got}; this launch is for {dt}")
            shape = tuple(a.shape)
            why = (None if shape == want else f"expected {want}") if want else self.cache_shape_ok(shape)
            if why:
                raise KernelInputError(f"{name} has shape {shape}: {why}")
            if want and not a.flags.c_contiguous:
                raise KernelInputError(f"{name} is not C-contiguous; pass a contiguous copy")
            views.append(a)
        if views[1].shape != views[2].shape:
            raise KernelInputError(f"k_cache and v_cache shapes differ: {views[1].shape}, {views[2].shape}")
        strides = [cache_strides(a, name) for a, name in zip(views[1:], ("k_cache", "v_cache"))]
        if strides[0] != strides[1]:
            raise KernelInputError(f"k_cache and v_cache strides differ (elements): {strides[0]}, "
                                   f"{strides[1]}; the kernel reads both at one offset")
        return views

    def used_rows(self, cache, seqs=None):
        """The cached rows this step reads, sequence by sequence (views or gathers of ``cache``,
        NumPy or CuPy): (kv_len_b, kv_heads, d) each, of the sequences ``seqs`` (None: all)."""
        out = []
        for b in range(self.batch) if seqs is None else seqs:
            n = self.kv_lens[b]
            if self.page_size:
                pages = self.block_table[b, :cdiv(n, self.page_size)]
                if type(cache).__module__.startswith("torch"):
                    import torch

                    pages = torch.as_tensor(pages, device=cache.device, dtype=torch.long)
                elif not isinstance(cache, np.ndarray):
                    import cupy

                    pages = cupy.asarray(pages)
                out.append(cache[pages].reshape(-1, self.kv_heads, self.d)[:n])
            else:
                out.append(cache[b, :n])
        return out

    def check_finite(self, q, k_cache, v_cache) -> None:
        """KernelInputError if q or a cached row this step reads holds NaN or Inf (NumPy
        arrays on the host; CuPy/torch on the device: one read of the used rows)."""
        xp = np
        if describe(q, "q").kind != "numpy":
            import cupy as xp
            q, k_cache, v_cache = (as_cupy(x, n)[0] for x, n in
                                   ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")))
        if self.dtype == "bf16" and q.dtype == xp.int16:
            def bad(x):    # bf16 bits: exponent all ones is Inf or NaN
                return bool(((x.view(xp.uint16) & 0x7F80) == 0x7F80).any())
        else:
            def bad(x):
                return not bool(xp.isfinite(x).all())
        if bad(q):
            raise KernelInputError("q holds NaN or Inf")
        for cache, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
            for b, rows in enumerate(self.used_rows(cache)):
                if bad(rows):
                    raise KernelInputError(f"{name} holds NaN or Inf in the rows of sequence {b}")

    def _device_layout(self):
        """kv_lens and the block table on the device, uploaded once."""
        import cupy

        if "kv_lens" not in self.workspace:
            self.workspace["kv_lens"] = cupy.asarray(np.asarray(self.kv_lens, np.int32))
            bt = self.block_table if self.page_size else np.zeros((self.batch, 1), np.int32)
            self.workspace["block_table"] = cupy.asarray(np.ascontiguousarray(bt, np.int32))
        return self.workspace["kv_lens"], self.workspace["block_table"]

    def _partials(self):
        import cupy

        if "O_part" not in self.workspace:
            rows = self.batch * self.q_len * self.heads
            self.workspace["O_part"] = cupy.empty((self.splits, rows, self.d), cupy.float32)
            self.workspace["L_part"] = cupy.empty((self.splits, rows), cupy.float32)
        return self.workspace["O_part"], self.workspace["L_part"]

    def _counters(self):
        """v7's arrival counters, 2 per (sequence, KV head, row chunk): zeroed once, and each
        launch leaves them zero."""
        import cupy

        if "counters" not in self.workspace:
            self.workspace["counters"] = cupy.zeros(2 * self.chunks * self.batch * self.kv_heads,
                                                    cupy.int32)
        return self.workspace["counters"]

    def probe(self) -> "DecodeLaunch":
        """This launch built with TIMELINE (decode.cu): the same kernels, tiles and splits, and
        decode_split's blocks each stamp where their time goes; ``stamps()`` reads those
        of the last run."""
        return replace(self, timeline=1, workspace={})

    def _timeline(self):
        import cupy

        if "timeline" not in self.workspace:
            split = self.launches()[0]
            self.workspace["timeline"] = cupy.zeros((int(np.prod(split.grid)), len(TIMELINE_FIELDS)),
                                                    cupy.uint64)
        return self.workspace["timeline"]

    def stamps(self) -> dict[str, np.ndarray]:
        """The last run's stamps of a ``probe()`` launch, per decode_split block (blockIdx.x
        fastest, then y, z): TIMELINE_FIELDS -> int64 arrays (decode.cu's Timeline says what
        each is)."""
        if not self.timeline:
            raise KernelInputError("stamps(): this launch was not built as a probe (probe())")
        rec = self._timeline().get().astype(np.int64)
        return {name: rec[:, i] for i, name in enumerate(TIMELINE_FIELDS)}

    def run(self, q, k_cache, v_cache, out=None, lse=None, check_finite: bool = False,
            only: str | None = None) -> Result:
        """q (B, q_len, H, d), k_cache / v_cache as configured (CuPy arrays or torch CUDA
        tensors) -> Result(O like q, L (B, H, q_len) float32). ``out`` / ``lse``: buffers to
        write into. Everything is checked before anything is launched. ``only``: the name of
        one of ``launches()`` to launch alone (the benchmark times a step's kernels one by
        one; O is then not the step's output)."""
        import cupy

        kernels = self.launches()
        if only is not None and only not in [kl.kernel for kl in kernels]:
            raise KernelInputError(f"only = {only!r}: this step launches "
                                   f"{', '.join(kl.kernel for kl in kernels)}")
        q, k, v = self._checked(q, k_cache, v_cache)
        if check_finite:
            self.check_finite(q, k, v)
        dt = dtype_name(self.dtype)
        if out is not None and dt == "bfloat16" and as_cupy(out, "out")[1] == "int16":
            dt = "int16"                      # a CuPy buffer of bf16 bits
        O = output(out, "out", tuple(q.shape), dt, like=q)
        L = output(lse, "lse", (self.batch, self.heads, self.q_len), "float32")
        kv_lens, bt = self._device_layout()
        O_part, L_part = self._partials() if self.splits > 1 else (O, L)   # unused when 1 split
        per_launch = self.kernel_args(cupy, q, k, v, O, L, O_part, L_part, bt, kv_lens, self._counters())
        if self.tma:                          # v9: the caches' tensor maps, by value
            per_launch[0] += self.tensor_maps(k, v)
        if self.kv_lens_arg:                  # v18: the kv_lens, by value
            per_launch[0] += (kv_lens_value(self.kv_lens),)
        if self.timeline:
            per_launch[0] += (self._timeline(),)
        for kl, args in zip(kernels, per_launch):
            if only in (None, kl.kernel):
                self.launch_kernel(kl, args)
        return Result(O, L)

    def tensor_maps(self, k, v) -> tuple:
        """v9's CUtensorMaps of the K and V caches (CuPy arrays (B, capacity, kv_heads, d) at
        any strides ``cache_strides`` takes) as 4-D tensors (d, N, kv_heads, B), N the longest
        kv_len, boxes of 64 columns x B_c keys (tma.cuh's tma_load_4d). The kernel asks them
        for whole tiles below a sequence's kv_len only (its ragged last tile goes by cp.async).
        A dimension of size 1 is never stepped along: its stride is given as 16 bytes.
        Made once per pair of caches (a launch's ``workspace`` keeps the last)."""
        from .common import tensor_map

        key = tuple((x.data.ptr, x.shape, x.strides) for x in (k, v))
        if self.workspace.get("tensor_maps_of") != key:
            def stride(x, i):
                return x.strides[i] if x.shape[i] > 1 else 16
            self.workspace["tensor_maps"] = tuple(
                tensor_map(x.data.ptr, (self.d, self.N, x.shape[2], x.shape[0]),
                           (stride(x, 1), stride(x, 2), stride(x, 0)), (64, self.block_cols, 1, 1),
                           self.dtype == "bf16", self.l2_prefetch or TMA_L2_PROMOTION) for x in (k, v))
            self.workspace["tensor_maps_of"] = key
        return self.workspace["tensor_maps"]

    def kernel_args(self, xp, q, k, v, O, L, O_part, L_part, block_table, kv_lens, counters) -> list:
        """The argument tuples of ``launches()`` in order (decode_split's, then
        decode_combine's), the scalars as ``xp``'s (CuPy, or NumPy for an emulation) types;
        ``counters``: v7's (``_counters``), passed to every version."""
        outer, row, head = cache_strides(k, "k_cache")
        i32 = xp.int32
        split = (q, k, v, O, L, O_part, L_part, block_table, kv_lens, i32(self.batch),
                 i32(self.q_len), i32(self.group), i32(self.kv_heads), i32(block_table.shape[1]),
                 xp.int64(outer), i32(row), xp.int64(head), i32(self.splits), i32(self.causal),
                 xp.float32(self.tau * LOG2E), counters)
        combine = (O_part, L_part, O, L, i32(self.batch * self.q_len * self.heads),
                   i32(self.splits), i32(self.heads), i32(self.q_len))
        return [split, combine][:len(self.launches())]


# ---------------------------------------------------------------------- configure (FlashInfer's plan)

def launch_ex(kernel, kl: KernelLaunch, args: tuple, how: str) -> None:
    """Launch ``kernel`` (a CuPy RawKernel) on CuPy's current stream through cuLaunchKernelEx
    with one attribute. ``how`` "programmatic": programmatic stream serialization, so it may
    start before the grid ahead of it in the stream ends, and waits for it in
    ``griddepcontrol.wait`` (v6, PDL in decode.cu); "cooperative": every block resident at
    once, or the driver refuses the launch (v7, whose blocks wait for each other). The launch
    configuration is made once per kernel, grid and attribute (``_launch_config``)."""
    import cupy
    from cuda.bindings import driver as cu

    cfg, function = _launch_config(kernel.kernel.ptr, kl, how, cupy.cuda.get_current_stream().ptr)
    # each argument's bytes in a ctypes object, and the array of their addresses (the void**
    # kernelParams): arrays as pointers, scalars as their C type, a NumPy array (v9's tensor
    # maps) by value, as CuPy passes it
    held = [ctypes.c_void_p(a.data.ptr) if isinstance(a, cupy.ndarray) else
            (ctypes.c_uint8 * a.nbytes).from_buffer_copy(a.tobytes()) if isinstance(a, np.ndarray) else
            _C_TYPES[type(a)](a.item()) for a in args]
    params = (ctypes.c_void_p * len(held))(*map(ctypes.addressof, held))
    err, = cu.cuLaunchKernelEx(cfg, function, ctypes.addressof(params), 0)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx({kl.kernel}, {how}): {err}")


_C_TYPES = {np.int32: ctypes.c_int, np.int64: ctypes.c_longlong, np.float32: ctypes.c_float}


@functools.lru_cache(maxsize=256)
def _launch_config(function: int, kl: KernelLaunch, how: str, stream: int):
    """(CUlaunchConfig of ``kl``'s grid, block and dynamic shared memory on ``stream`` with
    ``how``'s attribute, CUfunction) for ``launch_ex``: building them through cuda.bindings
    costs more than the launch."""
    from cuda.bindings import driver as cu

    attr = cu.CUlaunchAttribute()
    if how == "cooperative":
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
    else:
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (tuple(kl.grid) + (1, 1))[:3]
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = kl.threads, 1, 1
    cfg.sharedMemBytes = kl.dynamic_smem
    cfg.hStream = cu.CUstream(stream)
    cfg.attrs, cfg.numAttrs = [attr], 1
    return cfg, cu.CUfunction(function)


def cache_strides(a, name: str) -> tuple[int, int, int]:
    """The strides in elements of a K/V cache (4 dimensions, d last): (between sequences or
    pages, between keys, between KV heads). Any layout whose d is contiguous runs (a
    head-major cache through a transposed view: no copy); each stride a multiple of 8
    elements and the start 16-byte aligned (the kernel's 16-byte cp.async), none negative."""
    item = a.dtype.itemsize
    # a dimension of size 1 is only ever indexed at 0: its stride, whatever a framework
    # reports for it, is never used
    strides = [0 if n == 1 else st for n, st in zip(a.shape, a.strides)]
    es = [st // item for st in strides]
    if a.shape[3] > 1 and a.strides[3] != item:
        raise KernelInputError(f"{name}'s last dimension (d) is not contiguous (strides {tuple(a.strides)} "
                               "bytes); pass a view whose d is, or a contiguous copy")
    if any(st % item or e < 0 or e % 8 for st, e in zip(strides[:3], es)):
        raise KernelInputError(f"{name} has strides {tuple(es[:3])} elements before d; each must be a "
                               "non-negative multiple of 8 (16-byte loads)")
    if es[1] >= 2**31:                      # the kernel's kv_row_stride is an int
        raise KernelInputError(f"{name}'s stride between keys, {es[1]} elements, is 2**31 or more")
    ptr = a.data.ptr if hasattr(a, "data") and hasattr(a.data, "ptr") else a.ctypes.data
    if ptr % 16:
        raise KernelInputError(f"{name} does not start on a 16-byte boundary")
    return es[0], es[1], es[2]


def _int(value, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise KernelInputError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def host_values(x, name: str) -> np.ndarray:
    """``x`` (a sequence, NumPy, CuPy or torch array) as a NumPy array on the host (a device
    array is copied: the batch layout is planned on the host, as FlashInfer's plan does)."""
    if hasattr(x, "get") and not isinstance(x, np.ndarray):      # CuPy
        return x.get()
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError):
        raise KernelInputError(f"{name} must be integers (a list or an array)") from None


def check_layout(batch: int, kv_lens, q_len: int, causal: bool, page_size: int,
                 block_table, num_pages) -> tuple[tuple, np.ndarray | None]:
    """(kv_lens, block table) checked: one kv_len >= 1 per sequence, q_len <= kv_len under the
    causal mask, and (paged) every page a sequence uses inside the cache and used once."""
    lens = host_values(kv_lens, "kv_lens").reshape(-1)
    if lens.size != batch:
        raise KernelInputError(f"kv_lens has {lens.size} entries; the batch has {batch} sequences")
    if lens.dtype.kind not in "iu" or (lens < 1).any():
        raise KernelInputError(f"kv_lens must be integers >= 1, got {lens.tolist()[:8]}")
    if causal and (lens < q_len).any():
        b = int(np.argmax(lens < q_len))
        raise KernelInputError(f"q_len = {q_len} > kv_len = {int(lens[b])} of sequence {b} under "
                               "the causal mask (the new tokens must be in the cache)")
    if lens.max() >= 2**31:
        raise KernelInputError("kv_len must be below 2^31")
    lens = tuple(int(n) for n in lens)
    if not page_size:
        if block_table is not None:
            raise KernelInputError("block_table is for a paged cache: give page_size too")
        return lens, None
    if block_table is None or num_pages is None:
        raise KernelInputError("a paged cache needs block_table and num_pages")
    num_pages = _int(num_pages, "num_pages")
    bt = host_values(block_table, "block_table")
    if bt.ndim != 2 or bt.shape[0] != batch or bt.dtype.kind not in "iu":
        raise KernelInputError(f"block_table must be integers of shape (batch, max_pages) = "
                               f"({batch}, ...), got {bt.dtype} {bt.shape}")
    used = []
    for b, n in enumerate(lens):
        need = cdiv(n, page_size)
        if need > bt.shape[1]:
            raise KernelInputError(f"sequence {b} needs {need} pages of {page_size}; block_table "
                                   f"has {bt.shape[1]} columns")
        row = bt[b, :need]
        if (row < 0).any() or (row >= num_pages).any():
            raise KernelInputError(f"block_table row {b} points past the cache of {num_pages} pages")
        used.append(row)
    used = np.sort(np.concatenate(used))             # a sort: np.unique's hash is slower here
    repeated = used[1:][used[1:] == used[:-1]]
    if repeated.size:
        raise KernelInputError(f"block_table repeats page {int(repeated[0])}: each page "
                               "holds one sequence's tokens")
    return lens, np.ascontiguousarray(bt, np.int32)


def configure(batch: int, heads: int, kv_heads: int, head_dim: int, *, kv_lens, q_len: int = 1,
              dtype: str = "fp16", causal: bool = True, page_size=None, block_table=None,
              num_pages=None, splits=None, sm_count: int = 132, block_cols=None,
              stages=None, warps=None, combine=COMBINE, page_prefetch=1,
              split_rule=None, wgmma=None, pdl=None, fused=None, pingpong=None, tma=None,
              overlap=0, l2_prefetch=0, evict_first=0, phased=0, tmap_prefetch=0,
              half_rows=None, producer=None, kv_lens_arg=None, stagger=0, q_first=None,
              turn_pv=None, tree_softmax=0, short_chunks=None) -> DecodeLaunch:
    """The launch for one decode step of this batch layout, checked (KernelInputError) before
    anything touches a GPU. ``page_size`` None: a contiguous cache; else a paged one with
    ``block_table`` and ``num_pages``. ``splits`` None: ``split_rule``'s (SPLIT_RULES: "wave", "sm",
    "fa2"; None: ``default_split_rule``) for ``sm_count`` SMs.
    ``block_cols`` (B_c) and ``stages``: the tile and the tiles in flight (None: BLOCK_C,
    STAGES[d]; v5: WGMMA_TILES). ``warps``: decode_split's warps, 4 or 8 (None: ``default_warps``);
    ``combine``: decode_combine's version, 1 to 4 (the .cu file's header); ``page_prefetch``
    1 (paged): block-table entries read one tile ahead, 0: as v1; ``wgmma``: 1 for v5 (sm_90a;
    8 warps, 128 rows a block, or with ``warps=4`` 64; None warps: ``wgmma_warps``), 0 not,
    None: ``default_wgmma``; ``pdl``: 1 launches decode_combine by programmatic dependent
    launch (sm_90, v6: PDL in the .cu file), 0 not, None: 1 where there are splits;
    ``fused``: 1 merges the splits in decode_split where there are splits (v7: FUSED in the
    .cu file; its grid must fit one wave of ``sm_count`` SMs), 0 not, None: ``default_fused``
    where there are splits and they fit; ``pdl`` None is then 0. ``tma``: 1 takes the wgmma
    loop's K/V tiles from the TMA unit (v9: TMA in the .cu file; a contiguous cache), 0 by
    cp.async, None: ``default_tma``; ``pingpong``: 1 lets two warpgroups take turns issuing S
    (v9: PINGPONG; 8 warps on wgmma), 0 not, None: ``default_pingpong``; ``overlap``: 1 runs a
    tile's softmax while the previous tile's P V is on the tensor cores (v11: OVERLAP; wgmma,
    3 stages or more), 0 not. ``l2_prefetch``: 64, 128 or 256, the L2 prefetch size of the K/V
    copies (v13: L2_PREFETCH; the TMA unit's through its tensor maps), 0 none (the tensor maps:
    TMA_L2_PROMOTION); ``evict_first``: 1 marks the K/V lines first out of the L2 (v13), 0 not;
    ``phased``: 1 loads K and V apart in one buffer each, FlashAttention-2's order (v14:
    PHASED; mma.sync over a contiguous cache, stages 1, B_c 128 unless given), 0 not;
    ``tmap_prefetch``: 1 prefetches the tensor maps at entry (v15: TMAP_PREFETCH; tma 1), 0 not;
    ``half_rows``: 1 places at most 32 rows in the first 8 rows of each warp's 16 (v16:
    HALF_ROWS; wgmma with 4 warps), 0 not, None: ``default_half_rows``; ``producer``: 1 adds a
    warp that issues every K/V tile as its stage frees, the others computing without a barrier of
    the whole block a tile (v17: PRODUCER; tma 1, not with fused; pingpong None and fused
    None are then 0; with ``overlap=1``, v20; with ``pingpong=1``, strict turns of the two
    warpgroups, v22), 0 not, None: ``default_producer``
    (where pingpong and overlap are not asked for); ``kv_lens_arg``: 1 passes the kv_lens by value, a kernel
    parameter (v18: KV_LENS_ARG; at most KV_LENS_MAX sequences), 0 through global memory,
    None: ``default_kv_lens_arg``; ``stagger``: 1 has the producer ask for its first tiles one
    at a time, each once the one before has landed (v19: STAGGER; producer 1), 0 all at once;
    ``q_first``: 1 issues the loads of Q_i into registers before any K/V tile is asked for, so
    that they do not queue behind the tiles (v21: QFIRST; wgmma), 0 after them, None:
    ``default_q_first``; ``turn_pv``: 1 has a warpgroup's turn issue P_j V_j and S_{j+1}
    together, FlashAttention-3's ping-pong (v23: TURN_PV; producer 1 and pingpong 1; with
    ``overlap=1`` and 3 stages, the softmax of S_j beside P_{j-1} V_{j-1} as well, v24), 0 v22's
    turn of S_j alone, None: ``default_turn_pv`` where ``stages`` and ``pingpong`` are None (it
    then sets pingpong 1 and TURN_PV_STAGES); ``tree_softmax``: 1 folds a row's max and sum in
    4 partial chains (v25: TREE_SOFTMAX; wgmma), 0 in one; ``short_chunks``: 1 runs more than 64
    rows a KV head on one warpgroup a 64-row chunk (warps 4 on wgmma, v26), 0 not, None:
    ``default_short_chunks`` where warps, wgmma, splits, stages and the two warpgroups' options
    are not given (the launch is then configured again with 1)."""
    given = dict(locals())                 # v26's rule configures again with these
    from ..common import check_flag

    batch, heads = _int(batch, "batch"), _int(heads, "heads")
    kv_heads, q_len = _int(kv_heads, "kv_heads"), _int(q_len, "q_len")
    check_flag(causal, "causal")
    if heads % kv_heads:
        raise KernelInputError(f"heads = {heads} is not divisible by kv_heads = {kv_heads}")
    if head_dim not in HEAD_DIMS:
        raise KernelInputError(f"head dimension d = {head_dim} is not supported; this kernel takes "
                               f"d in {HEAD_DIMS}")
    if q_len > MAX_Q_LEN:
        raise KernelInputError(f"q_len = {q_len}: the decode kernel takes 1 to {MAX_Q_LEN} new tokens")
    dtype = flashsim_dtype(dtype)
    if dtype not in ("fp16", "bf16"):
        raise KernelInputError(f"dtype {dtype}: the decode kernel takes fp16 or bf16")
    if page_size is not None:
        page_size = _int(page_size, "page_size")
    if batch * kv_heads > GRID_Z_LIMIT:
        raise KernelInputError(f"batch x kv_heads = {batch * kv_heads} exceeds the grid's z limit "
                               f"of {GRID_Z_LIMIT}")
    lens, bt = check_layout(batch, kv_lens, q_len, causal, page_size or 0, block_table, num_pages)
    rows = q_len * (heads // kv_heads)
    if isinstance(short_chunks, bool) or short_chunks not in (None, 0, 1) or (
            short_chunks and (rows <= 64 or warps not in (None, 4) or wgmma not in (None, 1))):
        raise KernelInputError(f"short_chunks = {short_chunks!r}: 0, or 1 for one warpgroup of wgmma "
                               f"(warps 4) a 64-row chunk of more than 64 rows a KV head (this launch: "
                               f"{rows} rows, warps {warps}, wgmma {wgmma})")
    if short_chunks:
        warps, wgmma = 4, 1
    if wgmma is None:                      # other warps than v5's given: mma.sync
        wgmma = default_wgmma(rows) if warps in (None, wgmma_warps(rows)) and not phased else 0
    if isinstance(wgmma, bool) or wgmma not in (0, 1):
        raise KernelInputError(f"wgmma = {wgmma!r}: 0 or 1")
    if isinstance(phased, bool) or phased not in (0, 1) or (phased and (wgmma or page_size is not None)):
        raise KernelInputError(f"phased = {phased!r}: 0, or 1 for the mma.sync loop (wgmma 0) over a "
                               "contiguous cache")
    Bc = ((WGMMA_TILES[0] if wgmma else PHASED_BLOCK_C if phased else BLOCK_C) if block_cols is None
          else _int(block_cols, "block_cols"))
    stages_arg, pingpong_arg = stages, pingpong     # None: v23's default may set them (below)
    stages = ((WGMMA_TILES[1] if wgmma else 1 if phased else STAGES[head_dim]) if stages is None
              else _int(stages, "stages"))
    kv_buffers = 2 * stages * Bc * head_dim * 2        # the K/V stages, which the merge reuses
    if warps is None:                      # 8 where the key warps' merge fits the K/V buffers
        warps = wgmma_warps(rows) if wgmma else default_warps(rows)
        if not wgmma and warps == 8 and merge_bytes(rows, 8, Bc, head_dim) > kv_buffers:
            warps = 4
    else:
        warps = _int(warps, "warps")
    if warps not in WARPS or combine not in COMBINES or page_prefetch not in (0, 1):
        raise KernelInputError(f"warps = {warps!r}, combine = {combine!r}, page_prefetch = "
                               f"{page_prefetch!r}: the kernel has warps in {WARPS}, combine in "
                               f"{COMBINES}, page_prefetch 0 or 1")
    if split_rule is None:
        split_rule = default_split_rule(page_size)
    if split_rule not in SPLIT_RULES:
        raise KernelInputError(f"split_rule = {split_rule!r}: one of {', '.join(SPLIT_RULES)}")
    rw = warps if wgmma else row_warps(rows, warps, Bc)  # v5: one or two warpgroups of 64 rows
    chunks = cdiv(rows, 16 * rw)
    kw_ = warps // rw
    if Bc % (16 * kw_) or not (stages == 1 if phased else 2 <= stages <= 4):
        raise KernelInputError(f"block_cols = {Bc} must be a multiple of {16 * kw_} (16 keys per "
                               f"warp, {kw_} key warps) and stages = {stages} in 2..4 (phased: 1)")
    if wgmma and Bc not in (64, 128):
        raise KernelInputError(f"block_cols = {Bc}: v5 (wgmma) takes 64 or 128")
    if pdl is not None and (isinstance(pdl, bool) or pdl not in (0, 1)):
        raise KernelInputError(f"pdl = {pdl!r}: 0 or 1 (None: 1 where there are splits)")
    merge = merge_bytes(rows, warps, Bc, head_dim)
    if not wgmma and merge > kv_buffers:
        raise KernelInputError(f"stages = {stages}, block_cols = {Bc}: the merge of {kw_} key warps x "
                               f"{16 * rw} rows ({merge} bytes) does not fit the K/V buffers; use "
                               "more stages or fewer warps")
    smem = smem_bytes(head_dim, rw, Bc, stages, wgmma)
    if smem > SHARED_OPTIN:
        raise KernelInputError(f"block_cols = {Bc}, stages = {stages} need {smem} bytes of shared "
                               "memory; a block has at most 227 KiB")
    if pingpong is not None and (isinstance(pingpong, bool) or pingpong not in (0, 1)):
        raise KernelInputError(f"pingpong = {pingpong!r}: 0 or 1")
    if producer is not None and (isinstance(producer, bool) or producer not in (0, 1)):
        raise KernelInputError(f"producer = {producer!r}: 0 or 1")
    if pingpong and not default_pingpong(wgmma, warps):
        raise KernelInputError(f"pingpong = {pingpong}: the ping-pong needs two warpgroups (v5 with 8 warps)")
    if tma is None:
        tma = default_tma(wgmma, page_size)
    if isinstance(tma, bool) or tma not in (0, 1) or (tma and (page_size is not None or not wgmma)):
        raise KernelInputError(f"tma = {tma!r}: 0, or 1 for a contiguous cache on wgmma (v5's loop)")
    if isinstance(overlap, bool) or overlap not in (0, 1) or (overlap and (not wgmma or stages < 3)):
        raise KernelInputError(f"overlap = {overlap!r}: 0, or 1 on wgmma (v5's loop) with 3 stages or "
                               "more (V_j keeps its stage a tile longer)")
    if half_rows is None:
        half_rows = default_half_rows(wgmma, warps, rows, page_size)
    if isinstance(half_rows, bool) or half_rows not in (0, 1) or (
            half_rows and not (wgmma and warps == 4 and rows <= 32)):
        raise KernelInputError(f"half_rows = {half_rows!r}: 0, or 1 for at most 32 rows a KV head on "
                               f"one warpgroup of wgmma (this launch: {rows} rows, wgmma {wgmma}, "
                               f"{warps} warps)")
    if kv_lens_arg is None:
        kv_lens_arg = default_kv_lens_arg(batch, page_size)
    if isinstance(kv_lens_arg, bool) or kv_lens_arg not in (0, 1) or (kv_lens_arg and batch > KV_LENS_MAX):
        raise KernelInputError(f"kv_lens_arg = {kv_lens_arg!r}: 0, or 1 for at most {KV_LENS_MAX} "
                               f"sequences (this batch: {batch})")
    if isinstance(tmap_prefetch, bool) or tmap_prefetch not in (0, 1) or (tmap_prefetch and not tma):
        raise KernelInputError(f"tmap_prefetch = {tmap_prefetch!r}: 0, or 1 with tma 1 (the tensor "
                               "maps' loop)")
    if l2_prefetch not in L2_PREFETCH_SIZES or evict_first not in (0, 1) or isinstance(evict_first, bool):
        raise KernelInputError(f"l2_prefetch = {l2_prefetch!r}, evict_first = {evict_first!r}: "
                               f"l2_prefetch in {L2_PREFETCH_SIZES}, evict_first 0 or 1")
    n_tiles = cdiv(max(lens), Bc)
    # blocks resident at once (v9's mbarriers: static shared memory beside the dynamic)
    slots = sm_count * blocks_per_sm(smem + (MBARRIER_SMEM if tma else 0), head_dim, warps, wgmma)
    if splits is None:                     # "sm": one block per SM, the others every slot
        splits = SPLIT_RULES[split_rule](batch * kv_heads * chunks,
                                         sm_count if split_rule == "sm" else slots, n_tiles)
    else:
        splits, split_rule = _int(splits, "splits"), "given"
        if splits > MAX_SPLITS:
            raise KernelInputError(f"splits = {splits}: at most {MAX_SPLITS}")
    if fused is not None and (isinstance(fused, bool) or fused not in (0, 1)):
        raise KernelInputError(f"fused = {fused!r}: 0 or 1 (None: default_fused where the splits "
                               "fit one wave)")
    one_wave = splits * chunks * batch * kv_heads <= slots
    if fused is None:                      # v7: the merge in decode_split, where it can wait
        fused = int(default_fused(splits) and one_wave and not producer)
    fused = int(fused and splits > 1)      # one split: nothing to merge
    if producer is None:                   # v17: a producer warp, where the TMA loop has two warpgroups
        producer = int(default_producer(wgmma, warps, tma, fused) and not pingpong and not overlap)
    if pingpong is None:
        pingpong = 0 if producer else default_pingpong(wgmma, warps)
    if producer and (not tma or (pingpong and overlap and not turn_pv)):
        raise KernelInputError(f"producer = 1: the TMA unit's loop (tma 1, this launch {tma}), the "
                               f"ping-pong (v22) or the overlap (v20), both only with turn_pv 1 (v24; "
                               f"pingpong {pingpong}, overlap {overlap})")
    if isinstance(stagger, bool) or stagger not in (0, 1) or (stagger and not producer):
        raise KernelInputError(f"stagger = {stagger!r}: 0, or 1 with v17's producer (producer {producer})")
    if q_first is None:
        q_first = default_q_first(wgmma, page_size)
    if isinstance(q_first, bool) or q_first not in (0, 1) or (q_first and not wgmma):
        raise KernelInputError(f"q_first = {q_first!r}: 0, or 1 on wgmma (v5's loop; this launch: "
                               f"wgmma {wgmma})")
    if turn_pv is None:                    # v23 where it was chosen, at its own stages
        turn_pv = int(stages_arg is None and pingpong_arg is None and
                      default_turn_pv(producer, warps, overlap, cdiv(n_tiles, splits)))
        if turn_pv:
            pingpong, stages = 1, TURN_PV_STAGES
            smem = smem_bytes(head_dim, rw, Bc, stages, wgmma)
    if isinstance(turn_pv, bool) or turn_pv not in (0, 1) or (turn_pv and not (producer and pingpong)):
        raise KernelInputError(f"turn_pv = {turn_pv!r}: 0, or 1 with the producer's ping-pong (v22: "
                               f"producer 1, pingpong 1; this launch {producer}, {pingpong})")
    if isinstance(tree_softmax, bool) or tree_softmax not in (0, 1) or (tree_softmax and not wgmma):
        raise KernelInputError(f"tree_softmax = {tree_softmax!r}: 0, or 1 on wgmma (v5's loop; this "
                               f"launch: wgmma {wgmma})")
    if fused and producer:
        raise KernelInputError("producer = 1 with fused = 1: v17's consumers do not merge the splits; "
                               "fused 0")
    if fused and not one_wave:
        raise KernelInputError(f"fused = 1 needs every block resident at once: {splits} splits x "
                               f"{chunks * batch * kv_heads} blocks exceed one wave of {slots}")
    if short_chunks is None:               # v26 where two warpgroups would get short splits
        if (default_short_chunks(wgmma, warps, page_size, cdiv(n_tiles, splits)) and not overlap and
                all(given[k] is None for k in ("warps", "wgmma", "splits", "stages", "pingpong",
                                               "producer", "turn_pv"))):
            return configure(**{**given, "short_chunks": 1})
        short_chunks = 0
    if pdl is None:                        # v6: the combine launch overlaps the split's tail
        pdl = int(splits > 1 and not fused)
    name, algorithm = ("cupy_decode_paged", "paged") if page_size else ("cupy_decode", "flashdecoding")
    return DecodeLaunch(name, algorithm, batch, heads, max(lens), head_dim, dtype, causal,
                        16 * rw, Bc, 32 * warps + producer_threads(warps, producer), 0, smem, None,
                        kv_heads=kv_heads,
                        q_len=q_len, kv_lens=lens, page_size=page_size or 0, block_table=bt,
                        num_pages=None if not page_size else int(num_pages), splits=splits,
                        chunks=chunks, row_warps=rw, stages=stages, warps=warps, combine=combine,
                        page_prefetch=int(bool(page_prefetch and page_size)), split_rule=split_rule,
                        wgmma=wgmma, pdl=pdl, fused=fused, pingpong=pingpong, tma=tma, overlap=overlap,
                        l2_prefetch=l2_prefetch, evict_first=evict_first, phased=phased,
                        tmap_prefetch=tmap_prefetch, half_rows=half_rows, producer=producer,
                        kv_lens_arg=kv_lens_arg, stagger=stagger, q_first=q_first, turn_pv=turn_pv,
                        tree_softmax=tree_softmax, short_chunks=short_chunks)


# Shapes (B, kv_heads, kv_len, q_len; 32 query heads) whose default launches CI compiles (v21):
# 1 to 128 rows a KV head (mma.sync at 1, 2, 4 row warps; one warpgroup; two), with and without
# splits, v6's combine and v7's merge
DEFAULT_SHAPES = ((64, 32, 4096, 1), (1, 32, 4096, 1), (1, 8, 4096, 4), (8, 4, 32768, 3), (1, 1, 32768, 1),
              (8, 1, 32768, 1), (96, 1, 16384, 1), (1, 1, 32768, 4), (8, 1, 32768, 4), (96, 1, 16384, 4))


def compile_variants():
    """(file, defines, dynamic smem, hot kernels) that CI compiles: d x dtype x the page sizes
    the benchmark runs (0: contiguous) x row warps, the versions and tiles the benchmark and
    the sanitizer cases run (v5's for sm_90a: ``gpu_kernels.compile.arch_for``)."""
    out = []
    for d in HEAD_DIMS:
        for dtype in ("fp16", "bf16"):
            for page in COMPILED_PAGE_SIZES:
                for rw in (1, 2, 4):
                    out.append((CU_FILE, defines(d, dtype, page, rw), smem_bytes(d, rw), HOT))
    for Bc, st in TUNING[1:]:                # the tuning candidates, as the benchmark runs them
        for rw in (1, 2, 4):
            out.append((CU_FILE, defines(128, "fp16", 0, rw, Bc, st), smem_bytes(128, rw, Bc, st), HOT))
    for page in COMPILED_PAGE_SIZES:         # v1 (its combine, no prefetch), as the benchmark times it
        for rw in (1, 2, 4):
            out.append((CU_FILE, defines(128, "fp16", page, rw, combine=1, page_prefetch=0),
                        smem_bytes(128, rw), HOT))
    for rw in (1, 2, 4):                     # v2's combine, as the benchmark times it
        out.append((CU_FILE, defines(128, "fp16", 0, rw, combine=2), smem_bytes(128, rw), HOT))
    for d in HEAD_DIMS:                      # v2's 8 warps (row warps 2, 4, 8 at B_c = 64)
        for dtype in ("fp16", "bf16"):
            for page in COMPILED_PAGE_SIZES if (d, dtype) == (128, "fp16") else (0, 16):
                for rw in (2, 4, 8):
                    out.append((CU_FILE, defines(d, dtype, page, rw, warps=8), smem_bytes(d, rw), HOT))
    for d in HEAD_DIMS:                      # v5 (sm_90a) at its tiles, and the tuning step's
        for dtype in ("fp16", "bf16"):
            for page in COMPILED_PAGE_SIZES if (d, dtype) == (128, "fp16") else (0, 16):
                tiles = TUNING_V5 if (d, dtype, page) == (128, "fp16", 0) else (WGMMA_TILES,)
                for Bc, st in tiles:
                    out.append((CU_FILE, defines(d, dtype, page, 8, Bc, st, warps=8, wgmma=1),
                                smem_bytes(d, 8, Bc, st, wgmma=1), HOT))
                # v5_w4, one warpgroup: the default at 32-64 rows
                out.append((CU_FILE, defines(d, dtype, page, 4, *WGMMA_TILES, warps=4, wgmma=1),
                            smem_bytes(d, 4, *WGMMA_TILES, wgmma=1), HOT))
    for d in HEAD_DIMS:                      # v6, the defaults: v4's and v5's kernels with PDL
        for dtype in ("fp16", "bf16"):
            for page in COMPILED_PAGE_SIZES if (d, dtype) == (128, "fp16") else (0, 16):
                for rw in (1, 2):
                    out.append((CU_FILE, defines(d, dtype, page, rw, pdl=1), smem_bytes(d, rw), HOT))
                for w in (4, 8):
                    out.append((CU_FILE, defines(d, dtype, page, w, *WGMMA_TILES, warps=w, wgmma=1, pdl=1),
                                smem_bytes(d, w, *WGMMA_TILES, wgmma=1), HOT))
    for d in HEAD_DIMS:                      # v7: v6's kernels merging in decode_split
        for dtype in ("fp16", "bf16"):
            for page in COMPILED_PAGE_SIZES if (d, dtype) == (128, "fp16") else (0, 16):
                for rw in (1, 2):
                    out.append((CU_FILE, defines(d, dtype, page, rw, fused=1), smem_bytes(d, rw),
                                ("decode_split",)))
                for w in (4, 8):
                    out.append((CU_FILE, defines(d, dtype, page, w, *WGMMA_TILES, warps=w, wgmma=1, fused=1),
                                smem_bytes(d, w, *WGMMA_TILES, wgmma=1), ("decode_split",)))
    for d in HEAD_DIMS:                      # v9: the wgmma kernels with TMA (contiguous) and the
        for dtype in ("fp16", "bf16"):       # ping-pong (two warpgroups), one split, PDL, fused
            for page in COMPILED_PAGE_SIZES if (d, dtype) == (128, "fp16") else (0, 16):
                for w in (4, 8):
                    pp, tma = default_pingpong(1, w), default_tma(1, page)
                    if not (pp or tma):      # v8's kernels
                        continue
                    for pdl, fused in ((0, 0), (1, 0), (0, 1)):
                        out.append((CU_FILE, defines(d, dtype, page, w, *WGMMA_TILES, warps=w, wgmma=1,
                                                     pdl=pdl, fused=fused, pingpong=pp, tma=tma),
                                    smem_bytes(d, w, *WGMMA_TILES, wgmma=1),
                                    ("decode_split",) if fused else HOT))
    for d in HEAD_DIMS:                      # v10: v9's kernels with the one-round combine (PDL)
        for dtype in ("fp16", "bf16"):
            for page in COMPILED_PAGE_SIZES if (d, dtype) == (128, "fp16") else (0, 16):
                for rw in (1, 2):
                    out.append((CU_FILE, defines(d, dtype, page, rw, combine=4, pdl=1), smem_bytes(d, rw), HOT))
                for w in (4, 8):
                    out.append((CU_FILE, defines(d, dtype, page, w, *WGMMA_TILES, warps=w, combine=4,
                                                 wgmma=1, pdl=1, pingpong=default_pingpong(1, w),
                                                 tma=default_tma(1, page)),
                                smem_bytes(d, w, *WGMMA_TILES, wgmma=1), HOT))
    for d in HEAD_DIMS:                      # v9_s3 and v11: 3 stages of 128-key tiles, without and
        for dtype in ("fp16", "bf16"):       # with the overlap (TMA; pages by cp.async)
            for page in (0, 16) if (d, dtype) == (128, "fp16") else (0,):
                for w in (4, 8):
                    for ov in (0, 1):
                        out.append((CU_FILE, defines(d, dtype, page, w, 128, 3, warps=w, wgmma=1, pdl=1,
                                                     pingpong=default_pingpong(1, w),
                                                     tma=default_tma(1, page), overlap=ov),
                                    smem_bytes(d, w, 128, 3, wgmma=1), HOT))
    for d in HEAD_DIMS:                      # v16, the defaults at 32 rows: one warpgroup by TMA
        for dtype in ("fp16", "bf16"):       # (one split, PDL, fused)
            for pdl, fused in ((0, 0), (1, 0), (0, 1)):
                out.append((CU_FILE, defines(d, dtype, 0, 4, *WGMMA_TILES, warps=4, wgmma=1, pdl=pdl,
                                             fused=fused, tma=1, half_rows=1),
                            smem_bytes(d, 4, *WGMMA_TILES, wgmma=1), ("decode_split",) if fused else HOT))
    for d in HEAD_DIMS:                      # v17: a producer warp, one or two warpgroups by TMA
        for dtype in ("fp16", "bf16"):       # (one split, PDL; 2 and 3 stages)
            for w in (4, 8):
                for st in (2, 3):
                    for pdl in (0, 1):
                        out.append((CU_FILE, defines(d, dtype, 0, w, 128, st, warps=w, wgmma=1, pdl=pdl,
                                                     tma=1, half_rows=int(w == 4), producer=1),
                                    smem_bytes(d, w, 128, st, wgmma=1), HOT))
    for w in (4, 8):                         # v19 (an option of v17's producer), as --stagger runs it
        lc = configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=1 if w == 4 else 4, producer=1, stagger=1,
                       q_first=0)
        out.append((CU_FILE, lc.defines(), lc.dynamic_smem, HOT))
    # v20 (v17's producer with v11's overlap, 3 stages; on v18), v22 (v21 with strict ping-pong
    # turns), v23 (v22's turns covering P V and the next S; 2 and 3 stages) and v24 (v23 with
    # v20's overlap), two warpgroups, plain and staggered, as --overlap-producer,
    # --pingpong-producer, --turn-pv and --turn-overlap run them
    for kw in (dict(overlap=1, stages=3, q_first=0), dict(pingpong=1), dict(pingpong=1, turn_pv=1),
               dict(pingpong=1, turn_pv=1, stages=3), dict(pingpong=1, turn_pv=1, stages=3, overlap=1)):
        for d in HEAD_DIMS:
            for dtype in ("fp16", "bf16"):
                for sg in (0, 1):
                    lc = configure(8, 32, 1, d, kv_lens=[32768] * 8, q_len=4, dtype=dtype, producer=1,
                                   stagger=sg, **kw)
                    out.append((CU_FILE, lc.defines(), lc.dynamic_smem, HOT))
    for ql in (1, 4):                        # v18 (v21 without Q_i's loads first), as --q-first runs it
        lc = configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=ql, q_first=0)
        out.append((CU_FILE, lc.defines(), lc.dynamic_smem, HOT))
    for B, ql in ((64, 4), (8, 4), (8, 1)):    # v25 (tree_softmax) on v23's, v21's and v16's loops, as
        for d in HEAD_DIMS:                  # --tree-softmax runs it
            for dtype in ("fp16", "bf16"):
                lc = configure(B, 32, 1, d, kv_lens=[32768] * B, q_len=ql, dtype=dtype, tree_softmax=1)
                out.append((CU_FILE, lc.defines(), lc.dynamic_smem, HOT))
    lc = configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=4, stagger=1, producer=1)   # v21 + v19
    out.append((CU_FILE, lc.defines(), lc.dynamic_smem, HOT))
    for ql, kw in ((4, {}), (4, dict(stagger=1, producer=1)), (1, {})):   # v21 at 3 stages, as --stages
        lc = configure(8, 32, 1, 128, kv_lens=[32768] * 8, q_len=ql, stages=3, **kw)   # runs it
        out.append((CU_FILE, lc.defines(), lc.dynamic_smem, HOT))
    for d in HEAD_DIMS:                      # v21, the defaults over a contiguous cache: the kernels
        for dtype in ("fp16", "bf16"):       # they build across the rows, splits and merges
            for B, kvh, n, ql in DEFAULT_SHAPES:
                lc = configure(B, 32, kvh, d, kv_lens=[n] * B, q_len=ql, dtype=dtype)
                out.append((CU_FILE, lc.defines(), lc.dynamic_smem,
                            ("decode_split",) if lc.fused or lc.splits == 1 else HOT))
    # the probe (TIMELINE) of the defaults' two split kernels, as --timeline runs them
    out.append((CU_FILE, defines(128, "fp16", 0, 1, pdl=1, timeline=1), smem_bytes(128, 1), HOT))
    out.append((CU_FILE, defines(128, "fp16", 0, 4, *WGMMA_TILES, warps=4, wgmma=1, pdl=1, tma=1,
                                 timeline=1), smem_bytes(128, 4, *WGMMA_TILES, wgmma=1), HOT))
    return out


def kernel(launch: DecodeLaunch, name: str = "decode_split"):
    """The compiled RawKernel of a launch (registers etc. through kernel_resources)."""
    return get_kernel(CU_FILE, name, launch.defines(), launch.dynamic_smem, launch.arch())


# ---------------------------------------------------------------------- the correctness rule (host)

def reference_rows(launch: DecodeLaunch, q, k_rows, v_rows, pairs=None, causal=None) -> list:
    """The float64 reference of the (sequence, KV head) ``pairs`` (None: all), once, for
    ``check_rows`` to hold any implementation's output to. ``q``: (B, q_len, H, d) float32
    values; ``k_rows`` / ``v_rows``: per sequence (indexable by b) its (kv_len, kv_heads, d)
    cached rows (``used_rows``), float32 values. ``causal``: None is the launch's.

    Every query row is plain attention over the keys it sees (kv_len - q_len + qi + 1 under
    the causal mask), so each (b, kvh, qi) is ``harness.Reference`` of its group's query rows:
    returns [(b, kvh, qi, Reference, float64 logsumexp)]."""
    import flashsim

    from ..harness import Reference

    causal = launch.causal if causal is None else causal
    g = launch.group
    pairs = [(b, h) for b in range(launch.batch) for h in range(launch.kv_heads)] if pairs is None else pairs
    out = []
    for b, kvh in dict.fromkeys(pairs):
        n = launch.kv_lens[b]
        K64, V64 = (np.asarray(x[:n, kvh], np.float64) for x in (k_rows[b], v_rows[b]))
        for qi in range(launch.q_len):
            seen = n - launch.q_len + qi + 1 if causal else n
            Qg = np.asarray(q[b, qi, kvh * g:(kvh + 1) * g], np.float64)       # (group, d)
            ref = Reference.of(Qg, K64[:seen], V64[:seen], causal=False, dtype=launch.dtype)
            out.append((b, kvh, qi, ref, flashsim.reference.logsumexp(Qg, K64[:seen])[..., 0]))
    return out


def check_rows(launch: DecodeLaunch, refs: list, O, L=None) -> dict:
    """O (B, q_len, H, d) and L (B, H, q_len) or None (host float32 values) against
    ``reference_rows``: flash-attention's rule, max |O - ref| <= 2 x the error of a plain
    same-dtype implementation (``harness.plain_attention``) over the checked rows; L within
    1e-3 + 1e-5 |L| of the float64 logsumexp."""
    from ..harness import max_error_rule

    g = launch.group
    err = base = 0.0
    lerr = -math.inf if L is not None else None
    for b, kvh, qi, ref, L_ref in refs:
        got = np.asarray(O[b, qi, kvh * g:(kvh + 1) * g], np.float64)
        err = max(err, float(np.abs(got - ref.ref).max()) if np.isfinite(got).all() else math.inf)
        base = max(base, ref.baseline_error)
        if L is not None:
            L_got = np.asarray(L[b, kvh * g:(kvh + 1) * g, qi], np.float64)
            excess = np.abs(L_got - L_ref) - (1e-3 + 1e-5 * np.abs(L_ref))
            lerr = max(lerr, float(excess.max()) if np.isfinite(L_got).all() else math.inf)
    verdict = max_error_rule(err, 2 * base, baseline_error=base, dtype=launch.dtype,
                             rows_checked=len(refs))
    if L is not None:
        verdict["lse_excess"] = lerr
        verdict["ok"] = bool(verdict["ok"] and lerr <= 0)
    return verdict


def checked_pairs(launch: DecodeLaunch) -> list:
    """The (sequence, KV head) pairs a check compares with the float64 reference: the last,
    and the first too while the longest cache is below 32k keys (the reference's time)."""
    last = (launch.batch - 1, launch.kv_heads - 1)
    return [last] if launch.N >= 32768 else list(dict.fromkeys([(0, 0), last]))


class HeadRows:
    """One sequence's cached rows (kv_len, kv_heads, d) on the GPU (CuPy, or a torch tensor),
    copied to the host as float32 values one KV head at a time, as ``reference_rows`` indexes
    them: rows[:n, kvh]."""

    def __init__(self, x):
        self.x = x

    def __getitem__(self, index):
        x = self.x[index]
        if type(x).__module__.startswith("torch"):
            return x.float().cpu().numpy()
        return to_float32(x)


def page_table(kv_lens, page_size: int, rng, spare: int = 3) -> tuple[np.ndarray, int]:
    """A block table for ``kv_lens`` in pages of ``page_size`` tokens: (block_table (batch,
    max pages + 1) int32, num_pages). The pool holds the pages the sequences need and
    ``spare`` pages nobody uses, in the order of ``rng.permutation`` (pages scattered in
    memory, as a serving engine's allocator leaves them); -1 past each sequence's pages (the
    kernel must never read those columns)."""
    per = [cdiv(n, page_size) for n in kv_lens]
    if sum(per) > MAX_POOL_PAGES:
        raise KernelInputError(f"the sequences need {sum(per):,} pages of {page_size} tokens; a "
                               f"block table here holds at most {MAX_POOL_PAGES:,}")
    perm = rng.permutation(sum(per) + spare)
    bt = np.full((len(per), max(per) + 1), -1, np.int32)
    start = 0
    for b, k in enumerate(per):
        bt[b, :k] = perm[start:start + k]
        start += k
    return bt, len(perm)


def storage(x, dtype: str):
    """float values -> what the kernel reads: fp16, or bf16 as its int16 bits (round to
    nearest even); NumPy in, NumPy out, CuPy in, CuPy out."""
    xp = np if isinstance(x, np.ndarray) or not hasattr(x, "get") else _cupy()
    if dtype == "fp16":
        return xp.asarray(x).astype(xp.float16)
    u = xp.ascontiguousarray(x, xp.float32).view(xp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(xp.uint16).view(xp.int16)


def _cupy():
    import cupy

    return cupy


def device_inputs(launch: DecodeLaunch, seed: int = 0) -> tuple:
    """(q (B, q_len, H, d), k_cache, v_cache) on the GPU for ``launch``: standard normal
    values made there (CuPy), stored in the launch's dtype (``storage``); the cache as the
    launch reads it, contiguous (B, longest kv_len, kv_heads, d) or the pool of pages
    (num_pages, page_size, kv_heads, d) its block table points into."""
    cupy = _cupy()
    rng = cupy.random.default_rng(seed)
    cache = ((launch.num_pages, launch.page_size) if launch.page_size else
             (launch.batch, launch.N)) + (launch.kv_heads, launch.d)
    return tuple(storage(rng.standard_normal(shape, dtype=cupy.float32), launch.dtype)
                 for shape in ((launch.batch, launch.q_len, launch.heads, launch.d), cache, cache))


def device_check(launch: DecodeLaunch, q, k_cache, v_cache):
    """check(Result) -> ``check_rows``'s verdict for the step on these GPU inputs, over
    ``checked_pairs(launch)``; the float64 references are computed once, here."""
    pairs = checked_pairs(launch)
    seqs = list(dict.fromkeys(b for b, _ in pairs))
    k_rows, v_rows = ({b: HeadRows(x) for b, x in zip(seqs, launch.used_rows(c, seqs))}
                      for c in (k_cache, v_cache))
    refs = reference_rows(launch, to_float32(q), k_rows, v_rows, pairs)

    def check(res) -> dict:
        return dict(check_rows(launch, refs, to_float32(res.O), to_float32(res.L)),
                    pairs_checked=[list(p) for p in pairs])
    return check


def random_case(rng, batch: int, heads: int, kv_heads: int, d: int, kv_lens, q_len: int,
                page_size: int, dtype: str = "fp16", spike: bool = True,
                head_major: bool = False) -> dict:
    """Host inputs of one decode step for tests and the sanitizer: standard normal q, K, V
    rounded to ``dtype``; the cache contiguous (page_size 0) or in pages shuffled in memory,
    three pages nobody uses, and NaN in every slot past a sequence's kv_len (the kernel must
    never read them). With ``spike`` a few keys per sequence align with the last query rows
    (large logits), so the running maximum changes between tiles and splits. ``head_major``:
    the cache is stored (B, kv_heads, capacity, d) (pages: (num_pages, kv_heads, P, d)) and
    k_cache, v_cache are its transposed views (``cache_strides``; ``run_case`` keeps them so).

    Returns q (B, q_len, H, d), k_cache, v_cache (storage: fp16 or bf16 bits), rows_k, rows_v
    (per sequence its (kv_len, kv_heads, d) float32 values) and ``configure`` keywords."""
    from ..harness import round_to

    B, H, g = batch, heads, heads // kv_heads
    cap = max(kv_lens)
    q = rng.standard_normal((B, q_len, H, d))
    k = rng.standard_normal((B, cap, kv_heads, d))
    v = rng.standard_normal((B, cap, kv_heads, d))
    if spike:
        for b, n in enumerate(kv_lens):
            for p in rng.choice(n, size=max(1, n // 40), replace=False):
                k[b, p] = 3.0 * q[b, -1, ::g]
    q, k, v = (round_to(x, dtype) for x in (q, k, v))
    rows_k = [k[b, :n] for b, n in enumerate(kv_lens)]
    rows_v = [v[b, :n] for b, n in enumerate(kv_lens)]
    kw = dict(kv_lens=list(kv_lens), q_len=q_len, dtype=dtype)
    if page_size:
        bt, num_pages = page_table(kv_lens, page_size, rng)
        caches = [np.full((num_pages, page_size, kv_heads, d), np.nan, np.float32) for _ in "kv"]
        for b, n in enumerate(kv_lens):
            for j in range(cdiv(n, page_size)):
                m = min(page_size, n - j * page_size)
                for cache, x in zip(caches, (k, v)):
                    cache[bt[b, j], :m] = x[b, j * page_size:j * page_size + m]
        k, v = caches
        kw.update(page_size=page_size, block_table=bt, num_pages=num_pages)
    else:
        for b, n in enumerate(kv_lens):
            k[b, n:] = np.nan
            v[b, n:] = np.nan
    k, v = storage(k, dtype), storage(v, dtype)
    if head_major:
        k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (k, v))
    return dict(q=storage(q, dtype), k_cache=k, v_cache=v, q_values=q, rows_k=rows_k, rows_v=rows_v,
                configure=kw)


def device_case(case: dict) -> tuple:
    """``random_case``'s q, k_cache, v_cache on the GPU (CuPy): each array's storage copied as
    it is, then seen as the case sees it (a head-major cache: the transposed view again)."""
    import cupy

    return tuple(cupy.asarray(case[n]) if case[n].flags.c_contiguous else
                 cupy.asarray(case[n].transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
                 for n in ("q", "k_cache", "v_cache"))


def run_case(case: dict, heads: int, kv_heads: int, splits=None, probe: bool = False,
             **tiles) -> tuple[DecodeLaunch, dict]:
    """Configure (``tiles``: block_cols, stages) and run ``random_case`` on the GPU (CuPy),
    outputs poisoned with NaN first (``probe``: the launch's ``probe()``);
    returns the launch and the verdict of ``check_rows`` (with "all_written": every O and L
    entry finite)."""
    import cupy

    B, q_len, _, d = case["q"].shape
    launch = configure(B, heads, kv_heads, d, splits=splits, **case["configure"], **tiles)
    if probe:
        launch = launch.probe()
    dq, dk, dv = device_case(case)
    out = cupy.full(dq.shape, np.nan if launch.dtype == "fp16" else 0x7FC0, dq.dtype)
    lse = cupy.full((B, heads, q_len), np.nan, cupy.float32)
    O, L = launch.run(dq, dk, dv, out=out, lse=lse)
    Oh, Lh = to_float32(O), L.get()
    refs = reference_rows(launch, case["q_values"], case["rows_k"], case["rows_v"])
    verdict = check_rows(launch, refs, Oh, Lh)
    verdict["all_written"] = bool(np.isfinite(Oh).all() and np.isfinite(Lh).all())
    verdict["ok"] = bool(verdict["ok"] and verdict["all_written"] and O is out and L is lse)
    return launch, verdict


def to_float32(x) -> np.ndarray:
    """A host or device fp16/bf16 (bf16 as int16 bits) array as float32 NumPy values."""
    a = x.get() if hasattr(x, "get") else np.asarray(x)
    if a.dtype == np.int16:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)
