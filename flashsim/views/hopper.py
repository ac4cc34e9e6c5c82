"""Notebook 09, "After FlashAttention-2": views (plain numbers), pictures (matplotlib, on a
Figure of their own) and panels (ipywidgets) for the units beside the tensor cores, the
schedules of FlashAttention-3, FP8 errors and FlashAttention-4's conditional rescaling.

As in :mod:`flashsim.views.widgets`: each ``*_view`` returns a dict a cell can assert on;
each picture class has ``update(view)``; each ``*_panel`` wires controls whose values lie on
the slider grids. matplotlib and ipywidgets load only when a picture or panel is built.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import numerics
from ..errors import FlashsimError
from ..hardware import schedules
from ..hardware.presets import DEFAULT_GPU, GPUS, gpu as _gpu
from ..plan import plan
from ._text import text_table

HEAD_DIMS = (32, 64, 128, 256)
OUTLIER_FRACTIONS = (0.0, 0.0003, 0.001, 0.003, 0.01)
FP8_BLOCKS = (32, 64, 128, 256)
STREAMS = ("random", "sink", "local", "rising")
THRESHOLDS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)
LANES = ("tensor", "softmax", "memory")
LANE_LABELS = {"tensor": "tensor cores", "softmax": "SFU + fp32 (softmax)",
               "memory": "loads (L2 -> smem)"}


# ================================================================ the units
def unit_table(names=None) -> list[dict]:
    """Per preset: tensor FLOP/s, special-function and fp32 operations per second, and the
    ratio tensor / SFU (how many matmul FLOPs per exponential keep the two balanced)."""
    rows = []
    for key in names or [k for k, g in GPUS.items() if g.tensor_flops_per_clk_sm]:
        g = _gpu(key)
        r = g.unit_rates()
        rows.append({"gpu": key, "name": g.name, "clock_ghz": g.tensor_clock_hz / 1e9,
                     "tensor": r["tensor"], "tensor_fp8": r.get("tensor_fp8"),
                     "sfu": r["sfu"], "fp32": r["fp32"], "hbm": r["hbm"],
                     "flops_per_exp": r["tensor"] / r["sfu"], "source": g.unit_source})
    return rows


def format_unit_table(rows: list[dict]) -> str:
    lines = [f"{'GPU':<26}{'clock':>7}{'tensor fp16':>13}{'fp8':>9}{'SFU (exp)':>11}"
             f"{'fp32 ops':>10}{'FLOPs/exp':>11}",
             f"{'':<26}{'GHz':>7}{'TFLOP/s':>13}{'':>9}{'Tops/s':>11}{'Tops/s':>10}"]
    for r in rows:
        fp8 = f"{r['tensor_fp8'] / 1e12:.0f}" if r["tensor_fp8"] else "-"
        lines.append(f"{r['name']:<26}{r['clock_ghz']:>7.2f}{r['tensor'] / 1e12:>13.1f}"
                     f"{fp8:>9}{r['sfu'] / 1e12:>11.2f}{r['fp32'] / 1e12:>10.1f}"
                     f"{r['flops_per_exp']:>11.0f}")
    return "\n".join(lines)


def sfu_roofline_view(gpu: str = DEFAULT_GPU, seq_len: int = 4096, head_dim: int = 128,
                      dtype: str = "fp16") -> dict:
    """FlashAttention-2's forward on a roofline with a second ceiling: the special-function
    units. With E exponentials and F matmul FLOPs, the exponentials alone bound the matmul
    rate at sfu x F / E (about 4 d x sfu); without overlap the two add up:
    F / (F / tensor + E / sfu)."""
    g = _gpu(gpu)
    r = g.unit_rates()
    tensor = r["tensor_fp8"] if dtype == "fp8" and "tensor_fp8" in r else r["tensor"]
    rep = plan("flash2", seq_len, head_dim, dtype="fp16" if dtype == "fp8" else dtype,
               gpu=gpu).closed_form()
    F, E, B = rep.flops, rep.exp_ops, rep.hbm_bytes * (0.5 if dtype == "fp8" else 1.0)
    sfu_ceiling = r["sfu"] * F / E
    serial = F / (F / tensor + E / r["sfu"])
    intensity = F / B
    return {"gpu": gpu, "gpu_name": g.name, "seq_len": seq_len, "head_dim": head_dim,
            "dtype": dtype, "tensor": tensor, "sfu": r["sfu"], "bandwidth": r["hbm"],
            "flops": F, "exps": E, "intensity": intensity, "sfu_ceiling": sfu_ceiling,
            "serial_ceiling": serial, "exp_time_share": (E / r["sfu"]) / (F / tensor),
            "attainable_overlapped": min(tensor, sfu_ceiling, intensity * r["hbm"]),
            "attainable_serial": min(serial, intensity * r["hbm"])}


# ================================================================ schedules
@functools.lru_cache(maxsize=256)
def _timeline(schedule, loads, head_dim, block_rows, block_cols, kv_blocks, gpu, dtype,
              stages):
    ph = schedules.phases(head_dim, block_rows, block_cols, gpu, dtype)
    return schedules.timeline(ph, kv_blocks, schedule, loads, stages)


def timeline_view(schedule: str = "sequential", head_dim: int = 128, loads: str = "producer",
                  kv_blocks: int = 6, block_rows: int = 128, block_cols: int = 128,
                  gpu: str = "h100", dtype: str = "fp16", stages: int = 2) -> dict:
    """One thread block's tasks (lane, start, end, warp group, block j) under ``schedule``,
    and the steady-state cycles per K/V block of every schedule at this d (from a long
    run, 64 blocks, so the prologue and epilogue do not count)."""
    tl = _timeline(schedule, loads, head_dim, block_rows, block_cols, kv_blocks, gpu, dtype,
                   stages)
    per_block = {}
    for s in schedules.SCHEDULES:
        long = _timeline(s, loads, head_dim, block_rows, block_cols, 64, gpu, dtype, stages)
        short = _timeline(s, loads, head_dim, block_rows, block_cols, 32, gpu, dtype, stages)
        per_block[s] = (long.cycles - short.cycles) / 32
    ph = tl.phases
    tasks = [{"name": t.name, "lane": t.resource, "start": t.start, "end": t.end,
              "unit": t.unit, "block": t.block} for t in tl.tasks]
    return {"schedule": schedule, "loads": loads, "head_dim": head_dim, "gpu": gpu,
            "tasks": tasks, "cycles": tl.cycles, "utilisation": tl.utilisation(),
            "phases": {"gemm0": ph.gemm0, "softmax": ph.softmax, "gemm1": ph.gemm1,
                       "load": ph.load},
            "exp_share": ph.softmax / (ph.gemm0 + ph.gemm1),
            "per_block": per_block, "ideal_per_block": ph.gemm0 + ph.gemm1}


def format_schedules(v: dict) -> str:
    p = v["phases"]
    lines = [f"d = {v['head_dim']} on {v['gpu']}: per K/V block gemm0 {p['gemm0']:.0f}, "
             f"softmax {p['softmax']:.0f}, gemm1 {p['gemm1']:.0f}, loads {p['load']:.0f} "
             f"cycles (softmax / GEMMs = {v['exp_share']:.2f})"]
    for s, c in v["per_block"].items():
        lines.append(f"  {s:<16}{c:>8.0f} cycles per K/V block   tensor cores busy "
                     f"{v['ideal_per_block'] / c:>4.0%}")
    return "\n".join(lines)


# ================================================================ FP8
@functools.lru_cache(maxsize=64)
def fp8_view(outlier_fraction: float = 0.001, block: int = 128, seq_len: int = 512,
             head_dim: int = 64, heads: int = 2, seed: int = 0) -> dict:
    """The error table on a small problem (so a slider answers quickly): RMSE per method
    for this outlier fraction and FP8 block size (B_r = B_c = ``block``)."""
    r = numerics.Recipe(seq_len=seq_len, head_dim=head_dim, heads=heads,
                        outlier_fraction=outlier_fraction, block_rows=block,
                        block_cols=block, seed=seed)
    rows = numerics.error_table(r)
    return {"rows": rows, "outlier_fraction": outlier_fraction, "block": block,
            "seq_len": seq_len, "head_dim": head_dim, "heads": heads}


def format_error_rows(rows: list[dict]) -> str:
    return text_table([("method", "<28", "", lambda r: r["method"]),
                       ("ours", ">10", ".2e", lambda r: r["rmse"]),
                       ("paper", ">10", ".2e", lambda r: r["paper_rmse"]),
                       ("ours/paper", ">12", ".2f", lambda r: r["rmse"] / r["paper_rmse"])],
                      rows)


# ================================================================ conditional rescaling
@functools.lru_cache(maxsize=64)
def rescale_view(stream: str = "local", threshold: float = 8.0, block_cols: int = 128,
                 seed: int = 0) -> dict:
    """A stream of attention-like logits (``numerics.logit_stream``), FlashAttention-4's
    conditional rescaling at ``threshold`` (log2 units): how many rescales it does against
    FlashAttention-2's one per block, and, for the first row, the running max it keeps."""
    rng = np.random.default_rng(seed)
    S = numerics.logit_stream(stream, rng, rows=64, n=4096, d=64)
    V = rng.standard_normal((S.shape[1], 16))
    res = numerics.conditional_rescale(S, V, block_cols, threshold)
    row = S[-1]
    nb = -(-row.size // block_cols)
    blk = np.array([row[k * block_cols:(k + 1) * block_cols].max() for k in range(nb)])
    true = np.maximum.accumulate(blk)
    kept = np.empty(nb)
    m = -np.inf
    for k, b in enumerate(blk):
        if np.isneginf(m) or (not np.isneginf(b) and b - m > threshold):
            m = max(m, b)
        kept[k] = m
    return {"stream": stream, "threshold": threshold, "block_maxima": blk,
            "running_max": true, "kept_max": kept, "decisions": res["decisions"],
            "rescaled": res["rescaled"], "skipped": res["skipped"],
            "largest_p": res["largest_p"], "max_abs_error": res["max_abs_error"]}


# ================================================================ pictures
class SfuRooflinePicture:
    """Roofline (FLOP/s against FLOPs per HBM byte) with the tensor-core peak, the
    special-function ceiling and the no-overlap ceiling; FlashAttention-2 as a point.
    Built once; an update moves the lines and points."""

    def __init__(self, fig):
        from matplotlib.ticker import NullLocator
        ax = self.ax = fig.add_subplot(111)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1, 1e5)
        self.roof, = ax.plot([], [], "k-", lw=2, label="tensor cores, HBM")
        self.sfu, = ax.plot([], [], color="#d62728", ls="--", label="exponentials alone")
        self.serial, = ax.plot([], [], color="#9467bd", ls=":",
                               label="GEMMs, then exponentials")
        self.p_serial, = ax.plot([], [], "o", color="#2ca02c", ms=9,
                                 label="FlashAttention-2, no overlap")
        self.p_over, = ax.plot([], [], "^", color="#2ca02c", ms=9,
                               label="... with the softmax hidden")
        ax.set_xlabel("FLOPs per HBM byte")
        ax.set_ylabel("matmul FLOP/s")
        self.title = ax.set_title("", fontsize=9)
        ax.legend(loc="lower right", fontsize=7)
        ax.xaxis.set_minor_locator(NullLocator())      # minor log ticks cost most of a draw
        ax.yaxis.set_minor_locator(NullLocator())
        fig.subplots_adjust(left=0.12, right=0.97, top=0.86, bottom=0.13)

    def layers(self, v: dict) -> list:
        # the axes move only with the peak (GPU, dtype); d moves the ceilings and points
        return [((v["gpu"], v["dtype"]), [self.ax.yaxis, self.roof]),
                (None, [self.sfu, self.serial, self.p_serial, self.p_over, self.title])]

    def update(self, v: dict) -> None:
        x = np.geomspace(1, 1e5, 64)
        self.roof.set_data(x, np.minimum(v["tensor"], x * v["bandwidth"]))
        self.sfu.set_data([1, 1e5], [v["sfu_ceiling"]] * 2)
        self.serial.set_data([1, 1e5], [v["serial_ceiling"]] * 2)
        self.p_serial.set_data([v["intensity"]], [v["attainable_serial"]])
        self.p_over.set_data([v["intensity"]], [v["attainable_overlapped"]])
        self.ax.set_ylim(v["tensor"] / 100, v["tensor"] * 8)
        self.title.set_text(
            f"{v['gpu_name']}, d = {v['head_dim']}, {v['dtype']}: exponentials take "
            f"{v['exp_time_share']:.0%} of the GEMMs' time\ntensor {v['tensor'] / 1e12:.0f}, "
            f"exponentials alone {v['sfu_ceiling'] / 1e12:.0f}, no overlap "
            f"{v['serial_ceiling'] / 1e12:.0f} TFLOP/s")


