"""One decode step on one GPU, side by side: our decode kernel against PyTorch and a plain read.

    python -m benchmarks.decode_h200 --out DIR            # DIR/decode_h200.json, ~4 minutes
    python -m benchmarks.decode_h200 --out DIR --quick    # the issue's reference points only
    python -m benchmarks.decode_h200 --out DIR --splits-sweep   # DIR/decode_splits_h200.json, ~2 min
    python -m benchmarks.decode_h200 --sanitize           # tiny launches of every variant, no timing:
        compute-sanitizer --tool memcheck python -m benchmarks.decode_h200 --sanitize
        compute-sanitizer --tool racecheck python -m benchmarks.decode_h200 --sanitize
    python -m benchmarks.decode_h200 --profile-point 8,8,32768,1,0   # B,kv_heads,kv_len,q_len,page
        ncu --clock-control none --nvtx --nvtx-include decode/ -k regex:decode_ \\
            --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --csv \\
            --page raw --log-file DIR/decode_ncu_h200.csv \\
            python -m benchmarks.decode_h200 --profile-point 8,8,32768,1,16 --out DIR
      (several points in one process; with --out, DIR/decode_ncu_h200.json holds flashsim's
      predicted HBM bytes of each launch, launch.plan(), beside which ncu's DRAM bytes are read:
      with --nvtx-include, the CSV holds the measured launches only, in the points' order)

Points: batch in {1, 8, 64}, kv_len in {4k, 32k, 128k}, H = 32 query heads with kv_heads in
{32, 8, 1}, d = 128, q_len in {1, 4}, fp16 (a combination whose K/V cache exceeds 40 GB is
skipped). Implementations per point, all on the same K/V values:
  cupy_decode        ours, contiguous cache (B, kv_len, kv_heads, d) ("layout" token_major),
                     and again on PyTorch's own K and V tensors (B, kv_heads, kv_len, d) through
                     transposed views (head_major: no copy, the same bytes), each configuration of
                     decode.VARIANTS (v1: the first run's, 4 warps; v2: the new combine,
                     decode.default_warps; v2_w8: 8 warps, where a KV head has >= 32 rows; v3:
                     v3's combine; v4: v3 with the one-wave splits, the others FlashAttention-2's;
                     v5: v4 on wgmma, where a KV head has >= 32 rows; v6: v4's or v5's
                     kernels with the combine by programmatic dependent launch; v7: the same
                     kernels merging the splits themselves (no combine launch); v8: v7 above
                     32 splits, v6 up to 32, with the splits of the "sm" rule (one block per
                     SM; v4-v7: the wave rule's); v9, the defaults: v8 with the wgmma loop's
                     K/V tiles by the TMA unit and two warpgroups' ping-pong; v5_w4: v5 with
                     one warpgroup, where it has 32 to 64; v9_w4: v9 on one warpgroup's
                     wgmma wherever: 64-row chunks above 64 rows, padding below 32; v10:
                     v9 with decode_combine in one round of loads, COMBINE 4; v14: K and V
                     loaded apart, one 128-key buffer each, the wave rule's splits, where a KV
                     head has fewer than 32 rows)
                     timed in the same run (one equal to one timed before is not repeated);
                     the summary's "ours" is the fastest correct one, named in "ours_variant"
                     and "ours_layout"; "ours_head_major_over_best_torch": ours on the very
                     tensors PyTorch gets
  cupy_decode_paged  ours, the same rows in pages of 1, 16, 64 tokens, pages in random order,
                     "NHD" (num_pages, P, kv_heads, d) and "HND" (num_pages, kv_heads, P, d)
                     (the defaults, v9: decode.default_variant's kernels, v4, v5_w4 or
                     v5 (with the ping-pong; pages take no TMA), block-table entries
                     prefetched a tile ahead, the combine by
                     programmatic dependent launch or in decode_split; v1 too at pages of 16,
                     q_len 1)
  torch_flash, torch_cudnn, torch_math   PyTorch SDPA, enable_gqa=True, on (B, kv_heads,
                     kv_len, d) K/V, without a mask (q_len > 1: checked against the unmasked
                     reference; the q_len - 1 hidden keys change no bandwidth)
  torch_efficient    tried; it refuses enable_gqa (recorded in "skipped")
  torch_flex         flex_attention, compiled once per shape, at two points after the table
                     (its compile time)
  flashinfer         where it is installed (not on the H200's image: benchmarks/peers/flashinfer_aot.py
                     says how it travels): on the token-major pages of each page size, after
                     ours on them, as --flashinfer's (``Bench.flashinfer``)
  plain_read         a kernel that reads every byte of the same K and V once: the limit
Bandwidth = the K and V bytes a step must read (2 B kv_len kv_heads d 2) / time.

--host-issue (DIR/decode_host_issue_h200.json, ~1 min): the host's time to issue one call
(``Timing.launch_s``) at HOST_POINTS: ours on PyTorch's tensors, as the table calls it, and on
CuPy arrays over the same memory, beside PyTorch's cuDNN and flash backends and the plain read,
each checked first; the GPU spins the benchmark's lead before each call, so the time of the
calls is the GPU's as in the table. Then each is issued 200 times back to back (``issue_loop``):
its host time as a loop of layers sees it.

--overheads (DIR/decode_overheads_h200.json, ~1 min): where a small step's time goes, at
OVERHEAD_POINTS: the step (the default launch), each of its kernels launched alone
(``DecodeLaunch.run(only=...)``), an empty kernel on the split kernel's grid (launch and event
overhead) and the plain read, each under the table's flush (a write of 2 x L2, which leaves
dirty lines) and again with a clean flush (``harness.Harness(clean=True)``: the write, then a
read of as many other bytes). --overheads-profile runs the plain read and the step once after
each flush inside NVTX ranges "dirty" and "clean", for Nsight Compute without its own cache
control (what the timed call writes back of the flush's dirty lines):
    ncu --cache-control none --clock-control none --nvtx --nvtx-include dirty/ \
        --nvtx-include clean/ --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
        --csv --page raw --log-file DIR/decode_overheads_ncu_h200.csv \
        python -m benchmarks.decode_h200 --overheads-profile --out DIR

--configs (DIR/decode_configs_h200.json, ~2 min): at CONFIG_POINTS, the q_len-1 points where ours
fell short of PyTorch's best, ours at other splits, merges and tiles (``config_candidates``) between
two timings of PyTorch's cuDNN and flash backends, the plain read and a chunked plain read (each
block one contiguous run of K and of V). --configs-q4 (DIR/decode_configs_q4_h200.json): the same
at CONFIG_POINTS_Q4, the MQA points of q_len 4 (128 rows a block on wgmma); --configs-mqa
(DIR/decode_configs_mqa_h200.json) at CONFIG_POINTS_MQA, MQA at q_len 1, B 8, 32k and 128k.
--configs-profile runs PyTorch's cuDNN call and our step once each in NVTX ranges "peer" and
"ours", for Nsight Compute:
    ncu --clock-control none --nvtx --nvtx-include peer/ --nvtx-include ours/ --metrics \
        gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,... \
        --csv --page raw --log-file DIR/decode_configs_ncu_h200.csv \
        python -m benchmarks.decode_h200 --configs-profile --out DIR

--clock-ramp (DIR/decode_clock_ramp_h200.json, ~1 min): does a timing that follows host-side
idle time start slow? The table has, sporadically, timings whose repeats are mostly slow while
the fastest is as fast as its neighbours'. One explanation: while the host works (the float64
check before each timing) the GPU idles and lowers its clocks, and the harness's two warm-up
calls (well under a millisecond here) do not bring them back before the timed repeats. At
CLOCK_POINTS the default step is timed after the host sleeps each of CLOCK_IDLE_S, with three
warm-ups: "calls" (the harness's 2 calls), "spin" (one GPU thread busy CLOCK_WARM_S, then
the calls) and "calls_for" (the step itself for CLOCK_WARM_S, then the calls), in
CLOCK_CYCLES rounds; every repeat's time and NVML's SM and memory clocks just before and
after each timing are recorded (the launches are those the table checks; none checked here).

--flashinfer (DIR/decode_flashinfer_h200.json, ~3 min): FlashInfer's decode and paged kernels
at every point of the table (the reference points first), on pages of each of PAGES in the
same random order: BatchDecodeWithPagedKVCacheWrapper at q_len 1 ("flashinfer_decode", on
CUDA cores and, "use_tensor_cores" true, on tensor cores: its prefill kernel), and
BatchPrefillWithPagedKVCacheWrapper at q_len > 1 ("flashinfer_prefill", causal, which FlashInfer
aligns bottom-right: the decode rows' mask), each of FI_BACKENDS (``flashinfer_calls``); beside them in the same run, on the same pages, ours (the defaults),
and ours on the contiguous cache, PyTorch's cuDNN and flash backends and the plain read. Each
wrapper is planned once before its check and timing, as a server plans once a step for all
its layers; the timed call is ``run``. The table times FlashInfer the same way where it is
installed (``Bench.flashinfer``); this is the shorter run of it. FlashInfer is not on the H200
image and nothing can be downloaded or compiled for it there: benchmarks/peers/flashinfer_aot.py
says how its wheels and its modules (built on a machine without a GPU, for sm_90a) travel, and
the run loads them with FLASHINFER_DISABLE_JIT=1.

--ties (DIR/decode_ties_h200.json, ~1 min): at TIE_POINTS, where the table's fastest of ours
fell short of PyTorch's best by less than 2 %, TIE_ROUNDS rounds of ours (the defaults, on
PyTorch's own tensors, and on the token-major cache) and PyTorch's cuDNN and flash backends, one
timing of each a round in turn, each checked once first: is the difference larger than the
spread between rounds of the same call? (A table's one timing of each cannot say.)

--l2-hints (DIR/decode_l2_hints_h200.json, ~3 min): at L2_HINT_POINTS, ours (the defaults) with
each of L2_HINTS (v13: an L2 prefetch size and the evict-first policy on the K/V copies), PyTorch's
cuDNN and flash backends and the plain read, on PyTorch's own tensors, each checked once, then
ROUNDS rounds of one timing of each under the table's flush and under a clean one: does a
hint move ours, and does what it gains survive an L2 without the flush's dirty lines?
--l2-hints-profile runs, at L2_HINT_PROFILE_POINTS, the plain read and the step with each hint once
after each flush in NVTX ranges, for Nsight Compute without its own cache control (what each
reads and writes in DRAM):
    ncu --cache-control none --clock-control none --nvtx --nvtx-include dirty/ \
        --nvtx-include clean/ --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,\
lts__t_sectors_srcunit_tex_op_read.sum --csv --page raw --log-file DIR/decode_l2_hints_ncu_h200.csv \
        python -m benchmarks.decode_h200 --l2-hints-profile --out DIR

--phased (DIR/decode_phased_h200.json, ~2 min): the same rounds with ours as the defaults and
as v14 (``PHASED``: K and V loaded apart, one buffer each, FlashAttention-2's order, as cuDNN's
decode kernel lays out its tiles), at L2_HINT_POINTS: is cuDNN's last percent at one row a KV
head its order of loads?

--phased-heldout (DIR/decode_phased_heldout_h200.json, ~1 min): the same rounds, the defaults,
the phased loop at their splits and v14, at PHASED_HELDOUT_POINTS (off the grid, no splits, at most 16 rows a KV head).

--timeline (DIR/decode_timeline_h200.json, ~1 min): where a step's time goes, block by block,
at TIMELINE_POINTS: the default launch built as a probe (``DecodeLaunch.probe``: decode.cu's
TIMELINE, each decode_split block stamps its SM, the global timer at entry, once the prologue
has issued its tiles, once its first tile has landed, after its last tile and at exit, and the
SM cycles it waited for tiles), and configurations beside it (``timeline``: 3 stages, v15, the
other merge, the code warm in the L2); beside them the plain read and two chunked plain reads
of one block an SM (TIMELINE_CHUNKED_GRIDS), each block stamping its SM, entry, first loads and
exit (``stamped``). Ours is checked and timed as in the table (probe and not, to show what the
stamps cost); then each runs TIMELINE_RUNS times after the table's flush (the defaults and
the reads also after a clean one), each run's event time and stamps kept
(``timeline_summary``; the raw stamps of the run of median time).

--half-rows (DIR/decode_half_rows_h200.json, ~1 min): the same rounds, v9 and v16
(``HALF_ROWS``: a KV head's 32 rows in the first 8 rows of each warp's 16, so all four warps'
exp units share the softmax), at HALF_ROWS_POINTS (the table's MQA points of q_len 1) and
HALF_ROWS_HELDOUT_POINTS (off the grid, 32 rows a KV head, chosen before v16 was timed).

--producer (DIR/decode_producer_h200.json, ~2 min): the same rounds, the defaults and v17
(``PRODUCER``: a producer warp issues the tiles, the consumer warpgroups wait only on their
tile's mbarrier, no barrier of the whole block a tile) at 2 and 3 stages, at PRODUCER_POINTS
(the MQA points below 0.9 of the plain read, q_len 1 and 4) and PRODUCER_HELDOUT_POINTS (off
the grid, one or two warpgroups of wgmma, chosen before v17 was first timed).

--producer-heldout (DIR/decode_producer_heldout_h200.json, ~2 min): the same rounds, v9 and
v17, at PRODUCER_LONG_HELDOUT_POINTS (off the grid, two warpgroups, long loops).

--kv-lens (DIR/decode_kv_lens_h200.json, ~1 min): the same rounds, v17 and v18 (``KV_LENS_ARG``:
the kv_lens by value, so a block's first tile need not wait on a load of its kv_len), at
KV_LENS_POINTS and KV_LENS_HELDOUT_POINTS (off the grid, chosen before v18 was timed).

--stagger (DIR/decode_stagger_h200.json, ~1 min): the same rounds, the defaults and v19
(``STAGGER``: v17's producer asks for its first tiles one at a time), at STAGGER_POINTS and
STAGGER_HELDOUT_POINTS (off the grid, two warpgroups, short loops, chosen before v19 was timed).

--overlap-producer (DIR/decode_overlap_producer_h200.json, ~2 min): the same rounds, v18,
v17 at 3 stages, v19 and v20 (v17's producer with v11's overlap: S_j's softmax while
P_{j-1} V_{j-1} is on the tensor cores), plain and staggered, at OVERLAP_PRODUCER_POINTS (the
table's MQA points of q_len 4) and OVERLAP_PRODUCER_HELDOUT_POINTS (off the grid, two
warpgroups, chosen before v20 was timed).

--q-first (DIR/decode_q_first_h200.json, ~1 min): the same rounds, v18, v21 (Q_i's loads
issued before the prologue's K/V tiles; the defaults since), v19 and both, at Q_FIRST_POINTS (the table's
short MQA steps, B 8 at 32k) and Q_FIRST_HELDOUT_POINTS (off the grid, chosen before v21 was
timed).

--stages (DIR/decode_stages_h200.json, ~1 min): the same rounds, v21 (the defaults) at 2 and 3
stages, alone and with v19, at STAGES_POINTS (the table's MQA points of q_len 4, and q_len 1 at
B 8, 32k) and STAGES_HELDOUT_POINTS (off the grid, chosen before any timing there).

--pingpong-producer (DIR/decode_pingpong_producer_h200.json, ~1 min): the same rounds, v21 (the
defaults) and v22 (its two consumer warpgroups in strict ping-pong turns), plain and with v19's
prologue, at PINGPONG_PRODUCER_POINTS (the table's MQA points of q_len 4) and
PINGPONG_PRODUCER_HELDOUT_POINTS (off the grid, two warpgroups, chosen before v22 was timed).

--splits-sweep: at every point of the grid with B in {1, 8} where the blocks without splits
fill less than half the GPU's slots, ours (the default kernels, the contiguous cache) at split
counts around each rule's choice (``sweep_splits``), each checked, then timed: the data that
holds the rules (decode.SPLIT_RULES: the default "sm", the wave rule, FlashAttention-2's; no
constant in any is fitted) against each other. With --sweep-page P the same on the rows in
pages of P tokens (DIR/decode_splits_p<P>_h200.json): the rules for a paged cache.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback

import numpy as np

from benchmarks.common import ClockLog, Recorder, parser, write_json
from gpu_kernels import harness
from gpu_kernels.common import KernelInputError, Result, cdiv
from gpu_kernels.cupy import decode

H, D = 32, 128
BATCHES, KV_LENS, KV_HEADS, Q_LENS, PAGES = (1, 8, 64), (4096, 32768, 131072), (32, 8, 1), (1, 4), (1, 16, 64)
MAX_CACHE_BYTES = 40e9
# The issue's reference figures (B, kv_heads, kv_len, q_len) first: the deadline cuts the rest.
REFERENCE_POINTS = [(8, 8, 32768, 1), (1, 8, 32768, 1), (64, 8, 4096, 1), (1, 8, 131072, 1),
                    (8, 8, 32768, 4), (8, 1, 32768, 1), (8, 32, 32768, 1), (64, 8, 32768, 1)]
FLEX_POINTS = {(8, 8, 32768, 1), (8, 8, 32768, 4)}
FLEX_GRACE_S = 40.0
TUNING_POINTS = [(8, 8, 32768, 1), (64, 8, 4096, 1), (1, 8, 32768, 1)]
TUNING_POINTS_V5 = [(8, 1, 32768, 4)]   # v5's tiles (decode.TUNING_V5) are chosen here
PAGED_V1 = 16                 # the page size at which v1 (no block-table prefetch) is timed too
W8_MIN_ROWS = 32              # _w8 and v5 where a KV head has this many packed rows (MQA); fewer
                              # rows would pad 8 warps' 32-row tiles (the time budget)
# The cache as ours reads it: token_major, (B, kv_len, kv_heads, d) itself (pages "NHD");
# head_major, PyTorch's (B, kv_heads, kv_len, d) tensors through transposed views (pages "HND")
LAYOUTS = ("token_major", "head_major")
MATH_MAX_BYTES = 4e9          # the math backend repeats K/V per query head: small points only
# PyTorch's SDPA backends as the table times them (impl, SDPBackend name); the other modes
# time the first two, the fastest
TORCH_BACKENDS = (("torch_flash", "FLASH_ATTENTION"), ("torch_cudnn", "CUDNN_ATTENTION"),
                  ("torch_efficient", "EFFICIENT_ATTENTION"), ("torch_math", "MATH"))
FAST_BACKENDS = (("torch_cudnn", "CUDNN_ATTENTION"), ("torch_flash", "FLASH_ATTENTION"))
# --host-issue: a step of one launch (mma.sync), the combine by programmatic dependent launch
# (wgmma, TMA, the producer) and v7's cooperative merge
HOST_POINTS = [(8, 32, 4096, 1), (8, 1, 32768, 4), (1, 8, 32768, 1), (1, 1, 32768, 1)]
# --overheads: the points that miss the issue's targets (small steps, MQA) and large ones beside
OVERHEAD_POINTS = [(1, 1, 4096, 1), (8, 1, 4096, 1), (1, 8, 4096, 1), (1, 1, 32768, 1),
                   (8, 1, 32768, 1), (1, 8, 32768, 1), (8, 8, 32768, 1), (8, 1, 131072, 1),
                   (1, 1, 32768, 4), (8, 1, 32768, 4), (64, 8, 4096, 1), (8, 32, 32768, 1)]
# --timeline: MQA at q_len 1 (B 8 32k: the point below 0.9 of the plain read; 4k and 128k beside
# it; B 1), and one and four query rows a KV head at B 8 32k; MQA at q_len 4 (two warpgroups,
# v17's producer: a short step and a long one, both below 0.9 of the plain read)
TIMELINE_POINTS = [(8, 1, 32768, 1), (8, 1, 4096, 1), (8, 1, 131072, 1), (1, 1, 32768, 1),
                   (8, 8, 32768, 1), (8, 32, 32768, 1), (8, 1, 32768, 4), (64, 1, 131072, 4)]
TIMELINE_RUNS = 9
# --timeline's chunked plain reads (blocks, threads): one block an SM (128 blocks, as the MQA
# points' 8 x 16 splits), each thread 8 loads of 16 bytes in flight: 64 KB a block, the bytes
# the defaults' wgmma loop has in flight (one 128-key K and V tile), and 128 KB (3 stages)
TIMELINE_CHUNKED_GRIDS = ((128, 512), (128, 1024))
# --overheads-profile: (B, kv_heads, kv_len, q_len) whose plain read and step ncu sees
OVERHEAD_PROFILE_POINTS = [(1, 1, 4096, 1), (8, 1, 32768, 1), (8, 8, 32768, 1)]
# --configs: q_len-1 points where ours fell short of PyTorch's best in decode_h200.json of
# 2026-12-03 (small MQA steps, and streams of one row a KV head at DRAM saturation)
CONFIG_POINTS = [(1, 1, 4096, 1), (1, 1, 32768, 1), (8, 1, 4096, 1), (8, 32, 4096, 1),
                 (64, 8, 4096, 1), (64, 32, 4096, 1), (8, 32, 32768, 1), (64, 32, 32768, 1)]
CONFIG_TILES = ((64, 2), (64, 3), (64, 4), (128, 2), (128, 3))    # (B_c, stages) of mma.sync
CONFIG_TILES_WGMMA = ((128, 2), (64, 2), (64, 3), (64, 4), (128, 3))   # of wgmma, the default first
# --configs-q4: the MQA points at q_len 4 that fell short of 0.9 of the plain read (the block's
# 128 rows on wgmma) in decode_h200.json of 2026-12-03, and B 64 at 4k beside them
CONFIG_POINTS_Q4 = [(8, 1, 32768, 4), (8, 1, 131072, 4), (64, 1, 32768, 4), (64, 1, 131072, 4),
                    (64, 1, 4096, 4)]
# --configs-mqa: the q_len-1 point with B >= 8 and kv_len >= 32k below 0.9 of the plain read in
# decode_h200.json of 2026-12-03 (MQA, 32 rows a KV head on wgmma), and the same at 128k beside it
CONFIG_POINTS_MQA = [(8, 1, 32768, 1), (8, 1, 131072, 1)]
# --ties: the q_len-1 points where ours fell short of PyTorch's best, by less than 2 %, in
# decode_h200.json of 2026-12-03 (the run with FlashInfer), and the rounds of interleaved timings
TIE_POINTS = [(64, 8, 4096, 1), (8, 32, 32768, 1), (1, 1, 32768, 1), (1, 32, 131072, 1),
              (8, 32, 4096, 1), (8, 32, 131072, 1), (64, 32, 4096, 1), (64, 1, 4096, 1)]
TIE_ROUNDS = 8
# --l2-hints: v13's L2 hints on the K/V copies (decode.configure's l2_prefetch, evict_first) at
# TIE_POINTS (ours behind cuDNN there: one row a KV head streams at DRAM saturation), MQA at B 8
# 32k (the TMA unit's copies, below 0.9 of the plain read) and points where ours led, under the
# table's flush and a clean one (evict_first keeps the flush's dirty lines in the L2: under the
# table's flush it saves their write-back, which a clean flush leaves nothing of)
L2_HINT_POINTS = TIE_POINTS + [(8, 8, 32768, 1), (1, 8, 32768, 1), (8, 1, 32768, 1), (8, 8, 32768, 4)]
L2_HINTS = (("none", {}), ("L2::128B", dict(l2_prefetch=128)), ("L2::256B", dict(l2_prefetch=256)),
            ("evict_first", dict(evict_first=1)), ("L2::256B, evict_first", dict(l2_prefetch=256, evict_first=1)))
ROUNDS = 4                    # --l2-hints, --phased: interleaved rounds of one timing each
# The GPU's spin before each timed call (harness.Harness's lead_s), in ms: our step's host issue
# (CuPy, DLPack views of PyTorch's tensors, cuLaunchKernelEx through cuda.bindings) took 0.3-0.7
# ms (median) and up to 1.5 ms in --chunks-rule's runs, past the harness's 0.5, which timed the
# GPU idle behind it (decode_chunks_rule_first_h200.json's scatter; "launch_s" of each row)
LEAD_MS = 3.0
# --phased: v14 (K and V loaded apart, one buffer each, B_c 128: cuDNN's decode tile) with the
# defaults' splits and with the wave rule's (both resident slots, where splits are chosen)
PHASED = (("defaults", {}), ("phased", dict(phased=1)), ("phased, wave rule", dict(phased=1, split_rule="wave")))
# --half-rows: v16 (HALF_ROWS: a KV head's <= 32 rows in the first 8 rows of each warp's 16, so
# the 4 warps share the softmax) against v9 (the defaults before it) where one warpgroup of wgmma runs
# 32 rows: the table's MQA points of q_len 1 (where --timeline found v9's blocks computing for
# about 70 % of their loop), and HALF_ROWS_HELDOUT_POINTS, off the grid (32 rows a KV
# head by MQA, or groups of 16 and 8 at q_len 2 and 4), chosen before any timing of v16
HALF_ROWS = (("v9", decode.VARIANTS["v9"]), ("v16", dict(decode.VARIANTS["v16"], half_rows=1)))
HALF_ROWS_POINTS = [(B, 1, n, 1) for B in (1, 8, 64) for n in (4096, 32768, 131072)]
HALF_ROWS_HELDOUT_POINTS = [(4, 1, 16384, 1), (16, 1, 8192, 1), (2, 2, 65536, 2), (8, 4, 32768, 4),
                            (32, 1, 2048, 1)]
# --producer: v17 (a producer warp; the consumer warpgroups never meet at a block barrier)
# against the defaults, where wgmma runs by TMA: the MQA points that fell short of 0.9 of the
# plain read in decode_h200.json of 2026-12-03 (q_len 4: two warpgroups bound by their own
# arithmetic; q_len 1 B 8 32k: one warpgroup) and their neighbours on the grid, and held-out
# points off the grid (two warpgroups: 96 or 128 rows a KV head; one: 32 rows), chosen before
# v17 was first timed
# ("defaults": the defaults as they were before v17, v9 or v16 by the rows)
V17 = dict(decode.VARIANTS["v17"], producer=1)
PRODUCER = (("defaults", decode.VARIANTS["v16"]), ("v17", V17), ("v17, 3 stages", dict(V17, stages=3)))
PRODUCER_POINTS = CONFIG_POINTS_Q4 + [(8, 1, 32768, 1), (8, 1, 131072, 1), (1, 1, 32768, 1)]
PRODUCER_HELDOUT_POINTS = [(16, 1, 16384, 4), (4, 1, 65536, 4), (2, 2, 65536, 8), (32, 1, 8192, 3),
                           (4, 1, 65536, 1), (16, 1, 16384, 1), (2, 4, 131072, 4), (24, 2, 8192, 2)]
# --producer-heldout: v9 and v17 in the same rounds at points with long loops (32 to 512 tiles
# of 128 keys a block) off the grid, two warpgroups each, chosen after --producer's run (where
# v17 gained at the long steps only) and before any timing of them
PRODUCER_HELDOUT = (("v9", decode.VARIANTS["v9"]), ("v17", V17))
PRODUCER_LONG_HELDOUT_POINTS = [(32, 1, 65536, 4), (16, 1, 131072, 3), (4, 2, 131072, 8), (48, 1, 32768, 4),
                                (8, 4, 65536, 16), (96, 1, 16384, 4), (12, 1, 49152, 4)]
# --kv-lens: v18 (the kv_lens by value, a kernel parameter) against v17 (read from global memory
# before the first tile can be issued): short steps where ours fell behind PyTorch's best or
# near it in decode_h200.json of 2026-12-04, MQA at B 8 32k, and held-out points off the grid
# (one to 128 rows a KV head, steps of 4 to 64 MB), chosen before v18 was first timed
KV_LENS_ARGS = (("v17", decode.VARIANTS["v17"]), ("v18", dict(decode.VARIANTS["v18"], kv_lens_arg=1)))
KV_LENS_POINTS = [(1, 1, 32768, 1), (8, 1, 4096, 1), (1, 8, 4096, 1), (1, 32, 4096, 1), (64, 8, 4096, 1),
                  (1, 1, 4096, 4), (8, 1, 32768, 1), (8, 1, 32768, 4)]
KV_LENS_HELDOUT_POINTS = [(2, 1, 16384, 1), (4, 8, 8192, 1), (16, 2, 4096, 2), (2, 32, 8192, 1),
                          (32, 4, 2048, 1), (3, 1, 65536, 4)]
# --stagger: v19 (v17's producer asking for its first tiles one at a time) against v18 (the defaults then)
# where v17's producer runs (two warpgroups): the MQA points of q_len 4 (the short ones, where
# --timeline found the first tile landing 4 us later than at q_len 1, and long ones beside
# them), and held-out points off the grid with short loops, chosen before v19 was first timed
V18, V21 = decode.VARIANTS["v18"], decode.VARIANTS["v21"]
STAGGER = (("v18", V18), ("v19", dict(V18, stagger=1, producer=1)))
STAGGER_POINTS = [(8, 1, 32768, 4), (64, 1, 4096, 4), (8, 1, 131072, 4), (64, 1, 32768, 4)]
STAGGER_HELDOUT_POINTS = [(16, 1, 8192, 4), (32, 1, 4096, 3), (4, 2, 32768, 8), (24, 1, 16384, 4)]
# --overlap-producer: v20 (v17's producer with v11's overlap: a tile's softmax beside the previous
# tile's P V) against v18, v17 at v20's 3 stages (what the stages alone do) and v19,
# at the table's MQA points of q_len 4 (two warpgroups; --timeline found v17's loop there bound
# by arithmetic) and held-out points off the grid (96 or 128 rows a KV head, short and long
# loops), chosen before v20 was first timed
V20 = dict(V18, producer=1, overlap=1, stages=3)
OVERLAP_PRODUCER = (("v18", V18), ("v17, 3 stages", dict(V18, producer=1, stages=3)),
                    ("v19", dict(V18, stagger=1, producer=1)),
                    ("v20", V20), ("v20, staggered", dict(V20, stagger=1)))
OVERLAP_PRODUCER_POINTS = [(B, 1, n, 4) for B in (1, 8, 64) for n in (4096, 32768, 131072)]
OVERLAP_PRODUCER_HELDOUT_POINTS = [(24, 1, 24576, 4), (6, 2, 65536, 8), (40, 1, 8192, 3), (12, 1, 98304, 4),
                                   (3, 1, 131072, 4), (20, 2, 16384, 8), (2, 1, 65536, 4)]
# --q-first: v21 (Q_i's loads issued before the prologue's K/V tiles) against v18 (the defaults then), v19
# and both, where wgmma runs (MQA): the table's short MQA steps of q_len 1 and 4 (whose start is
# a large part of them) and B 8 at 32k, and held-out points off the grid (32 to 128 rows a KV
# head), chosen before v21 was first timed
Q_FIRST = (("v18", V18), ("v21", dict(V21, q_first=1)), ("v19", dict(V18, stagger=1, producer=1)),
           ("v21 + v19", dict(V21, q_first=1, stagger=1, producer=1)))
Q_FIRST_POINTS = [(B, 1, n, ql) for ql in (1, 4) for B, n in ((1, 4096), (8, 4096), (64, 4096), (8, 32768))]
Q_FIRST_HELDOUT_POINTS = [(16, 1, 8192, 1), (32, 1, 2048, 4), (4, 2, 16384, 4), (48, 1, 4096, 3),
                          (2, 1, 16384, 1), (12, 2, 8192, 8)]
# --stages: v21 at 3 stages of 128-key tiles (two tiles in flight while one is computed on)
# against its 2, alone and with v19's prologue: v21's warp samples at MQA q_len 4, B 8, 32k
# (decode_loop_sass_ncu_h200_v21.csv) have the consumers waiting on a tile's mbarrier where
# v18's waited on Q_i's stores. The table's MQA points of q_len 4 and MQA q_len 1 at B 8, 32k,
# and held-out points off the grid (one and two warpgroups), chosen before any timing here
STAGES_V21 = (("v21", V21), ("v21, 3 stages", dict(V21, stages=3)), ("v21 + v19", dict(V21, stagger=1, producer=1)),
              ("v21 + v19, 3 stages", dict(V21, stagger=1, producer=1, stages=3)))
STAGES_POINTS = [(B, 1, n, 4) for B in (1, 8, 64) for n in (4096, 32768, 131072)] + [(8, 1, 32768, 1)]
STAGES_HELDOUT_POINTS = [(16, 1, 16384, 4), (4, 1, 65536, 4), (32, 1, 8192, 4), (12, 2, 32768, 8),
                         (6, 1, 49152, 1), (24, 1, 65536, 1)]
# --pingpong-producer: v22 (v21 with FlashAttention-3's strict ping-pong turns of the two
# consumer warpgroups beside the producer) against v21, alone and with v19's prologue, at the
# table's MQA points of q_len 4 (two warpgroups) and held-out points off the grid with two
# warpgroups, chosen before v22 was first timed
V22 = dict(V21, producer=1, pingpong=1)
PINGPONG_PRODUCER = (("v21", V21), ("v22", V22), ("v22 + v19", dict(V22, stagger=1)))
PINGPONG_PRODUCER_POINTS = [(B, 1, n, 4) for B in (1, 8, 64) for n in (4096, 32768, 131072)]
PINGPONG_PRODUCER_HELDOUT_POINTS = [(16, 1, 24576, 4), (5, 1, 98304, 4), (40, 1, 4096, 4), (10, 2, 16384, 8),
                                    (3, 2, 65536, 8), (28, 1, 12288, 3)]
# --turn-pv: v23 (v22 whose turn issues P_{j-1} V_{j-1} with S_j, FlashAttention-3's grouping) at
# 2 and 3 stages against v21 and v22, at the table's MQA points of q_len 4 and held-out points
# off the grid with two warpgroups (none of v22's), chosen before v23 was first timed
V23 = dict(V22, turn_pv=1)
TURN_PV = (("v21", V21), ("v22", V22), ("v23", V23), ("v23, 3 stages", dict(V23, stages=3)))
TURN_PV_HELDOUT_POINTS = [(20, 1, 20480, 4), (6, 1, 81920, 4), (48, 1, 6144, 4), (7, 2, 40960, 8),
                          (2, 4, 65536, 16), (36, 1, 10240, 3)]
# --turn-pv-heldout: the rule read off --turn-pv's calibration points (v23 at 3 stages above
# decode.TURN_PV_MIN_TILES tiles a split, decode.default_turn_pv) against v21 at points chosen
# after that run and before this one, none of its: two warpgroups with the producer, 18 to 64
# tiles a split, and two below the rule's threshold (4 and 8 tiles), where it keeps v21
TURN_PV_RULE_POINTS = [(12, 1, 24576, 4), (24, 1, 16384, 4), (96, 1, 8192, 4), (5, 2, 32768, 8),
                       (10, 4, 12288, 16), (16, 1, 65536, 3), (40, 1, 12288, 4), (4, 1, 16384, 4),
                       (32, 1, 4096, 4)]
TURN_PV_RULE = (("v21", V21), ("v23, 3 stages", dict(V23, stages=3)), ("defaults", decode.VARIANTS["v23"]))
# --turn-overlap: v24 (v23 with v20's order inside a warpgroup: the softmax of S_j beside
# P_{j-1} V_{j-1}) against v23 and v21, at the table's MQA points of q_len 4 and held-out points
# off the grid where the defaults run the producer, chosen before v24 was first timed
V24 = dict(V23, stages=3, overlap=1)
TURN_OVERLAP = (("v23, 3 stages", dict(V23, stages=3)), ("v24", V24), ("v21", V21))
TURN_OVERLAP_HELDOUT_POINTS = [(32, 1, 16384, 4), (80, 1, 8192, 4), (3, 2, 98304, 8), (9, 1, 57344, 4),
                               (14, 4, 24576, 16), (5, 1, 98304, 4)]
# --tree-softmax: v25 (the softmax's row max and sum in 4 partial chains) on the defaults against
# the defaults, at the table's MQA points of q_len 4 and of q_len 1 with B >= 8 (two warpgroups
# and one), and held-out points off the grid on wgmma, chosen before v25 was first timed
TREE_SOFTMAX = (("v23", decode.VARIANTS["v23"]), ("v25", dict(decode.VARIANTS["v23"], tree_softmax=1)))
TREE_SOFTMAX_POINTS = PINGPONG_PRODUCER_POINTS + [(B, 1, n, 1) for B in (8, 64) for n in (4096, 32768, 131072)]
TREE_SOFTMAX_HELDOUT_POINTS = [(12, 1, 49152, 1), (40, 2, 8192, 2), (6, 1, 65536, 4), (24, 1, 32768, 3),
                               (3, 4, 131072, 16), (72, 1, 4096, 1)]
# --chunks-q4: at short MQA steps of q_len 4 (1 or 2 tiles a split: no loop for v23's turns),
# the defaults against one warpgroup on each 64-row half of a KV head's 128 rows (two row
# chunks, v9_w4's layout, with v21's loads): twice the blocks at the "sm" rule's splits (half
# v23's where those fill the SMs), each half the arithmetic a tile; the table's short MQA points
# of q_len 4 and held-out points off the grid, chosen before any timing here
CHUNKS = dict(decode.VARIANTS["v23"], warps=4, wgmma=1)
CHUNKS_Q4 = (("v23", decode.VARIANTS["v23"]), ("one warpgroup, chunks", CHUNKS))
CHUNKS_Q4_POINTS = [(B, 1, 4096, 4) for B in (1, 8, 64)]
CHUNKS_Q4_HELDOUT_POINTS = [(2, 1, 4096, 4), (4, 1, 8192, 4), (16, 1, 2048, 4), (3, 1, 6144, 3)]
# --chunks-rule: the second run of that lead, over the whole range of split lengths, so that a
# rule can be read off it: the defaults against one warpgroup a 64-row chunk (with v23's
# 128-key tiles at 2 stages, and with 64-key tiles at 4: twice the splits where a split would
# be one tile) at the table's 9 MQA points of q_len 4 (calibration: any rule is read off these
# alone) and at held-out points off the grid with more than 64 rows a KV head (MQA at q_len 3
# to 5, groups of 16 at q_len 6 and 8), chosen before this run; CHUNKS_RULE_ROUNDS rounds,
# twice ROUNDS, because the first run's rounds of ours scattered
CHUNKS_RULE = CHUNKS_Q4 + (("chunks, 64-key tiles", dict(CHUNKS, block_cols=64, stages=4)),)
CHUNKS_RULE_HELDOUT_POINTS = [(2, 1, 16384, 4), (4, 1, 4096, 3), (16, 2, 8192, 8), (32, 1, 8192, 4),
                              (1, 1, 65536, 4), (12, 1, 2048, 4), (6, 2, 4096, 6), (24, 1, 24576, 4),
                              (3, 1, 12288, 5)]
CHUNKS_RULE_ROUNDS = 8
# --phased-heldout: the phased loop (at the defaults' splits, 1 here, and at v14's wave rule)
# against the defaults off the table's grid, where a step needs no splits (batch x kv_heads
# blocks fill half the slots or more) and a KV head has at most 16 rows, chosen before any
# timing there: holds "phased where there are no splits" (read off the table's
# decode_h200.json of 2026-12-03, its calibration) to points it was not chosen on
PHASED_HELDOUT_POINTS = [(16, 8, 16384, 1), (32, 4, 8192, 2), (4, 32, 65536, 1), (16, 16, 8192, 2),
                         (3, 32, 24576, 3), (40, 2, 8192, 1), (12, 8, 12288, 4), (24, 16, 6144, 1)]
PHASED_HELDOUT = (("defaults", {}), ("phased", dict(phased=1)), ("v14", decode.VARIANTS["v14"]))
# --l2-hints-profile: where a hint moved ours most in decode_l2_hints_h200.json (2026-12-03)
L2_HINT_PROFILE_POINTS = [(8, 32, 4096, 1), (1, 8, 32768, 1), (8, 8, 32768, 1)]
# --clock-ramp: (B, kv_heads, kv_len, q_len), the first where the table's slow timings fell
CLOCK_POINTS = [(1, 32, 32768, 4), (8, 1, 32768, 1)]
CLOCK_IDLE_S, CLOCK_WARMUPS, CLOCK_WARM_S = (0.0, 2.0), ("calls", "spin", "calls_for"), 0.1
CLOCK_REPEATS, CLOCK_CYCLES = 10, 4
# FlashInfer's float workspace (the split-KV partials; its examples take 128 MB)
FI_WORKSPACE_BYTES = 2 << 30     # its fa2 prefill at MQA, q_len 4 (128 rows a KV head) took > 0.5 GB
FI_BACKENDS = ("fa2", "fa3")        # the prefill kernel at q_len > 1; fa3 where its module is there
# the chunked plain read's launches: (blocks, threads), one resident wave each
PLAIN_READ_CHUNKED_GRIDS = ((132 * 8, 256), (132 * 2, 1024))
EMPTY = r"""
extern "C" __global__ void empty_launch(int* flag) { if (flag[0] == 0x5EED) flag[1] = 1; }
"""

METHOD = ("Every implementation is checked on the very inputs it is timed on before it is timed: "
          "the float64 reference of the last (sequence, KV head) (and the first, below kv_len 32k) "
          "for every query row, flash-attention's rule (max error <= 2 x a plain same-dtype "
          "NumPy implementation's, harness.plain_attention), L within 1e-3 + 1e-5|L|; a point "
          "whose check fails is still timed and recorded with check_ok false. Then the harness "
          "(gpu_kernels.harness: warm-up, CUDA events around each call, a 2 x L2 flush before "
          "every repeat, the median).")

PLAIN_READ = r"""
extern "C" __global__ void plain_read(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                      unsigned long long n, unsigned int* out) {
    unsigned int acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {      // four 16-byte loads of each in flight
        uint4 x0 = a[i], x1 = a[i + stride], x2 = a[i + 2 * stride], x3 = a[i + 3 * stride];
        uint4 y0 = b[i], y1 = b[i + stride], y2 = b[i + 2 * stride], y3 = b[i + 3 * stride];
        acc ^= x0.x ^ x0.y ^ x0.z ^ x0.w ^ x1.x ^ x1.y ^ x1.z ^ x1.w ^ x2.x ^ x2.y ^ x2.z ^ x2.w
             ^ x3.x ^ x3.y ^ x3.z ^ x3.w ^ y0.x ^ y0.y ^ y0.z ^ y0.w ^ y1.x ^ y1.y ^ y1.z ^ y1.w
             ^ y2.x ^ y2.y ^ y2.z ^ y2.w ^ y3.x ^ y3.y ^ y3.z ^ y3.w;
    }
    for (; i < n; i += stride) {
        uint4 x = a[i], y = b[i];
        acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
    }
    if (acc == 0x9E3779B9u) out[0] = acc;               // keeps the loads; almost never true
}
"""
# The same bytes, each block streaming one contiguous chunk of a and of b (as an attention
# block streams its K and V) where PLAIN_READ's grid-stride loop spreads every step over the
# whole range: which of the two access patterns DRAM serves faster is measured (--configs).
# PLAIN_READ's loop, over the block's chunk [lo, hi) with its threads' stride.
PLAIN_READ_CHUNKED = (PLAIN_READ.replace("void plain_read(", "void plain_read_chunked(")
                      .replace("""    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
