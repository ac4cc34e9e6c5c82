// decode.cu -- decode attention over a KV cache on tensor cores (fp16 / bf16 in, fp32 accumulate):
// Flash-Decoding (split-KV + combine), GQA packing, paged KV through a block table.
//
// One step of generation: q_len new query rows per sequence (1..16, the last q_len positions of
// the sequence, already in the cache) attend to that sequence's kv_len cached keys. The step is
// memory-bound: K and V are read once, everything else is small. Per thread block
// (sequence b, KV head kvh, split s, row chunk c):
//
//   rows    the q_len x group query rows that share KV head kvh (group = heads / kv_heads),
//           packed row r = qi * group + hg (query position qi, head kvh * group + hg): one
//           Q_i tile of B_r = 16 ROW_WARPS rows, so K and V are read once per KV head, not
//           once per query head (GQA packing; more than 64 rows: row chunks, blockIdx.x)
//   keys    split s of the sequence's T_c = ceil(kv_len / B_c) K/V tiles (balanced integer
//           split), streamed in B_c-row tiles through STAGES shared-memory buffers by cp.async
//   state   per query row the running max m_i, the running sum l_i and an fp32 O_i accumulator
//           (the paper's names), rescaled by alpha = exp(m_old - m_new) as each tile arrives
//   output  splits == 1: O = diag(l_i)^-1 O_i in fp16/bf16 and L = m_i + log l_i, directly;
//           splits > 1: the normalized partial O_i (fp32) and its L per split to a workspace,
//           then decode_combine merges the splits (v7: decode_split's blocks do, FUSED)
//           (the associative (m, l) merge):
//           L = log sum_s exp(L_s), O = sum_s exp(L_s - L) O_s.
//
//   HBM traffic per (b, kvh), rows R = q_len * group, n = kv_len (chunks: K/V once per chunk):
//     read  K, V: 2 n d 2 bytes; Q: R d 2; block table (paged): ceil(n / P) int32 entries
//           (one lookup per key row; the repeats of a page hit the cache)
//     write O: R d 2, L: R 4; splits S > 1: partials S R (d + 1) 4 written and read back once
//
// Work decomposition inside a block: 4 warps = ROW_WARPS x KEY_WARPS. Warp (wm, wn) owns the
// 16 packed rows wm * 16 .. + 15 and the keys wn * KW .. + KW - 1 of every tile (KW = B_c /
// KEY_WARPS): its own S = Q K^T slice (mma.sync m16n8k16), its own m_i, l_i and O_i. At the
// end the KEY_WARPS partial states of a row are merged through shared memory, the same (m, l)
// merge as decode_combine. Q fragments stay in registers; P goes from the S accumulators
// straight into the A operand of P V (as flash2_tc.cu).
//
// Versions (selected by compile-time constants, so the benchmark times old and new in one run):
//   (v1) NUM_WARPS 4, COMBINE 1: the design above; decode_combine loops over the splits one by
//       one in every lane (two dependent loads per split: slow when S is large, small grids)
//   (v2) NUM_WARPS 8 (ROW_WARPS up to 8: 128 packed rows in one block, so MQA / big groups at
//       q_len 4 read K/V once instead of once per 64-row chunk) and COMBINE 2: lane s of a
//       warp loads L_s of 32 splits at once, the weights exp(L_s - L_max) go round by shuffle
//       and the O_s loads of 8 splits are in flight together; PAGE_PREFETCH 1: a paged
//       tile's block-table entries are read one tile ahead (registers), off the copy's path.
//   (v3) COMBINE 3: one decode_combine block per output row, warp w merging splits w, w + 4,
//       ...; the 4 warps' sums meet in shared memory. v2's one warp per row walked S splits in
//       S / 8 rounds of dependent loads: at B = 1, MQA (32 rows, over 100 splits) that combine
//       took longer on the H200 than the split kernel itself (benchmarks/decode_h200.json
//       times v2 and v3 side by side).
//   (v4) v3's kernels; decode.py chooses the splits by its one-wave rule (nothing here changes).
//   (v5) WGMMA 1 (sm_90a): decode_split on Hopper's warpgroup MMA, for 128 packed rows per
//       block (MQA or big groups at q_len 4: where v2's mma.sync loop is bound by arithmetic,
//       128 rows x 4 d FLOPs per key). Two warpgroups of 64 rows (NUM_WARPS 8, ROW_WARPS 8);
//       per K/V tile each computes S = Q_w K_j^T (wgmma, both operands in shared memory), masks
//       it, runs the online softmax on the accumulators, and adds P V_j (wgmma, P from
//       registers): flash3.cu's v1 step (wgmma.cuh), with this file's loads (split, paging,
//       cp.async STAGES deep) into flash3's swizzled 64-column panels. No key warps, so no
//       merge: each thread writes its own rows of O (or of the split's partial O) directly.
//       With NUM_WARPS 4 (ROW_WARPS 4): one warpgroup, 64-row blocks (MQA at q_len 1: 32 rows).
//   (v6) PDL 1: v4's or v5's kernels, decode_combine by programmatic dependent launch (its
//       launch and block start overlap decode_split's tail: what counts in a step of a few
//       tens of us at B = 1; benchmarks/decode_h200.json times v6 beside them).
//   (v7) FUSED 1: v4's or v5's decode_split merges the splits itself, no decode_combine: the
//       splits of a (sequence, KV head, row chunk) meet at a counter once their partials are
//       written, then share the merge, its loads all in flight at once (fused_combine below).
//       One wave of resident blocks only, launched cooperatively (decode.py).
//   (v8) v6's or v7's kernels; decode.py chooses the splits for one block per SM where two
//       could be resident (its "sm" rule: half v4's splits there; nothing here changes).
//   (v9) TMA 1 (v5's wgmma loop over a contiguous cache): one thread issues each K/V tile as
//       the TMA unit's tensor copies (one box per 64-column panel, in the 128-byte swizzle the
//       panels have; tma.cuh), completing on the stage's mbarrier, where v5 has every thread
//       compute addresses and issue 16-byte cp.async copies (flash3.cu's v1 -> v2 step); a
//       sequence's ragged last tile still goes by cp.async, which zero-fills past kv_len.
//       PINGPONG 1 (two warpgroups): warpgroup 1 issues its S = Q K^T only after warpgroup 0
//       has (a named barrier), so one warpgroup's GEMMs run during the other's softmax
//       (FlashAttention-3's ping-pong inside one tile; flash3.cu's v4 runs it across tiles).
//  (v10) COMBINE 4: decode_combine in one round of loads. v3 reads the L_s of its row, then
//       (once their max is known) the O_s: two dependent trips to the L2 after the split grid
//       drains. Here each warp issues the L_s and O_s of up to COMBINE4_LOADS of its splits at
//       once and merges them online (a running max, rescaled as in the split loop); the 4
//       warps' states meet in shared memory. Up to 32 splits it waits on one trip, not two
//       (Nsight Compute saw v3 take longer than cuDNN's reduction: decode_configs_ncu_h200.csv).
//       Its loads sit in registers: it is bounded to 64, so that as many of its blocks share an
//       SM as of v3's.
//  (v11) OVERLAP 1 (WGMMA 1): inside a warpgroup, the softmax of S_j runs while P_{j-1} V_{j-1}
//       is on the tensor cores (FlashAttention-3's intra-warpgroup pipelining, flash3.cu's v4,
//       here without a producer warpgroup): per tile S_j and P_{j-1} V_{j-1} are issued
//       together, S_j waited for, masked and exponentiated, then P_{j-1} V_{j-1} waited for, O_i
//       rescaled and P_j packed; the last tile's P V after the loop. V_{j-1} holds its stage one
//       tile longer, so a tile is issued STAGES - 2 ahead (v5, v9: STAGES - 1): 3 stages or more.
//  (v13) L2_PREFETCH, EVICT_FIRST: L2 hints on the K/V copies, for the last percent of DRAM
//       bandwidth where one row a KV head streams at saturation. With L2_PREFETCH 128 or 256 a
//       cp.async miss brings that many bytes into the L2 (FlashAttention-2's cp.async carries
//       .L2::128B; the TMA unit's copies take it from the tensor map, decode.py); with
//       EVICT_FIRST the K/V lines, read once, are the L2's first candidates for eviction, so
//       the lines already there (dirty ones too) stay. The mma.sync loop's cp.async copies and
//       the wgmma loop's TMA copies take them; the wgmma loop's cp.async copies (pages, a ragged
//       last tile) do not (load_kv_wg says why).
//  (v14) PHASED 1 (mma.sync loop, contiguous cache, STAGES 1): FlashAttention-2's own order, as
//       cuDNN's decode kernel lays out its buffers (one K and one V tile, 128 keys): V_j is
//       loaded while S_j = Q K_j^T and its softmax run, K_{j+1} while P V_j runs, each waited
//       for in full; a block has one tensor's tile in flight at a time, where v4's stages
//       have K and V of STAGES - 1 tiles in flight together.
//  (v15) TMAP_PREFETCH 1 (TMA 1): thread 0 asks for both tensor maps first thing
//       (prefetch.tensormap), so the prologue's first TMA copies need not wait for the TMA
//       unit to fetch their 128-byte descriptors (cold after the L2 flush). --timeline: the
//       first tile lands no sooner; not taken.
//  (v16) HALF_ROWS 1 (one warpgroup, at most 32 rows: MQA at q_len 1): a wgmma tile has 64 rows,
//       so half of them pad. In v5 they are rows 32..63, warps 2 and 3's: those warps run the
//       softmax on zeros while warps 0 and 1 carry every real row on their two SM sub-partitions'
//       exp units. Here packed row pr sits in tile row 16 (pr / 8) + pr % 8, rows g of every
//       warp: each warp has 8 real rows, skips the softmax of its rows g + 8, and the four
//       sub-partitions share the exponentials. (--timeline: at MQA, q_len 1, a v9 block computes
//       for about 70 % of its loop; v16 computes less, and the short steps, whose few tiles a
//       block does not overlap with loads, gain most.)
//  (v17) PRODUCER 1 (TMA 1): one more warp, the producer, issues every K/V tile of the block as
//       soon as its stage is free (an "empty" mbarrier each consumer warp arrives on once its
//       GEMMs have read the stage), and the consumer warpgroups wait only on the "full"
//       mbarrier of the tile they compute: no barrier of the whole block per tile. In v9 every
//       tile starts at a __syncthreads, so two warpgroups meet at each tile and the tensor
//       cores idle while both run their softmax; here they drift apart and one's softmax runs
//       beside the other's GEMMs (flash3.cu's v3 step, with one producer warp instead of a
//       producer warpgroup: the consumers keep their registers, no setmaxnreg). The ragged
//       last tile: the producer warp's cp.async (zero-filling past kv_len), then its arrival.
//  (v18) KV_LENS_ARG 1: the sequences' kv_lens by value, a kernel parameter (KvLens, up to
//       KV_LENS_MAX sequences), where v1-v17 load kv_lens[b] from global memory first thing:
//       every block's first tile is issued only once its kv_len is known (its split's tiles
//       depend on it), so that load, a trip to DRAM after the benchmark's L2 flush, stood
//       before every step's first bytes. The launch is built for its kv_lens (decode.py's
//       configure takes them), so nothing is lost by passing them along.
//  (v19) STAGGER 1 (PRODUCER 1): the producer asks for tile n of the prologue (n < STAGES) only
//       once tile n - 1 has landed. v17's producer fills every stage at once: 2 x 8 MB across
//       128 blocks, and a block's first tile lands when most of it has (--timeline: 10 us after
//       the start at MQA q_len 4, B 8, 32k, where v16's one tile a block lands at 6 us); the
//       loop, bound by arithmetic there, then starts that much later.
//  (v20) PRODUCER 1 and OVERLAP 1 (3 stages): v17's producer with v11's loop, the softmax of
//       S_j while P_{j-1} V_{j-1} is on the tensor cores (FlashAttention-3's intra-warpgroup
//       pipelining beside its producer, flash3.cu's v3 and v4 steps together). --timeline
//       found v17's MQA q_len-4 loop bound by arithmetic, a 128-key tile at about 2.1 us where
//       its GEMMs alone take about 1.2 us: each warpgroup's exponentials (16 per SM and clock)
//       ran between its own GEMMs. v11 alone did not pay, its block barrier a tile costing what
//       the overlap saved; v17 has none. A consumer warp arrives on tile j - 1's empty
//       mbarrier once P_{j-1} V_{j-1} is done (V_{j-1} holds its stage a tile longer).
//  (v21) QFIRST 1 (wgmma): each consumer thread issues its loads of Q_i into registers first,
//       before any K/V tile is asked for, and stores them to shared memory after the prologue.
//       Nsight Compute's warp samples of v18 at MQA q_len 4, B 8, 32k (decode_loop_sass_ncu_h200
//       .csv) hold a large share at Q_i's stores, waiting for Q_i's loads: issued after the
//       prologue's tiles, they reach the memory system behind the whole GPU's first K/V stages
//       (16 MB at that point), and the loop cannot start before Q_i is in. The defaults since.
//  (v22) PRODUCER 1 and PINGPONG 1 (two warpgroups, not OVERLAP): FlashAttention-3's ping-pong
//       beside v17's producer. v9's one-way turn (warpgroup 1 after 0, once a tile) leans on
//       v9's block barrier a tile; without it, as in v17, warpgroup 0 could run a tile ahead and
//       arrive twice at one phase of the named barrier. Here each warpgroup waits for its own
//       turn before issuing S and hands the turn to the other after: strict alternation, one
//       S issue at a time, at most a tile apart, where v17 lets the two drift.
//  (v23) TURN_PV 1 (v22's constants): FlashAttention-3's turn. v22's turn covers S_j alone, so
//       warpgroup 1's S_j queues right behind 0's and both softmaxes run at about the same time
//       (the exp units shared, the tensor cores idle); each P V then goes whenever its softmax
//       ends. Here a turn issues P_j V_j and S_{j+1} together: the other warpgroup's two GEMMs
//       run on the tensor cores while this one's softmax of S_{j+1} runs, and the turns
//       alternate, so one warpgroup's exponentials meet the other's GEMMs. A tile's stage is
//       freed once its P V is done, which is issued with the next tile's S: at 2 stages the
//       tile after that is asked for only during the next softmax (v21 asks a tile earlier),
//       so --turn-pv times 3 stages too. The defaults at 3 stages where the producer feeds two
//       warpgroups long splits (decode.py's default_turn_pv), v21 elsewhere.
//  (v24) TURN_PV 1 and OVERLAP 1 (3 stages): v23's turns with v20's order inside a warpgroup:
//       a turn issues S_j, then P_{j-1} V_{j-1}, and the softmax of S_j starts once S_j is done,
//       while P_{j-1} V_{j-1} and then the other warpgroup's GEMMs run (FlashAttention-3's two
//       schedules together). v23's softmax waits for both GEMMs of its turn. --turn-overlap:
//       no faster than v23; an option.
//  (v25) TREE_SOFTMAX 1 (WGMMA 1): the softmax's row max and row sum (wgmma.cuh's softmax_step)
//       in 4 partial chains each, joined at the end, where v5-v24 fold each row's 32 pairs into
//       one dependent chain of FMNMX and one of FADD. Nsight Compute's warp samples of v23 at
//       MQA q_len 4 (decode_loop_sass_ncu_h200_v23.csv) have fixed-latency waits as their
//       largest reason: with the turns keeping the tensor cores fed, a softmax's latency sits
//       on the loop's path. The sum's order changes (still the same every run). --tree-softmax:
//       no faster; an option.
// Masks: keys >= kv_len (ragged tiles, zero-filled
// by cp.async), and, causal, key k hidden from query position qi when k > kv_len - q_len + qi
// (bottom-right aligned: the new tokens are the last q_len of the sequence).
//
// Compile-time constants (defaults let the file compile alone):
//   HEAD_DIM   d, 64 or 128             IS_BF16    0: fp16, 1: bf16
//   PAGE_SIZE  0: contiguous cache (B, capacity, kv_heads, d); P > 0: pages (num_pages, P,
//              kv_heads, d) (vLLM "NHD") addressed through block_table (B, max_pages) int32;
//              either at any strides (kv_batch_stride, kv_row_stride, kv_head_stride, in
//              elements, multiples of 8; d contiguous): a head-major cache (B, kv_heads,
//              capacity, d) or pages (num_pages, kv_heads, P, d) (FlashInfer's "HND") run
//              through a transposed view, with no copy
//   NUM_WARPS  4 or 8 warps per decode_split block (32 NUM_WARPS threads)
//   ROW_WARPS  1, 2, 4 (or 8 with 8 warps) (B_r = 16 ROW_WARPS)   BLOCK_C  B_c, keys per tile
//              (a multiple of 16 KEY_WARPS, KEY_WARPS = NUM_WARPS / ROW_WARPS)
//   STAGES     shared-memory buffers of K and V tiles in flight (2..4)
//   COMBINE    1, 2, 3 or 4: decode_combine's version (above)
//   PAGE_PREFETCH  0 as in v1, or 1 (v2, paged): block-table entries read one tile ahead
//   WGMMA      0, or 1: v5 (ROW_WARPS = NUM_WARPS, 8 or 4; compile for sm_90a)
//   PDL        0, or 1: programmatic dependent launch of decode_combine (sm_90; below)
//   FUSED      0, or 1: v7, the merge inside decode_split (needs ``counters``: 2 ints per
//              group, zero before the launch and left zero by it)
//   TMA        0, or 1: v9's K/V copies (WGMMA 1, PAGE_SIZE 0; two more parameters, the caches'
//              CUtensorMaps as 4-D tensors (d, N, kv_heads, B), passed by value)
//   PINGPONG   0, or 1: v9's turns of two warpgroups (WGMMA 1, NUM_WARPS 8)
//   OVERLAP    0, or 1: v11's softmax beside the previous tile's P V (WGMMA 1, STAGES >= 3)
//   L2_PREFETCH  0, 64, 128 or 256: v13's L2 prefetch size on the mma.sync loop's K/V copies
//   EVICT_FIRST  0, or 1: v13's evict-first L2 policy on the mma.sync loop's K/V copies and
//              the TMA unit's
//   PHASED     0, or 1: v14's order of loads (WGMMA 0, PAGE_SIZE 0, STAGES 1)
//   TMAP_PREFETCH  0, or 1 (TMA 1): the tensor maps prefetched at entry (v15, below)
//   HALF_ROWS  0, or 1 (WGMMA 1, NUM_WARPS 4, at most 32 packed rows): v16's row placement
//   PRODUCER   0, or 1 (TMA 1, not FUSED): v17's producer warp (with OVERLAP: v20; with
//              PINGPONG, not OVERLAP: v22)
//   STAGGER    0, or 1 (PRODUCER 1): v19's prologue, one tile at a time
//   QFIRST     0, or 1 (WGMMA 1): v21, Q_i's loads before the prologue's tiles
//   TURN_PV    0, or 1 (PRODUCER 1, PINGPONG 1): v23, a turn covers P_j V_j and S_{j+1}; with
//              OVERLAP 1 (3 stages): v24
//   TREE_SOFTMAX  0, or 1 (WGMMA 1): v25, a row's max and sum over 4 partial chains
//   KV_LENS_ARG  0, or 1: v18, one more parameter of decode_split, ``kv_lens_arg`` (KvLens, by
//              value: kv_lens[b] for b < batch <= KV_LENS_MAX); ``kv_lens`` is then not read
//   TIMELINE   0, or 1: a probe, not a version (below): one more parameter of decode_split,
//              ``timeline``, TL_FIELDS uint64 words a block
// Grid of decode_split: (row chunks, splits, B * kv_heads); block: 32 NUM_WARPS threads (v17:
// 32 more, the producer warp last); dynamic
// shared memory SMEM_BYTES. decode_combine: one warp per output row, 4 rows per 128-thread block
// (v3, v4: one row per block).
// Layouts: Q, O (B, q_len, H, d); L (B, H, q_len) fp32 (natural log); workspace O_part
// (S, B q_len H, d) fp32, L_part (S, B q_len H) fp32.

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef IS_BF16
#define IS_BF16 0
#endif
#ifndef PAGE_SIZE
#define PAGE_SIZE 0
#endif
#ifndef ROW_WARPS
#define ROW_WARPS 1
#endif
#ifndef BLOCK_C
#define BLOCK_C 64
#endif
#ifndef STAGES
#define STAGES 3
#endif

