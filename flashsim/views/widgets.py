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
    panel.caption                           # the controls as the browser shows them

What the numbers are: the views' byte counts are what SRAM requests from the level below it
(the two-level model's "HBM traffic"); where a GPU preset applies, :func:`dram_bytes` (the L2
model, :mod:`flashsim.hardware.l2`) gives what reaches DRAM, for N up to ``DRAM_MAX_N``.

Controls hold only values a browser can show: a slider's value is one of its steps (the
SRAM slider is a :class:`~ipywidgets.SelectionSlider` over :func:`sram_options`, so a value
off its grid is refused instead of being snapped by the browser), and a panel's
``caption`` is written from the controls' own state.
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
from ..hardware import l2 as _l2
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


# ================================================================ DRAM bytes (the L2 model)

# The L2 model steps through every thread block, so it answers in about a second at
# N = 4096 and far slower past it; the views draw DRAM bytes up to this N (when
# flashsim.hardware.l2 is faster, raise it).
DRAM_MAX_N = 4096
_DRAM_CACHE: dict = {}


def dram_bytes(p) -> int:
    """What reaches DRAM for plan ``p`` on its preset's L2 (the default preset's without
    one), counting the output still dirty in L2 when the kernels end: the L2 model's
    ``dram_read + dram_write + dirty_at_end`` bytes. Cached per schedule (algorithm, shape,
    tiles, placement, softmax rows), since that, not M itself, is what the L2 model reads."""
    key = (p.algorithm, p.pass_, p.seq_len, p.head_dim, p.batch, p.heads, p.dtype, p.causal,
           p.extra_passes, p.block_rows, p.block_cols, p.softmax_rows, p.placement,
           p.gpu.name if p.gpu else None,
           sum(b for _, b in p.working_set()), sum(b for _, b in p.register_set()))
    if key not in _DRAM_CACHE:
        x = _l2.simulate(p)
        _DRAM_CACHE[key] = x.dram_read_bytes + x.dram_write_bytes + x.dirty_at_end_bytes
    return _DRAM_CACHE[key]


# ================================================================ 01 memory hierarchy

def memory_table(names=None) -> list[dict]:
    """One row per GPU preset: capacities (bytes) and bandwidths (bytes/s) of the levels.

    ``sram_total`` is SMs x the shared memory one block may use (what the model calls M, on
    every SM at once); ``l1_shared_total`` SMs x the SM's whole L1 + shared memory (the
    FlashAttention paper's "SRAM"); ``registers_total`` SMs x the register file;
    ``sram_bandwidth`` the estimate in :data:`SHARED_BYTES_PER_CLOCK_PER_SM`'s comment."""
    rows = []
    for name in names or GPUS:
        g = _gpu(name)
        rows.append({
            "gpu": name, "name": g.name, "sms": g.sms,
            "sram_per_block": g.sram_per_block, "sram_total": g.sms * g.sram_per_block,
            "sram_per_sm": g.sram_per_sm, "l1_shared_per_sm": g.l1_shared_per_sm,
            "l1_shared_total": g.sms * g.l1_shared_per_sm,
            "registers_per_sm": g.register_bytes_per_sm,
            "registers_per_block": g.register_bytes_per_block,
            "registers_total": g.sms * g.register_bytes_per_sm,
            "l2_bytes": g.l2_bytes, "hbm_kind": g.hbm_kind,
            "hbm_capacity": g.hbm_capacity, "hbm_bandwidth": g.hbm_bandwidth,
            "sram_bandwidth": g.sms * SHARED_BYTES_PER_CLOCK_PER_SM * g.boost_clock_hz,
        })
    return rows