""", """    const unsigned long long per = (n + gridDim.x - 1) / gridDim.x;
    const unsigned long long lo = (unsigned long long)blockIdx.x * per;
    const unsigned long long hi = lo + per < n ? lo + per : n;
    const unsigned long long stride = blockDim.x;
    unsigned long long i = lo + threadIdx.x;
""").replace("< n;", "< hi;"))
assert PLAIN_READ_CHUNKED.count("< hi;") == 2 and "lo + threadIdx.x" in PLAIN_READ_CHUNKED


def stamped(source: str, name: str) -> str:
    """A plain read's source (PLAIN_READ's or PLAIN_READ_CHUNKED's) with decode.cu's TIMELINE
    stamps of each block, kernel ``name``_timeline with one more parameter ``tl`` (4 uint64 a
    block): SM, entry, thread 0's first 8 loads returned (its first pass of the loop of 4 loads
    of each) and exit, on the global timer (ns)."""
    out = (source.replace(f"void {name}(", f"void {name}_timeline(")
           .replace("unsigned int* out) {", """unsigned int* out,
                                      unsigned long long* tl) {
    unsigned long long t0, t1, tf = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));""")
           .replace("""             ^ y2.x ^ y2.y ^ y2.z ^ y2.w ^ y3.x ^ y3.y ^ y3.z ^ y3.w;