class TimelinePicture:
    """A Gantt chart of one thread block: tensor cores, SFU + fp32, loads; colour by warp
    group, shade by K/V block. Built once (one collection of bars, a pool of labels); drawn
    in layers: the frame and the lanes' labels are saved, the cycle axis is redrawn only when
    its limit (the cycles rounded up to a round number) moves."""

    LABELS = 64

    def __init__(self, fig):
        from matplotlib.collections import PolyCollection
        self.fig = fig
        ax = self.ax = fig.add_subplot(111)
        self.bars = PolyCollection([], edgecolor="black", linewidth=0.3)
        ax.add_collection(self.bars)
        self.labels = [ax.text(0, 0, "", ha="center", va="center", fontsize=6, visible=False)
                       for _ in range(self.LABELS)]
        ax.set_yticks(range(len(LANES)), [LANE_LABELS[x] for x in LANES], fontsize=8)
        ax.set_ylim(len(LANES) - 0.5, -0.5)          # lanes top to bottom
        ax.set_xlabel("cycles of one SM")
        self.title = ax.set_title("", fontsize=9)
        fig.subplots_adjust(left=0.2, right=0.98, top=0.88, bottom=0.16)

    @staticmethod
    def _xmax(v: dict) -> float:
        """The cycle axis's end: the run's cycles rounded up to a round number, so most
        moves keep the axis as it is."""
        from .pictures import round_up
        return round_up(max(float(v["cycles"]), 1.0))

    def layers(self, v: dict) -> list:
        return [(self._xmax(v), [self.ax.xaxis]),
                (None, [self.bars, *self.labels, self.title])]

    def update(self, v: dict) -> None:
        from matplotlib import colormaps
        cmap = {0: colormaps["Blues"], 1: colormaps["Oranges"], -1: colormaps["Greys"]}
        last = max(t["block"] for t in v["tasks"]) + 1
        verts, colors, labels = [], [], []
        for t in v["tasks"]:
            y = LANES.index(t["lane"])
            verts.append([(t["start"], y - 0.3), (t["end"], y - 0.3), (t["end"], y + 0.3),
                          (t["start"], y + 0.3)])
            colors.append(cmap[t["unit"]](0.35 + 0.5 * (t["block"] % 4) / 4))
            if t["end"] - t["start"] > v["cycles"] / 60 and t["name"][0] in "gsKV":
                label = t["name"].split(".")[0] + (f"·{t['block']}" if "." in t["name"] else "")
                labels.append(((t["start"] + t["end"]) / 2, y, label))
        self.bars.set_verts(verts)
        self.bars.set_facecolors(colors)
        for k, text in enumerate(self.labels):
            text.set_visible(k < len(labels))
            if k < len(labels):
                text.set_position(labels[k][:2])
                text.set_text(labels[k][2])
        self.ax.set_xlim(0, self._xmax(v))
        u = v["utilisation"]
        self.title.set_text(
            f"{v['schedule']} (loads: {v['loads']}), d = {v['head_dim']}, {last} K/V "
            f"blocks: {v['cycles']:.0f} cycles; tensor cores busy {u['tensor']:.0%}")


