"""What each notebook view shows, computed by plain functions; and thin ipywidgets panels.

Every ``*_view`` function takes the values of a view's controls and returns a dict of plain
numbers and NumPy arrays: what the picture draws and what a notebook cell (or a test) can
assert on. They call flashsim's closed forms (``Plan.closed_form()``, equal to
``Plan.count()`` byte for byte, as ``tests/test_counts.py`` holds) so a slider answers fast
even at N = 65536.

:class:`Panel` wires controls, a view function and a picture from :mod:`flashsim.views.pictures`:
moving a control runs :meth:`Panel.refresh` (recompute, redraw, PNG into an ``Image``
widget). The ``*_panel`` functions build the notebooks' panels. ipywidgets and matplotlib
are imported only when a panel is built, so ``import flashsim`` stays light.

    panel = flashsim.views.widgets.sram_panel(seq_len=4096)
    panel                                   # in a notebook: sliders and the picture
    panel.controls["sram"].value = 2**17    # runs the callback, as dragging does
    panel.view["bytes"]["flash1"]           # what the picture now shows
"""

from __future__ import annotations

import base64
import functools
import time
from typing import Callable

import numpy as np

from ..algorithms import online_softmax
from ..errors import FlashsimError
from ..plan import plan
from ..hardware.presets import DEFAULT_GPU, GPUS, gpu as _gpu, roofline_time
from ..units import DTYPE_BYTES, cdiv, parse_size

ALGS = ("standard", "flash1", "flash2")
KiB = 1024

# SRAM bandwidth is estimated as SMs x 128 bytes per clock (32 banks of 4 bytes each per
# clock: CUDA C++ Programming Guide, "Shared Memory") x boost clock; for the A100 this gives
# the 19 TB/s the FlashAttention paper quotes.
SHARED_BYTES_PER_CLOCK_PER_SM = 128

# Panels render without font hinting: glyph rendering dominates a redraw and unhinted text
# draws about twice as fast (measured in benchmarks/slider_latency.py's development).
RENDER_RC = {"text.hinting": "none"}


# ================================================================ 01 memory hierarchy

def memory_table(names=None) -> list[dict]:
    """One row per GPU preset: capacities (bytes) and bandwidths (bytes/s) of SRAM and HBM.

    ``sram_total`` is SMs x the shared memory one block may use (what the model calls M, on
    every SM at once); ``sram_bandwidth`` the estimate in :data:`SHARED_BYTES_PER_CLOCK_PER_SM`'s comment."""
    rows = []
    for name in names or GPUS:
        g = _gpu(name)
        rows.append({
            "gpu": name, "name": g.name, "sms": g.sms,
            "sram_per_block": g.sram_per_block, "sram_total": g.sms * g.sram_per_block,
            "l2_bytes": g.l2_bytes, "hbm_kind": g.hbm_kind,
            "hbm_capacity": g.hbm_capacity, "hbm_bandwidth": g.hbm_bandwidth,
            "sram_bandwidth": g.sms * SHARED_BYTES_PER_CLOCK_PER_SM * g.boost_clock_hz,
        })
    return rows


def format_memory_table(rows: list[dict]) -> str:
    """:func:`memory_table` as fixed-width text, one GPU a line."""
    head = (f"{'gpu':<10}{'SMs':>5}{'SRAM/block':>12}{'SRAM total':>12}{'L2':>9}"
            f"{'HBM':>14}{'HBM TB/s':>10}{'SRAM TB/s':>11}{'ratio':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['gpu']:<10}{r['sms']:>5}{r['sram_per_block'] / KiB:>8.0f} KiB"
            f"{r['sram_total'] / 2**20:>8.1f} MiB{r['l2_bytes'] / 1e6:>6.0f} MB"
            f"{r['hbm_capacity'] / 1e9:>5.0f} GB {r['hbm_kind']:<6}"
            f"{r['hbm_bandwidth'] / 1e12:>8.2f}{r['sram_bandwidth'] / 1e12:>11.1f}"
            f"{r['sram_bandwidth'] / r['hbm_bandwidth']:>6.1f}x")
    return "\n".join(lines)