""", """             ^ y2.x ^ y2.y ^ y2.z ^ y2.w ^ y3.x ^ y3.y ^ y3.z ^ y3.w;
        if (tf == 0)                                     // once acc has the first 8 loads' data
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(tf) : "r"(acc));
""")
           .replace("    if (acc == 0x9E3779B9u) out[0] = acc;               // keeps the loads; almost never true",
                    """    if (acc == 0x9E3779B9u) out[0] = acc;               // keeps the loads; almost never true
    __syncthreads();                                     // the block's last load has returned
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        tl[4 * blockIdx.x] = sm; tl[4 * blockIdx.x + 1] = t0; tl[4 * blockIdx.x + 2] = tf;
        tl[4 * blockIdx.x + 3] = t1;
    }"""))
    assert out.count("globaltimer") == 3 and "tl[4 * blockIdx.x + 3]" in out and f"{name}_timeline(" in out
    return out


PLAIN_READ_TIMELINE = stamped(PLAIN_READ, "plain_read")
PLAIN_READ_CHUNKED_TIMELINE = stamped(PLAIN_READ_CHUNKED, "plain_read_chunked")


def cache_bytes(B, kvh, n) -> int:
    return 2 * B * n * kvh * D * 2


def point_row(B, kvh, n, ql, **extra) -> dict:
    """The fields every row of one point (B, kv_heads, kv_len, q_len) carries."""
    return {"batch": B, "heads": H, "kv_heads": kvh, "kv_len": n, "q_len": ql, "head_dim": D,
            "dtype": "float16", "kv_bytes": cache_bytes(B, kvh, n), **extra}


def by_point(points, checked: bool = True) -> dict[tuple, list[dict]]:
    """The rows of each point (B, kv_heads, kv_len, q_len), in the order first recorded; with
    ``checked``, only those whose check passed."""
    out: dict[tuple, list[dict]] = {}
    for p in points:
        if p["check_ok"] or not checked:
            out.setdefault((p["batch"], p["kv_heads"], p["kv_len"], p["q_len"]), []).append(p)
    return out


def grid_points(quick: bool) -> list[tuple]:
    pts = list(REFERENCE_POINTS)
    if not quick:
        pts += [(B, kvh, n, ql) for B in BATCHES for n in KV_LENS for kvh in KV_HEADS for ql in Q_LENS]
    return [p for p in dict.fromkeys(pts) if cache_bytes(*p[:3]) <= MAX_CACHE_BYTES]


def paged_copy(torch, k, v, page_size: int, seed: int, head_major: bool = False):
    """The rows of k, v (B, n, kvh, d) in pages of ``page_size`` tokens, the pages in a
    random order: (k_pages, v_pages (num_pages, P, kvh, d), block_table (B, pages) int32 on
    the host). ``head_major``: the pages stored (num_pages, kvh, P, d) (FlashInfer's "HND"),
    returned as their transposed views."""
    B, n, kvh, d = k.shape
    per = math.ceil(n / page_size)
    perm = np.random.default_rng(seed).permutation(B * per).astype(np.int32)
    bt = perm.reshape(B, per)
    idx = torch.as_tensor(bt.reshape(-1), device="cuda", dtype=torch.long)
    out = []
    for x in (k, v):
        pages = torch.empty((B * per, page_size, kvh, d), dtype=x.dtype, device="cuda")
        src = torch.zeros((B, per * page_size, kvh, d), dtype=x.dtype, device="cuda") \
            if per * page_size != n else x
        if src is not x:
            src[:, :n] = x
        pages[idx] = src.reshape(B * per, page_size, kvh, d)
        del src
        if head_major:
            pages = pages.transpose(1, 2).contiguous().transpose(1, 2)
        out.append(pages)
    return out[0], out[1], bt


class Bench(Recorder):
    def __init__(self, args, name: str = "decode_h200.json"):
        import cupy
        import torch

        self.torch, self.cupy = torch, cupy
        self.harness = harness.Harness("cupy", target_s=0.06, max_repeats=12,   # the 4-minute budget
                                       lead_s=args.lead_ms / 1e3)
        super().__init__(args, name, METHOD, timing=self.harness.method(),
                         notes={}, tuning=[], config={}, plain_read_source=PLAIN_READ.strip())
        self.tile = dict(block_cols=decode.BLOCK_C, stages=decode.STAGES[D])   # until tune()
        self.tile_v5 = dict(zip(("block_cols", "stages"), decode.WGMMA_TILES))
        self._plain = cupy.RawKernel(PLAIN_READ, "plain_read")
        self._flag = cupy.zeros(1, cupy.uint32)
        self.failures = 0
        # NVML's clocks and clock-event reasons through the run, beside each row's host times
        # ("host_t"): what the GPU did during a slow timing (DIR/<name>_clocks.json)
        self.clocks = ClockLog().start()
        self._fi_workspace = None
        try:                  # not on the H200's image: benchmarks/peers/flashinfer_aot.py
            import flashinfer
            self.fi = flashinfer
            self.results["notes"]["flashinfer"] = f"flashinfer-python {flashinfer.__version__}"
        except ImportError as exc:
            self.fi = None
            self.results["notes"]["flashinfer"] = f"not installed here ({exc}): no FlashInfer points"

    def clean_harness(self):
        """The table's harness (its repeats and lead) with a clean flush: a write, then a read
        of as many other bytes (--overheads, --timeline, the interleaved rounds)."""
        return harness.Harness("cupy", target_s=self.harness.target_s, max_repeats=self.harness.max_repeats,
                               clean=True, lead_s=self.harness.lead_s)

    # ------------------------------------------------------------------ recording

    def record(self, what: dict, fn, check, repeats=None, into: str = "points") -> dict | None:
        """Check fn's output, then time fn (even if the check failed: check_ok false); the
        row goes to results[into] and is returned (None: it raised, recorded as skipped)."""
        t_start = time.perf_counter()
        try:
            res = fn()
            self.torch.cuda.synchronize()
            verdict = check(res) if check is not None else {"ok": True, "note": "no output"}
            del res
            t = self.harness.time(fn, repeats=repeats)
        except Exception as exc:  # OOM, a backend that refuses: skipped, with the reason
            self.skip(what, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            if what["impl"].startswith("cupy"):     # ours must run: that is a failure
                self.failures += 1
            self.torch.cuda.empty_cache()
            return None
        tb = what["kv_bytes"] / t.median_s / 1e12
        ok = bool(verdict["ok"])
        if not ok and what["impl"].startswith("cupy"):    # a peer's miss is recorded, not ours
            self.failures += 1
        row = {**what, "time_s": t.median_s, "tbps": tb, "check_ok": ok,
               "repeats": len(t.times_s), "min_s": min(t.times_s), "check": verdict,
               "host_t": [t_start, time.perf_counter()], "launch_s": statistics.median(t.launch_s),
               "launch_max_s": max(t.launch_s)}
        self.results[into].append(row)
        print(f"{what['impl']:>18} B={what['batch']:>2} kvh={what['kv_heads']:>2} n={what['kv_len']:>6} "
              f"q={what['q_len']} P={what['page_size']}: {t.median_s * 1e6:9.1f} us {tb:5.2f} TB/s"
              f"{'' if ok else '  CHECK FAILED'}", flush=True)
        return row

    def finish(self, note: str = "") -> str:
        self.clocks.stop()
        write_json(self.args.out, self.name.replace(".json", "_clocks.json"), self.clocks.as_dict(),
                   indent=None)
        return super().finish(note)

    def conclude(self, step, summary=None) -> int:
        """Run ``step`` (``guarded``), then ``summary()`` over what it recorded, and write the
        file with its failed checks: the exit status of a mode (0: it ran and every check of
        ours passed)."""
        ok = self.guarded(step)
        if summary is not None:
            summary()
        self.results["failed_checks"] = self.failures
        self.finish(f"; {self.failures} failed checks")
        return 0 if ok and not self.failures else 1

    def due_points(self, points):
        """(B, kv_heads, kv_len, q_len, the point's row fields) of each of ``points`` while
        time is left (``due``: the rest are recorded as skipped)."""
        for B, kvh, n, ql in points:
            base = point_row(B, kvh, n, ql, page_size=0)
            if self.due(base):
                yield B, kvh, n, ql, base

    # ------------------------------------------------------------------ one point
    def inputs(self, B, kvh, n, ql):
        """q, k, v (contiguous cache) of one point, the launch of our kernel, the float64
        references of its checked rows (causal, and unmasked for q_len > 1), the check of our
        output and ``run_ours(launch, k, v)`` -> a timed call writing into fixed O, L."""
        torch = self.torch
        g = torch.Generator(device="cuda").manual_seed(B * 7 + kvh * 3 + n + ql)
        q = torch.randn((B, ql, H, D), device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn((B, n, kvh, D), device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn((B, n, kvh, D), device="cuda", dtype=torch.float16, generator=g)
        launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **self.tile)
        pairs = decode.checked_pairs(launch)
        qh = q.float().cpu().numpy()
        rows = ({b: decode.HeadRows(k[b]) for b, _ in pairs},
                {b: decode.HeadRows(v[b]) for b, _ in pairs})
        refs = {True: decode.reference_rows(launch, qh, *rows, pairs)}
        if ql > 1:
            refs[False] = decode.reference_rows(launch, qh, *rows, pairs, causal=False)
        del rows

        def ours_check(res):
            return decode.check_rows(launch, refs[True], res.O.float().cpu().numpy(),
                                     res.L.cpu().numpy())

        O = torch.empty_like(q)
        L = torch.empty((B, H, ql), device="cuda", dtype=torch.float32)

        def run_ours(lch, kk, vv):
            def fn():
                lch.run(q, kk, vv, out=O, lse=L)
                return Result(O, L)
            return fn
        return q, k, v, launch, refs, ours_check, run_ours

    @staticmethod
    def torch_layout(q, k, v):
        """One point's inputs as PyTorch takes them, q (B, H, q_len, d) and K, V (B, kv_heads,
        kv_len, d) contiguous, and those K, V as ours reads them (transposed views: head-major):
        (qt, kt, vt, kh, vh)."""
        qt = q.transpose(1, 2).contiguous()
        kt, vt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        return qt, kt, vt, kt.transpose(1, 2), vt.transpose(1, 2)

    def tiles(self, wgmma: int) -> dict:
        """The tuned tiles of v5 (wgmma) or of the mma.sync versions."""
        return self.tile_v5 if wgmma else self.tile

    def variant_tiles(self, kw: dict, rows: int) -> dict:
        """The tuned tiles of a VARIANTS entry for ``rows`` packed rows a KV head (one that
        names no wgmma, v6, runs the default's), less those it names itself (v9_s3, v11)."""
        tiles = self.tiles(kw.get("wgmma", decode.default_wgmma(rows)))
        return {k: v for k, v in tiles.items() if k not in kw}

    def tune(self):
        """Time every (B_c, STAGES) of decode.TUNING on the contiguous cache at TUNING_POINTS
        (and of decode.TUNING_V5, v5, at TUNING_POINTS_V5); the fastest correct one (geometric
        mean) runs the whole table."""
        self.tile = self._tune(decode.TUNING, TUNING_POINTS, {"wgmma": 0})
        self.tile_v5 = self._tune(decode.TUNING_V5, TUNING_POINTS_V5, decode.VARIANTS["v5"])
        self.results["config"] = {**self.tile, "chosen_from": [list(c) for c in decode.TUNING],
                                  "points": [list(p) for p in TUNING_POINTS],
                                  "v5": {**self.tile_v5, "chosen_from": [list(c) for c in decode.TUNING_V5],
                                         "points": [list(p) for p in TUNING_POINTS_V5]}}
        print(f"tiles for the table: {self.tile}; v5: {self.tile_v5}", flush=True)
        self.save()

    def _tune(self, candidates, points, kw) -> dict:
        times = {c: [] for c in candidates}
        for B, kvh, n, ql in points:
            q, k, v, launch, refs, check, run_ours = self.inputs(B, kvh, n, ql)
            base = point_row(B, kvh, n, ql, page_size=0)
            for Bc, st in candidates:
                lt = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, block_cols=Bc, stages=st,
                                      **kw)
                row = self.record({"impl": "cupy_decode", **base, "block_cols": Bc, "stages": st,
                                   "splits": lt.splits, "wgmma": lt.wgmma}, run_ours(lt, k, v), check,
                                  into="tuning")
                if row is not None and row["check_ok"] and (Bc, st) in times:
                    times[(Bc, st)].append(row["time_s"])
                else:
                    times.pop((Bc, st), None)           # failed or did not run: not chosen
            del q, k, v
            self.torch.cuda.empty_cache()
        full = {c: t for c, t in times.items() if len(t) == len(points)}
        best = min(full, key=lambda c: sum(map(math.log, full[c]))) if full else candidates[0]
        return dict(block_cols=best[0], stages=best[1])

    def point(self, B, kvh, n, ql):
        torch = self.torch
        base = point_row(B, kvh, n, ql)
        q, k, v, launch, refs, ours_check, run_ours = self.inputs(B, kvh, n, ql)

        self.ours(base, k, v, run_ours, ours_check, "token_major")
        self.paged(base, k, v, run_ours, ours_check, "token_major", peers=self.fi and (
            lambda kp, vp, bt: self.flashinfer(base, q, kp, vp, bt, launch, refs)))
        self.plain_read(base, k, v)

        qt, kt, vt, kh, vh = self.torch_layout(q, k, v)
        del k, v
        torch.cuda.empty_cache()
        for impl, fields, fn, check in self.sdpa_calls(base, qt, kt, vt, launch, refs):
            self.record({"impl": impl, **base, **fields}, fn, check,
                        repeats=3 if impl == "torch_math" else None)
        del qt
        # ours on PyTorch's very K and V: the head-major cache through its transposed view
        self.ours(base, kh, vh, run_ours, ours_check, "head_major")
        self.paged(base, kh, vh, run_ours, ours_check, "head_major")
        del kt, vt, kh, vh
        torch.cuda.empty_cache()
        self.save()

    def ours(self, base, k, v, run_ours, ours_check, layout: str):
        """Ours on the cache k, v (B, n, kvh, d) as laid out (``layout``: token_major, the
        arrays themselves; head_major, transposed views of (B, kvh, n, d) storage), each
        configuration of decode.VARIANTS that differs from those timed before it. The row that
        ran the defaults' configuration (``decode.default_version``, at the run's tuned tiles) under whichever
        name timed it first is marked "defaults": the table's best is a maximum over many
        timings, the defaults' row is one configuration chosen before timing."""
        B, kvh, n, ql = (base[x] for x in ("batch", "kv_heads", "kv_len", "q_len"))
        seen, defaults = {}, None
        for name, kw in decode.VARIANTS.items():
            if (name.endswith("_w8") or name == "v5") and ql * H // kvh < W8_MIN_ROWS:
                continue
            if name == "v5_w4" and not W8_MIN_ROWS <= ql * H // kvh <= 64:   # one 64-row block
                continue
            if name in ("v9_s3", "v11") and ql * H // kvh < W8_MIN_ROWS:     # v9_w4 pads those
                continue
            if name == "v14" and ql * H // kvh >= W8_MIN_ROWS:  # mma.sync where the defaults run wgmma
                continue
            try:
                lv = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql,
                                      **self.variant_tiles(kw, ql * H // kvh), **kw)
            except KernelInputError as exc:   # e.g. 8 warps' merge with the tuned 2 stages
                self.skip({"impl": "cupy_decode", **base, "page_size": 0, "variant": name,
                           "layout": layout}, str(exc))
                continue
            defs = lv.defines()
            if lv.splits == 1:                  # no combine launch: its version is moot
                defs.pop("COMBINE")
            key = (tuple(sorted(defs.items())), lv.splits)
            if name == decode.default_version(0):
                defaults = key
            if key in seen:                     # the same kernels and grid as one timed above
                continue
            seen[key] = self.record({"impl": "cupy_decode", **base, "page_size": 0, "layout": layout,
                                     "splits": lv.splits, "variant": name, "warps": lv.warps,
                                     "combine": lv.combine, "block_cols": lv.block_cols,
                                     "stages": lv.stages, "fused": lv.fused},
                                    run_ours(lv, k, v), ours_check)
        if seen.get(defaults) is not None:
            seen[defaults]["defaults"] = True

    def paged(self, base, k, v, run_ours, ours_check, layout: str, peers=None, v1: bool = True):
        """Ours on the same rows in pages of each of PAGES, in random order: "NHD" pages
        (num_pages, P, kvh, d) (``layout`` token_major) or "HND" (num_pages, kvh, P, d) seen
        through transposed views (head_major); the defaults (recorded as v12: v9's kernels, the
        wave rule's splits), and (``v1``) v1 too at PAGED_V1, q_len 1, token_major; then
        ``peers(kp, vp, block_table)`` on the same pages (FlashInfer's, where it is installed)."""
        torch = self.torch
        B, kvh, n, ql = (base[x] for x in ("batch", "kv_heads", "kv_len", "q_len"))
        for P in PAGES:
            kp, vp, bt = paged_copy(torch, k, v, P, seed=P, head_major=layout == "head_major")
            extra = v1 and P == PAGED_V1 and ql == 1 and layout == "token_major"
            for name in ("defaults", "v1") if extra else ("defaults",):
                kw = {} if name == "defaults" else decode.VARIANTS[name]
                try:
                    lp = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, page_size=P,
                                          block_table=bt, num_pages=kp.shape[0],
                                          **self.variant_tiles(kw, ql * H // kvh), **kw)
                except KernelInputError as exc:
                    self.skip({"impl": "cupy_decode_paged", **base, "page_size": P,
                               "variant": name, "layout": layout}, str(exc))
                    continue
                if name == "defaults":          # v12: v9's kernels, the wave rule's splits
                    name = decode.default_version(P)
                self.record({"impl": "cupy_decode_paged", **base, "page_size": P, "layout": layout,
                             "splits": lp.splits, "variant": name, "warps": lp.warps,
                             "combine": lp.combine, "page_prefetch": lp.page_prefetch,
                             "block_cols": lp.block_cols, "stages": lp.stages, "fused": lp.fused},
                            run_ours(lp, kp, vp), ours_check)
            if peers is not None:
                peers(kp, vp, bt)
            del kp, vp
            torch.cuda.empty_cache()

    def plain_read(self, base, k, v):
        """The plain read of the same K and V bytes (the physical limit)."""
        self.record({"impl": "plain_read", **base, "page_size": 0},
                    plain_read_call(self._plain, k, v, self._flag), None)

    def flashinfer(self, base, q, kp, vp, bt, launch, refs):
        """FlashInfer's kernels (``flashinfer_calls``) on the NHD pages kp, vp of block table
        bt, each planned, checked against the causal float64 reference, then timed; one that
        does not plan (a module not built, a shape it refuses) is recorded as skipped."""
        torch = self.torch
        if self._fi_workspace is None:
            self._fi_workspace = torch.empty(FI_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        pbase = {**base, "page_size": kp.shape[1], "layout": "token_major"}
        for impl, fields, plan, fn in flashinfer_calls(self.fi, torch, q, kp, vp, bt, base["kv_len"],
                                                       self._fi_workspace):
            try:
                plan()
            except Exception as exc:  # a module not built, a shape it refuses: recorded
                self.skip({"impl": impl, **pbase, **fields},
                          f"plan: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
                continue
            self.record({"impl": impl, **pbase, **fields}, fn, lambda o: decode.check_rows(
                launch, refs[True], o.float().cpu().numpy()))

    def sdpa(self, backend, q, k, v):
        """(fn, mask) for one SDPA backend, or (None, why) if it refuses. No mask, also at
        q_len > 1: SDPA's is_causal is top-left aligned, and causal_lower_right may dispatch
        to another backend than the one asked for; the unmasked reference checks it."""
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b = getattr(SDPBackend, backend)

        def fn():
            with sdpa_kernel(b):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            fn()
            self.torch.cuda.synchronize()
            return fn, "none"
        except Exception as exc:  # a backend that refuses the shape or GQA
            return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"

    def sdpa_calls(self, base, qt, kt, vt, launch, refs, backends=TORCH_BACKENDS) -> list[tuple]:
        """(impl, fields, fn, check) of each PyTorch SDPA backend of ``backends`` on its own
        (B, H, q_len, d) and (B, kv_heads, kv_len, d) tensors; one that refuses the shape, and
        the math backend past MATH_MAX_BYTES, recorded as skipped. The check takes the causal
        reference where the backend was masked or q_len is 1, else the unmasked one."""
        out = []
        for impl, backend in backends:
            what = {"impl": impl, **base, "page_size": 0, "layout": "head_major"}
            if impl == "torch_math" and base["kv_bytes"] * (H // base["kv_heads"]) > MATH_MAX_BYTES:
                self.skip(what, f"math backend run only up to {MATH_MAX_BYTES / 1e9:.0f} GB of K/V "
                                "repeated per query head (it materialises them)")
                continue
            fn, masked = self.sdpa(backend, qt, kt, vt)
            if fn is None:
                self.skip(what, masked)
                continue
            exact = masked != "none" or base["q_len"] == 1
            out.append((impl, {"page_size": 0, "layout": "head_major", "mask": masked}, fn,
                        lambda o, c=exact: decode.check_rows(launch, refs[c],
                                                             o.transpose(1, 2).float().cpu().numpy())))
        return out

    def flex_points(self):
        """flex_attention at FLEX_POINTS, after the table (its compile takes long): each
        started only while at most FLEX_GRACE_S past the deadline."""
        for B, kvh, n, ql in sorted(FLEX_POINTS):
            base = point_row(B, kvh, n, ql)
            if self.left() < -FLEX_GRACE_S:
                self.skip({"impl": "torch_flex", **base}, "deadline")
                continue
            try:
                q, k, v, launch, refs, _, _ = self.inputs(B, kvh, n, ql)
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                del q, k, v
                self.flex(base, qt, kt, vt, launch, refs)
                del qt, kt, vt
            except Exception as exc:  # a peer's trouble: recorded, the run goes on
                self.skip({"impl": "torch_flex", **base}, f"{type(exc).__name__}: {str(exc)[:300]}")
            self.torch.cuda.empty_cache()
            self.save()

    def flex(self, base, q, k, v, launch, refs):
        what = {"impl": "torch_flex", **base, "page_size": 0}
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            ql, n = base["q_len"], base["kv_len"]
            shift = n - ql

            def mask_mod(b, h, q_idx, kv_idx):
                return kv_idx <= q_idx + shift
            bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=ql, KV_LEN=n, device="cuda")
            compiled = self.torch.compile(flex_attention)

            def fn():
                return compiled(q, k, v, block_mask=bm, enable_gqa=True)
            fn()
        except Exception as exc:  # compile failures, shapes flex refuses
            self.skip(what, f"flex_attention failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            return
        what["mask"] = "causal (bottom-right)"
        self.record(what, fn, lambda o: decode.check_rows(launch, refs[True],
                                                          o.transpose(1, 2).float().cpu().numpy()))

    def sweep_point(self, B, kvh, n, ql, page_size: int = 0):
        """Ours at ``sweep_splits`` of this point, each checked, then timed; ``page_size``: on
        the same rows in pages of that many tokens ("NHD", random order, as the table's)."""
        base = point_row(B, kvh, n, ql, page_size=page_size)
        q, k, v, launch, refs, ours_check, run_ours = self.inputs(B, kvh, n, ql)
        tl = self.tiles(decode.default_wgmma(ql * H // kvh))     # the default kernels' tiles
        paged = {}
        if page_size:
            k, v, bt = paged_copy(self.torch, k, v, page_size, seed=page_size)
            paged = dict(page_size=page_size, block_table=bt, num_pages=k.shape[0])
        rules = {r: decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **tl, **paged,
                                     split_rule=r).splits for r in decode.SPLIT_RULES}
        for S in sweep_splits(rules, cdiv(n, launch.block_cols)):
            ls = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **tl, **paged, splits=S)
            self.record({"impl": "cupy_decode_paged" if page_size else "cupy_decode", **base,
                         "variant": decode.default_variant(ls.rows),
                         "splits": S, "rules": [r for r, x in rules.items() if x == S], "warps": ls.warps,
                         "block_cols": ls.block_cols, "stages": ls.stages},
                        run_ours(ls, k, v), ours_check)
        del q, k, v
        self.torch.cuda.empty_cache()
        self.save()

    def sweep_summary(self):
        """Per point: the fastest split count, and each rule's time over the fastest's."""
        rows = []
        for k, here in by_point(self.results["points"]).items():
            best = min(here, key=lambda p: p["time_s"])
            row = {"batch": k[0], "kv_heads": k[1], "kv_len": k[2], "q_len": k[3],
                   "best_splits": best["splits"], "best_time_s": best["time_s"]}
            for r in decode.SPLIT_RULES:
                mine = next((p for p in here if r in p["rules"]), None)
                row[f"{r}_splits"] = mine["splits"] if mine else None
                row[f"{r}_over_best"] = mine["time_s"] / best["time_s"] if mine else None
            rows.append(row)
        self.results["summary"] = rows
        f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        for r in rows:
            print(f"B={r['batch']:>2} kvh={r['kv_heads']:>2} n={r['kv_len']:>6} q={r['q_len']}: best "
                  f"S={r['best_splits']:>3}; " + ", ".join(
                      f"{k} S={r[f'{k}_splits']} x{f(r[f'{k}_over_best'])}" for k in decode.SPLIT_RULES),
                  flush=True)

    def summary(self, show: bool = True):
        rows = []
        for k, here in by_point(self.results["points"], checked=False).items():

            def best(pred):
                c = [p["tbps"] for p in here if pred(p) and p["check_ok"]]
                return max(c) if c else None
            ours = best(lambda p: p["impl"] == "cupy_decode")
            fastest = [p for p in here if p["impl"] == "cupy_decode" and p["check_ok"]
                       and p["tbps"] == ours]
            by_layout = {lay: best(lambda p, lay=lay: p["impl"] == "cupy_decode"
                                   and p.get("layout", "token_major") == lay)
                         for lay in LAYOUTS}
            dflt = best(lambda p: p.get("defaults") and p.get("layout") == "token_major")
            paged = best(lambda p: p["impl"] == "cupy_decode_paged")
            peer = best(lambda p: p["impl"].startswith("torch"))
            fi = best(lambda p: p["impl"].startswith("flashinfer"))
            read = best(lambda p: p["impl"] == "plain_read")
            rows.append({"batch": k[0], "kv_heads": k[1], "kv_len": k[2], "q_len": k[3],
                         "ours_tbps": ours,
                         "ours_variant": fastest[0].get("variant", "v1") if fastest else None,
                         "ours_layout": fastest[0].get("layout", "token_major") if fastest else None,
                         **{f"ours_{lay}_tbps": t for lay, t in by_layout.items()},
                         "ours_head_major_over_best_torch": (by_layout["head_major"] / peer
                                                             if by_layout["head_major"] and peer else None),
                         "ours_paged_best_tbps": paged, "best_torch_tbps": peer,
                         "plain_read_tbps": read,
                         "ours_over_best_torch": ours / peer if ours and peer else None,
                         "ours_over_plain_read": ours / read if ours and read else None,
                         "defaults_tbps": dflt,
                         "defaults_over_best_torch": dflt / peer if dflt and peer else None,
                         "defaults_over_plain_read": dflt / read if dflt and read else None,
                         # FlashInfer's fastest kernel and page size, where it ran
                         "flashinfer_tbps": fi,
                         "ours_over_flashinfer": ours / fi if ours and fi else None,
                         "ours_paged_over_flashinfer": paged / fi if paged and fi else None})
        for r in rows:
            q1 = next((x for x in rows if (x["batch"], x["kv_heads"], x["kv_len"], x["q_len"]) ==
                       (r["batch"], r["kv_heads"], r["kv_len"], 1)), None)
            for who in ("ours", "defaults"):
                r[f"{who}_over_q1"] = r[f"{who}_tbps"] / q1[f"{who}_tbps"] if r["q_len"] > 1 and q1 and \
                    q1[f"{who}_tbps"] and r[f"{who}_tbps"] else None
        self.results["summary"] = rows
        if not show:
            return
        f = lambda x: "   -" if x is None else f"{x:4.2f}"  # noqa: E731
        print(f"\n{'B':>3} {'kvh':>3} {'kv_len':>6} {'q':>2} | {'ours':>4} {'tokM':>4} {'hedM':>4} "
              f"{'paged':>5} {'torch':>5} {'read':>4} | ours/torch ours/read ours/q1 variant layout (TB/s)")
        for r in rows:
            print(f"{r['batch']:>3} {r['kv_heads']:>3} {r['kv_len']:>6} {r['q_len']:>2} | "
                  f"{f(r['ours_tbps'])} {f(r['ours_token_major_tbps'])} {f(r['ours_head_major_tbps'])} "
                  f"{f(r['ours_paged_best_tbps']):>5} {f(r['best_torch_tbps']):>5} "
                  f"{f(r['plain_read_tbps'])} | {f(r['ours_over_best_torch']):>10} "
                  f"{f(r['ours_over_plain_read']):>9} {f(r['ours_over_q1']):>7} {r['ours_variant']} "
                  f"{r['ours_layout']}")


# ---------------------------------------------------------------------- the splits sweep

def sweep_points() -> list[tuple]:
    """(B, kv_heads, kv_len, q_len) of the grid with B in {1, 8} whose blocks without splits
    (B kv_heads row chunks) fill less than half of one wave (132 SMs, one v4 block each at
    the tuned tiles or two at the default: the half of the smaller): where splits are chosen."""
    out = []
    for B, kvh, n, ql in grid_points(False):
        if B in (1, 8) and B * kvh < 66:
            out.append((B, kvh, n, ql))
    return out


def sweep_splits(rules: dict, n_tiles: int) -> list[int]:
    """Split counts timed at one point: each rule's choice (``rules``: name -> S), one either
    side of each, twice the wave rule's (a second wave), 1, and the powers of two up to
    MAX_SPLITS and the tiles."""
    top = min(decode.MAX_SPLITS, n_tiles)
    c = {1} | {2 ** i for i in range(1, 8) if 2 ** i <= top}
    for S in rules.values():
        c |= {S - 1, S, S + 1}
    c.add(2 * rules["wave"])
    return sorted(x for x in c if 1 <= x <= top)


# ---------------------------------------------------------------------- sanitizer and ncu modes

def tiny_cases():
    """(H, kv_heads, d, kv_lens, q_len, page, dtype, splits, configure keywords): every variant
    in a few small blocks: splits 1 and more, contiguous and pages of 1, 16, 64, q_len 1, 4,
    16, ragged, 1, 2, 4 and 8 row warps, 4 and 8 warps, the four combines, row chunks, bf16,
    d = 64, v5 (wgmma; the default from 32 rows: one warpgroup up to 64), v9 (TMA, the
    ping-pong; ragged last tiles, pages without TMA), v9_s3 and v11 (3 stages, the overlap), v13's
    L2 hints, v14, the TIMELINE probe (the keyword ``probe``, which goes to ``run_case``) and
    head-major caches (the keyword ``head_major``, which goes to ``random_case``: ``case_options``)."""
    cases = [(4, 2, 128, [37, 130], ql, P, "fp16", splits, {})
             for P in (0, 1, 16, 64) for ql, splits in ((1, 1), (4, 3))]
    tuned = [(4, 2, 128, [37, 300], 4, 0, "fp16", 2, dict(block_cols=Bc, stages=st))
             for Bc, st in decode.TUNING[1:]]                       # the tuning step's tiles
    v1, v2, w8, v3, v3w8, v5, v5w4, v9 = (decode.VARIANTS[v] for v in ("v1", "v2", "v2_w8", "v3", "v3_w8",
                                                                       "v5", "v5_w4", "v9"))
    tuned += [(32, 1, 128, [37, 300], 4, 0, "fp16", 2, dict(v5, block_cols=Bc, stages=st))
              for Bc, st in decode.TUNING_V5[1:]]                  # and v5's
    return cases + tuned + [(32, 1, 128, [70, 9], 1, 16, "fp16", 2, dict(wgmma=0)),  # 32 rows: 2 row warps
                            (32, 1, 128, [100], 4, 0, "fp16", 2, v1),      # 128 rows: 2 chunks
                            (4, 2, 128, [37, 300], 4, 16, "fp16", 3, v1),  # v1's paged loads
                            (32, 1, 128, [100], 4, 0, "fp16", 2, {}),      # 128 rows: 8 warps
                            (8, 2, 128, [65, 200], 16, 16, "bf16", None, {}),
                            (8, 8, 64, [1, 64, 129], 1, 1, "fp16", 2, {}),
                            # v1 and v2 combines over many splits, some empty
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 9, v1),
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 40, {}),
                            # 8 warps: 2 row x 4 key warps; pages; d = 64; 256 rows (chunks)
                            (32, 1, 128, [70, 300], 1, 0, "fp16", 3, w8),
                            (32, 1, 128, [70, 300], 4, 64, "fp16", 3, w8),
                            (32, 1, 128, [70, 300], 4, 1, "fp16", None, dict(stages=4, wgmma=0)),
                            (32, 4, 64, [65, 130], 4, 16, "bf16", 2, w8),
                            (16, 1, 128, [90, 20], 16, 0, "fp16", 2, {}),
                            # v3's combine: a row's splits over 4 warps, some empty; d = 64
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 40, v3),
                            (32, 1, 128, [70, 300], 1, 16, "fp16", 5, v3w8),
                            (8, 8, 64, [1, 64, 129], 1, 0, "bf16", 7, v3),
                            # v5 (wgmma): 128-row blocks with padding rows, pages, bf16, d = 64
                            (8, 1, 128, [37, 300], 1, 0, "fp16", 2, v5),
                            (32, 1, 64, [70, 300], 4, 16, "bf16", 3, v5),
                            (32, 1, 128, [5, 129], 4, 1, "fp16", 5, v5),
                            (64, 2, 128, [200], 4, 16, "bf16", 1, v5),
                            # v5_w4: one warpgroup, 64-row blocks (32 rows: half padding)
                            (32, 1, 128, [70, 300], 1, 16, "fp16", 3, v5w4),
                            (32, 1, 64, [5, 129], 2, 0, "bf16", 2, v5w4),
                            # the default at 32 rows (v5_w4) over pages of 1 and 64
                            (32, 1, 128, [70, 130], 1, 1, "fp16", 3, {}),
                            (32, 1, 128, [70, 130], 1, 64, "fp16", None, {}),
                            # a head-major cache (and "HND" pages) through transposed views
                            (8, 2, 128, [37, 300], 1, 0, "fp16", 3, dict(head_major=True)),
                            (8, 2, 128, [37, 300], 4, 16, "bf16", None, dict(head_major=True)),
                            (32, 2, 128, [70, 9], 1, 1, "fp16", 2, dict(head_major=True)),
                            (32, 4, 64, [65, 130], 4, 0, "fp16", 2, dict(v5, head_major=True)),
                            # v6 (the defaults) named: the combine by programmatic dependent launch
                            (32, 8, 128, [37, 3000], 1, 0, "fp16", None, decode.VARIANTS["v6"]),
                            (32, 1, 128, [37, 3000], 4, 16, "bf16", 40, decode.VARIANTS["v6"]),
                            # v7: the merge in decode_split (mma.sync and wgmma, empty splits, d = 64)
                            (32, 8, 128, [37, 3000], 1, 0, "fp16", None, decode.VARIANTS["v7"]),
                            (32, 1, 128, [37, 3000], 4, 16, "bf16", 40, decode.VARIANTS["v7"]),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, decode.VARIANTS["v7"]),
                            (8, 8, 64, [1, 64, 129], 1, 0, "bf16", 7, decode.VARIANTS["v7"]),
                            # v9: TMA (full tiles; the ragged last by cp.async), the ping-pong
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, v9),       # 128 rows, ragged
                            (32, 1, 64, [70, 300, 256], 4, 0, "bf16", 3, v9),   # d = 64, one full
                            (16, 1, 128, [90, 20], 16, 0, "fp16", 2, v9),       # 256 rows: chunks
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, v9),    # fused, many splits
                            (32, 1, 128, [70, 1300], 1, 0, "fp16", 3, v9),      # one warpgroup
                            (32, 2, 128, [1000, 129], 4, 0, "fp16", 2, dict(v9, head_major=True)),
                            (32, 1, 128, [70, 300], 4, 16, "bf16", 3, v9),      # pages: no TMA
                            # v9_w4: one warpgroup, 128 rows in two chunks (TMA, fused, pages)
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, decode.VARIANTS["v9_w4"]),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, decode.VARIANTS["v9_w4"]),
                            (32, 1, 64, [70, 300], 4, 16, "bf16", 3, decode.VARIANTS["v9_w4"]),
                            # v10: the one-round combine (some splits empty; over 64 splits two
                            # rounds; d = 64, bf16, pages)
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 40, dict(decode.VARIANTS["v10"], fused=0)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 100, dict(decode.VARIANTS["v10"], fused=0)),
                            (8, 8, 64, [1, 64, 129], 1, 0, "bf16", 7, decode.VARIANTS["v10"]),
                            (32, 1, 128, [70, 300], 4, 16, "bf16", 3, decode.VARIANTS["v10"]),
                            # v9_s3, v11 (3 stages; the overlap): 128 rows, ragged (TMA and
                            # cp.async), d = 64, one warpgroup, pages, row chunks, fused over
                            # empty splits
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, decode.VARIANTS["v9_s3"]),
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, decode.VARIANTS["v11"]),
                            (32, 1, 64, [70, 300, 256], 4, 0, "bf16", 3, decode.VARIANTS["v11"]),
                            (32, 1, 128, [70, 1300], 1, 0, "fp16", 3, decode.VARIANTS["v11"]),
                            (32, 1, 128, [70, 300], 4, 16, "bf16", 3, decode.VARIANTS["v11"]),
                            (16, 1, 128, [90, 20], 16, 0, "fp16", 2, decode.VARIANTS["v11"]),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, decode.VARIANTS["v11"]),
                            # v13's L2 hints: mma.sync (ragged, pages, d = 64), wgmma by TMA and
                            # by cp.async (pages), each hint
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 3, dict(l2_prefetch=256, evict_first=1)),
                            (8, 8, 64, [1, 64, 129], 1, 16, "bf16", 2, dict(l2_prefetch=128)),
                            (8, 2, 128, [37, 300], 4, 1, "fp16", None, dict(evict_first=1, head_major=True)),
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, dict(v9, evict_first=1, l2_prefetch=256)),
                            (32, 1, 128, [70, 1300], 1, 0, "fp16", 3, dict(evict_first=1)),
                            (32, 1, 128, [70, 300], 4, 16, "bf16", 3, dict(v9, l2_prefetch=64, evict_first=1)),
                            # v14 (K and V apart): ragged, q_len 4, many splits (some empty), MQA
                            # on mma.sync, d = 64, bf16, head-major, the hints beside it
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 3, dict(phased=1)),
                            (4, 2, 128, [37, 300], 4, 0, "fp16", 40, dict(phased=1)),
                            (32, 1, 128, [70, 1300], 1, 0, "fp16", None, dict(phased=1)),
                            (8, 8, 64, [1, 64, 129], 1, 0, "bf16", 2, dict(phased=1)),
                            (8, 2, 128, [37, 300], 4, 0, "bf16", None, dict(phased=1, head_major=True)),
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 2, dict(phased=1, l2_prefetch=128, evict_first=1)),
                            # the TIMELINE probe (--timeline): mma.sync with empty splits, wgmma
                            # by TMA (ragged), fused, v14's two waits a tile
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 40, dict(probe=True)),
                            (32, 1, 128, [70, 1300], 1, 0, "fp16", 3, dict(v9, probe=True)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(v9, probe=True)),
                            (4, 2, 128, [37, 300], 4, 0, "fp16", 3, dict(phased=1, probe=True)),
                            # v15 (the tensor maps prefetched): ragged, fused, probed
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, dict(v9, tmap_prefetch=1)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, dict(tmap_prefetch=1, probe=True)),
                            # v16 (32 rows in the warps' lower halves): MQA ragged (TMA and its
                            # cp.async last tile), causal groups of 16 at q_len 2, d = 64, bf16,
                            # pages (cp.async), head-major, fused over many splits, probed
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(half_rows=1)),
                            (32, 2, 128, [70, 1300], 2, 0, "fp16", 3, dict(half_rows=1)),
                            (32, 1, 64, [70, 300, 256], 1, 0, "bf16", 3, dict(half_rows=1)),
                            (32, 1, 128, [70, 300], 1, 16, "bf16", 3, dict(half_rows=1)),
                            (32, 4, 128, [129, 700], 4, 1, "fp16", None, dict(half_rows=1, head_major=True)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, dict(half_rows=1, probe=True)),
                            # v17 (a producer warp): MQA ragged (the producer's cp.async last
                            # tile) at q_len 1 and 4 (one and two warpgroups), 3 stages, empty
                            # splits, d = 64, bf16, head-major, probed
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(producer=1)),
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(producer=1)),
                            (32, 1, 128, [300, 1000], 4, 0, "fp16", 3, dict(producer=1, stages=3)),
                            (32, 1, 128, [129, 300], 1, 0, "fp16", 8, dict(producer=1, stages=3)),
                            (32, 2, 64, [70, 300, 256], 4, 0, "bf16", 3, dict(producer=1)),
                            (32, 1, 128, [129, 700], 4, 0, "fp16", None, dict(producer=1, head_major=True)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(producer=1, probe=True)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, dict(producer=1, probe=True)),
                            # v18 (the kv_lens by value): ragged on mma.sync, one and two
                            # warpgroups (the producer's cp.async last tile), fused, pages, d = 64,
                            # bf16, head-major, probed; v17 beside it (kv_lens from memory)
                            (4, 2, 128, [37, 300], 1, 0, "fp16", 3, dict(kv_lens_arg=1)),
                            (32, 1, 128, [70, 1300], 1, 0, "fp16", 3, dict(kv_lens_arg=1)),
                            (32, 1, 128, [70, 1300, 129], 4, 0, "fp16", 3, dict(kv_lens_arg=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(kv_lens_arg=1)),
                            (8, 8, 64, [1, 64, 129], 1, 16, "bf16", 2, dict(kv_lens_arg=1)),
                            (32, 2, 128, [129, 700], 2, 0, "fp16", None, dict(kv_lens_arg=1, head_major=True)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, dict(kv_lens_arg=1, probe=True)),
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(decode.VARIANTS["v17"])),
                            # v19 (the producer's first tiles one at a time): two warpgroups
                            # ragged, 3 stages with a one-tile split, one warpgroup, probed
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(producer=1, stagger=1)),
                            (32, 1, 128, [129, 1000], 4, 0, "fp16", 8, dict(producer=1, stagger=1, stages=3)),
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(producer=1, stagger=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(producer=1, stagger=1, probe=True)),
                            # v20 (the producer with the overlap, 3 stages): two warpgroups ragged,
                            # splits of a tile or none, one warpgroup (half rows; 64 rows, bf16,
                            # d = 64), head-major, staggered, probed
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(V20)),
                            (32, 1, 128, [129, 1000], 4, 0, "fp16", 8, dict(V20)),
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(V20)),
                            (32, 2, 64, [70, 300, 256], 4, 0, "bf16", 3, dict(V20)),
                            (32, 1, 128, [129, 700], 4, 0, "fp16", None, dict(V20, head_major=True)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V20, stagger=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V20, probe=True)),
                            # v21 (Q_i's loads first): one warpgroup (half rows; 64 rows, bf16,
                            # d = 64), two (with v17's producer; with v19's), cp.async on pages,
                            # fused, probed
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(q_first=1)),
                            (32, 2, 64, [70, 300, 256], 4, 0, "bf16", 3, dict(q_first=1)),
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(q_first=1)),
                            (32, 1, 128, [129, 1000], 4, 0, "fp16", 8, dict(q_first=1, stagger=1, producer=1)),
                            (32, 1, 128, [129, 700], 4, 16, "fp16", 3, dict(q_first=1)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, dict(q_first=1, fused=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(q_first=1, probe=True)),
                            # since v21 is the defaults, the cases above run it on wgmma where
                            # they do not say; v18's loop (q_first 0) at one and two warpgroups,
                            # and v21 on two warpgroups merging the splits (v7, the ping-pong)
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(q_first=0)),
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(q_first=0)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(fused=1)),
                            # v22 (strict ping-pong turns beside the producer): two warpgroups
                            # ragged (one-tile splits, empty ones), 3 stages, bf16 d = 64,
                            # head-major, staggered, probed
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(V22)),
                            (32, 1, 128, [129, 1000], 4, 0, "fp16", 8, dict(V22, stages=3)),
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 40, dict(V22)),
                            (32, 2, 64, [70, 300, 256], 8, 0, "bf16", 3, dict(V22)),
                            (32, 1, 128, [129, 700], 4, 0, "fp16", None, dict(V22, head_major=True)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V22, stagger=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V22, probe=True)),
                            # v23 (a turn: P V with the next S): two warpgroups ragged (one-tile
                            # splits, empty ones), 3 stages, bf16 d = 64, q_len 16 with a group of
                            # 8, head-major, staggered, probed
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(V23)),
                            (32, 1, 128, [129, 1000], 4, 0, "fp16", 8, dict(V23, stages=3)),
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 40, dict(V23)),
                            (32, 2, 64, [70, 300, 256], 8, 0, "bf16", 3, dict(V23, stages=3)),
                            (32, 4, 128, [300, 700], 16, 0, "fp16", 2, dict(V23)),
                            (32, 1, 128, [129, 700], 4, 0, "fp16", None, dict(V23, head_major=True)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V23, stagger=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V23, probe=True)),
                            # v24 (v23 with the overlap): two warpgroups ragged (one-tile splits,
                            # empty ones), bf16 d = 64, q_len 16, head-major, staggered, probed
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(V24)),
                            (32, 1, 128, [129, 1000], 4, 0, "fp16", 8, dict(V24)),
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 40, dict(V24)),
                            (32, 2, 64, [70, 300, 256], 8, 0, "bf16", 3, dict(V24)),
                            (32, 4, 128, [300, 700], 16, 0, "fp16", 2, dict(V24)),
                            (32, 1, 128, [129, 700], 4, 0, "fp16", None, dict(V24, head_major=True)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V24, stagger=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(V24, probe=True)),
                            # v25 (the softmax in 4 partial chains): one warpgroup (half rows) and
                            # two (v21's loop, v23's), ragged, causal q_len 4, bf16 d = 64, fused
                            (32, 1, 128, [37, 300], 1, 0, "fp16", 2, dict(tree_softmax=1)),
                            (32, 1, 128, [70, 1300], 4, 0, "fp16", 3, dict(tree_softmax=1)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 2, dict(V23, tree_softmax=1)),
                            (32, 2, 64, [70, 300, 256], 4, 0, "bf16", 3, dict(tree_softmax=1)),
                            (32, 1, 128, [300, 9000], 1, 0, "fp16", 60, dict(tree_softmax=1, fused=1)),
                            # one warpgroup a 64-row chunk with v21's loads (Q_i first, the kv_lens
                            # by value; --chunks-q4, --chunks-rule): 128 rows ragged (TMA and its
                            # cp.async last tile), one split, many (some empty; fused over one
                            # sequence, and as v26's rule runs it), 96 rows
                            # (the second chunk half padding) bf16 d = 64, 160 rows (3 chunks),
                            # 64-key tiles at 4 stages, a group of 16 at q_len 8 head-major
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 2, dict(CHUNKS)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 1, dict(CHUNKS)),
                            (32, 1, 128, [300, 9000], 4, 0, "fp16", 60, dict(CHUNKS)),
                            (32, 1, 128, [9000], 4, 0, "fp16", 60, dict(CHUNKS)),      # fused (v7)
                            (32, 1, 64, [9000], 4, 0, "bf16", None, {}),  # v26's rule: 1 tile a split
                            (32, 1, 64, [70, 300, 256], 3, 0, "bf16", 3, dict(CHUNKS)),
                            (32, 1, 128, [70, 1300], 5, 0, "fp16", None, dict(CHUNKS)),
                            (32, 1, 128, [37, 300], 4, 0, "fp16", 3, dict(CHUNKS, block_cols=64, stages=4)),
                            (32, 2, 128, [129, 700], 8, 0, "fp16", 2, dict(CHUNKS, head_major=True))]


