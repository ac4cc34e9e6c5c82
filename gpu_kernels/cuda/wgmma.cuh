// wgmma.cuh -- Hopper's warpgroup MMA for attention (sm_90a): the swizzled shared-memory tiles,
// S = Q_w K_j^T and O += P V_j of one warpgroup of 64 query rows, and the online softmax of a
// block on the accumulators. Written for flash3.cu (whose header explains the layouts) and
// shared with decode.cu's v5; both include common.cuh first.
//
// The including file defines HEAD_DIM (64, 128 or 256), BLOCK_R (the Q tile's rows, 64 per
// warpgroup), BLOCK_C (B_c: 64 or 128) and IS_BF16.

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh needs the sm_90a target (wgmma, setmaxnreg): --gpu-architecture=sm_90a"
#endif

#define PANEL_BYTES(rows) ((rows) * 128)                 // one 64-column panel of a tile
#define TILE_BYTES(rows) (PANEL_BYTES(rows) * (HEAD_DIM / 64))

typedef unsigned long long u64;

// ---------------------------------------------------------------- wgmma (warpgroup MMA)
// D (64 x N fp32, N/2 registers per thread) = (or +=) A (64 x 16) B (16 x N). Accumulator
// register 4 n + e of a thread (lane = 4 g + t of warp q of the warpgroup) holds row
// 16 q + g + 8 (e / 2), column 8 n + 2 t + (e % 2): the mma.sync m16n8 layout, repeated.
// A in registers (RS) is the mma.sync m16n8k16 A fragment of the warp's 16 rows.
#if IS_BF16
#define WG_TYPES ".f32.bf16.bf16"
#else
#define WG_TYPES ".f32.f16.f16"
#endif
#define WG_ACC32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_ACC64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_ACC128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_F32(i) WG_F8(i), WG_F8(i + 8), WG_F8(i + 16), WG_F8(i + 24)
#define WG_OPS32 WG_F32(0)
#define WG_OPS64 WG_F32(0), WG_F32(32)
#define WG_OPS128 WG_F32(0), WG_F32(32), WG_F32(64), WG_F32(96)

template <int N> struct Wgmma;
// ss: A and B from shared memory (descriptors), B K-major; scale_d = 0 overwrites D.
// rs: A from registers (4 x fp16x2), B from shared memory N-major (transpose bit set).
// The operand numbers after the accumulators: a0..a5 (%N/2 ...).
#define DEFINE_WGMMA(N, ACC, OPS, a0, a1, a2, a3, a4, a5)                                        \
    template <> struct Wgmma<N> {                                                                \
        static __device__ __forceinline__ void ss(float* d, u64 da, u64 db, int scale_d) {       \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " a2 ", 0;\n"                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16" WG_TYPES " " ACC ", " a0   \
                         ", " a1 ", p, 1, 1, 0, 0;\n}\n"                                         \
                         : OPS : "l"(da), "l"(db), "r"(scale_d));                                \
        }                                                                                        \
        static __device__ __forceinline__ void rs(float* d, const u32* a, u64 db, int scale_d) { \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " a5 ", 0;\n"                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16" WG_TYPES " " ACC ", {" a0  \
                         ", " a1 ", " a2 ", " a3 "}, " a4 ", p, 1, 1, 1;\n}\n"                    \
                         : OPS : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),            \
                           "r"(scale_d));                                                        \
        }                                                                                        \
    };
DEFINE_WGMMA(64, WG_ACC32, WG_OPS32, "%32", "%33", "%34", "%35", "%36", "%37")
DEFINE_WGMMA(128, WG_ACC64, WG_OPS64, "%64", "%65", "%66", "%67", "%68", "%69")
DEFINE_WGMMA(256, WG_ACC128, WG_OPS128, "%128", "%129", "%130", "%131", "%132", "%133")

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int n>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(n) : "memory"); }
// After a wait, tie the accumulators to it: the compiler may not move their reads before it.
template <int n>
__device__ __forceinline__ void fence_regs(float (&r)[n]) {
#pragma unroll
    for (int i = 0; i < n; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
// ... and the A fragments of an RS GEMM: wgmma reads them asynchronously, so they stay live
// (their registers unused for anything else) until the wait.
template <int n>
__device__ __forceinline__ void fence_regs(u32 (&r)[n]) {
#pragma unroll
    for (int i = 0; i < n; ++i) asm volatile("" : "+r"(r[i]) :: "memory");
}

// Shared-memory matrix descriptor: start address, LBO, SBO = 1024 (8 rows of 128 bytes),
// swizzle mode 1 (128 B) in bits 62-63; addresses and offsets in 16-byte units.
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lbo_bytes) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo_bytes >> 4) << 16) | ((u64)(1024 >> 4) << 32) |
           (1ull << 62);
}

// Byte offset of 16-byte chunk c (columns 8c .. 8c + 7) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ u32 tile_off(int rows, int r, int c) {
    return (c / 8) * PANEL_BYTES(rows) + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

// Ordinary (generic-proxy) writes to shared memory made visible to wgmma and TMA (async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Named barriers (0 is __syncthreads): bar.sync waits until ``threads`` threads have reached
// barrier ``id``; bar.arrive counts this thread without waiting (the warpgroup ping-pong).
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
// A warpgroup's registers per thread lowered or raised (every warp of it executes the same one):
// a producer warpgroup gives its registers to the consumers (flash3.cu's v3, decode.cu's v17).
template <int regs> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(regs));
}
template <int regs> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(regs));
}

