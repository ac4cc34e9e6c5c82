// flash2_tc.cu -- FlashAttention-2 forward on tensor cores (fp16 / bf16 in, fp32 accumulate).
//
// The same algorithm as flashsim's "flash2" (paper's Algorithm 1 of FlashAttention-2): one thread
// block per query block Q_i (B_r rows) of one (batch, head); K_j, V_j (B_c rows each) streamed
// through shared memory; online softmax with running row max m_i and row sum l_i kept in
// registers; O_i rescaled by diag(l_i)^-1 once, at the end; only O and the logsumexp
// L = m_i + log(l_i) are written to HBM. flash2.cu is the same loop written plainly (fp32, one
// warp per row): read it first; this file adds the tensor-core machinery around that loop.
//
//   HBM traffic per (batch, head), non-causal, T_r = ceil(N / B_r):
//     read  Q: N*d*2 bytes, K and V: T_r * N*d*2 bytes each (every Q block streams all of K, V)
//     write O: N*d*2 bytes, L: N*4 bytes
//   (the L2 between HBM and the SMs serves most of the K/V re-reads: flashsim.hardware.l2
//   models how many; docs/model.md)
//
// Work decomposition: NUM_WARPS warps, each owning WARP_M = 16 * M_TILES query rows
// (B_r = WARP_M * NUM_WARPS). Per K/V block a warp computes its WARP_M x B_c slice of
// S_ij = Q_i K_j^T with mma.sync m16n8k16, keeps it in registers, turns it into P_ij in
// registers (fp32 softmax statistics), repacks the accumulators as the A operand of P_ij V_j
// (no shared-memory round trip) and accumulates its WARP_M x d slice of O_i in registers.
//
// Versions (VERSION compile-time constant; every version below is in this file):
//   v1  mma.sync m16n8k16 + ldmatrix (.trans for V_j), 16 rows per warp, Q_i fragments kept
//       in registers, P_ij kept in registers, exp2 with log2(e)*tau folded into one scale.
//       K_j, V_j loaded with plain 16-byte loads into row-padded shared memory (+16 bytes per
//       row, so ldmatrix is free of bank conflicts); load, barrier, compute, barrier: no overlap.
//   v2  v1 + cp.async (global -> shared without registers) in FlashAttention-2's order:
//       V_j is in flight while S_ij = Q_i K_j^T is computed, K_{j+1} is in flight while
//       softmax and P_ij V_j run.
//   v3  v2 with XOR-swizzled shared memory instead of padding: 16-byte chunk c of row r is
//       stored at chunk c ^ (r % 8); conflict-free ldmatrix and cp.async, no padding bytes.
//   v4  v3 with K and V double-buffered (two stages each): K_{j+1} and V_{j+1} are both
//       loaded while block j is computed, one barrier per block instead of two.
//   v5  v3 with 32 rows per warp (two m16 tiles): every K_j / V_j fragment read from shared
//       memory feeds two mma instead of one; Q_i fragments are re-read from shared memory at
//       each k-step (as FlashAttention-2 does at d = 128) to leave registers for O_i.
//
// Compile-time constants (all have defaults, so the file compiles on its own):
//   HEAD_DIM   d, 64 or 128               BLOCK_R  B_r = WARP_M * NUM_WARPS
//   BLOCK_C    B_c, multiple of 16        IS_BF16  0: fp16 inputs, 1: bf16 inputs
//   VERSION    1..5 as above              MIN_BLOCKS  blocks per SM asked of ptxas
//                                                     (__launch_bounds__; caps registers)
// Runtime: N (any N >= 1; ragged last blocks are masked), causal (0/1, top-left aligned:
// key k is visible to query q when k <= q), scale_log2 = tau * log2(e) with tau = 1/sqrt(d).
// Layout: Q, K, V, O are (B, H, N, d) contiguous; L is (B, H, N) fp32.
// Grid: (ceil(N / B_r), B * H); block: 32 * NUM_WARPS threads; dynamic shared memory
// SMEM_BYTES (below), which needs the > 48 KB opt-in for the larger tiles.
//
// The only headers are ours (common.cuh, and tc_tiles.cuh for the tile constants' defaults):
// conversions and tensor-core instructions are inline PTX there, so the file compiles under
// NVRTC without the CUDA toolkit's include folder.

#include "tc_tiles.cuh"
#ifndef VERSION
#define VERSION 3
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

