"""Decoding is memory-bound: notebook 08's logic (bytes per token, cache memory, SMs, time).

Everything is read from ``flashsim.decode`` plans (their loop nests, counted exactly) and
``flashsim.hardware.timing.predict_memory_bound``:

    v = decode_view(kv_len=32768, batch=1, heads=32, kv_heads=8, page_size=0, splits=0)
    v["bytes_per_token"], v["cache_bytes_per_seq"], v["time_s"], v["sm_blocks"]
    panel = decode_panel()          # sliders: context, batch, heads, KV heads, page, splits

Measured points (``flashsim/measured/data/decode_h200.json``, written by the decode
benchmark) are drawn beside the prediction when that file exists; until then
:func:`measurements` is empty and the view says so. An unmeasured point is absent.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import decode
from ..algorithms import mla, paged
from ..errors import FlashsimError
from ..hardware.presets import DEFAULT_GPU, gpu as _gpu
from ..units import dtype_bytes, format_bytes

KV_LENS = tuple(2**k for k in range(10, 18))          # 1k .. 128k tokens
BATCHES = (1, 2, 4, 8, 16, 32, 64)
HEADS = (8, 16, 32, 64, 128)
# KV heads: 0 means "= heads" (MHA), -1 the MLA latent cache; the labels say which
KV_HEADS = (("MHA", 0), ("16", 16), ("8", 8), ("4", 4), ("2", 2), ("1 (MQA)", 1),
            ("MLA", -1))
PAGE_SIZES = (("contiguous", 0), ("1", 1), ("16", 16), ("64", 64), ("256", 256))
SPLITS = (("auto", 0), ("1", 1), ("2", 2), ("4", 4), ("8", 8), ("16", 16), ("32", 32),
          ("64", 64), ("128", 128))
DATA = "decode_h200.json"
MATCH = ("batch", "heads", "kv_heads", "kv_len", "q_len", "head_dim", "page_size", "dtype")


@lru_cache(maxsize=512)           # plans are frozen; their nests and predictions are kept
def make_plan(kv_len: int = 32768, batch: int = 1, heads: int = 32, kv_heads: int = 8,
              page_size: int = 0, splits: int = 0, q_len: int = 1, head_dim: int = 128,
              dtype: str = "fp16", gpu: str = DEFAULT_GPU):
    """The decode plan a setting of the sliders means (0: MHA / contiguous / auto)."""
    s = "auto" if splits == 0 else splits
    if kv_heads == -1:
        return decode.plan("mla", q_len=q_len, kv_len=kv_len, heads=heads, batch=batch,
                           dtype=dtype, splits=s, page_size=page_size or None, gpu=gpu)
    kvh = heads if kv_heads == 0 else kv_heads
    if kvh > heads:
        raise FlashsimError(f"{kvh} KV heads is more than the {heads} query heads")
    return decode.plan("paged" if page_size else "flashdecoding", q_len=q_len,
                       kv_len=kv_len, head_dim=head_dim, heads=heads, kv_heads=kvh,
                       batch=batch, dtype=dtype, splits=s, page_size=page_size or None,
                       gpu=gpu)


def cache_kind(kv_heads: int, heads: int) -> str:
    return {0: "mha", -1: "mla", 1: "mqa"}.get(kv_heads, "mha" if kv_heads == heads else "gqa")


def decode_view(kv_len: int = 32768, batch: int = 1, heads: int = 32, kv_heads: int = 8,
                page_size: int = 0, splits: int = 0, q_len: int = 1, head_dim: int = 128,
                dtype: str = "fp16", gpu: str = DEFAULT_GPU) -> dict:
    """One decode step: bytes per generated token, KV-cache memory per sequence (one
    layer), which SMs have work, predicted time per launch, and the same step without
    splits; the measured points of the same shape when the data exist."""
    p = make_plan(kv_len, batch, heads, kv_heads, page_size, splits, q_len, head_dim, dtype,
                  gpu)
    rep = p.count()
    launches = p.predict()
    time_s = sum(x.seconds for x in launches)
    unsplit = None if p.shared_kv else _flash2(kv_len, batch, heads, p.kv_heads, q_len,
                                                head_dim, dtype, gpu)
    b = dtype_bytes(dtype)
    kind = cache_kind(kv_heads, heads)
    gqa_heads = p.kv_heads if kind == "gqa" else min(8, heads)   # GQA's bar: 8 KV heads
    per_token = {k: mla.cache_bytes_per_token(k, heads, head_dim, gqa_heads, b)
                 for k in ("mha", "gqa", "mqa", "mla")}
    tokens = batch * q_len
    groups: dict = {}
    for name, t in rep.per_tensor.items():
        base = name.split("[")[0]
        key = ("K/V cache" if decode.kv_tensor(name) else "block table"
               if base == "block_table" else "partials (fp32)" if base.endswith("_part")
               else "Q, O, L")
        groups[key] = groups.get(key, 0) + t["read_bytes"] + t["write_bytes"]
    occupancy = p.occupancy()
    row_bytes = per_token[kind]
    memory = paged.fragmentation([kv_len] * batch, page_size or 1, row_bytes)
    g = _gpu(gpu)
    return {
        "kv_len": kv_len, "batch": batch, "heads": heads, "kv_heads": p.kv_heads,
        "kind": kind, "page_size": page_size, "splits": p.splits, "q_len": q_len,
        "dtype": dtype, "algorithm": p.algorithm, "sms": g.sms,
        "block_rows": p.block_rows, "block_cols": p.block_cols,
        "requested_bytes": rep.requested_bytes, "kv_bytes": rep.kv_bytes,
        "bytes_per_token": rep.requested_bytes / tokens, "bytes_by_kind": groups,
        "cache_bytes_per_token": per_token, "cache_bytes_per_seq": kv_len * row_bytes,
        "cache_memory": memory,
        "launches": [{"label": x.label, "blocks": x.blocks, "seconds": x.seconds,
                      "memory_s": x.dram_s} for x in launches],
        "sm_blocks": [blocks for _, blocks, _ in occupancy],
        "busy_sms": sum(n > 0 for n in occupancy[0][1]),
        "time_s": time_s, "tbps": rep.kv_bytes / time_s / 1e12,
        "unsplit_s": None if unsplit is None else unsplit.predict_seconds(),
        "curve": time_curve(kv_heads, batch, heads, page_size, splits, q_len, head_dim,
                            dtype, gpu),
        "measured": matching(measurements(), p, page_size),
        "measured_note": measured_note(),
    }


@lru_cache(maxsize=256)
def time_curve(kv_heads, batch, heads, page_size, splits, q_len, head_dim, dtype, gpu):
    """Predicted seconds against every context length of the slider, and flash2's."""
    out = {"kv_len": list(KV_LENS), "time_s": [], "flash2_s": []}
    for n in KV_LENS:
        p = make_plan(n, batch, heads, kv_heads, page_size, splits, q_len, head_dim, dtype,
                      gpu)
        out["time_s"].append(p.predict_seconds())
        if not p.shared_kv:
            out["flash2_s"].append(_flash2(n, batch, heads, p.kv_heads, q_len, head_dim,
                                           dtype, gpu).predict_seconds())
    return out


