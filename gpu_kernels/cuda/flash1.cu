// flash1.cu -- FlashAttention forward (Dao et al., 2022, Algorithm 1) in fp32 on CUDA cores.
//
// The same loop nest as flashsim's "flash1": outer loop over K/V blocks j (K_j, V_j held in
// shared memory), inner loop over Q blocks i; for every (j, i) the block reads Q_i, O_i, l_i, m_i
// from HBM, updates them with S_ij = tau Q_i K_j^T and writes O_i, l_i, m_i back. O, l, m are
// initialised in HBM (0, 0, -inf) first, as line 2 of the algorithm does.
// Parallelism is over (batch, head) only: one thread block runs the whole nest of one head,
// as the original FlashAttention CUDA kernel did (FlashAttention-2 added the split over Q
// blocks). The j loop cannot be split across blocks: every j updates every O_i.
//
//   HBM traffic per head, 4-byte elements, R = sum_j rows(j) (rows(j) = N, or under the causal
//   mask N - floor(j B_c / B_r) B_r, the Q rows block j reaches):
//     read  K, V: N d 4 each;  Q, O: R d 4 each;  l, m: 4 R each
//     write O: R d 4 + N d 4;  l, m: 4 R + 4 N each     (+ N terms: the initialisation)
//
// Per (j, i) step, one warp per row r of Q_i (rows r = warp, warp + NUM_WARPS, ...):
//   S_ij[r] = tau Q_i[r] K_j^T (masked: -inf)     mt = rowmax S_ij[r]
//   P~_ij[r] = exp(S_ij[r] - mt)                  lt = rowsum P~_ij[r]
//   m_new = max(m_i, mt)  l_new = e^(m_i - m_new) l_i + e^(mt - m_new) lt
//   O_i[r] = (l_i e^(m_i - m_new) O_i[r] + e^(mt - m_new) P~_ij[r] V_j) / l_new
// The row statistics m~_ij, l~_ij stay in the warp's registers.
//
// Versions: one. Compile-time constants (defaults: flashsim.plan("flash1", head_dim=64,
// dtype="fp32", sram="48KiB"): the paper's B_c = ceil(M / 4d), B_r = min(B_c, d), shrunk to fit):
//   HEAD_DIM d    BLOCK_R B_r    BLOCK_C B_c    NUM_THREADS threads per block
// Shared memory: K_j^T (d x (B_c + 1), one padding column), V_j (B_c x d), Q_i, O_i (B_r x d),
// S_ij (B_r x B_c), l_i, m_i (B_r): the simulator's working set plus the d * 4 padding bytes.
// Layout: Q, K, V, O (B, H, N, d) fp32 contiguous; l, m (B, H, N) fp32. Grid: (B * H).

#ifndef HEAD_DIM   // compiled alone: the defaults below (the loaders define all three)
#define HEAD_DIM 64
#define BLOCK_R 33
#define BLOCK_C 33
#endif
#include "common.cuh"   // NUM_THREADS (default 256) and NUM_WARPS come from here