class ErrorPicture:
    """RMSE per method (ours as bars, the paper's as marks), log scale. Built on the first
    view (the methods are the bars); an update sets the bars' heights."""

    def __init__(self, fig):
        self.fig = fig
        self.ax = None

    def _build(self, rows: list[dict]) -> None:
        from matplotlib.ticker import NullLocator
        ax = self.ax = self.fig.add_subplot(111)
        x = np.arange(len(rows))
        self.bars = ax.bar(x, [r["paper_rmse"] for r in rows], alpha=0.8,
                           color=["#1f77b4"] * 3 + ["#d62728"] * (len(rows) - 3),
                           label="ours (emulated)")
        self.paper, = ax.plot(x, [r["paper_rmse"] for r in rows], "k_", ms=18, mew=2,
                              label="paper (N(0,1) + 0.1% outliers)")
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xticks(x, [r["method"].replace(" ", "\n", 1) for r in rows], fontsize=7)
        ax.set_ylabel("RMSE of O")
        self.title = ax.set_title("", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        self.fig.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.2)

    @staticmethod
    def _decades(rows: list[dict]) -> tuple[float, float]:
        """y limits on whole decades around every bar and mark, so they rarely move."""
        ys = [y for r in rows for y in (r["rmse"], r["paper_rmse"]) if y > 0]
        return 10.0 ** np.floor(np.log10(min(ys))), 10.0 ** (np.ceil(np.log10(max(ys))) + 1)

    def layers(self, v: dict) -> list:
        return [(self._decades(v["rows"]), [self.ax.yaxis]),
                (None, [*self.bars.patches, self.paper, self.title])]

    def update(self, v: dict) -> None:
        rows = v["rows"]
        if self.ax is None:
            self._build(rows)
        for bar, r in zip(self.bars.patches, rows):
            bar.set_height(r["rmse"])
        self.ax.set_ylim(*self._decades(rows))
        self.title.set_text(f"outlier fraction {v['outlier_fraction']:g}, FP8 blocks of "
                            f"{v['block']} rows, N = {v['seq_len']}, d = {v['head_dim']}")


