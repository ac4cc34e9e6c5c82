"""Online softmax (Milakov & Gimelshein, 2018), step by step: the idea FlashAttention tiles.

Versions, each a float64 function over the last axis and a loop nest that flashsim counts:

    naive    l = sum_k e^{x_k};  y_j = e^{x_j} / l                x read 2x, y written once: 3
             (overflows as soon as some x_j > 709)
    safe     m = max_k x_k;  l = sum_k e^{x_k - m};  y_j = e^{x_j - m} / l
                                                                  x read 3x, y written once: 4
    online   one pass for (m, l) with the recurrence
                 m_j = max(m_{j-1}, x_j)
                 l_j = l_{j-1} e^{m_{j-1} - m_j} + e^{x_j - m_j}
             then y_j = e^{x_j - m_N} / l_N                       x read 2x, y written once: 3

(memory accesses per element, the numbers in the paper's Table 1; :func:`accesses_per_element`
gets them from :func:`flashsim.nest.count` on the nests built by :func:`nest`, not from this
table.)

Block by block, with alpha = e^{m_old - m_new}, the same recurrence reads

    m_new = max(m_old, max_j x_j)          (j in the block)
    l     = alpha l + sum_j e^{x_j - m_new}
    o     = alpha o + sum_j e^{x_j - m_new} v_j       (softmax(x) V, unnormalised)

and two partial states merge associatively (:func:`merge`), which is why blocks can be
processed in any grouping, on any number of thread blocks. :func:`trace` exposes every step;
its last step equals softmax(x) and softmax(x) V to float64 rounding.

Entries of x may be -inf (masked); a row whose every entry is -inf has no softmax and is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._common import exp_diff
from ..errors import FlashsimError
from ..nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor, count, execute
from ..units import STAT_BYTES

KINDS = ("naive", "safe", "online")


# --------------------------------------------------------------------------- references

def safe_softmax(x) -> np.ndarray:
    """The float64 reference: softmax over the last axis, max subtracted first.
    x: (..., N) -> (..., N)."""
    x = _check_x(x)
    m = x.max(axis=-1, keepdims=True)
    p = np.exp(x - m)
    return p / p.sum(axis=-1, keepdims=True)


def naive_softmax(x) -> np.ndarray:
    """e^{x_j} / sum_k e^{x_k} without the max: inf / inf = nan once some x_j > 709.
    x: (..., N) -> (..., N). Overflow is left visible on purpose (no warning, nan out)."""
    x = _check_x(x)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(x)
        return p / p.sum(axis=-1, keepdims=True)


def online_normalizer(x) -> tuple[np.ndarray, np.ndarray]:
    """(m_N, l_N) by the element-by-element recurrence, one read of x.
    x: (..., N) -> m, l: (...)."""
    x = _check_x(x)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for j in range(x.shape[-1]):
        m_new = np.maximum(m, x[..., j])
        # l_j = l_{j-1} e^{m_{j-1} - m_j} + e^{x_j - m_j}
        l = l * exp_diff(m, m_new) + exp_diff(x[..., j], m_new)
        m = m_new
    return m, l


def online_softmax(x) -> np.ndarray:
    """softmax(x) from the online (m, l): one pass for the statistics, one to normalise.
    x: (..., N) -> (..., N)."""
    x = _check_x(x)
    m, l = online_normalizer(x)
    return exp_diff(x, m[..., None]) / l[..., None]


# --------------------------------------------------------------------- states and merge

@dataclass(frozen=True)
class State:
    """The running statistics of a prefix (or any subset) of x: m = max x_j,
    l = sum_j e^{x_j - m}, and, for softmax(x) V, o = sum_j e^{x_j - m} v_j ((d_v,) or ()).
    The empty set is m = -inf, l = 0, o = 0."""
    m: float
    l: float
    o: np.ndarray | float | None = None

    @property
    def output(self):
        """softmax(x) V over the elements seen: o / l (rows: o (..., R, d_v) / l (..., R))."""
        if self.o is None:
            return None
        return self.o / (np.expand_dims(self.l, -1) if np.ndim(self.o) > np.ndim(self.l)
                         else self.l)


def state_of(x, v=None) -> State:
    """The state of a whole chunk, computed directly. x: (n,), v: (n,) or (n, d_v)."""
    x = _check_x(x, ndim=1)
    v = _check_v(v, len(x))
    m = float(x.max())
    p = exp_diff(x, m)                                             # (n,)
    return State(m, float(p.sum()), None if v is None else p @ v)


def merge(a: State, b: State) -> State:
    """The state of the union of two disjoint chunks (associative and commutative):

        m = max(m_a, m_b);  l = l_a e^{m_a - m} + l_b e^{m_b - m};  o likewise.

    Many rows at once too: m, l of shape (..., R) and o of (..., R, d_v), row by row (how a
    device of ring attention merges the partial outputs of its steps)."""
    if np.ndim(a.m) or np.ndim(b.m):
        m = np.maximum(a.m, b.m)
        sa, sb = exp_diff(np.asarray(a.m, float), m), exp_diff(np.asarray(b.m, float), m)
        if a.o is None or b.o is None:
            o = None
        else:
            wide = np.ndim(a.o) > np.ndim(a.m)                     # o: (..., R, d_v)
            o = ((sa[..., None] if wide else sa) * a.o + (sb[..., None] if wide else sb) * b.o)
        return State(m, sa * a.l + sb * b.l, o)
    m = max(a.m, b.m)
    sa, sb = float(exp_diff(np.float64(a.m), m)), float(exp_diff(np.float64(b.m), m))
    o = None if a.o is None or b.o is None else sa * a.o + sb * b.o
    return State(m, sa * a.l + sb * b.l, o)


def update(m_old, l_old, x_block, o_old=None, v_block=None):
    """One block of the online recurrence, over the last axis of ``x_block``.

    m_old, l_old: (...); x_block: (..., B); o_old: (..., d_v) and v_block: (B, d_v), or None.
    Returns (m_new, l_new, o_new, alpha, p) with alpha = e^{m_old - m_new}: (...) and
    p = e^{x_block - m_new}: (..., B). The trace and the online nest both call this."""
    m_new = np.maximum(m_old, x_block.max(axis=-1))               # (...)
    alpha = exp_diff(m_old, m_new)                # e^{m_old - m_new}; 0 if nothing seen yet
    p = exp_diff(x_block, m_new[..., None])                       # (..., B)
    l_new = alpha * l_old + p.sum(axis=-1)
    if v_block is None:
        o_new = None
    else:                                                         # v: (B,) gives o: (...)
        a = alpha[..., None] if v_block.ndim == 2 else alpha
        o_new = a * o_old + p @ v_block
    return m_new, l_new, o_new, alpha, p


# ------------------------------------------------------------------------------ trace

@dataclass(frozen=True)
class Step:
    """The state after block k, which covers x[lo:hi].

    x: (hi - lo,) the block; m_old, m_new, alpha = e^{m_old - m_new}, l_old, l: floats;
    p: (hi,) the weights e^{x_j - m_new} of every element seen so far (the earlier ones
    rescaled by each alpha on the way); o: (d_v,) or () sum_j p_j v_j, or None without v."""
    k: int
    lo: int
    hi: int
    x: np.ndarray
    m_old: float
    m_new: float
    alpha: float
    l_old: float
    l: float
    p: np.ndarray
    o: np.ndarray | float | None

    @property
    def y(self) -> np.ndarray:
        """softmax of x[:hi]: p / l, (hi,). The last step's y is softmax(x)."""
        return self.p / self.l

    @property
    def output(self):
        """softmax(x[:hi]) V[:hi]: o / l. The last step's is softmax(x) V."""
        return None if self.o is None else self.o / self.l

    @property
    def max_changed(self) -> bool:
        """The running maximum rose in this block, so the old state was rescaled."""
        return self.m_new > self.m_old


