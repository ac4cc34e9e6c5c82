"""Float64 references: the ground truth every algorithm and kernel is checked against."""

from __future__ import annotations

import numpy as np


def attention(Q, K, V, causal: bool = False, mask=None, dropout=None) -> np.ndarray:
    """softmax(Q K^T / sqrt(d)) V in float64, directly (the whole N x N matrix at once).

    Q, K, V: (..., N, d). Returns O: (..., N, d). With ``causal``, query r sees keys <= r;
    ``mask`` (N, N) bool: query r sees key c where True (a row that sees nothing gives
    O = 0, as FlashAttention writes it); ``dropout`` (N, N): the factor Z / (1 - p) applied
    to P after the softmax (``flashsim.masks.dropout_scale``).
    """
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    return _probabilities(Q, K, causal, mask, dropout) @ V


def _probabilities(Q, K, causal=False, mask=None, dropout=None) -> np.ndarray:
    """P = softmax(S) (..., N, N), rows that see nothing 0; times ``dropout`` if given."""
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])            # (..., N, N)
    if causal:
        n = S.shape[-1]
        S = np.where(np.tril(np.ones((S.shape[-2], n), dtype=bool)), S, -np.inf)
    if mask is not None:
        S = np.where(np.asarray(mask, dtype=bool), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    l = P.sum(axis=-1, keepdims=True)
    P = P / np.where(l > 0, l, 1.0)
    return P if dropout is None else P * dropout


def logsumexp(Q, K, causal: bool = False, mask=None) -> np.ndarray:
    """L = log sum_j exp(S_rj) per row, float64, (..., N, 1): what FlashAttention-2 stores.
    ``mask`` as for :func:`attention`; a row that sees nothing has L = -inf."""
    Q, K = (np.asarray(x, dtype=np.float64) for x in (Q, K))
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], dtype=bool)), S, -np.inf)
    if mask is not None:
        S = np.where(np.asarray(mask, dtype=bool), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        return m_safe + np.log(np.exp(S - m_safe).sum(axis=-1, keepdims=True))


def attention_backward(Q, K, V, dO, causal: bool = False, mask=None, dropout=None):
    """(dQ, dK, dV) of ``phi`` with dO = d phi / dO, for O = softmax(Q K^T / sqrt(d)) V,
    in float64, directly (FlashAttention paper, Appendix B.2).

    Q, K, V, dO: (..., N, d). Returns dQ, dK, dV: (..., N, d).

        P = softmax(S), S = tau Q K^T      dV = P^T dO       dP = dO V^T
        dS = P o (dP - rowsum(P o dP))     dQ = tau dS K     dK = tau dS^T Q

    ``mask`` and ``dropout`` as for :func:`attention`; with dropout Z~ = Z / (1 - p):
    dV = (P o Z~)^T dO, dP = (dO V^T) o Z~.
    """
    if mask is not None or dropout is not None:
        Q, K, V, dO = (np.asarray(x, dtype=np.float64) for x in (Q, K, V, dO))
        tau = 1.0 / np.sqrt(Q.shape[-1])
        P = _probabilities(Q, K, causal, mask)
        Zs = 1.0 if dropout is None else dropout
        dV = np.swapaxes(P * Zs, -1, -2) @ dO
        dP = (dO @ np.swapaxes(V, -1, -2)) * Zs
        dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
        return tau * (dS @ K), tau * (np.swapaxes(dS, -1, -2) @ Q), dV
    Q, K, V, dO = (np.asarray(x, dtype=np.float64) for x in (Q, K, V, dO))
    tau = 1.0 / np.sqrt(Q.shape[-1])
    S = tau * (Q @ np.swapaxes(K, -1, -2))                             # (..., N, N)
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], dtype=bool)), S, -np.inf)
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)
    dV = np.swapaxes(P, -1, -2) @ dO
    dP = dO @ np.swapaxes(V, -1, -2)
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    return tau * (dS @ K), tau * (np.swapaxes(dS, -1, -2) @ Q), dV


def attention_kv(Q, K, V, causal: bool = True, scale: float | None = None) -> np.ndarray:
    """Attention of q_len new rows against a KV cache, float64, directly (decoding).

    Q: (..., H, q_len, d); K: (..., H_kv, n, d); V: (..., H_kv, n, d_v) with H a multiple
    of H_kv (query head h reads KV head h // (H / H_kv): GQA, MQA when H_kv = 1). With
    ``causal`` the rows are the last q_len positions: row m sees keys <= n - q_len + m.
    ``scale`` defaults to 1/sqrt(d). Returns O: (..., H, q_len, d_v)."""
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    g = Q.shape[-3] // K.shape[-3]
    K, V = np.repeat(K, g, axis=-3), np.repeat(V, g, axis=-3)
    tau = 1.0 / np.sqrt(Q.shape[-1]) if scale is None else scale
    S = tau * (Q @ np.swapaxes(K, -1, -2))                            # (..., H, q, n)
    if causal:
        q, n = S.shape[-2:]
        S = np.where(np.arange(n)[None, :] <= n - q + np.arange(q)[:, None], S, -np.inf)
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    return (P / P.sum(axis=-1, keepdims=True)) @ V