#ifndef NUM_WARPS
#define NUM_WARPS 4
#endif
#ifndef COMBINE
#define COMBINE 1
#endif
#ifndef PAGE_PREFETCH
#define PAGE_PREFETCH 0
#endif
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef PDL
#define PDL 0
#endif
#ifndef FUSED
#define FUSED 0
#endif
#ifndef PINGPONG
#define PINGPONG 0
#endif
#ifndef TMA
#define TMA 0
#endif
#ifndef OVERLAP
#define OVERLAP 0
#endif
#ifndef L2_PREFETCH
#define L2_PREFETCH 0
#endif
#ifndef EVICT_FIRST
#define EVICT_FIRST 0
#endif
#ifndef PHASED
#define PHASED 0
#endif
#ifndef TIMELINE
#define TIMELINE 0
#endif
#ifndef TMAP_PREFETCH
#define TMAP_PREFETCH 0
#endif
#ifndef HALF_ROWS
#define HALF_ROWS 0
#endif
#ifndef PRODUCER
#define PRODUCER 0
#endif
#ifndef KV_LENS_ARG
#define KV_LENS_ARG 0
#endif
#ifndef STAGGER
#define STAGGER 0
#endif
#ifndef QFIRST
#define QFIRST 0
#endif
#ifndef TURN_PV
#define TURN_PV 0
#endif
#ifndef TREE_SOFTMAX
#define TREE_SOFTMAX 0
#endif
#define NUM_THREADS (32 * NUM_WARPS)                 // the threads that compute (v17: the consumers)
// v17's producer: one warp beside one consumer warpgroup; beside two, a warpgroup (ptxas sizes
// registers by warpgroups: 288 threads would get 384's, 168 each), whose first warp issues the
// tiles and which gives its registers to the consumers (setmaxnreg, as flash3.cu's v3)
#define PRODUCER_THREADS (PRODUCER ? (NUM_WARPS == 8 ? 128 : 32) : 0)
#define BLOCK_THREADS (NUM_THREADS + PRODUCER_THREADS)
#define PRODUCER_REGS 40                             // 128 x 40 + 256 x 232 = 64512 of 65536
#define CONSUMER_REGS 232
#define COMBINE_WARPS 4
#define COMBINE_THREADS (32 * COMBINE_WARPS)
#define KEY_WARPS (NUM_WARPS / ROW_WARPS)
#define BLOCK_R (16 * ROW_WARPS)
#define KW (BLOCK_C / KEY_WARPS)                     // keys of a tile per warp
#define KV_TILE_ELEMS (BLOCK_C * HEAD_DIM)
#define Q_CHUNKS (BLOCK_R * HEAD_DIM / 8 / NUM_THREADS)   // v21: Q_i's 16-byte chunks per thread
#if WGMMA   // 1 KiB to align the swizzled panels, Q_i, STAGES x (K_j, V_j)
#define SMEM_BYTES (1024 + (BLOCK_R * HEAD_DIM + 2 * STAGES * KV_TILE_ELEMS) * 2)
#else
#define SMEM_BYTES ((BLOCK_R * HEAD_DIM + 2 * STAGES * KV_TILE_ELEMS) * 2)
#endif
// After the loop the K/V buffers hold the KEY_WARPS partial states (O_i fp32, m_i, l_i).
#define MERGE_BYTES (KEY_WARPS * BLOCK_R * (HEAD_DIM + 2) * 4)

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "HEAD_DIM must be 64 or 128");
static_assert(NUM_WARPS == 4 || NUM_WARPS == 8, "NUM_WARPS is 4 or 8");
static_assert((ROW_WARPS == 1 || ROW_WARPS == 2 || ROW_WARPS == 4 || ROW_WARPS == 8) &&
              ROW_WARPS <= NUM_WARPS, "ROW_WARPS is 1, 2, 4 or 8, at most NUM_WARPS");
