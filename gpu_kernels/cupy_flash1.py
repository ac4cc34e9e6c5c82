"""FlashAttention (Algorithm 1) in fp32 on CUDA cores (``cuda/flash1.cu``).

    O = flash1_attention(Q, K, V, causal=False)               # (B, H, N, d) float32
    O, l, m = flash1_attention(Q, K, V, return_stats=True)    # l, m: (B, H, N) float32

Outer loop over K/V blocks, inner loop over Q blocks, O, l, m in HBM between steps; one
thread block per (batch, head). Tiles from ``flashsim.plan("flash1", ...)`` for ``SRAM`` bytes.
"""

from __future__ import annotations

from .cupy_common import check_qkv, get_kernel, tau, wrap_like

CU_FILE = "flash1.cu"
SRAM = 48 * 1024
NUM_THREADS = 256


def plan(N: int, d: int, causal: bool = False, sram: int = SRAM):
    import flashsim

    return flashsim.plan("flash1", seq_len=N, head_dim=d, dtype="fp32", sram=sram, causal=causal)


def defines(d: int, block_rows: int, block_cols: int) -> dict[str, int]:
    return {"HEAD_DIM": d, "BLOCK_R": block_rows, "BLOCK_C": block_cols, "NUM_THREADS": NUM_THREADS}


def flash1_attention(Q, K, V, causal: bool = False, *, sram: int = SRAM, return_stats: bool = False):
    """Q, K, V: (B, H, N, d) float32 -> O (and l, m: (B, H, N) with ``return_stats``)."""
    import cupy

    s = check_qkv(Q, K, V, dtypes=("float32",))
    q, k, v = s.q, s.k, s.v
    p = plan(s.N, s.d, causal, sram)
    O = cupy.empty_like(q)
    l = cupy.empty((s.B, s.H, s.N), dtype=cupy.float32)
    m = cupy.empty_like(l)
    get_kernel(CU_FILE, "flash1_fwd", defines(s.d, p.block_rows, p.block_cols))(
        (s.B * s.H,), (NUM_THREADS,),
        (q, k, v, O, l, m, cupy.int32(s.N), cupy.float32(tau(s.d)), cupy.int32(causal)))
    if return_stats:
        return tuple(wrap_like(x, s.was_torch) for x in (O, l, m))
    return wrap_like(O, s.was_torch)


def compile_variants():
    out = []
    for d in (64, 128):
        p = plan(4096, d)
        out.append((CU_FILE, defines(d, p.block_rows, p.block_cols), 0, ("flash1_fwd",)))
    return out
