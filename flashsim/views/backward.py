"""Recomputation: the backward pass trades FLOPs for bytes (notebook 07's logic).

Standard attention keeps the N x N matrix P in HBM from the forward pass to the backward
pass, and its backward writes and reads two more (dP, dS). FlashAttention keeps only O and
the softmax statistics, O(N), and recomputes each tile of P from Q_i, K_j and those
statistics: one more matmul per tile (10 N^2 d FLOPs in the backward instead of 8), far
fewer bytes. Everything here is computed from flashsim's plans (closed forms, which
``tests/test_backward.py`` holds equal to the counted traffic):

    rows = fwd_bwd_rows(1024, 64, batch=64, heads=16, dtype="fp16", gpu="a100-40gb")
    print(format_rows(rows))
    print(format_figure2(figure2()))         # the paper's Figure 2 (left) beside the model
    panel = recomputation_panel()            # a slider on N (notebooks; needs ipywidgets)
"""

from __future__ import annotations

import functools
import json
import pathlib

import numpy as np

from .. import measured
from ..measured import papers
from ..plan import plan
from ..hardware.presets import DEFAULT_GPU, GPUS, gpu as _gpu, roofline_time
from ..units import format_bytes

ALGS = ("standard", "flash1", "flash2")
MEASUREMENTS = measured.path("backward_h200.json")

FIGURE2_SHAPE = {"seq_len": 1024, "head_dim": 64, "heads": 16, "batch": 64}


def fwd_bwd_rows(seq_len: int, head_dim: int, *, batch: int = 1, heads: int = 1,
                 dtype: str = "fp16", gpu: str = DEFAULT_GPU, sram=None, causal: bool = False,
                 extra_passes=(), placement: str | None = None, mask=None,
                 dropout: float = 0.0, algorithms=ALGS) -> list[dict]:
    """One row per algorithm: forward and backward bytes requested from the level below
    SRAM and FLOPs (the backward's tiles, shared by both passes), what is saved between
    them, and the roofline time on ``gpu`` from those bytes. ``extra_passes`` apply to
    standard attention only; ``placement`` as for :func:`flashsim.plan` (default: buffers
    placed as kernels place them, since a preset applies); ``mask``, ``dropout`` as for
    :func:`flashsim.plan` (``algorithms`` then among standard and flash2)."""
    preset = _gpu(gpu)
    rows = []
    for alg in algorithms:
        passes = tuple(extra_passes) if alg == "standard" else ()
        kw = dict(batch=batch, heads=heads, dtype=dtype, gpu=gpu, sram=sram, causal=causal,
                  extra_passes=passes, placement=placement, mask=mask, dropout=dropout)
        both = plan(alg, seq_len, head_dim, pass_="fwd+bwd", **kw)
        kw.update(block_rows=both.block_rows, block_cols=both.block_cols)
        fwd = plan(alg, seq_len, head_dim, **kw).closed_form()
        bwd = plan(alg, seq_len, head_dim, pass_="bwd", **kw).closed_form()
        total = fwd.hbm_bytes + bwd.hbm_bytes
        flops = fwd.flops + bwd.flops
        saved = both.saved_for_backward()
        rows.append({
            "algorithm": alg, "extra_passes": list(passes),
            "block_rows": both.block_rows, "block_cols": both.block_cols,
            "fwd_bytes": fwd.hbm_bytes, "bwd_bytes": bwd.hbm_bytes, "hbm_bytes": total,
            "fwd_flops": fwd.flops, "bwd_flops": bwd.flops, "flops": flops,
            "saved_bytes": sum(saved.values()), "saved": saved,
            "time_s": roofline_time(total, flops, preset, dtype),
        })
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows as one fixed-format table."""
    head = (f"{'':<22}" + "".join(f"{r['algorithm']:>18}" for r in rows))

    def line(label, fmt):
        return f"{label:<22}" + "".join(f"{fmt(r):>18}" for r in rows)

    return "\n".join([
        head, "-" * len(head),
        line("B_r x B_c", lambda r: f"{r['block_rows']} x {r['block_cols']}"),
        line("HBM bytes, forward", lambda r: format_bytes(r["fwd_bytes"])),
        line("HBM bytes, backward", lambda r: format_bytes(r["bwd_bytes"])),
        line("HBM bytes, fwd+bwd", lambda r: format_bytes(r["hbm_bytes"])),
        line("GFLOP, fwd+bwd", lambda r: f"{r['flops'] / 1e9:,.1f}"),
        line("FLOPs vs standard", lambda r: f"{r['flops'] / rows[0]['flops']:.3f}x"),
        line("bytes vs standard", lambda r: f"{r['hbm_bytes'] / rows[0]['hbm_bytes']:.3f}x"),
        line("kept for backward", lambda r: format_bytes(r["saved_bytes"])),
        line("roofline time (ms)", lambda r: f"{r['time_s'] * 1e3:.3f}"),
    ])


def memory_view(seq_len: int = 1024, head_dim: int = 64, batch: int = 64, heads: int = 16,
                dtype: str = "fp16", gpu: str = DEFAULT_GPU, causal: bool = False,
                sizes=tuple(2**k for k in range(8, 17))) -> dict:
    """What notebook 07's slider shows: over sequence lengths ``sizes`` (and ``seq_len``),
    the bytes kept between the passes and the fwd+bwd roofline time of each algorithm; the
    rows at ``seq_len``; and the GPU's memory capacity for scale."""
    sizes = sorted(set(int(n) for n in sizes) | {int(seq_len)})
    per = {n: _rows(n, head_dim, batch, heads, dtype, gpu, causal) for n in sizes}
    capacity = _gpu(gpu).hbm_capacity
    return {
        "seq_len": int(seq_len), "head_dim": head_dim, "batch": batch, "heads": heads,
        "dtype": dtype, "gpu": GPUS[gpu].name, "causal": causal, "sizes": np.array(sizes),
        "saved": {a: np.array([per[n][k]["saved_bytes"] for n in sizes])
                  for k, a in enumerate(ALGS)},
        "time": {a: np.array([per[n][k]["time_s"] for n in sizes]) for k, a in enumerate(ALGS)},
        "rows": per[int(seq_len)], "capacity_bytes": capacity,
    }