@lru_cache(maxsize=512)
def _flash2(kv_len, batch, heads, kv_heads, q_len, head_dim, dtype, gpu):
    """FlashAttention-2 over the same cache without splits (pack-GQA)."""
    return decode.plan("flash2", q_len=q_len, kv_len=kv_len, head_dim=head_dim, heads=heads,
                       kv_heads=kv_heads, batch=batch, dtype=dtype, gpu=gpu)


def measurements() -> list[dict]:
    """The committed decode points (``benchmarks/decode_h200.py``), or [] when the file
    does not exist yet: an unmeasured point is absent, not estimated. A point without its
    B_c takes the run's (the file's "config"). Parsed once per version of the file: every
    redraw of notebook 08 asks (a megabyte of JSON, tens of ms a parse)."""
    from .. import measured
    try:
        st = measured.path(DATA).stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        stamp = None
    return list(_measurements(measured.load, stamp))


@lru_cache(maxsize=4)
def _measurements(load, stamp) -> tuple:
    """measurements() of the file as ``load`` reads it, ``stamp`` its version (mtime, size)."""
    try:
        data = load(DATA)
    except FileNotFoundError:
        return ()
    bc = data.get("config", {}).get("block_cols")
    return tuple(pt if "block_cols" in pt or bc is None or not pt["impl"].startswith("cupy")
                 else {**pt, "block_cols": bc} for pt in data["points"])


