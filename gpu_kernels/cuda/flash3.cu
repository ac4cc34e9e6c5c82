// flash3.cu -- FlashAttention-3-style forward for Hopper (sm_90a): fp16 / bf16 in, fp32 accumulate.
//
// The same algorithm as flash2_tc.cu (FlashAttention-2's Algorithm 1: one thread block per query
// block Q_i of B_r rows of one (batch, head); K_j, V_j blocks of B_c rows streamed through shared
// memory; online softmax with the running row max m_i and row sum l_i in registers; O_i rescaled
// by diag(l_i)^-1 once, at the end; only O and L = m_i + log(l_i) written to HBM), rebuilt on
// Hopper's own instructions, one step of the FlashAttention-3 paper (Shah et al., 2024) per version.
// Read flash2_tc.cu first: the loop, the names and the masks are the same.
//
//   HBM traffic per (batch, head), non-causal, T_r = ceil(N / B_r): as flash2_tc.cu
//     read  Q: N*d*2 bytes, K and V: T_r * N*d*2 bytes each;  write O: N*d*2 bytes, L: N*4 bytes
//
// Work decomposition: B_r = 128 query rows per thread block, two consumer warpgroups (4 warps,
// 128 threads each) of 64 rows: warpgroup w owns rows 64 w .. 64 w + 63 of Q_i. Per K/V block a
// warpgroup computes its 64 x B_c slice of S_ij = Q_i K_j^T with wgmma (m64 n=B_c k16, both
// operands in shared memory: "SS"), keeps it in registers, turns it into P_ij (fp32 statistics),
// converts P_ij to fp16/bf16 in registers and uses it as the A operand of O_i += P_ij V_j (wgmma
// m64 n=d k16 with A in registers: "RS"); V_j is read as B in its (key, d) row-major layout with
// the descriptor's transpose bit (N-major B). O_i (64 x d per warpgroup) stays in registers.
//
// Shared memory: every tile (Q_i, K_j, V_j) is stored in panels of 64 columns (128 bytes of
// fp16 per row) with the 128-byte swizzle: 16-byte chunk c of row r of a panel sits at chunk
// c ^ (r % 8), the layout both wgmma's descriptors (swizzle mode 1) and the TMA unit
// (CU_TENSOR_MAP_SWIZZLE_128B, box of 64 columns) use. A descriptor names a 64-column panel
// with SBO = 1024 bytes (8 rows of 128 bytes); K-major (Q, K) steps along d by 32 bytes inside a
// panel and to the next panel every 4 k-steps; N-major (V) takes LBO = B_c * 128 bytes, the
// distance between its 64-column panels along d.
//
// Versions (VERSION compile-time constant; every version below is in this file):
//   v1  the first Hopper version: wgmma (SS for S_ij = Q_i K_j^T, RS for O_i += P_ij V_j, V_j
//       transposed by the descriptor), P_ij kept in registers, online softmax m_i, l_i, alpha
//       in registers; Q_i, K_j, V_j loaded by all 256 threads with cp.async into the swizzled
//       panels, K/V double-buffered (K_{j+1}, V_{j+1} in flight while block j is computed).
//   v2  v1 with the loads done by the TMA unit (cp.async.bulk.tensor.3d with a CUtensorMap made
//       on the host, passed as a __grid_constant__ parameter; rows past N are filled with zeros
//       by the unit), completing on mbarriers (expect_tx bytes): one thread issues every copy,
//       into a circular buffer of KV_STAGES stages.
//   v3  v2 with warp specialisation: a producer warpgroup (128 threads, one of which issues the
//       copies) and two consumer warpgroups, 384 threads, __launch_bounds__(384, 1); setmaxnreg
//       moves registers from the producer (down to 24) to the consumers (up to 240). The
//       producer waits on "empty" mbarriers that the consumers arrive on once a stage is read.
//   v4  v3 with FlashAttention-3's two schedules: ping-pong between the two consumer
//       warpgroups (named barriers: one warpgroup issues its GEMMs while the other does its
//       softmax) and, inside a warpgroup, softmax of block j overlapping the GEMMs
//       S_{j+1} = Q_i K_{j+1}^T ... in the paper's order: S_{j} and P_{j-1} V_{j-1} issued
//       together, softmax of S_j while P_{j-1} V_{j-1} runs.
//
// Compile-time constants (all have defaults, so the file compiles on its own):
//   HEAD_DIM   d: 64, 128 or 256           BLOCK_R  B_r = 128 (two consumer warpgroups of 64 rows)
//   BLOCK_C    B_c: 64 or 128 (S_ij per warpgroup is 64 x B_c fp32 in registers)
//   KV_STAGES  K/V stages in shared memory (2 or 3; v1: 2)
//   IS_BF16    0: fp16 inputs, 1: bf16 inputs      VERSION  1..4 as above
//   TMAP_GLOBAL  0: tensor maps as __grid_constant__ parameters; 1: a pointer to the three
//              in global memory (the loader's fallback where its caller cannot pass structs)
//   MASK       0: as above; 1 (v3 only): the FlashMask path below, which skips the tiles the
//              mask hides. Every version with MASK 0 is the same code as without the option.
//
// The mask path (MASK 1, v3). FlashMask (Wang et al., 2024) describes a mask by four int32
// vectors over the key columns c: query r does not see key c when LTS_c <= r < LTE_c or
// UTS_c <= r < UTE_c (flashsim/masks.py builds them for causal, sliding:W, document:...,
// prefix:P). The host classifies every tile (i, j) as skipped, partial or full from per-key-
// block minima and maxima of the vectors (flashsim.masks.Mask.classify, FlashMask's test) and
// hands the kernel, per query block i, the list of its non-skipped key blocks in CSR form, as
// flex_attention's BlockMask does: kv_indptr[i] .. kv_indptr[i + 1] index kv_entries, each
// entry 4 j + (1 if consumer warpgroup 0's 64 rows need the element mask) + (2 if warpgroup
// 1's do). The producer and the consumers walk the same list, so the n-th tile of the list
// uses stage n % S with parity (n / S) % 2 on both sides and the mbarrier pipeline stays in
// step; a skipped tile costs neither a load nor a GEMM. In a partial tile the consumer sets
// S_ij to -inf where the column vectors (read as one int4 (LTS, LTE, UTS, UTE) per column)
// hide the element, before the row max; full tiles do no per-element work. A row that sees no
// key at all ends with l_i = 0: its O row is written as 0 and its L as -inf.
// Runtime: N (any N >= 1; ragged last blocks are masked), causal (0/1, top-left aligned: key k
// is visible to query q when k <= q), scale_log2 = tau * log2(e) with tau = 1/sqrt(d); three
// from v2 on, three tensor maps (Q, K, V as 3-D tensors (d, N, B*H), boxes of 64 x rows x 1).
// Layout: Q, K, V, O are (B, H, N, d) contiguous; L is (B, H, N) fp32.
// Grid: (ceil(N / B_r), B * H); block: NUM_THREADS (256 for v1, v2; 384 from v3 on); dynamic
// shared memory SMEM_BYTES (below), above 48 KB: the loader opts in.
//
// Needs sm_90a (wgmma, setmaxnreg): compile with --gpu-architecture=sm_90a (NVRTC) or
// -gencode=arch=compute_90a,code=sm_90a (nvcc). The only headers are ours: common.cuh,
// tc_tiles.cuh (the tile constants' defaults, shared with flash2_tc.cu) and wgmma.cuh (the
// warpgroup GEMMs and the softmax of a block, shared with decode.cu's v5).