def roofline_view(gpu: str = DEFAULT_GPU, seq_len: int = 4096, head_dim: int = 64,
                  dtype: str = "fp16", causal: bool = False) -> dict:
    """Arithmetic intensity I = FLOPs / HBM bytes of each algorithm, on ``gpu``'s roofline.

    Returns peak (FLOP/s), bandwidth (B/s), ridge = peak / bandwidth (FLOP/B) and per
    algorithm: intensity, attainable FLOP/s = min(peak, I x bandwidth), bound ("memory" or
    "compute"), the roofline time for one head, hbm_bytes and flops."""
    g = _gpu(gpu)
    peak, bw = g.peak_flops(dtype), g.hbm_bandwidth
    algs = {}
    for alg in ALGS:
        rep = plan(alg, seq_len, head_dim, dtype=dtype, gpu=gpu, causal=causal).closed_form()
        inten = rep.flops / rep.hbm_bytes
        algs[alg] = {"intensity": inten, "attainable": min(peak, inten * bw),
                     "bound": "memory" if inten * bw < peak else "compute",
                     "time_s": roofline_time(rep.hbm_bytes, rep.flops, g, dtype),
                     "hbm_bytes": rep.hbm_bytes, "flops": rep.flops}
    return {"gpu": gpu, "gpu_name": g.name, "seq_len": seq_len, "head_dim": head_dim,
            "dtype": dtype, "peak": peak, "bandwidth": bw, "ridge": peak / bw, "algs": algs}


# ================================================================ 02 standard attention

N_GRID = tuple(2**k for k in range(8, 17))          # 256 .. 65536


def standard_view(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16",
                  scale: bool = False, mask: bool = False, gpu: str = DEFAULT_GPU) -> dict:
    """Standard attention's HBM bytes by tensor at one N, and total traffic against N.

    The eager extra passes (``scale``: S / sqrt(d) as its own kernel, ``mask``: masked_fill)
    each add a full read and write of an N x N matrix. Returns ``per_tensor`` (standard),
    ``square_bytes`` (all N x N matrices) and ``square_passes`` (their traffic in units of
    N^2 b, one read or one write of an N x N matrix), ``flash2_bytes`` for comparison and
    ``curve``: N_GRID against both totals and the compulsory floor 4 N d b."""
    passes = tuple(p for p, on in (("scale", scale), ("mask", mask)) if on)
    b = DTYPE_BYTES[dtype]
    p = plan("standard", seq_len, head_dim, dtype=dtype, gpu=gpu, extra_passes=passes,
             causal=mask)
    rep = p.closed_form()
    square = {k: v for k, v in rep.per_tensor.items() if k not in "QKVO"}
    square_bytes = sum(t["read_bytes"] + t["write_bytes"] for t in square.values())
    f2 = plan("flash2", seq_len, head_dim, dtype=dtype, gpu=gpu, causal=mask).closed_form()
    return {
        "seq_len": seq_len, "head_dim": head_dim, "dtype": dtype, "passes": passes,
        "per_tensor": rep.per_tensor, "hbm_bytes": rep.hbm_bytes,
        "square_bytes": square_bytes, "square_passes": square_bytes / (seq_len**2 * b),
        "flash2_bytes": f2.hbm_bytes, "ratio": rep.hbm_bytes / f2.hbm_bytes,
        "curve": _standard_curve(head_dim, dtype, passes, gpu),
    }


@functools.lru_cache(maxsize=64)
def _standard_curve(head_dim: int, dtype: str, passes: tuple, gpu: str) -> dict:
    b = DTYPE_BYTES[dtype]
    causal = "mask" in passes
    return {
        "seq_len": np.array(N_GRID),
        "standard": np.array([plan("standard", n, head_dim, dtype=dtype, gpu=gpu,
                                   extra_passes=passes, causal=causal).closed_form().hbm_bytes
                              for n in N_GRID]),
        "flash2": np.array([plan("flash2", n, head_dim, dtype=dtype, gpu=gpu,
                                 causal=causal).closed_form().hbm_bytes for n in N_GRID]),
        "floor": 4 * np.array(N_GRID) * head_dim * b,
    }


# ================================================================ 03 online softmax

EXAMPLES = ("rising maximum", "huge logits", "max in the last block", "random")


