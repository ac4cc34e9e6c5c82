"""Pictures for the notebooks (matplotlib, imported lazily: ``import flashsim`` stays light).

Each picture is a class built once on a matplotlib Figure and redrawn by ``update(view)``
from a view dict of :mod:`flashsim.views.widgets`. Artists are created once and only their data
change, so a slider's redraw stays fast (a fresh Axes costs tens of milliseconds).

    fig = flashsim.views.pictures.figure((9, 4.6))
    flashsim.views.pictures.SramPicture(fig).update(flashsim.views.widgets.sram_view(seq_len=4096))
    fig.savefig("sram.png")

:func:`draw` does the three lines at once; ``docs/make_figures.py`` uses it for the README.
"""

from __future__ import annotations

import functools

import numpy as np

from ..units import format_bytes

COLORS = {"standard": "#d62728", "flash1": "#1f77b4", "flash2": "#2ca02c"}
LABELS = {"standard": "standard attention", "flash1": "FlashAttention (Alg. 1)",
          "flash2": "FlashAttention-2"}


def figure(figsize=(9.0, 4.0), dpi: int = 80):
    """A Figure on the Agg canvas, independent of pyplot (no global state, no display); its
    renderer keeps the text it rasterized (:func:`_text_cache_canvas`)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, dpi=dpi)
    _text_cache_canvas()(fig)
    return fig


TEXT_CACHE_LINES = 4096      # about 2 KB a line: a few MB at most


@functools.cache
def _text_cache_canvas():
    """FigureCanvasAgg whose renderer keeps each line of text it rasterized.

    matplotlib 3.11's Agg lays out and rasterizes every glyph of every label on every draw
    (some 60 us a glyph): half of a panel's redraw, though most labels (tick labels, the
    unchanged lines of a readout) are drawn again with the same text at the same place. A
    line is kept as one coverage bitmap under (text, font, sub-pixel offset, hinting), and
    drawn again from it at any whole-pixel shift: the bitmap FreeType renders depends only on
    the offset's fraction. Overlapping glyphs' coverage is combined as two draws of one
    colour combine (1 - (1 - a)(1 - b)), equal to drawing them one by one up to rounding.
    Where matplotlib draws lines otherwise (before 3.11), or for mathtext and rotated text,
    the stock renderer draws."""
    import collections
    import math

    from matplotlib.backends import backend_agg as agg
    from matplotlib.font_manager import fontManager
    from matplotlib import ft2font

    stock = agg.FigureCanvasAgg
    if not (hasattr(agg.RendererAgg, "_draw_text_glyphs_and_boxes")       # what 3.11 has
            and all(hasattr(ft2font.FT2Font, a) for a in ("_layout", "_set_transform",
                                                          "_render_glyph"))):
        return stock
    RenderMode = ft2font.RenderMode
    cache: collections.OrderedDict = collections.OrderedDict()
    identity = np.array([[0x10000, 0], [0, 0x10000]])

    class Renderer(agg.RendererAgg):
        def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
            features, language = ((None, None) if mtext is None else    # a multi-line text
                                  (mtext.get_fontfeatures(), mtext.get_language()))
            if ismath or angle % 360 or not isinstance(language, (str, type(None))):
                return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
            X, Y = x, self.height - y                    # FreeType's y is upwards
            ix, iy = math.floor(X), math.floor(Y)
            flags = agg.get_hinting_flag()
            # the font files too: which ones a FontProperties means follows rcParams
            key = (s, hash(prop), tuple(fontManager._find_fonts_by_props(prop)), self.dpi, flags,
                   gc.get_antialiased(), X - ix, Y - iy,
                   None if features is None else tuple(features), language)
            line = cache.get(key)
            if line is None:
                line = self._rasterize(s, prop, X, Y, ix, iy, flags, features, language,
                                       gc.get_antialiased())
                cache[key] = line
                if len(cache) > TEXT_CACHE_LINES:
                    cache.popitem(last=False)
            else:
                cache.move_to_end(key)
            if line is not None:
                image, left, top = line
                # draw_text_image's y is downwards and the bitmap's bottom side
                self._renderer.draw_text_image(image, left + ix,
                                               int(self.height) - (top + iy) + image.shape[0], 0, gc)

        def _rasterize(self, s, prop, X, Y, ix, iy, flags, features, language, aa):
            """(coverage, left, top) of line ``s`` at (X, Y), offsets from (ix, iy); as
            RendererAgg.draw_text and _draw_text_glyphs_and_boxes do it at angle 0."""
            font = self._prepare_font(prop)
            size = prop.get_size_in_points()
            glyphs = []
            for item in font._layout(s, flags=flags, features=features, language=language):
                f = item.ft_object
                f.set_size(size, self.dpi)
                f._set_transform(identity, [round(0x40 * (X + item.x)), round(0x40 * (Y + item.y))])
                bitmap = f._render_glyph(item.glyph_index, flags,
                                         RenderMode.NORMAL if aa else RenderMode.MONO)
                buffer = np.array(bitmap.buffer, dtype=np.uint8)
                if not aa:
                    buffer *= 0xff
                if buffer.size:
                    glyphs.append((buffer, bitmap.left - ix, bitmap.top - iy))
            if not glyphs:
                return None
            left = min(g[1] for g in glyphs)
            top = max(g[2] for g in glyphs)
            width = max(g[1] + g[0].shape[1] for g in glyphs) - left
            height = top - min(g[2] - g[0].shape[0] for g in glyphs)
            image = np.zeros((height, width), dtype=np.uint16)
            for buffer, gl, gt in glyphs:
                r, c = top - gt, gl - left
                part = image[r:r + buffer.shape[0], c:c + buffer.shape[1]]
                part[...] = 255 - ((255 - part) * (255 - buffer.astype(np.uint16)) + 127) // 255
            return image.astype(np.uint8), left, top

    class Canvas(stock):
        text_cache = cache

        def get_renderer(self):
            w, h = self.get_width_height(physical=True)
            key = w, h, self.figure.dpi
            if self._lastKey != key:
                self.renderer = Renderer(w, h, self.figure.dpi)
                self._lastKey = key
            return self.renderer

    return Canvas


def draw(picture, view: dict, figsize=(9.0, 4.0), dpi: int = 80):
    """A new figure with ``picture`` (a class of this module) drawn from ``view``."""
    fig = figure(figsize, dpi)
    picture(fig).update(view)
    return fig


class LayeredRenderer:
    """Redraw a figure in layers, so a slider re-renders only what it changed (blitting).

    A picture may define ``layers(view) -> [(key, [artist, ...]), ...]``, back to front,
    and ``base_key(view)``. Everything not in a layer is the base. A layer whose key equals
    the one drawn last time is restored from a saved copy of the canvas instead of being
    drawn again; a key of None means "always redraw" (and so does every layer after a
    changed one). Text is what costs: with matplotlib 3.11 a label takes a millisecond or
    more, so the axes' tick labels and legends stay in the saved copies."""

    def __init__(self, fig):
        self.fig = fig
        self.keys: list | None = None
        self.saved: list = []

    def render(self, picture, view: dict) -> None:
        canvas = self.fig.canvas
        layers = list(getattr(picture, "layers", lambda v: [])(view))
        keys = [getattr(picture, "base_key", lambda v: 0)(view)] + [k for k, _ in layers]
        for _, artists in layers:
            for a in artists:
                a.set_animated(True)               # left out of canvas.draw()
        start = 0
        if self.keys is not None and len(self.keys) == len(keys):
            while start < len(keys) and keys[start] is not None and keys[start] == self.keys[start]:
                start += 1
        start = min(start, len(keys) - 1)          # the top layer is always drawn
        if start == 0:
            canvas.draw()
            self.saved = [canvas.copy_from_bbox(self.fig.bbox)]
        else:
            canvas.restore_region(self.saved[start - 1])
            del self.saved[start:]
        for level in range(max(start, 1), len(keys)):
            for a in layers[level - 1][1]:
                self.fig.draw_artist(a)
            if level < len(keys) - 1:
                self.saved.append(canvas.copy_from_bbox(self.fig.bbox))
        self.keys = keys

    def png(self) -> bytes:
        """The canvas as PNG bytes (fast zlib level: these images live for a moment)."""
        import io

        from PIL import Image
        canvas = self.fig.canvas
        w, h = canvas.get_width_height(physical=True)
        img = Image.frombuffer("RGBA", (w, h), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        img = img.convert("RGB")         # the figure is opaque: a quarter less to compress
        buf = io.BytesIO()
        img.save(buf, format="png", compress_level=1)
        return buf.getvalue()


def png(fig, dpi: int | None = None) -> bytes:
    """The figure as PNG bytes (a full draw)."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()


def show(fig):
    """Something a notebook cell displays: the figure as an IPython PNG image (works with
    any matplotlib backend, and headless)."""
    from IPython.display import Image
    return Image(data=png(fig))


def bytes_label(x: float) -> str:
    """``3 * 2**30`` -> ``3 GiB``; three significant digits at most."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} B"


def _log2_bytes_axis(axis, numticks: int = 8) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    axis.set_major_locator(LogLocator(base=2, subs=(1.0,), numticks=numticks))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda x, _: bytes_label(x)))