def case_options(tiles: dict) -> tuple[dict, dict]:
    """A tiny case's keywords split into ``random_case``'s (head_major) and ``configure``'s."""
    tiles = dict(tiles)
    return {"head_major": tiles.pop("head_major", False)}, tiles


def sanitize() -> int:
    """Run every tiny case once (no timing, no PyTorch) and check it: for compute-sanitizer.
    CuPy's memory pool is off, so every array is its own allocation and memcheck sees an
    access past any of them."""
    import cupy

    cupy.cuda.set_allocator(None)
    bad = 0
    for i, (Hh, kvh, d, lens, ql, P, dtype, splits, tiles) in enumerate(tiny_cases()):
        label = (f"H={Hh} kv_heads={kvh} d={d} kv_lens={lens} q_len={ql} page={P} {dtype} "
                 f"splits={splits} {tiles or ''}")
        try:
            layout, tiles = case_options(tiles)
            case = decode.random_case(np.random.default_rng(i), len(lens), Hh, kvh, d, lens, ql, P, dtype,
                                      **layout)
            launch, verdict = decode.run_case(case, Hh, kvh, splits, **tiles)
            ok = verdict["ok"]
            label += f" -> {launch.splits} splits, error {verdict['max_abs_error']:.2e} <= {verdict['bound']:.2e}"
        except Exception:  # keep going: the sanitizer reports every case
            traceback.print_exc()
            ok = False
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label}", flush=True)
    print(f"{len(tiny_cases()) - bad} of {len(tiny_cases())} tiny launches match the reference")
    return 1 if bad else 0