#define M_TILES (VERSION >= 5 ? 2 : 1)     // m16 tiles per warp
#define WARP_M (16 * M_TILES)               // query rows per warp
#define NUM_WARPS (BLOCK_R / WARP_M)
#define NUM_THREADS (32 * NUM_WARPS)
#define KV_STAGES (VERSION == 4 ? 2 : 1)
#define SWIZZLE (VERSION >= 3)
#define Q_IN_REGS (M_TILES == 1)
// Row stride of a shared-memory tile, in 16-bit elements.
#define SMEM_STRIDE (SWIZZLE ? HEAD_DIM : HEAD_DIM + 8)
#define SMEM_BYTES ((BLOCK_R + 2 * KV_STAGES * BLOCK_C) * SMEM_STRIDE * 2)

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "HEAD_DIM must be 64 or 128");
static_assert(BLOCK_R % WARP_M == 0 && NUM_WARPS >= 1 && NUM_WARPS <= 16, "BLOCK_R = WARP_M * warps");
static_assert(BLOCK_C % 16 == 0, "BLOCK_C must be a multiple of 16");
static_assert(VERSION >= 1 && VERSION <= 5, "VERSION is 1..5");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory above the 227 KB per-block limit");

#include "common.cuh"

// Offset (in 16-bit elements) of element (row, col) of a tile; col % 8 == 0 for 16-byte access.
__device__ __forceinline__ int tile_off(int row, int col) {
#if SWIZZLE
    return row * SMEM_STRIDE + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
#else
    return row * SMEM_STRIDE + col;
#endif
}

// Copy rows [row0, row0 + ROWS) of a (N, d) matrix into a shared tile; rows >= N become zeros.
template <int ROWS>
__device__ __forceinline__ void load_tile(u16* tile, const u16* g, int row0, int N) {
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
    constexpr int ITERS = (ROWS * CHUNKS + NUM_THREADS - 1) / NUM_THREADS;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int c = it * NUM_THREADS + threadIdx.x;
        if (ROWS * CHUNKS % NUM_THREADS != 0 && c >= ROWS * CHUNKS) break;
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = row0 + r < N;
        const u16* src = g + (size_t)(valid ? row0 + r : 0) * HEAD_DIM + col;
#if VERSION >= 2
        cp_async_16(smem_addr(tile + tile_off(r, col)), src, valid);
#else
        uint4 v = make_uint4(0, 0, 0, 0);
        if (valid) v = *reinterpret_cast<const uint4*>(src);
        *reinterpret_cast<uint4*>(tile + tile_off(r, col)) = v;
#endif
    }
}

