"""Float64 references: the ground truth every algorithm and kernel is checked against."""

from __future__ import annotations

import numpy as np


def attention(Q, K, V, causal: bool = False) -> np.ndarray:
    """softmax(Q K^T / sqrt(d)) V in float64, directly (the whole N x N matrix at once).

    Q, K, V: (..., N, d). Returns O: (..., N, d). With ``causal``, query r sees keys <= r.
    """
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])            # (..., N, N)
    if causal:
        n = S.shape[-1]
        S = np.where(np.tril(np.ones((S.shape[-2], n), dtype=bool)), S, -np.inf)
    S = S - S.max(axis=-1, keepdims=True)
    P = np.exp(S)
    return (P / P.sum(axis=-1, keepdims=True)) @ V


def logsumexp(Q, K, causal: bool = False) -> np.ndarray:
    """L = log sum_j exp(S_rj) per row, float64, (..., N, 1): what FlashAttention-2 stores."""
    Q, K = (np.asarray(x, dtype=np.float64) for x in (Q, K))
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], dtype=bool)), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(S - m).sum(axis=-1, keepdims=True))
