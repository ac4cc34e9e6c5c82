// common.cuh -- what the attention kernels in this folder share; every .cu includes it.
//
//   neg_inf()            -inf as a float (no <cmath> under NVRTC)
//   cdiv(a, b)           ceil(a / b) for positive a, b: the blocks of b covering a
//   warp_max, warp_sum   a reduction over the 32 lanes of a warp (every lane gets the result)
//   exp_diff(a, b)       exp(a - b), with exp(-inf - (-inf)) read as 0 (flashsim's exp_diff)
//   fast_exp2(x)         2^x by ex2.approx (ex2.approx(-inf) = 0)
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