def _pow2_axis(axis, values) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    axis.set_major_locator(FixedLocator(list(values)))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{int(x):,}" if x < 2**10 else
                                           f"{int(x) // 2**10}K"))


def _nice_step(span: float, ticks: int = 5) -> float:
    """A power of two times 1 or 1.5... simply: the power of two nearest span / ticks, so
    byte axes read 256 KiB, 512 KiB, ... rather than 97.7 KiB."""
    return float(2 ** round(np.log2(max(span, 1) / ticks)))


def round_up(x: float) -> float:
    """``x`` rounded up to a round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k): an axis
    limit that most slider moves leave as it is, so a layered picture keeps its axis."""
    x = max(float(x), 1e-300)
    k = 10.0 ** np.floor(np.log10(x))
    return next(m * k for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * k >= x * (1 - 1e-12))


def decades(lo: float, hi: float) -> tuple[float, float]:
    """Log-axis limits on whole decades around [lo, hi] (both > 0)."""
    return 10.0 ** np.floor(np.log10(lo)), 10.0 ** np.ceil(np.log10(hi))


def _log_limits(values, pad: float = 1.6) -> tuple[float, float]:
    v = np.concatenate([np.ravel(np.asarray(a, float)) for a in values])
    v = v[v > 0]
    return v.min() / pad, v.max() * pad


# ===================================================================== 01 memory

def memory_hierarchy(rows: list[dict], figsize=(10.0, 4.4), dpi: int = 80):
    """Two bar charts (log scale): capacity of registers, shared memory, L2 and HBM, and
    bandwidth of shared memory and HBM, per GPU preset (on-chip levels summed over the
    SMs). ``rows`` from :func:`flashsim.views.widgets.memory_table`. Returns the figure."""
    fig = figure(figsize, dpi)
    ax1, ax2 = fig.subplots(1, 2)
    y = np.arange(len(rows))
    for ax, pairs, title in (
            (ax1, (("registers_total", "registers (all SMs)"),
                   ("sram_total", "shared memory M x SMs"), ("l2_bytes", "L2"),
                   ("hbm_capacity", "HBM")), "capacity (bytes)"),
            (ax2, (("sram_bandwidth", "SRAM"), ("hbm_bandwidth", "HBM")),
             "bandwidth (bytes/s)")):
        h = 0.8 / len(pairs)
        for k, (key, label) in enumerate(pairs):
            vals = [r[key] for r in rows]
            ax.barh(y + (k - (len(pairs) - 1) / 2) * h, vals, height=h, label=label)
            for yy, v in zip(y + (k - (len(pairs) - 1) / 2) * h, vals):
                text = (bytes_label(v) if key != "hbm_capacity" else f"{v / 1e9:.0f} GB") \
                    if "bandwidth" not in key else f"{v / 1e12:.1f} TB/s"
                ax.text(v * 1.1, yy, text, va="center", fontsize=7)
        ax.set_xscale("log")
        ax.set_yticks(y, [r["gpu"] for r in rows])
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
        ax.set_xlim(right=ax.get_xlim()[1] * 20)
    fig.tight_layout()
    return fig