def memory_levels(gpu: str = DEFAULT_GPU) -> list[dict]:
    """The four levels of one preset, from the SM outwards: ``level``, ``per_block`` (what
    one thread block may hold; None where the level is not split by block), ``per_sm``,
    ``chip`` (all SMs, or the one shared L2 and DRAM) in bytes, and ``holds`` (what a
    FlashAttention-2 kernel keeps there)."""
    g = _gpu(gpu)
    return [
        {"level": "registers", "per_block": g.register_bytes_per_block,
         "per_sm": g.register_bytes_per_sm, "chip": g.sms * g.register_bytes_per_sm,
         "holds": "S_ij / P_ij, the O_i accumulator, m_i, l_i"},
        {"level": "shared memory", "per_block": g.sram_per_block, "per_sm": g.sram_per_sm,
         "chip": g.sms * g.sram_per_sm, "holds": "Q_i, K_j, V_j (tiles loaded from HBM)"},
        {"level": "L2", "per_block": None, "per_sm": None, "chip": g.l2_bytes,
         "holds": "recent tiles of Q, K, V, O for every SM"},
        {"level": "DRAM (HBM)", "per_block": None, "per_sm": None,
         "chip": int(g.hbm_capacity), "holds": "Q, K, V, O, L"},
    ]


def format_memory_levels(gpu: str = DEFAULT_GPU) -> str:
    """:func:`memory_levels` as text."""
    def cell(x):
        return "" if x is None else (f"{x / 1e9:.0f} GB" if x >= 10**10 else
                                     (f"{x / 2**20:.1f} MiB" if x >= 2**20 else
                                      f"{x / KiB:,.1f} KiB"))
    lines = [f"{'level':<15}{'a block':>12}{'an SM':>12}{'the chip':>12}   holds",
             "-" * 90]
    for r in memory_levels(gpu):
        lines.append(f"{r['level']:<15}{cell(r['per_block']):>12}{cell(r['per_sm']):>12}"
                     f"{cell(r['chip']):>12}   {r['holds']}")
    return "\n".join(lines)


def sram_sizes(gpu: str = "a100-80gb") -> dict:
    """The three "SRAM sizes" a reader meets, on one preset: ``paper_total`` (the
    FlashAttention paper's "about 20 MB" on an A100: SMs x the L1 + shared memory of an
    SM), ``per_sm`` (its "192 KB per SM": L1 and shared memory together, of which the
    program may take ``shared_per_sm`` as shared memory) and ``M`` (flashsim's SRAM size:
    the shared memory one thread block may use), with ``registers_per_sm`` beside."""
    g = _gpu(gpu)
    return {"gpu": g.name, "sms": g.sms, "paper_total": g.sms * g.l1_shared_per_sm,
            "per_sm": g.l1_shared_per_sm, "shared_per_sm": g.sram_per_sm,
            "M": g.sram_per_block, "registers_per_sm": g.register_bytes_per_sm,
            "registers_per_block": g.register_bytes_per_block}


def format_memory_table(rows: list[dict]) -> str:
    """:func:`memory_table` as fixed-width text, one GPU a line."""
    head = (f"{'gpu':<10}{'SMs':>5}{'regs/SM':>9}{'M/block':>9}{'L1+sh/SM':>10}"
            f"{'shared total':>13}{'L2':>9}"
            f"{'HBM':>14}{'HBM TB/s':>10}{'SRAM TB/s':>11}{'ratio':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['gpu']:<10}{r['sms']:>5}{r['registers_per_sm'] / KiB:>5.0f} KiB"
            f"{r['sram_per_block'] / KiB:>5.0f} KiB{r['l1_shared_per_sm'] / KiB:>6.0f} KiB"
            f"{r['sram_total'] / 2**20:>9.1f} MiB{r['l2_bytes'] / 2**20:>5.0f} MiB"
            f"{r['hbm_capacity'] / 1e9:>5.0f} GB {r['hbm_kind']:<6}"
            f"{r['hbm_bandwidth'] / 1e12:>8.2f}{r['sram_bandwidth'] / 1e12:>11.1f}"
            f"{r['sram_bandwidth'] / r['hbm_bandwidth']:>6.1f}x")
    return "\n".join(lines)