#include "tc_tiles.cuh"
#ifndef KV_STAGES
#define KV_STAGES 2
#endif
#ifndef VERSION
#define VERSION 1
#endif
#ifndef TMAP_GLOBAL
#define TMAP_GLOBAL 0      // 1: the tensor maps are read from global memory, not parameters
#endif
#ifndef MASK
#define MASK 0             // 1: FlashMask's column vectors and the tile list (v3)
#endif

#define CONSUMERS 2                                      // consumer warpgroups, 64 rows each
#define PRODUCER (VERSION >= 3)                          // a warpgroup that only loads
#define NUM_THREADS (128 * (CONSUMERS + PRODUCER))
#define USE_TMA (VERSION >= 2)

#include "common.cuh"
#include "wgmma.cuh"     // wgmma, the swizzled tiles (PANEL_BYTES, TILE_BYTES), both GEMMs, softmax
// 1024 bytes of slack to align the tiles to the 1024-byte swizzle pattern, Q_i, the K/V stages,
// then the mbarriers (Q full, and per stage: K full, V full, empty).
#define SMEM_BYTES (1024 + TILE_BYTES(BLOCK_R) + 2 * KV_STAGES * TILE_BYTES(BLOCK_C) + 8 * (1 + 3 * KV_STAGES))

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "HEAD_DIM must be 64, 128 or 256");
static_assert(BLOCK_R == 64 * CONSUMERS, "B_r = 64 rows per consumer warpgroup");
static_assert(BLOCK_C == 64 || BLOCK_C == 128, "BLOCK_C must be 64 or 128");
static_assert(KV_STAGES >= 2 && KV_STAGES <= 3, "2 or 3 K/V stages");
static_assert(VERSION >= 1 && VERSION <= 4, "VERSION is 1..4");
static_assert(!MASK || VERSION == 3, "the mask path is built on v3 (MASK needs VERSION 3)");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory above the 227 KB per-block limit");