class RooflinePicture:
    """Attainable FLOP/s against arithmetic intensity; the three algorithms as points."""

    def __init__(self, fig):
        from matplotlib.ticker import FuncFormatter, NullLocator
        self.ax = ax = fig.add_subplot(111)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e12:g} TFLOP/s"))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlim(1, 1e4)
        ax.set_xlabel("I = FLOPs per byte: filled, requested from below SRAM; open, DRAM")
        ax.set_ylabel("attainable FLOP/s")
        self.roof, = ax.plot([], [], color="black", lw=2)
        self.ridge = ax.axvline(1.0, color="gray", ls=":")
        self.points = {a: ax.plot([], [], "o", ms=9, color=c, label=LABELS[a])[0]
                       for a, c in COLORS.items()}
        self.dram = {a: ax.plot([], [], "o", ms=9, mfc="none", mew=1.5, color=c)[0]
                     for a, c in COLORS.items()}
        offsets = {"standard": (8, -4), "flash1": (-10, 10), "flash2": (8, -16)}
        self.notes = {a: ax.annotate("", (1, 1), xytext=offsets[a], textcoords="offset points",
                                     fontsize=8, color=COLORS[a],
                                     ha="right" if a == "flash1" else "left")
                      for a in COLORS}
        self.title = ax.set_title("", fontsize=9)
        ax.legend(loc="lower right", fontsize=8)
        fig.subplots_adjust(left=0.16, right=0.97, top=0.91, bottom=0.12)

    def layers(self, v: dict) -> list:
        return [((v["gpu"], v["dtype"]), [self.ax.yaxis, self.roof, self.ridge]),
                (None, [*self.points.values(), *self.dram.values(), *self.notes.values(),
                        self.title])]

    def update(self, v: dict) -> None:
        I = np.geomspace(1, 1e4, 64)
        self.roof.set_data(I, np.minimum(v["peak"], I * v["bandwidth"]))
        self.ridge.set_xdata([v["ridge"], v["ridge"]])
        self.ax.set_ylim(v["peak"] / 2000, v["peak"] * 3)
        for alg, a in v["algs"].items():
            self.points[alg].set_data([a["intensity"]], [a["attainable"]])
            self.notes[alg].xy = (a["intensity"], a["attainable"])
            di = a.get("dram_intensity")
            self.dram[alg].set_data(([di], [a["dram_attainable"]]) if di else ([], []))
            self.notes[alg].set_text(f"I = {a['intensity']:.0f}, {a['bound']}-bound"
                                     + (f"; DRAM: {di:.0f}" if di else ""))
        dram = ("open circles: DRAM bytes (L2 model)" if v["seq_len"] <= v["dram_max_n"]
                else f"DRAM bytes drawn for N <= {v['dram_max_n']}")
        self.title.set_text(f"{v['gpu_name']}, {v['dtype']}, N = {v['seq_len']}, "
                            f"d = {v['head_dim']}: min(peak, I x bandwidth), ridge at "
                            f"{v['ridge']:.0f} FLOP/byte\n{dram}")


# ===================================================================== 02 standard

SEGMENTS = (("Q, K, V, O, L", "#7f7f7f"), ("S", "#ff9896"), ("S_scaled", "#c49c94"),
            ("S_masked", "#f7b6d2"), ("P", "#d62728"))


class StandardTrafficPicture:
    """Left: standard attention's HBM bytes by tensor, as shares of its total (stacked),
    beside FlashAttention-2's total on the same scale. Right: total traffic against N,
    log-log, with the compulsory floor. Moving N redraws only the bars and the marks."""

    def __init__(self, fig):
        from matplotlib.ticker import PercentFormatter
        self.ax, self.ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
        ax = self.ax
        self.bars = {name: ax.barh([1, 0], [0, 0], color=c, label=name, height=0.6)
                     for name, c in SEGMENTS}
        ax.set_yticks([1, 0], ["standard", "flash2"])
        ax.set_ylim(-0.6, 2.1)
        ax.set_xlim(0, 1.5)
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel("share of standard attention's HBM bytes")
        ax.legend(loc="upper center", fontsize=7, ncol=5, handlelength=1, columnspacing=0.8)
        self.totals = [ax.text(0, y, "", va="center", fontsize=8) for y in (1, 0)]
        self.title = ax.set_title("", fontsize=9)
        ax2 = self.ax2
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        self.lines = {"standard": ax2.plot([], [], color=COLORS["standard"],
                                           label="standard")[0],
                      "flash2": ax2.plot([], [], color=COLORS["flash2"], label="flash2")[0],
                      "floor": ax2.plot([], [], "k:", label="floor 4Nd·b")[0]}
        self.marks = ax2.plot([], [], "o", color="black", ms=5)[0]
        self.now = ax2.axvline(1, color="gray", lw=0.8)
        _pow2_axis(ax2.xaxis, [2**k for k in range(8, 17, 2)])
        _log2_bytes_axis(ax2.yaxis)
        ax2.set_xlabel("sequence length N")
        ax2.set_title("HBM bytes against N (one head)", fontsize=9)
        ax2.legend(loc="upper left", fontsize=8)
        fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.13, wspace=0.25)

    def layers(self, v: dict) -> list:
        return [((v["head_dim"], v["dtype"], v["passes"]),
                 [self.ax2.yaxis, *self.lines.values()]),
                (None, [*(r for b in self.bars.values() for r in b.patches), *self.totals,
                        self.title, self.marks, self.now])]

    def update(self, v: dict) -> None:
        t, total = v["per_tensor"], v["hbm_bytes"]
        rw = {k: x["read_bytes"] + x["write_bytes"] for k, x in t.items()}
        seg_std = {"Q, K, V, O, L": sum(rw.get(k, 0) for k in "QKVO"),
                   **{k: rw.get(k, 0) for k in ("S", "S_scaled", "S_masked", "P")}}
        left = 0.0
        for name, _ in SEGMENTS:
            rect_std, rect_f2 = self.bars[name].patches
            rect_std.set_x(left)
            rect_std.set_width(seg_std[name] / total)
            rect_f2.set_width(v["flash2_bytes"] / total if name == "Q, K, V, O, L" else 0)
            left += seg_std[name] / total
        self.totals[0].set_position((1.02, 1))
        self.totals[0].set_text(f"{bytes_label(total)}\nN x N: {v['square_passes']:.0f} passes")
        self.totals[1].set_position((v["flash2_bytes"] / total + 0.02, 0))
        self.totals[1].set_text(f"{bytes_label(v['flash2_bytes'])} ({v['ratio']:.1f}x less)")
        passes = "+".join(v["passes"]) or "no extra passes"
        self.title.set_text(f"N = {v['seq_len']}, d = {v['head_dim']}, {v['dtype']}, "
                            f"{passes}: HBM bytes by tensor")
        c = v["curve"]
        for k in ("standard", "flash2", "floor"):
            self.lines[k].set_data(c["seq_len"], c[k])
        n = v["seq_len"]
        self.now.set_xdata([n, n])
        self.marks.set_data([n, n], [total, v["flash2_bytes"]])
        self.ax2.set_xlim(c["seq_len"][0] / 1.3, c["seq_len"][-1] * 1.3)
        self.ax2.set_ylim(*_log_limits([c["floor"], c["standard"]]))


# ===================================================================== 03 online softmax