// ---------------------------------------------------------------- the kernel
extern "C" __global__ void __launch_bounds__(NUM_THREADS, MIN_BLOCKS)
flash2_tc_fwd(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
              u16* __restrict__ O, float* __restrict__ L, int N, float scale_log2, int causal) {
    constexpr int D = HEAD_DIM, B_r = BLOCK_R, B_c = BLOCK_C, MT = M_TILES;
    constexpr int NT = B_c / 8;   // 8-column n-tiles of S_ij per m16 tile
    constexpr int DT = D / 8;     // 8-column n-tiles of O_i per m16 tile
    constexpr int KQ = D / 16;    // 16-wide k-steps of Q_i K_j^T
    constexpr int KP = B_c / 16;  // 16-wide k-steps of P_ij V_j
    const float NEG_INF = neg_inf();

    extern __shared__ __align__(128) u16 smem[];
    u16* Q_s = smem;                                  // B_r x d (later: O_i staging)
    u16* K_s = Q_s + B_r * SMEM_STRIDE;               // KV_STAGES x B_c x d
    u16* V_s = K_s + KV_STAGES * B_c * SMEM_STRIDE;   // KV_STAGES x B_c x d

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row group, thread in group
    // Causal blocks differ in cost: launch the longest (last) query blocks first.
    const int i = causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const size_t bh = blockIdx.y;
    const u16* Qg = Q + bh * N * D;
    const u16* Kg = K + bh * N * D;
    const u16* Vg = V + bh * N * D;
    const int row0 = i * B_r;             // first query row of Q_i
    const int wrow = warp * WARP_M;       // first row of this warp inside Q_i

    const int T_c = (N + B_c - 1) / B_c;
    const int j_end = causal ? min(T_c, (min(row0 + B_r, N) + B_c - 1) / B_c) : T_c;

    // ---- Q_i -> shared (-> registers: A fragments, KQ x 4 registers, when Q_IN_REGS)
    load_tile<B_r>(Q_s, Qg, row0, N);
#if VERSION >= 2
    load_tile<B_c>(K_s, Kg, 0, N);      // K_0
#if VERSION == 4
    load_tile<B_c>(V_s, Vg, 0, N);      // V_0
#endif
    cp_async_commit();
    cp_async_wait<0>();
#endif
    __syncthreads();
#if Q_IN_REGS
    u32 q_frag[KQ][4];
#pragma unroll
    for (int kq = 0; kq < KQ; ++kq)
        ldmatrix_x4(q_frag[kq][0], q_frag[kq][1], q_frag[kq][2], q_frag[kq][3],
                    smem_addr(Q_s + tile_off(wrow + lane % 16, kq * 16 + (lane / 16) * 8)));
#endif

    // Accumulators of m16 tile mt: rows wrow + 16 mt + g (elements 0, 1) and + 8 (2, 3).
    float o_acc[MT][DT][4];                 // O_i slice; columns 8 dt + 2t, +1
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            o_acc[mt][dt][0] = o_acc[mt][dt][1] = o_acc[mt][dt][2] = o_acc[mt][dt][3] = 0.f;
    float m_i[MT][2], l_i[MT][2];          // running max of tau*S*log2(e); running sum
#pragma unroll                              // (this thread's columns only)
    for (int mt = 0; mt < MT; ++mt) m_i[mt][0] = m_i[mt][1] = NEG_INF, l_i[mt][0] = l_i[mt][1] = 0.f;

    for (int j = 0; j < j_end; ++j) {
        const int stage = (KV_STAGES == 2) ? (j & 1) : 0;
        const u16* K_j = K_s + stage * B_c * SMEM_STRIDE;
        const u16* V_j = V_s + stage * B_c * SMEM_STRIDE;
#if VERSION == 1
        __syncthreads();                      // everyone is done with K_{j-1}, V_{j-1}
        load_tile<B_c>(K_s, Kg, j * B_c, N);
        load_tile<B_c>(V_s, Vg, j * B_c, N);
        __syncthreads();
#elif VERSION == 4
        if (j + 1 < j_end) {                  // K_{j+1}, V_{j+1} in flight during block j
            load_tile<B_c>(K_s + (stage ^ 1) * B_c * SMEM_STRIDE, Kg, (j + 1) * B_c, N);
            load_tile<B_c>(V_s + (stage ^ 1) * B_c * SMEM_STRIDE, Vg, (j + 1) * B_c, N);
        }
        cp_async_commit();
#else
        load_tile<B_c>(V_s, Vg, j * B_c, N);  // V_j in flight during S_ij = Q_i K_j^T
        cp_async_commit();
#endif

        // ---- S_ij = Q_i K_j^T  (WARP_M x B_c per warp, fp32)
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#if Q_IN_REGS
#pragma unroll
#else
#pragma unroll 1                              // one k-step live at a time: fewer registers
#endif
        for (int kq = 0; kq < KQ; ++kq) {
#if Q_IN_REGS
            const u32 (*a)[4] = &q_frag[kq];
#else
            u32 a[MT][4];                     // Q_i fragments of this k-step, from shared memory
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                            smem_addr(Q_s + tile_off(wrow + mt * 16 + lane % 16, kq * 16 + (lane / 16) * 8)));
#endif
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                u32 b0, b1, b2, b3;  // (b0, b1): n-tile 2np; (b2, b3): n-tile 2np + 1
                ldmatrix_x4(b0, b1, b2, b3,
                            smem_addr(K_j + tile_off(np * 16 + lane % 8 + (lane / 16) * 8,
                                                     kq * 16 + ((lane / 8) % 2) * 8)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<IS_BF16>(s[mt][2 * np], a[mt], b0, b1);
                    mma_16816<IS_BF16>(s[mt][2 * np + 1], a[mt], b2, b3);
                }
            }
        }

        // ---- mask: columns >= N, and (causal) key index > query index
        const int col0 = j * B_c;
        if (col0 + B_c > N || (causal && col0 + B_c - 1 > row0 + wrow)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = col0 + nt * 8 + 2 * t + (e & 1);
                        const int row = row0 + wrow + mt * 16 + g + (e >> 1) * 8;
                        if (col >= N || (causal && col > row)) s[mt][nt][e] = NEG_INF;
                    }
        }

        // ---- online softmax (statistics in fp32, base 2): m_new, alpha, P_ij, l_i
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // h = 0: row g, h = 1: row g + 8
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_i[mt][h], mx * scale_log2);
            const float m_use = (m_new == NEG_INF) ? 0.f : m_new;  // fully masked so far
            const float alpha = fast_exp2(m_i[mt][h] - m_use);
            float rowsum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[mt][nt][2 * h] = fast_exp2(fmaf(s[mt][nt][2 * h], scale_log2, -m_use));
                s[mt][nt][2 * h + 1] = fast_exp2(fmaf(s[mt][nt][2 * h + 1], scale_log2, -m_use));
                rowsum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
            }
            l_i[mt][h] = l_i[mt][h] * alpha + rowsum;
            m_i[mt][h] = m_new;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                o_acc[mt][dt][2 * h] *= alpha;
                o_acc[mt][dt][2 * h + 1] *= alpha;
            }
        }