def flush_profile(stem: str, metrics: tuple = ("dram__bytes_write.sum",)) -> list[dict]:
    """The launches a flush profile of ``benchmarks.decode_h200`` (--overheads-profile:
    ``decode_overheads_ncu_h200``; --l2-hints-profile: ``decode_l2_hints_ncu_h200``) ran inside
    its NVTX ranges (``stem``.json), each with ``metrics`` as Nsight Compute counted them (from
    ``stem``.csv, whose launches must be the JSON's; ``dram_write_bytes``: the DRAM bytes
    written); [] where that profile is not committed."""
    from .. import measured
    from gpu_kernels import ncu

    metrics = tuple(dict.fromkeys(("dram__bytes_write.sum", *metrics)))
    try:
        order = measured.load(f"{stem}.json")["launches"]
        rows = ncu.parse_csv(measured.path(f"{stem}.csv").read_text(), list(metrics))
    except FileNotFoundError:
        return []
    if [r["kernel_name"] for r in rows] != [x["kernel"] for x in order]:
        raise FlashsimError(f"{stem}.csv: its launches are not the JSON's")
    return [{**x, **{m: r[m] for m in metrics}, "dram_write_bytes": int(r["dram__bytes_write.sum"])}
            for r, x in zip(rows, order)]


def overhead_profile() -> list[dict]:
    """``flush_profile`` of --overheads-profile: the plain read and the default step."""
    return flush_profile("decode_overheads_ncu_h200")


PROFILE_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "launch__grid_size",
                   "launch__block_size", "launch__registers_per_thread",
                   "launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static")


def configs_profile() -> list[dict]:
    """The calls ``benchmarks.decode_h200 --configs-profile`` ran inside its NVTX ranges
    (``decode_configs_ncu_h200.json``: PyTorch's cuDNN call, then our step, at each point),
    each with its kernels as Nsight Compute saw them (``kernels``: name, time_s, grid, block,
    registers, shared_bytes, dram_read_bytes). Our step's kernels must be the JSON's; the
    peer's are the rows up to our step's first; [] where the profile is not committed."""
    from .. import measured
    from gpu_kernels import ncu

    try:
        calls = measured.load("decode_configs_ncu_h200.json")["calls"]
        rows = ncu.parse_csv(measured.path("decode_configs_ncu_h200.csv").read_text(),
                             PROFILE_METRICS)
    except FileNotFoundError:
        return []
    out, i = [], 0
    for n, c in enumerate(calls):
        if c["kernels"] is not None:           # ours: the kernels the JSON names
            take = len(c["kernels"])
            if [r["kernel_name"] for r in rows[i:i + take]] != c["kernels"]:
                raise FlashsimError("decode_configs_ncu_h200.csv: its kernels are not the JSON's")
        else:                                  # the peer's: up to the next call's first kernel
            nxt = calls[n + 1]["kernels"][0] if n + 1 < len(calls) else None
            take = next((k for k, r in enumerate(rows[i:]) if r["kernel_name"] == nxt),
                        len(rows) - i)
            if take == 0:
                raise FlashsimError("decode_configs_ncu_h200.csv: a peer's call has no kernel")
        kernels = [{"name": r["kernel_name"], "time_s": 1e-9 * r["gpu__time_duration.sum"],
                    "grid": int(r["launch__grid_size"]), "block": int(r["launch__block_size"]),
                    "registers": int(r["launch__registers_per_thread"]),
                    "shared_bytes": int(r["launch__shared_mem_per_block_dynamic"]
                                        + r["launch__shared_mem_per_block_static"]),
                    "dram_read_bytes": int(r["dram__bytes_read.sum"])} for r in rows[i:i + take]]
        out.append({**c, "kernels": kernels})
        i += take
    if i != len(rows):
        raise FlashsimError("decode_configs_ncu_h200.csv: more kernels than the JSON's calls")
    return out


