"""Standard attention in fp32 on CUDA cores: three launches (``cuda/standard_attention.cu``).

    O = standard_attention(Q, K, V, causal=False)      # Q, K, V, O: (B, H, N, d) float32

Kernel 1 writes S = tau Q K^T (B, H, N, N) to HBM, kernel 2 the row softmax P, kernel 3
O = P V: the schedule of ``flashsim.plan("standard", ...)`` with its tiles (B_r, B_c) and
softmax rows R for the shared memory the kernels use (``SRAM`` bytes).
"""

from __future__ import annotations

from .cupy_common import cdiv, check_qkv, get_kernel, tau, wrap_like

CU_FILE = "standard_attention.cu"
SRAM = 48 * 1024  # shared memory per block the kernels are planned for (no opt-in needed)
NUM_THREADS = 256


def plan(N: int, d: int, causal: bool = False, sram: int = SRAM):
    """flashsim's plan for this shape: block_rows, block_cols, softmax_rows."""
    import flashsim

    return flashsim.plan("standard", seq_len=N, head_dim=d, dtype="fp32", sram=sram, causal=causal)


def defines(d: int, block_rows: int, block_cols: int) -> dict[str, int]:
    return {"HEAD_DIM": d, "BLOCK_R": block_rows, "BLOCK_C": block_cols, "NUM_THREADS": NUM_THREADS}


def standard_attention(Q, K, V, causal: bool = False, *, sram: int = SRAM):
    """softmax(tau Q K^T) V with S and P written to HBM. Q, K, V: (B, H, N, d) float32 -> O."""
    import cupy

    s = check_qkv(Q, K, V, dtypes=("float32",))
    q, k, v = s.q, s.k, s.v
    p = plan(s.N, s.d, causal, sram)
    D = defines(s.d, p.block_rows, p.block_cols)
    S = cupy.empty((s.B, s.H, s.N, s.N), dtype=cupy.float32)
    P = cupy.empty_like(S)
    O = cupy.empty_like(q)
    grid = (cdiv(s.N, p.block_rows), s.B * s.H)
    get_kernel(CU_FILE, "standard_qk", D)(grid, (NUM_THREADS,), (q, k, S, cupy.int32(s.N), cupy.float32(tau(s.d))))
    R = p.softmax_rows
    if R >= 1:
        smem = (R * s.N + 2 * R) * 4
        get_kernel(CU_FILE, "standard_softmax", D, smem)(
            (cdiv(s.N, R), s.B * s.H), (NUM_THREADS,), (S, P, cupy.int32(s.N), cupy.int32(R), cupy.int32(causal)),
            shared_mem=smem)
    else:
        get_kernel(CU_FILE, "standard_softmax_streaming", D)(
            grid, (NUM_THREADS,), (S, P, cupy.int32(s.N), cupy.int32(causal)))
    get_kernel(CU_FILE, "standard_pv", D)(grid, (NUM_THREADS,), (P, v, O, cupy.int32(s.N)))
    return wrap_like(O, s.was_torch)


def compile_variants():
    """(file, defines, dynamic smem, hot kernels) checked by CI: the plans for d = 64, 128."""
    out = []
    for d in (64, 128):
        p = plan(4096, d)
        out.append((CU_FILE, defines(d, p.block_rows, p.block_cols), 0,
                    ("standard_qk", "standard_softmax", "standard_softmax_streaming", "standard_pv")))
    return out