def trace(x, block: int, v=None) -> list[Step]:
    """Online softmax over x, ``block`` elements at a time, every step kept.

    x: (N,) logits (finite or -inf, at least one finite); v: (N,) or (N, d_v) or None.
    The last block may be short (N need not divide by ``block``). Keeps the weights of the
    whole prefix at every step, so memory grows as N^2 / block: meant for teaching sizes."""
    x = _check_x(x, ndim=1)
    v = _check_v(v, len(x))
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise FlashsimError(f"block must be a positive integer, got {block!r}")
    m, l = np.float64(-np.inf), np.float64(0.0)
    p = np.zeros(0)
    o = None if v is None else np.zeros(v.shape[1:])
    steps = []
    for k, lo in enumerate(range(0, len(x), block)):
        hi = min(lo + block, len(x))
        xb = x[lo:hi]
        m_new, l_new, o_new, alpha, p_b = update(
            m, l, xb, o, None if v is None else v[lo:hi])
        p = np.concatenate([alpha * p, p_b])                       # rescale the old weights
        steps.append(Step(k, lo, hi, xb, float(m), float(m_new), float(alpha), float(l),
                          float(l_new), p, o_new))
        m, l, o = m_new, l_new, o_new
    return steps


# ------------------------------------------------------------------ as flashsim loop nests