#if VERSION != 1 && VERSION != 4
        cp_async_wait<0>();                   // V_j has arrived (this thread's part)
        __syncthreads();                      // ... everyone's part; K_j no longer read
        if (j + 1 < j_end) load_tile<B_c>(K_s, Kg, (j + 1) * B_c, N);  // K_{j+1} during P V_j
        cp_async_commit();
#endif

        // ---- O_i += P_ij V_j : P_ij straight from the S accumulators (A operand layout)
#pragma unroll
        for (int kp = 0; kp < KP; ++kp) {
            u32 p_frag[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                p_frag[mt][0] = pack2<IS_BF16>(s[mt][2 * kp][0], s[mt][2 * kp][1]);
                p_frag[mt][1] = pack2<IS_BF16>(s[mt][2 * kp][2], s[mt][2 * kp][3]);
                p_frag[mt][2] = pack2<IS_BF16>(s[mt][2 * kp + 1][0], s[mt][2 * kp + 1][1]);
                p_frag[mt][3] = pack2<IS_BF16>(s[mt][2 * kp + 1][2], s[mt][2 * kp + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                u32 b0, b1, b2, b3;  // (b0, b1): d-tile 2dp; (b2, b3): d-tile 2dp + 1
                ldmatrix_x4_trans(b0, b1, b2, b3,
                                  smem_addr(V_j + tile_off(kp * 16 + lane % 16, dp * 16 + (lane / 16) * 8)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<IS_BF16>(o_acc[mt][2 * dp], p_frag[mt], b0, b1);
                    mma_16816<IS_BF16>(o_acc[mt][2 * dp + 1], p_frag[mt], b2, b3);
                }
            }
        }

#if VERSION >= 2
        cp_async_wait<0>();                   // K_{j+1} (v2, v3, v5) or K_{j+1}, V_{j+1} (v4)
        __syncthreads();                      // visible to all; V_j (and K_j) no longer read
#endif
    }

    // ---- epilogue: O_i = diag(l_i)^-1 O_i, L_i = m_i + log(l_i) (natural log)
    // Stage this warp's WARP_M x d slice of O_i in its own rows of Q_s (nobody else reads
    // them any more), then write 16-byte chunks to HBM.
    u16* O_s = Q_s;
    const float LN2 = 0.6931471805599453f;
    float* Lg = L + bh * N;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l_i[mt][h] += __shfl_xor_sync(0xffffffffu, l_i[mt][h], 1);
            l_i[mt][h] += __shfl_xor_sync(0xffffffffu, l_i[mt][h], 2);
            inv[h] = 1.f / l_i[mt][h];
            const int row = row0 + wrow + mt * 16 + g + 8 * h;
            if (t == 0 && row < N) Lg[row] = (m_i[mt][h] + __log2f(l_i[mt][h])) * LN2;
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            *reinterpret_cast<u32*>(O_s + tile_off(wrow + mt * 16 + g, dt * 8) + 2 * t) =
                pack2<IS_BF16>(o_acc[mt][dt][0] * inv[0], o_acc[mt][dt][1] * inv[0]);
            *reinterpret_cast<u32*>(O_s + tile_off(wrow + mt * 16 + g + 8, dt * 8) + 2 * t) =
                pack2<IS_BF16>(o_acc[mt][dt][2] * inv[1], o_acc[mt][dt][3] * inv[1]);
        }
    }
    __syncwarp();
    u16* Og = O + bh * N * D;
#pragma unroll
    for (int c = lane; c < WARP_M * DT; c += 32) {
        const int r = c / DT, col = (c % DT) * 8;
        if (row0 + wrow + r < N)
            *reinterpret_cast<uint4*>(Og + (size_t)(row0 + wrow + r) * D + col) =
                *reinterpret_cast<const uint4*>(O_s + tile_off(wrow + r, col));
    }
}
