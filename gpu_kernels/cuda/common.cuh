// common.cuh -- what the attention kernels in this folder share; every .cu includes it.
//
//   NUM_THREADS, NUM_WARPS  threads (default 256) and warps per block
//   neg_inf()            -inf as a float (no <cmath> under NVRTC)
//   cdiv(a, b)           ceil(a / b) for positive a, b: the blocks of b covering a
//   warp_max, warp_sum   a reduction over the 32 lanes of a warp (every lane gets the result)
//   exp_diff(a, b)       exp(a - b), with exp(-inf - (-inf)) read as 0 (flashsim's exp_diff)
//   fast_exp2(x)         2^x by ex2.approx (ex2.approx(-inf) = 0)
//   warp_score_row, warp_exp_row, pv_entry: one row of S_ij, P_ij and P_ij V_j per warp (the
//   fp32 kernels flash1.cu and flash2.cu)
//   PTX wrappers for the tensor-core kernels: smem_addr, cp.async (16 bytes, commit, wait),
//   ldmatrix (x4, .trans), mma.sync m16n8k16 with fp32 accumulation and pack2 (fp32 pair to
//   fp16x2 / bf16x2), the last two for fp16 (BF16 = 0) or bf16 (BF16 = 1) operands.
//
// No headers are included: conversions and tensor-core instructions are inline PTX, so the
// kernels compile under NVRTC without the CUDA toolkit's include folder. The loaders
// (gpu_kernels/cupy/common.py) paste this file in place of the #include line, so CuPy's
// compile cache sees its text.

#ifndef FLASHSIM_COMMON_CUH
#define FLASHSIM_COMMON_CUH

typedef unsigned int u32;
typedef unsigned short u16;

// Threads per block: the SIMT kernels take NUM_THREADS (default 256), the tensor-core kernel
// defines it from its warps before including this file. Whole warps either way.
#ifndef NUM_THREADS
#define NUM_THREADS 256
#endif
#ifndef NUM_WARPS
#define NUM_WARPS (NUM_THREADS / 32)
#endif
static_assert(NUM_THREADS % 32 == 0, "whole warps");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float exp_diff(float a, float b) {
    return (a == neg_inf()) ? 0.f : expf(a - b);
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---------------------------------------------------------------- one row per warp (fp32)
// The SIMT kernels (flash1.cu, flash2.cu) give each warp a row r of Q_i (row-major, d wide),
// K_j transposed (Kt_j[k * (B_c + 1) + c]: one padding column) and V_j (row-major, d wide);
// lane l handles the columns l, l + 32, ... of the row.

// S_ij[r, c] = tau Q_i[r] . K_j[c] for c < cols (-inf where the causal mask hides key
// key0 + c from query ``query``) into S_r; returns this lane's maximum of them.
template <int d, int B_c>
__device__ __forceinline__ float warp_score_row(const float* Q_r, const float* Kt_j, float* S_r,
                                                int lane, int cols, float tau, int causal,
                                                int key0, int query) {
    float mx = neg_inf();
    for (int c = lane; c < cols; c += 32) {
        float s = 0.f;
        for (int k = 0; k < d; ++k) s = fmaf(Q_r[k], Kt_j[k * (B_c + 1) + c], s);
        s *= tau;
        if (causal && key0 + c > query) s = neg_inf();
        S_r[c] = s;
        mx = fmaxf(mx, s);
    }
    return mx;
}

// S_r[c] = exp(S_r[c] - m) for c < cols (exp_diff: 0 where masked); returns the row's sum.
__device__ __forceinline__ float warp_exp_row(float* S_r, int lane, int cols, float m) {
    float sum = 0.f;
    for (int c = lane; c < cols; c += 32) {
        const float p = exp_diff(S_r[c], m);
        S_r[c] = p;
        sum += p;
    }
    return warp_sum(sum);
}

// (P_ij V_j)[r, c] = sum over k < cols of P_r[k] V_j[k, c].
template <int d>
__device__ __forceinline__ float pv_entry(const float* P_r, const float* V_j, int c, int cols) {
    float pv = 0.f;
    for (int k = 0; k < cols; ++k) pv = fmaf(P_r[k], V_j[k * d + c], pv);
    return pv;
}

// ---------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
    // src_size 0 fills the 16 bytes with zeros (rows past N).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(n)); }

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// D (16x8 fp32) += A (16x16, row) * B (16x8, col); A, B fp16 (BF16 = 0) or bf16 (BF16 = 1)
template <int BF16>
__device__ __forceinline__ void mma_16816(float* d, const u32* a, u32 b0, u32 b1) {
    if constexpr (BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two fp32 values -> one register holding two 16-bit values (lo in the low half).
template <int BF16>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

#endif  // FLASHSIM_COMMON_CUH
