// standard.cu -- standard attention in fp32 on CUDA cores (SIMT), three launches.
//
// The same schedule as flashsim's "standard" (FlashAttention paper, Algorithm 0):
//   kernel 1  standard_qk         S = tau Q K^T      one thread block per Q block i (Q_i resident),
//                                                    K_j streamed; S_ij stored to HBM
//   kernel 2  standard_softmax    P = softmax(S)     R whole rows per thread block, or, when one
//             standard_softmax_streaming             row does not fit (R = 0), B_r x B_c tiles
//                                                    read twice (online m_i, l_i; then normalise)
//   kernel 3  standard_pv         O = P V            one thread block per Q block i, O_i
//                                                    accumulated in shared memory
// Causal: S is computed in full (as eager frameworks do) and the mask is applied inside the
// softmax, so the masked entries of P are 0 and kernel 3 multiplies them anyway.
//
//   HBM traffic per (batch, head), 4-byte elements, T_r = ceil(N / B_r):
//     kernel 1  read Q: N d 4, K: T_r N d 4          write S: N^2 4
//     kernel 2  read S: N^2 4 (2 N^2 4 when R = 0)   write P: N^2 4
//     kernel 3  read P: N^2 4, V: T_r N d 4          write O: N d 4
//
// Versions: one. Compile-time constants (defaults: flashsim.plan("standard", head_dim=64,
// dtype="fp32", sram="48KiB"), i.e. the 64 x 64 matmul tile):
//   HEAD_DIM d    BLOCK_R B_r    BLOCK_C B_c    NUM_THREADS threads per block
// Shared memory: kernel 1 holds Q_i (B_r x d) and K_j^T (d x (B_c + 1), one padding column
// so that the transposed store is free of bank conflicts); S_ij leaves registers straight for
// HBM. Kernel 3 holds P_ij, V_j, O_i: the simulator's working set b (B_r d + B_c d + B_r B_c).
// Kernel 2 takes R (N + 2) * 4 bytes of dynamic shared memory (R rows, m_r, l_r).
// Layout: Q, K, V, O (B, H, N, d) fp32 contiguous; S, P (B, H, N, N) fp32.
// Grid: kernels 1, 3 and the streaming softmax (ceil(N / B_r), B * H); kernel 2 (ceil(N / R), B * H).

#ifndef HEAD_DIM   // compiled alone: the defaults below (the loaders define all three)
#define HEAD_DIM 64
#define BLOCK_R 64
#define BLOCK_C 64
#endif
#include "common.cuh"   // NUM_THREADS (default 256) and NUM_WARPS come from here

// Static shared memory of kernels 1 and 3 (kernel 2's is dynamic): within the 48 KB a block
// gets without the opt-in (cupy/standard.py's shared_bytes says the same).
static_assert(4 * (BLOCK_R * HEAD_DIM + HEAD_DIM * (BLOCK_C + 1)) <= 48 * 1024 &&
              4 * (BLOCK_R * BLOCK_C + BLOCK_C * HEAD_DIM + BLOCK_R * HEAD_DIM) <= 48 * 1024,
              "static shared memory above 48 KB");