def profile_points(specs: list, torch, out=None) -> int:
    """``profile_point`` of each spec in one process (one start-up for ncu); with ``out``,
    the predictions go to out/decode_ncu_h200.json (the ncu CSV of the same run beside)."""
    rows = [profile_point(spec, torch) for spec in specs]
    if out:
        import json
        import pathlib

        path = pathlib.Path(out) / "decode_ncu_h200.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"note": "flashsim's prediction (launch.plan().count()) of each "
                                            "profiled point, in order; each point launches twice "
                                            "(a warm-up, then the one in NVTX range 'decode'), and "
                                            "ncu's DRAM bytes of those launches are in the run's "
                                            "ncu CSV (decode_ncu_h200.csv; under ncu as this "
                                            "file's docstring says, the measured launches only)",
                                    "provenance": harness.provenance(),
                                    "points": rows}, indent=1))
        print(f"wrote {path}")
    return 0


def profile_point(spec: str, torch) -> dict:
    """One launch of our kernel inside the NVTX range "decode" (after one warm-up outside it);
    flashsim's plan of the same launch gives the predicted HBM bytes printed beside."""
    import cupy

    B, kvh, n, ql, P = (int(x) for x in spec.split(","))
    q = torch.randn((B, ql, H, D), device="cuda", dtype=torch.float16)
    k = torch.randn((B, n, kvh, D), device="cuda", dtype=torch.float16)
    v = torch.randn((B, n, kvh, D), device="cuda", dtype=torch.float16)
    kw = {}
    if P:
        k, v, bt = paged_copy(torch, k, v, P, seed=P)
        kw = dict(page_size=P, block_table=bt, num_pages=k.shape[0])
    launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **kw)
    launch.run(q, k, v)
    torch.cuda.synchronize()
    cupy.cuda.nvtx.RangePush("decode")
    launch.run(q, k, v)
    torch.cuda.synchronize()
    cupy.cuda.nvtx.RangePop()
    print(f"profiled {launch.kernel} B={B} kv_heads={kvh} kv_len={n} q_len={ql} page={P}: "
          f"splits={launch.splits}, K/V bytes {cache_bytes(B, kvh, n)}, launches "
          f"{[(x.kernel, x.grid) for x in launch.launches()]}")
    try:
        rep = launch.plan().count()
        pred = {"hbm_read_bytes": rep.hbm_read_bytes, "hbm_write_bytes": rep.hbm_write_bytes,
                "kv_bytes": rep.kv_bytes, "kernel_kv_bytes_read": launch.kv_bytes_read()}
    except Exception as exc:  # a launch flashsim cannot tile: said, the profile stands
        pred = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"flashsim predicts (launch.plan().count()): {pred}", flush=True)
    return {"point": dict(batch=B, kv_heads=kvh, kv_len=n, q_len=ql, page_size=P, heads=H,
                          head_dim=D),
            "launch": launch.plan_record(), "flashsim": pred,
            "launches": [[x.kernel, list(x.grid)] for x in launch.launches()]}