class RescalePicture:
    """Block maxima of one row, the true running max and the stale max FlashAttention-4
    keeps (it moves only when the max grows by more than the threshold). Built once; the
    stream sets the axes, the threshold moves only the kept max."""

    def __init__(self, fig):
        ax = self.ax = fig.add_subplot(111)
        self.maxima, = ax.plot([], [], ".", color="gray", label="max of block j")
        self.running, = ax.step([], [], where="post", color="#1f77b4",
                                label="running max (FlashAttention-2 rescales at every block)")
        self.kept, = ax.step([], [], where="post", color="#d62728",
                             label="max kept (moves when it falls behind by > threshold)")
        ax.set_xlabel("K/V block j")
        ax.set_ylabel("logit (log2 units)")
        self.title = ax.set_title("", fontsize=9)
        self.legend = ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.13)

    def layers(self, v: dict) -> list:
        # the legend is drawn last, over the data, as a one-pass draw would
        return [(v["stream"], [self.ax.xaxis, self.ax.yaxis, self.maxima, self.running]),
                (None, [self.kept, self.title, self.legend])]

    def update(self, v: dict) -> None:
        k = np.arange(len(v["block_maxima"]))
        self.maxima.set_data(k, v["block_maxima"])
        self.running.set_data(k, v["running_max"])
        self.kept.set_data(k, v["kept_max"])
        self.ax.relim()
        self.ax.autoscale_view()
        self.title.set_text(
            f"{v['stream']} logits, threshold {v['threshold']:g}: {v['rescaled']} rescales of "
            f"{v['decisions']} (skipped {v['skipped'] / max(v['decisions'], 1):.1%}); "
            f"largest P~ = {v['largest_p']:.3g}")


