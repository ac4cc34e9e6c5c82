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

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK_R
#define BLOCK_R 32
#endif
#ifndef BLOCK_C
#define BLOCK_C 32
#endif
#ifndef NUM_THREADS
#define NUM_THREADS 256
#endif

#define NUM_WARPS (NUM_THREADS / 32)
static_assert(NUM_THREADS % 32 == 0, "whole warps");

#include "common.cuh"

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
            float mx = neg_inf();
            for (int c = lane; c < cols; c += 32) {                  // S_ij = tau Q_i K_j^T
                float s = 0.f;
                for (int k = 0; k < d; ++k) s = fmaf(Q_i[r * d + k], Kt_j[k * (B_c + 1) + c], s);
                s *= tau;
                if (causal && col0 + c > row0 + r) s = neg_inf();
                S_ij[r * B_c + c] = s;
                mx = fmaxf(mx, s);
            }
            const float m_old = m_i[r];
            const float m_new = fmaxf(m_old, warp_max(mx));          // running max
            float rowsum = 0.f;
            for (int c = lane; c < cols; c += 32) {                  // P_ij, unnormalised
                const float p = exp_diff(S_ij[r * B_c + c], m_new);
                S_ij[r * B_c + c] = p;
                rowsum += p;
            }
            rowsum = warp_sum(rowsum);
            __syncwarp();                                            // P_ij row visible to the warp
            const float alpha = exp_diff(m_old, m_new);              // rescale old state
            for (int c = lane; c < d; c += 32) {                     // O_i = alpha O_i + P_ij V_j
                float pv = 0.f;
                for (int k = 0; k < cols; ++k) pv = fmaf(S_ij[r * B_c + k], V_j[k * d + c], pv);
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
