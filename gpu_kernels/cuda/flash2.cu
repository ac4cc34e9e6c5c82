// flash2.cu -- FlashAttention-2 forward (Dao, 2023, Algorithm 1) in fp32 on CUDA cores.
//
// The same loop nest as flashsim's "flash2": one thread block per Q block i of one
// (batch, head); Q_i, the unnormalised O_i and the statistics m_i, l_i stay in shared memory
// while K_j, V_j stream through; the division by l_i waits until the end (deferred rescale);
// only O and the logsumexp L = m_i + log(l_i) are written.
// (flash2_tc.cu is the same algorithm on tensor cores in fp16/bf16.)
//
//   HBM traffic per head, 4-byte elements, C = sum_i cols(i) (cols(i) = N, or under the causal
//   mask the keys up to the end of the last block that Q block i reaches):
//     read  Q: N d 4;  K, V: C d 4 each        write O: N d 4;  L: 4 N
//
// Per K/V block j, one warp per row r of Q_i (rows r = warp, warp + NUM_WARPS, ...):
//   S_ij[r] = tau Q_i[r] K_j^T (masked: -inf)       m_new = max(m_i, rowmax S_ij[r])
//   P_ij[r] = exp(S_ij[r] - m_new)                   alpha = exp(m_i - m_new)
//   l_i = alpha l_i + rowsum P_ij[r]                 O_i[r] = alpha O_i[r] + P_ij[r] V_j
// and at the end O_i[r] /= l_i, L_i = m_i + log(l_i).
//
// Versions: one. Compile-time constants (defaults: flashsim.plan("flash2", head_dim=64,
// dtype="fp32", sram="48KiB"): B_r = B_c = the largest multiple of 16 that fits):
//   HEAD_DIM d    BLOCK_R B_r    BLOCK_C B_c    NUM_THREADS threads per block
// Shared memory: Q_i, O_i (B_r x d), K_j^T (d x (B_c + 1), one padding column), V_j (B_c x d),
// S_ij (B_r x B_c), m_i, l_i (B_r): the simulator's working set plus the d * 4 padding bytes.
// Layout: Q, K, V, O (B, H, N, d) fp32 contiguous; L (B, H, N) fp32.
// Grid: (ceil(N / B_r), B * H).

#ifndef HEAD_DIM   // compiled alone: the defaults below (the loaders define all three)
#define HEAD_DIM 64
#define BLOCK_R 32
#define BLOCK_C 32
#endif
#include "common.cuh"   // NUM_THREADS (default 256) and NUM_WARPS come from here

// Static shared memory (cupy/flash2.py's shared_bytes): within the 48 KB of no opt-in.
static_assert(4 * (2 * BLOCK_R * HEAD_DIM + 2 * BLOCK_R + HEAD_DIM * (BLOCK_C + 1) +
                   BLOCK_C * HEAD_DIM + BLOCK_R * BLOCK_C) <= 48 * 1024,
              "static shared memory above 48 KB");

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
flash2_fwd(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
           float* __restrict__ O, float* __restrict__ L, int N, float tau, int causal) {
    constexpr int d = HEAD_DIM, B_r = BLOCK_R, B_c = BLOCK_C;
    __shared__ float Q_i[B_r * d];
    __shared__ float O_i[B_r * d];
    __shared__ float m_i[B_r], l_i[B_r];
    __shared__ float Kt_j[d * (B_c + 1)];  // K_j transposed: Kt_j[k][c] = K_j[c][k]
    __shared__ float V_j[B_c * d];
    __shared__ float S_ij[B_r * B_c];

    const size_t bh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int i = blockIdx.x, row0 = i * B_r, rows = min(B_r, N - row0);   // Q block i
    const float* Qg = Q + bh * N * d;
    const float* Kg = K + bh * N * d;
    const float* Vg = V + bh * N * d;

    for (int e = tid; e < B_r * d; e += NUM_THREADS) {               // load Q_i; O_i = 0
        Q_i[e] = (e / d < rows) ? Qg[(size_t)row0 * d + e] : 0.f;
        O_i[e] = 0.f;
    }
    for (int r = tid; r < B_r; r += NUM_THREADS) { m_i[r] = neg_inf(); l_i[r] = 0.f; }

    // K/V block j, keys col0 = j B_c ..; causal: up to the block holding key row0 + rows - 1
    const int col_end = causal ? min(N, ((row0 + rows - 1) / B_c + 1) * B_c) : N;
    for (int j = 0, col0 = 0; col0 < col_end; ++j, col0 += B_c) {
        const int cols = min(B_c, N - col0);
        __syncthreads();                                             // done with K_{j-1}, V_{j-1}
        for (int e = tid; e < B_c * d; e += NUM_THREADS) {           // load K_j, V_j
            const int c = e / d, k = e % d;
            const bool valid = c < cols;
            Kt_j[k * (B_c + 1) + c] = valid ? Kg[(size_t)(col0 + c) * d + k] : 0.f;
            V_j[e] = valid ? Vg[(size_t)col0 * d + e] : 0.f;
        }
        __syncthreads();
        for (int r = warp; r < rows; r += NUM_WARPS) {               // one warp per row
            // S_ij[r] = tau Q_i[r] K_j^T (masked); m_new = max(m_i, rowmax S_ij[r])
            const float mx = warp_score_row<d, B_c>(&Q_i[r * d], Kt_j, &S_ij[r * B_c], lane, cols,
                                                    tau, causal, col0, row0 + r);
            const float m_old = m_i[r];
            const float m_new = fmaxf(m_old, warp_max(mx));          // running max
            // P_ij[r] = exp(S_ij[r] - m_new), unnormalised, in place; its row sum
            const float rowsum = warp_exp_row(&S_ij[r * B_c], lane, cols, m_new);
            __syncwarp();                                            // P_ij row visible to the warp
            const float alpha = exp_diff(m_old, m_new);              // rescale old state
            for (int c = lane; c < d; c += 32) {                     // O_i = alpha O_i + P_ij V_j
                const float pv = pv_entry<d>(&S_ij[r * B_c], V_j, c, cols);
                O_i[r * d + c] = alpha * O_i[r * d + c] + pv;
            }
            __syncwarp();
            if (lane == 0) { l_i[r] = alpha * l_i[r] + rowsum; m_i[r] = m_new; }
        }
    }
    __syncthreads();
    // O_i = O_i / l_i (deferred rescale); L_i = m_i + log(l_i); write O_i, L_i
    float* Og = O + bh * N * d + (size_t)row0 * d;
    for (int e = tid; e < rows * d; e += NUM_THREADS) Og[e] = O_i[e] / l_i[e / d];
    for (int r = tid; r < rows; r += NUM_THREADS) L[bh * N + row0 + r] = m_i[r] + logf(l_i[r]);
}