class OnlineSoftmaxPicture:
    """Top: the logits x_j, the current block shaded, m_old and m_new as lines. Bottom:
    softmax of the prefix seen so far (bars) against the final softmax (ticks). Right: m,
    l and alpha as numbers."""

    def __init__(self, fig):
        self.fig = fig
        self.n = 0

    def _build(self, n: int) -> None:
        """Artists for up to ``n`` elements; a shorter input hides the rest (no rebuild)."""
        from matplotlib.patches import Rectangle
        fig = self.fig
        fig.clear()
        gs = fig.add_gridspec(2, 2, width_ratios=[3, 1.3], hspace=0.35, left=0.11,
                              right=0.98, top=0.93, bottom=0.1, wspace=0.08)
        self.ax = ax = fig.add_subplot(gs[0, 0])
        self.ax2 = ax2 = fig.add_subplot(gs[1, 0], sharex=ax)
        tax = fig.add_subplot(gs[:, 1])
        tax.axis("off")
        j = np.arange(n)
        self.span = Rectangle((0, 0), 1, 1, transform=ax.get_xaxis_transform(),
                              color="#ffe0b2", zorder=0)
        ax.add_patch(self.span)
        self.dots = ax.scatter(j, np.zeros(n), s=22, zorder=3)
        self.m_old = ax.axhline(0, color="#ff7f0e", ls="--", lw=1.2)
        self.m_new = ax.axhline(0, color="#d62728", lw=1.2)
        # m_old at the left end, m_new at the right: apart even when the two are equal
        self.m_old_label = ax.text(-0.5, 0, "m_old", color="#ff7f0e", ha="left",
                                   va="top", fontsize=8)
        self.m_new_label = ax.text(n - 0.5, 0, "m_new", color="#d62728", ha="right",
                                   va="bottom", fontsize=8)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.tick_params(labelbottom=False)     # the axes below share x and label it
        ax.set_ylabel("logit x_j")
        self.title = ax.set_title("", fontsize=9)
        self.bars = ax2.bar(j, np.zeros(n), width=0.8, color="#1f77b4")
        self.final, = ax2.plot(j, np.zeros(n), "_", color="black", ms=9, mew=2)
        ax2.set_xlim(-0.7, n - 0.3)
        ax2.set_xlabel("element j")
        ax2.set_ylabel("y_j")
        tax.text(0.0, 0.0, "top: orange = this block,\n     blue = seen, grey = not yet\n"
                           "bottom: bars = softmax of the\n  prefix seen so far; black\n"
                           "  ticks = softmax(x), the answer", va="bottom", fontsize=8,
                 transform=tax.transAxes)
        self.text = tax.text(0.0, 1.0, "", va="top", family="monospace", fontsize=8.5,
                             transform=tax.transAxes)
        self.n = n

    def base_key(self, v: dict):
        return id(self.ax)                     # new axes only past 64 elements

    def layers(self, v: dict) -> list:
        return [((v["example"], len(v["x"]), v["block"]),
                 [self.ax.xaxis, self.ax.yaxis, self.ax2.xaxis, self.ax2.yaxis, self.final]),
                (None, [self.span, self.dots, self.m_old, self.m_new, self.m_old_label,
                        self.m_new_label, *self.bars, self.title, self.text])]

    def update(self, v: dict) -> None:
        x = v["x"]
        n = len(x)
        if n > self.n:
            self._build(max(n, 64))
        lo, hi = v["lo"], v["hi"]
        colors = np.array(["#1f77b4"] * hi + ["#c7c7c7"] * (n - hi), dtype=object)
        colors[lo:hi] = "#ff7f0e"
        self.dots.set_offsets(np.column_stack([np.arange(n), x]))
        self.dots.set_facecolors(list(colors))
        self.ax2.set_xlim(-0.7, n - 0.3)
        self.m_new_label.set_x(n - 0.5)
        self.span.set_x(lo - 0.5)
        self.span.set_width(hi - lo)
        for line, label, m in ((self.m_old, self.m_old_label, v["m_old"]),
                               (self.m_new, self.m_new_label, v["m_new"])):
            line.set_visible(np.isfinite(m))
            label.set_visible(np.isfinite(m))
            if np.isfinite(m):
                line.set_ydata([m, m])
                label.set_y(m)
        pad = max(0.5, 0.08 * (x.max() - x.min()))
        self.ax.set_ylim(x.min() - pad, x.max() + 2.5 * pad)
        y = np.zeros(len(self.bars))
        y[:hi] = v["y"]
        for k, (bar, h) in enumerate(zip(self.bars, y)):
            bar.set_height(h)
            bar.set_visible(k < n)
            bar.set_color("#ff7f0e" if lo <= k < hi else "#1f77b4")
        self.final.set_data(np.arange(n), v["softmax"])
        self.ax2.set_ylim(0, 1.15 * max(v["y_top"], v["softmax"].max()))
        last = " (the last)" if v["k"] == v["steps"] - 1 else ""
        self.title.set_text(f"{v['example']}: step {v['k']}: block {v['k'] + 1} of "
                            f"{v['steps']}{last} (x[{lo}:{hi}]), block size {v['block']}")
        if not np.isfinite(v["m_old"]):
            rose = "first block: nothing to rescale"
        elif v["m_new"] > v["m_old"]:
            rose = "the max rose: old state rescaled"
        else:
            rose = "the max did not change: alpha = 1"
        lines = [
            f"m_old = {v['m_old']:.6g}",
            f"m_new = max(m_old, max x[{lo}:{hi}])",
            f"      = {v['m_new']:.6g}",
            "alpha = e^(m_old - m_new)",
            f"      = {v['alpha']:.6g}",
            rose, "",
            f"l_old = {v['l_old']:.6g}",
            "l = alpha l_old + sum e^(x-m_new)",
            f"  = {v['l']:.6g}", "",
            f"o / l = softmax(x[:{hi}]) . v[:{hi}]",
            f"      = {v['output']:.6g}",
        ]
        if hi == n:
            err = np.abs(v["y"] - v["softmax"]).max()
            lines += ["", "last step:", f"max |y - softmax(x)| = {err:.1e}"]
        self.text.set_text("\n".join(lines))


# ===================================================================== 04 SRAM and tiles