def softmax_example(kind: str, n: int = 32, seed: int = 0) -> np.ndarray:
    """Logits (n,) chosen to exercise online softmax.

    rising maximum: a trend, so the running max changes in most blocks;
    huge logits: magnitudes up to 1e4 (e^x overflows past 709), max rising by a few units;
    max in the last block: everything seen early is rescaled at the very end;
    random: standard normal."""
    rng = np.random.default_rng(seed)
    j = np.arange(n)
    if kind == "rising maximum":
        return 0.25 * j + rng.standard_normal(n)
    if kind == "huge logits":
        return 1e4 - 8.0 + 8.0 * j / max(n - 1, 1) + 2.0 * rng.standard_normal(n)
    if kind == "max in the last block":
        x = rng.standard_normal(n)
        x[-1] = 6.0
        return x
    if kind == "random":
        return rng.standard_normal(n)
    raise FlashsimError(f"unknown example {kind!r}: choose one of {', '.join(EXAMPLES)}")


@functools.lru_cache(maxsize=64)
def _softmax_trace(kind: str, n: int, block: int, seed: int):
    x = softmax_example(kind, n, seed)
    v = np.random.default_rng(seed + 1).standard_normal(n)
    return x, v, online_softmax.trace(x, block, v)


def online_softmax_view(example: str = "rising maximum", n: int = 32, block: int = 8,
                        step: int = 0, seed: int = 0) -> dict:
    """Step ``step`` of online softmax over ``softmax_example(example, n)`` in blocks of
    ``block`` (clamped to the last step). Returns the logits x (n,), v (n,), the step's
    fields (k, lo, hi, m_old, m_new, alpha, l_old, l, y: softmax of x[:hi], output:
    softmax(x[:hi]) v[:hi]), ``steps`` (how many), ``softmax`` (the float64 reference for
    all of x), ``y_top`` (the largest y_j over all steps), ``max_changes`` (blocks where
    the running max rose) and limits for the step slider."""
    x, v, steps = _softmax_trace(example, n, block, seed)
    s = steps[min(max(step, 0), len(steps) - 1)]
    return {
        "example": example, "x": x, "v": v, "block": block, "steps": len(steps),
        "k": s.k, "lo": s.lo, "hi": s.hi, "m_old": s.m_old, "m_new": s.m_new,
        "alpha": s.alpha, "l_old": s.l_old, "l": s.l, "y": s.y, "output": s.output,
        "softmax": online_softmax.safe_softmax(x),
        "y_top": max(float(t.y.max()) for t in steps),
        "max_changes": [t.k for t in steps if t.max_changed],
        "limits": {"step": (0, len(steps) - 1)},
    }


# ================================================================ 04 SRAM size and tiles

SRAM_MIN, SRAM_MAX = 16 * KiB, 1024 * KiB
SRAM_POINTS = 25                                   # 4 per octave, 16 KiB .. 1 MiB


def sram_grid(points: int = SRAM_POINTS) -> np.ndarray:
    """SRAM sizes M (bytes), log-spaced from 16 KiB to 1 MiB."""
    return np.unique(np.geomspace(SRAM_MIN, SRAM_MAX, points).round().astype(np.int64))


def theorem2_constant(seq_len: int, head_dim: int, sizes, flash1_bytes) -> float:
    """c in Theorem 2's Theta(N^2 d^2 / M), fitted to flash1's traffic at ``sizes``: the
    geometric mean of traffic x M / (N^2 d^2), bytes and M both in bytes. (The paper's
    leading term: Q read, O read and O written N / B_c times with B_c = M / (4 d b) gives
    c = 12 b^2; our B_c also makes room for S_ij, so the fitted c comes out larger.)"""
    sizes, f1 = np.asarray(sizes, float), np.asarray(flash1_bytes, float)
    ratio = f1 * sizes / (float(seq_len) ** 2 * head_dim**2)
    return float(np.exp(np.mean(np.log(ratio))))