// ------------------------------------------------------------------ kernel 1: S = tau Q K^T
extern "C" __global__ void __launch_bounds__(NUM_THREADS)
standard_qk(const float* __restrict__ Q, const float* __restrict__ K, float* __restrict__ S,
            int N, float tau) {
    constexpr int d = HEAD_DIM, B_r = BLOCK_R, B_c = BLOCK_C;
    constexpr int PER_THREAD = (B_r * B_c + NUM_THREADS - 1) / NUM_THREADS;  // S_ij entries
    __shared__ float Q_i[B_r * d];
    __shared__ float Kt_j[d * (B_c + 1)];  // K_j transposed: Kt_j[k][c] = K_j[c][k]

    const size_t bh = blockIdx.y;
    const int i = blockIdx.x, tid = threadIdx.x;
    const int row0 = i * B_r, rows = min(B_r, N - row0);
    const float* Qg = Q + bh * N * d;
    const float* Kg = K + bh * N * d;
    float* Sg = S + bh * N * N;

    for (int e = tid; e < B_r * d; e += NUM_THREADS)                 // load Q_i
        Q_i[e] = (e / d < rows) ? Qg[(size_t)row0 * d + e] : 0.f;

    for (int j = 0, col0 = 0; col0 < N; ++j, col0 += B_c) {          // K block j: keys col0 = j B_c ..
        const int cols = min(B_c, N - col0);
        __syncthreads();                                             // done with K_{j-1}
        for (int e = tid; e < B_c * d; e += NUM_THREADS) {           // load K_j (transposed)
            const int c = e / d, k = e % d;
            Kt_j[k * (B_c + 1) + c] = (c < cols) ? Kg[(size_t)(col0 + c) * d + k] : 0.f;
        }
        __syncthreads();
        float acc[PER_THREAD];
#pragma unroll
        for (int q = 0; q < PER_THREAD; ++q) acc[q] = 0.f;
        for (int k = 0; k < d; ++k) {
#pragma unroll
            for (int q = 0; q < PER_THREAD; ++q) {
                const int e = min(tid + q * NUM_THREADS, B_r * B_c - 1);
                acc[q] = fmaf(Q_i[(e / B_c) * d + k], Kt_j[k * (B_c + 1) + e % B_c], acc[q]);
            }
        }
#pragma unroll
        for (int q = 0; q < PER_THREAD; ++q) {                       // store S_ij
            const int e = tid + q * NUM_THREADS, r = e / B_c, c = e % B_c;
            if (e < B_r * B_c && r < rows && c < cols)
                Sg[(size_t)(row0 + r) * N + col0 + c] = tau * acc[q];
        }
    }
}