def flush_dirty_bytes() -> int:
    """Dirty bytes the benchmark's L2 flush (a write of 2 x L2) leaves, which every measured
    step started from: the most a plain read of more than the L2 wrote back to DRAM after
    it, as Nsight Compute counted (``overhead_profile``); 0 where that profile is not
    committed."""
    l2 = _gpu(DEFAULT_GPU).l2_bytes
    return max((x["dram_write_bytes"] for x in overhead_profile()
                if x["what"] == "plain_read" and x["flush"] == "dirty" and x["kv_bytes"] > l2),
               default=0)


PEERS = ("torch", "plain_read", "flashinfer")     # impl prefixes that are not our kernel
DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}   # the files' names


def point_dtype(pt: dict) -> str:
    """A point's dtype in flashsim's names (the benchmark writes NumPy's)."""
    return DTYPES.get(pt["dtype"], pt["dtype"])


def ours_fastest(points: list[dict]) -> list[dict]:
    """Our kernel's correct points, the fastest configuration (variant) of each shape."""
    best: dict = {}
    for pt in points:
        if pt["impl"].startswith(PEERS) or not pt.get("check_ok"):
            continue
        key = (pt["impl"], pt["batch"], pt["heads"], pt["kv_heads"], pt["kv_len"], pt["q_len"],
               pt["head_dim"], pt.get("page_size") or 0, point_dtype(pt))
        if key not in best or pt["time_s"] < best[key]["time_s"]:
            best[key] = pt
    return list(best.values())


def measured_note() -> str:
    n = len(measurements())
    return (f"{n} measured points from {DATA}" if n else
            f"not measured yet: {DATA} is not committed, so no measured points are drawn")


def matching(points: list[dict], p, page_size: int) -> list[dict]:
    """Our kernel's measured points (the fastest variant of each) with this plan's shape at
    any context length."""
    want = {"batch": p.batch, "heads": p.heads, "kv_heads": p.kv_heads, "q_len": p.q_len,
            "head_dim": p.head_dim, "page_size": page_size or None}
    out = []
    for pt in ours_fastest(points):
        if point_dtype(pt) == p.dtype and all(
                pt.get(k) == v or (k == "page_size" and not pt.get(k) and not v)
                for k, v in want.items()):
            out.append(pt)
    return out


def describe(v: dict) -> str:
    """One line from a view (the notebook prints it from the widget's state)."""
    by = ", ".join(f"{k} {format_bytes(b)}" for k, b in v["bytes_by_kind"].items())
    un = "" if v["unsplit_s"] is None else \
        f"; without splits (flash2) {v['unsplit_s'] * 1e6:.1f} us"
    return (f"{v['algorithm']}: {v['kind'].upper()} cache, {v['kv_heads']} KV heads, "
            f"kv_len {v['kv_len']:,}, batch {v['batch']}, {v['splits']} splits: "
            f"{format_bytes(v['bytes_per_token'])} per generated token ({by}); cache "
            f"{format_bytes(v['cache_bytes_per_seq'])} per sequence per layer; "
            f"{v['busy_sms']} of {v['sms']} SMs busy; predicted {v['time_s'] * 1e6:.1f} us "
            f"({v['tbps']:.2f} TB/s of K/V){un}. {v['measured_note']}")


BYTE_KINDS = ("K/V cache", "Q, O, L", "partials (fp32)", "block table")
CACHE_KINDS = ("mha", "gqa", "mqa", "mla")