@functools.lru_cache(maxsize=64)
def _sram_curves(seq_len: int, head_dim: int, dtype: str, causal: bool) -> dict:
    sizes = sram_grid()
    curves, blocks = {}, {}
    for alg in ALGS:
        out, blk = [], []
        for m in sizes:
            p = plan(alg, seq_len, head_dim, dtype=dtype, sram=int(m), causal=causal)
            out.append(p.closed_form().hbm_bytes)
            blk.append((p.block_rows, p.block_cols))
        curves[alg], blocks[alg] = np.array(out, dtype=np.int64), blk
    # Fit c where B_r = min(d, N), the paper's regime (B_r = min(B_c, d)); all sizes if none.
    paper = np.array([br == min(head_dim, seq_len) for br, _ in blocks["flash1"]])
    fit = paper if paper.sum() >= 2 else np.ones(len(sizes), bool)
    c = theorem2_constant(seq_len, head_dim, sizes[fit], curves["flash1"][fit])
    return {"sizes": sizes, "curves": curves, "blocks": blocks, "c": c}


def sram_view(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16",
              sram: int | str = 100 * KiB, causal: bool = False) -> dict:
    """HBM traffic of the three algorithms against the SRAM size M, and at one M.

    Returns ``sizes`` (M grid, bytes), ``curves`` {alg: bytes at each size}, ``theorem2``
    = c N^2 d^2 / M with the fitted ``c``, ``floor`` = 4 N d b (Q, K, V read once and O
    written once), and at ``sram``: ``bytes`` {alg: hbm bytes}, ``blocks`` {alg: (B_r, B_c)}."""
    M = parse_size(sram) if isinstance(sram, str) else int(round(sram))
    cached = _sram_curves(seq_len, head_dim, dtype, bool(causal))
    at, blocks = {}, {}
    for alg in ALGS:
        p = plan(alg, seq_len, head_dim, dtype=dtype, sram=M, causal=causal)
        at[alg], blocks[alg] = p.closed_form().hbm_bytes, (p.block_rows, p.block_cols)
    b = DTYPE_BYTES[dtype]
    return {
        "seq_len": seq_len, "head_dim": head_dim, "dtype": dtype, "causal": bool(causal),
        "sram": M, "sizes": cached["sizes"], "curves": cached["curves"], "c": cached["c"],
        "theorem2": cached["c"] * float(seq_len) ** 2 * head_dim**2 / cached["sizes"],
        "floor": 4 * seq_len * head_dim * b, "bytes": at, "blocks": blocks,
    }


TILE_SEQ_LENS = (128, 256, 512, 1024)
MAX_TILES = 1024                                    # 32 x 32: still readable, traced fast


