"""Beyond one GPU: context parallelism's timeline and bytes (notebook 11's logic).

Everything is computed by :mod:`flashsim.context_parallel` (closed forms, which
``tests/test_context_parallel.py`` holds equal to the counted kernels):

    v = timeline_view(devices=4, seq_len=65536, link="450", schedule="ring", causal=True)
    v["idle_fraction"]        # per device: the share of the run it waits
    panel = timeline_panel()  # sliders: devices, N, link bandwidth; schedule, mask
"""

from __future__ import annotations

import functools

import numpy as np

from .. import context_parallel as cpm
from ..hardware.presets import DEFAULT_GPU, gpu as _gpu
from ..plan import plan

DEVICES = (1, 2, 3, 4, 6, 8)
SEQ_LENS = tuple(2**k for k in range(12, 21))           # 4096 .. 1,048,576
# One direction of one link, GB/s: PCIe 4 and 5 x16, NVLink 3 (A100), NVLink 4 (H100/H200),
# NVLink 5 (B200: 1.8 TB/s both directions); the labels say which.
LINK_GBPS = {"32": "PCIe 4.0 x16", "64": "PCIe 5.0 x16", "300": "NVLink 3",
             "450": "NVLink 4", "900": "NVLink 5"}


def timeline_view(devices: int = 4, seq_len: int = 65536, link: str = "450",
                  schedule: str = "ring", causal: bool = True, head_dim: int = 128,
                  heads: int = 32, batch: int = 1, dtype: str = "bf16",
                  gpu: str = DEFAULT_GPU, efficiency: float = 1.0) -> dict:
    """One forward pass spread over ``devices``: when each computes and each transfer runs,
    how long each idles, and the bytes through each device's HBM against those over the
    links. ``link``: one direction's GB/s, a key of :data:`LINK_GBPS`."""
    if str(link) not in LINK_GBPS:
        raise cpm.FlashsimError(f"link {link!r}: choose one of {', '.join(LINK_GBPS)} GB/s")
    bw = float(link) * 1e9
    base = plan("flash2", seq_len, head_dim, batch=batch, heads=heads, dtype=dtype,
                causal=causal, gpu=gpu)
    cp = cpm.cp_plan(base, devices, schedule)
    tl = cp.timeline(link_bandwidth=bw, efficiency=efficiency)
    rep = cp.closed_form()
    one = base.closed_form()
    t_one = max(one.hbm_bytes / _gpu(gpu).hbm_bandwidth,
                one.flops / (efficiency * _gpu(gpu).peak_flops(dtype)))
    return {
        "devices": devices, "seq_len": seq_len, "schedule": schedule, "causal": causal,
        "layout": cp.layout, "comm": cp.comm, "head_dim": head_dim, "heads": heads,
        "dtype": dtype, "gpu": gpu, "link_gbps": float(link), "link_name": LINK_GBPS[str(link)],
        "rows": [cp.rows(p) for p in range(devices)],
        "compute": tl.compute, "transfers": [(t.src, t.dst, t.step, a, b)
                                             for t, a, b in tl.transfers],
        "total_s": tl.total_s, "busy_s": tl.busy_s,
        "idle_fraction": [1 - b / tl.total_s for b in tl.busy_s],
        "overlapped": tl.overlapped, "one_device_s": t_one,
        "speedup": t_one / tl.total_s,
        "hbm_bytes": rep.hbm_bytes_per_device,
        "link_send_bytes": [d.send_bytes for d in rep.devices],
        "link_bytes": rep.link_bytes,
        "min_rows_for_overlap": cpm.min_rows_for_overlap(gpu, dtype, efficiency=efficiency,
                                                         link_bandwidth=bw),
    }


