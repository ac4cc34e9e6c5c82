"""Masks and sparsity (notebook 10's logic): the mask, its tiles, and what skipping buys.

Everything is computed by flashsim's plans on the H200 preset (its default tiles, buffers
placed as kernels place them) from :mod:`flashsim.masks`, whose counts
``tests/test_masks.py`` holds equal to the closed forms:

    v = mask_view("sliding", seq_len=16384, window=1024)
    v["fraction"], v["flash2"]["time_s"], v["unmasked"]["time_s"]
    panel = mask_panel()          # sliders: window, documents, density; the family, N

Measured points come from ``flashsim/measured/data/masks_h200.json`` only when that file
exists (``benchmarks/masks_h200.py`` writes it): ``{"provenance": {...}, "points": [{"impl",
"d", "N", "mask", "time_ms", "non_skipped_fraction", ...}, ...]}``, the masked kernel's points
as impl ``cupy_flash3_mask`` (mask: the spec), the unmasked kernel's as ``cupy_flash3`` (mask
"none"), peers beside them. Without it :func:`measurements` is empty and the notebook says so.

The Hopper kernel's own time model (``flashsim.measured.masked_time``: each query block's
fixed, tile and partial-tile cost handed out over the SMs, fitted at one N) gives each view
its predicted masked / unmasked ratio (``kernel_ratio``, for d it was fitted at), drawn
beside the measured crosses; :func:`kernel_model_table` sets it beside every measured point.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import masks as _masks, measured
from ..hardware.presets import DEFAULT_GPU, gpu as _gpu, roofline_time
from ..plan import plan
from ._text import text_table

FAMILIES = ("sliding", "document", "blocksparse", "causal", "prefix")
WINDOWS = tuple(2**k for k in range(6, 15))                 # 64 .. 16384
DOCUMENTS = tuple(range(1, 17))
DENSITIES = tuple(round(0.05 * k, 2) for k in range(1, 21))  # 0.05 .. 1.0
SEQ_LENS = (4096, 8192, 16384, 32768)
MEASUREMENTS = "masks_h200.json"
MASKED_IMPL, UNMASKED_IMPL = "cupy_flash3_mask", "cupy_flash3"   # the benchmark's impl names
PICTURE = 256                                                # mask drawn on 256 x 256 samples


def spec(family: str, seq_len: int, window: int = 1024, documents: int = 4,
         density: float = 0.25, seed: int = 0) -> str:
    """The mask spec a family's controls describe: documents as equal causal documents, a
    prefix of a quarter of N."""
    if family == "sliding":
        return f"sliding:{window}"
    if family == "document":
        lengths = _masks.documents(seq_len, documents)
        return "document:" + ",".join(map(str, lengths)) + ":causal"
    if family == "blocksparse":
        return f"blocksparse:{density:g}:{seed}"
    if family == "prefix":
        return f"prefix:{seq_len // 4}"
    if family == "causal":
        return "causal"
    raise _masks.MaskError(f"family {family!r}: choose one of {', '.join(FAMILIES)}")


def _row(p) -> dict:
    rep = p.count()
    return {"hbm_bytes": rep.hbm_bytes, "flops": rep.flops,
            "kv_bytes": sum(rep.per_tensor[t]["read_bytes"] for t in ("K", "V")),
            "time_s": roofline_time(rep.hbm_bytes, rep.flops, p.gpu, p.dtype),
            "per_tensor": rep.per_tensor}


def mask_view(family: str = "sliding", seq_len: int = 16384, window: int = 1024,
              documents: int = 4, density: float = 0.25, head_dim: int = 128,
              heads: int | None = None, dtype: str = "fp16", gpu: str = DEFAULT_GPU) -> dict:
    """One mask on one shape: the mask (sampled), its tile classes, the tiles skipped, and
    flash2's predicted bytes and roofline time beside the unmasked run's and standard
    attention's (which reads the dense mask and skips nothing). ``heads`` defaults to
    2048 / d, batch 1: the shape issue 16's H200 measurements use. A pure function of the
    mask's spec and the shape, so it is cached on that (a slider of another family, which
    leaves the spec as it is, costs nothing; a step back is free); the measured points are
    read fresh."""
    text = spec(family, seq_len, window, documents, density)
    v = dict(_mask_view(family, text, seq_len, head_dim, heads or max(1, 2048 // head_dim),
                        dtype, gpu))
    v["measured"] = [p for p in measurements()      # the data file, read as it is now
                     if p.get("N") == seq_len and p.get("d") == head_dim]
    return v


@functools.lru_cache(maxsize=256)
def _mask_view(family: str, text: str, seq_len: int, head_dim: int, heads: int, dtype: str,
               gpu: str) -> dict:
    kw = dict(dtype=dtype, gpu=gpu, heads=heads)
    fa = plan("flash2", seq_len, head_dim, mask=text, **kw)
    full = plan("flash2", seq_len, head_dim, block_rows=fa.block_rows,
                block_cols=fa.block_cols, **kw)
    std = plan("standard", seq_len, head_dim, mask=text, **kw)
    m = fa.mask
    idx = (np.arange(PICTURE) * seq_len) // PICTURE
    counts = _masks.tile_counts(fa)
    rows = {"flash2": _row(fa), "unmasked": _row(full), "standard": _row(std)}
    return {
        "family": family, "spec": text, "seq_len": seq_len, "head_dim": head_dim,
        "heads": heads,
        "dtype": dtype, "gpu": _gpu(gpu).name, "block_rows": fa.block_rows,
        "block_cols": fa.block_cols,
        "picture": m.at(idx[:, None], idx[None, :], fa.block_rows, fa.block_cols),
        "classes": m.classify(fa.block_rows, fa.block_cols), **counts, **rows,
        "dense_mask_bytes": _masks.dense_mask_bytes(seq_len),
        "flashmask_bytes": _masks.flashmask_bytes(seq_len),
        "time_ratio": rows["flash2"]["time_s"] / rows["unmasked"]["time_s"],
        "kernel_ratio": kernel_ratio(text, seq_len, head_dim, heads),
    }


def kernel_ratio(text: str, seq_len: int, head_dim: int, heads: int) -> float | None:
    """The Hopper kernel's masked / unmasked time by its query-block model
    (``flashsim.measured.masked_time``), or None at a d it was not fitted at."""
    from ..measured import masked_time as mt
    if head_dim not in mt.CONSTANTS:
        return None
    return (mt.predict_seconds(text, seq_len, head_dim, heads)
            / mt.predict_seconds("none", seq_len, head_dim, heads))


def kernel_model_table() -> str:
    """Every measured point of the masked kernel beside the query-block model's ratio and
    the benchmark's s + p kappa (``masked_time.format_rows``), or the note that none is
    measured."""
    from ..measured import masked_time as mt
    return mt.format_rows(mt.rows()) if measurements() else measured_note()


def describe(v: dict) -> str:
    """One line from a view, for a cell to print from the widget's state."""
    return (f"{v['spec'][:48]} at N = {v['seq_len']:,}, d = {v['head_dim']}, "
            f"{v['heads']} heads, tiles "
            f"{v['block_rows']} x {v['block_cols']}: {v['skipped']:,} of {v['tiles']:,} "
            f"tiles skipped, {v['partial']:,} partial; flash2 moves "
            f"{v['flash2']['hbm_bytes'] / 1e9:.3f} GB ({v['flash2']['kv_bytes'] / max(1, v['unmasked']['kv_bytes']):.3f}"
            f" of the unmasked K/V reads), roofline {v['flash2']['time_s'] * 1e3:.3f} ms "
            f"({v['time_ratio']:.3f} of unmasked; computed fraction {v['fraction']:.3f})")