// ---------------------------------------------------------------- mbarriers, TMA, registers
#include "tma.cuh"      // TensorMap, mbar_*, tma_load (3-D boxes); named barriers, setmaxnreg: wgmma.cuh

// Named barrier ids (0 is __syncthreads): the ping-pong pair, then one per consumer warpgroup.
#define BAR_SCHED 1     // 1 + w: warpgroup w may issue its GEMMs
#define BAR_WG 3        // 3 + w: the 128 threads of consumer warpgroup w

// ---------------------------------------------------------------- loads
// cp.async (v1): rows [row0, row0 + ROWS) of a (N, d) matrix into a swizzled tile, by THREADS
// threads numbered tid; rows >= N become zeros.
template <int ROWS, int THREADS>
__device__ __forceinline__ void cp_async_tile(u32 tile, const u16* g, int row0, int N, int tid) {
    constexpr int CHUNKS = HEAD_DIM / 8;
#pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / THREADS; ++it) {
        const int c = it * THREADS + tid, r = c / CHUNKS, ch = c % CHUNKS;
        const bool valid = row0 + r < N;
        cp_async_16(tile + tile_off(ROWS, r, ch), g + (size_t)(valid ? row0 + r : 0) * HEAD_DIM + ch * 8, valid);
    }
}
// TMA (v2 on): a whole tile, panel by panel; the caller has announced its bytes on bar.
template <int ROWS>
__device__ __forceinline__ void tma_tile(u32 tile, const TensorMap* map, int row0, int bh, u32 bar) {
#pragma unroll
    for (int p = 0; p < HEAD_DIM / 64; ++p) tma_load(tile + p * PANEL_BYTES(ROWS), map, p * 64, row0, bh, bar);
}