static_assert(COMBINE >= 1 && COMBINE <= 4, "COMBINE is 1, 2, 3 or 4");
#define MAX_SPLITS_COMBINE 128                       // decode.py MAX_SPLITS: v3's weights in shared memory
#define COMBINE4_LOADS 8                             // v4: splits a warp loads in one round: 4 x 8 =
                                                     // 32, the most decode.py's defaults send here
static_assert(KW % 16 == 0 && KW >= 16, "BLOCK_C must be a multiple of 16 KEY_WARPS");
static_assert(PHASED ? STAGES == 1 : STAGES >= 2 && STAGES <= 4, "STAGES is 2..4 (v14: 1)");
static_assert(!PHASED || (!WGMMA && PAGE_SIZE == 0), "v14: the mma.sync loop over a contiguous cache");
static_assert(PAGE_SIZE >= 0, "PAGE_SIZE >= 0");
static_assert(WGMMA || MERGE_BYTES <= 2 * STAGES * KV_TILE_ELEMS * 2, "merge buffers fit the K/V buffers");
static_assert(!WGMMA || ROW_WARPS == NUM_WARPS, "v5: one or two warpgroups of 64 rows, no key warps");
static_assert(!PINGPONG || (WGMMA && NUM_WARPS == 8), "v9: the ping-pong of two warpgroups");
static_assert(!TMA || (WGMMA && PAGE_SIZE == 0), "v9 (TMA): the wgmma loop over a contiguous cache");
static_assert(!TMAP_PREFETCH || TMA, "v15 (TMAP_PREFETCH): the tensor maps of TMA 1");
static_assert(!HALF_ROWS || (WGMMA && NUM_WARPS == 4), "v16 (HALF_ROWS): one warpgroup of wgmma");
static_assert(!STAGGER || PRODUCER, "v19 (STAGGER): v17's producer");
static_assert(!QFIRST || (WGMMA && BLOCK_R * HEAD_DIM / 8 % NUM_THREADS == 0), "v21 (QFIRST): the wgmma loop");
static_assert(!PRODUCER || (TMA && !FUSED && !(PINGPONG && OVERLAP && !TURN_PV)),
              "v17 (PRODUCER): the TMA loop without v7's merge (v22's turns with v20's overlap: v24)");
static_assert(!OVERLAP || (WGMMA && STAGES >= 3), "v11: the wgmma loop, V_{j-1} a stage longer (3 stages)");
static_assert(!TURN_PV || (PRODUCER && PINGPONG && NUM_WARPS == 8), "v23 (TURN_PV): v22's turns, two warpgroups");
static_assert(!TREE_SOFTMAX || WGMMA, "v25 (TREE_SOFTMAX): the wgmma loop's softmax");
static_assert(L2_PREFETCH == 0 || L2_PREFETCH == 64 || L2_PREFETCH == 128 || L2_PREFETCH == 256,
              "L2_PREFETCH is 0, 64, 128 or 256");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory above the 227 KB per-block limit");

#include "common.cuh"
#if WGMMA
#include "wgmma.cuh"     // flash3.cu's warpgroup GEMMs, swizzled panels and softmax step
#define BAR_PINGPONG 1       // v9: warpgroup 0 has issued this tile's S (named barrier; 0 is __syncthreads)
#define BAR_CONSUMERS 2      // v17: the consumer warps' Q_i stored (the producer warp not among them)
#define BAR_TURN 3           // v22: BAR_TURN + w, warpgroup w's turn to issue S (3 and 4)
#endif
#if KV_LENS_ARG   // v18: the kv_lens by value (1 KiB of the 4 KiB of parameters)
#define KV_LENS_MAX 256
struct KvLens { int n[KV_LENS_MAX]; };
#define KV_LENS_PARAMS , const __grid_constant__ KvLens kv_lens_arg
#define KV_LEN_OF(b) (kv_lens_arg.n[b])
#else
#define KV_LENS_PARAMS
#define KV_LEN_OF(b) (kv_lens[b])
#endif
#if TMA
#include "tma.cuh"       // mbarriers, the TMA unit's 4-D box copies
#define TMA_PARAMS , const __grid_constant__ TensorMap tm_k, const __grid_constant__ TensorMap tm_v
#else
#define TMA_PARAMS
#endif