@functools.lru_cache(maxsize=32)
def _tile_schedule(algorithm: str, seq_len: int, head_dim: int, dtype: str, sram: int,
                   causal: bool) -> dict:
    """One pass over ``Plan.trace()``: for every S_ij tile computed, in order, its (i, j),
    what SRAM holds of Q, K, V, O at that moment and the HBM bytes moved so far."""
    p = plan(algorithm, seq_len, head_dim, dtype=dtype, sram=sram, causal=causal)
    Tr, Tc = cdiv(seq_len, p.block_rows), cdiv(seq_len, p.block_cols)
    order = np.full((Tr, Tc), -1, dtype=np.int64)
    resident: dict[str, tuple[str, tuple[int, int]]] = {}
    tiles, held, read, written = [], [], [], []
    rd = wr = 0
    o_written = np.zeros(Tr, dtype=np.int64)
    writes = []
    for rec in p.trace():
        op = rec["op"]
        if op in ("load", "alloc"):
            name = rec["tensor"] or rec["buf"].split("_")[0]
            if name in ("Q", "K", "V", "O"):
                resident[rec["buf"]] = (name, rec["rows"])
            rd += rec["bytes"] if op == "load" else 0
        elif op == "store":
            wr += rec["bytes"]
            if rec["tensor"] == "O":
                o_written[rec["rows"][0] // p.block_rows] += 1
        elif op == "free":
            for buf in rec["bufs"]:
                resident.pop(buf, None)
        elif op == "compute" and rec["name"].startswith("S_ij"):
            i, j = rec["blocks"]["i"], rec["blocks"]["j"]
            order[i, j] = len(tiles)
            tiles.append((i, j))
            held.append(tuple(sorted(resident.values())))
            read.append(rd)
            written.append(wr)
            writes.append(o_written.copy())
    return {"plan": p, "order": order, "tiles": tiles, "held": held, "read": read,
            "written": written, "o_writes": writes, "total_read": rd, "total_written": wr}


def tile_view(algorithm: str = "flash2", seq_len: int = 256, head_dim: int = 64,
              dtype: str = "fp16", sram: int | str = 48 * KiB, causal: bool = True,
              step: int = 0) -> dict:
    """The tile grid of S (T_r x T_c tiles of B_r x B_c) at the ``step``-th tile computed.

    ``state`` (T_r, T_c): 0 not yet, 1 done, 2 current, 3 skipped (fully masked, never
    computed); ``held`` [(tensor, (row_lo, row_hi)), ...]: the rows of Q, K, V, O in SRAM
    at this step; ``read_bytes``/``written_bytes``: HBM traffic so far (one head);
    ``o_writes`` (T_r,): how many times each O block has been written so far."""
    if algorithm not in ("flash1", "flash2"):
        raise FlashsimError("the tile view shows flash1 or flash2")
    M = parse_size(sram) if isinstance(sram, str) else int(round(sram))
    p = plan(algorithm, seq_len, head_dim, dtype=dtype, sram=M, causal=causal)
    tiles = cdiv(seq_len, p.block_rows) * cdiv(seq_len, p.block_cols)
    if tiles > MAX_TILES:
        raise FlashsimError(
            f"{tiles} tiles (B_r = {p.block_rows}, B_c = {p.block_cols}) are too many to "
            f"draw; the grid shows at most {MAX_TILES}: raise M or lower N")
    sch = _tile_schedule(algorithm, seq_len, head_dim, dtype, M, bool(causal))
    p, order = sch["plan"], sch["order"]
    s = min(max(step, 0), len(sch["tiles"]) - 1)
    state = np.where(order < 0, 3, np.where(order < s, 1, np.where(order == s, 2, 0)))
    i, j = sch["tiles"][s]
    return {
        "algorithm": algorithm, "seq_len": seq_len, "head_dim": head_dim, "dtype": dtype,
        "sram": M, "causal": bool(causal), "block_rows": p.block_rows,
        "block_cols": p.block_cols, "state": state, "step": s, "steps": len(sch["tiles"]),
        "i": i, "j": j, "held": list(sch["held"][s]), "read_bytes": sch["read"][s],
        "written_bytes": sch["written"][s], "o_writes": sch["o_writes"][s],
        "total_read": sch["total_read"], "total_written": sch["total_written"],
        "skipped": int((order < 0).sum()), "limits": {"step": (0, len(sch["tiles"]) - 1)},
    }


# ================================================================ 05 FlashAttention-2

def loop_order_view(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16",
                    sram: int | str = 100 * KiB, causal: bool = False) -> dict:
    """flash1 against flash2, tensor by tensor: ``per_tensor`` {alg: {tensor: {read_bytes,
    write_bytes}}} and the O traffic of each in units of N d b (``o_passes``)."""
    M = parse_size(sram) if isinstance(sram, str) else int(round(sram))
    nd = seq_len * head_dim * DTYPE_BYTES[dtype]
    out = {"seq_len": seq_len, "head_dim": head_dim, "dtype": dtype, "sram": M,
           "per_tensor": {}, "o_passes": {}, "hbm_bytes": {}, "blocks": {}}
    for alg in ("flash1", "flash2"):
        p = plan(alg, seq_len, head_dim, dtype=dtype, sram=M, causal=causal)
        rep = p.closed_form()
        o = rep.per_tensor["O"]
        out["per_tensor"][alg] = rep.per_tensor
        out["o_passes"][alg] = (o["read_bytes"] + o["write_bytes"]) / nd
        out["hbm_bytes"][alg] = rep.hbm_bytes
        out["blocks"][alg] = (p.block_rows, p.block_cols)
    return out


def occupancy(scheme: str, batch: int, heads: int, seq_len: int, block_rows: int,
              sms: int = 132) -> dict:
    """How thread blocks fill the SMs, one block per SM at a time.

    ``"flash1"``: FA1's original kernel, grid = batch x heads, each block loops over all
    T_r = ceil(N / B_r) Q blocks. ``"flash2"``: grid = batch x heads x T_r, one Q block
    each. Work is counted in Q-block units (one B_r-row block against all of K, V).
    Returns blocks, waves = ceil(blocks / sms), units per block, time (units: waves x units
    per block) and utilisation (work / (sms x time))."""
    for name, v in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                    ("block_rows", block_rows), ("sms", sms)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise FlashsimError(f"{name} must be a positive integer, got {v!r}")
    Tr = cdiv(seq_len, block_rows)
    if scheme == "flash1":
        blocks, units = batch * heads, Tr
    elif scheme == "flash2":
        blocks, units = batch * heads * Tr, 1
    else:
        raise FlashsimError(f"unknown scheme {scheme!r}: choose flash1 or flash2")
    waves = cdiv(blocks, sms)
    time_units = waves * units
    return {"scheme": scheme, "blocks": blocks, "waves": waves, "units_per_block": units,
            "time_units": time_units, "utilisation": batch * heads * Tr / (sms * time_units),
            "sms": sms, "q_blocks": Tr}


def parallelism_view(batch: int = 2, heads: int = 4, seq_len: int = 8192,
                     block_rows: int = 128, gpu: str = DEFAULT_GPU) -> dict:
    """FA1's and FA2's grids side by side on ``gpu``'s SMs: {"flash1": occupancy(...),
    "flash2": ...}, ``speedup`` = FA1 time / FA2 time, ``time_units`` T (the longer of the
    two) and ``busy`` {scheme: (sms, C)}: the fraction of each of C <= 512 equal slices of
    [0, T) in which each SM is busy, for the picture."""
    sms = _gpu(gpu).sms
    occ = {s: occupancy(s, batch, heads, seq_len, block_rows, sms) for s in ("flash1", "flash2")}
    T = max(o["time_units"] for o in occ.values())
    cols = min(T, 512)
    t0 = np.arange(cols) * (T / cols)              # column c covers [t0, t0 + T / cols)
    busy = {}
    for s, o in occ.items():
        # SM k runs blocks k, k + sms, ... back to back: busy on [0, end_k).
        k = np.arange(sms)
        end = np.maximum(0, -(-(o["blocks"] - k) // sms)) * o["units_per_block"]
        busy[s] = np.clip((end[:, None] - t0[None, :]) / (T / cols), 0.0, 1.0)  # (sms, cols)
    return {"batch": batch, "heads": heads, "seq_len": seq_len, "block_rows": block_rows,
            "gpu": gpu, "sms": sms, **occ, "busy": busy, "time_units": T,
            "speedup": occ["flash1"]["time_units"] / occ["flash2"]["time_units"]}


# ================================================================ panels (ipywidgets)

class Panel:
    """Controls + a view function + a picture. Any control's change runs :meth:`refresh`:

        view = compute(**values); picture.update(view); PNG -> image widget

    ``view`` holds the last result, ``last_ms`` the last refresh's wall time; bad input
    (a FlashsimError) leaves the picture as it was and puts the message in ``error`` and
    above the picture. A view may return ``limits`` {control: (lo, hi)}, e.g. how many
    steps there are; the control's range follows it (and the view is recomputed if its
    value had to move). Displaying a Panel displays its ``widget``, with the current picture
    as a PNG beside it for renderers without widgets (:meth:`_repr_mimebundle_`)."""

    def __init__(self, compute: Callable[..., dict], picture, controls: dict,
                 figsize=(9.0, 4.0), dpi: int = 80):
        import ipywidgets as W

        from . import pictures
        self.compute, self.controls, self.dpi = compute, dict(controls), dpi
        self.fig = pictures.figure(figsize, dpi)
        self.picture = picture(self.fig)
        self.image = W.Image(format="png")
        self.message = W.HTML()
        self.view: dict = {}
        self.error: str | None = None
        self.last_ms = float("nan")
        self._busy = False
        self._renderer = pictures.LayeredRenderer(self.fig)
        for w in self.controls.values():
            w.observe(self._on_change, names="value")
        self.widget = W.VBox([W.HBox(list(self.controls.values()),
                                     layout=W.Layout(flex_flow="row wrap")),
                              self.message, self.image])
        self.refresh()

    def values(self) -> dict:
        return {k: w.value for k, w in self.controls.items()}

    def _on_change(self, change) -> None:
        if not self._busy:
            self.refresh()

    def refresh(self) -> dict:
        t0 = time.perf_counter()
        self._busy = True
        try:
            view = self.compute(**self.values())
            for name, (lo, hi) in view.get("limits", {}).items():
                w = self.controls.get(name)
                if w is not None and (w.min, w.max) != (lo, hi):
                    w.min, w.max = min(w.min, lo), max(w.max, hi)   # never lo > hi on the way
                    w.min, w.max = lo, hi
                    view = self.compute(**self.values())
        except FlashsimError as e:       # e.g. tiles that do not fit: say so, keep the picture
            self.error = str(e)
            self.message.value = f"<b>not drawn:</b> {self.error}"
            return self.view
        finally:
            self._busy = False
        self.error = None
        self.message.value = ""
        self.view = view
        self.picture.update(view)
        self.image.value = self.png()
        self.last_ms = (time.perf_counter() - t0) * 1e3
        return view

    def png(self) -> bytes:
        """Render (in layers: only what changed is drawn again) and encode as PNG."""
        import matplotlib
        with matplotlib.rc_context(RENDER_RC):
            self._renderer.render(self.picture, self.view)
        return self._renderer.png()

    def _repr_mimebundle_(self, **kwargs):
        """The live widget for JupyterLab and, beside it, the picture as it is now as a PNG:
        renderers that cannot run widgets (nbconvert, the docs site) show that instead."""
        data = dict(self.widget._repr_mimebundle_(**kwargs))
        data["image/png"] = base64.b64encode(self.image.value).decode("ascii")
        return data


def _w():
    import ipywidgets as W
    return W


def _style():
    return {"description_width": "initial"}


def _sram_slider(value: int, description: str = "SRAM M (bytes)"):
    """Log scale, 16 KiB to 1 MiB in steps of 2^(1/8); the readout is the exact bytes."""
    W = _w()
    return W.FloatLogSlider(value=value, base=2, min=14, max=20, step=0.125,
                            description=description, readout_format=",.0f",
                            continuous_update=True, style=_style())


def _pow2_slider(options, value, description):
    W = _w()
    return W.SelectionSlider(options=list(options), value=value, description=description,
                             continuous_update=True, style=_style())


def roofline_panel(gpu: str = DEFAULT_GPU, seq_len: int = 4096, head_dim: int = 64,
                   dtype: str = "fp16") -> Panel:
    """Notebook 01: the roofline of a preset with standard, flash1 and flash2 on it."""
    from . import pictures
    W = _w()
    return Panel(roofline_view, pictures.RooflinePicture, {
        "gpu": W.Dropdown(options=list(GPUS), value=gpu, description="GPU"),
        "seq_len": _pow2_slider(N_GRID, seq_len, "N"),
        "head_dim": _pow2_slider((32, 64, 128, 256), head_dim, "d"),
        "dtype": W.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="dtype"),
    }, figsize=(7.5, 4.2))


def standard_panel(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16") -> Panel:
    """Notebook 02: standard attention's bytes by tensor, a slider on N, eager extra passes."""
    from . import pictures
    W = _w()
    return Panel(standard_view, pictures.StandardTrafficPicture, {
        "seq_len": _pow2_slider(N_GRID, seq_len, "N"),
        "head_dim": _pow2_slider((32, 64, 128, 256), head_dim, "d"),
        "dtype": W.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="dtype"),
        "scale": W.Checkbox(value=False, description="separate scale pass"),
        "mask": W.Checkbox(value=False, description="separate mask pass (causal)"),
    }, figsize=(10.0, 4.0))


def online_softmax_panel(example: str = "rising maximum", n: int = 32,
                         block: int = 8) -> Panel:
    """Notebook 03: online softmax, one block per step (a Play button drives the step)."""
    from . import pictures
    W = _w()
    steps = cdiv(n, block)
    step = W.IntSlider(value=0, min=0, max=steps - 1, description="step",
                       continuous_update=True)
    panel = Panel(online_softmax_view, pictures.OnlineSoftmaxPicture, {
        "example": W.Dropdown(options=list(EXAMPLES), value=example, description="input"),
        "n": W.IntSlider(value=n, min=4, max=64, description="N", continuous_update=False),
        "block": W.IntSlider(value=block, min=1, max=16, description="block"),
        "step": step,
    }, figsize=(9.0, 5.0))
    play = W.Play(value=0, min=0, max=step.max, interval=900, description="play")
    W.jslink((play, "value"), (step, "value"))
    W.jslink((step, "max"), (play, "max"))
    panel.widget.children = (W.HBox([play]),) + tuple(panel.widget.children)
    panel.play = play
    return panel


def sram_panel(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16",
               sram: int = 100 * KiB, causal: bool = False) -> Panel:
    """Notebook 04: HBM traffic against SRAM size, a log slider from 16 KiB to 1 MiB."""
    from . import pictures
    W = _w()
    return Panel(sram_view, pictures.SramPicture, {
        "sram": _sram_slider(sram),
        "seq_len": _pow2_slider(N_GRID, seq_len, "N"),
        "head_dim": _pow2_slider((32, 64, 128, 256), head_dim, "d"),
        "dtype": W.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="dtype"),
        "causal": W.Checkbox(value=causal, description="causal"),
    }, figsize=(9.0, 4.6))


def tile_panel(algorithm: str = "flash2", seq_len: int = 256, head_dim: int = 64,
               sram: int = 48 * KiB, causal: bool = True) -> Panel:
    """Notebook 04: the tile grid, the blocks in SRAM at a chosen step, causal skipping."""
    from . import pictures
    W = _w()
    return Panel(tile_view, pictures.TilePicture, {
        "algorithm": W.Dropdown(options=["flash1", "flash2"], value=algorithm,
                                description="algorithm"),
        "seq_len": _pow2_slider(TILE_SEQ_LENS, seq_len, "N"),
        "head_dim": _pow2_slider((32, 64, 128), head_dim, "d"),
        "dtype": W.Dropdown(options=list(DTYPE_BYTES), value="fp16", description="dtype"),
        "sram": _sram_slider(sram),
        "causal": W.Checkbox(value=causal, description="causal"),
        "step": W.IntSlider(value=0, min=0, max=1, description="step"),
    }, figsize=(9.0, 5.0))


def loop_order_panel(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16",
                     sram: int = 100 * KiB) -> Panel:
    """Notebook 05: flash1 against flash2, HBM bytes by tensor."""
    from . import pictures
    W = _w()
    return Panel(loop_order_view, pictures.LoopOrderPicture, {
        "seq_len": _pow2_slider(N_GRID, seq_len, "N"),
        "head_dim": _pow2_slider((32, 64, 128, 256), head_dim, "d"),
        "dtype": W.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="dtype"),
        "sram": _sram_slider(sram),
    }, figsize=(8.0, 4.0))