class SramPicture:
    """Bytes requested from the level below SRAM against the SRAM size M (log-log) for the
    three algorithms (solid), Theorem 2's c N^2 d^2 / M and the compulsory floor; dashed
    with open markers, what the L2 model sends to DRAM for the same plans (N small enough);
    the current M marked, block sizes noted."""

    def __init__(self, fig):
        from matplotlib.ticker import FuncFormatter
        self.ax = ax = fig.add_subplot(111)
        ax.set_xscale("log")
        ax.set_yscale("log")
        self.lines = {a: ax.plot([], [], color=c, lw=2, label=LABELS[a])[0]
                      for a, c in COLORS.items()}
        self.theorem = ax.plot([], [], color=COLORS["flash1"], ls="--", lw=1,
                               label="Theorem 2: c N²d²/M")[0]
        self.floor = ax.axhline(1, color="black", ls=":", lw=1.2,
                                label="floor: Q, K, V read, O written once")
        self.now = ax.axvline(1, color="gray", lw=1)
        self.marks = {a: ax.plot([], [], "o", color=c, ms=7)[0] for a, c in COLORS.items()}
        self.dram = {a: ax.plot([], [], "--", marker="o", mfc="none", color=c, lw=1.2, ms=5)[0]
                     for a, c in COLORS.items()}
        self.dram["flash2"].set_label("dashed, open: DRAM bytes (L2 model)")
        for alg in COLORS:
            self.lines[alg].set_label(LABELS[alg] + ", requested")
        _pow2_axis(ax.xaxis, [2**k for k in range(14, 21)])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: bytes_label(x)))
        _log2_bytes_axis(ax.yaxis)
        ax.set_xlim(2**14 / 1.15, 2**20 * 1.15)
        ax.set_xlabel("SRAM per thread block, M")
        ax.set_ylabel("bytes read + written")
        ax.grid(True, alpha=0.25)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
        self.title = ax.set_title("", fontsize=10)
        self.note = fig.text(0.695, 0.52, "", ha="left", va="top", family="monospace",
                             fontsize=8)
        fig.subplots_adjust(left=0.1, right=0.68, top=0.91, bottom=0.12)

    def layers(self, v: dict) -> list:
        return [((v["seq_len"], v["head_dim"], v["dtype"], v["causal"]),
                 [self.ax.yaxis, *self.lines.values(), *self.dram.values(), self.theorem,
                  self.floor, self.title]),
                (None, [self.now, *self.marks.values(), self.note])]

    def update(self, v: dict) -> None:
        sizes = v["sizes"]
        for alg, line in self.lines.items():
            line.set_data(sizes, v["curves"][alg])
            self.marks[alg].set_data([v["sram"]], [v["bytes"][alg]])
        self.theorem.set_data(sizes, v["theorem2"])
        self.floor.set_ydata([v["floor"], v["floor"]])
        self.now.set_xdata([v["sram"], v["sram"]])
        dram = v.get("dram")
        for alg, line in self.dram.items():
            line.set_data((v["dram_sizes"], dram[alg]) if dram is not None else ([], []))
        self.ax.set_ylim(*_log_limits([v["floor"], *v["curves"].values()], pad=1.4))
        self.title.set_text(f"N = {v['seq_len']}, d = {v['head_dim']}, {v['dtype']}"
                            f"{', causal' if v['causal'] else ''}, one head: "
                            f"bytes against SRAM size")
        lines = [f"M = {bytes_label(v['sram'])} = {v['sram']:,} B", "requested from below:"]
        for alg in COLORS:
            br, bc = v["blocks"][alg]
            lines.append(f"{alg:<8}  B_r={br:<4} B_c={bc}")
            lines.append(f"{'':8}  {bytes_label(v['bytes'][alg])}")
        lines += ["", f"floor     {bytes_label(v['floor'])}",
                  f"Theorem 2 c = {v['c']:.3g} (fitted)", ""]
        if dram is None:
            lines += ["DRAM (L2 model): drawn", f"for N <= {v['dram_max_n']}"]
        else:
            lines += [f"DRAM: {bytes_label(v['l2_bytes'])} L2,", "H200 preset's SMs"]
        self.note.set_text("\n".join(lines))


TILE_COLORS = ("#ffffff", "#9ecae1", "#ff7f0e", "#d9d9d9",      # even (i + j)
               "#f0f0f0", "#7fb4d8", "#e6550d", "#c6c6c6")      # odd: a checkerboard