// Offset (16-bit elements) of (row, col) in a d-wide tile: 16-byte chunk c of row r stored
// at chunk c ^ (r % 8), so ldmatrix and cp.async are free of bank conflicts (flash2_tc v3).
__device__ __forceinline__ int tile_off(int row, int col) {
    return row * HEAD_DIM + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// The packed row held in row r of a block's tile (v16: rows 16 w .. 16 w + 7 of warp w hold
// packed rows 8 w .. 8 w + 7, rows 16 w + 8 .. 16 w + 15 pad: NO_ROW), relative to row0.
constexpr int NO_ROW = 1 << 20;
__device__ __forceinline__ int packed_row(int r) {
    return HALF_ROWS ? (r % 16 < 8 ? 8 * (r / 16) + r % 16 : NO_ROW) : r;
}

constexpr int CHUNKS = HEAD_DIM / 8;                      // 16-byte chunks per K/V row
constexpr int LOAD_ITERS = BLOCK_C * CHUNKS / NUM_THREADS;  // chunks per thread per tile
static_assert(BLOCK_C * CHUNKS % NUM_THREADS == 0, "whole tiles per thread sweep");

// PAGE_PREFETCH (paged): the block-table entries of the rows a thread loads for a tile are
// read one tile ahead into registers (one entry when a page holds whole tiles), so a tile's
// cp.async never waits on a block-table load; 0: read just before the copy (v1).
#if PAGE_SIZE > 0 && PAGE_PREFETCH
constexpr int NPG = PAGE_SIZE % BLOCK_C == 0 ? 1 : LOAD_ITERS;
#else
constexpr int NPG = 1;
#endif
struct Pages { int pg[NPG]; };

// The pages of tile key0's rows that this thread copies (rows past kv_len: unused, 0).
__device__ __forceinline__ void fetch_pages(Pages& P, const int* bt_row, int key0, int kv_len) {
#if PAGE_SIZE > 0 && PAGE_PREFETCH
#pragma unroll
    for (int i = 0; i < NPG; ++i) {
        const int p = key0 + (NPG == 1 ? 0 : (i * NUM_THREADS + (int)threadIdx.x) / CHUNKS);
        P.pg[i] = p < kv_len ? bt_row[p / PAGE_SIZE] : 0;
    }
#else
    (void)P; (void)bt_row; (void)key0; (void)kv_len;
#endif
}

// Where one block's rows of the cache are (elements): ``base`` is sequence b's first row
// (contiguous) or the stride between pages (paged); ``row_stride`` the stride between keys;
// ``head_off`` KV head kvh's offset in a row. Any strides: (B, capacity, kv_heads, d) and a
// head-major (B, kv_heads, capacity, d) cache seen through a transposed view both run.
struct CacheRows { size_t base; int row_stride; size_t head_off; };

// Element offset of key p's row in the cache: contiguous, or through the block table
// (PAGE_PREFETCH: ``pages`` holds the entries of load iteration it's rows).
__device__ __forceinline__ size_t kv_row_off(const int* bt_row, const CacheRows& cr, int p,
                                             const Pages& pages, int it) {
    (void)bt_row; (void)pages; (void)it;
#if PAGE_SIZE == 0
    return cr.base + (size_t)p * cr.row_stride + cr.head_off;
#else
#if PAGE_PREFETCH
    const int page = pages.pg[NPG == 1 ? 0 : it];
#else
    const int page = bt_row[p / PAGE_SIZE];
#endif
    return (size_t)page * cr.base + (size_t)(p % PAGE_SIZE) * cr.row_stride + cr.head_off;
#endif
}

// One 16-byte K/V copy by cp.async, with v13's L2 hints (PTX: cp.async.cg.shared.global
// {.L2::cache_hint}{.L2::<size>B}); src_size 0 zero-fills, as cp_async_16. ``policy``: from
// kv_policy (EVICT_FIRST), else unused.
#define KV_STR2(x) #x
#define KV_STR(x) KV_STR2(x)
#if L2_PREFETCH
#define KV_PREFETCH ".L2::" KV_STR(L2_PREFETCH) "B"
#else
#define KV_PREFETCH ""
#endif
__device__ __forceinline__ unsigned long long kv_policy() {
    unsigned long long p = 0;
#if EVICT_FIRST
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));   // no side effect: hoisted
#endif
    return p;
}
__device__ __forceinline__ void kv_copy_16(u32 dst, const void* src, bool valid, unsigned long long policy) {
#if EVICT_FIRST
    asm volatile("cp.async.cg.shared.global.L2::cache_hint" KV_PREFETCH " [%0], [%1], 16, %2, %3;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0), "l"(policy));
#else
    (void)policy;
    asm volatile("cp.async.cg.shared.global" KV_PREFETCH " [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
#endif
}

// K_j, V_j: keys key0 .. key0 + B_c - 1 of sequence b, KV head kvh, into one stage.
// Keys >= kv_len are zero-filled (no bytes read; P is 0 there and 0 * 0 stays 0).
// PAGE_PREFETCH: ``pages`` holds this tile's fetch_pages.
// LOAD_K, LOAD_V: which of the two (v14 loads them apart).
template <bool LOAD_K = true, bool LOAD_V = true>
__device__ __forceinline__ void load_kv(u16* K_st, u16* V_st, const u16* K, const u16* V,
                                        const int* bt_row, const CacheRows& cr, int key0, int kv_len,
                                        const Pages& pages) {
    const unsigned long long policy = kv_policy();
#pragma unroll
    for (int it = 0; it < LOAD_ITERS; ++it) {
        const int c = it * NUM_THREADS + threadIdx.x;
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const int p = key0 + r;            // key position in the sequence
        const bool valid = p < kv_len;
        const size_t off = valid ? kv_row_off(bt_row, cr, p, pages, it) : 0;
        if (LOAD_K) kv_copy_16(smem_addr(K_st + tile_off(r, col)), K + off + col, valid, policy);
        if (LOAD_V) kv_copy_16(smem_addr(V_st + tile_off(r, col)), V + off + col, valid, policy);
    }
}

// PDL 1 (programmatic dependent launch, sm_90): decode_split lets the next grid in the
// stream (decode_combine, launched with programmatic stream serialization) start once every
// split block runs; decode_combine's blocks wait in griddepcontrol.wait until the split grid
// has finished and its writes are visible. The combine's launch and block scheduling then
// overlap the split's tail instead of following it. Launched without the attribute, both
// instructions do nothing.
__device__ __forceinline__ void pdl_launch_dependents() {
#if PDL
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// TIMELINE 1: where a decode_split block's time goes (benchmarks/decode_h200.py --timeline).
// Thread 0 of each block writes its record: the SM it ran on; the global timer (ns, one clock
// for every SM) at entry, once the prologue has issued its tiles, once its first tile has
// landed, after its last tile and at exit; its SM's clock (cycles) at entry and exit, and the
// cycles it spent in the loop's waits for a tile (the wait and the barrier after it: a block
// waiting on DRAM, or on a warp still computing). The other threads run as without it;
// TIMELINE 0 compiles every call away.
#define TL_FIELDS 9
enum { TL_SM, TL_ENTRY, TL_ISSUED, TL_FIRST, TL_LOOP_END, TL_EXIT, TL_CLK_ENTRY, TL_CLK_EXIT, TL_CLK_WAIT };
#if TIMELINE
#define TIMELINE_PARAMS , unsigned long long* __restrict__ timeline
#define TL_ARG timeline
struct Timeline {
    unsigned long long* rec;
    long long waited = 0, c0 = 0;
    __device__ __forceinline__ explicit Timeline(unsigned long long* tl)
        : rec(tl + TL_FIELDS * (blockIdx.x + (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z))) {
        if (threadIdx.x == 0) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            rec[TL_SM] = sm;
            rec[TL_ENTRY] = now_ns();
            rec[TL_CLK_ENTRY] = clock64();
        }
    }
    __device__ __forceinline__ static unsigned long long now_ns() {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
    }
    __device__ __forceinline__ void mark(int field) { if (threadIdx.x == 0) rec[field] = now_ns(); }
    __device__ __forceinline__ void mark_by(int field, bool me) { if (me) rec[field] = now_ns(); }
    __device__ __forceinline__ void wait_begin() { c0 = clock64(); }
    __device__ __forceinline__ void wait_end() { waited += clock64() - c0; }
    __device__ __forceinline__ void exit() {
        if (threadIdx.x == 0) {
            rec[TL_CLK_WAIT] = waited;
            rec[TL_CLK_EXIT] = clock64();
            rec[TL_EXIT] = now_ns();
        }
    }
};
#else
#define TIMELINE_PARAMS
#define TL_ARG nullptr
struct Timeline {
    __device__ __forceinline__ explicit Timeline(void*) {}
    __device__ __forceinline__ void mark(int) {}
    __device__ __forceinline__ void mark_by(int, bool) {}
    __device__ __forceinline__ void wait_begin() {}
    __device__ __forceinline__ void wait_end() {}
    __device__ __forceinline__ void exit() {}
};
#endif

// FUSED 1 (v7). A launch of decode_combine costs a step at B = 1 (12-50 us) a few us more
// than its bytes: the split grid drains, the combine's blocks start and wait on L2 latency.
// Here the num_splits blocks of one group (sequence b, KV head kvh, row chunk) meet at an
// arrival counter once each has written its partial O and L, and then merge the group's rows
// together. Waiting on other blocks is safe only when the whole grid is resident at once:
// decode.py launches v7 cooperatively (the driver refuses a grid larger than one wave).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Returns once all num_splits blocks of group ``grp`` have arrived; their partials are then
// visible to every thread of this block. counters[2 grp]: arrivals, [2 grp + 1]: departures;
// the last block to leave resets both, so the next launch finds them zero.
__device__ __forceinline__ void group_barrier(int* counters, int grp, int num_splits) {
    __threadfence();                      // this thread's partial O, L before the arrival
    __syncthreads();
    if (threadIdx.x == 0) {
        int* arrive = counters + 2 * grp;
        atomicAdd(arrive, 1);
        while (ld_acquire_gpu(arrive) < num_splits) __nanosleep(64);
        if (atomicAdd(arrive + 1, 1) == num_splits - 1) {   // everyone has left the wait
            arrive[0] = 0;
            arrive[1] = 0;
        }
    }
    __syncthreads();
}

// v7's merge of a group's rows (packed rows row0 .. min(row0 + B_r, R) - 1). Unit u is (row
// u / CH, columns 32 (u % CH) ..); block `split` owns units split, split + num_splits, ...
// (``mine`` of them) and merges as many at once as its threads hold: a unit takes 8 sl_n
// threads, thread (split lane sl, column quad c4) loading O_s[row, 4 c4 ..] and L_s of splits
// sl, sl + sl_n, ... (at most MERGE_LOADS), all in flight together (__ldcg: written by other
// SMs during this launch, so read from the L2). sl_n is a power of 2, as large as lets all
// ``mine`` units go in one pass. Weights exp(L_s - max L) as decode_combine's; a unit's split
// lanes meet by shuffles, and, where a unit spans warps, in shared memory ``red`` (the K/V
// buffers, free by now). The order of every sum is fixed: the same bits each run.
constexpr int MERGE_LOADS = 16;          // splits per thread: MAX_SPLITS_COMBINE over 8 lanes of 8 warps x 2

__device__ __forceinline__ void fused_combine(const float* O_part, const float* L_part, u16* O,
                                              float* L, float* red, int split, int num_splits,
                                              int NR, int b, int kvh, int row0, int R, int group,
                                              int H, int q_len) {
    constexpr int D = HEAD_DIM, CH = D / 32, MAX_SL = NUM_THREADS / 8;
    static_assert(MAX_SL * MERGE_LOADS >= MAX_SPLITS_COMBINE, "a unit's splits fit its threads' loads");
    float* red_m = red;                                      // [NUM_WARPS] max, [NUM_WARPS] sum
    float* red_s = red + NUM_WARPS;
    float4* red4 = reinterpret_cast<float4*>(red + 16);      // [NUM_WARPS][8]
    const float NEG_INF = neg_inf();
    const int units = min(BLOCK_R, R - row0) * CH;
    const int mine = units > split ? cdiv(units - split, num_splits) : 0;
    int sl_n = 1, fit = 1;                                   // split lanes per unit
    while (sl_n * MERGE_LOADS < num_splits) sl_n *= 2;      // the loads fit the registers
    while (2 * fit * 8 * mine <= NUM_THREADS && fit < MAX_SL) fit *= 2;   // one pass, if it can
    while (sl_n < fit && sl_n < num_splits) sl_n *= 2;
    const int span = 8 * sl_n, per_pass = NUM_THREADS / span, wpu = span > 32 ? span / 32 : 1;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int slot = tid / span, sl = (tid / 8) % sl_n, c4 = tid % 8;
    for (int k0 = 0; k0 < mine; k0 += per_pass) {           // the same trip count in every thread
        const int k = k0 + slot;
        const bool active = k < mine;
        const int u = split + k * num_splits;
        const int pr = row0 + (active ? u / CH : 0), col = (active ? u % CH : 0) * 32 + c4 * 4;
        const int qi = pr / group, h = kvh * group + pr % group;
        const int orow = (b * q_len + qi) * H + h;
        float4 x[MERGE_LOADS];
        float ls[MERGE_LOADS];
        float lmax = NEG_INF;
#pragma unroll
        for (int i = 0; i < MERGE_LOADS; ++i) {
            const int s = sl + i * sl_n;
            const bool valid = active && s < num_splits;
            x[i] = valid ? __ldcg(reinterpret_cast<const float4*>(O_part + ((size_t)s * NR + orow) * D + col))
                         : make_float4(0.f, 0.f, 0.f, 0.f);
            ls[i] = valid ? __ldcg(L_part + (size_t)s * NR + orow) : NEG_INF;
            lmax = fmaxf(lmax, ls[i]);
        }
        for (int o = 8; o < min(32, span); o <<= 1) lmax = fmaxf(lmax, __shfl_xor_sync(0xffffffffu, lmax, o));
        if (wpu > 1) {                                       // block-uniform: wpu depends on num_splits
            if (lane == 0) red_m[warp] = lmax;
            __syncthreads();
            for (int j = 0; j < wpu; ++j) lmax = fmaxf(lmax, red_m[slot * wpu + j]);
        }
        float sum = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int i = 0; i < MERGE_LOADS; ++i) {
            const float w = ls[i] == NEG_INF ? 0.f : expf(ls[i] - lmax);   // empty split: weight 0
            sum += w;
            acc.x += w * x[i].x, acc.y += w * x[i].y, acc.z += w * x[i].z, acc.w += w * x[i].w;
        }
        for (int o = 8; o < min(32, span); o <<= 1) {       // the unit's split lanes in this warp
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
            acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
            acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o);
            acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
        }
        if (wpu > 1) {                                       // and its other warps
            if (lane < 8) red4[warp * 8 + lane] = acc;
            if (lane == 0) red_s[warp] = sum;
            __syncthreads();
            if (tid % span < 8) {
                acc = red4[slot * wpu * 8 + c4];
                sum = red_s[slot * wpu];
                for (int j = 1; j < wpu; ++j) {
                    const float4 y = red4[(slot * wpu + j) * 8 + c4];
                    acc.x += y.x, acc.y += y.y, acc.z += y.z, acc.w += y.w;
                    sum += red_s[slot * wpu + j];
                }
            }
        }
        if (active && tid % span < 8) {                      // split lane 0 of the unit's first warp
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            *reinterpret_cast<uint2*>(O + (size_t)orow * D + col) =
                make_uint2(pack2<IS_BF16>(acc.x * inv, acc.y * inv), pack2<IS_BF16>(acc.z * inv, acc.w * inv));
            if (c4 == 0 && u % CH == 0) L[(b * H + h) * q_len + qi] = sum > 0.f ? lmax + logf(sum) : NEG_INF;
        }
    }
}

// ---------------------------------------------------------------- kernel 1: one split
#if WGMMA
// v5: as load_kv, into flash3's swizzled 64-column panels (wgmma.cuh's tile_off, bytes).
// Without v13's hints: with the evict-first policy on these copies (a ragged last tile, two
// warpgroups) the H200 raised an illegal instruction in decode_split (compute-sanitizer,
// decode_h200_memcheck_v13a.log); why is not known.
// NT threads (thread ``tid`` of them) share the tile: the block's NUM_THREADS, or v17's producer warp.
template <int NT = NUM_THREADS>
__device__ __forceinline__ void load_kv_wg(u32 K_st, u32 V_st, const u16* K, const u16* V,
                                           const int* bt_row, const CacheRows& cr, int key0, int kv_len,
                                           const Pages& pages, int tid = threadIdx.x) {
    static_assert(BLOCK_C * CHUNKS % NT == 0, "whole tiles per thread sweep");
    static_assert(NT == NUM_THREADS || PAGE_SIZE == 0, "pages: every thread's own entries (fetch_pages)");
    constexpr int ITERS = NT == NUM_THREADS ? LOAD_ITERS : BLOCK_C * CHUNKS / NT;
#pragma unroll (NT == NUM_THREADS ? ITERS : 1)    // the producer warp: few registers (setmaxnreg)
    for (int it = 0; it < ITERS; ++it) {
        const int c = it * NT + tid;
        const int r = c / CHUNKS, ch = c % CHUNKS;
        const int p = key0 + r;
        const bool valid = p < kv_len;
        const size_t off = valid ? kv_row_off(bt_row, cr, p, pages, it) : 0;
        cp_async_16(K_st + tile_off(BLOCK_C, r, ch), K + off + ch * 8, valid);
        cp_async_16(V_st + tile_off(BLOCK_C, r, ch), V + off + ch * 8, valid);
    }
}