def measurements() -> list[dict]:
    """The masked kernel's H200 points (``masks_h200.json``) if committed, else []: an
    unmeasured point is absent, never estimated."""
    p = measured.path(MEASUREMENTS)
    return measured.load(MEASUREMENTS).get("points", []) if p.is_file() else []


def measured_note() -> str:
    pts = measurements()
    if not pts:
        return ("not measured yet: no flashsim/measured/data/masks_h200.json (the masked "
                "Hopper kernel's benchmark writes it); the model's predictions stand alone")
    return f"{len(pts)} measured points from flashsim/measured/data/{MEASUREMENTS}"


def carry_table(sizes=(1024, 4096, 16384, 65536, 131072)) -> list[dict]:
    """What a mask costs to carry, per head: a dense N x N boolean against FlashMask's four
    int32 vectors."""
    return [{"seq_len": n, "dense_bytes": _masks.dense_mask_bytes(n),
             "flashmask_bytes": _masks.flashmask_bytes(n),
             "ratio": _masks.dense_mask_bytes(n) / _masks.flashmask_bytes(n)} for n in sizes]


def format_carry(rows: list[dict]) -> str:
    return text_table([("N", ">8", ",", lambda r: r["seq_len"]),
                       ("dense bool (B)", ">18", ",", lambda r: r["dense_bytes"]),
                       ("FlashMask (B)", ">16", ",", lambda r: r["flashmask_bytes"]),
                       ("ratio", ">10", ",.0f", lambda r: r["ratio"])], rows)


