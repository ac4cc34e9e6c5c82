"""Attention in low precision, emulated number by number: FlashAttention-3's FP8 recipe and
FlashAttention-4's two softmax tricks.

Every format is real: fp16 and bf16 through NumPy / ``ml_dtypes``, FP8 as
``ml_dtypes.float8_e4m3fn`` (e4m3: 3 mantissa bits, largest finite 448, no infinity). A
matmul on tensor cores is emulated as its inputs rounded to their format and a float32
product (products of fp16 or e4m3 values are exact in fp32; the order of the fp32 additions
differs from the hardware's, an effect far below the errors studied here).

FP8, step by step (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, Section 3.3):

    quantize_fp8         one scale per tensor (amax / 448), or per block of rows (B_r x d
                         for Q, B_c x d for K and V): the block's largest entry maps to 448
    random_hadamard      M = diag(+-1) H / sqrt(d), orthogonal, so (Q M)(K M)^T = Q K^T;
                         "incoherent processing" rotates Q and K before they are quantized,
                         spreading an outlier over all d coordinates
    P in FP8             P~ = exp(S - m) <= 1 is multiplied by a static 2^8 before the cast
                         (FlashAttention-3's ``Max_offset = 8``, hopper/softmax.h), so that it
                         uses e4m3's range instead of underflowing below 2^-9; the row sum l
                         is kept in fp32 from the unrounded P~, and the 2^8 cancels in O / l

``error_table`` runs the paper's Section 4.3 experiment (Table 3): Q, K, V with entries
N(0, 1) + N(0, 100) Bernoulli(0.001), each method's output against a float64 reference on
the same drawn values, as the root-mean-square error over every entry of O.

FlashAttention-4's softmax tricks (Blackwell):

    exp2_poly            2^x on the FMA units: x = n + f, 2^f by a cubic (Horner, fp32),
                         2^n by adding n to the exponent field; run on a fraction of the
                         elements so the special-function unit is not the bottleneck
    conditional rescale  skip the rescale of O_i and l_i unless the running max grew by more
                         than a threshold: both stay relative to the same stale max, so O / l
                         is unchanged; the threshold bounds P~ <= 2^threshold (no overflow)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import FlashsimError
from .measured.papers import FLASHATTENTION3_TABLE3

E4M3_MAX = 448.0
P_SCALE = 256.0          # FlashAttention-3 FP8: exp2(x - max + 8), P~ in [0, 256]
LOG2E = 1.4426950408889634


def _ml_dtypes():
    try:
        import ml_dtypes
    except ImportError:          # pragma: no cover - a dependency of flashsim
        raise FlashsimError("flashsim.numerics needs ml_dtypes (pip install ml_dtypes)") \
            from None
    return ml_dtypes


def round_to(x, fmt: str) -> np.ndarray:
    """``x`` rounded to ``fmt`` (fp32, fp16, bf16, e4m3; round to nearest even), returned as
    float32 (e4m3 saturates at +-448 as FlashAttention's conversions do)."""
    x = np.asarray(x, dtype=np.float32)
    if fmt == "fp32":
        return x
    if fmt == "fp16":
        return x.astype(np.float16).astype(np.float32)
    md = _ml_dtypes()
    if fmt == "bf16":
        return x.astype(md.bfloat16).astype(np.float32)
    if fmt == "e4m3":
        return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(md.float8_e4m3fn).astype(np.float32)
    raise FlashsimError(f"unknown format {fmt!r}: choose fp32, fp16, bf16 or e4m3")


def quantize_fp8(x, block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FP8 codes and scales of ``x`` (..., n, d): ``x ~ codes * scale``.

    ``block_rows=None``: one scale per matrix (per-tensor; one per head here, as a kernel
    sees it); else one per block of ``block_rows`` rows. A scale is amax / 448, so the
    block's largest entry lands on e4m3's largest value. Returns (codes (..., n, d) as
    float32 holding e4m3 values, scales (..., n, 1) repeated over each block's rows)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-2]
    if block_rows is None:
        amax = np.abs(x).max(axis=(-2, -1), keepdims=True)
        scale = np.broadcast_to(amax, x.shape[:-1] + (1,)) / E4M3_MAX
    else:
        if int(block_rows) <= 0:
            raise FlashsimError(f"block_rows must be positive, got {block_rows!r}")
        pad = -n % block_rows
        xp = np.concatenate([x, np.zeros(x.shape[:-2] + (pad, x.shape[-1]), np.float32)], -2)
        blocks = xp.reshape(x.shape[:-2] + (-1, block_rows, x.shape[-1]))
        amax = np.abs(blocks).max(axis=(-2, -1), keepdims=True)
        scale = np.broadcast_to(amax, blocks.shape[:-1] + (1,)).reshape(
            x.shape[:-2] + (n + pad, 1))[..., :n, :] / E4M3_MAX
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    return round_to(x / scale, "e4m3"), scale


def hadamard(d: int) -> np.ndarray:
    """The d x d Sylvester Hadamard matrix (entries +-1), d a power of two."""
    if d <= 0 or d & (d - 1):
        raise FlashsimError(f"a Hadamard matrix needs d a power of two, got {d}")
    H = np.ones((1, 1))
    while H.shape[0] < d:
        H = np.block([[H, H], [H, -H]])
    return H


def random_hadamard(d: int, rng) -> np.ndarray:
    """M = diag(s) H / sqrt(d) with random signs s: orthogonal (M M^T = I), so rotating
    both Q and K leaves Q K^T unchanged (QuIP's incoherence processing, FlashAttention-3's
    choice; the product costs O(d log d) with the fast transform)."""
    s = rng.choice([-1.0, 1.0], size=d)
    return s[:, None] * hadamard(d) / math.sqrt(d)


def outlier_inputs(rng, shape, outlier_fraction: float = 0.001, outlier_std: float = 10.0):
    """Q, K, V with entries N(0, 1) + N(0, outlier_std^2) Bernoulli(outlier_fraction): the
    FlashAttention-3 paper's stand-in for LLM activations with outlier features (float64)."""
    if not 0 <= outlier_fraction <= 1:
        raise FlashsimError(f"outlier_fraction must lie in [0, 1], got {outlier_fraction}")

    def one():
        x = rng.standard_normal(shape)
        hit = rng.random(shape) < outlier_fraction
        return x + np.where(hit, outlier_std * rng.standard_normal(shape), 0.0)

    return one(), one(), one()


def reference(Q, K, V) -> np.ndarray:
    """softmax(Q K^T / sqrt(d)) V in float64."""
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    S = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    return (P @ V) / P.sum(axis=-1, keepdims=True)


def _mm(a, b):
    return np.matmul(a, b, dtype=np.float32)


def _T(x):
    return np.swapaxes(x, -1, -2)


# ----------------------------------------------------------------------------- the methods
def baseline_fp16(Q, K, V) -> np.ndarray:
    """Standard attention as eager PyTorch runs it in fp16 (the FlashAttention repository's
    ``attention_ref`` without upcast): q = fp16(Q / sqrt(d)), S = fp16(q K^T), P = fp16(
    softmax(S)) (computed in fp32, stored in fp16), O = fp16(P V); fp32 accumulation."""
    d = Q.shape[-1]
    q, k, v = (round_to(a, "fp16") for a in (Q, K, V))
    S = round_to(_mm(round_to(q / np.float32(math.sqrt(d)), "fp16"), _T(k)), "fp16")
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P = round_to(P / P.sum(axis=-1, keepdims=True), "fp16")
    return round_to(_mm(P, v), "fp16")


def flash_fp16(Q, K, V, block_cols: int = 128) -> np.ndarray:
    """FlashAttention-2/-3 in fp16: S_ij and the softmax statistics in fp32, P~_ij rounded
    to fp16 for the P V product, O_i accumulated in fp32 (rescaled by alpha), divided by
    l_i once at the end and rounded to fp16. Tiles B_c = ``block_cols`` columns (the rows
    do not change the arithmetic)."""
    q, k, v = (round_to(a, "fp16") for a in (Q, K, V))
    return _online(q, k, v, np.float32(1 / math.sqrt(Q.shape[-1])), block_cols,
                   p_round=lambda P: round_to(P, "fp16"))


def baseline_fp8(Q, K, V) -> np.ndarray:
    """The paper's FP8 baseline: per-tensor scaling of Q, K, V, fp32 matmul accumulators,
    softmax intermediates in fp16; P (normalised, fp16) cast to e4m3 as it is for the P V
    product (the paper scales Q, K and V, not P), O in fp16."""
    d = Q.shape[-1]
    (q, sq), (k, sk), (v, sv) = (quantize_fp8(round_to(a, "fp16")) for a in (Q, K, V))
    S = round_to(_mm(q, _T(k)) * sq * _T(sk), "fp16")
    S = round_to(S / np.float32(math.sqrt(d)), "fp16")
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P = round_to(P / P.sum(axis=-1, keepdims=True), "fp16")
    return round_to(_mm(round_to(P, "e4m3"), v) * sv[..., :1, :], "fp16")


def flash3_fp8(Q, K, V, *, block_quant: bool = True, incoherent: bool = True,
               p_scale: float = P_SCALE, block_rows: int = 128, block_cols: int = 128,
               rng=None) -> np.ndarray:
    """FlashAttention-3 in FP8: (optionally) Q, K rotated by a random Hadamard matrix,
    Q, K, V quantized per block (or per tensor), S_ij = (Q8_i K8_j^T) sq_i sk_j in fp32,
    online softmax in fp32, P~_ij x ``p_scale`` cast to e4m3, O_i += P8 V8_j sv_j / p_scale
    in fp32, O = O_i / l_i in fp16."""
    d = Q.shape[-1]
    q, k, v = (round_to(a, "fp16") for a in (Q, K, V))
    if incoherent:
        M = random_hadamard(d, rng if rng is not None else np.random.default_rng(0))
        q, k = round_to(q @ M, "fp16"), round_to(k @ M, "fp16")
    (q, sq), (k, sk), (v, sv) = (
        quantize_fp8(a, rows if block_quant else None)
        for a, rows in ((q, block_rows), (k, block_cols), (v, block_cols)))
    ps = np.float32(p_scale)
    return _online(q * sq, k * sk, v * sv, np.float32(1 / math.sqrt(d)), block_cols,
                   p_round=lambda P: round_to(P * ps, "e4m3") / ps)


def _online(q, k, v, tau, block_cols: int, p_round) -> np.ndarray:
    """FlashAttention-2's forward loop over K/V blocks, all query rows at once (fp32):
    q, k, v already hold the values the tensor cores multiply (dequantized FP8 values are
    exactly representable in fp32, so scaling before or after the product is the same)."""
    N = k.shape[-2]
    m = np.full(q.shape[:-1] + (1,), -np.inf, np.float32)
    l = np.zeros_like(m)
    O = np.zeros(q.shape, np.float32)
    for c0 in range(0, N, block_cols):
        S = _mm(q, _T(k[..., c0:c0 + block_cols, :])) * tau
        m_new = np.maximum(m, S.max(axis=-1, keepdims=True))
        P = np.exp(S - m_new)
        alpha = np.exp(m - m_new)
        l = alpha * l + P.sum(axis=-1, keepdims=True)
        O = alpha * O + _mm(p_round(P), v[..., c0:c0 + block_cols, :])
        m = m_new
    return round_to(O / l, "fp16")


# ----------------------------------------------------------------------------- Table 3
@dataclass(frozen=True)
class Recipe:
    """The error experiment's setting. The paper gives the distribution and the reference
    (float64); not the shape: ours is stated here and swept in notebook 09."""
    seq_len: int = 1024
    head_dim: int = 64
    heads: int = 8
    outlier_fraction: float = 0.001
    outlier_std: float = 10.0
    block_rows: int = 128          # FlashAttention-3's tiles (B_r x B_c) for the FP8 blocks
    block_cols: int = 128
    fa2_block_cols: int = 64       # FlashAttention-2's B_c at d <= 128
    seed: int = 0


METHODS = ("Baseline FP16", "FlashAttention-2 FP16", "FlashAttention-3 FP16", "Baseline FP8",
           "FlashAttention-3 FP8", "No block quant", "No incoherent processing")


def error_table(recipe: Recipe = Recipe(), methods=METHODS) -> list[dict]:
    """Rows ``{method, rmse, paper_rmse, recipe}``: the FlashAttention-3 paper's Table 3
    reproduced on emulated numbers (``paper_rmse`` quoted, ``rmse`` computed)."""
    r = recipe
    for name in ("seq_len", "head_dim", "heads", "block_rows", "block_cols", "fa2_block_cols"):
        if int(getattr(r, name)) <= 0:
            raise FlashsimError(f"{name} must be positive, got {getattr(r, name)!r}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise FlashsimError(f"unknown method(s) {unknown}: choose from {', '.join(METHODS)}")
    rng = np.random.default_rng(r.seed)
    Q, K, V = outlier_inputs(rng, (r.heads, r.seq_len, r.head_dim), r.outlier_fraction,
                             r.outlier_std)
    ref = reference(Q, K, V)
    rot = np.random.default_rng(r.seed + 1)           # the rotation's signs, one draw
    fp8 = dict(block_rows=r.block_rows, block_cols=r.block_cols)
    run = {
        "Baseline FP16": lambda: baseline_fp16(Q, K, V),
        "FlashAttention-2 FP16": lambda: flash_fp16(Q, K, V, r.fa2_block_cols),
        "FlashAttention-3 FP16": lambda: flash_fp16(Q, K, V, r.block_cols),
        "Baseline FP8": lambda: baseline_fp8(Q, K, V),
        "FlashAttention-3 FP8": lambda: flash3_fp8(Q, K, V, rng=rot, **fp8),
        "No block quant": lambda: flash3_fp8(Q, K, V, block_quant=False, rng=rot, **fp8),
        "No incoherent processing": lambda: flash3_fp8(Q, K, V, incoherent=False, **fp8),
    }
    how = {
        "Baseline FP16": "fp16 S and P (softmax computed in fp32, stored in fp16)",
        "FlashAttention-2 FP16": f"fp32 S and statistics, P~ in fp16, B_c = {r.fa2_block_cols}",
        "FlashAttention-3 FP16": f"fp32 S and statistics, P~ in fp16, B_c = {r.block_cols}",
        "Baseline FP8": "per-tensor e4m3 Q, K, V; S, P in fp16; P cast to e4m3 unscaled",
        "FlashAttention-3 FP8": f"{r.block_rows}/{r.block_cols}-row blocks, Hadamard rotation "
                                "of Q and K, P~ x 2^8 in e4m3",
        "No block quant": "per-tensor scales, Hadamard rotation, P~ x 2^8 in e4m3",
        "No incoherent processing": "block scales, no rotation, P~ x 2^8 in e4m3",
    }
    rows = []
    for name in methods:
        err = run[name]() - ref
        rows.append({"method": name, "rmse": float(np.sqrt(np.mean(err ** 2))),
                     "paper_rmse": FLASHATTENTION3_TABLE3["rmse"][name], "how": how[name]})
    return rows


# ----------------------------------------------------------------------------- FA4 tricks
def exp2_poly_coefficients(degree: int = 3) -> np.ndarray:
    """Coefficients c_0..c_degree of p(f) ~ 2^f on [0, 1) with p(0) = 1 and p(1) = 2 exactly
    (so 2^n p(f) is continuous at every integer), least squares on Chebyshev nodes: the
    kind of polynomial FlashAttention-4 evaluates on the FMA units (a cubic for bf16)."""
    if degree < 1:
        raise FlashsimError(f"degree must be at least 1, got {degree}")
    f = 0.5 - 0.5 * np.cos(np.pi * (np.arange(256) + 0.5) / 256)
    # p(f) = 1 + f + f (f - 1) q(f), q of degree - 2: p(0) = 1, p(1) = 2 by construction
    if degree == 1:
        return np.array([1.0, 1.0])
    A = np.stack([f * (f - 1) * f ** k for k in range(degree - 1)], axis=1)
    q = np.linalg.lstsq(A, 2.0 ** f - 1 - f, rcond=None)[0]
    c = np.zeros(degree + 1)
    c[0], c[1] = 1.0, 1.0
    for k, qk in enumerate(q):      # f^(k+2) qk - f^(k+1) qk
        c[k + 2] += qk
        c[k + 1] -= qk
    return c


def exp2_poly(x, coefficients=None) -> np.ndarray:
    """2^x in float32 without the special-function unit: n = floor(x), f = x - n in [0, 1),
    p(f) by Horner's rule (one FMA per coefficient), then 2^n by adding n to the exponent
    field (an integer add). Inputs below -126 flush to 0, as ex2.approx.ftz does."""
    c = exp2_poly_coefficients() if coefficients is None else np.asarray(coefficients)
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        xc = np.maximum(x, np.float32(-127.0))
        n = np.floor(xc)
        f = xc - n
        p = np.full_like(f, np.float32(c[-1]))
        for ck in c[-2::-1]:
            p = p * f + np.float32(ck)                    # fma in the kernel
        bits = p.view(np.int32) + (n.astype(np.int32) << 23)
        out = bits.view(np.float32)
    return np.where(x < -126, np.float32(0.0), out)


def exp2_poly_error(degree: int = 3, samples: int = 1 << 16) -> dict:
    """Largest relative error of ``exp2_poly`` against float64 over x in [-20, 0] (where
    softmax's exponents live), beside bf16's rounding (2^-9) and fp16's (2^-12)."""
    x = np.linspace(-20, 0, samples, dtype=np.float32)
    got = exp2_poly(x, exp2_poly_coefficients(degree)).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float64)) - 1)
    return {"degree": degree, "max_rel_error": float(rel.max()),
            "bf16_half_ulp": 2.0 ** -9, "fp16_half_ulp": 2.0 ** -12}


def attention_with_poly_exp(Q, K, V, fraction: float = 0.5, degree: int = 3,
                            block_cols: int = 128, out: str = "bf16") -> dict:
    """FlashAttention forward in fp32 with P~ rounded to ``out`` (bf16) for P V, once with
    every exponential from the special-function unit (float32 exp2) and once with the first
    ``fraction`` of each tile's columns from ``exp2_poly``; both outputs rounded to ``out``.
    Returns the RMSE of each against float64 and how many output entries differ."""
    if not 0 <= fraction <= 1:
        raise FlashsimError(f"fraction must lie in [0, 1], got {fraction}")
    c = exp2_poly_coefficients(degree)
    q, k, v = (round_to(a, out) for a in (Q, K, V))
    scale = np.float32(LOG2E / math.sqrt(Q.shape[-1]))

    def run(poly: bool):
        N = k.shape[-2]
        m = np.full(q.shape[:-1] + (1,), -np.inf, np.float32)
        l = np.zeros_like(m)
        O = np.zeros(q.shape, np.float32)
        for c0 in range(0, N, block_cols):
            S = _mm(q, _T(k[..., c0:c0 + block_cols, :])) * scale        # log2 units
            m_new = np.maximum(m, S.max(axis=-1, keepdims=True))
            x = S - m_new
            P = np.exp2(x)
            if poly:
                cut = int(round(fraction * x.shape[-1]))
                P[..., :cut] = exp2_poly(x[..., :cut], c)
            alpha = np.exp2(m - m_new)
            l = alpha * l + P.sum(axis=-1, keepdims=True)
            O = alpha * O + _mm(round_to(P, out), v[..., c0:c0 + block_cols, :])
            m = m_new
        return round_to(O / l, out)

    ref = reference(Q, K, V)
    hw, poly = run(False), run(True)
    return {"rmse_hardware_exp": float(np.sqrt(np.mean((hw - ref) ** 2))),
            "rmse_poly_exp": float(np.sqrt(np.mean((poly - ref) ** 2))),
            "outputs_that_differ": float(np.mean(hw != poly)),
            "fraction": fraction, "degree": degree}


def conditional_rescale(S, V, block_cols: int = 128, threshold: float = 8.0) -> dict:
    """Online softmax over the rows of logits ``S`` (..., n_rows, N) in log2 units, against
    ``V`` (..., N, d), rescaling O_i and l_i only when the running max would grow by more
    than ``threshold`` (FlashAttention-4; ``threshold=0`` is FlashAttention-2's every-time
    rescale). Until then m_i stays stale: P~ = 2^(S - m_stale) <= 2^threshold, and O_i, l_i
    are both relative to m_stale, so O_i / l_i at the end is the same softmax.

    Returns the output (float64 arithmetic, so only the schedule differs), the decisions
    (row-blocks after a row's first block: FlashAttention-2 rescales at every one), how
    many rescaled, and the largest P~ seen. FlashAttention-4's kernels use 8: P~ <= 256."""
    if threshold < 0:
        raise FlashsimError(f"threshold must be >= 0, got {threshold}")
    S, V = np.asarray(S, np.float64), np.asarray(V, np.float64)
    N = S.shape[-1]
    m = np.full(S.shape[:-1] + (1,), -np.inf)
    l = np.zeros_like(m)
    O = np.zeros(S.shape[:-1] + (V.shape[-1],))
    decisions = rescaled = 0
    biggest = 0.0
    for c0 in range(0, N, block_cols):
        s = S[..., c0:c0 + block_cols]
        blk = s.max(axis=-1, keepdims=True)
        first = np.isneginf(m)
        seen = ~first & ~np.isneginf(blk)           # a kernel skips fully masked tiles
        grow = seen & (blk - m > threshold)
        decisions += int(seen.sum())
        rescaled += int(grow.sum())
        m_new = np.where(first | grow, np.maximum(m, blk), m)
        alpha = np.where(first, 0.0, np.exp2(np.where(first, 0.0, m - m_new)))
        with np.errstate(invalid="ignore"):     # a row masked so far: -inf - (-inf)
            P = np.where(np.isneginf(s), 0.0, np.exp2(s - m_new))
        biggest = max(biggest, float(P.max()))
        l = alpha * l + P.sum(axis=-1, keepdims=True)
        O = alpha * O + P @ V[..., c0:c0 + block_cols, :]
        m = m_new
    out = O / l
    Sm = S - S.max(axis=-1, keepdims=True)
    P = np.exp2(Sm)
    ref = (P @ V) / P.sum(axis=-1, keepdims=True)
    return {"output": out, "max_abs_error": float(np.abs(out - ref).max()),
            "decisions": decisions, "rescaled": rescaled,
            "skipped": decisions - rescaled, "largest_p": biggest, "threshold": threshold}


def logit_stream(kind: str, rng, rows: int = 64, n: int = 4096, d: int = 64) -> np.ndarray:
    """Attention-like logits (log2 units, rows x n) for the conditional-rescaling counts:

    ``random``  q . k / sqrt(d) for Gaussian q, k (no structure)
    ``sink``    the same, with key 0 scoring high for every query (an attention sink)
    ``local``   causal rows where each query scores its recent keys higher (a decaying
                position bias, as RoPE-like models show): the max keeps moving right
    ``rising``  logits that increase along the row (the worst case: the max grows at every
                block)"""
    q = rng.standard_normal((rows, d))
    k = rng.standard_normal((n, d))
    S = q @ k.T / math.sqrt(d) * LOG2E
    if kind == "random":
        return S
    if kind == "sink":
        S[:, 0] += 8.0
        return S
    if kind == "local":
        pos = np.arange(n)
        row_pos = np.linspace(n // 8, n - 1, rows).astype(int)
        dist = row_pos[:, None] - pos[None, :]
        S = S + 6.0 * np.exp(-np.maximum(dist, 0) / 64.0)
        S[dist < 0] = -np.inf
        return S
    if kind == "rising":
        return S + np.linspace(0, 40, n)[None, :]
    raise FlashsimError(f"unknown stream {kind!r}: choose random, sink, local or rising")