#if TMA
// v9: K_j, V_j (keys key0 .. key0 + B_c - 1 of sequence b, KV head kvh, all below its kv_len)
// into one stage by the TMA unit, issued by one thread: per tensor one box of 64 columns x B_c
// keys per panel (the 128-byte swizzle writes the panels tile_off reads), all counted on the
// stage's mbarrier. A sequence's ragged last tile goes through load_kv_wg instead (cp.async
// zero-fills the keys past kv_len and reads none of them; a box would read them).
__device__ __forceinline__ void tma_kv(u32 K_st, u32 V_st, const TensorMap* map_k, const TensorMap* map_v,
                                       int key0, int kvh, int b, u32 bar) {
    mbar_expect_tx(bar, 2 * TILE_BYTES(BLOCK_C));
#pragma unroll
    for (int p = 0; p < HEAD_DIM / 64; ++p) {
#if EVICT_FIRST
        const unsigned long long policy = kv_policy();
        tma_load_4d_hint(K_st + p * PANEL_BYTES(BLOCK_C), map_k, p * 64, key0, kvh, b, bar, policy);
        tma_load_4d_hint(V_st + p * PANEL_BYTES(BLOCK_C), map_v, p * 64, key0, kvh, b, bar, policy);
#else
        tma_load_4d(K_st + p * PANEL_BYTES(BLOCK_C), map_k, p * 64, key0, kvh, b, bar);
        tma_load_4d(V_st + p * PANEL_BYTES(BLOCK_C), map_v, p * 64, key0, kvh, b, bar);
#endif
    }
}
#endif

// Two warpgroups: one block per SM, 256 threads of 150-215 registers (ptxas, d = 64, 128)
// take most of the register file; one warpgroup (64 rows): room for two blocks.
// v17: 384 or 160 threads, one block per SM (its tiles take most of the shared memory anyway).
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, NUM_WARPS == 4 && !PRODUCER ? 2 : 1)
decode_split(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
             u16* __restrict__ O, float* __restrict__ L, float* __restrict__ O_part,
             float* __restrict__ L_part, const int* __restrict__ block_table,
             const int* __restrict__ kv_lens, int batch, int q_len, int group, int kv_heads,
             int max_pages, long long kv_batch_stride, int kv_row_stride,
             long long kv_head_stride, int num_splits, int causal,
             float scale_log2, int* __restrict__ counters TMA_PARAMS KV_LENS_PARAMS TIMELINE_PARAMS) {
    constexpr int D = HEAD_DIM, B_c = BLOCK_C;
    const float NEG_INF = neg_inf();
    Timeline tl(TL_ARG);
#if TMA && TMAP_PREFETCH
    if (threadIdx.x == 0) {
        tma_prefetch_map(&tm_k);
        tma_prefetch_map(&tm_v);
    }
#endif
    pdl_launch_dependents();

    extern __shared__ __align__(128) unsigned char smem_raw[];   // aligned to 1 KiB below
    const u32 q_tile = (smem_addr(smem_raw) + 1023) & ~1023u;   // the swizzle repeats every 1 KiB
    const u32 kv_tiles = q_tile + TILE_BYTES(BLOCK_R);           // STAGES x (K_j, V_j)
    auto k_tile = [&](int st) { return kv_tiles + 2 * st * TILE_BYTES(B_c); };
    auto v_tile = [&](int st) { return kv_tiles + (2 * st + 1) * TILE_BYTES(B_c); };

    const int w = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int chunk = blockIdx.x, split = blockIdx.y;
    const int b = blockIdx.z / kv_heads, kvh = blockIdx.z % kv_heads;
    const int H = kv_heads * group;
    const int R = q_len * group;
    const int row0 = chunk * BLOCK_R;
    const int kv_len = KV_LEN_OF(b);
    // kv_batch_stride: between sequences (contiguous) or pages (paged)
    const CacheRows cr = {PAGE_SIZE ? (size_t)kv_batch_stride : (size_t)b * (size_t)kv_batch_stride,
                          kv_row_stride, (size_t)kvh * (size_t)kv_head_stride};
    const int* bt_row = block_table + (size_t)b * max_pages;
    const int shift = causal ? kv_len - q_len : kv_len - 1;
    const int T_c = cdiv(kv_len, B_c);
    const int t_begin = (int)((long long)split * T_c / num_splits);
    const int t_end = (int)((long long)(split + 1) * T_c / num_splits);

    auto q_chunk = [&](int c) {           // 16-byte chunk c of Q_i (row c / (d / 8)); 0 past R
        const int pr = row0 + packed_row(c / (D / 8));
        uint4 v = make_uint4(0, 0, 0, 0);
        if (pr < R) {
            const int qi = pr / group, hg = pr % group;
            v = *reinterpret_cast<const uint4*>(
                Q + ((size_t)(b * q_len + qi) * H + kvh * group + hg) * D + (c % (D / 8)) * 8);
        }
        return v;
    };
#if QFIRST   // v21: Q_i's loads in flight before any K/V tile is asked for (stored after the prologue)
    uint4 q_regs[Q_CHUNKS];
    if (threadIdx.x < NUM_THREADS) {
#pragma unroll
        for (int i = 0; i < Q_CHUNKS; ++i) q_regs[i] = q_chunk(threadIdx.x + i * NUM_THREADS);
    }
#endif

    // ---- prologue: the first AHEAD tiles in flight, then Q_i (generic 16-byte stores). A tile's
    // stage is free once the GEMMs that read it are done: tile j - 1's at tile j (v11: V_{j-1}
    // is read during tile j, so its stage is free at tile j + 1).
    Pages pages;
#if !PRODUCER
    constexpr int AHEAD = OVERLAP ? STAGES - 2 : STAGES - 1;
#endif
#if TMA   // stage st's mbarrier completes a phase each time a tile lands in it by TMA
    __shared__ __align__(8) unsigned long long kv_full[STAGES];
    auto ragged = [&](int jt) { return (jt + 1) * B_c > kv_len; };
#if !PRODUCER
    auto issue = [&](int jt, int st) {    // tile jt into stage st: TMA, or the ragged tile by cp.async
        if (ragged(jt)) {
            load_kv_wg(k_tile(st), v_tile(st), K, V, bt_row, cr, jt * B_c, kv_len, pages);
            cp_async_commit();
        } else if (threadIdx.x == 0) {
            tma_kv(k_tile(st), v_tile(st), &tm_k, &tm_v, jt * B_c, kvh, b, smem_addr(&kv_full[st]));
        }
    };
#else          // v17: stage st is free once every consumer warp has arrived after its GEMMs
    __shared__ __align__(8) unsigned long long kv_empty[STAGES];
#endif
    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(smem_addr(&kv_full[st]), 1);
#if PRODUCER
            mbar_init(smem_addr(&kv_empty[st]), NUM_WARPS);
#endif
        }
        mbar_init_fence();
    }
    __syncthreads();                      // the mbarriers initialised before anyone waits
#if PRODUCER
    if (threadIdx.x >= NUM_THREADS) {     // v17: the producer warp, tile n of the split into stage n % S
#if NUM_WARPS == 8
        setmaxnreg_dec<PRODUCER_REGS>();
#endif
        const int lane_p = threadIdx.x - NUM_THREADS;
        if (lane_p < 32)                  // (beside two warpgroups: its first warp)
        for (int n = 0; n < t_end - t_begin; ++n) {
            const int jt = t_begin + n, st = n % STAGES;
            if (n >= STAGES) mbar_wait(smem_addr(&kv_empty[st]), (n / STAGES - 1) & 1);   // tile n - S read
#if STAGGER
            else if (n > 0) mbar_wait(smem_addr(&kv_full[n - 1]), 0);                      // v19: n - 1 landed
#endif
            if (ragged(jt)) {             // cp.async zero-fills past kv_len; landed, then announced
                load_kv_wg<32>(k_tile(st), v_tile(st), K, V, bt_row, cr, jt * B_c, kv_len, pages, lane_p);
                cp_async_commit();
                cp_async_wait<0>();
                fence_proxy_async();      // this lane's copies visible to wgmma (async proxy)
                __syncwarp();
                if (lane_p == 0) mbar_arrive(smem_addr(&kv_full[st]));
            } else if (lane_p == 0) {
                tma_kv(k_tile(st), v_tile(st), &tm_k, &tm_v, jt * B_c, kvh, b, smem_addr(&kv_full[st]));
            }
            if (n == (STAGGER ? 0 : min(STAGES, t_end - t_begin) - 1)) tl.mark_by(TL_ISSUED, lane_p == 0);
        }
    } else {                              // the consumers: the rest of the kernel (setmaxnreg acts
#if NUM_WARPS == 8                        // only where each role is one branch of an if/else)
    setmaxnreg_inc<CONSUMER_REGS>();
#endif
#else
    for (int st = 0; st < AHEAD && t_begin + st < t_end; ++st) issue(t_begin + st, st);
    tl.mark(TL_ISSUED);
#endif
#else
#pragma unroll
    for (int st = 0; st < AHEAD; ++st) {
        if (t_begin + st < t_end) {
            fetch_pages(pages, bt_row, (t_begin + st) * B_c, kv_len);
            load_kv_wg(k_tile(st), v_tile(st), K, V, bt_row, cr, (t_begin + st) * B_c, kv_len, pages);
        }
        cp_async_commit();
    }
    if (t_begin + AHEAD < t_end) fetch_pages(pages, bt_row, (t_begin + AHEAD) * B_c, kv_len);
    tl.mark(TL_ISSUED);
#endif
    unsigned char* q_gen = smem_raw + (q_tile - smem_addr(smem_raw));   // generic pointer to Q_i
#if QFIRST
#pragma unroll
    for (int i = 0; i < Q_CHUNKS; ++i) {
        const int c = threadIdx.x + i * NUM_THREADS;
        *reinterpret_cast<uint4*>(q_gen + tile_off(BLOCK_R, c / (D / 8), c % (D / 8))) = q_regs[i];
    }
#else
    for (int c = threadIdx.x; c < BLOCK_R * (D / 8); c += NUM_THREADS)
        *reinterpret_cast<uint4*>(q_gen + tile_off(BLOCK_R, c / (D / 8), c % (D / 8))) = q_chunk(c);
#endif
    fence_proxy_async();                  // Q_i's stores visible to wgmma (the loop's barrier orders them)
#if PRODUCER                              // (v17: no such barrier; the consumers' own)
    named_sync(BAR_CONSUMERS, NUM_THREADS);
#endif

    // This thread's rows of the block: row_w + g and row_w + g + 8 (accumulator e: + 8 (e / 2)).
    const int row_w = w * 64 + warp * 16;
    float o[O_REGS];
#pragma unroll
    for (int k = 0; k < O_REGS; ++k) o[k] = 0.f;
    float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f}, alpha[2];
    float s[S_REGS];
    u32 p[P_REGS];
    int limit[2];                         // last visible key of rows g, g + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int pr = row0 + packed_row(row_w + g + 8 * h);
        limit[h] = min(kv_len - 1, shift + (causal ? pr / group : 0));
    }

    // S_j masked (the ragged end, the causal diagonal), then the online softmax: P_j in s
    auto mask_softmax = [&](int j) {
        const int key0 = j * B_c;
        if (key0 + B_c - 1 > shift) {
#pragma unroll
            for (int n = 0; n < B_c / 8; ++n)
#pragma unroll
                for (int e = 0; e < (HALF_ROWS ? 2 : 4); ++e)   // v16: rows g + 8 pad
                    if (key0 + n * 8 + 2 * t + (e & 1) > limit[e >> 1]) s[4 * n + e] = NEG_INF;
        }
        softmax_step<HALF_ROWS ? 1 : 2, (bool)TREE_SOFTMAX>(s, m_i, l_i, alpha, scale_log2);
    };