# The modes that write a file of their own beside the table: flag -> (file, what, run(bench, args))
# The interleaved-rounds modes (``rounds``), one place each: --MODE's file, what it times (its
# --help), its points, its candidates (label, configure keywords), the rows' label field and,
# where not ROUNDS, its rounds. A candidate that names an earlier version pins it
# (decode.VARIANTS), so that a run today times what the committed run timed, whatever the
# defaults have become since.
ROUND_SETS = {
    "l2-hints": ("decode_l2_hints_h200.json", "ours with v13's L2 hints on the K/V copies, PyTorch's "
                 "backends and the plain read in interleaved rounds, under both flushes",
                 L2_HINT_POINTS, L2_HINTS, "hint"),
    "phased-heldout": ("decode_phased_heldout_h200.json", "v14 against the defaults in interleaved "
                       "rounds at held-out points without splits",
                       PHASED_HELDOUT_POINTS, PHASED_HELDOUT, "config"),
    "phased": ("decode_phased_h200.json", "ours with v14's loads (K and V apart), PyTorch's backends "
               "and the plain read in interleaved rounds, under both flushes",
               L2_HINT_POINTS, PHASED, "config"),
    "half-rows": ("decode_half_rows_h200.json", "v16 (the rows of an MQA step spread over the 4 warps) "
                  "against v9 in interleaved rounds, at the table's MQA q_len-1 points and "
                  "held-out points",
                  HALF_ROWS_POINTS + HALF_ROWS_HELDOUT_POINTS, HALF_ROWS, "config"),
    "producer": ("decode_producer_h200.json", "v17 (a producer warp issues the tiles) against the "
                 "defaults in interleaved rounds, at the MQA points below 0.9 of the plain read and "
                 "held-out points",
                 PRODUCER_POINTS + PRODUCER_HELDOUT_POINTS, PRODUCER, "config"),
    "producer-heldout": ("decode_producer_heldout_h200.json", "v17 against v9 in interleaved rounds at "
                         "held-out points with long loops",
                         PRODUCER_LONG_HELDOUT_POINTS, PRODUCER_HELDOUT, "config"),
    "kv-lens": ("decode_kv_lens_h200.json", "v18 (the kv_lens by value) against v17 in interleaved "
                "rounds at short steps and held-out points",
                KV_LENS_POINTS + KV_LENS_HELDOUT_POINTS, KV_LENS_ARGS, "config"),
    "stagger": ("decode_stagger_h200.json", "v19 (the producer's first tiles one at a time) against "
                "v18 in interleaved rounds at MQA q_len-4 points and held-out points",
                STAGGER_POINTS + STAGGER_HELDOUT_POINTS, STAGGER, "config"),
    "overlap-producer": ("decode_overlap_producer_h200.json", "v20 (the producer with the overlap) "
                         "against v18, v17 at 3 stages and v19 in interleaved rounds at the "
                         "MQA q_len-4 points and held-out points",
                         OVERLAP_PRODUCER_POINTS + OVERLAP_PRODUCER_HELDOUT_POINTS, OVERLAP_PRODUCER, "config"),
    "stages": ("decode_stages_h200.json", "v21 at 3 stages against its 2, alone and with v19, in "
               "interleaved rounds at MQA points and held-out points",
               STAGES_POINTS + STAGES_HELDOUT_POINTS, STAGES_V21, "config"),
    "pingpong-producer": ("decode_pingpong_producer_h200.json", "v22 (strict ping-pong turns beside the "
                          "producer) against v21 in interleaved rounds at the MQA q_len-4 points and "
                          "held-out points",
                          PINGPONG_PRODUCER_POINTS + PINGPONG_PRODUCER_HELDOUT_POINTS, PINGPONG_PRODUCER, "config"),
    "q-first": ("decode_q_first_h200.json", "v21 (Q_i's loads before the K/V tiles) against v18 "
                "and v19 in interleaved rounds at short MQA steps and held-out points",
                Q_FIRST_POINTS + Q_FIRST_HELDOUT_POINTS, Q_FIRST, "config"),
    "turn-pv": ("decode_turn_pv_h200.json", "v23 (a turn issues P V and the next S together) at 2 and 3 "
                "stages against v21 and v22 in interleaved rounds at the MQA q_len-4 points and held-out "
                "points",
                PINGPONG_PRODUCER_POINTS + TURN_PV_HELDOUT_POINTS, TURN_PV, "config"),
    "turn-pv-heldout": ("decode_turn_pv_heldout_h200.json", "the defaults' rule for v23 (default_turn_pv) "
                        "against v21 and v23 at 3 stages in interleaved rounds at held-out points chosen "
                        "after --turn-pv",
                        TURN_PV_RULE_POINTS, TURN_PV_RULE, "config"),
    "turn-overlap": ("decode_turn_overlap_h200.json", "v24 (v23's turns with the softmax beside the previous "
                     "P V) against v23 and v21 in interleaved rounds at the MQA q_len-4 points and "
                     "held-out points",
                     PINGPONG_PRODUCER_POINTS + TURN_OVERLAP_HELDOUT_POINTS, TURN_OVERLAP, "config"),
    "tree-softmax": ("decode_tree_softmax_h200.json", "v25 (the softmax's row max and sum in 4 partial "
                     "chains) on the defaults against the defaults in interleaved rounds at the MQA points "
                     "and held-out points",
                     TREE_SOFTMAX_POINTS + TREE_SOFTMAX_HELDOUT_POINTS, TREE_SOFTMAX, "config"),
    "chunks-q4": ("decode_chunks_q4_h200.json", "at short MQA steps of q_len 4, the defaults against one "
                  "warpgroup on each 64-row chunk in interleaved rounds, the table's points and held-out "
                  "points",
                  CHUNKS_Q4_POINTS + CHUNKS_Q4_HELDOUT_POINTS, CHUNKS_Q4, "config"),
    "chunks-rule": ("decode_chunks_rule_h200.json", "the defaults against one warpgroup on each 64-row "
                    "chunk (128- and 64-key tiles) in interleaved rounds at the MQA q_len-4 points and "
                    "held-out points with more than 64 rows a KV head",
                    PINGPONG_PRODUCER_POINTS + CHUNKS_RULE_HELDOUT_POINTS, CHUNKS_RULE, "config",
                    CHUNKS_RULE_ROUNDS),
}


def _rounds(mode: str):
    """MODES' runner of an interleaved-rounds mode."""
    return lambda bench, args: rounds(bench, *ROUND_SETS[mode][2:])


MODES = {
    "splits-sweep": ("decode_splits_h200.json", "ours at split counts around both rules'",
                     lambda bench, args: sweep(bench, args)),
    "host-issue": ("decode_host_issue_h200.json", "the host's time to issue one call: ours on "
                   "PyTorch's tensors and on CuPy arrays, PyTorch's cuDNN and flash backends, the "
                   "plain read", lambda bench, args: host_issue(bench)),
    "overheads": ("decode_overheads_h200.json", "a step, its kernels alone, an empty launch, after "
                  "a dirty and a clean flush", lambda bench, args: overheads(bench)),
    "configs": ("decode_configs_h200.json", "ours at other tiles, splits and merges where it fell "
                "short of PyTorch's best, the peers timed before and after",
                lambda bench, args: configs(bench, CONFIG_POINTS)),
    "configs-q4": ("decode_configs_q4_h200.json", "--configs at the MQA points of q_len 4 below 0.9 "
                   "of the plain read", lambda bench, args: configs(bench, CONFIG_POINTS_Q4)),
    "configs-mqa": ("decode_configs_mqa_h200.json", "--configs at the MQA points of q_len 1 with B >= 8 "
                    "and kv_len >= 32k", lambda bench, args: configs(bench, CONFIG_POINTS_MQA)),
    "clock-ramp": ("decode_clock_ramp_h200.json", "the default step after host idle time, three "
                   "warm-ups, every repeat", lambda bench, args: clock_ramp(bench)),
    "ties": ("decode_ties_h200.json", "ours and PyTorch's backends in interleaved rounds where "
             "the table has them within 2 percent", lambda bench, args: ties(bench)),
    "timeline": ("decode_timeline_h200.json", "where a step's time goes, block by block: the "
                 "defaults' probe (TIMELINE) and the plain read's blocks, after the table's flush",
                 lambda bench, args: timeline(bench)),
    "flashinfer": ("decode_flashinfer_h200.json", "FlashInfer's decode and paged kernels beside ours, "
                   "PyTorch's and the plain read", lambda bench, args: flashinfer_table(bench, args)),
    **{mode: (name, what, _rounds(mode)) for mode, (name, what, *_) in ROUND_SETS.items()}}


def main(argv=None) -> int:
    ap = parser(__doc__, deadline_s=200.0)
    ap.add_argument("--quick", action="store_true", help="the reference points only")
    ap.add_argument("--lead-ms", type=float, default=LEAD_MS,
                    help="the GPU's spin before each timed call, while the host issues it (ms)")
    ap.add_argument("--sanitize", action="store_true", help="tiny launches of every variant, no timing")
    ap.add_argument("--profile-point", nargs="+",
                    help="B,kv_heads,kv_len,q_len,page (one or more): one NVTX-marked launch each")
    ap.add_argument("--no-flex", action="store_true", help="skip flex_attention (its compile time)")
    ap.add_argument("--no-tune", action="store_true", help="the default tiles, no tuning step")
    ap.add_argument("--sweep-page", type=int, default=0, metavar="P",
                    help="--splits-sweep on pages of P tokens (DIR/decode_splits_p<P>_h200.json)")
    for flag, (name, what, _) in MODES.items():
        ap.add_argument(f"--{flag}", action="store_true", help=f"{what} ({name})")
    ap.add_argument("--configs-profile", action="store_true",
                    help="PyTorch's cuDNN call and our step at the --configs points in NVTX ranges, for ncu")
    ap.add_argument("--overheads-profile", action="store_true",
                    help="the plain read and the step after each flush, in NVTX ranges, for ncu")
    ap.add_argument("--l2-hints-profile", action="store_true",
                    help="the plain read and the step with each L2 hint after each flush, in NVTX ranges, for ncu")
    args = ap.parse_args(argv)

    if args.sanitize:
        return sanitize()
    try:
        import torch
    except ImportError:
        print("decode_h200: the table and --profile-point need PyTorch (inputs and peers); "
              "--sanitize runs without it", file=sys.stderr)
        return 2

    if args.profile_point:
        return profile_points(args.profile_point, torch, args.out)
    if args.overheads_profile:
        return overheads_profile(args.out)
    if args.l2_hints_profile:
        return l2_hints_profile(args.out)
    if args.configs_profile:
        return configs_profile(args.out)
    flag = next((f for f in MODES if getattr(args, f.replace("-", "_"))), None)
    name, _, run = MODES[flag] if flag else ("decode_h200.json", None, None)
    if flag == "splits-sweep" and args.sweep_page:
        name = name.replace("_h200", f"_p{args.sweep_page}_h200")
    bench = Bench(args, name)
    bench.results["provenance"] = harness.provenance(
        extra={"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()})
    if bench.fi is not None:
        import os
        bench.results["provenance"]["packages"]["flashinfer-python"] = bench.fi.__version__
        bench.results["provenance"]["flashinfer_jit_disabled"] = bool(os.environ.get("FLASHINFER_DISABLE_JIT"))
    if run is not None:
        return run(bench, args)
    bench.results["configs"] = {"heads": H, "head_dim": D, "batches": list(BATCHES), "kv_lens": list(KV_LENS),
                                "kv_heads": list(KV_HEADS), "q_lens": list(Q_LENS), "pages": list(PAGES),
                                "max_cache_bytes": MAX_CACHE_BYTES}
    def table():
        if not args.no_tune:
            bench.tune()
        for B, kvh, n, ql in grid_points(args.quick):
            what = {"batch": B, "kv_heads": kvh, "kv_len": n, "q_len": ql}
            if not bench.due(what):
                continue
            try:
                bench.point(B, kvh, n, ql)
            except Exception as exc:  # one point's failure (OOM, ...) does not stop the rest
                traceback.print_exc()
                bench.skip(what, f"{type(exc).__name__}: {str(exc)[:300]}")
                bench.failures += 1
                torch.cuda.empty_cache()
        bench.summary(show=False)
        bench.save()
        if not args.no_flex:
            bench.flex_points()

    return bench.conclude(table, bench.summary)


def plain_read_call(kernel, k, v, flag, grid=(132 * 16, 256), extra=()):
    """A call of a plain-read ``kernel`` (PLAIN_READ's, or PLAIN_READ_CHUNKED's) over the
    bytes of the torch tensors k and v, on ``grid`` (blocks, threads); ``extra``: arguments
    after ``flag`` (PLAIN_READ_TIMELINE's stamps)."""
    import cupy
    import torch

    nvec = k.numel() * k.element_size() // 16
    kc, vc = (cupy.from_dlpack(x.view(torch.int16)) for x in (k, v))
    return lambda: kernel((grid[0],), (grid[1],), (kc, vc, cupy.uint64(nvec), flag, *extra))


def host_issue(bench) -> int:
    """--host-issue: at each of HOST_POINTS, the defaults on PyTorch's tensors (as the table
    calls them: "inputs" torch) and on CuPy arrays over the same memory ("inputs" cupy), then
    PyTorch's cuDNN and flash backends and the plain read; rows as the table's, whose
    ``launch_s`` is the host's time to issue a timed call (each after a synchronize), and
    whose "issue_loop" is ``issue_loop``'s: the same calls issued back to back."""
    cupy, torch = bench.cupy, bench.torch

    def record(what, fn, check):
        row = bench.record(what, fn, check)
        if row is not None:
            row["issue_loop"] = issue_loop(torch, fn)

    def run():
        for B, kvh, n, ql, base in bench.due_points(HOST_POINTS):
            q, k, v, _, refs, check, run_ours = bench.inputs(B, kvh, n, ql)
            launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)      # the defaults
            cfg = {"splits": launch.splits, "fused": launch.fused, "pdl": launch.pdl,
                   "wgmma": launch.wgmma, "kernels": [kl.kernel for kl in launch.launches()]}
            record({"impl": "cupy_decode", **base, **cfg, "inputs": "torch"}, run_ours(launch, k, v), check)
            views = [cupy.from_dlpack(x) for x in (q, k, v)]
            views += [cupy.empty_like(views[0]), cupy.empty((B, H, ql), cupy.float32)]
            record({"impl": "cupy_decode", **base, **cfg, "inputs": "cupy"},
                   lambda: launch.run(*views[:3], out=views[3], lse=views[4]),
                   lambda res: check(Result(torch.from_dlpack(res.O), torch.from_dlpack(res.L))))
            views.clear()
            qt, kt, vt, _, _ = bench.torch_layout(q, k, v)
            for impl, fields, fn, chk in bench.sdpa_calls(base, qt, kt, vt, launch, refs, FAST_BACKENDS):
                record({"impl": impl, **base, **fields}, fn, chk)
            record({"impl": "plain_read", **base, "page_size": 0},
                   plain_read_call(bench._plain, k, v, bench._flag), None)
            del q, k, v, qt, kt, vt
            torch.cuda.empty_cache()
            bench.save()

    return bench.conclude(run)


def issue_loop(torch, fn, calls: int = 200, every: int = 10) -> dict:
    """The host's seconds to issue each of ``calls`` calls of ``fn`` back to back, as a decode
    loop issues its layers (a synchronize after every ``every`` keeps the launch queue short;
    it is not timed): the 10th, 50th and 90th percentiles."""
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if i % every == every - 1:
            torch.cuda.synchronize()
    p10, p50, p90 = np.percentile(times, [10, 50, 90])
    return {"calls": calls, "every": every, "p10_s": float(p10), "median_s": float(p50), "p90_s": float(p90)}


def overheads(bench) -> int:
    """--overheads: at each of OVERHEAD_POINTS, under each flush ("dirty": the table's, "clean":
    a read of other bytes after it), the step (the default launch, checked), the plain read and
    an empty kernel on the split kernel's grid; under the dirty flush also each of the step's
    kernels alone ("part": its name). Rows as the table's, with "flush" and "part"."""
    cupy, torch = bench.cupy, bench.torch
    empty = cupy.RawKernel(EMPTY, "empty_launch")
    flag = cupy.zeros(2, cupy.int32)
    hs = {"dirty": bench.harness, "clean": bench.clean_harness()}
    bench.results["timing_clean"] = hs["clean"].method()

    def run():
        for B, kvh, n, ql, base in bench.due_points(OVERHEAD_POINTS):
            q, k, v, _, refs, check, run_ours = bench.inputs(B, kvh, n, ql)
            # the defaults (inputs' launch has the mma.sync tiles, also where the defaults run wgmma)
            launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)
            O, L = torch.empty_like(q), torch.empty((B, H, ql), device="cuda", dtype=torch.float32)
            split = launch.launches()[0]
            cfg = {"splits": launch.splits, "fused": launch.fused, "pdl": launch.pdl,
                   "warps": launch.warps, "wgmma": launch.wgmma, "tma": launch.tma,
                   "block_cols": launch.block_cols, "stages": launch.stages,
                   "kernels": [kl.kernel for kl in launch.launches()]}
            for flush, h in hs.items():
                bench.harness = h
                bench.record({"impl": "cupy_decode", **base, **cfg, "flush": flush, "part": "step"},
                             run_ours(launch, k, v), check)
                bench.plain_read({**base, "flush": flush}, k, v)
                bench.record({"impl": "empty_launch", **base, "flush": flush, "grid": list(split.grid),
                              "threads": split.threads},
                             lambda g=split.grid, t=split.threads: empty(g, (t,), (flag,)), None)
            bench.harness = hs["dirty"]
            if len(cfg["kernels"]) > 1:
                for name in cfg["kernels"]:
                    bench.record({"impl": "cupy_decode", **base, **cfg, "flush": "dirty", "part": name},
                                 lambda name=name: launch.run(q, k, v, out=O, lse=L, only=name), None)
            del q, k, v, O, L
            torch.cuda.empty_cache()
            bench.save()

    return bench.conclude(run)