@functools.lru_cache(maxsize=512)
def _rows(*args) -> tuple:
    """fwd_bwd_rows, remembered: a slider revisits the same sizes (read only)."""
    N, d, batch, heads, dtype, gpu, causal = args
    return tuple(fwd_bwd_rows(N, d, batch=batch, heads=heads, dtype=dtype, gpu=gpu,
                              causal=causal))


def figure2(gpu: str = "a100-40gb", causal: bool = False) -> dict:
    """The paper's Figure 2 (left) configuration through the simulator (fp16, forward +
    backward, the paper's two-level model and block rules on the preset's M), beside the
    paper's own A100 figures in both published versions, which are quoted, not computed.

    ``flop_units`` = N^2 d x batch x heads, the unit the paper's GFLOPs come close to:
    flashsim counts 2 FLOPs per multiply-add of every matmul, 12 such units for standard
    attention's forward + backward (4 + 8) and 14 for FlashAttention's (4 + 10), while the
    paper prints 66.6 and 75.2 GFLOPs, about 1.0 and 1.1 units. The paper does not state
    its convention, so the factor of about 12 is reported, not explained away."""
    shape = dict(FIGURE2_SHAPE)
    N, d = shape.pop("seq_len"), shape.pop("head_dim")
    kw = dict(dtype="fp16", gpu=gpu, causal=causal, placement="two-level", **shape)
    plain = fwd_bwd_rows(N, d, **kw)
    eager = fwd_bwd_rows(N, d, extra_passes=("scale", "mask"), **kw)[0]
    eager["algorithm"] = "standard +scale,mask"
    units = N * N * d * FIGURE2_SHAPE["batch"] * FIGURE2_SHAPE["heads"]
    return {"papers": list(papers.FLASHATTENTION_FIGURE2_VERSIONS), "gpu": GPUS[gpu].name,
            "causal": causal, "rows": [plain[0], eager, plain[1], plain[2]],
            "flop_units": units}


def format_figure2(fig: dict) -> str:
    out = []
    for p in fig["papers"]:
        out += [f"Quoted from {p['source']} ({p['version']}):", f"  \"{p['caption']}\"",
                f"  {'':<16}{'GFLOPs':>10}{'HBM R/W (GB)':>14}{'runtime (ms)':>14}"]
        for key, name in (("standard", "standard"), ("flash", "FlashAttention")):
            v = p[key]
            out.append(f"  {name:<16}{v['gflops']:>10}{v['hbm_rw_gb']:>14}"
                       f"{v['runtime_ms']:>14}")
        out.append("")
    u = fig["flop_units"]
    out += [f"flashsim, same shape, fp16, {fig['gpu']} preset, two-level model"
            f"{', causal' if fig['causal'] else ''} (GB = 10^9 bytes; requested from the "
            f"level below SRAM):",
            f"  {'':<22}{'B_r x B_c':>11}{'GFLOP':>9}{'/ N^2 d B H':>12}{'GB':>8}"
            f"{'roofline (ms)':>15}"]
    for r in fig["rows"]:
        out.append(f"  {r['algorithm']:<22}{r['block_rows']:>5} x {r['block_cols']:<3}"
                   f"{r['flops'] / 1e9:>9.1f}{r['flops'] / u:>12.2f}{r['hbm_bytes'] / 1e9:>8.2f}"
                   f"{r['time_s'] * 1e3:>15.2f}")
    p = fig["papers"][0]
    out.append(f"  the paper's GFLOPs / N^2 d B H: standard {p['standard']['gflops'] * 1e9 / u:.2f}"
               f", FlashAttention {p['flash']['gflops'] * 1e9 / u:.2f} (N^2 d B H = "
               f"{u / 1e9:.1f} G)")
    return "\n".join(out)