#if PRODUCER      // v17: tile j's stage filled (TMA, or the producer's cp.async), and freed once this
    auto full = [&](int j) {                          // warp's GEMMs have read it (the last warp to
        const int n = j - t_begin;                    // arrive frees it)
        tl.wait_begin();
        mbar_wait(smem_addr(&kv_full[n % STAGES]), (n / STAGES) & 1);
        tl.wait_end();
    };
    auto freed = [&](int j) {
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(&kv_empty[(j - t_begin) % STAGES]));
    };
#endif
#if PINGPONG && PRODUCER   // v22, v23: warpgroup w waits for its turn at BAR_TURN + w and hands it
    // over at the other's; warpgroup 1 hands over first (at the start) and not after its last,
    // so every phase has one arrive and one sync. (Constant ids: ptxas reserves all 16 barriers
    // for a computed one.)
    auto turn = [&]() {
        if (w == 0) named_sync(BAR_TURN, 2 * 128);
        else named_sync(BAR_TURN + 1, 2 * 128);
    };
    auto hand_over = [&](bool last) {
        if (w == 0) named_arrive(BAR_TURN + 1, 2 * 128);
        else if (!last) named_arrive(BAR_TURN, 2 * 128);
    };
#endif
#if PRODUCER && OVERLAP && !TURN_PV   // v20: flash3.cu's v4 order. Tile t_begin's S alone; then S_j and
    // P_{j-1} V_{j-1} issued together, S_j's softmax while P V runs. (One loop with a guarded
    // P V would have ptxas serialize every wgmma: warning C7514.)
    if (t_begin < t_end) {
        full(t_begin);
        tl.mark(TL_FIRST);
        gemm_qk(s, q_tile, w, k_tile(0));
        wgmma_wait<0>();
        fence_regs(s);
        mask_softmax(t_begin);                        // O_i = 0: nothing to rescale
        convert_p(s, p);
    }
    for (int j = t_begin + 1; j < t_end; ++j) {
        const int st = (j - t_begin) % STAGES, prev = (j - 1 - t_begin) % STAGES;
        full(j);
        gemm_qk(s, q_tile, w, k_tile(st));            // S_j = Q_w K_j^T
        gemm_pv(o, p, v_tile(prev));                  // O_i += P_{j-1} V_{j-1}
        wgmma_wait<1>();                              // S_j done, P V running
        fence_regs(s);
        mask_softmax(j);
        wgmma_wait<0>();                              // P_{j-1} V_{j-1} done: O_i, P and the stage free
        fence_regs(o);
        fence_regs(p);
        freed(j - 1);
        rescale_o(o, alpha);
        convert_p(s, p);
    }
#elif PRODUCER && TURN_PV   // v23: a turn issues P_j V_j and S_{j+1} together (FlashAttention-3's)
    // Each warpgroup has T + 1 turns for the split's T tiles (the first S, then P_{j-1} V_{j-1}
    // with S_j, then the last P V).
    // After a turn's GEMMs: both waited for (S_j, and P_{j-1} V_{j-1}: O_i, P free), tile j - 1's
    // stage freed, the softmax of S_j. Each S is waited for in the iteration that issues it, and
    // the first tile's turn (S alone) and the last's (P V alone) are peeled off the loop: an S
    // that crosses the loop's back edge, or a GEMM issued under a condition, would have ptxas
    // serialize every wgmma (C7515, C7518).
    auto softmax_of = [&](int j) {
        wgmma_wait<0>();
        fence_regs(s);
        fence_regs(o);
        fence_regs(p);
        if (j > t_begin) freed(j - 1);                // V_{j-1} read
        mask_softmax(j);
        rescale_o(o, alpha);
        convert_p(s, p);
    };
    if (t_begin < t_end) {                            // (an empty split: no turns at all)
        if (w == 1) named_arrive(BAR_TURN, 2 * 128);  // warpgroup 0 has the first turn
        full(t_begin);
        tl.mark(TL_FIRST);
        turn();
        gemm_qk(s, q_tile, w, k_tile(0));             // S_{t_begin}
        hand_over(false);
        softmax_of(t_begin);
        for (int j = t_begin + 1; j < t_end; ++j) {
            full(j);
            turn();           // the other's GEMMs are queued ahead of these; its softmax runs beside them
#if OVERLAP       // v24: S_j first, and its softmax while P_{j-1} V_{j-1} runs (v20's order)
            gemm_qk(s, q_tile, w, k_tile((j - t_begin) % STAGES));
            gemm_pv(o, p, v_tile((j - 1 - t_begin) % STAGES));
            hand_over(false);
            wgmma_wait<1>();                          // S_j done, P_{j-1} V_{j-1} running
            fence_regs(s);
            mask_softmax(j);
            wgmma_wait<0>();                          // P_{j-1} V_{j-1} done: O_i, P, V_{j-1} free
            fence_regs(o);
            fence_regs(p);
            freed(j - 1);
            rescale_o(o, alpha);
            convert_p(s, p);
#else
            gemm_pv(o, p, v_tile((j - 1 - t_begin) % STAGES));
            gemm_qk(s, q_tile, w, k_tile((j - t_begin) % STAGES));
            hand_over(false);
            softmax_of(j);
#endif
        }
        turn();                                       // the last tile's P V alone
        gemm_pv(o, p, v_tile((t_end - 1 - t_begin) % STAGES));
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
        hand_over(true);
        freed(t_end - 1);
    }
#else
#if PINGPONG && PRODUCER   // v22: warpgroup 0 has the first turn (each phase: one arrive, one sync)
    if (w == 1 && t_begin < t_end) named_arrive(BAR_TURN, 2 * 128);
#endif
    for (int j = t_begin; j < t_end; ++j) {
#if PRODUCER     // v17: nothing to issue
        full(j);
#elif TMA
        tl.wait_begin();
        {
            const int n = j - t_begin;
            if (ragged(j)) {              // the last tile (its cp.async group the last committed)
                cp_async_wait<0>();
                fence_proxy_async();
            } else {                      // phase n / STAGES of its stage: every earlier tile in
                mbar_wait(smem_addr(&kv_full[n % STAGES]), (n / STAGES) & 1);   // it came by TMA
            }
        }
        __syncthreads();                  // tile j has landed, and tile j + AHEAD's stage is free
        tl.wait_end();
        if (j + AHEAD < t_end) issue(j + AHEAD, (j + AHEAD - t_begin) % STAGES);
#else
        tl.wait_begin();
        cp_async_wait<AHEAD - 1>();       // tile j has landed (this thread's part) ...
        fence_proxy_async();              // ... visible to wgmma (async proxy) ...
        __syncthreads();                  // ... everyone's; and tile j + AHEAD's stage is free
        tl.wait_end();
        {
            const int jn = j + AHEAD, st = (jn - t_begin) % STAGES;
            if (jn < t_end)
                load_kv_wg(k_tile(st), v_tile(st), K, V, bt_row, cr, jn * B_c, kv_len, pages);
            cp_async_commit();
            if (jn + 1 < t_end) fetch_pages(pages, bt_row, (jn + 1) * B_c, kv_len);
        }
#endif
        if (j == t_begin) tl.mark(TL_FIRST);
        const int st = (j - t_begin) % STAGES;
#if PINGPONG && PRODUCER   // v22: this warpgroup's turn, then the other's (none after 1's last S)
        turn();
#elif PINGPONG    // v9: warpgroup 1 issues S after warpgroup 0 has, so its GEMMs run during 0's softmax
        if (w == 1) named_sync(BAR_PINGPONG, 2 * 128);
#endif
        gemm_qk(s, q_tile, w, k_tile(st));            // S = Q_w K_j^T
#if PINGPONG && PRODUCER
        hand_over(j + 1 == t_end);
#elif PINGPONG
        if (w == 0) named_arrive(BAR_PINGPONG, 2 * 128);
#endif
#if OVERLAP       // v11: O_i += P_{j-1} V_{j-1} on the tensor cores during S_j's softmax
        if (j > t_begin) gemm_pv(o, p, v_tile((j - 1 - t_begin) % STAGES));
#endif
#if OVERLAP
        if (j > t_begin) wgmma_wait<1>();             // S_j done (committed first), P V running
        else wgmma_wait<0>();
#else
        wgmma_wait<0>();
#endif
        fence_regs(s);
        mask_softmax(j);
#if OVERLAP
        wgmma_wait<0>();                              // P_{j-1} V_{j-1} done: O_i and P free
        fence_regs(o);
        fence_regs(p);
        rescale_o(o, alpha);
        convert_p(s, p);
#else
        rescale_o(o, alpha);
        convert_p(s, p);
        gemm_pv(o, p, v_tile(st));                    // O_i += P V_j
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
#endif
#if PRODUCER      // v17: this warp's GEMMs have read the stage
        freed(j);
#endif
    }
#endif   // v20's loop or the others
#if OVERLAP && !TURN_PV   // v11, v20: the last tile's O_i += P V (each P V trails its S by a tile)
    if (t_begin < t_end) {                            // the last tile's O_i += P V
        gemm_pv(o, p, v_tile((t_end - 1 - t_begin) % STAGES));
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
    }
#endif
#if !TMA
    cp_async_wait<0>();
#endif
    tl.mark(TL_LOOP_END);

    // ---- O = diag(l_i)^-1 O_i and L = m_i + log l_i (rows that saw no key: O 0, L -inf), to O,
    // L (one split) or to this split's partial O, L; each thread its own rows and columns
    const float LN2 = 0.6931471805599453f;
    const int NR = batch * q_len * H;
#pragma unroll
    for (int h = 0; h < (HALF_ROWS ? 1 : 2); ++h) {
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 1);
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 2);
        const int pr = row0 + packed_row(row_w + g + 8 * h);
        if (pr >= R) continue;
        const float inv = l_i[h] > 0.f ? 1.f / l_i[h] : 0.f;
        const float lse = l_i[h] > 0.f ? (m_i[h] + __log2f(l_i[h])) * LN2 : NEG_INF;
        const int qi = pr / group, hh = kvh * group + pr % group;
        const int orow = (b * q_len + qi) * H + hh;
        if (num_splits == 1) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<u32*>(O + (size_t)orow * D + n * 8 + 2 * t) =
                    pack2<IS_BF16>(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
            if (t == 0) L[(b * H + hh) * q_len + qi] = lse;
        } else {
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<float2*>(O_part + ((size_t)split * NR + orow) * D + n * 8 + 2 * t) =
                    make_float2(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
            if (t == 0) L_part[(size_t)split * NR + orow] = lse;
        }
    }
#if FUSED
    if (num_splits > 1) {
        group_barrier(counters, blockIdx.z * gridDim.x + chunk, num_splits);
        fused_combine(O_part, L_part, O, L, reinterpret_cast<float*>(smem_raw + (kv_tiles - smem_addr(smem_raw))),
                      split, num_splits, NR, b, kvh, row0, R, group, H, q_len);
    }
#else
    (void)counters;
#endif
#if PRODUCER
    }                                     // the consumers' branch