# ================================================================ panels
def _panel(compute, picture, controls, figsize):
    from .widgets import Panel
    return Panel(compute, picture, controls, figsize=figsize)


def _select(options, value, description):
    import ipywidgets as W
    if value not in options:
        raise FlashsimError(f"{description} {value!r} is not on the slider: {options}")
    return W.SelectionSlider(options=list(options), value=value, description=description,
                             continuous_update=False, style={"description_width": "initial"})


def _dropdown(options, value, description):
    import ipywidgets as W
    return W.Dropdown(options=list(options), value=value, description=description)


def sfu_roofline_panel(gpu: str = "h100", head_dim: int = 128, seq_len: int = 4096):
    return _panel(functools.partial(sfu_roofline_view, seq_len=seq_len), SfuRooflinePicture, {
        "gpu": _dropdown([k for k, g in GPUS.items() if g.tensor_flops_per_clk_sm], gpu, "GPU"),
        "head_dim": _select(HEAD_DIMS, head_dim, "d"),
        "dtype": _dropdown(("fp16", "fp8"), "fp16", "dtype"),
    }, (8.0, 4.2))


def timeline_panel(schedule: str = "sequential", head_dim: int = 128,
                   loads: str = "producer"):
    for d in _neighbours(HEAD_DIMS, head_dim):      # a first step of d answers at once
        timeline_view(schedule=schedule, head_dim=d, loads=loads)
    return _panel(timeline_view, TimelinePicture, {
        "schedule": _dropdown(schedules.SCHEDULES, schedule, "schedule"),
        "head_dim": _select(HEAD_DIMS, head_dim, "d"),
        "loads": _dropdown(schedules.LOADS, loads, "loads"),
    }, (10.0, 3.4))


def _neighbours(options, value) -> list:
    i = list(options).index(value)
    return [options[j] for j in (i - 1, i + 1) if 0 <= j < len(options)]


def fp8_panel(outlier_fraction: float = 0.001, block: int = 128):
    """The error table takes most of a second per point: the points one slider step from
    the start are computed (cached) before the panel shows, so a first move answers at once."""
    for f in _neighbours(OUTLIER_FRACTIONS, outlier_fraction):   # as the panel calls it:
        fp8_view(outlier_fraction=f, block=block)                # lru_cache keys on keywords
    for b in _neighbours(FP8_BLOCKS, block):
        fp8_view(outlier_fraction=outlier_fraction, block=b)
    return _panel(fp8_view, ErrorPicture, {
        "outlier_fraction": _select(OUTLIER_FRACTIONS, outlier_fraction, "outlier fraction"),
        "block": _select(FP8_BLOCKS, block, "FP8 block rows"),
    }, (9.0, 4.0))


def rescale_panel(stream: str = "local", threshold: float = 8.0):
    return _panel(rescale_view, RescalePicture, {
        "stream": _dropdown(STREAMS, stream, "logits"),
        "threshold": _select(THRESHOLDS, threshold, "threshold"),
    }, (9.0, 3.8))