// ---------------------------------------------------------------- the two GEMMs of a warpgroup
constexpr int S_REGS = BLOCK_C / 2;    // S_ij: 64 x B_c fp32 per warpgroup
constexpr int O_REGS = HEAD_DIM / 2;   // O_i: 64 x d fp32 per warpgroup
constexpr int P_REGS = BLOCK_C / 4;    // P_ij: 64 x B_c fp16/bf16, as B_c / 16 A fragments

// S = Q_w K_j^T (issued, committed, not waited for). Q_w: this warpgroup's 64 rows of Q_i.
__device__ __forceinline__ void gemm_qk(float (&s)[S_REGS], u32 q_tile, int w, u32 k_tile) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const u32 a = q_tile + (kk / 4) * PANEL_BYTES(BLOCK_R) + w * 64 * 128 + (kk % 4) * 32;
        const u32 b = k_tile + (kk / 4) * PANEL_BYTES(BLOCK_C) + (kk % 4) * 32;
        Wgmma<BLOCK_C>::ss(s, smem_desc(a, 16), smem_desc(b, 16), kk > 0);
    }
    wgmma_commit();
}
// O += P V_j (issued, committed, not waited for): 16 keys per k-step, V_j N-major.
__device__ __forceinline__ void gemm_pv(float (&o)[O_REGS], const u32 (&p)[P_REGS], u32 v_tile) {
    wgmma_fence();
#pragma unroll
    for (int kp = 0; kp < BLOCK_C / 16; ++kp)
        Wgmma<HEAD_DIM>::rs(o, &p[4 * kp], smem_desc(v_tile + kp * 16 * 128, PANEL_BYTES(BLOCK_C)), 1);
    wgmma_commit();
}

// ---------------------------------------------------------------- softmax pieces
// Online softmax of one block (base 2, statistics fp32): m_i, l_i updated, S_ij -> P_ij in place,
// alpha[h] = exp2(m_old - m_new) returned for the rescale of O_i (rows g, g + 8: h = 0, 1).
// HALVES 1: rows g only (decode.cu's v16 puts its padding rows at g + 8: left as they are, alpha 1).
// TREE (decode.cu's v25): a row's max and sum over 4 partial chains, not one: a chain of B_c / 4
// dependent FMNMX / FADD is as many latencies per tile (the sum's order changes, still fixed).
template <int HALVES = 2, bool TREE = false>
__device__ __forceinline__ void softmax_step(float (&s)[S_REGS], float (&m_i)[2], float (&l_i)[2],
                                             float (&alpha)[2], float scale_log2) {
    constexpr int CHAINS = TREE ? 4 : 1;
    const float NEG_INF = neg_inf();
    if (HALVES == 1) alpha[1] = 1.f;
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        float mc[CHAINS];
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) mc[c] = NEG_INF;
#pragma unroll
        for (int n = 0; n < BLOCK_C / 8; ++n)
            mc[n % CHAINS] = fmaxf(mc[n % CHAINS], fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
        float mx = TREE ? fmaxf(fmaxf(mc[0], mc[1 % CHAINS]), fmaxf(mc[2 % CHAINS], mc[3 % CHAINS])) : mc[0];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 threads of a row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_i[h], mx * scale_log2);
        const float m_use = (m_new == NEG_INF) ? 0.f : m_new;  // fully masked so far
        alpha[h] = fast_exp2(m_i[h] - m_use);
        float rc[CHAINS];
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) rc[c] = 0.f;
#pragma unroll
        for (int n = 0; n < BLOCK_C / 8; ++n) {
            s[4 * n + 2 * h] = fast_exp2(fmaf(s[4 * n + 2 * h], scale_log2, -m_use));
            s[4 * n + 2 * h + 1] = fast_exp2(fmaf(s[4 * n + 2 * h + 1], scale_log2, -m_use));
            rc[n % CHAINS] += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
        }
        const float rowsum = TREE ? (rc[0] + rc[1 % CHAINS]) + (rc[2 % CHAINS] + rc[3 % CHAINS]) : rc[0];
        l_i[h] = l_i[h] * alpha[h] + rowsum;
        m_i[h] = m_new;
    }
}
__device__ __forceinline__ void rescale_o(float (&o)[O_REGS], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < O_REGS; ++i) o[i] *= alpha[(i >> 1) & 1];
}
// P_ij (fp32 accumulators) -> fp16/bf16 A fragments of P_ij V_j: k-step kp takes S columns
// 16 kp .. 16 kp + 15, i.e. accumulator n-tiles 2 kp and 2 kp + 1 (as flash2_tc.cu).
__device__ __forceinline__ void convert_p(const float (&s)[S_REGS], u32 (&p)[P_REGS]) {
#pragma unroll
    for (int kp = 0; kp < BLOCK_C / 16; ++kp) {
        p[4 * kp + 0] = pack2<IS_BF16>(s[8 * kp + 0], s[8 * kp + 1]);
        p[4 * kp + 1] = pack2<IS_BF16>(s[8 * kp + 2], s[8 * kp + 3]);
        p[4 * kp + 2] = pack2<IS_BF16>(s[8 * kp + 4], s[8 * kp + 5]);
        p[4 * kp + 3] = pack2<IS_BF16>(s[8 * kp + 6], s[8 * kp + 7]);
    }
}