#endif
    tl.exit();
}
#else
extern "C" __global__ void __launch_bounds__(NUM_THREADS)
decode_split(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
             u16* __restrict__ O, float* __restrict__ L, float* __restrict__ O_part,
             float* __restrict__ L_part, const int* __restrict__ block_table,
             const int* __restrict__ kv_lens, int batch, int q_len, int group, int kv_heads,
             int max_pages, long long kv_batch_stride, int kv_row_stride,
             long long kv_head_stride, int num_splits, int causal,
             float scale_log2, int* __restrict__ counters KV_LENS_PARAMS TIMELINE_PARAMS) {
    constexpr int D = HEAD_DIM, B_c = BLOCK_C;
    constexpr int NT = KW / 8;     // 8-key n-tiles of S per warp
    constexpr int DT = D / 8;      // 8-column n-tiles of O_i
    constexpr int KQ = D / 16;     // k-steps of Q K^T
    constexpr int KP = KW / 16;    // k-steps of P V
    const float NEG_INF = neg_inf();
    Timeline tl(TL_ARG);
    pdl_launch_dependents();

    extern __shared__ __align__(128) u16 smem[];
    u16* Q_s = smem;                              // B_r x d
    u16* KV_s = Q_s + BLOCK_R * D;                // STAGES x (K_j, V_j), each B_c x d

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp % ROW_WARPS, wn = warp / ROW_WARPS;
    const int g = lane / 4, t = lane % 4;         // mma fragment row group, thread in group
    const int chunk = blockIdx.x, split = blockIdx.y;
    const int b = blockIdx.z / kv_heads, kvh = blockIdx.z % kv_heads;
    const int H = kv_heads * group;
    const int R = q_len * group;                  // packed rows of this KV head
    const int row0 = chunk * BLOCK_R;             // first packed row of this block
    const int kv_len = KV_LEN_OF(b);
    // kv_batch_stride: between sequences (contiguous) or pages (paged)
    const CacheRows cr = {PAGE_SIZE ? (size_t)kv_batch_stride : (size_t)b * (size_t)kv_batch_stride,
                          kv_row_stride, (size_t)kvh * (size_t)kv_head_stride};
    const int* bt_row = block_table + (size_t)b * max_pages;

    // Key k is visible to query position qi when k <= limit(qi) (and k < kv_len).
    const int shift = causal ? kv_len - q_len : kv_len - 1;
    // Every chunk streams all T_c tiles (its last rows may see fewer keys: the mask hides
    // them), so each chunk reads the K/V bytes flashsim's nest counts per Q tile.
    const int T_c = cdiv(kv_len, B_c);
    const int t_begin = (int)((long long)split * T_c / num_splits);
    const int t_end = (int)((long long)(split + 1) * T_c / num_splits);

    // ---- prologue: the first STAGES - 1 tiles in flight, then Q_i (plain 16-byte loads).
    // Invariant of the loop below: at iteration j, ``pages`` holds tile j + STAGES - 1's.
    Pages pages;
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (t_begin + st < t_end) {
            fetch_pages(pages, bt_row, (t_begin + st) * B_c, kv_len);
            load_kv(KV_s + 2 * st * KV_TILE_ELEMS, KV_s + (2 * st + 1) * KV_TILE_ELEMS, K, V, bt_row,
                    cr, (t_begin + st) * B_c, kv_len, pages);
        }
        cp_async_commit();
    }
#if PHASED   // v14: K of the first tile only
    if (t_begin < t_end)
        load_kv<true, false>(KV_s, KV_s + KV_TILE_ELEMS, K, V, bt_row, cr, t_begin * B_c, kv_len, pages);
    cp_async_commit();
#endif
    if (t_begin + STAGES - 1 < t_end) fetch_pages(pages, bt_row, (t_begin + STAGES - 1) * B_c, kv_len);
    tl.mark(TL_ISSUED);
    for (int c = threadIdx.x; c < BLOCK_R * (D / 8); c += NUM_THREADS) {
        const int r = c / (D / 8), col = (c % (D / 8)) * 8, pr = row0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (pr < R) {
            const int qi = pr / group, hg = pr % group;
            v = *reinterpret_cast<const uint4*>(
                Q + ((size_t)(b * q_len + qi) * H + kvh * group + hg) * D + col);
        }
        *reinterpret_cast<uint4*>(Q_s + tile_off(r, col)) = v;
    }
    __syncthreads();
    u32 q_frag[KQ][4];
#pragma unroll
    for (int kq = 0; kq < KQ; ++kq)
        ldmatrix_x4(q_frag[kq][0], q_frag[kq][1], q_frag[kq][2], q_frag[kq][3],
                    smem_addr(Q_s + tile_off(wm * 16 + lane % 16, kq * 16 + (lane / 16) * 8)));

    // Accumulators: rows wm * 16 + g (elements 0, 1) and + 8 (2, 3) of the block.
    float o_acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o_acc[dt][0] = o_acc[dt][1] = o_acc[dt][2] = o_acc[dt][3] = 0.f;
    float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};   // base 2; l_i: this thread's columns
    int limit[2];                                            // last visible key of rows g, g + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int pr = row0 + wm * 16 + g + 8 * h;
        limit[h] = min(kv_len - 1, shift + (causal ? pr / group : 0));
    }

    for (int j = t_begin; j < t_end; ++j) {
        tl.wait_begin();
#if PHASED
        cp_async_wait<0>();               // K_j has landed (this thread's part) ...
        __syncthreads();                  // ... everyone's; and every warp is done with V_{j-1}
        tl.wait_end();
        load_kv<false, true>(KV_s, KV_s + KV_TILE_ELEMS, K, V, bt_row, cr, j * B_c, kv_len, pages);
        cp_async_commit();
#else
        cp_async_wait<STAGES - 2>();      // tile j has landed (this thread's part) ...
        __syncthreads();                  // ... everyone's; and tile j - 1's stage is free
        tl.wait_end();
        {
            const int jn = j + STAGES - 1, st = (jn - t_begin) % STAGES;
            if (jn < t_end)
                load_kv(KV_s + 2 * st * KV_TILE_ELEMS, KV_s + (2 * st + 1) * KV_TILE_ELEMS, K, V,
                        bt_row, cr, jn * B_c, kv_len, pages);
            cp_async_commit();
            if (jn + 1 < t_end) fetch_pages(pages, bt_row, (jn + 1) * B_c, kv_len);   // next one
        }
#endif
        if (j == t_begin) tl.mark(TL_FIRST);
        const int st = (j - t_begin) % STAGES;
        const u16* K_j = KV_s + 2 * st * KV_TILE_ELEMS;
        const u16* V_j = K_j + KV_TILE_ELEMS;
        const int kw0 = wn * KW;          // this warp's first key row of the tile

        // ---- S = Q_i K_j^T on this warp's 16 rows x KW keys (fp32)
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int kq = 0; kq < KQ; ++kq) {
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                u32 b0, b1, b2, b3;   // (b0, b1): n-tile 2np; (b2, b3): n-tile 2np + 1
                ldmatrix_x4(b0, b1, b2, b3,
                            smem_addr(K_j + tile_off(kw0 + np * 16 + lane % 8 + (lane / 16) * 8,
                                                     kq * 16 + ((lane / 8) % 2) * 8)));
                mma_16816<IS_BF16>(s[2 * np], q_frag[kq], b0, b1);
                mma_16816<IS_BF16>(s[2 * np + 1], q_frag[kq], b2, b3);
            }
        }

        // ---- mask: keys past a row's limit (ragged end of the sequence, causal diagonal)
        const int key0 = j * B_c + kw0;
        if (key0 + KW - 1 > shift) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (key0 + nt * 8 + 2 * t + (e & 1) > limit[e >> 1]) s[nt][e] = NEG_INF;
        }

        // ---- online softmax (fp32, base 2): m_new, alpha, P, l_i, O_i *= alpha
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_i[h], mx * scale_log2);
            const float m_use = (m_new == NEG_INF) ? 0.f : m_new;   // nothing visible yet
            const float alpha = fast_exp2(m_i[h] - m_use);
            float rowsum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[nt][2 * h] = fast_exp2(fmaf(s[nt][2 * h], scale_log2, -m_use));
                s[nt][2 * h + 1] = fast_exp2(fmaf(s[nt][2 * h + 1], scale_log2, -m_use));
                rowsum += s[nt][2 * h] + s[nt][2 * h + 1];
            }
            l_i[h] = l_i[h] * alpha + rowsum;
            m_i[h] = m_new;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                o_acc[dt][2 * h] *= alpha;
                o_acc[dt][2 * h + 1] *= alpha;
            }
        }

#if PHASED
        tl.wait_begin();
        cp_async_wait<0>();               // V_j has landed (this thread's part) ...
        __syncthreads();                  // ... everyone's; and every warp is done with K_j
        tl.wait_end();
        if (j + 1 < t_end)
            load_kv<true, false>(KV_s, KV_s + KV_TILE_ELEMS, K, V, bt_row, cr, (j + 1) * B_c, kv_len, pages);
        cp_async_commit();
#endif
        // ---- O_i += P V_j (P from the S accumulators, A operand layout)
#pragma unroll
        for (int kp = 0; kp < KP; ++kp) {
            u32 p_frag[4];
            p_frag[0] = pack2<IS_BF16>(s[2 * kp][0], s[2 * kp][1]);
            p_frag[1] = pack2<IS_BF16>(s[2 * kp][2], s[2 * kp][3]);
            p_frag[2] = pack2<IS_BF16>(s[2 * kp + 1][0], s[2 * kp + 1][1]);
            p_frag[3] = pack2<IS_BF16>(s[2 * kp + 1][2], s[2 * kp + 1][3]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                u32 b0, b1, b2, b3;   // (b0, b1): d-tile 2dp; (b2, b3): d-tile 2dp + 1
                ldmatrix_x4_trans(b0, b1, b2, b3,
                                  smem_addr(V_j + tile_off(kw0 + kp * 16 + lane % 16,
                                                           dp * 16 + (lane / 16) * 8)));
                mma_16816<IS_BF16>(o_acc[2 * dp], p_frag, b0, b1);
                mma_16816<IS_BF16>(o_acc[2 * dp + 1], p_frag, b2, b3);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();                      // every warp is done with the K/V buffers
    tl.mark(TL_LOOP_END);

    // ---- the KEY_WARPS partial states of each row -> shared memory (unnormalized O_i, m_i, l_i)
    float* O_w = reinterpret_cast<float*>(KV_s);          // KEY_WARPS x B_r x d
    float* m_w = O_w + KEY_WARPS * BLOCK_R * D;           // KEY_WARPS x B_r
    float* l_w = m_w + KEY_WARPS * BLOCK_R;               // KEY_WARPS x B_r
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 1);
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 2);
        const int r = wm * 16 + g + 8 * h;
        if (t == 0) {
            m_w[wn * BLOCK_R + r] = m_i[h];
            l_w[wn * BLOCK_R + r] = l_i[h];
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<float2*>(O_w + (wn * BLOCK_R + r) * D + dt * 8 + 2 * t) =
                make_float2(o_acc[dt][2 * h], o_acc[dt][2 * h + 1]);
    }
    __syncthreads();

    // ---- merge them: m = max_w m_w, l = sum_w 2^(m_w - m) l_w, O = sum_w 2^(m_w - m) O_w / l;
    // write O, L (one split) or the partial O, L of this split (several)
    const float LN2 = 0.6931471805599453f;
    const int NR = batch * q_len * H;                       // output rows
    for (int c = threadIdx.x; c < BLOCK_R * (D / 4); c += NUM_THREADS) {
        const int r = c / (D / 4), col = (c % (D / 4)) * 4, pr = row0 + r;
        if (pr >= R) continue;
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < KEY_WARPS; ++w) m = fmaxf(m, m_w[w * BLOCK_R + r]);
        float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < KEY_WARPS; ++w) {
            const float mw = m_w[w * BLOCK_R + r];
            if (mw == NEG_INF) continue;                    // saw no visible key
            const float a = fast_exp2(mw - m);
            l += a * l_w[w * BLOCK_R + r];
            const float4 ow = *reinterpret_cast<const float4*>(O_w + (w * BLOCK_R + r) * D + col);
            o[0] += a * ow.x, o[1] += a * ow.y, o[2] += a * ow.z, o[3] += a * ow.w;
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse = l > 0.f ? (m + __log2f(l)) * LN2 : NEG_INF;
        const int qi = pr / group, h = kvh * group + pr % group;
        const int orow = (b * q_len + qi) * H + h;
        if (num_splits == 1) {
            *reinterpret_cast<uint2*>(O + (size_t)orow * D + col) =
                make_uint2(pack2<IS_BF16>(o[0] * inv, o[1] * inv), pack2<IS_BF16>(o[2] * inv, o[3] * inv));
            if (col == 0) L[(b * H + h) * q_len + qi] = lse;
        } else {
            *reinterpret_cast<float4*>(O_part + ((size_t)split * NR + orow) * D + col) =
                make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
            if (col == 0) L_part[(size_t)split * NR + orow] = lse;
        }
    }