class TilePicture:
    """The score matrix S cut into B_r x B_c tiles: done, current, not yet, and skipped
    (fully masked) tiles; beside it Q, K, V and O with the rows that are in SRAM now."""

    def __init__(self, fig):
        from matplotlib.colors import ListedColormap
        gs = fig.add_gridspec(1, 5, width_ratios=[7, 0.6, 0.6, 0.6, 0.6], wspace=0.25,
                              bottom=0.26, top=0.86, left=0.08, right=0.97)
        self.ax = ax = fig.add_subplot(gs[0])
        self.grid = ax.imshow(np.zeros((1, 1)), cmap=ListedColormap(TILE_COLORS), vmin=0,
                              vmax=7, interpolation="nearest", extent=(0, 1, 1, 0),
                              aspect="equal")
        ax.set_xlabel("keys: columns of S = rows of K, V")
        ax.set_ylabel("queries: rows of S = rows of Q, O")
        self.title = fig.text(0.08, 0.985, "", va="top", fontsize=9)
        self.strips = {}
        strip_cmap = ListedColormap(["#ffffff", "#ff7f0e", "#a1d99b"])
        first = None
        for k, name in enumerate("QKVO"):
            sax = fig.add_subplot(gs[k + 1], sharey=first)
            first = first or sax
            self.strips[name] = sax.imshow(np.zeros((1, 1)), cmap=strip_cmap, vmin=0, vmax=2,
                                           interpolation="nearest", extent=(0, 1, 1, 0),
                                           aspect="auto")
            sax.set_xticks([])
            sax.set_title(name, fontsize=10)
            sax.tick_params(labelsize=7, labelleft=(k == 0))
            self.strips[name + "_ax"] = sax
        self.text = fig.text(0.08, 0.02, "", family="monospace", fontsize=8)

    def base_key(self, v: dict):
        # the axes (their ticks cost most of a draw) depend on N alone; d, M, the mask
        # and the step move only the images and the texts
        return v["seq_len"]

    def layers(self, v: dict) -> list:
        return [(None, [self.grid, *(self.strips[n] for n in "QKVO"), self.text,
                        self.title])]

    def update(self, v: dict) -> None:
        N, Br, Bc = v["seq_len"], v["block_rows"], v["block_cols"]
        st = v["state"]
        Tr, Tc = st.shape
        checker = (np.add.outer(np.arange(Tr), np.arange(Tc)) % 2) * 4
        self.grid.set_data(st + checker)
        self.grid.set_extent((0, Tc * Bc, Tr * Br, 0))
        self.ax.set_xlim(0, N)
        self.ax.set_ylim(N, 0)
        for name in "QKVO":
            B = Bc if name in "KV" else Br
            T = Tc if name in "KV" else Tr
            col = np.zeros((T, 1))
            if name == "O":
                col[v["o_writes"] > 0, 0] = 2                 # written to HBM at least once
            for tensor, (r0, _) in v["held"]:
                if tensor == name:
                    col[r0 // B, 0] = 1
            self.strips[name].set_data(col)
            self.strips[name].set_extent((0, 1, T * B, 0))
            self.strips[name + "_ax"].set_ylim(N, 0)
        self.title.set_text(
            f"{v['algorithm']}, N = {N}, d = {v['head_dim']}, {v['dtype']}, M = "
            f"{bytes_label(v['sram'])}{', causal' if v['causal'] else ''}\n"
            f"B_r = {Br}, B_c = {Bc}: {Tr} x {Tc} tiles, {v['skipped']} skipped (grey)")
        held = ", ".join(f"{t}[{r0}:{r1}]" for t, (r0, r1) in v["held"])
        last = " (the last)" if v["step"] == v["steps"] - 1 else ""
        self.text.set_text(
            f"step {v['step']}: tile {v['step'] + 1} of {v['steps']}{last}, (i, j) = "
            f"({v['i']}, {v['j']}) (orange)\n"
            f"in SRAM (orange strips): {held}\n"
            f"HBM so far: read {bytes_label(v['read_bytes'])} of "
            f"{bytes_label(v['total_read'])}, written {bytes_label(v['written_bytes'])} of "
            f"{bytes_label(v['total_written'])}\n"
            f"green strip: rows of the output already written to HBM")


# ===================================================================== 05 FlashAttention-2

class LoopOrderPicture:
    """HBM bytes by tensor, flash1 against flash2 (read solid, write hatched)."""

    TENSORS = ("Q", "K", "V", "O", "l", "m", "L")

    def __init__(self, fig):
        from matplotlib.ticker import FuncFormatter
        self.ax = ax = fig.add_subplot(111)
        y = np.arange(len(self.TENSORS))[::-1].astype(float)
        self.y = y
        self.read, self.write, self.notes = {}, {}, {}
        for alg, off in (("flash1", 0.2), ("flash2", -0.2)):
            c = COLORS[alg]
            self.read[alg] = ax.barh(y + off, np.zeros(len(y)), height=0.38, color=c,
                                     label=f"{alg} read")
            self.write[alg] = ax.barh(y + off, np.zeros(len(y)), height=0.38, color="white",
                                      edgecolor=c, hatch="///", label=f"{alg} write")
            self.notes[alg] = [ax.text(0, yy + off, "", va="center", fontsize=7)
                               for yy in y]
        ax.set_yticks(y, self.TENSORS)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: bytes_label(x)))
        ax.legend(loc="lower right", fontsize=8)
        self.title = ax.set_title("", fontsize=9)
        fig.subplots_adjust(left=0.06, right=0.97, top=0.92, bottom=0.08)

    def layers(self, v: dict) -> list:
        return [(None, [self.ax.xaxis, self.title,
                        *(r for b in (*self.read.values(), *self.write.values())
                          for r in b.patches),
                        *(t for ts in self.notes.values() for t in ts)])]

    def update(self, v: dict) -> None:
        from matplotlib.ticker import MultipleLocator
        top = 1.0
        for alg in ("flash1", "flash2"):
            t = v["per_tensor"][alg]
            for k, name in enumerate(self.TENSORS):
                r = t.get(name, {}).get("read_bytes", 0)
                w = t.get(name, {}).get("write_bytes", 0)
                self.read[alg].patches[k].set_width(r)
                self.write[alg].patches[k].set_x(r)
                self.write[alg].patches[k].set_width(w)
                note = self.notes[alg][k]
                note.set_x(r + w)
                note.set_text(f" {bytes_label(r + w)}" if name in t else "")
                top = max(top, r + w)
        self.ax.set_xlim(0, top * 1.3)
        self.ax.xaxis.set_major_locator(MultipleLocator(_nice_step(top * 1.3)))
        self.title.set_text(
            f"N = {v['seq_len']}, d = {v['head_dim']}, {v['dtype']}, M = "
            f"{bytes_label(v['sram'])}: O moves {v['o_passes']['flash1']:.0f} x N·d·b bytes "
            f"in flash1, {v['o_passes']['flash2']:.0f} x in flash2")


class WavesPicture:
    """SMs (rows) against time (columns), busy or idle, for FA1's grid (batch x heads
    blocks) and FA2's (batch x heads x T_r blocks), on one time axis."""

    def __init__(self, fig):
        from matplotlib.colors import LinearSegmentedColormap
        self.axes = fig.subplots(2, 1, sharex=True)
        cmap = LinearSegmentedColormap.from_list("busy", ["#f7f7f7", "#2ca02c"])
        self.images, self.titles = {}, {}
        for ax, scheme in zip(self.axes, ("flash1", "flash2")):
            self.images[scheme] = ax.imshow(np.zeros((1, 1)), cmap=cmap, vmin=0, vmax=1,
                                            aspect="auto", interpolation="nearest",
                                            extent=(0, 1, 1, 0))
            ax.set_ylabel("SM")
            self.titles[scheme] = ax.set_title("", fontsize=9)
        self.axes[1].set_xlabel("time, in units of one Q block against all of K and V")
        self.sup = fig.suptitle("", fontsize=10)
        for ax in self.axes:
            ax.set_yticks([0, 33, 66, 99, 132])
        fig.subplots_adjust(left=0.08, right=0.98, top=0.86, bottom=0.11, hspace=0.4)

    def layers(self, v: dict) -> list:
        return [(None, [*self.images.values(), *self.titles.values(), self.sup,
                        *(ax.xaxis for ax in self.axes)])]

    def update(self, v: dict) -> None:
        T, sms = v["time_units"], v["sms"]
        for ax, scheme in zip(self.axes, ("flash1", "flash2")):
            o = v[scheme]
            self.images[scheme].set_data(v["busy"][scheme])
            self.images[scheme].set_extent((0, T, sms, 0))
            ax.set_xlim(0, T)
            ax.set_ylim(sms, 0)
            grid = "batch x heads" if scheme == "flash1" else "batch x heads x ceil(N/B_r)"
            self.titles[scheme].set_text(
                f"{'FA1' if scheme == 'flash1' else 'FA2'} grid = {grid} = {o['blocks']:,} "
                f"blocks on {sms} SMs: {o['waves']} wave{'s' * (o['waves'] > 1)}, "
                f"time {o['time_units']:,}, SMs busy {100 * o['utilisation']:.0f}%")
        self.sup.set_text(
            f"batch {v['batch']}, heads {v['heads']}, N = {v['seq_len']}, B_r = "
            f"{v['block_rows']}: FA2 finishes {v['speedup']:.1f}x sooner")