def format_padding(w: dict) -> str:
    return (f"{w['sequences']} sequences: padded {w['padded_tokens']:,} tokens and "
            f"{w['padded_scores']:,} scores; packed (cu_seqlens {w['cu_seqlens'].tolist()}) "
            f"{w['packed_tokens']:,} tokens and {w['packed_scores']:,} scores: padding wastes "
            f"{w['token_waste']:.0%} of the tokens and {w['score_waste']:.0%} of the "
            "attention work")


# -------------------------------------------------------------------------- the picture
CLASS_COLORS = ("#f0f0f0", "#ffbb78", "#2ca02c")        # skipped, partial, full


class MaskPicture:
    """Left: the mask (sampled; dark = seen). Middle: the tiles, skipped (light), partial
    (orange), full (green). Right: bytes and roofline time of flash2 with the mask, without
    it and of standard attention with the dense mask, as shares of the unmasked flash2
    run's; measured points (when committed) as crosses, the Hopper kernel's query-block model
    (``kernel_ratio``) as a plus. Drawn in layers: the frames, tick
    labels and legend are saved; the bar axis's limits lie on whole decades, so a move
    redraws only the images, bars and title (and the bar axis when its decades change)."""

    def __init__(self, fig):
        from matplotlib.colors import ListedColormap
        self.ax = fig.add_axes([0.03, 0.12, 0.27, 0.72])
        self.bx = fig.add_axes([0.35, 0.12, 0.27, 0.72])
        self.cx = fig.add_axes([0.72, 0.12, 0.26, 0.72])
        # fixed extents: the axes' limits never move, whatever N or the tile count
        self.img = self.ax.imshow(np.zeros((2, 2)), cmap="Greys", vmin=0, vmax=1,
                                  interpolation="nearest", extent=(0, 1, 1, 0))
        self.tiles = self.bx.imshow(np.zeros((2, 2)), cmap=ListedColormap(CLASS_COLORS),
                                    vmin=0, vmax=2, interpolation="nearest",
                                    extent=(0, 1, 1, 0))
        for a, t in ((self.ax, "mask (query rows x key columns)"),
                     (self.bx, "tiles: skipped / partial / full")):
            a.set_xticks([])
            a.set_yticks([])
            a.set_title(t, fontsize=8)
        x = np.arange(3)
        self.bars_b = self.cx.bar(x - 0.2, np.ones(3), width=0.4, color="#1f77b4",
                                  label="bytes")
        self.bars_t = self.cx.bar(x + 0.2, np.ones(3), width=0.4, color="#ff7f0e",
                                  label="roofline time")
        self.meas, = self.cx.plot([], [], "kx", ms=8, label="measured time")
        self.model, = self.cx.plot([], [], "r+", ms=9, label="kernel model")
        self.cx.set_xticks(x)
        self.cx.set_xticklabels(["flash2\nmasked", "flash2\nunmasked", "standard\ndense mask"],
                                fontsize=7)
        self.cx.set_yscale("log")
        self.cx.set_ylabel("/ unmasked flash2", fontsize=8)
        self.cx.legend(fontsize=7, loc="upper left", frameon=False)
        self.title = fig.suptitle("", fontsize=9)

    @staticmethod
    def _ratios(v: dict) -> list[float]:
        """Every bar's and cross's height, as a share of the unmasked flash2 run's."""
        base, ys = v["unmasked"], []
        for key in ("flash2", "unmasked", "standard"):
            ys += [v[key]["hbm_bytes"] / base["hbm_bytes"], v[key]["time_s"] / base["time_s"]]
        pts = [p for p in v["measured"] if p.get("mask") == v["spec"] and p.get("impl") == MASKED_IMPL]
        ref = [p for p in v["measured"] if p.get("impl") == UNMASKED_IMPL]
        return ys + ([p["time_ms"] / ref[0]["time_ms"] for p in pts] if ref else []) \
            + ([v["kernel_ratio"]] if v.get("kernel_ratio") else [])

    @classmethod
    def _decades(cls, v: dict) -> tuple[float, float]:
        """The bar axis's limits on whole decades around every bar, so they rarely move."""
        from .pictures import decades
        ys = [y for y in cls._ratios(v) if y > 0]
        return decades(min(ys) / 2, max(ys) * 2)

    def layers(self, v: dict) -> list:
        return [(self._decades(v), [self.cx.yaxis]),
                (None, [self.img, self.tiles, *self.ax.spines.values(),   # frames over images
                        *self.bx.spines.values(), *self.bars_b, *self.bars_t, self.meas,
                        self.model, self.title])]

    def update(self, v: dict) -> None:
        self.img.set_data(v["picture"].astype(float))
        self.tiles.set_data(v["classes"])
        base = v["unmasked"]
        for k, key in enumerate(("flash2", "unmasked", "standard")):
            self.bars_b[k].set_height(v[key]["hbm_bytes"] / base["hbm_bytes"])
            self.bars_t[k].set_height(v[key]["time_s"] / base["time_s"])
        pts = [p for p in v["measured"] if p.get("mask") == v["spec"] and p.get("impl") == MASKED_IMPL]
        ref = [p for p in v["measured"] if p.get("impl") == UNMASKED_IMPL]
        if pts and ref:
            self.meas.set_data([0.2] * len(pts),
                               [p["time_ms"] / ref[0]["time_ms"] for p in pts])
        else:
            self.meas.set_data([], [])
        k = v.get("kernel_ratio")
        self.model.set_data(*(([0.2], [k]) if k else ([], [])))
        self.cx.set_ylim(*self._decades(v))
        self.title.set_text(f"{v['spec'][:60]}, N = {v['seq_len']:,}, tiles "
                            f"{v['block_rows']} x {v['block_cols']} ({v['gpu']}): "
                            f"{v['skipped']:,} of {v['tiles']:,} tiles skipped")