def roofline_view(gpu: str = DEFAULT_GPU, seq_len: int = 4096, head_dim: int = 64,
                  dtype: str = "fp16", causal: bool = False) -> dict:
    """Arithmetic intensity of each algorithm on ``gpu``'s roofline, with the preset's tiles
    (buffers placed as kernels place them).

    Returns peak (FLOP/s), bandwidth (B/s), ridge = peak / bandwidth (FLOP/B) and per
    algorithm: ``intensity`` = FLOPs / bytes requested from the level below SRAM (the
    two-level count: the bytes DRAM would see if the L2 cache kept nothing), attainable
    FLOP/s = min(peak, I x bandwidth), bound ("memory" or "compute"), the roofline time for
    one head, ``requested_bytes`` and flops; and, for N <= ``DRAM_MAX_N``, the same from
    the L2 model's DRAM bytes: ``dram_bytes``, ``dram_intensity``, ``dram_bound``
    (None past it)."""
    g = _gpu(gpu)
    peak, bw = g.peak_flops(dtype), g.hbm_bandwidth
    algs = {}
    for alg in ALGS:
        p = plan(alg, seq_len, head_dim, dtype=dtype, gpu=gpu, causal=causal)
        rep = p.closed_form()
        inten = rep.flops / rep.requested_bytes
        dram = dram_bytes(p) if seq_len <= DRAM_MAX_N else None
        di = None if dram is None else rep.flops / dram
        algs[alg] = {"intensity": inten, "attainable": min(peak, inten * bw),
                     "bound": "memory" if inten * bw < peak else "compute",
                     "time_s": roofline_time(rep.requested_bytes, rep.flops, g, dtype),
                     "requested_bytes": rep.requested_bytes, "hbm_bytes": rep.requested_bytes,
                     "flops": rep.flops, "blocks": (p.block_rows, p.block_cols),
                     "dram_bytes": dram, "dram_intensity": di,
                     "dram_attainable": None if di is None else min(peak, di * bw),
                     "dram_bound": None if di is None else
                     ("memory" if di * bw < peak else "compute")}
    return {"gpu": gpu, "gpu_name": g.name, "seq_len": seq_len, "head_dim": head_dim,
            "dtype": dtype, "peak": peak, "bandwidth": bw, "ridge": peak / bw, "algs": algs,
            "dram_max_n": DRAM_MAX_N}


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
DRAM_SIZES = tuple(2**k for k in range(15, 21))    # where the DRAM curve is computed


def sram_grid(points: int = SRAM_POINTS) -> np.ndarray:
    """SRAM sizes M (bytes), log-spaced from 16 KiB to 1 MiB."""
    return np.unique(np.geomspace(SRAM_MIN, SRAM_MAX, points).round().astype(np.int64))


def sram_options() -> list[int]:
    """The SRAM slider's values, in bytes: whole KiB at 2^(1/8) steps from 16 KiB to 1 MiB,
    and the sizes a cell or a preset names (48 and 100 KiB, each preset's M). A slider over
    exactly these values shows what a cell sets, never a neighbour it snaps to."""
    grid = {int(round(2 ** (14 + k / 8) / KiB)) * KiB for k in range(49)}
    grid |= {48 * KiB, 100 * KiB} | {g.sram_per_block for g in GPUS.values()}
    return sorted(grid)


def sram_label(m: int) -> str:
    """How the SRAM slider shows ``m`` bytes: ``"227 KiB"``."""
    return f"{m // KiB} KiB" if m % KiB == 0 else f"{m:,} B"


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
            out.append(p.closed_form().requested_bytes)
            blk.append((p.block_rows, p.block_cols))
        curves[alg], blocks[alg] = np.array(out, dtype=np.int64), blk
    # Fit c where B_r = min(d, N), the paper's regime (B_r = min(B_c, d)); all sizes if none.
    paper = np.array([br == min(head_dim, seq_len) for br, _ in blocks["flash1"]])
    fit = paper if paper.sum() >= 2 else np.ones(len(sizes), bool)
    c = theorem2_constant(seq_len, head_dim, sizes[fit], curves["flash1"][fit])
    return {"sizes": sizes, "curves": curves, "blocks": blocks, "c": c}


@functools.lru_cache(maxsize=32)
def _dram_curves(seq_len: int, head_dim: int, dtype: str, causal: bool) -> dict | None:
    """DRAM bytes (L2 model, the default preset's L2) of the same two-level plans at
    ``DRAM_SIZES``; None past ``DRAM_MAX_N``."""
    if seq_len > DRAM_MAX_N:
        return None
    return {alg: np.array([dram_bytes(plan(alg, seq_len, head_dim, dtype=dtype, sram=m,
                                           causal=causal)) for m in DRAM_SIZES],
                          dtype=np.int64) for alg in ALGS}