class DecodePicture:
    """Four panes: the bytes one token moves, by kind (shares); cache bytes per token for
    MHA/GQA/MQA/MLA; which SMs have work in the split launch; predicted time against
    context length, flash2 without splits beside it, and the measured points of the same
    shape when they exist. Axes and ticks are drawn once; only the data layer changes."""

    def __init__(self, fig):
        a, c, s, t = self.ax = fig.subplots(2, 2).ravel()
        fig.subplots_adjust(left=0.12, right=0.98, top=0.88, bottom=0.1, hspace=0.6,
                            wspace=0.35)
        self.sup = fig.suptitle("", fontsize=10)
        self.share = a.barh(list(BYTE_KINDS), [0] * len(BYTE_KINDS), color="#1f77b4")
        a.set_xlim(0, 100)
        a.set_xlabel("% of the bytes one step moves")
        self.share_title = a.set_title("", fontsize=9)
        self.cache = c.bar([k.upper() for k in CACHE_KINDS], [1] * 4, color="#bbbbbb")
        c.set_yscale("log")
        c.set_ylim(100, 2**20)
        c.minorticks_off()
        c.set_ylabel("cache bytes / token / layer")
        self.cache_title = c.set_title("", fontsize=9)
        self.cols = 12
        self.sm_image = s.imshow(np.zeros((11, self.cols)), cmap="Greens", vmin=0, vmax=1,
                                 aspect="auto", interpolation="nearest")
        s.set_xticks([])
        s.set_yticks([])
        self.sm_title = s.set_title("", fontsize=9)
        (self.curve,) = t.plot(KV_LENS, np.ones(len(KV_LENS)), "o-", label="predicted")
        (self.flash2,) = t.plot(KV_LENS, np.ones(len(KV_LENS)), "s--",
                                label="flash2, no splits")
        (self.points,) = t.plot([], [], "x", color="#d62728", ms=8, label="measured")
        self.here = t.axvline(KV_LENS[0], color="#999999", lw=0.8)
        t.set_xscale("log")
        t.set_yscale("log")
        t.set_xlim(KV_LENS[0] / 1.3, KV_LENS[-1] * 1.3)
        t.set_ylim(3, 1e5)
        t.minorticks_off()
        t.set_xlabel("kv_len")
        t.set_ylabel("us")
        t.legend(fontsize=7, loc="upper left")
        self.note = t.text(0.98, 0.04, "", transform=t.transAxes, fontsize=7, ha="right")
        self.time_title = t.set_title("", fontsize=9)

    def layers(self, v: dict) -> list:
        return [(None, [*self.share, self.share_title, *self.cache, self.cache_title,
                        self.sm_image, self.sm_title, self.curve, self.flash2, self.points,
                        self.here, self.note, self.time_title, self.sup])]

    def update(self, v: dict) -> None:
        total = sum(v["bytes_by_kind"].values())
        for bar, kind in zip(self.share, BYTE_KINDS):
            bar.set_width(100 * v["bytes_by_kind"].get(kind, 0) / total)
        self.share_title.set_text(f"{format_bytes(v['bytes_per_token'])} per generated "
                                  "token (one layer)")
        for bar, kind in zip(self.cache, CACHE_KINDS):
            bar.set_height(v["cache_bytes_per_token"][kind])
            bar.set_color("#d62728" if kind == v["kind"] else "#bbbbbb")
        self.cache_title.set_text(f"cache: {format_bytes(v['cache_bytes_per_seq'])} per "
                                  "sequence per layer")
        grid = np.zeros(-(-v["sms"] // self.cols) * self.cols)
        grid[:len(v["sm_blocks"][0])] = v["sm_blocks"][0]
        self.sm_image.set_data(grid.reshape(-1, self.cols))
        self.sm_image.set_clim(0, max(1, grid.max()))
        self.sm_title.set_text(f"blocks per SM: {v['busy_sms']} of {v['sms']} SMs busy")
        cv = v["curve"]
        self.curve.set_data(cv["kv_len"], np.array(cv["time_s"]) * 1e6)
        self.curve.set_label(v["algorithm"])
        f2 = cv["flash2_s"]
        self.flash2.set_data(cv["kv_len"] if f2 else [], np.array(f2) * 1e6 if f2 else [])
        pts = v["measured"]
        self.points.set_data([m["kv_len"] for m in pts], [m["time_s"] * 1e6 for m in pts])
        self.note.set_text(f"{len(pts)} measured points" if pts else "measured: not yet")
        self.here.set_xdata([v["kv_len"], v["kv_len"]])
        self.time_title.set_text(f"predicted {v['time_s'] * 1e6:.1f} us, "
                                 f"{v['tbps']:.2f} TB/s of K/V")
        self.sup.set_text(f"{v['kind'].upper()}, {v['heads']} heads / {v['kv_heads']} KV "
                          f"heads, batch {v['batch']}, kv_len {v['kv_len']:,}, "
                          f"{v['splits']} splits"
                          + (f", pages of {v['page_size']}" if v["page_size"] else ""))


def decode_panel(kv_len: int = 32768, batch: int = 1, heads: int = 32, kv_heads: int = 8,
                 page_size: int = 0, splits: int = 0):
    """Notebook 08: sliders on context length, batch, query heads, KV heads (MHA, GQA,
    MQA, MLA), page size and splits."""
    import ipywidgets as W

    from .widgets import Panel, _style

    def sel(options, value, description):
        return W.SelectionSlider(options=list(options), value=value, description=description,
                                 style=_style(), continuous_update=False)

    return Panel(decode_view, DecodePicture, {
        "kv_len": sel(KV_LENS, kv_len, "context kv_len"),
        "batch": sel(BATCHES, batch, "batch"),
        "heads": sel(HEADS, heads, "query heads"),
        "kv_heads": sel(KV_HEADS, kv_heads, "KV heads"),
        "page_size": sel(PAGE_SIZES, page_size, "page size"),
        "splits": sel(SPLITS, splits, "splits"),
    }, figsize=(10.0, 6.4))


# ------------------------------------------------------------- tables the notebook prints

def intensity_table(kv_len: int = 32768, heads: int = 128, head_dim: int = 128,
                    dtype: str = "bf16", gpu: str = DEFAULT_GPU) -> list[dict]:
    """MHA, GQA (8 KV heads), MQA and MLA of one model width at q_len 1, batch 1: cache
    bytes per token, requested bytes, FLOPs per byte and predicted time."""
    rows = []
    for kind, kvh in (("MHA", 0), ("GQA-8", 8), ("MQA", 1), ("MLA", -1)):
        p = make_plan(kv_len, 1, heads, kvh, 0, 0, 1, head_dim, dtype, gpu)
        rep = p.count()
        rows.append({"kind": kind, "kv_heads": p.kv_heads, "qk_dim": p.head_dim,
                     "cache_bytes_per_token": rep.kv_bytes // kv_len // max(
                         1, p.group_rows // p.block_rows),
                     "requested_bytes": rep.requested_bytes,
                     "flops_per_byte": rep.flops / rep.requested_bytes,
                     "time_s": p.predict_seconds()})
    return rows


def format_intensity(rows: list[dict]) -> str:
    head = (f"{'cache':<7}{'KV heads':>9}{'QK dims':>8}{'cache B/token':>14}"
            f"{'bytes moved':>14}{'FLOP/B':>8}{'predicted':>12}")
    return "\n".join([head, "-" * len(head)] + [
        f"{r['kind']:<7}{r['kv_heads']:>9}{r['qk_dim']:>8}{r['cache_bytes_per_token']:>14,}"
        f"{format_bytes(r['requested_bytes']):>14}{r['flops_per_byte']:>8.1f}"
        f"{r['time_s'] * 1e6:>10.1f}us" for r in rows])


def gqa_table(kv_len: int = 32768, heads: int = 32, kv_heads: int = 8, batch: int = 8,
              head_dim: int = 128, dtype: str = "fp16", gpu: str = DEFAULT_GPU) -> list[dict]:
    """flash2 over the cache with one block per query head against pack-GQA: K/V bytes
    requested, what the L2 model lets through to DRAM, and the predicted time."""
    from ..hardware import l2
    rows = []
    for pack in (False, True):
        p = decode.plan("flash2", q_len=1, kv_len=kv_len, head_dim=head_dim, heads=heads,
                        kv_heads=kv_heads, batch=batch, dtype=dtype, gpu=gpu, gqa_pack=pack)
        rep = p.count()
        rep.l2 = l2.simulate(p.engine_view())
        rows.append({"schedule": "pack-GQA" if pack else "per query head",
                     "blocks": p.predict()[0].blocks, "kv_bytes": rep.kv_bytes,
                     "dram_bytes": rep.dram_bytes, "time_s": rep.predicted_time_s})
    return rows


def format_gqa(rows: list[dict]) -> str:
    head = f"{'schedule':<16}{'blocks':>7}{'K/V requested':>15}{'DRAM (L2 model)':>17}{'time':>11}"
    return "\n".join([head, "-" * len(head)] + [
        f"{r['schedule']:<16}{r['blocks']:>7}{format_bytes(r['kv_bytes']):>15}"
        f"{format_bytes(r['dram_bytes']):>17}{r['time_s'] * 1e6:>9.1f}us" for r in rows])


def fragmentation_table(kv_lens=(100, 3000, 517, 12000, 40), page_sizes=(1, 16, 64, 256),
                        heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                        dtype: str = "fp16", capacity: int = 32768) -> list[dict]:
    """KV-cache memory of a ragged batch (one layer): a contiguous cache reserving
    ``capacity`` tokens per sequence against pages of each size; and the block table's
    bytes per decode step."""
    row = mla.cache_bytes_per_token("gqa", heads, head_dim, kv_heads, dtype_bytes(dtype))
    out = []
    for P in page_sizes:
        f = paged.fragmentation(kv_lens, P, row, capacity)
        p = decode.plan("paged", q_len=1, kv_lens=list(kv_lens), head_dim=head_dim,
                        heads=heads, kv_heads=kv_heads, dtype=dtype, page_size=P)
        table = sum(t["read_bytes"] for n, t in p.count().per_tensor.items()
                    if n.startswith("block_table"))
        out.append({"page_size": P, **f, "table_bytes": table})
    return out


def format_fragmentation(rows: list[dict]) -> str:
    r0 = rows[0]
    lines = [f"tokens' bytes {format_bytes(r0['used'])}; contiguous cache "
             f"{format_bytes(r0['contiguous'])} (waste {format_bytes(r0['contiguous_waste'])})",
             f"{'page':>6}{'paged memory':>14}{'waste':>12}{'table read/step':>17}"]
    lines += [f"{r['page_size']:>6}{format_bytes(r['paged']):>14}"
              f"{format_bytes(r['paged_waste']):>12}{r['table_bytes']:>15,} B" for r in rows]
    return "\n".join(lines)


def measured_table(gpu: str = DEFAULT_GPU, dirty_bytes: int | None = None) -> list[dict]:
    """Our kernel's committed points (the fastest variant of each shape) beside flashsim's
    prediction for the same configuration: the point's splits, B_c, warps, rows per block
    (the kernel's: all q_len x group rows of a KV head up to 16 rows a warp, else blocks of 16
    warps' rows, as ``gpu_kernels.cupy.decode``'s plan_block_rows) and where its splits merged
    (the row's "fused": in the split launch, ``fused_combine``), from the L2 the benchmark's
    flush leaves (``flush_dirty_bytes``; or ``dirty_bytes`` when given: 0, a clean L2);
    empty until the data exist."""
    dirty = flush_dirty_bytes() if dirty_bytes is None else dirty_bytes
    out = []
    for pt in ours_fastest(measurements()):
        warps = pt.get("warps", 4)
        rows = pt["q_len"] * pt["heads"] // pt["kv_heads"]
        try:
            p = decode.plan("paged" if pt.get("page_size") else "flashdecoding",
                            q_len=pt["q_len"], kv_len=pt["kv_len"], head_dim=pt["head_dim"],
                            heads=pt["heads"], kv_heads=pt["kv_heads"], batch=pt["batch"],
                            dtype=point_dtype(pt), page_size=pt.get("page_size") or None,
                            splits=pt.get("splits") or "auto", block_cols=pt.get("block_cols"),
                            block_rows=min(rows, 16 * warps), warps=warps, gpu=gpu,
                            fused_combine=bool(pt.get("fused")))
        except FlashsimError:
            continue
        out.append({**pt, "predicted_s": p.predict_seconds(dirty_bytes=dirty)})
    return out


def measured_picture(fig, rows: list[dict]) -> None:
    """Measured against predicted time, one mark per point of ``measured_table`` (contiguous
    and paged), the diagonal where they agree."""
    ax = fig.subplots()
    for paged_, marker, label in ((False, "o", "contiguous"), (True, "^", "paged")):
        sel = [r for r in rows if bool(r.get("page_size")) == paged_]
        ax.plot([r["predicted_s"] * 1e6 for r in sel], [r["time_s"] * 1e6 for r in sel],
                marker, ms=4, alpha=0.7, label=f"{label} ({len(sel)} points)")
    lo, hi = 1.0, 1e5
    ax.plot([lo, hi], [lo, hi], "-", color="#999999", lw=0.8, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("flashsim's predicted time (us)")
    ax.set_ylabel("measured on the H200 (us)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("our decode kernel: measured vs predicted" if rows else
                 measured_note(), fontsize=9)


def format_measured(rows: list[dict]) -> str:
    if not rows:
        return measured_note()
    head = (f"{'impl':<18}{'B':>4}{'kvh':>5}{'kv_len':>8}{'q':>3}{'page':>5}"
            f"{'measured':>11}{'TB/s':>6}{'predicted':>11}{'check':>7}")
    return "\n".join([head, "-" * len(head)] + [
        f"{r['impl']:<18}{r['batch']:>4}{r['kv_heads']:>5}{r['kv_len']:>8}{r['q_len']:>3}"
        f"{r.get('page_size') or '-':>5}{r['time_s'] * 1e6:>9.1f}us{r['tbps']:>6.2f}"
        f"{r['predicted_s'] * 1e6:>9.1f}us{'ok' if r['check_ok'] else 'FAIL':>7}"
        for r in rows])


# ---------------------------------------------------------------------- one step, block by block
TIMELINE = "decode_timeline_h200.json"
# decode_split's stamps (decode.cu's TIMELINE) between which a block's time is drawn
PHASES = (("entry_ns", "issued_ns", "start: kv_len, barriers, issue", "#999999"),
          ("issued_ns", "first_tile_ns", "first tile in flight", "#e69f00"),
          ("first_tile_ns", "loop_end_ns", "loop: a tile computed, the next in flight", "#0072b2"),
          ("loop_end_ns", "exit_ns", "after the loop: O, L (or the merge)", "#009e73"))


def timeline_runs(batch: int = 8, kv_heads: int = 1, kv_len: int = 32768, q_len: int = 1,
                  impl: str = "cupy_decode", config: str | None = "defaults", grid=None,
                  flush: str = "dirty") -> dict | None:
    """One row of --timeline's committed run (``benchmarks/decode_h200.py``): the stamps of
    its run of median event time (ns from its first block's start, one entry per block) and
    that run's ``timeline_summary``; None where it was not measured."""
    from .. import measured
    try:
        data = measured.load(TIMELINE)
    except FileNotFoundError:
        return None
    for r in data.get("timeline", []):
        if ((r["batch"], r["kv_heads"], r["kv_len"], r["q_len"], r["impl"], r.get("flush"))
                == (batch, kv_heads, kv_len, q_len, impl, flush)
                and (config is None or r.get("config") == config)
                and (grid is None or r.get("grid") == list(grid))):
            return {**r, "run": r["runs"][len(r["runs"]) // 2]}
    return None


def timeline_picture(fig, batch: int = 8, kv_heads: int = 1, kv_len: int = 32768,
                     q_len: int = 1) -> None:
    """Our step's decode_split blocks (the defaults, after the table's flush), one line each
    in order of start, coloured by PHASES; beside it the plain read whose blocks each stream
    one contiguous chunk, one block an SM with 64 KB in flight (as ours), from start to end."""
    ours = timeline_runs(batch, kv_heads, kv_len, q_len)
    read = timeline_runs(batch, kv_heads, kv_len, q_len, "plain_read_chunked", None, (128, 512))
    axes = fig.subplots(1, 2, sharex=True)
    if ours is None:
        axes[0].set_title(f"not measured yet ({TIMELINE})", fontsize=9)
        return
    st = ours["stamps"]
    order = sorted(range(len(st["entry_ns"])), key=lambda i: st["entry_ns"][i])
    for a, b, label, colour in PHASES:
        ys = [y for y, i in enumerate(order) if st[a][i] is not None and st[b][i] is not None]
        axes[0].hlines(ys, [st[a][order[y]] / 1e3 for y in ys], [st[b][order[y]] / 1e3 for y in ys],
                       colors=colour, lw=1.2, label=label)
    axes[0].set_title(f"ours: {ours['run']['event_ns'] / 1e3:.1f} us between the events, "
                      f"{ours['splits']} splits", fontsize=8)
    axes[0].set_ylabel("decode_split blocks, by start")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.subplots_adjust(bottom=0.33, top=0.9)
    if read is not None:
        rs = read["stamps"]
        ys = range(len(rs["entry_ns"]))
        axes[1].hlines(list(ys), [x / 1e3 for x in rs["entry_ns"]], [x / 1e3 for x in rs["exit_ns"]],
                       colors="#cc79a7", lw=1.2)
        axes[1].set_title(f"plain read, 64 KB in flight an SM: {read['run']['event_ns'] / 1e3:.1f} us",
                          fontsize=8)
    for ax in axes:
        ax.set_xlabel("us from the first block's start")