def parallelism_panel(batch: int = 2, heads: int = 4, seq_len: int = 8192,
                      block_rows: int = 128) -> Panel:
    """Notebook 05: thread blocks over the SMs, FA1's grid against FA2's."""
    from . import pictures
    W = _w()
    return Panel(parallelism_view, pictures.WavesPicture, {
        "batch": W.IntSlider(value=batch, min=1, max=64, description="batch"),
        "heads": W.IntSlider(value=heads, min=1, max=64, description="heads"),
        "seq_len": _pow2_slider(N_GRID, seq_len, "N"),
        "block_rows": _pow2_slider((64, 128, 256), block_rows, "B_r"),
    }, figsize=(9.0, 4.6))


def recomputation_panel(seq_len: int = 1024, head_dim: int = 64, batch: int = 64,
                        heads: int = 16, dtype: str = "fp16", gpu: str = DEFAULT_GPU):
    """A slider on N over :func:`memory_view` and :class:`RecomputationPicture`."""
    import ipywidgets as W

    from . import backward, pictures
    controls = {"seq_len": W.SelectionSlider(options=[2**k for k in range(8, 17)],
                                             value=seq_len, description="N",
                                             continuous_update=False)}

    def compute(seq_len):
        return backward.memory_view(seq_len, head_dim, batch, heads, dtype, gpu)

    return Panel(compute, pictures.RecomputationPicture, controls, figsize=(10.0, 4.0))
