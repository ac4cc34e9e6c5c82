"""FlashAttention-2 forward in fp32 on CUDA cores (``cuda/flash2.cu``).

    O, L = flash2_attention(Q, K, V, causal=False)   # Q, K, V, O: (B, H, N, d) float32; L: (B, H, N)

One thread block per Q block; K/V streamed; deferred rescale; L = logsumexp of each row of
tau Q K^T. Tiles from ``flashsim.plan("flash2", ...)`` for ``SRAM`` bytes of shared memory.
"""

from __future__ import annotations

from .cupy_common import cdiv, check_qkv, get_kernel, tau, wrap_like

CU_FILE = "flash2.cu"
SRAM = 48 * 1024
NUM_THREADS = 256


def plan(N: int, d: int, causal: bool = False, sram: int = SRAM):
    import flashsim

    return flashsim.plan("flash2", seq_len=N, head_dim=d, dtype="fp32", sram=sram, causal=causal)


def defines(d: int, block_rows: int, block_cols: int) -> dict[str, int]:
    return {"HEAD_DIM": d, "BLOCK_R": block_rows, "BLOCK_C": block_cols, "NUM_THREADS": NUM_THREADS}


def flash2_attention(Q, K, V, causal: bool = False, *, sram: int = SRAM):
    """Q, K, V: (B, H, N, d) float32 -> (O (B, H, N, d), L (B, H, N)) float32."""
    import cupy

    s = check_qkv(Q, K, V, dtypes=("float32",))
    q, k, v = s.q, s.k, s.v
    p = plan(s.N, s.d, causal, sram)
    O = cupy.empty_like(q)
    L = cupy.empty((s.B, s.H, s.N), dtype=cupy.float32)
    get_kernel(CU_FILE, "flash2_fwd", defines(s.d, p.block_rows, p.block_cols))(
        (cdiv(s.N, p.block_rows), s.B * s.H), (NUM_THREADS,),
        (q, k, v, O, L, cupy.int32(s.N), cupy.float32(tau(s.d)), cupy.int32(causal)))
    return wrap_like(O, s.was_torch), wrap_like(L, s.was_torch)


def compile_variants():
    out = []
    for d in (64, 128):
        p = plan(4096, d)
        out.append((CU_FILE, defines(d, p.block_rows, p.block_cols), 0, ("flash2_fwd",)))
    return out