class WarpsPicture:
    """One B_r x B_c tile of S and the B_r x d accumulator O_i, coloured by the warp that
    owns each element, for split-K (FlashAttention) and split-Q (FlashAttention-2); beside
    them, the shared-memory elements each scheme writes and reads per K/V block to combine
    its warps' results."""

    def __init__(self, fig):
        from matplotlib.colors import ListedColormap
        gs = fig.add_gridspec(2, 3, width_ratios=[1.0, 1.0, 1.1], hspace=0.55, wspace=0.6,
                              left=0.06, right=0.97, top=0.85, bottom=0.12)
        cmap = ListedColormap(["#bdbdbd", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                               "#9467bd", "#8c564b", "#e377c2", "#17becf"])
        self.images, self.titles = {}, {}
        for row, scheme in enumerate(("split-K", "split-Q")):
            for col, what in enumerate(("S", "O")):
                ax = fig.add_subplot(gs[row, col])
                self.images[scheme, what] = ax.imshow(np.zeros((1, 1)), cmap=cmap, vmin=-1,
                                                      vmax=7, interpolation="nearest",
                                                      aspect="auto")
                ax.set_xticks([])
                ax.set_yticks([])
                self.titles[scheme, what] = ax.set_title("", fontsize=8)
        self.bar_ax = bax = fig.add_subplot(gs[:, 2])
        self.bars = bax.bar([0, 1], [0, 0], color=["#d62728", "#2ca02c"])
        bax.set_xticks([0, 1], ["split-K\n(FlashAttention)", "split-Q\n(FlashAttention-2)"],
                       fontsize=8)
        bax.set_ylabel("elements written + read in shared\nmemory per K/V block to combine",
                       fontsize=8)
        self.bar_notes = [bax.text(x, 0, "", ha="center", va="bottom", fontsize=8)
                          for x in (0, 1)]
        self.sup = fig.suptitle("", fontsize=10)

    def layers(self, v: dict) -> list:
        return [(None, [*self.images.values(), *self.titles.values(), *self.bars,
                        *self.bar_notes, self.bar_ax.yaxis, self.sup])]

    def update(self, v: dict) -> None:
        w, Br, Bc, d = v["warps"], v["block_rows"], v["block_cols"], v["head_dim"]
        for scheme in ("split-K", "split-Q"):
            x = v[scheme]
            for what, extent in (("S", (0, Bc, Br, 0)), ("O", (0, d, Br, 0))):
                img = self.images[scheme, what]
                img.set_data(x["owner_" + what])
                img.set_extent(extent)
                img.axes.set_xlim(0, extent[1])
                img.axes.set_ylim(Br, 0)
            shared = "" if scheme == "split-Q" else ": every warp a partial (grey)"
            self.titles[scheme, "S"].set_text(f"{scheme}: S_ij, {Br} x {Bc}, by warp")
            self.titles[scheme, "O"].set_text(f"O_i, {Br} x {d}{shared}")
        totals = [v[s]["exchange_written"] + v[s]["exchange_read"] for s in ("split-K", "split-Q")]
        for bar, note, total, s in zip(self.bars, self.bar_notes, totals, ("split-K", "split-Q")):
            bar.set_height(total)
            note.set_y(total)
            note.set_text(f"{total:,}\n+{v[s]['barriers']} barriers")
        self.bar_ax.set_ylim(0, max(totals + [1]) * 1.3)
        self.sup.set_text(f"{w} warps share a {Br} x {Bc} tile (d = {d}): split-K combines "
                          f"partial results through shared memory at every K/V block, "
                          f"split-Q never")