// Static shared memory (cupy/flash1.py's shared_bytes): within the 48 KB of no opt-in.
static_assert(4 * (HEAD_DIM * (BLOCK_C + 1) + BLOCK_C * HEAD_DIM + 2 * BLOCK_R * HEAD_DIM +
                   BLOCK_R * BLOCK_C + 2 * BLOCK_R) <= 48 * 1024, "static shared memory above 48 KB");

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
flash1_fwd(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
           float* __restrict__ O, float* __restrict__ l, float* __restrict__ m,
           int N, float tau, int causal) {
    constexpr int d = HEAD_DIM, B_r = BLOCK_R, B_c = BLOCK_C;
    __shared__ float Kt_j[d * (B_c + 1)];  // K_j transposed: Kt_j[k][c] = K_j[c][k]
    __shared__ float V_j[B_c * d];
    __shared__ float Q_i[B_r * d];
    __shared__ float O_i[B_r * d];
    __shared__ float S_ij[B_r * B_c];
    __shared__ float l_i[B_r], m_i[B_r];

    const size_t bh = blockIdx.x;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const float* Qg = Q + bh * N * d;
    const float* Kg = K + bh * N * d;
    const float* Vg = V + bh * N * d;
    float* Og = O + bh * N * d;
    float* lg = l + bh * N;
    float* mg = m + bh * N;

    // line 2: O = 0, l = 0, m = -inf in HBM
    for (int e = tid; e < N * d; e += NUM_THREADS) Og[e] = 0.f;
    for (int r = tid; r < N; r += NUM_THREADS) { lg[r] = 0.f; mg[r] = neg_inf(); }

    // outer loop: K/V block j, keys col0 = j B_c .. (j and col0 advance together)
    for (int j = 0, col0 = 0; col0 < N; ++j, col0 += B_c) {
        const int cols = min(B_c, N - col0);
        __syncthreads();                                             // HBM init / K_{j-1} done
        for (int e = tid; e < B_c * d; e += NUM_THREADS) {           // load K_j, V_j
            const int c = e / d, k = e % d;
            const bool valid = c < cols;
            Kt_j[k * (B_c + 1) + c] = valid ? Kg[(size_t)(col0 + c) * d + k] : 0.f;
            V_j[e] = valid ? Vg[(size_t)col0 * d + e] : 0.f;
        }
        const int i_start = causal ? col0 / B_r : 0;                 // first Q block reached
        // inner loop: Q block i, queries row0 = i B_r ..
        for (int i = i_start, row0 = i_start * B_r; row0 < N; ++i, row0 += B_r) {
            const int rows = min(B_r, N - row0);
            __syncthreads();                                         // K_j, V_j in; Q_{i-1} done
            for (int e = tid; e < rows * d; e += NUM_THREADS) {      // load Q_i, O_i
                Q_i[e] = Qg[(size_t)row0 * d + e];
                O_i[e] = Og[(size_t)row0 * d + e];
            }
            for (int r = tid; r < rows; r += NUM_THREADS) {          // load l_i, m_i
                l_i[r] = lg[row0 + r];
                m_i[r] = mg[row0 + r];
            }
            __syncthreads();
            for (int r = warp; r < rows; r += NUM_WARPS) {           // one warp per row
                // S_ij[r] = tau Q_i[r] K_j^T (masked); m~_ij = rowmax S_ij[r]
                const float mt = warp_max(warp_score_row<d, B_c>(&Q_i[r * d], Kt_j, &S_ij[r * B_c],
                                                                 lane, cols, tau, causal, col0,
                                                                 row0 + r));
                // P~_ij[r] = exp(S_ij[r] - m~_ij) in place; l~_ij = rowsum P~_ij[r]
                const float lt = warp_exp_row(&S_ij[r * B_c], lane, cols, mt);
                __syncwarp();                                        // P~_ij row visible to the warp
                const float m_old = m_i[r], l_old = l_i[r];
                const float m_new = fmaxf(m_old, mt);
                const float a = exp_diff(m_old, m_new), bt = exp_diff(mt, m_new);
                const float l_new = a * l_old + bt * lt;
                for (int c = lane; c < d; c += 32) {
                    const float pv = pv_entry<d>(&S_ij[r * B_c], V_j, c, cols);   // P~_ij V_j
                    O_i[r * d + c] = (l_old * a * O_i[r * d + c] + bt * pv) / l_new;
                }
                __syncwarp();
                if (lane == 0) { l_i[r] = l_new; m_i[r] = m_new; }
            }
            __syncthreads();
            for (int e = tid; e < rows * d; e += NUM_THREADS)        // write O_i, l_i, m_i
                Og[(size_t)row0 * d + e] = O_i[e];
            for (int r = tid; r < rows; r += NUM_THREADS) {
                lg[row0 + r] = l_i[r];
                mg[row0 + r] = m_i[r];
            }
        }
    }
}