# the slider that shapes each family's mask
FAMILY_OF = {"window": "sliding", "documents": "document", "density": "blocksparse"}


def mask_panel(family: str = "sliding", seq_len: int = 16384, window: int = 1024,
               documents: int = 4, density: float = 0.25):
    """Notebook 10: the family, N, and sliders for the window, the number of documents and
    the block density. Each slider moves the mask of its own family: moving it selects
    that family (the dropdown follows), so every slider changes the picture."""
    import ipywidgets as W

    from .widgets import Panel, _pow2_slider as slider

    class MaskPanel(Panel):
        def _on_change(self, change) -> None:
            fam = self.controls["family"]
            own = next((FAMILY_OF[k] for k, w in self.controls.items()
                        if w is change["owner"] and k in FAMILY_OF), None)
            if own is not None and fam.value != own and not self._busy:
                self._busy = True           # one refresh, after both controls moved
                try:
                    fam.value = own
                finally:
                    self._busy = False
            super()._on_change(change)

    return MaskPanel(mask_view, MaskPicture, {
        "family": W.Dropdown(options=list(FAMILIES), value=family, description="mask"),
        "seq_len": slider(SEQ_LENS, seq_len, "N"),
        "window": slider(WINDOWS, window, "window W"),
        "documents": slider(DOCUMENTS, documents, "documents"),
        "density": slider(DENSITIES, density, "block density"),
    }, figsize=(10.0, 3.8))