def timeline_summary(st: dict, event_s: float) -> dict:
    """What one run's stamps say (ns from the first block's entry): ``st`` is
    ``DecodeLaunch.stamps()`` or the plain read's (sm, entry_ns, exit_ns). The event time
    beside the blocks' span (the rest: the launch before the first block and the events); when
    the last block starts; the median exit and how far the last is behind it; and for decode_split
    blocks (those with tiles) the median time to their first tile, in their loop and after it,
    the share of their cycles spent waiting for tiles and the SM clock."""
    entry, exit_ = st["entry_ns"], st["exit_ns"]
    t0, med_exit = int(entry.min()), float(np.median(exit_))
    per_sm = np.bincount(st["sm"])
    out = {"event_ns": event_s * 1e9, "span_ns": int(exit_.max()) - t0,
           "last_entry_ns": int(entry.max()) - t0, "median_exit_ns": med_exit - t0,
           "tail_ns": int(exit_.max()) - med_exit, "blocks": len(entry),
           "sms": int((per_sm > 0).sum()), "most_blocks_on_an_sm": int(per_sm.max())}
    if "first_load_ns" in st and (st["first_load_ns"] > 0).any():   # the plain read's thread 0
        ran = st["first_load_ns"] > 0                        # (in the loop of 4 loads at a time)
        out["first_load_ns"] = float(np.median(st["first_load_ns"][ran] - entry[ran]))
    if "first_tile_ns" in st:
        has = st["first_tile_ns"] > 0                        # blocks with at least one tile
        first, loop_end = st["first_tile_ns"][has], st["loop_end_ns"][has]
        cycles = st["exit_clk"] - st["entry_clk"]
        out |= {"issued_ns": float(np.median(st["issued_ns"][has] - entry[has])),
                "first_tile_ns": float(np.median(first - entry[has])),
                "first_tile_max_ns": int((first - entry[has]).max()),
                "loop_ns": float(np.median(loop_end - first)),
                "after_loop_ns": float(np.median(exit_[has] - loop_end)),
                "wait_share": float(st["wait_clk"][has].sum() / cycles[has].sum()),
                "sm_clock_mhz": float(np.median(cycles / np.maximum(exit_ - entry, 1)) * 1e3)}
    return out


def timeline(bench) -> int:
    """--timeline: at each of TIMELINE_POINTS, the defaults built as a probe, checked and timed
    as in the table beside the same launch without the stamps, then TIMELINE_RUNS runs after the
    table's flush; where the defaults run wgmma tiles by TMA also with 3 stages and with the
    tensor maps prefetched (v15), and at 32 rows the other row placement (v9's where the
    defaults run v16's); where there are splits, the other merge (v7's in decode_split
    where the defaults launch v6's combine, and the reverse; where v7's grid fits a wave); and
    "code warm": after the flush a launch of the same kernel on a one-tile-a-split sequence,
    then the step (the stamps are the step's; the event time is both). The plain read's blocks
    likewise. The defaults and the plain read also after a clean flush (``Harness(clean=True)``). Rows of results["timeline"]: the point, "impl",
    "config", each run's ``timeline_summary`` and the raw stamps of the run of median event time."""
    cupy = bench.cupy
    plain = cupy.RawKernel(PLAIN_READ_TIMELINE, "plain_read_timeline")
    chunked = cupy.RawKernel(PLAIN_READ_CHUNKED_TIMELINE, "plain_read_chunked_timeline")
    flag = cupy.zeros(1, cupy.uint32)
    grid = (132 * 16, 256)                                   # plain_read_call's default
    plain_tl = cupy.zeros((grid[0], 4), cupy.uint64)         # the largest grid's stamps
    bench.results["timeline"] = []

    clean = bench.clean_harness()
    bench.results["timing_clean"] = clean.method()
    flushes = {"dirty": bench.harness, "clean": clean}

    def runs(fn, stamps, h) -> tuple[list, dict]:
        out = []
        for _ in range(TIMELINE_RUNS):
            t = h.time(fn, repeats=1).times_s[0]           # after the warm-ups: one flushed run
            out.append((t, stamps()))
        out.sort(key=lambda r: r[0])
        t_med, st = out[len(out) // 2]
        t0 = int(st["entry_ns"].min())
        raw = {k: [x - t0 if x > 0 else None for x in v.tolist()]     # None: not stamped
               for k, v in st.items() if k.endswith("_ns")}
        raw["sm"] = st["sm"].tolist()
        if "exit_clk" in st:                            # SM clocks are not one clock: durations
            raw["cycles"] = (st["exit_clk"] - st["entry_clk"]).tolist()
            raw["wait_cycles"] = st["wait_clk"].tolist()
        return [timeline_summary(s, t) for t, s in out], raw

    def warmed(lch, step):
        """The step after a launch of the same kernel (a probe too) on one tile a split."""
        warm = decode.configure(1, H, lch.kv_heads, D, kv_lens=[lch.block_cols * lch.splits],
                                q_len=lch.q_len, **lch.options()).probe()
        wq = cupy.zeros((1, lch.q_len, H, D), cupy.float16)
        wk = cupy.zeros((1, lch.block_cols * lch.splits, lch.kv_heads, D), cupy.float16)

        def fn():
            warm.run(wq, wk, wk)
            return step()
        return fn

    def run():
        for B, kvh, n, ql, base in bench.due_points(TIMELINE_POINTS):
            q, k, v, _, refs, check, run_ours = bench.inputs(B, kvh, n, ql)
            launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)
            configs = [("defaults", launch)]
            if launch.tma:
                configs += [(name, decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **kw))
                            for name, kw in (("stages 3", dict(stages=3)),
                                             ("tensor maps prefetched", dict(tmap_prefetch=1)),
                                             *((("v9's rows" if launch.half_rows else "v16",
                                                 dict(half_rows=1 - launch.half_rows)),)
                                               if launch.rows <= 32 else ()))]
            if launch.splits > 1:                      # the other merge: v7 in decode_split, or v6's launch
                try:
                    configs.append(("combine launch (v6)" if launch.fused else "merged in decode_split (v7)",
                                    decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql,
                                                     fused=1 - launch.fused)))
                except KernelInputError:               # v7's grid larger than one wave
                    pass
            configs.append(("code warm", launch))
            for name, lch in configs:
                probe = lch.probe()
                fields = {**base, "config": name, "splits": lch.splits, "warps": lch.warps,
                          "wgmma": lch.wgmma, "tma": lch.tma, "block_cols": lch.block_cols,
                          "stages": lch.stages, "fused": lch.fused, "tmap_prefetch": lch.tmap_prefetch,
                          "half_rows": lch.half_rows}
                step = run_ours(probe, k, v)
                if name == "code warm":
                    step = warmed(lch, step)
                else:
                    for is_probe, x in ((0, lch), (1, probe)):
                        bench.record({"impl": "cupy_decode", **fields, "probe": is_probe},
                                     run_ours(x, k, v), check)
                for flush in ("dirty", "clean") if name == "defaults" else ("dirty",):
                    summaries, raw = runs(step, probe.stamps, flushes[flush])
                    bench.results["timeline"].append({"impl": "cupy_decode", **fields, "flush": flush,
                                                      "runs": summaries, "stamps": raw})

            def read_stamps(blocks):
                rec = plain_tl.get()[:blocks].astype(np.int64)
                return {"sm": rec[:, 0], "entry_ns": rec[:, 1], "first_load_ns": rec[:, 2],
                        "exit_ns": rec[:, 3]}
            bench.plain_read(base, k, v)
            for impl, kern, g in (("plain_read", plain, grid),
                                  *(("plain_read_chunked", chunked, g) for g in TIMELINE_CHUNKED_GRIDS)):
                for flush, h in flushes.items():
                    summaries, raw = runs(plain_read_call(kern, k, v, flag, g, (plain_tl,)),
                                          lambda b=g[0]: read_stamps(b), h)
                    bench.results["timeline"].append({"impl": impl, **base, "grid": list(g), "flush": flush,
                                                      "runs": summaries, "stamps": raw})
            del q, k, v
            bench.torch.cuda.empty_cache()
            bench.save()

    return bench.conclude(run)


def flush_profile(out, points, calls, name: str) -> int:
    """For Nsight Compute without its own cache control: at each of ``points``, the plain read,
    then each call of ``calls(B, kvh, n, ql, q, k, v)`` -> [(what, fields, fn, kernels)], each
    once after the table's flush inside NVTX range "dirty" and once after a clean flush inside
    "clean" (the flushes and a warm-up outside the ranges); the order of the ranges' launches
    goes to out/``name`` beside ncu's CSV."""
    import cupy
    import torch

    plain = cupy.RawKernel(PLAIN_READ, "plain_read")
    flag = cupy.zeros(1, cupy.uint32)

    hs = {"dirty": harness.Harness("cupy"), "clean": harness.Harness("cupy", clean=True)}
    order = []
    for B, kvh, n, ql in points:
        q = torch.randn((B, ql, H, D), device="cuda", dtype=torch.float16)
        k = torch.randn((B, n, kvh, D), device="cuda", dtype=torch.float16)
        v = torch.randn((B, n, kvh, D), device="cuda", dtype=torch.float16)
        for what, fields, fn, kernels in [("plain_read", {}, plain_read_call(plain, k, v, flag), ["plain_read"]),
                                          *calls(B, kvh, n, ql, q, k, v)]:
            fn()                                      # compiles, warms the launch path
            for flush, h in hs.items():
                cupy.cuda.runtime.deviceSynchronize()
                h.flush()
                cupy.cuda.runtime.deviceSynchronize()
                cupy.cuda.nvtx.RangePush(flush)
                fn()
                cupy.cuda.runtime.deviceSynchronize()
                cupy.cuda.nvtx.RangePop()
                order += [{"batch": B, "kv_heads": kvh, "kv_len": n, "q_len": ql, "flush": flush,
                           "what": what, **fields, "kernel": kname, "kv_bytes": cache_bytes(B, kvh, n),
                           "l2_flush_bytes": h.flush_bytes} for kname in kernels]
        del q, k, v
        torch.cuda.empty_cache()
    print("wrote " + write_json(out, name, {
        "note": "the launches inside NVTX ranges 'dirty' and 'clean', in order: the rows of the "
                f"run's ncu CSV ({name.replace('.json', '.csv')})",
        "provenance": harness.provenance(), "launches": order}))
    return 0


def overheads_profile(out) -> int:
    """--overheads-profile: at OVERHEAD_PROFILE_POINTS the plain read, then the step (the
    default launch), each after either flush (``flush_profile``)."""
    def calls(B, kvh, n, ql, q, k, v):
        launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)
        return [("step", {}, lambda: launch.run(q, k, v), [kl.kernel for kl in launch.launches()])]
    return flush_profile(out, OVERHEAD_PROFILE_POINTS, calls, "decode_overheads_ncu_h200.json")


def l2_hints_profile(out) -> int:
    """--l2-hints-profile: at L2_HINT_PROFILE_POINTS the plain read, then the step (the
    defaults) with each of L2_HINTS, each after either flush (``flush_profile``): what reaches
    DRAM, read and written, under each hint."""
    def calls(B, kvh, n, ql, q, k, v):
        out = []
        for hint, kw in L2_HINTS:
            launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **kw)
            out.append(("step", {"hint": hint}, lambda lc=launch: lc.run(q, k, v),
                        [kl.kernel for kl in launch.launches()]))
        return out
    return flush_profile(out, L2_HINT_PROFILE_POINTS, calls, "decode_l2_hints_ncu_h200.json")


# ---------------------------------------------------------------------- timings after host idle time

def clock_ramp(bench) -> int:
    """--clock-ramp (the module's docstring): the default step after host idle time, with
    three warm-ups, every repeat recorded."""
    cupy = bench.cupy
    h = bench.harness

    def clocks():                 # (SM MHz, memory MHz), or None without NVML
        x = bench.clocks.sample()
        return x and x[1:3]
    bench.results["config"] = {"points": [list(p) for p in CLOCK_POINTS], "idle_s": list(CLOCK_IDLE_S),
                               "warmups": list(CLOCK_WARMUPS), "warm_s": CLOCK_WARM_S,
                               "repeats": CLOCK_REPEATS, "cycles": CLOCK_CYCLES}
    rows = bench.results.setdefault("rows", [])

    def run():
        for B, kvh, n, ql in CLOCK_POINTS:
            rng = cupy.random.default_rng(0)
            q = rng.standard_normal((B, ql, H, D), dtype=cupy.float32).astype(cupy.float16)
            k = rng.standard_normal((B, n, kvh, D), dtype=cupy.float32).astype(cupy.float16)
            v = rng.standard_normal((B, n, kvh, D), dtype=cupy.float32).astype(cupy.float16)
            launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)

            def fn(launch=launch, q=q, k=k, v=v):
                return launch.run(q, k, v)
            fn()
            h.dev.synchronize()
            for cycle in range(CLOCK_CYCLES):
                for idle in CLOCK_IDLE_S:
                    for warm in CLOCK_WARMUPS:
                        time.sleep(idle)
                        before = clocks()
                        if warm == "spin":
                            h.dev.spin(CLOCK_WARM_S)
                        elif warm == "calls_for":
                            t0 = time.perf_counter()
                            while time.perf_counter() - t0 < CLOCK_WARM_S:
                                fn()
                                h.dev.synchronize()
                        t = h.time(fn, repeats=CLOCK_REPEATS)
                        rows.append({**point_row(B, kvh, n, ql), "splits": launch.splits,
                                     "cycle": cycle, "idle_s": idle, "warmup": warm,
                                     "times_s": t.times_s, "time_s": t.median_s, "min_s": min(t.times_s),
                                     "clocks_before": before, "clocks_after": clocks()})
                        print(f"B={B} kvh={kvh} n={n} q={ql} idle {idle} s {warm:>9}: median "
                              f"{t.median_s * 1e6:8.1f} us, min {min(t.times_s) * 1e6:8.1f} us, "
                              f"clocks {before} -> {rows[-1]['clocks_after']}", flush=True)
            bench.save()

    ok = bench.guarded(run)
    bench.finish("")
    return 0 if ok else 1


# ---------------------------------------------------------------------- configurations at the misses