def sram_view(seq_len: int = 4096, head_dim: int = 64, dtype: str = "fp16",
              sram: int | str = 100 * KiB, causal: bool = False) -> dict:
    """Traffic of the three algorithms against the SRAM size M (the paper's two-level
    model: every buffer in an SRAM of M bytes), and at one M.

    Returns ``sizes`` (M grid, bytes), ``curves`` {alg: bytes requested from the level below
    SRAM at each size}, ``theorem2`` = c N^2 d^2 / M with the fitted ``c``, ``floor`` =
    4 N d b (Q, K, V read once and O written once), and at ``sram``: ``bytes`` {alg:
    requested bytes}, ``blocks`` {alg: (B_r, B_c)}. ``dram`` {alg: bytes at
    ``dram_sizes``}: what the L2 model of the default preset (60 MiB on an H200) sends to
    DRAM for the same plans, or None when N > ``DRAM_MAX_N``."""
    M = parse_size(sram) if isinstance(sram, str) else int(round(sram))
    cached = _sram_curves(seq_len, head_dim, dtype, bool(causal))
    at, blocks = {}, {}
    for alg in ALGS:
        p = plan(alg, seq_len, head_dim, dtype=dtype, sram=M, causal=causal)
        at[alg], blocks[alg] = p.closed_form().requested_bytes, (p.block_rows, p.block_cols)
    b = DTYPE_BYTES[dtype]
    return {
        "seq_len": seq_len, "head_dim": head_dim, "dtype": dtype, "causal": bool(causal),
        "sram": M, "sizes": cached["sizes"], "curves": cached["curves"], "c": cached["c"],
        "theorem2": cached["c"] * float(seq_len) ** 2 * head_dim**2 / cached["sizes"],
        "floor": 4 * seq_len * head_dim * b, "bytes": at, "blocks": blocks,
        "dram_sizes": np.array(DRAM_SIZES), "dram": _dram_curves(seq_len, head_dim, dtype,
                                                                 bool(causal)),
        "dram_max_n": DRAM_MAX_N, "l2_bytes": _gpu(DEFAULT_GPU).l2_bytes,
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


def nonmatmul_flops(algorithm: str, seq_len: int, head_dim: int, block_rows: int,
                    block_cols: int) -> dict:
    """Elementwise FLOPs (everything but the two matmuls) of a forward pass without a mask,
    one head, counted from the Compute steps of ``flash1.py`` and ``flash2.py`` as written:
    one FLOP per add, multiply, divide, max, exp or log. Per tile of r rows and c columns:

        flash1: scale S, rowmax, exp(S - m~), rowsum            5 r c
                m_new, e^(m - m_new), e^(m~ - m_new), l_new      8 r
                O = diag(l_new)^-1 (l a O + b~ P~V): l a, then
                four passes over r x d                           4 r d + r
        flash2: scale S, rowmax, exp(S - m_new), rowsum          5 r c
                m_new, alpha = e^(m - m_new), l = alpha l + .    5 r
                O = alpha O + P V (unnormalised)                 2 r d
                once per Q block, at the end: O / l, L = m + log l   r d + 2 r

    FlashAttention-2's saving is the rescale: O is divided by l once, not at every tile.
    Returns ``total`` and its parts, and ``matmul`` = 4 N^2 d for scale."""
    if algorithm not in ("flash1", "flash2"):
        raise FlashsimError("non-matmul FLOPs are counted for flash1 and flash2")
    N, d, Br, Bc = seq_len, head_dim, block_rows, block_cols
    for name, v in (("seq_len", N), ("head_dim", d), ("block_rows", Br), ("block_cols", Bc)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise FlashsimError(f"{name} must be a positive integer, got {v!r}")
    Tc = cdiv(N, Bc)
    rc, r_tiles = N * N, N * Tc          # sum over tiles of r c, and of r
    softmax = 5 * rc
    if algorithm == "flash1":
        stats, rescale, final = 8 * r_tiles, 4 * d * r_tiles + r_tiles, 0
    else:
        stats, rescale, final = 5 * r_tiles, 2 * d * r_tiles, N * d + 2 * N
    return {"algorithm": algorithm, "softmax": softmax, "statistics": stats,
            "rescale": rescale, "final": final, "total": softmax + stats + rescale + final,
            "matmul": 4 * N * N * d, "tiles": cdiv(N, Br) * Tc}


def warp_partition_view(block_rows: int = 128, block_cols: int = 64, head_dim: int = 128,
                        warps: int = 4) -> dict:
    """How the warps of one thread block share a B_r x B_c tile, FlashAttention against
    FlashAttention-2 (the FlashAttention-2 paper, section 3.3).

    ``split-K`` (FlashAttention): K_j, V_j split across the warps, Q_i read by all. Warp w
    computes the columns of S_ij it owns, so every row's max, sum and O_i are spread over
    all warps: per K/V block each warp writes its partial row maxima, row sums and B_r x d
    partial O_i to shared memory and reads the others' back to combine them, behind a
    barrier each (3). ``split-Q`` (FlashAttention-2): Q_i split across the warps, K_j, V_j
    read by all. Warp w owns whole rows of S_ij, m_i, l_i and O_i: nothing to combine.

    Returns per scheme: ``owner_S`` (B_r, B_c) and ``owner_O`` (B_r, d), the warp owning
    each element (-1: every warp holds a partial), ``exchange_written`` and
    ``exchange_read`` (elements per K/V block, for combining warps' results),
    ``barriers`` (extra per K/V block) and ``operand_reads`` (elements of Q_i, K_j, V_j
    the warps read from shared memory per K/V block)."""
    Br, Bc, d, w = block_rows, block_cols, head_dim, warps
    for name, v in (("block_rows", Br), ("block_cols", Bc), ("head_dim", d), ("warps", w)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise FlashsimError(f"{name} must be a positive integer, got {v!r}")
    if Bc % w or Br % w:
        raise FlashsimError(f"B_r = {Br} and B_c = {Bc} must be multiples of the {w} warps")
    cols = np.repeat(np.arange(w), Bc // w)
    rows = np.repeat(np.arange(w), Br // w)
    stats = 2 * Br                                  # a row max and a row sum per row
    split_k = {
        "owner_S": np.broadcast_to(cols[None, :], (Br, Bc)).copy(),
        "owner_O": np.full((Br, d), -1),
        "exchange_written": w * (stats + Br * d), "exchange_read": w * (stats + Br * d),
        "barriers": 3, "operand_reads": w * Br * d + 2 * Bc * d,
    }
    split_q = {
        "owner_S": np.broadcast_to(rows[:, None], (Br, Bc)).copy(),
        "owner_O": np.broadcast_to(rows[:, None], (Br, d)).copy(),
        "exchange_written": 0, "exchange_read": 0, "barriers": 0,
        "operand_reads": Br * d + 2 * w * Bc * d,
    }
    return {"block_rows": Br, "block_cols": Bc, "head_dim": d, "warps": w,
            "split-K": split_k, "split-Q": split_q}


# ================================================================ panels (ipywidgets)

class Panel:
    """Controls + a view function + a picture. Any control's change runs :meth:`refresh`:

        view = compute(**values); picture.update(view); PNG -> image widget

    ``view`` holds the last result, ``last_ms`` the last refresh's wall time; bad input
    (a FlashsimError) leaves the picture as it was and puts the message in ``error`` and
    above the picture. A view may return ``limits`` {control: (lo, hi)}, e.g. how many
    steps there are; the control's range follows it (and the view is recomputed if its
    value had to move). Displaying a Panel displays its ``widget``, with the current picture
    as a PNG beside it for renderers without widgets (:meth:`_repr_mimebundle_`).

    ``caption`` (shown above the picture) is written from the controls' own state: each
    control's description and the text the browser shows for its value (a selection
    slider's label, not the number behind it), so what a reader sees next to the sliders
    is what the picture was computed from."""

    def __init__(self, compute: Callable[..., dict], picture, controls: dict,
                 figsize=(9.0, 4.0), dpi: int = 80):
        import ipywidgets as W

        from . import pictures
        self.compute, self.controls, self.dpi = compute, dict(controls), dpi
        self.fig = pictures.figure(figsize, dpi)
        self.picture = picture(self.fig)
        self.image = W.Image(format="png")
        self.message = W.HTML()
        self.caption_html = W.HTML()
        self.view: dict = {}
        self.error: str | None = None
        self.last_ms = float("nan")
        self._busy = False
        self._renderer = pictures.LayeredRenderer(self.fig)
        for w in self.controls.values():
            w.observe(self._on_change, names="value")
        self.widget = W.VBox([W.HBox(list(self.controls.values()),
                                     layout=W.Layout(flex_flow="row wrap")),
                              self.caption_html, self.message, self.image])
        self.refresh()

    def values(self) -> dict:
        return {k: w.value for k, w in self.controls.items()}

    @property
    def caption(self) -> str:
        """The controls as a browser shows them: ``"SRAM M = 227 KiB, N = 65536, ..."``."""
        return ", ".join(f"{w.description} = {shown(w)}" for w in self.controls.values())

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
        self.caption_html.value = f"<small>showing: {self.caption}</small>"
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


def shown(w) -> str:
    """The text a browser shows for control ``w``'s value: a selection's label, a
    checkbox's on/off, else the value."""
    if hasattr(w, "options"):        # the option's label, read from the index the browser
        opt = w.options[w.index]      # syncs (``w.label`` is '' until the index first moves)
        return str(opt[0] if isinstance(opt, tuple) else opt)
    if isinstance(w.value, bool):
        return "on" if w.value else "off"
    return str(w.value)


def on_grid(w, value) -> bool:
    """Whether control ``w`` can hold ``value`` exactly, as a browser would show it: one of
    a selection's options, or a slider value on its min + k step grid within its range."""
    if hasattr(w, "options"):
        opts = [o[1] if isinstance(o, tuple) else o for o in w.options]
        return value in opts
    if isinstance(value, bool) or not hasattr(w, "step"):
        return True
    if hasattr(w, "base"):                       # a log slider: the exponent is on the grid
        x = np.log(value) / np.log(w.base)
        k = (x - w.min) / w.step
        return w.min - 1e-9 <= x <= w.max + 1e-9 and abs(k - round(k)) < 1e-9
    k = (value - w.min) / w.step
    return w.min <= value <= w.max and abs(k - round(k)) < 1e-9


def _w():
    import ipywidgets as W
    return W


def _style():
    return {"description_width": "initial"}


SRAM_SLIDER_WIDTH = "560px"      # 55 steps: a few pixels each, the widest control


def _sram_slider(value: int, description: str = "SRAM M"):
    """Over :func:`sram_options` (16 KiB to 1 MiB, about 2^(1/8) apart, plus the sizes
    cells and presets name), labelled in KiB. Setting a value that is not an option raises
    (traitlets' TraitError) instead of showing a neighbour."""
    W = _w()
    return W.SelectionSlider(options=[(sram_label(m), m) for m in sram_options()],
                             value=int(value), description=description,
                             continuous_update=True, style=_style(),
                             layout=W.Layout(width=SRAM_SLIDER_WIDTH))


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


def warps_panel(block_rows: int = 128, block_cols: int = 64, head_dim: int = 128,
                warps: int = 4) -> Panel:
    """Notebook 05: split-K against split-Q, who owns what and what crosses shared memory."""
    from . import pictures
    W = _w()
    return Panel(warp_partition_view, pictures.WarpsPicture, {
        "block_rows": _pow2_slider((32, 64, 128), block_rows, "B_r"),
        "block_cols": _pow2_slider((32, 64, 128), block_cols, "B_c"),
        "head_dim": _pow2_slider((32, 64, 128), head_dim, "d"),
        "warps": _pow2_slider((1, 2, 4, 8), warps, "warps"),
    }, figsize=(10.0, 4.4))


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
