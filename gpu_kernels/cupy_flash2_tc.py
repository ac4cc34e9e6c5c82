"""FlashAttention-2 forward on tensor cores, fp16 / bf16 (``cuda/flash2_tc.cu``).

    O, L = flash2_tc_attention(Q, K, V, causal=False)
    # Q, K, V, O: (B, H, N, d) float16 or bfloat16 (CuPy arrays, or PyTorch CUDA tensors
    # through DLPack without copies; results come back in the same framework), d in {64, 128};
    # L: (B, H, N) float32, the natural-log logsumexp of each row of tau Q K^T.

mma.sync m16n8k16 with fp32 accumulation and fp32 softmax statistics; any N (ragged last
blocks are masked); causal is top-left aligned (query r sees keys <= r). The header of the
.cu file lists the versions (``version=1..5``); ``CONFIGS`` holds the default tiles per d.
"""

from __future__ import annotations

from .cupy_common import LOG2E, KernelInputError, cdiv, check_qkv, get_kernel, output, tau, wrap_like

CU_FILE = "flash2_tc.cu"
HEAD_DIMS = (64, 128)
VERSIONS = (1, 2, 3, 4, 5)
# Default compile-time constants per head dimension (B_r = BLOCK_M, B_c = BLOCK_N).
# The fastest correct configuration of the sweep in benchmarks/cupy_h200.py on the H200
# (benchmarks/results/cupy_h200.json, "tc_configs").
CONFIGS = {
    64: {"BLOCK_M": 128, "BLOCK_N": 64, "VERSION": 5, "MIN_BLOCKS": 1},
    128: {"BLOCK_M": 128, "BLOCK_N": 64, "VERSION": 3, "MIN_BLOCKS": 1},
}


def warp_rows(version: int) -> int:
    """Query rows per warp (WARP_M in the .cu file): two m16 tiles from v5 on."""
    return 32 if version >= 5 else 16


def smem_bytes(d: int, block_m: int, block_n: int, version: int) -> int:
    """Dynamic shared memory of one block: Q_i plus K_j, V_j (two stages in v4), padded rows
    before v3 (same formula as SMEM_BYTES in the .cu file)."""
    stages = 2 if version == 4 else 1
    stride = d if version >= 3 else d + 8
    return (block_m + 2 * stages * block_n) * stride * 2


def defines(d: int, dtype: str, **config) -> dict[str, int]:
    c = dict(CONFIGS[d])
    c.update({k.upper(): v for k, v in config.items() if v is not None})
    return {"HEAD_DIM": d, "IS_BF16": int(dtype == "bfloat16"), **c}


def flash2_tc_attention(Q, K, V, causal: bool = False, *, version: int | None = None,
                        block_m: int | None = None, block_n: int | None = None,
                        min_blocks: int | None = None, out=None, lse=None):
    """Q, K, V: (B, H, N, d) fp16/bf16, d in (64, 128) -> (O like Q, L (B, H, N) float32).

    ``version``, ``block_m`` (B_r), ``block_n`` (B_c), ``min_blocks``: override ``CONFIGS``.
    ``out`` / ``lse``: preallocated O and L to write into (checked like the inputs).
    """
    import cupy

    if version is not None and version not in VERSIONS:
        raise KernelInputError(f"version {version} does not exist; choose one of {VERSIONS}")
    s = check_qkv(Q, K, V, dtypes=("float16", "bfloat16"), head_dims=HEAD_DIMS)
    D = defines(s.d, s.dtype, version=version, block_m=block_m, block_n=block_n, min_blocks=min_blocks)
    wm = warp_rows(D["VERSION"])
    if D["BLOCK_M"] % wm or D["BLOCK_M"] > 16 * wm or D["BLOCK_N"] % 16:
        raise KernelInputError(f"version {D['VERSION']} needs block_m a multiple of {wm} (at most "
                               f"{16 * wm}) and block_n a multiple of 16, got {D['BLOCK_M']}, {D['BLOCK_N']}")
    O = output(out, "out", (s.B, s.H, s.N, s.d), s.dtype, like=s.q)
    L = output(lse, "lse", (s.B, s.H, s.N), "float32")
    smem = smem_bytes(s.d, D["BLOCK_M"], D["BLOCK_N"], D["VERSION"])
    kernel = get_kernel(CU_FILE, "flash2_tc_fwd", D, smem)
    kernel((cdiv(s.N, D["BLOCK_M"]), s.B * s.H), (32 * D["BLOCK_M"] // wm,),
           (s.q, s.k, s.v, O, L, cupy.int32(s.N), cupy.float32(tau(s.d) * LOG2E), cupy.int32(causal)),
           shared_mem=smem)
    if out is not None and lse is not None:
        return out, lse
    return (out if out is not None else wrap_like(O, s.was_torch, s.dtype),
            lse if lse is not None else wrap_like(L, s.was_torch))


def tuning_configs(d: int) -> list[dict[str, int]]:
    """The variants the benchmark sweeps (and CI compiles) for one d: every version at the
    baseline tiles B_r = 128, B_c = 64, then other tiles for the faster versions."""
    def c(bm, bn, version, min_blocks=1):
        return {"BLOCK_M": bm, "BLOCK_N": bn, "VERSION": version, "MIN_BLOCKS": min_blocks}

    out = [c(128, 64, v) for v in VERSIONS]
    if d == 64:
        out += [c(128, 128, 4), c(64, 64, 4, 2), c(128, 32, 4), c(128, 32, 5), c(256, 64, 5), c(64, 64, 5),
                c(64, 64, 3)]
    else:
        out += [c(128, 128, 4), c(64, 64, 4, 2), c(128, 32, 5), c(256, 32, 5), c(64, 32, 5),
                c(64, 64, 3), c(128, 32, 3)]
    return out


def compile_variants():
    out = []
    for d in HEAD_DIMS:
        for dtype in ("float16", "bfloat16"):
            configs = tuning_configs(d) if dtype == "float16" else [CONFIGS[d]]
            if CONFIGS[d] not in configs:
                configs = [CONFIGS[d]] + configs
            for c in configs:
                D = defines(d, dtype, **c)
                out.append((CU_FILE, D, smem_bytes(d, D["BLOCK_M"], D["BLOCK_N"], D["VERSION"]),
                            ("flash2_tc_fwd",)))
    return out