def config_candidates(B, kvh, n, ql) -> list[tuple[str, dict]]:
    """(label, configure keywords) timed at one point by --configs: the defaults, then, where a
    KV head's rows take wgmma (MQA), the splits around the default's, each with and without the
    merge in decode_split, and the other wgmma tiles; elsewhere (no splits: one stream of K/V a
    block) every CONFIG_TILES tile with 4 and 8 warps."""
    rows = ql * H // kvh
    out = [("defaults", {})]
    if decode.default_wgmma(rows):
        S = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql).splits
        for s in sorted({max(1, S // 4), max(1, S // 2), S, min(decode.MAX_SPLITS, 2 * S)}):
            out += [(f"splits {s}, fused {f}", dict(splits=s, fused=f)) for f in (0, 1)]
        out += [(f"B_c {bc}, stages {st}", dict(block_cols=bc, stages=st))
                for bc, st in CONFIG_TILES_WGMMA[1:]]
        # 64-key tiles at 2 stages fit two blocks an SM: the wave rule's splits fill both slots,
        # so one block's prologue and partial write overlap the other's stream
        out += [(f"B_c 64, stages 2, wave rule, fused {f}",
                 dict(block_cols=64, stages=2, split_rule="wave", fused=f)) for f in (0, 1)]
        out.append(("v9_w4", decode.VARIANTS["v9_w4"]))
        v11 = decode.VARIANTS["v11"]            # the overlap, at its tiles and at 64-key tiles
        out += [("v11", v11), ("v11, B_c 64, stages 4", dict(v11, block_cols=64, stages=4))]
    else:
        out += [(f"B_c {bc}, stages {st}, warps {w}", dict(block_cols=bc, stages=st, warps=w))
                for bc, st in CONFIG_TILES for w in (4, 8)]
        out.append(("splits 2", dict(splits=2)))       # half the stream a block: a shorter tail
    return out


def configs(bench, points=CONFIG_POINTS) -> int:
    """--configs: at each of ``points`` (CONFIG_POINTS; --configs-q4: CONFIG_POINTS_Q4), on PyTorch's own K and V tensors (head-major, ours
    through transposed views), PyTorch's cuDNN and flash backends, the plain read and the
    chunked plain read (each of PLAIN_READ_CHUNKED_GRIDS), then ours at config_candidates, each
    checked, then timed; then the peers and the plain reads again ("pass" 1), so that the
    configurations lie between two timings of each peer."""
    cupy, torch = bench.cupy, bench.torch
    chunked = cupy.RawKernel(PLAIN_READ_CHUNKED, "plain_read_chunked")
    bench.results["plain_read_chunked_source"] = PLAIN_READ_CHUNKED.strip()
    bench.results["configs"] = {"points": [list(p) for p in points],
                                "tiles": [list(t) for t in CONFIG_TILES],
                                "tiles_wgmma": [list(t) for t in CONFIG_TILES_WGMMA],
                                "plain_read_chunked_grids": [list(g) for g in PLAIN_READ_CHUNKED_GRIDS]}

    def peers(base, launch, refs, qt, kt, vt, kh, vh, npass):
        for impl, fields, fn, check in bench.sdpa_calls(base, qt, kt, vt, launch, refs, FAST_BACKENDS):
            bench.record({"impl": impl, **base, **fields, "pass": npass}, fn, check)
        bench.record({"impl": "plain_read", **base, "pass": npass, "grid": [132 * 16, 256]},
                     plain_read_call(bench._plain, kh, vh, bench._flag), None)
        for g in PLAIN_READ_CHUNKED_GRIDS:
            bench.record({"impl": "plain_read_chunked", **base, "pass": npass, "grid": list(g)},
                         plain_read_call(chunked, kh, vh, bench._flag, g), None)

    def run():
        for B, kvh, n, ql, base in bench.due_points(points):
            q, k, v, launch, refs, check, run_ours = bench.inputs(B, kvh, n, ql)
            qt, kt, vt, kh, vh = bench.torch_layout(q, k, v)
            del k, v
            torch.cuda.empty_cache()
            peers(base, launch, refs, qt, kt, vt, kh, vh, 0)
            seen = set()
            for label, kw in config_candidates(B, kvh, n, ql):
                what = {"impl": "cupy_decode", **base, "layout": "head_major", "config": label}
                try:
                    lc = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **kw)
                except KernelInputError as exc:    # e.g. the merge in decode_split past one wave
                    bench.skip(what, str(exc))
                    continue
                same = (tuple(sorted(lc.defines().items())), lc.splits)
                if same in seen:                   # the kernels and grid of one timed above
                    continue
                seen.add(same)
                bench.record({**what, "splits": lc.splits, "warps": lc.warps, "wgmma": lc.wgmma,
                              "block_cols": lc.block_cols, "stages": lc.stages, "fused": lc.fused,
                              "pdl": lc.pdl, "tma": lc.tma, "chunks": lc.chunks},
                             run_ours(lc, kh, vh), check)
            peers(base, launch, refs, qt, kt, vt, kh, vh, 1)
            del q, qt, kt, vt, kh, vh
            torch.cuda.empty_cache()
            bench.save()

    return bench.conclude(run, lambda: configs_summary(bench))


def configs_profile(out) -> int:
    """--configs-profile: at CONFIG_POINTS up to 4 GB of K/V, PyTorch's cuDNN backend and our
    step (the defaults), each once (after a warm-up) inside NVTX range "peer" or "ours", for
    Nsight Compute: which kernels each runs, on what grid, for how long. The order of the
    ranges' calls goes to out/decode_configs_ncu_h200.json beside ncu's CSV."""
    import torch

    order = []
    for B, kvh, n, ql in CONFIG_POINTS:
        if cache_bytes(B, kvh, n) > 4e9:
            continue
        q = torch.randn((B, H, ql, D), device="cuda", dtype=torch.float16)
        kt = torch.randn((B, kvh, n, D), device="cuda", dtype=torch.float16)
        vt = torch.randn((B, kvh, n, D), device="cuda", dtype=torch.float16)
        launch = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)
        qs = q.transpose(1, 2)
        calls = {"peer": lambda: torch.nn.functional.scaled_dot_product_attention(
                     q, kt, vt, enable_gqa=True),
                 "ours": lambda: launch.run(qs, kt.transpose(1, 2), vt.transpose(1, 2))}
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for what, fn in calls.items():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fn()                                  # compiles, warms the launch path
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(what)
                fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
            order.append({"batch": B, "kv_heads": kvh, "kv_len": n, "q_len": ql, "what": what,
                          "impl": "torch_cudnn" if what == "peer" else "cupy_decode",
                          "kernels": None if what == "peer" else [kl.kernel for kl in launch.launches()],
                          "kv_bytes": cache_bytes(B, kvh, n)})
        del q, kt, vt, calls
        torch.cuda.empty_cache()
    print("wrote " + write_json(out, "decode_configs_ncu_h200.json", {
        "note": "the calls inside NVTX ranges 'peer' (PyTorch SDPA, cuDNN backend) and 'ours' (the "
                "default step), in order; their kernels are the rows of the run's ncu CSV "
                "(decode_configs_ncu_h200.csv)",
        "provenance": harness.provenance(), "calls": order}))
    return 0


def configs_summary(bench):
    """Per point: the fastest configuration of ours, the defaults, the best peer (the faster
    pass of each) and the fastest plain read, with ours over each."""
    rows = []
    for k, here in by_point(bench.results["points"]).items():
        ours = [p for p in here if p["impl"] == "cupy_decode"]
        peer = [p for p in here if p["impl"].startswith("torch")]
        plain = [p for p in here if p["impl"].startswith("plain_read")]
        if not ours:
            continue
        best = min(ours, key=lambda p: p["time_s"])
        dflt = next((p for p in ours if p["config"] == "defaults"), None)
        row = {"batch": k[0], "kv_heads": k[1], "kv_len": k[2], "q_len": k[3],
               "best_config": best["config"], "best_time_s": best["time_s"],
               "defaults_time_s": dflt and dflt["time_s"]}
        if peer:
            bp = min(peer, key=lambda p: p["time_s"])
            row |= {"best_peer": bp["impl"], "best_peer_time_s": bp["time_s"],
                    "best_over_peer": bp["time_s"] / best["time_s"]}
        if plain:
            pr = min(plain, key=lambda p: p["time_s"])
            row |= {"best_plain_read": pr["impl"], "best_plain_read_grid": pr.get("grid"),
                    "plain_read_time_s": pr["time_s"], "best_over_plain_read": pr["time_s"] / best["time_s"]}
        rows.append(row)
        print(f"B={k[0]:>2} kvh={k[1]:>2} n={k[2]:>6} q={k[3]}: best {best['config']!r} "
              f"{best['time_s'] * 1e6:.1f} us; defaults {dflt['time_s'] * 1e6 if dflt else float('nan'):.1f}; "
              f"peer {row.get('best_peer')} x{row.get('best_over_peer', float('nan')):.3f}; "
              f"plain {row.get('best_plain_read')} x{row.get('best_over_plain_read', float('nan')):.3f}",
              flush=True)
    bench.results["summary"] = rows


def ties(bench) -> int:
    """--ties: the module docstring's. Rows as the table's with "round"; "summary" per point:
    each implementation's median over the rounds, and per round PyTorch's best over ours (the
    defaults, the faster of the two layouts) with the rounds where ours was the faster."""
    torch = bench.torch

    def run():
        for B, kvh, n, ql, base in bench.due_points(TIE_POINTS):
            q, k, v, launch, refs, ours_check, run_ours = bench.inputs(B, kvh, n, ql)
            qt, kt, vt, kh, vh = bench.torch_layout(q, k, v)
            dflt = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)      # the defaults
            calls = [("cupy_decode", {"page_size": 0, "layout": "head_major"},
                      run_ours(dflt, kh, vh), ours_check),
                     ("cupy_decode", {"page_size": 0, "layout": "token_major"}, run_ours(dflt, k, v),
                      ours_check)]
            calls += bench.sdpa_calls(base, qt, kt, vt, launch, refs, FAST_BACKENDS)
            for rnd in range(TIE_ROUNDS):
                for impl, fields, fn, check in calls:
                    bench.record({"impl": impl, **base, **fields, "round": rnd,
                                  "splits": dflt.splits if impl == "cupy_decode" else None},
                                 fn, check if rnd == 0 else None)
            del q, k, v, qt, kt, vt, kh, vh, calls
            torch.cuda.empty_cache()
            bench.save()

    return bench.conclude(run, lambda: ties_summary(bench))


def ties_summary(bench):
    rows = []
    for k, here in by_point(bench.results["points"]).items():
        rounds = sorted({p["round"] for p in here})
        per = []                        # per round: PyTorch's best time over ours' best
        for r in rounds:
            ours = [p["time_s"] for p in here if p["round"] == r and p["impl"] == "cupy_decode"]
            peer = [p["time_s"] for p in here if p["round"] == r and p["impl"].startswith("torch")]
            if ours and peer:
                per.append(min(peer) / min(ours))
        med = {f"{impl}_{lay}" if impl == "cupy_decode" else impl: float(np.median(
               [p["time_s"] for p in here if p["impl"] == impl and p.get("layout") == lay]))
               for impl, lay in dict.fromkeys((p["impl"], p.get("layout")) for p in here)}
        rows.append({"batch": k[0], "kv_heads": k[1], "kv_len": k[2], "q_len": k[3],
                     "median_time_s": med, "rounds": len(per),
                     "ours_over_best_torch_by_round": per,
                     "ours_faster_rounds": sum(x >= 1 for x in per)})
        print(f"B={k[0]:>2} kvh={k[1]:>2} n={k[2]:>6}: ours over PyTorch's best, by round: "
              + " ".join(f"{x:.3f}" for x in per) + f" (ours faster in {rows[-1]['ours_faster_rounds']})",
              flush=True)
    bench.results["summary"] = rows


def rounds(bench, points, candidates, field: str, n_rounds: int = ROUNDS) -> int:
    """At each of ``points``, on PyTorch's own K and V tensors (ours through transposed views),
    ours with each of ``candidates`` ((label, configure keywords over the defaults)), PyTorch's
    cuDNN and flash backends and the plain read, each checked once, then timed in ``n_rounds``
    rounds, one timing of each a round under each flush ("dirty": the table's, "clean":
    ``harness.Harness(clean=True)``). Rows as the table's with ``field`` (the label), "flush"
    and "round"; "summary" per point and flush (``rounds_summary``). --l2-hints, --phased and
    --phased-heldout."""
    torch = bench.torch
    hs = {"dirty": bench.harness, "clean": bench.clean_harness()}
    bench.results["timing_clean"] = hs["clean"].method()
    bench.results["configs"] = {"points": [list(p) for p in points],
                                field + "s": {name: kw for name, kw in candidates}, "rounds": n_rounds}

    def run():
        for B, kvh, n, ql, base in bench.due_points(points):
            q, k, v, launch, refs, ours_check, run_ours = bench.inputs(B, kvh, n, ql)
            qt, kt, vt, kh, vh = bench.torch_layout(q, k, v)
            del k, v
            torch.cuda.empty_cache()
            calls = []
            for label, kw in candidates:
                lc = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql, **kw)
                calls.append(("cupy_decode", {"page_size": 0, "layout": "head_major", field: label,
                                              "splits": lc.splits, "wgmma": lc.wgmma, "tma": lc.tma},
                              run_ours(lc, kh, vh), ours_check))
            calls += bench.sdpa_calls(base, qt, kt, vt, launch, refs, FAST_BACKENDS)
            calls.append(("plain_read", {"page_size": 0}, plain_read_call(bench._plain, kh, vh, bench._flag),
                          None))
            for rnd in range(n_rounds):
                for flush, h in hs.items():
                    bench.harness = h
                    for impl, fields, fn, check in calls:
                        bench.record({"impl": impl, **base, **fields, "flush": flush, "round": rnd}, fn,
                                     check if (rnd, flush) == (0, "dirty") else None)
            bench.harness = hs["dirty"]
            del q, qt, kt, vt, kh, vh, calls
            torch.cuda.empty_cache()
            bench.save()

    return bench.conclude(run, lambda: rounds_summary(bench, candidates, field))


def rounds_summary(bench, candidates, field: str):
    """Per point and flush: each implementation's (ours: each candidate's) median time over the
    rounds, and per round the first candidate's time over each one's, PyTorch's best over it
    and the plain read's over it (above 1: the candidate is the faster)."""
    rows = []
    first = candidates[0][0]
    over = f"over_{first.replace(' ', '_')}_by_round"
    for k, here in by_point(bench.results["points"], checked=False).items():
        for flush in ("dirty", "clean"):
            at = [p for p in here if p.get("flush") == flush]
            rnds = sorted({p["round"] for p in at})

            def t(pred, r):
                ts = [p["time_s"] for p in at if p["round"] == r and pred(p)]
                return min(ts) if ts else None
            med = {}
            for p in at:
                med.setdefault(p["impl"] + (f" {p[field]}" if field in p else ""), []).append(p["time_s"])
            row = {"batch": k[0], "kv_heads": k[1], "kv_len": k[2], "q_len": k[3], "flush": flush,
                   "median_time_s": {name: float(np.median(ts)) for name, ts in med.items()},
                   field + "s": {}}
            base = [t(lambda p: p.get(field) == first, r) for r in rnds]
            peer = [t(lambda p: p["impl"].startswith("torch"), r) for r in rnds]
            plain = [t(lambda p: p["impl"] == "plain_read", r) for r in rnds]
            for label, _ in candidates:
                mine = [t(lambda p, h=label: p.get(field) == h, r) for r in rnds]
                row[field + "s"][label] = {
                    over: [b / a for a, b in zip(mine, base) if a and b],
                    "best_torch_over_ours_by_round": [b / a for a, b in zip(mine, peer) if a and b],
                    "plain_read_over_ours_by_round": [b / a for a, b in zip(mine, plain) if a and b]}
            rows.append(row)
            print(f"B={k[0]:>2} kvh={k[1]:>2} n={k[2]:>6} q={k[3]} {flush}: " + "; ".join(
                f"{h} x{np.median(v[over]):.3f} vs torch {np.median(v['best_torch_over_ours_by_round']):.3f}"
                for h, v in row[field + "s"].items() if v[over] and v["best_torch_over_ours_by_round"]), flush=True)
    bench.results["summary"] = rows


# ---------------------------------------------------------------------- FlashInfer

def flashinfer_calls(fi, torch, q, kp, vp, bt, n: int, workspace) -> list[tuple]:
    """(impl, fields, plan, fn) of FlashInfer's kernels for q (B, q_len, H, d) on the NHD pages kp, vp
    (num_pages, P, kv_heads, d) that block table bt (B, pages) lists, each sequence n keys:
    q_len 1, BatchDecodeWithPagedKVCacheWrapper on CUDA cores and on tensor cores (its prefill
    kernel, ``use_tensor_cores``); q_len > 1,
    BatchPrefillWithPagedKVCacheWrapper (causal, bottom-right) on each of FI_BACKENDS. Each is
    planned by its ``plan()``, once; fn is the timed ``run`` and returns O as (B, q_len, H, d). A backend
    whose module is missing or that refuses the shape raises from plan: the caller skips it."""
    B, ql, _, _ = q.shape
    P, kvh, per = kp.shape[1], kp.shape[2], bt.shape[1]
    i32 = dict(dtype=torch.int32, device=q.device)
    indptr = torch.arange(0, B * per + 1, per, **i32)
    indices = torch.as_tensor(np.ascontiguousarray(bt).reshape(-1), **i32)
    last = torch.full((B,), n - (per - 1) * P, **i32)       # keys on each sequence's last page
    rows = q.reshape(B * ql, H, D)                          # FlashInfer's (tokens, heads, d)
    if ql == 1:
        wrappers = [("flashinfer_decode", {"use_tensor_cores": tc},
                     fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc))
                    for tc in (False, True)]
        plan = lambda w: w.plan(indptr, indices, last, H, kvh, D, P,  # noqa: E731
                                q_data_type=torch.float16)
    else:
        qo = torch.arange(0, B * ql + 1, ql, **i32)
        wrappers = [("flashinfer_prefill", {"backend": b},
                     fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=b))
                    for b in FI_BACKENDS]
        plan = lambda w: w.plan(qo, indptr, indices, last, H, kvh, D, P,  # noqa: E731
                                causal=True, q_data_type=torch.float16)
    return [(impl, fields, lambda w=w: plan(w), lambda w=w: w.run(rows, (kp, vp)).reshape(B, ql, H, D))
            for impl, fields, w in wrappers]


def flashinfer_table(bench, args) -> int:
    """--flashinfer: the module docstring's. Rows as the table's; "summary" per point: the
    fastest FlashInfer kernel and page size, ours (the defaults) on the same pages and on the
    contiguous cache, PyTorch's best backend and the plain read."""
    if bench.fi is None:
        print(f"decode_h200: --flashinfer needs flashinfer-python ({bench.results['notes']['flashinfer']}); "
              "benchmarks/peers/flashinfer_aot.py says how it travels to the GPU machine", file=sys.stderr)
        return 2
    torch = bench.torch
    bench.results["configs"] = {"pages": list(PAGES), "workspace_bytes": FI_WORKSPACE_BYTES,
                                "prefill_backends": list(FI_BACKENDS),
                                "flashinfer_modules": "benchmarks/peers/flashinfer_aot.py (nvcc, sm_90a)"}

    def point(B, kvh, n, ql, base):
        q, k, v, launch, refs, ours_check, run_ours = bench.inputs(B, kvh, n, ql)
        dflt = decode.configure(B, H, kvh, D, kv_lens=[n] * B, q_len=ql)      # the defaults
        bench.record({"impl": "cupy_decode", **base, "page_size": 0, "layout": "token_major",
                      "variant": decode.default_version(0), "splits": dflt.splits},
                     run_ours(dflt, k, v), ours_check)
        bench.plain_read({**base, "page_size": 0}, k, v)
        bench.paged(base, k, v, run_ours, ours_check, "token_major", v1=False,
                    peers=lambda kp, vp, bt: bench.flashinfer(base, q, kp, vp, bt, launch, refs))
        qt, kt, vt, _, _ = bench.torch_layout(q, k, v)
        del k, v
        torch.cuda.empty_cache()
        for impl, fields, fn, check in bench.sdpa_calls(base, qt, kt, vt, launch, refs, FAST_BACKENDS):
            bench.record({"impl": impl, **base, **fields}, fn, check)
        del q, qt, kt, vt
        torch.cuda.empty_cache()
        bench.save()

    def run():
        for B, kvh, n, ql, base in bench.due_points(grid_points(args.quick)):
            try:
                point(B, kvh, n, ql, base)
            except Exception as exc:  # one point's failure (OOM, ...) does not stop the rest
                traceback.print_exc()
                bench.skip(base, f"{type(exc).__name__}: {str(exc)[:300]}")
                bench.failures += 1
                torch.cuda.empty_cache()

    return bench.conclude(run, lambda: flashinfer_summary(bench))


def flashinfer_summary(bench):
    """Per point: FlashInfer's fastest correct kernel and page size, ours (the defaults) at
    that page size and on the contiguous cache, PyTorch's best backend and the plain read
    (TB/s of the K/V bytes), and ours over each."""
    rows = []
    for k, here in by_point(bench.results["points"]).items():
        fi = [p for p in here if p["impl"].startswith("flashinfer")]
        if not fi:
            continue
        best = max(fi, key=lambda p: p["tbps"])
        mine = lambda pred: max((p["tbps"] for p in here if pred(p)), default=None)  # noqa: E731
        row = {"batch": k[0], "kv_heads": k[1], "kv_len": k[2], "q_len": k[3],
               "flashinfer_tbps": best["tbps"], "flashinfer_impl": best["impl"],
               "flashinfer_page_size": best["page_size"],
               "flashinfer_backend": best.get("backend"),
               "ours_paged_tbps": mine(lambda p: p["impl"] == "cupy_decode_paged"
                                       and p["page_size"] == best["page_size"]),
               "ours_tbps": mine(lambda p: p["impl"] == "cupy_decode"),
               "best_torch_tbps": mine(lambda p: p["impl"].startswith("torch")),
               "plain_read_tbps": mine(lambda p: p["impl"] == "plain_read")}
        for who in ("ours_paged", "ours"):
            row[f"{who}_over_flashinfer"] = row[f"{who}_tbps"] / best["tbps"] if row[f"{who}_tbps"] else None
        row["flashinfer_over_plain_read"] = (best["tbps"] / row["plain_read_tbps"]
                                             if row["plain_read_tbps"] else None)
        rows.append(row)
        f = lambda x: "   -" if x is None else f"{x:4.2f}"  # noqa: E731
        print(f"B={k[0]:>2} kvh={k[1]:>2} n={k[2]:>6} q={k[3]}: flashinfer {f(best['tbps'])} TB/s "
              f"({best['impl']}, P {best['page_size']}); ours paged x{f(row['ours_paged_over_flashinfer'])}, "
              f"contiguous x{f(row['ours_over_flashinfer'])}; flashinfer / plain read "
              f"{f(row['flashinfer_over_plain_read'])}", flush=True)
    bench.results["summary"] = rows


def sweep(bench, args) -> int:
    """--splits-sweep: the tuned tiles (as the table), then ``sweep_point`` at ``sweep_points``."""
    def run():
        if not args.no_tune:
            bench.tune()
        for B, kvh, n, ql in sweep_points():
            what = {"batch": B, "kv_heads": kvh, "kv_len": n, "q_len": ql}
            if bench.due(what):
                bench.sweep_point(B, kvh, n, ql, args.sweep_page)

    return bench.conclude(run, bench.sweep_summary)


if __name__ == "__main__":
    sys.exit(main())