def nest(kind: str, n: int, *, rows: int = 1, block: int = 64, row_block: int = 1,
         elem_bytes: int = 4) -> Nest:
    """The softmax of each row of a (rows x n) matrix x in HBM into y, as a flashsim nest.

    Each pass streams x through SRAM ``block`` columns at a time; the statistics m_r, l_r
    (fp32) stay in SRAM. ``kind`` is one of KINDS; see the module header for the passes."""
    if kind not in KINDS:
        raise FlashsimError(f"unknown softmax {kind!r}: choose one of {', '.join(KINDS)}")
    b = elem_bytes
    tensors = {"x": Tensor("x", rows, n, b), "y": Tensor("y", rows, n, b)}

    def read_pass(label, fn):
        return Loop("k", block, n, label=label, body=(
            Load("x_rk", "x", rows="r", cols="k"),
            Compute(label, fn),
        ))

    def stat(sram, name):
        return sram[name][..., 0]                                  # (..., row_block)

    def sum_exp(sram, ctx):                                        # naive: l += sum e^{x}
        with np.errstate(over="ignore"):
            sram["l_r"] = sram["l_r"] + np.exp(sram["x_rk"]).sum(axis=-1, keepdims=True)

    def running_max(sram, ctx):                                    # safe pass 1
        sram["m_r"] = np.maximum(sram["m_r"], sram["x_rk"].max(axis=-1, keepdims=True))

    def sum_exp_shifted(sram, ctx):                                # safe pass 2
        sram["l_r"] = sram["l_r"] + exp_diff(sram["x_rk"], sram["m_r"]).sum(axis=-1, keepdims=True)

    def online(sram, ctx):                                         # online: (m, l) in one pass
        m_new, l_new, _, _, _ = update(stat(sram, "m_r"), stat(sram, "l_r"), sram["x_rk"])
        sram["m_r"], sram["l_r"] = m_new[..., None], l_new[..., None]

    def normalise(sram, ctx):
        with np.errstate(over="ignore", invalid="ignore"):
            if kind == "naive":
                sram["x_rk"] = np.exp(sram["x_rk"]) / sram["l_r"]
            else:
                sram["x_rk"] = exp_diff(sram["x_rk"], sram["m_r"]) / sram["l_r"]

    write_pass = Loop("k", block, n, label="y = e^(x - m) / l", body=(
        Load("x_rk", "x", rows="r", cols="k"),
        Compute("y_rk = e^(x_rk - m_r) / l_r", normalise),
        Store("x_rk", "y", rows="r", cols="k"),
    ))
    stats = (Alloc("m_r", "r", 1, STAT_BYTES, -np.inf), Alloc("l_r", "r", 1, STAT_BYTES, 0.0))
    passes = {
        "naive": (read_pass("l_r += sum e^x_rk", sum_exp),),
        "safe": (read_pass("m_r = max(m_r, max x_rk)", running_max),
                 read_pass("l_r += sum e^(x_rk - m_r)", sum_exp_shifted)),
        "online": (read_pass("m_new = max(m_r, max x_rk); l_r = e^(m_r - m_new) l_r + "
                             "sum e^(x_rk - m_new); m_r = m_new", online),),
    }[kind]
    return Nest(tensors, (Loop("r", row_block, rows, label="rows of x", body=(
        stats + passes + (write_pass,))),))


def run_nest(kind: str, x, *, block: int = 64) -> tuple[np.ndarray, dict]:
    """Run :func:`nest` with values. x: (rows, n) or (n,). Returns y (same shape) and
    {"read_bytes": ..., "write_bytes": ...} for one head, fp32 elements."""
    x = _check_x(x)
    x2 = np.atleast_2d(x)
    hbm = {"x": x2.copy(), "y": np.full(x2.shape, np.nan)}
    c = execute(nest(kind, x2.shape[1], rows=x2.shape[0], block=block), hbm)
    return hbm["y"].reshape(x.shape), {"read_bytes": c.read["x"], "write_bytes": c.write["y"]}


def accesses_per_element(kind: str, n: int = 4096, *, block: int = 64) -> float:
    """HBM accesses per element of x, counted by :func:`flashsim.nest.count`:
    (bytes read + bytes written) / (n * bytes per element). 3, 4 and 3 for naive, safe and
    online, whatever n and block."""
    b = 4
    c = count(nest(kind, n, block=block, elem_bytes=b))
    return (sum(c.read.values()) + sum(c.write.values())) / (n * b)


# ----------------------------------------------------------------------------- checks

def _check_x(x, ndim: int | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise FlashsimError(f"logits must be real numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if a.ndim < 1 or a.shape[-1] == 0 or (ndim is not None and a.ndim != ndim):
        raise FlashsimError(f"logits have shape {a.shape}; expected "
                            f"{'(N,)' if ndim == 1 else '(..., N)'} with N >= 1")
    if np.isnan(a).any() or np.isposinf(a).any():
        raise FlashsimError("logits contain NaN or +inf")
    if np.isneginf(a).all(axis=-1).any():
        raise FlashsimError("a row whose every logit is -inf (fully masked) has no softmax")
    return a


def _check_v(v, n: int):
    if v is None:
        return None
    a = np.asarray(v, dtype=np.float64)
    if a.ndim not in (1, 2) or a.shape[0] != n:
        raise FlashsimError(f"v has shape {a.shape}; expected ({n},) or ({n}, d_v)")
    if not np.isfinite(a).all():
        raise FlashsimError("v contains NaN or Inf")
    return a