# How each version's Figure 2 (left) is run here: the NeurIPS caption's "key-padding mask
# and no dropout"; the arXiv v2 caption states neither, so the paper's own benchmark setting
# (Section 4.3: "with dropout and a padding mask") at GPT-2's attention dropout, 0.1. The
# padding mask hides no key (every sequence is 1024 long; the paper gives no lengths), so
# FlashAttention skips nothing and the baseline still reads the dense mask.
FIGURE2_SETTINGS = {"arXiv v2": {"mask": "padding:1024", "dropout": 0.1},
                    "NeurIPS 2022": {"mask": "padding:1024", "dropout": 0.0}}
FIGURE2_EAGER = ("scale", "mask")       # S / sqrt(d) and masked_fill as separate passes


def figure2_paper(gpu: str = "a100-40gb") -> list[dict]:
    """Figure 2 (left) in each paper version's own configuration (``FIGURE2_SETTINGS``),
    through the simulator (fp16, forward + backward, the two-level model on the preset's M),
    beside that version's quoted figures. Rows: standard attention whose softmax reads the
    dense N x N boolean mask (a fused masked softmax), the eager pipeline with separate scale
    and masked_fill passes (``FIGURE2_EAGER``), both with a separate dropout pass storing its
    keep mask when the setting has dropout; FlashAttention-2 counted with the mask and dropout
    fused; and FlashAttention (flash1, which takes no mask here) counted without them, which
    for this setting is the same count: the padding mask hides no key, so no tile is skipped,
    and fused dropout moves no byte (``flash2`` with and without shows it)."""
    shape = dict(FIGURE2_SHAPE)
    N, d = shape.pop("seq_len"), shape.pop("head_dim")
    kw = dict(dtype="fp16", gpu=gpu, placement="two-level", **shape)
    out = []
    for paper in papers.FLASHATTENTION_FIGURE2_VERSIONS:
        setting = dict(FIGURE2_SETTINGS[paper["version"]])
        drop = ",dropout" if setting["dropout"] else ""
        fused, fa2 = fwd_bwd_rows(N, d, algorithms=("standard", "flash2"), **setting, **kw)
        eager = fwd_bwd_rows(N, d, algorithms=("standard",), extra_passes=FIGURE2_EAGER,
                             **setting, **kw)[0]
        fa1 = fwd_bwd_rows(N, d, algorithms=("flash1",), **kw)[0]
        fused["label"] = f"standard, masked softmax{drop}"
        eager["label"] = f"standard +scale,mask{drop}"
        fa2["label"] = "FlashAttention-2, fused"
        fa1["label"] = "FlashAttention (no mask: same)"
        out.append({"paper": paper, "setting": setting, "gpu": GPUS[gpu].name,
                    "rows": [fused, eager, fa1, fa2]})
    return out


def format_figure2_paper(runs: list[dict]) -> str:
    out = []
    for run in runs:
        p, s = run["paper"], run["setting"]
        said = p["mask_dropout"] or f"not in the caption; run {p['benchmarks_setting']}"
        out += [f"{p['version']} ({p['source']})",
                f"  mask and dropout: {said}",
                f"  flashsim: mask {s['mask']}, dropout {s['dropout']:g}, {run['gpu']} "
                "preset, two-level model (GB = 10^9 B)",
                f"  {'':<34}{'GB':>8}{'roofline ms':>13}   paper: GB, ms"]
        for r in run["rows"]:
            key = "standard" if r["algorithm"] == "standard" else "flash"
            out.append(f"  {r['label']:<34}{r['hbm_bytes'] / 1e9:>8.2f}"
                       f"{r['time_s'] * 1e3:>13.2f}   {p[key]['hbm_rw_gb']}, "
                       f"{p[key]['runtime_ms']}")
        out.append("")
    return "\n".join(out).rstrip()


def measurements(path=None) -> list[dict]:
    """The committed H200 measurements of the backward kernels
    (``benchmarks/results/backward_h200.json``), or [] when there are none."""
    path = pathlib.Path(path) if path is not None else MEASUREMENTS
    if not path.is_file():
        return []
    return json.loads(path.read_text()).get("points", [])


def format_measurements(points: list[dict]) -> str:
    """Measured time beside the model's bytes and roofline time, one line per point."""
    if not points:
        return "no H200 measurements committed (benchmarks/results/backward_h200.json)"
    out = [f"{'implementation':<21}{'shape (B,H,N,d)':>20}{'causal':>7}{'measured ms':>13}"
           f"{'model GB':>10}{'roofline ms':>13}"]
    for p in points:
        shape = f"{p['batch']},{p['heads']},{p['N']},{p['d']}"
        model = p.get("flashsim_hbm_bytes")
        out.append(f"{p['impl']:<21}{shape:>20}{('yes' if p['causal'] else 'no'):>7}"
                   f"{p['time_ms']:>13.2f}"
                   + (f"{model / 1e9:>10.2f}{p['roofline_time_ms']:>13.2f}" if model else
                      f"{'-':>10}{'-':>13}"))
    return "\n".join(out)