def schedules_table(devices: int = 4, seq_len: int = 65536, link: str = "450",
                    causal: bool = True, **kw) -> list[dict]:
    """One row per schedule: time, the most idle device's share, link and HBM bytes."""
    rows = []
    for s in cpm.SCHEDULES:
        v = timeline_view(devices, seq_len, link, s, causal, **kw)
        rows.append({"schedule": s, "total_ms": v["total_s"] * 1e3,
                     "max_idle": max(v["idle_fraction"]), "overlapped": v["overlapped"],
                     "link_bytes": v["link_bytes"], "hbm_bytes_max": max(v["hbm_bytes"]),
                     "speedup": v["speedup"]})
    return rows


def format_schedules(rows: list[dict]) -> str:
    head = f"{'schedule':<10}{'time (ms)':>11}{'vs 1 GPU':>10}{'most idle':>11}" \
           f"{'hidden':>8}{'link bytes':>16}{'max HBM bytes':>16}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['schedule']:<10}{r['total_ms']:>11.3f}{r['speedup']:>9.2f}x"
                     f"{r['max_idle']:>11.0%}{'yes' if r['overlapped'] else 'no':>8}"
                     f"{r['link_bytes']:>16,}{r['hbm_bytes_max']:>16,}")
    return "\n".join(lines)


def describe(v: dict) -> str:
    """One line from a view, for the notebook to print from the widget state."""
    idle = ", ".join(f"{x:.0%}" for x in v["idle_fraction"])
    return (f"{v['schedule']} on {v['devices']} devices, N = {v['seq_len']:,}"
            f"{' causal' if v['causal'] else ''}, {v['link_name']} ({v['link_gbps']:.0f} GB/s "
            f"one way): {v['total_s'] * 1e3:.2f} ms ({v['speedup']:.2f}x one GPU); idle "
            f"{idle}; transfers {'hidden' if v['overlapped'] else 'NOT hidden'} (an unmasked "
            f"step hides its transfer from {v['min_rows_for_overlap']:,.0f} rows per device; "
            f"here {min(v['rows']):,})")


def timeline_panel(devices: int = 4, seq_len: int = 65536, link: str = "450",
                   schedule: str = "ring", causal: bool = True):
    """Notebook 11: sliders on devices, N and link bandwidth; the schedule and the mask."""
    import ipywidgets as W

    from . import pictures
    from .widgets import Panel, _style
    # The view is a pure function of the controls: cached, and the points one slider step
    # from the start computed before the panel shows, so a move answers at once.
    view = functools.lru_cache(maxsize=256)(timeline_view)
    start = dict(devices=devices, seq_len=seq_len, link=link, schedule=schedule, causal=causal)
    for key, grid in (("devices", DEVICES), ("seq_len", SEQ_LENS), ("link", tuple(LINK_GBPS))):
        i = grid.index(start[key])
        for j in (i - 1, i + 1):
            if 0 <= j < len(grid):
                view(**{**start, key: grid[j]})
    return Panel(view, pictures.TimelinePicture, {
        "devices": W.SelectionSlider(options=list(DEVICES), value=devices,
                                     description="devices P", style=_style()),
        "seq_len": W.SelectionSlider(options=list(SEQ_LENS), value=seq_len,
                                     description="N", style=_style()),
        "link": W.SelectionSlider(options=list(LINK_GBPS), value=link,
                                  description="link GB/s (one way)", style=_style()),
        "schedule": W.Dropdown(options=list(cpm.SCHEDULES), value=schedule,
                               description="schedule"),
        "causal": W.Checkbox(value=causal, description="causal"),
    }, figsize=(10.0, 4.4))


def measurements() -> list[dict]:
    """The two-GPU ring measurements (``benchmarks/ring_attention.py``) if committed, else
    []: an unmeasured point is absent."""
    from .. import measured
    try:
        return measured.load("ring_attention_h200x2.json")["points"]
    except FileNotFoundError:
        return []


def link_share(v: dict) -> np.ndarray:
    """Per device: bytes it sends over the link as a share of the bytes through its HBM."""
    return np.array(v["link_send_bytes"]) / np.array(v["hbm_bytes"])