// ------------------------------------------------------------------ kernel 2: P = softmax(S)
// R whole rows in shared memory; one warp per row. Causal: key c > query r gets P = 0.
extern "C" __global__ void __launch_bounds__(NUM_THREADS)
standard_softmax(const float* __restrict__ S, float* __restrict__ P, int N, int R, int causal) {
    extern __shared__ float smem[];
    float* S_r = smem;              // R x N
    float* m_r = S_r + R * N;       // R
    float* l_r = m_r + R;           // R
    const size_t bh = blockIdx.y;
    const int r0 = blockIdx.x * R, rows = min(R, N - r0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float* Sg = S + bh * N * N + (size_t)r0 * N;
    float* Pg = P + bh * N * N + (size_t)r0 * N;

    for (int e = threadIdx.x; e < rows * N; e += NUM_THREADS) S_r[e] = Sg[e];  // read once
    __syncthreads();
    for (int r = warp; r < rows; r += NUM_WARPS) {
        const int last = causal ? r0 + r : N - 1;  // last visible key
        float m = neg_inf();
        for (int c = lane; c <= last; c += 32) m = fmaxf(m, S_r[r * N + c]);
        m = warp_max(m);
        float l = 0.f;
        for (int c = lane; c <= last; c += 32) l += expf(S_r[r * N + c] - m);
        l = warp_sum(l);
        if (lane == 0) { m_r[r] = m; l_r[r] = l; }
        for (int c = lane; c < N; c += 32)
            S_r[r * N + c] = (c <= last) ? expf(S_r[r * N + c] - m) / l : 0.f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * N; e += NUM_THREADS) Pg[e] = S_r[e];  // write once
}

// Rows too long for shared memory: B_r x B_c tiles of S, read twice.
extern "C" __global__ void __launch_bounds__(NUM_THREADS)
standard_softmax_streaming(const float* __restrict__ S, float* __restrict__ P, int N, int causal) {
    constexpr int B_r = BLOCK_R, B_c = BLOCK_C;
    __shared__ float S_ij[B_r * B_c];
    __shared__ float m_i[B_r], l_i[B_r];
    const size_t bh = blockIdx.y;
    const int i = blockIdx.x, row0 = i * B_r, rows = min(B_r, N - row0);   // Q block i
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float* Sg = S + bh * N * N;
    float* Pg = P + bh * N * N;

    for (int r = threadIdx.x; r < B_r; r += NUM_THREADS) { m_i[r] = neg_inf(); l_i[r] = 0.f; }
    for (int pass = 0; pass < 2; ++pass) {  // pass 0: online m_i, l_i; pass 1: P_ij
        for (int j = 0, col0 = 0; col0 < N; ++j, col0 += B_c) {       // block j: keys col0 = j B_c ..
            const int cols = min(B_c, N - col0);
            __syncthreads();
            for (int e = threadIdx.x; e < rows * B_c; e += NUM_THREADS) {   // load S_ij
                const int r = e / B_c, c = e % B_c;
                const bool visible = c < cols && !(causal && col0 + c > row0 + r);
                S_ij[e] = visible ? Sg[(size_t)(row0 + r) * N + col0 + c] : neg_inf();
            }
            __syncthreads();
            for (int r = warp; r < rows; r += NUM_WARPS) {
                if (pass == 0) {
                    float mx = neg_inf();
                    for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, S_ij[r * B_c + c]);
                    const float m_new = fmaxf(m_i[r], warp_max(mx));
                    float s = 0.f;
                    if (m_new != neg_inf())
                        for (int c = lane; c < cols; c += 32) s += expf(S_ij[r * B_c + c] - m_new);
                    s = warp_sum(s);
                    const float alpha = (m_i[r] == neg_inf()) ? 0.f : expf(m_i[r] - m_new);
                    __syncwarp();
                    if (lane == 0) { l_i[r] = alpha * l_i[r] + s; m_i[r] = m_new; }
                } else {
                    for (int c = lane; c < cols; c += 32) {
                        const float x = S_ij[r * B_c + c];
                        Pg[(size_t)(row0 + r) * N + col0 + c] =
                            (x == neg_inf()) ? 0.f : expf(x - m_i[r]) / l_i[r];
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------ kernel 3: O = P V
extern "C" __global__ void __launch_bounds__(NUM_THREADS)
standard_pv(const float* __restrict__ P, const float* __restrict__ V, float* __restrict__ O, int N) {
    constexpr int d = HEAD_DIM, B_r = BLOCK_R, B_c = BLOCK_C;
    __shared__ float P_ij[B_r * B_c];
    __shared__ float V_j[B_c * d];
    __shared__ float O_i[B_r * d];
    const size_t bh = blockIdx.y;
    const int i = blockIdx.x, row0 = i * B_r, rows = min(B_r, N - row0);  // Q block i
    const int tid = threadIdx.x;
    const float* Pg = P + bh * N * N;
    const float* Vg = V + bh * N * d;

    for (int e = tid; e < B_r * d; e += NUM_THREADS) O_i[e] = 0.f;
    for (int j = 0, col0 = 0; col0 < N; ++j, col0 += B_c) {          // block j: keys col0 = j B_c ..
        const int cols = min(B_c, N - col0);
        __syncthreads();
        for (int e = tid; e < B_r * B_c; e += NUM_THREADS) {         // load P_ij
            const int r = e / B_c, c = e % B_c;
            P_ij[e] = (r < rows && c < cols) ? Pg[(size_t)(row0 + r) * N + col0 + c] : 0.f;
        }
        for (int e = tid; e < B_c * d; e += NUM_THREADS)             // load V_j
            V_j[e] = (e / d < cols) ? Vg[(size_t)col0 * d + e] : 0.f;
        __syncthreads();
        for (int e = tid; e < B_r * d; e += NUM_THREADS) {           // O_i += P_ij V_j
            const int r = e / d, c = e % d;
            float acc = O_i[e];
            for (int k = 0; k < B_c; ++k) acc = fmaf(P_ij[r * B_c + k], V_j[k * d + c], acc);
            O_i[e] = acc;
        }
    }
    __syncthreads();
    float* Og = O + bh * N * d + (size_t)row0 * d;
    for (int e = tid; e < rows * d; e += NUM_THREADS) Og[e] = O_i[e];  // store O_i
}