#if FUSED
    if (num_splits > 1) {
        group_barrier(counters, blockIdx.z * gridDim.x + chunk, num_splits);
        fused_combine(O_part, L_part, O, L, reinterpret_cast<float*>(KV_s), split, num_splits, NR,
                      b, kvh, row0, R, group, H, q_len);
    }
#else
    (void)counters;
#endif
    tl.exit();
}

#endif   // WGMMA

// ---------------------------------------------------------------- kernel 2: combine the splits
// acc[0 .. CPL) += w x a lane's CPL columns of one partial O_s row (one vector load).
__device__ __forceinline__ void add_weighted(float* acc, const float* src, float w) {
#if HEAD_DIM == 128
    const float4 x = *reinterpret_cast<const float4*>(src);
    acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
#else
    const float2 x = *reinterpret_cast<const float2*>(src);
    acc[0] += w * x.x, acc[1] += w * x.y;
#endif
}

// COMBINE 1, 2: one warp per output row orow = (b q_len + qi) H + h; lane l owns columns
// l CPL .. + CPL - 1. COMBINE 3: one block per output row, its 4 warps splitting the splits.
// L = log sum_s exp(L_s) (empty splits: L_s = -inf, weight 0), O = sum_s exp(L_s - L) O_s.
// v4: at most 64 registers (48 at d = 64), so that as many blocks share an SM as of v3 (62 and
// 43 registers): with 16 loads a warp and no bound, 107 let 4 (decode_h200_v10a.json: slower
// than v3 at B = 64, MQA, where 2048 and more rows of 2 splits make several waves of combine
// blocks)
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS, COMBINE == 4 ? (HEAD_DIM == 64 ? 10 : 8) : 1)
decode_combine(const float* __restrict__ O_part, const float* __restrict__ L_part,
               u16* __restrict__ O, float* __restrict__ L, int NR, int num_splits, int H,
               int q_len) {
    constexpr int D = HEAD_DIM, CPL = D / 32;
    pdl_wait();                           // decode_split's partials are all written
#if COMBINE == 3
    // v3: few output rows (small batch x heads) and many splits left v2 with a few warps each
    // walking S splits in rounds of 8 dependent-latency loads; here every row has 4 warps,
    // warp w takes splits w, w + 4, ..., so a row's loads are in flight 4 times as wide.
    __shared__ float w_s[MAX_SPLITS_COMBINE];
    __shared__ float part[COMBINE_WARPS][D];
    __shared__ float red[COMBINE_WARPS];
    const int orow = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float NEG_INF = neg_inf();
    float lmax = NEG_INF;
    for (int s = threadIdx.x; s < num_splits; s += COMBINE_THREADS)
        lmax = fmaxf(lmax, L_part[(size_t)s * NR + orow]);
    lmax = warp_max(lmax);
    if (lane == 0) red[warp] = lmax;
    __syncthreads();
    lmax = red[0];
#pragma unroll
    for (int k = 1; k < COMBINE_WARPS; ++k) lmax = fmaxf(lmax, red[k]);
    __syncthreads();                                     // red is reused for the sum below
    float sum = 0.f;
    for (int s = threadIdx.x; s < num_splits; s += COMBINE_THREADS) {
        const float ls = L_part[(size_t)s * NR + orow];
        const float w = ls == NEG_INF ? 0.f : expf(ls - lmax);   // empty split: weight 0
        w_s[s] = w;
        sum += w;
    }
    sum = warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = 0.f;
#pragma unroll
    for (int k = 0; k < COMBINE_WARPS; ++k) sum += red[k];
    float acc[CPL];
#pragma unroll
    for (int k = 0; k < CPL; ++k) acc[k] = 0.f;
#pragma unroll 8
    for (int s = warp; s < num_splits; s += COMBINE_WARPS) {
        const float w = w_s[s];
        add_weighted(acc, O_part + ((size_t)s * NR + orow) * D + lane * CPL, w);
    }
#pragma unroll
    for (int k = 0; k < CPL; ++k) part[warp][lane * CPL + k] = acc[k];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
        acc[k] = part[0][lane * CPL + k];
#pragma unroll
        for (int x = 1; x < COMBINE_WARPS; ++x) acc[k] += part[x][lane * CPL + k];
    }
#elif COMBINE == 4
    // v4: warp w holds splits w, w + 4, ...; each round loads COMBINE4_LOADS of them (L_s and a
    // lane's columns of O_s) with nothing waiting between, then folds them into the warp's
    // running (max, sum, acc). Splits past num_splits and empty ones (L_s = -inf) weigh 0.
    __shared__ float part[COMBINE_WARPS][D];
    __shared__ float red_m[COMBINE_WARPS], red_l[COMBINE_WARPS];
    const int orow = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float NEG_INF = neg_inf();
    float lmax = NEG_INF, sum = 0.f, acc[CPL];
#pragma unroll
    for (int k = 0; k < CPL; ++k) acc[k] = 0.f;
    for (int s0 = warp; s0 < num_splits; s0 += COMBINE_WARPS * COMBINE4_LOADS) {
        float ls[COMBINE4_LOADS], x[COMBINE4_LOADS][CPL];
#pragma unroll
        for (int i = 0; i < COMBINE4_LOADS; ++i) {
            const int s = s0 + i * COMBINE_WARPS;
            ls[i] = NEG_INF;
#pragma unroll
            for (int k = 0; k < CPL; ++k) x[i][k] = 0.f;
            if (s < num_splits) {
                ls[i] = L_part[(size_t)s * NR + orow];
                const float* src = O_part + ((size_t)s * NR + orow) * D + lane * CPL;
#if HEAD_DIM == 128
                const float4 v = *reinterpret_cast<const float4*>(src);
                x[i][0] = v.x, x[i][1] = v.y, x[i][2] = v.z, x[i][3] = v.w;
#else
                const float2 v = *reinterpret_cast<const float2*>(src);
                x[i][0] = v.x, x[i][1] = v.y;
#endif
            }
        }
        float m = lmax;
#pragma unroll
        for (int i = 0; i < COMBINE4_LOADS; ++i) m = fmaxf(m, ls[i]);
        if (m == NEG_INF) continue;                      // nothing but empty splits so far
        const float a = lmax == NEG_INF ? 0.f : expf(lmax - m);
        sum *= a;
#pragma unroll
        for (int k = 0; k < CPL; ++k) acc[k] *= a;
#pragma unroll
        for (int i = 0; i < COMBINE4_LOADS; ++i) {
            const float w = ls[i] == NEG_INF ? 0.f : expf(ls[i] - m);
            sum += w;
#pragma unroll
            for (int k = 0; k < CPL; ++k) acc[k] += w * x[i][k];
        }
        lmax = m;
    }
    if (lane == 0) red_m[warp] = lmax, red_l[warp] = sum;
#pragma unroll
    for (int k = 0; k < CPL; ++k) part[warp][lane * CPL + k] = acc[k];
    __syncthreads();
    if (warp != 0) return;
    lmax = red_m[0];
#pragma unroll
    for (int x = 1; x < COMBINE_WARPS; ++x) lmax = fmaxf(lmax, red_m[x]);
    sum = 0.f;
#pragma unroll
    for (int k = 0; k < CPL; ++k) acc[k] = 0.f;
#pragma unroll
    for (int x = 0; x < COMBINE_WARPS; ++x) {            // in warp order: the same bits every run
        const float a = red_m[x] == NEG_INF ? 0.f : expf(red_m[x] - lmax);
        sum += a * red_l[x];
#pragma unroll
        for (int k = 0; k < CPL; ++k) acc[k] += a * part[x][lane * CPL + k];
    }
#else
    const int orow = blockIdx.x * COMBINE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (orow >= NR) return;
    const float NEG_INF = neg_inf();
    float lmax = NEG_INF;
    float sum = 0.f, acc[CPL];
#pragma unroll
    for (int k = 0; k < CPL; ++k) acc[k] = 0.f;
#endif
#if COMBINE == 1
    for (int s = 0; s < num_splits; ++s) lmax = fmaxf(lmax, L_part[(size_t)s * NR + orow]);
    for (int s = 0; s < num_splits; ++s) {
        const float ls = L_part[(size_t)s * NR + orow];
        if (ls == NEG_INF) continue;
        const float w = expf(ls - lmax);
        sum += w;
        const float* src = O_part + ((size_t)s * NR + orow) * D + lane * CPL;
#pragma unroll
        for (int k = 0; k < CPL; ++k) acc[k] += w * src[k];
    }
#elif COMBINE == 2
    // lane s % 32 loads L_s: 32 splits per load, the max and sum by shuffles
    for (int s = lane; s < num_splits; s += 32) lmax = fmaxf(lmax, L_part[(size_t)s * NR + orow]);
#pragma unroll
    for (int x = 16; x; x >>= 1) lmax = fmaxf(lmax, __shfl_xor_sync(0xffffffffu, lmax, x));
    for (int s0 = 0; s0 < num_splits; s0 += 32) {
        const int s = s0 + lane;
        const float ls = s < num_splits ? L_part[(size_t)s * NR + orow] : NEG_INF;
        const float w_mine = ls == NEG_INF ? 0.f : expf(ls - lmax);   // empty split: weight 0
        sum += w_mine;
        const int n = min(32, num_splits - s0);
        // every split's O_s is written (an empty one as zeros), so no branch: loads in flight
#pragma unroll 8
        for (int k = 0; k < n; ++k) {
            const float w = __shfl_sync(0xffffffffu, w_mine, k);
            add_weighted(acc, O_part + ((size_t)(s0 + k) * NR + orow) * D + lane * CPL, w);
        }
    }
#pragma unroll
    for (int x = 16; x; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
#endif
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    u32 packed[CPL / 2];
#pragma unroll
    for (int k = 0; k < CPL / 2; ++k) packed[k] = pack2<IS_BF16>(acc[2 * k] * inv, acc[2 * k + 1] * inv);
    u16* dst = O + (size_t)orow * D + lane * CPL;
#if HEAD_DIM == 128
    *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
#else
    *reinterpret_cast<u32*>(dst) = packed[0];
#endif
    if (lane == 0) {
        const int h = orow % H, qi = (orow / H) % q_len, b = orow / (H * q_len);
        L[(b * H + h) * q_len + qi] = sum > 0.f ? lmax + logf(sum) : NEG_INF;
    }
}