def predicted_vs_measured(rows: list[dict], quantity: str, ax=None):
    """Log-log scatter, one colour per kernel, with the y = x line and a +-band."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    band = {"dram": 0.10, "l2": 0.15, "sm": 0.15, "time": 0.5}[quantity]
    kernels = sorted({r["point"]["kernel"] for r in rows})
    seen: list = []
    for k in kernels:
        sel = [r for r in rows if r["point"]["kernel"] == k]
        if quantity == "time":
            x = [r["measured"]["time_s"] for r in sel]
            y = [r["predicted"]["time_s"] for r in sel]
        elif quantity == "sm":       # reads: what the SMs asked for, before L1
            sel = [r for r in sel if r["measured"]["sm_read_bytes"]]
            x = [r["measured"]["sm_read_bytes"] for r in sel]
            y = [r["predicted"]["l2_read_bytes"] for r in sel]
        else:
            x = [r["measured"][f"{quantity}_read_bytes"] + r["measured"][f"{quantity}_write_bytes"]
                 for r in sel]
            y = [r["predicted"][f"{quantity}_read_bytes"] + r["predicted"][f"{quantity}_write_bytes"]
                 for r in sel]
        ax.scatter(x, y, s=14, label=k)
        seen += x + y
    lo, hi = min(seen) / 1.5, max(seen) * 1.5
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * (1 - band) if quantity != "time" else xs / 1.5,
                    xs * (1 + band), color="k", alpha=0.08)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.minorticks_off()      # up to ten decades: hundreds of unlabelled ticks cost seconds to lay out
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    unit = "s" if quantity == "time" else "bytes"
    name = "SM read requests" if quantity == "sm" else quantity
    ax.set_xlabel(f"measured {name} ({unit})")
    ax.set_ylabel(f"predicted {name} ({unit})")
    ax.legend(fontsize=7)
    return ax


class RecomputationPicture:
    """Left: bytes kept between the passes against N (log-log): P is N^2, O and the
    statistics are N. Right: the fwd+bwd roofline time. The current N marked."""

    def __init__(self, fig):
        self.colors = COLORS
        self.ax, self.bx = fig.add_subplot(121), fig.add_subplot(122)
        for ax in (self.ax, self.bx):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, alpha=0.25)
            ax.set_xlabel("sequence length N")
        self.saved = {a: self.ax.plot([], [], color=c, lw=2, label=LABELS[a])[0]
                      for a, c in COLORS.items()}
        self.time = {a: self.bx.plot([], [], color=c, lw=2, label=LABELS[a])[0]
                     for a, c in COLORS.items()}
        self.cap = self.ax.axhline(1, color="black", ls=":", lw=1.2, label="GPU memory")
        self.marks = [ax.axvline(1, color="gray", lw=1) for ax in (self.ax, self.bx)]
        self.ax.set_ylabel("bytes kept for the backward pass")
        self.bx.set_ylabel("fwd+bwd roofline time (s)")
        self.ax.legend(fontsize=8, loc="upper left", frameon=False)
        self.title = fig.suptitle("", fontsize=10)
        fig.subplots_adjust(left=0.09, right=0.98, top=0.88, bottom=0.13, wspace=0.3)

    def update(self, v: dict) -> None:
        n = v["sizes"]
        for a in self.saved:
            self.saved[a].set_data(n, v["saved"][a])
            self.time[a].set_data(n, v["time"][a])
        for m in self.marks:
            m.set_xdata([v["seq_len"], v["seq_len"]])
        cap = v["capacity_bytes"] or 1
        self.cap.set_ydata([cap, cap])
        self.cap.set_visible(v["capacity_bytes"] is not None)
        lo = min(x.min() for x in v["saved"].values())
        hi = max(max(x.max() for x in v["saved"].values()), cap)
        self.ax.set_ylim(lo / 2, hi * 2)
        self.ax.set_xlim(n.min() / 1.2, n.max() * 1.2)
        t = np.concatenate(list(v["time"].values()))
        self.bx.set_ylim(t.min() / 2, t.max() * 2)
        self.bx.set_xlim(n.min() / 1.2, n.max() * 1.2)
        rows = {r["algorithm"]: r for r in v["rows"]}
        self.title.set_text(
            f"batch {v['batch']} x {v['heads']} heads, d = {v['head_dim']}, {v['dtype']}, "
            f"{v['gpu']}: at N = {v['seq_len']}, standard keeps "
            f"{format_bytes(rows['standard']['saved_bytes'])}, FlashAttention-2 "
            f"{format_bytes(rows['flash2']['saved_bytes'])}")


class TimelinePicture:
    """Left: context parallelism's timeline, one lane per device: compute per step (colour:
    whose K/V slice it attends to) and, beneath, the transfers it sends; gaps are idle time.
    Right: bytes through each device's HBM against the bytes it sends over its link."""

    MAX_DEVICES = 8

    def __init__(self, fig):
        from matplotlib import colormaps
        from matplotlib.collections import PolyCollection
        self.fig = fig
        self.cmap = colormaps["tab10"]
        self.ax = fig.add_axes([0.07, 0.14, 0.58, 0.70])
        self.bx = fig.add_axes([0.74, 0.14, 0.24, 0.70])
        self.work = PolyCollection([], edgecolor="white", linewidth=0.3)
        self.sends = PolyCollection([], facecolor="0.55", edgecolor="none")
        self.ax.add_collection(self.work)
        self.ax.add_collection(self.sends)
        self.ax.set_xlabel("time (ms)")
        self.ax.invert_yaxis()
        self.idle = [self.ax.text(0, 0, "", fontsize=8, va="center", ha="left")
                     for _ in range(self.MAX_DEVICES)]
        x = np.arange(self.MAX_DEVICES)
        self.hbm = self.bx.bar(x - 0.2, np.ones_like(x), width=0.4, color="#1f77b4",
                               label="HBM (r+w)")
        self.link = self.bx.bar(x + 0.2, np.ones_like(x), width=0.4, color="0.55",
                                label="sent over link")
        self.bx.set_yscale("log")
        from matplotlib.ticker import NullLocator
        self.bx.yaxis.set_minor_locator(NullLocator())   # minor log ticks cost most of a draw
        self.bx.set_xlabel("device")
        self.bx.set_ylabel("bytes")
        self.bx.legend(fontsize=7, loc="upper left", frameon=False)
        self.title = fig.suptitle("", fontsize=9)

    def _limits(self, v: dict) -> tuple:
        """The time axis's end (rounded up) and the byte axis's decades: the axes' keys."""
        hi = max(max(v["hbm_bytes"]), max(v["link_send_bytes"]) or 1)
        lo = min([x for x in v["hbm_bytes"] + v["link_send_bytes"] if x > 0] or [1])
        return round_up(v["total_s"] * 1e3 * 1.22), decades(lo / 3, hi * 3)

    def layers(self, v: dict) -> list:
        # Drawn in layers: each axis (tick labels cost most) only when what it shows moves,
        # least often moved first: the devices, then the byte decades, then the time axis
        t_end, b_lim = self._limits(v)
        return [(v["devices"], [self.ax.yaxis, self.bx.xaxis]),
                (b_lim, [self.bx.yaxis]),
                (t_end, [self.ax.xaxis]),
                (None, [self.work, self.sends, *self.idle, *self.hbm, *self.link,
                        *self.ax.spines.values(), *self.bx.spines.values(),
                        self.bx.get_legend(), self.title])]          # the legend over the bars

    def update(self, v: dict) -> None:
        P = v["devices"]
        ms = 1e3
        verts, colors = [], []
        for p, steps in enumerate(v["compute"]):
            for _, src, a, b in steps:
                src = p if src < 0 else src
                verts.append([(a * ms, p - 0.38), (b * ms, p - 0.38), (b * ms, p + 0.08),
                              (a * ms, p + 0.08)])
                colors.append(self.cmap(src % 10))
        self.work.set_verts(verts)
        self.work.set_facecolors(colors)
        self.sends.set_verts([[(a * ms, src + 0.14), (b * ms, src + 0.14),
                               (b * ms, src + 0.36), (a * ms, src + 0.36)]
                              for src, _, _, a, b in v["transfers"]])
        T = v["total_s"] * ms
        t_end, b_lim = self._limits(v)
        self.ax.set_xlim(0, t_end)
        self.ax.set_ylim(P - 0.5, -0.6)
        self.ax.set_yticks(range(P))
        self.ax.set_yticklabels([f"device {p}" for p in range(P)], fontsize=8)
        for p, t in enumerate(self.idle):
            t.set_visible(p < P)
            if p < P:
                t.set_position((T * 1.01, p - 0.15))
                t.set_text(f"idle {v['idle_fraction'][p]:.0%}")
        for p in range(self.MAX_DEVICES):
            for bars, key in ((self.hbm, "hbm_bytes"), (self.link, "link_send_bytes")):
                bars[p].set_visible(p < P)
                bars[p].set_height(max(v[key][p], 1) if p < P else 1)
        self.bx.set_xlim(-0.6, P - 0.4)
        self.bx.set_xticks(range(P))
        self.bx.set_ylim(*b_lim)
        self.title.set_text(
            f"{v['schedule']} ({v['layout']} slices{', causal' if v['causal'] else ''}), "
            f"N = {v['seq_len']:,}, d = {v['head_dim']}, {v['heads']} heads, {v['dtype']}, "
            f"{v['gpu']}, {v['link_name']} {v['link_gbps']:.0f} GB/s one way: "
            f"{v['total_s'] * 1e3:.2f} ms, {v['speedup']:.2f}x one GPU; transfers "
            f"{'hidden' if v['overlapped'] else 'not hidden'}")
