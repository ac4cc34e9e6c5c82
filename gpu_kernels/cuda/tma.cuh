// tma.cuh -- mbarriers and the TMA unit's tensor copies (sm_90): the loads of flash3.cu (v2 on)
// and of decode.cu's v9 (TMA 1). A copy names a box of a tensor described by a CUtensorMap
// (made on the host: gpu_kernels/cupy/common.py tensor_map) and completes on an mbarrier
// that was told how many bytes to expect. The including file includes common.cuh first.

struct __align__(64) TensorMap { unsigned long long opaque[16]; };   // CUtensorMap, made by the host

__device__ __forceinline__ void mbar_init(u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// The initialised mbarriers made visible to the async proxy (TMA) before any copy names them.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {   // arrive, and bytes to come
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(u32 bar, int parity) {
    u32 done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
// Wait until the phase of this parity has completed (phase k has parity k % 2). (No timeout:
// a trap in this loop makes ptxas spill the consumers' registers; the benchmark runs each
// version first in a child process with a time limit instead.)
__device__ __forceinline__ void mbar_wait(u32 bar, int parity) {
    while (!mbar_try_wait(bar, parity)) {}
}
// The tensor map's 128 bytes fetched ahead into the TMA unit's descriptor cache (CUTLASS's
// prefetch_tma_descriptor): its first copy need not wait for them. ``map``: a generic address
// (a __grid_constant__ parameter's).
__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)map) : "memory");
}
// One box (64 columns x rows x 1) of a 3-D tensor (d, N, B*H) into shared memory, counted on bar.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int col, int row, int bh, u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"((unsigned long long)map), "r"(col), "r"(row), "r"(bh), "r"(bar) : "memory");
}
// One box (64 columns x rows x 1 x 1) of a 4-D tensor into shared memory, counted on bar:
// coordinates innermost first (decode.cu: column, key, KV head, sequence).
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, int c0, int c1, int c2, int c3,
                                            u32 bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(dst), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

// As tma_load_4d, with an L2 cache policy (createpolicy's 64-bit descriptor) on the copy's lines.
__device__ __forceinline__ void tma_load_4d_hint(u32 dst, const TensorMap* map, int c0, int c1, int c2,
                                                 int c3, u32 bar, unsigned long long policy) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
                 :: "r"(dst), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
                    "l"(policy)
                 : "memory");
}