// ---------------------------------------------------------------- softmax pieces
// Mask S_ij: columns >= N and (causal) key > query. row_w: first row (global) of this thread's
// warp slice; col0: first key of block j.
__device__ __forceinline__ void mask_s(float (&s)[S_REGS], int col0, int row_w, int g, int t, int N, int causal) {
    const float NEG_INF = neg_inf();
#pragma unroll
    for (int n = 0; n < BLOCK_C / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = col0 + n * 8 + 2 * t + (e & 1), row = row_w + g + 8 * (e >> 1);
            if (col >= N || (causal && col > row)) s[4 * n + e] = NEG_INF;
        }
}
#if MASK
// Mask S_ij by FlashMask's column vectors (one int4 (LTS, LTE, UTS, UTE) per key column):
// element (row, col) is hidden when LTS <= row < LTE or UTS <= row < UTE; columns >= N too.
__device__ __forceinline__ void mask_cols(float (&s)[S_REGS], const int4* __restrict__ cols, int col0,
                                          int row_w, int g, int t, int N) {
    const float NEG_INF = neg_inf();
#pragma unroll
    for (int n = 0; n < BLOCK_C / 8; ++n)
#pragma unroll
        for (int c2 = 0; c2 < 2; ++c2) {
            const int col = col0 + n * 8 + 2 * t + c2;
            const int4 v = col < N ? __ldg(cols + col) : make_int4(0, N, 0, 0);   // past N: all hidden
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row_w + g + 8 * h;
                if ((row >= v.x && row < v.y) || (row >= v.z && row < v.w)) s[4 * n + 2 * h + c2] = NEG_INF;
            }
        }
}
#endif
// ---------------------------------------------------------------- the kernel
// One block per SM (the 1 also gives setmaxnreg the register cap it needs at entry).
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
flash3_fwd(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
           u16* __restrict__ O, float* __restrict__ L, int N, float scale_log2, int causal
#if MASK   // the tile list (CSR over query blocks) and FlashMask's vectors, (N, 4) int32
           , const int* __restrict__ kv_indptr, const int* __restrict__ kv_entries,
           const int4* __restrict__ mask_cols_lts_lte_uts_ute
#endif
#if USE_TMA && TMAP_GLOBAL
           , const TensorMap* __restrict__ tmaps     // Q, K, V
#elif USE_TMA
           , const __grid_constant__ TensorMap tm_q, const __grid_constant__ TensorMap tm_k,
           const __grid_constant__ TensorMap tm_v
#endif
           ) {
    constexpr int D = HEAD_DIM, B_r = BLOCK_R, B_c = BLOCK_C, S = KV_STAGES;
    const float NEG_INF = neg_inf();

    extern __shared__ unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;   // the swizzle repeats every 1024 B
    const u32 q_tile = base;                                   // B_r x d
    const u32 k_tiles = q_tile + TILE_BYTES(B_r);              // S x (B_c x d)
    const u32 v_tiles = k_tiles + S * TILE_BYTES(B_c);         // S x (B_c x d)
    const u32 bars = v_tiles + S * TILE_BYTES(B_c);            // mbarriers, 8 bytes each
    [[maybe_unused]] const u32 q_full = bars;
    [[maybe_unused]] auto k_full = [&](int s) { return bars + 8 * (1 + s); };
    [[maybe_unused]] auto v_full = [&](int s) { return bars + 8 * (1 + S + s); };
    [[maybe_unused]] auto empty = [&](int s) { return bars + 8 * (1 + 2 * S + s); };
    auto k_tile = [&](int s) { return k_tiles + s * TILE_BYTES(B_c); };
    auto v_tile = [&](int s) { return v_tiles + s * TILE_BYTES(B_c); };

    // Causal blocks differ in cost: launch the longest (last) query blocks first (masked: the
    // last ones too, which are the longest for causal and prefix masks).
    const int i = (causal || MASK) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const int bh = blockIdx.y;
    const size_t head = (size_t)bh * N * D;
    const int row0 = i * B_r;
    const int T_c = cdiv(N, B_c);
    const int j_end = causal ? min(T_c, cdiv(min(row0 + B_r, N), B_c)) : T_c;
#if MASK   // this query block's tiles: entries it_begin .. it_end - 1 of the list, in order
    const int it_begin = kv_indptr[i], it_end = kv_indptr[i + 1];
#endif

    const int wg_all = threadIdx.x / 128;          // warpgroup of the block
    const int w = wg_all - PRODUCER;               // consumer warpgroup (-1: the producer)
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;

#if USE_TMA
#if TMAP_GLOBAL
    const TensorMap *map_q = tmaps, *map_k = tmaps + 1, *map_v = tmaps + 2;
#else
    const TensorMap *map_q = &tm_q, *map_k = &tm_k, *map_v = &tm_v;
#endif
    if (threadIdx.x == 0) {
#if TMAP_GLOBAL   // maps written by the host into global memory: acquire them for the TMA unit
        for (int m = 0; m < 3; ++m)
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" :: "l"(tmaps + m) : "memory");
#endif
        mbar_init(q_full, 1);
        for (int s = 0; s < S; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(empty(s), CONSUMERS * 4);       // lane 0 of every consumer warp
        }
        mbar_init_fence();
        fence_proxy_async();
    }
    __syncthreads();
#endif

    // ---------------------------------------------------------------- producer (v3, v4)
#if PRODUCER
    if (w < 0) {
        setmaxnreg_dec<24>();
        if (tid == 0) {
            mbar_expect_tx(q_full, TILE_BYTES(B_r));
            tma_tile<B_r>(q_tile, map_q, row0, bh, q_full);
#if MASK   // the n-th listed tile (key block j) into stage n % S, as the consumers read it
            for (int n = 0; n < it_end - it_begin; ++n) {
                const int j = kv_entries[it_begin + n] >> 2, s = n % S;
                if (n >= S) mbar_wait(empty(s), (n / S - 1) & 1);   // both warpgroups done with it
#else
            for (int j = 0; j < j_end; ++j) {
                const int s = j % S;
                if (j >= S) mbar_wait(empty(s), (j / S - 1) & 1);   // both warpgroups done with it
#endif
                mbar_expect_tx(k_full(s), TILE_BYTES(B_c));
                tma_tile<B_c>(k_tile(s), map_k, j * B_c, bh, k_full(s));
                mbar_expect_tx(v_full(s), TILE_BYTES(B_c));
                tma_tile<B_c>(v_tile(s), map_v, j * B_c, bh, v_full(s));
            }
        }
    } else   // setmaxnreg acts only where each warpgroup's role is one branch of an if/else
#endif
    {
    // ---------------------------------------------------------------- consumers
#if PRODUCER
    setmaxnreg_inc<240>();
#endif
    // This thread's rows: row_w + g and row_w + g + 8 of the sequence (row_w: its warp's first).
    const int row_w = row0 + w * 64 + warp * 16;
    float o[O_REGS];
#pragma unroll
    for (int k = 0; k < O_REGS; ++k) o[k] = 0.f;
    float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f}, alpha[2];
    float s[S_REGS];
    u32 p[P_REGS];
#if MASK   // mask needed: the block reaches past N, or the list marks it for this warpgroup
    int entry = 0;
    auto needs_mask = [&](int j) { return j * B_c + B_c > N || ((entry >> w) & 1); };
#else      // mask needed: the block reaches past N, or (causal) past this warpgroup's first row
    auto needs_mask = [&](int j) {
        return j * B_c + B_c > N || (causal && j * B_c + B_c - 1 > row0 + w * 64);
    };
#endif
    // Block j in FlashAttention-2's order, each GEMM waited for (v1, v2, v3): S_ij = Q_i K_j^T,
    // mask, softmax, rescale O_i, P_ij V_j. wait_v() runs before the second GEMM (v3 waits for
    // V_j there, so S_ij need not wait for it).
    [[maybe_unused]] auto serial_block = [&](int j, u32 k_j, u32 v_j, auto wait_v) {
        gemm_qk(s, q_tile, w, k_j);
        wgmma_wait<0>();
        fence_regs(s);
#if MASK
        if (needs_mask(j)) mask_cols(s, mask_cols_lts_lte_uts_ute, j * B_c, row_w, g, t, N);
#else
        if (needs_mask(j)) mask_s(s, j * B_c, row_w, g, t, N, causal);
#endif
        softmax_step(s, m_i, l_i, alpha, scale_log2);
        rescale_o(o, alpha);
        convert_p(s, p);
        wait_v();
        gemm_pv(o, p, v_j);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
    };

#if VERSION == 1
    // ---- v1: all 256 threads load with cp.async; K_{j+1}, V_{j+1} in flight during block j
    cp_async_tile<B_r, NUM_THREADS>(q_tile, Q + head, row0, N, threadIdx.x);
    cp_async_tile<B_c, NUM_THREADS>(k_tile(0), K + head, 0, N, threadIdx.x);
    cp_async_tile<B_c, NUM_THREADS>(v_tile(0), V + head, 0, N, threadIdx.x);
    cp_async_commit();
    for (int j = 0; j < j_end; ++j) {
        const int st = j & 1;
        cp_async_wait<0>();            // this thread's part of K_j, V_j (and Q_i)
        fence_proxy_async();           // ... visible to wgmma (async proxy)
        __syncthreads();               // everyone's part; everyone done with block j - 1
        if (j + 1 < j_end) {           // into the stage block j - 1 used
            cp_async_tile<B_c, NUM_THREADS>(k_tile(st ^ 1), K + head, (j + 1) * B_c, N, threadIdx.x);
            cp_async_tile<B_c, NUM_THREADS>(v_tile(st ^ 1), V + head, (j + 1) * B_c, N, threadIdx.x);
        }
        cp_async_commit();
        serial_block(j, k_tile(st), v_tile(st), [] {});
    }
#elif VERSION == 2
    // ---- v2: thread 0 issues TMA copies; K_{j+1}, V_{j+1} (stage (j+1) % S) during block j
    if (threadIdx.x == 0) {
        mbar_expect_tx(q_full, TILE_BYTES(B_r));
        tma_tile<B_r>(q_tile, map_q, row0, bh, q_full);
        for (int j = 0; j < min(S - 1, j_end); ++j) {
            mbar_expect_tx(k_full(j), 2 * TILE_BYTES(B_c));
            tma_tile<B_c>(k_tile(j), map_k, j * B_c, bh, k_full(j));
            tma_tile<B_c>(v_tile(j), map_v, j * B_c, bh, k_full(j));
        }
    }
    mbar_wait(q_full, 0);
    for (int j = 0; j < j_end; ++j) {
        const int st = j % S;
        // Everyone is done with block j - 1, so its stage ((j + S - 1) % S) can take block j + S - 1.
        __syncthreads();
        if (threadIdx.x == 0 && j + S - 1 < j_end) {
            const int jn = j + S - 1, sn = jn % S;
            mbar_expect_tx(k_full(sn), 2 * TILE_BYTES(B_c));
            tma_tile<B_c>(k_tile(sn), map_k, jn * B_c, bh, k_full(sn));
            tma_tile<B_c>(v_tile(sn), map_v, jn * B_c, bh, k_full(sn));
        }
        mbar_wait(k_full(st), (j / S) & 1);    // K_j and V_j have landed
        serial_block(j, k_tile(st), v_tile(st), [] {});
    }
#elif VERSION == 3
    // ---- v3: consumers only compute; a stage is released once both GEMMs that read it are done
    mbar_wait(q_full, 0);
#if MASK   // the listed tiles only: the n-th in stage n % S, as the producer loaded it
    for (int n = 0; n < it_end - it_begin; ++n) {
        entry = kv_entries[it_begin + n];
        const int j = entry >> 2, st = n % S, parity = (n / S) & 1;
#else
    for (int j = 0; j < j_end; ++j) {
        const int st = j % S, parity = (j / S) & 1;
#endif
        mbar_wait(k_full(st), parity);
        serial_block(j, k_tile(st), v_tile(st), [&] { mbar_wait(v_full(st), parity); });
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(st));
    }
#else
    // ---- v4: ping-pong between the warpgroups (BAR_SCHED + w: "your turn to issue GEMMs"),
    // and inside a warpgroup S_j and P_{j-1} V_{j-1} in flight while softmax of S_j runs.
    // Warpgroup 1 lets warpgroup 0 go first; each warpgroup hands the turn over after issuing.
    // Warpgroup 1 skips its last hand-over so the arrivals match the waits.
    const int me = BAR_SCHED + w, other = BAR_SCHED + (w ^ 1);
    if (w == 1) named_arrive(BAR_SCHED + 0, 2 * 128);
    mbar_wait(q_full, 0);
    mbar_wait(k_full(0), 0);
    named_sync(me, 2 * 128);
    gemm_qk(s, q_tile, w, k_tile(0));
    named_arrive(other, 2 * 128);
    wgmma_wait<0>();
    fence_regs(s);
    if (needs_mask(0)) mask_s(s, 0, row_w, g, t, N, causal);
    softmax_step(s, m_i, l_i, alpha, scale_log2);     // O_i = 0: nothing to rescale
    convert_p(s, p);
    for (int j = 1; j < j_end; ++j) {
        const int st = j % S, prev = (j - 1) % S;
        mbar_wait(k_full(st), (j / S) & 1);
        named_sync(me, 2 * 128);
        gemm_qk(s, q_tile, w, k_tile(st));                     // S_j
        mbar_wait(v_full(prev), ((j - 1) / S) & 1);
        gemm_pv(o, p, v_tile(prev));                           // O_i += P_{j-1} V_{j-1}
        named_arrive(other, 2 * 128);
        wgmma_wait<1>();                                       // S_j done, P V still running
        fence_regs(s);
        if (needs_mask(j)) mask_s(s, j * B_c, row_w, g, t, N, causal);
        softmax_step(s, m_i, l_i, alpha, scale_log2);
        wgmma_wait<0>();                                       // P_{j-1} V_{j-1} done
        fence_regs(o);
        fence_regs(p);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(prev));
        rescale_o(o, alpha);
        convert_p(s, p);
    }
    {
        const int last = (j_end - 1) % S;
        mbar_wait(v_full(last), ((j_end - 1) / S) & 1);
        named_sync(me, 2 * 128);
        gemm_pv(o, p, v_tile(last));
        if (w == 0) named_arrive(other, 2 * 128);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
    }
#endif

    // ---------------------------------------------------------------- epilogue
    // O_i = diag(l_i)^-1 O_i, L_i = m_i + log(l_i) (natural log). This warpgroup's 64 x d slice
    // of O_i is staged in its own rows of the Q_i tile (no GEMM reads them any more), then
    // written to HBM in 16-byte chunks.
    const float LN2 = 0.6931471805599453f;
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 1);
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 2);
#if MASK   // a row that sees no key: l_i = 0, m_i = -inf; O row 0, L = -inf
        inv[h] = l_i[h] > 0.f ? 1.f / l_i[h] : 0.f;
#else
        inv[h] = 1.f / l_i[h];
#endif
        const int row = row_w + g + 8 * h;
        if (t == 0 && row < N) L[(size_t)bh * N + row] = (m_i[h] + __log2f(l_i[h])) * LN2;
    }
    unsigned char* smem_gen = smem_raw + (q_tile - smem_addr(smem_raw));   // generic pointer to Q_i
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = w * 64 + warp * 16 + g + 8 * h;    // row inside Q_i
            *reinterpret_cast<u32*>(smem_gen + tile_off(B_r, r, n) + 4 * t) =
                pack2<IS_BF16>(o[4 * n + 2 * h] * inv[h], o[4 * n + 2 * h + 1] * inv[h]);
        }
    named_sync(BAR_WG + w, 128);
    u16* Og = O + head;
#pragma unroll
    for (int it = 0; it < 64 * (D / 8) / 128; ++it) {
        const int c = it * 128 + tid, r = c / (D / 8), ch = c % (D / 8);
        const int row = row0 + w * 64 + r;
        if (row < N)
            *reinterpret_cast<uint4*>(Og + (size_t)row * D + ch * 8) =
                *reinterpret_cast<const uint4*>(smem_gen + tile_off(B_r, w * 64 + r, ch));
    }
    }   // consumers
}
