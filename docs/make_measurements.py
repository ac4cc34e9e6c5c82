"""Write docs/measurements.md from the committed data in flashsim/measured/data/.

    python docs/make_measurements.py

Every number in that page comes from a JSON file written by a benchmark script; nothing is
typed by hand. A test regenerates the page and fails if the committed copy differs.
"""

from __future__ import annotations

import bisect
import csv
import io
import pathlib
import re
import statistics
import sys

from flashsim import measured

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "measurements.md"


def _load(name: str):
    return measured.load(name) if measured.path(name).exists() else None


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def _prov(p: dict) -> str:
    keys = ("gpu", "driver", "date", "date_utc", "command", "nvidia_smi", "processor")
    parts = [f"{k}: `{p[k]}`" for k in keys if p.get(k)]
    if p.get("packages"):
        parts.append("packages: " + ", ".join(f"{k} {v}" for k, v in p["packages"].items() if v))
    return "; ".join(parts)


def _section(lines, name: str, title: str):
    """The dataset ``name`` with its heading and provenance added to ``lines``, or None
    (and nothing added) when it is not committed."""
    d = _load(name)
    if d:
        lines += [f"## {title}", "", f"Provenance: {_prov(d['provenance'])}.", ""]
    return d


def _results(lines, name: str, title: str, header: list[str], row):
    """A section of one table, a row ``row(r)`` per entry r of the file's ``results``;
    returns the file's data (None, and nothing added, when it is not committed)."""
    d = _section(lines, name, title)
    if d:
        lines += _table(header, [row(r) for r in d["results"]])
        lines.append("")
    return d


def core(lines):
    d = _results(lines, "core_speed.json", "The simulator's speed (CPU)",
                 ["what", "median", "target", "met"],
                 lambda r: [r["what"], f"{r['seconds'] * 1e3:.1f} ms",
                            f"{r['target_s'] * 1e3:.0f} ms", "yes" if r["met"] else "no"])
    if not d:
        return
    if d.get("cli"):
        limit = d["provenance"].get("cli_memory_limit_bytes", 0) / 2**30
        lines += [f"The CLI, one fresh process per line under `/usr/bin/time -v` with a "
                  f"{limit:.0f} GiB address-space limit (wall time is longer on a loaded "
                  "machine: the 1-minute load average before each run is listed):", ""]
        lines += _table(
            ["what", "exit", "wall", "CPU", "peak memory", "target", "load", "met"],
            [[c["what"], str(c["exit_status"]), f"{c['wall_s']:.2f} s", f"{c['cpu_s']:.2f} s",
              f"{c['peak_rss_bytes'] / 2**20:.0f} MiB",
              f"< {c['target_wall_s']} s" + (f", < {c['target_peak_rss_bytes'] / 2**30:.0f} GiB"
                                              if c["target_peak_rss_bytes"] else ""),
              f"{c['load_average_1min_before']:.1f}", "yes" if c["met"] else "no"]
             for c in d["cli"]])
        lines.append("")


def slider(lines):
    _results(lines, "slider_latency.json", "Notebook slider latency (CPU: recompute + redraw)",
             ["view", "median", "p90", "met (< 100 ms)"],
             lambda r: [r["what"], f"{r['median_s'] * 1e3:.1f} ms", f"{r['p90_s'] * 1e3:.1f} ms",
                        "yes" if r["met"] else "no"])


def numba(lines):
    d = _section(lines, "numba_h200.json", "numba.cuda kernels, fp32 (H200)")
    if not d:
        return
    lines += [f"All correctness checks passed: {'yes' if d['all_checks_passed'] else 'no'}."]
    for f in d.get("failures", []):
        c = f["check"]
        lines.append(f"Failed check: {f['algorithm']} N={f['N']} d={f['d']}: max |O - ref| = "
                     f"{c['max_abs_error']:.3e} > tolerance {c['tolerance']:.3e} (2 x the fp32 "
                     "baseline's error + 2 ulp); the sweep stopped there, so later points are "
                     "absent.")
    lines.append("")
    rows = [r for r in d["results"] if not r["causal"]]
    rows.sort(key=lambda r: (r["d"], r["N"], r["algorithm"], r["variant"]))
    lines += _table(["d", "N", "algorithm", "tiles", "time", "TFLOP/s", "flashsim roofline"],
                    [[r["d"], r["N"], r["algorithm"], f"{r['variant']} {r['block_rows']}x{r['block_cols']}",
                      f"{r['time_ms']:.2f} ms", f"{r['tflops']:.1f}", f"{r['predicted_time_ms']:.2f} ms"]
                     for r in rows if "time_ms" in r])
    lines += ["", "Over the standard pipeline (time ratio; > 1: faster). Default tiles are "
              "flashsim's `fastest_blocks` for each kernel; square tiles are flashsim's SRAM "
              "rule at 48 KiB, which counts O_i and S_ij in SRAM where the kernel keeps them "
              "in registers:", ""]
    lines += _table(["N", "d", "FA2 default tiles", "FA2 square tiles", "FA1 / standard"],
                    [[s["N"], s["d"], f"{s['speedup']:.2f}",
                      f"{s['square_flash2_over_standard']:.2f}",
                      f"{s['flash1_over_standard']:.2f}"] for s in d["summary"]["flash2_over_standard"]])
    explored = d.get("thread_layouts") or []
    if explored:
        lines += ["", f"FA2 tiles explored at N = {explored[0]['N']} (best-scored thread layout "
                  "each):", ""]
        lines += _table(["d", "tiles", "threads TRxTC", "layout score", "time", "TFLOP/s"],
                        [[r["d"], f"{r['block_rows']}x{r['block_cols']}",
                          f"{r['threads']['TR']}x{r['threads']['TC']}", f"{r['score']:.2f}",
                          f"{r['time_ms']:.2f} ms", f"{r['tflops']:.1f}"] for r in explored])
    lines.append("")


def cupy(lines):
    d = _section(lines, "cupy_h200.json", "CuPy kernels beside PyTorch (H200)")
    if not d:
        return
    lines += ["Tensor-core FlashAttention-2 (ours, fp16) against PyTorch SDPA's flash backend "
              "in the same run (16k tokens, hidden 2048):", ""]
    lines += _table(["d", "N", "causal", "ours TFLOP/s", "torch flash TFLOP/s", "ratio"],
                    [[r["d"], r["N"], r["causal"], f"{r['ours_tflops']:.1f}",
                      f"{r['torch_flash_tflops']:.1f}", f"{r['ratio']:.2f}"]
                     for r in d["ratio_vs_torch_flash"]])
    lines += ["", "Every implementation at d = 128, no mask (TFLOP/s):", ""]
    impls = sorted({p["impl"] for p in d["points"]})
    Ns = sorted({p["N"] for p in d["points"]})
    by = {(p["impl"], p["N"]): p for p in d["points"] if p["d"] == 128 and not p["causal"]}
    lines += _table(["implementation"] + [str(n) for n in Ns],
                    [[i] + [f"{by[(i, n)]['tflops']:.1f}" if (i, n) in by else "" for n in Ns]
                     for i in impls])
    lines.append("")


def backward(lines):
    d = _section(lines, "backward_h200.json", "Backward pass (H200)")
    if not d:
        return
    lines += _table(["implementation", "N", "d", "causal", "time", "flashsim HBM bytes"],
                    [[p["impl"], p["N"], p["d"], p["causal"], f"{p['time_ms']:.2f} ms",
                      f"{p['flashsim_hbm_bytes']:,}" if p.get("flashsim_hbm_bytes") else ""]
                     for p in d["points"]])
    lines.append("")


def _f(x, spec=".2f"):
    return "" if x is None else format(x, spec)


def decode_done_when(d: dict) -> list[str]:
    """Issue 14's three kernel targets, each as the worst measured ratio over its points: for
    ours (the fastest configuration at each point) and, where the run marked them, for
    configure's defaults alone on the token-major cache (one configuration, chosen before
    timing: no maximum over many timings)."""
    rows = d["summary"]
    out = []
    for who, name in (("ours", "ours"), ("defaults", "the defaults alone (token-major)")):
        for what, pick, key, target in (
                (f"{name} / PyTorch's best backend, every point with q_len = 1",
                 lambda r: r["q_len"] == 1, f"{who}_over_best_torch", 1.0),
                (f"{name} / plain read, B >= 8 and kv_len >= 32k (q_len 1 and 4)",
                 lambda r: r["batch"] >= 8 and r["kv_len"] >= 32768, f"{who}_over_plain_read", 0.9),
                (f"{name} at q_len = 4 / at q_len = 1", lambda r: r["q_len"] == 4,
                 f"{who}_over_q1", 0.8)):
            vals = [(r[key], r) for r in rows if pick(r) and r.get(key) is not None]
            if not vals:
                continue
            worst, r = min(vals, key=lambda v: v[0])
            met = sum(v >= target for v, _ in vals)
            out.append(f"* {what}: at least {target:g} at {met} of {len(vals)} points; worst "
                       f"{worst:.3f} (B = {r['batch']}, kv_heads = {r['kv_heads']}, kv_len = "
                       f"{r['kv_len']}, q_len = {r['q_len']}).")
    return out


def decode_done_when_rerun(name: str = "decode_h200_rerun.json") -> list[str]:
    """The same targets for ours in another run of the whole table (the same tree, another
    process): how much a one-timing table moves between runs at the targets' edges."""
    r = _load(name)
    if not r:
        return []
    return ([f"* The same targets in a second run of the whole table (`{name}`, "
             f"{r['provenance'].get('date', '')[:16].replace('T', ' ')} UTC, the same tree; "
             f"{r.get('failed_checks', 0)} failed checks):"]
            + ["  " + line for line in decode_done_when(r) if line.startswith("* ours")])


def _ratios(xs, at_least: float = 1.0) -> str:
    """Ratios over points: their median, range, and how many reach ``at_least``."""
    xs = sorted(xs)
    return (f"median {statistics.median(xs):.3f}, {xs[0]:.3f} to {xs[-1]:.3f}, at least "
            f"{at_least:g} at {sum(x >= at_least for x in xs)} of {len(xs)} points")


def decode_vs_flashinfer(d: dict) -> list[str]:
    """Ours against FlashInfer's fastest kernel and page size where the table's run timed it
    (the same run, the same inputs): the fastest of ours, and ours on pages."""
    rows = [r for r in d["summary"] if r.get("flashinfer_tbps")]
    if not rows:
        return []
    out = []
    for ql in sorted({r["q_len"] for r in rows}):
        parts = []
        for key, name in (("ours_over_flashinfer", "ours"), ("ours_paged_over_flashinfer", "ours on pages")):
            xs = [r[key] for r in rows if r["q_len"] == ql and r.get(key)]
            if xs:
                parts.append(f"{name} {_ratios(xs)}")
        out.append(f"* over FlashInfer's fastest kernel and page size in the same run "
                   f"(flashinfer-python {d['provenance'].get('packages', {}).get('flashinfer-python', '?')}), "
                   f"q_len = {ql}: " + "; ".join(parts) + ".")
    return out


def decode_ties(t: dict, name: str = "decode_ties_h200.json", what: str = "") -> list[str]:
    """``--ties``: per point, ours (the defaults, the faster layout of a round) over PyTorch's
    best in each interleaved round: the median, the range, and the rounds ours was faster."""
    rows = t.get("summary") or []
    if not rows:
        return []
    parts = []
    for r in rows:
        xs = sorted(r["ours_over_best_torch_by_round"])
        parts.append(f"{_pt(_key(r))}: {statistics.median(xs):.3f} ({xs[0]:.3f} to {xs[-1]:.3f}), "
                     f"ours faster in {r['ours_faster_rounds']} of {len(xs)}")
    return [f"* Where the table had ours just below PyTorch's best at q_len = 1{what} (`{name}`, "
            f"{t['provenance'].get('date', '')[:10]}; the defaults on both layouts, cuDNN and flash, "
            "one timing of each a round, in turn): ours over PyTorch's best, by round: "
            + "; ".join(parts) + "."]


def decode_ties_runs() -> list[str]:
    """The --ties runs: the first, and the second (another process, its first points only)."""
    out = []
    for name, what in (("decode_ties_h200.json", ""), ("decode_ties_h200_rerun.json", ", again in another run")):
        t = _load(name)
        out += decode_ties(t, name, what) if t else []
    return out


FLUSHES = {"dirty": "the table's flush", "clean": "a clean flush"}


def decode_rounds(h: dict, name: str, field: str, what: str) -> list[str]:
    """An interleaved-rounds run (--l2-hints, --phased, --phased-heldout: ``rounds``): per
    candidate and flush, the first candidate's time over its time (the median over rounds at
    each point; above 1: the candidate is the faster), and ours with it over PyTorch's best
    (its time over ours) after the table's flush, at ``ref`` points: those with one row a KV
    head (kv_heads 32, q_len 1) where the run has them, else all."""
    rows = h.get("summary") or []
    if not rows:
        return []
    labels = list(h["configs"][field + "s"])
    first, key = labels[0], f"over_{labels[0].replace(' ', '_')}_by_round"
    parts = []
    for label in labels[1:]:
        per = []
        for flush in ("dirty", "clean"):
            xs = [statistics.median(r[field + "s"][label][key]) for r in rows
                  if r["flush"] == flush and r[field + "s"][label][key]]
            if xs:
                per.append(f"{FLUSHES[flush]} {_ratios(xs)}")
        parts.append(f"{label}: " + "; ".join(per))
    one_row = any(r["kv_heads"] == 32 and r["q_len"] == 1 for r in rows)
    peer = {}
    for r in rows:
        if r["flush"] == "dirty" and (not one_row or (r["kv_heads"] == 32 and r["q_len"] == 1)):
            for label, v in r[field + "s"].items():
                if v["best_torch_over_ours_by_round"]:
                    peer.setdefault(label, []).append(statistics.median(v["best_torch_over_ours_by_round"]))
    where = "at the points with one row a KV head (kv_heads 32, q_len 1)" if one_row else "at every point"
    return [f"* {what} (`{name}`, {h['provenance'].get('date', '')[:10]}; on PyTorch's own tensors, "
            f"beside cuDNN, flash and the plain read, {h['configs']['rounds']} rounds of one timing of "
            f"each, under the table's flush and a clean one, {len(rows) // 2} points; "
            f"{h.get('failed_checks', 0)} failed checks): the time of {first} over the time of each "
            "(above 1: it is the faster), the median over rounds at each point: " + "; ".join(parts)
            + f". Ours over PyTorch's best (its time over ours, the --ties lines' ratio) {where}, the "
            "table's flush: " + "; ".join(f"{label} {_ratios(xs)}" for label, xs in peer.items()) + "."]


def _on_grid(r: dict, grid: dict) -> bool:
    """Whether a row's point is on the table's grid (its "configs": batches, kv_lens, kv_heads
    and q_lens)."""
    return (r["batch"] in grid["batches"] and r["kv_len"] in grid["kv_lens"]
            and r["kv_heads"] in grid["kv_heads"] and r["q_len"] in grid["q_lens"])


def decode_rounds_split(h: dict, name: str, grid: dict, what: str, parts: tuple[str, str],
                        sides=((None, ""),)) -> list[str]:
    """A ``rounds`` run whose points on the table's grid (``grid``: the table's "configs") are
    where a version was chosen and whose points off it are held out: ``decode_rounds`` of each,
    apart (``parts``: how each is named); ``sides``: (predicate of a summary row, its name)
    splitting each part again (None: all of it)."""
    out = []
    for part, calibration in zip(parts, (True, False)):
        for keep, side in sides:
            rows = [r for r in h.get("summary") or []
                    if _on_grid(r, grid) == calibration and (keep is None or keep(r))]
            if rows:
                out += decode_rounds({**h, "summary": rows}, name, "config", f"{what} {part}{side}")
    return out


def decode_chunks_rule(h: dict, name: str, grid: dict, what: str) -> list[str]:
    """--chunks-rule: v23 against one warpgroup a 64-row chunk at the table's MQA points of q_len
    4 (where v26's rule was read off) and held out, each apart where v23's own splits (the
    run's rows) have at most CHUNKS_MAX_TILES tiles, which the rule gives the chunks, and where
    they have more, where it keeps v23."""
    from flashsim.units import cdiv
    from gpu_kernels.cupy.decode import CHUNKS_MAX_TILES, WGMMA_TILES

    point = lambda r: (r["batch"], r["kv_heads"], r["kv_len"], r["q_len"])     # noqa: E731
    splits = {point(r): r["splits"] for r in h.get("points") or [] if r.get("config") == "v23"}

    def short(r):
        return (point(r) in splits and
                cdiv(cdiv(r["kv_len"], WGMMA_TILES[0]), splits[point(r)]) <= CHUNKS_MAX_TILES)
    return decode_rounds_split(h, name, grid, what, (
        "at the table's MQA points of q_len 4, where v26's rule was read off",
        "held out: off the grid, more than 64 rows a KV head, chosen before the first run"), (
        (short, f", where v23's splits have at most {CHUNKS_MAX_TILES} tiles (the rule takes the chunks)"),
        (lambda r: not short(r), ", where they have more (the rule keeps v23)")))


def decode_launch_times(d: dict, name: str = "decode_h200.json") -> list[str]:
    """The host's time to issue each timed call (the rows' launch_s: the median over a timing's
    repeats), ours and each peer's, beside the GPU's lead spin (the run's timing method)."""
    by = {}
    for r in d.get("points") or []:
        if r.get("launch_s") is not None:
            by.setdefault(r["impl"], []).append(r["launch_s"])
    if not by:
        return []
    ms = lambda x: f"{x * 1e3:.2f}"                                            # noqa: E731
    return [f"* The host's time to issue one timed call (`{name}`, {d['provenance'].get('date', '')[:10]}; "
            "the median over each timing's repeats, then over the timings, ms; the GPU spins "
            f"{ms(d['timing']['lead_s'])} ms before each, so that an issue shorter than that is not timed): "
            + "; ".join(f"{impl} {ms(statistics.median(xs))} ({ms(min(xs))} to {ms(max(xs))}, "
                        f"{len(xs)} timings)" for impl, xs in sorted(by.items())) + "."]


def decode_host_issue(h: dict, name: str = "decode_host_issue_h200.json") -> list[str]:
    """--host-issue: the host's time to issue a call of ours (on PyTorch's tensors and on CuPy
    arrays) and of each peer, each call after a synchronize (the harness's launch_s) and in a
    loop of calls back to back (issue_loop), at each point."""
    by = {}
    for r in h["points"]:
        who = r["impl"] + (f" on {'PyTorch tensors' if r['inputs'] == 'torch' else 'CuPy arrays'}"
                           if r.get("inputs") else "")
        by.setdefault(who, []).append(r)
    us = lambda x: f"{x * 1e6:.0f}"                                              # noqa: E731
    loop = h["points"][0]["issue_loop"]
    parts = []
    for who, rows in by.items():
        one = sorted(r["launch_s"] for r in rows)
        back = sorted(r["issue_loop"]["median_s"] for r in rows)
        parts.append(f"{who}: {us(one[0])} to {us(one[-1])} after a synchronize, {us(back[0])} to "
                     f"{us(back[-1])} back to back")
    points = ", ".join(f"({B}, {kvh}, {n // 1024}k, {ql})" for B, kvh, n, ql in
                       dict.fromkeys((r["batch"], r["kv_heads"], r["kv_len"], r["q_len"]) for r in h["points"]))
    return [f"* The host's time to issue one call (`{name}`, {h['provenance'].get('date', '')[:10]}; the "
            f"defaults at (B, kv_heads, kv_len, q_len) = {points}; us, the median over a timing's repeats, each after a synchronize "
            f"(the harness's), and over {loop['calls']} calls back to back, a synchronize after every "
            f"{loop['every']} (not timed), as a loop of layers issues them; the range over the points): "
            + "; ".join(parts) + "."]


def decode_host_issue_ab(ab: dict, name: str = "decode_host_issue_ab_h200.json") -> list[str]:
    """The A/B of two trees' host paths in one process: each point's median time per call of
    the old over the new, by inputs (the median over the rounds)."""
    rows = [r for r in ab["points"] if "median_s" in r]
    trees = list(dict.fromkeys(r["host_path"] for r in rows))
    ratios = {}
    for key in dict.fromkeys((r["batch"], r["kv_heads"], r["kv_len"], r["q_len"], r["inputs"]) for r in rows):
        t = {tree: statistics.median(r["median_s"] for r in rows if r["host_path"] == tree and
                                     (r["batch"], r["kv_heads"], r["kv_len"], r["q_len"], r["inputs"]) == key)
             for tree in trees}
        ratios.setdefault(key[-1], []).append((t[trees[0]] / t[trees[1]], t[trees[1]]))
    same = [r["same_output_bits"] for r in ab["points"] if "same_output_bits" in r]
    parts = [f"on {'PyTorch tensors' if inputs == 'torch' else 'CuPy arrays'} {min(x for x, _ in v):.1f} to "
             f"{max(x for x, _ in v):.1f} times as fast ({min(t for _, t in v) * 1e6:.0f} to "
             f"{max(t for _, t in v) * 1e6:.0f} us a call)" for inputs, v in ratios.items()]
    new = "the one since (commit 02531b0)" if trees[1] == "the change" else f"tree {trees[1]}"
    return [f"* The host path of tree {trees[0]} against {new} (`{name}`, "
            f"{ab['provenance'].get('date', '')[:10]}; in one process, {len(same)} points, "
            f"{max(r['round'] for r in rows) + 1} rounds of {rows[0]['calls']} calls back to back on the same "
            f"buffers): the second is " + "; ".join(parts)
            + f"; the same output bits from both at {sum(same)} of {len(same)} points."]


def decode_half_rows(h: dict, name: str, grid: dict, note: str = "") -> list[str]:
    """--half-rows: v16 against v9 at the table's MQA points, where the rule was chosen, and at
    the held-out points off that grid."""
    return decode_rounds_split(h, name, grid, "v16 (a KV head's 32 rows spread over the four warps)", (
        f"at the table's MQA points of q_len 1, where it was chosen{note}",
        f"held out: off the grid, 32 rows a KV head, chosen before v16 was timed{note}"))


def _timeline_median(row: dict, key: str):
    xs = [r[key] for r in row["runs"] if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def decode_timeline(t: dict, name: str = "decode_timeline_h200.json") -> list[str]:
    """--timeline: per point, where the defaults' step goes block by block (each quantity the
    median over the runs, us), beside the plain read's event time and span; the other
    configurations' event times and loops; the chunked plain reads of one block an SM."""
    rows = t.get("timeline") or []
    if not rows:
        return []
    us = lambda x: f"{x / 1e3:.1f}"                                   # noqa: E731
    pts = []
    for r in rows:
        k = (r["batch"], r["kv_heads"], r["kv_len"], r["q_len"])
        if k not in pts:
            pts.append(k)
    out = [f"* Where a step's time goes, block by block (`{name}`, {t['provenance'].get('date', '')[:10]}; "
           "decode.cu's TIMELINE probe: each decode_split block stamps the global timer; "
           f"{len(rows[0]['runs'])} runs of each after the flush, the median of each quantity, us):"]
    for k in pts:
        here = [r for r in rows if (r["batch"], r["kv_heads"], r["kv_len"], r["q_len"]) == k]
        get = lambda impl, flush, config=None, grid=None: next(                     # noqa: E731
            (r for r in here if r["impl"] == impl and r.get("flush") == flush
             and (config is None or r.get("config") == config)
             and (grid is None or r.get("grid") == list(grid))), None)
        parts = []
        for flush in ("dirty", "clean"):
            dflt, plain = get("cupy_decode", flush, "defaults"), get("plain_read", flush, grid=(132 * 16, 256))
            if not dflt or not plain:
                continue
            m = lambda key, row=dflt: _timeline_median(row, key)                 # noqa: E731
            parts.append(
                f"after {FLUSHES[flush]}: the step {us(m('event_ns'))} between the events (the plain read "
                f"{us(_timeline_median(plain, 'event_ns'))}); the blocks span {us(m('span_ns'))}: a block "
                f"has issued its first tiles {us(m('issued_ns'))} after it starts, its first tile lands "
                f"at {us(m('first_tile_ns'))}, its loop takes {us(m('loop_ns'))} (waiting for tiles "
                f"{m('wait_share'):.0%} of its cycles), {us(m('after_loop_ns'))} follow it, and the "
                f"last block ends {us(m('tail_ns'))} after the median one; outside the blocks "
                f"{us(m('event_ns') - m('span_ns'))} (the plain read's "
                f"{us(_timeline_median(plain, 'event_ns') - _timeline_median(plain, 'span_ns'))}: "
                "the launch and the events)")
        dflt = get("cupy_decode", "dirty", "defaults")
        others = []
        for r in here:
            if r["impl"] != "cupy_decode" or r.get("config") in (None, "defaults"):
                continue
            m = lambda key, row=r: _timeline_median(row, key)                    # noqa: E731
            ev = "" if r["config"] == "code warm" else f"{us(m('event_ns'))}, "
            others.append(f"{r['config']} {ev}first tile {us(m('first_tile_ns'))}, loop "
                          f"{us(m('loop_ns'))}, after it {us(m('after_loop_ns'))}")
        chunked = [f"{g[0]} blocks of {g[1]} threads ({g[1] * 128 // 1024} KB in flight a block) "
                   f"{us(_timeline_median(c, 'event_ns'))}"
                   for g in ((128, 512), (128, 1024)) if (c := get("plain_read_chunked", "dirty", grid=g))]
        what = (f"{dflt['splits']} split{'s' if dflt['splits'] > 1 else ''}, {len(dflt['stamps']['sm'])} blocks, "
                f"{'wgmma' if dflt['wgmma'] else 'mma.sync'}, {dflt['block_cols']}-key tiles, "
                f"{dflt['stages']} stages")
        line = f"  * {_pt(k)} ({what}): " + "; ".join(parts) + "."
        if others:
            line += " Beside the defaults, the table's flush (event time, first tile, loop): " + "; ".join(others) + "."
        if chunked:
            line += " Plain reads with each block one contiguous chunk, the table's flush: " + "; ".join(chunked) + "."
        out.append(line)
    return out


def decode_v14(d: dict) -> list[str]:
    """v14 (K and V loaded apart, the wave rule's splits) over the defaults' row at the same
    point and layout in the table, by whether the defaults' launch has splits."""
    rows = {}
    for p in d["points"]:
        if p["impl"] == "cupy_decode" and p["check_ok"] and (p.get("variant") == "v14" or p.get("defaults")):
            rows.setdefault((_key(p), p["layout"]), {})["v14" if p.get("variant") == "v14" else "defaults"] = p
    groups: dict = {}
    for (k, _), v in rows.items():
        if "v14" in v and "defaults" in v:
            splits = "without splits" if v["defaults"]["splits"] == 1 else "with splits"
            groups.setdefault(splits, []).append(v["v14"]["time_s"] / v["defaults"]["time_s"])
    return [f"* v14 (K and V loaded apart, one 128-key buffer each, the wave rule's splits) over the "
            f"defaults, fewer than 32 packed rows a KV head, where the defaults' launch runs {g}, "
            f"same point and layout, {len(r)} timings: {_over(r, 'v14 ')}."
            for g, r in sorted(groups.items(), reverse=True)]


def decode_v5_w4(d: dict) -> list[str]:
    """How v5_w4 (one warpgroup) did where it is timed: MQA at q_len = 1 (32 rows), against
    the split kernels of v1-v5 (v6-v9 run v5_w4's kernel there, with another combine, splits
    or loads)."""
    by = {}
    for p in d["points"]:
        if p["impl"] == "cupy_decode" and p["check_ok"] and p["kv_heads"] == 1 and p["q_len"] == 1 \
                and re.fullmatch(r"v[1-5](_w[48])?", p.get("variant", "v1")):   # v1-v5 alone
            mine = by.setdefault((p["batch"], p["kv_len"]), {})     # a variant's best layout
            mine[p.get("variant", "v1")] = max(p["tbps"], mine.get(p.get("variant", "v1"), 0))
    here = {k: v for k, v in by.items() if "v5_w4" in v}
    if not here:
        return []
    fastest = sum(max(v, key=v.get) == "v5_w4" for v in here.values())
    worst = min(v["v5_w4"] / max(v.values()) for v in here.values())
    w8 = [v["v5_w4"] / v["v4"] for v in here.values() if "v4" in v]
    line = (f"* v5_w4 (wgmma, one warpgroup), MQA at q_len = 1: the fastest of v1-v5 at {fastest} "
            f"of {len(here)} points, at worst {worst:.3f} of the fastest")
    return [line + (f"; over v4 (8 mma.sync warps) {min(w8):.2f}-{max(w8):.2f}x." if w8 else ".")]


def decode_layouts(d: dict) -> list[str]:
    """Ours on PyTorch's own (B, kv_heads, kv_len, d) tensors (head-major, transposed views)
    against ours on the token-major cache, and against PyTorch on those same tensors."""
    rows = [r for r in d["summary"] if r.get("ours_head_major_tbps") and r.get("ours_token_major_tbps")]
    if not rows:
        return []
    ratio = {(r["batch"], r["kv_heads"], r["kv_len"], r["q_len"]):
             r["ours_head_major_tbps"] / r["ours_token_major_tbps"] for r in rows}
    near = [x for x in ratio.values() if abs(x - 1) <= 0.02]
    far = "; ".join(f"B {b}, kv_heads {h}, kv_len {n}, q_len {q}: {x:.2f}"
                    for (b, h, n, q), x in ratio.items() if abs(x - 1) > 0.02)
    same = [r for r in rows if r["q_len"] == 1 and r.get("ours_head_major_over_best_torch")]
    met = sum(r["ours_head_major_over_best_torch"] >= 1 for r in same)
    return [f"* The cache's layout: ours on PyTorch's own K and V tensors (B, kv_heads, kv_len, d), "
            f"read through transposed views, over ours on the token-major cache (B, kv_len, "
            f"kv_heads, d): median {statistics.median(ratio.values()):.3f}; within 2 % at "
            f"{len(near)} of {len(ratio)} points" + (f" (the others: {far})" if far else "")
            + f". On the very tensors PyTorch gets, ours at least matches its best backend at "
            f"{met} of {len(same)} points with q_len = 1."]


def _over(ratios, who: str = "") -> str:
    """Time ratios of one version over another, as every version line states them."""
    r = list(ratios)
    return (f"median {statistics.median(r):.3f}, {min(r):.3f} to {max(r):.3f}; {who}faster at "
            f"{sum(x < 1 for x in r)}")


def _ours_times(d: dict) -> dict:
    """(B, H, kv_heads, kv_len, q_len, layout, variant) -> (time_s, splits) of every checked
    contiguous point of ours: what the version comparisons below set side by side."""
    return {(p["batch"], p["heads"], p["kv_heads"], p["kv_len"], p["q_len"],
             p.get("layout", "token_major"), p.get("variant")): (p["time_s"], p["splits"])
            for p in d["points"] if p["impl"] == "cupy_decode" and p["check_ok"]}


def _over_by_rows(t: dict, var: str, base_of) -> list[tuple[int, list[float]]]:
    """(packed rows a KV head, time ratios) of ``var`` over ``base_of(key)`` (a row of
    ``_ours_times`` ``t``, or None) at the same point, layout and splits, by rows."""
    by_rows: dict = {}
    for key, (time_s, splits) in t.items():
        B, H, kvh, n, ql, lay, v = key
        base = base_of(key[:-1], splits) if v == var else None
        if base and base[1] == splits:
            by_rows.setdefault(ql * H // kvh, []).append(time_s / base[0])
    return sorted(by_rows.items())


def decode_v6(d: dict) -> list[str]:
    """v6 (the combine by programmatic dependent launch) over the same kernels
    launched one after the other (v4, v5_w4 or v5, whichever the defaults run), same layout."""
    from gpu_kernels.cupy import decode as dk

    t = _ours_times(d)
    ratios = []
    for (B, H, kvh, n, ql, lay, var), (time_s, splits) in t.items():
        before = t.get((B, H, kvh, n, ql, lay, dk.default_variant(ql * H // kvh)))
        if var == "v6" and splits > 1 and before and before[1] == splits:
            ratios.append((time_s / before[0], B, kvh, n, ql, before[0]))
    if not ratios:
        return []
    ratios.sort()

    def at(r):
        return f"B = {r[1]}, kv_heads = {r[2]}, kv_len = {r[3]}, q_len = {r[4]} (a step of {r[5] * 1e6:.1f} us)"
    return [f"* v6 (decode_combine by programmatic dependent launch; the defaults at 2 to 32 splits) over the same "
            f"kernels launched one after the other, same splits and layout, at the {len(ratios)} "
            f"timings with splits: {_over(r[0] for r in ratios)}; the largest gain at {at(ratios[0])}, the largest loss at {at(ratios[-1])}."]


def decode_v7(d: dict) -> list[str]:
    """v7 (the splits merged in decode_split) over v6 (the combine launch by PDL), same point,
    layout and splits: where the defaults take v7 (more than 32 splits) and where not."""
    from gpu_kernels.cupy import decode as dk

    t = _ours_times(d)
    groups = {True: [], False: []}
    for (B, H, kvh, n, ql, lay, var), (time_s, splits) in t.items():
        v6 = t.get((B, H, kvh, n, ql, lay, "v6"))
        if var == "v7" and splits > 1 and v6 and v6[1] == splits:
            groups[bool(dk.default_fused(splits))].append((time_s / v6[0], time_s - v6[0], B, kvh, n, ql))
    out = []
    for fused, what in ((True, "above 32 splits (the defaults run v7)"),
                        (False, "at 2 to 32 splits (the defaults run v6)")):
        r = sorted(groups[fused])
        if not r:
            continue
        out.append(f"* v7 (the splits merged in decode_split, no combine launch) over v6 {what}, "
                   f"same splits and layout, {len(r)} timings: median {statistics.median(x[0] for x in r):.3f}, "
                   f"{r[0][0]:.3f} to {r[-1][0]:.3f}, {min(x[1] for x in r) * 1e6:+.1f} to "
                   f"{max(x[1] for x in r) * 1e6:+.1f} us; v7 faster at {sum(x[0] < 1 for x in r)}.")
    return out


NCU_DECODE = ["dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"]


def _profiled_launches(d: dict, csv_name: str, metrics: list) -> list[tuple[dict, list[dict]]]:
    """Each point of a ``--profile-point`` JSON beside ncu's rows of its launches (the CSV of the
    same run holds the measured launches only, in the points' order), names and count checked."""
    from gpu_kernels import ncu

    rows, out, i = ncu.parse_csv(measured.path(csv_name).read_text(), metrics), [], 0
    for p in d["points"]:
        mine, i = rows[i:i + len(p["launches"])], i + len(p["launches"])
        names = [r["kernel_name"] for r in mine]
        if names != [k for k, _ in p["launches"]]:
            raise ValueError(f"{csv_name}: launches {names} where the JSON has {p['launches']}")
        out.append((p, mine))
    if i != len(rows):
        raise ValueError(f"{csv_name} has {len(rows)} launches, the JSON's points {i}")
    return out


def decode_ncu(d: dict) -> list[str]:
    """Nsight Compute's DRAM bytes of the default launch at each profiled point beside
    flashsim's prediction of that launch (``benchmarks/decode_h200.py --profile-point`` under
    ncu: decode_ncu_h200.json and the CSV of the same run, the measured launches in order)."""
    if "provenance" not in d or not measured.path("decode_ncu_h200.csv").exists():
        return []                      # the first profile's files (warm-ups in the CSV too)
    parts = []
    for p, mine in _profiled_launches(d, "decode_ncu_h200.csv", NCU_DECODE):
        pt, launch, pred = p["point"], p["launch"], p["flashsim"]
        read = sum(r["dram__bytes_read.sum"] for r in mine) / pred["hbm_read_bytes"]
        write = sum(r["dram__bytes_write.sum"] for r in mine) / pred["hbm_write_bytes"]
        parts.append(f"B {pt['batch']}, kv_heads {pt['kv_heads']}, {pt['kv_len'] // 1024}k, "
                     f"q_len {pt['q_len']}{', pages of %d' % pt['page_size'] if pt['page_size'] else ''}"
                     f" ({launch['warps']} warps{', wgmma' if launch.get('wgmma') else ''}, "
                     f"{launch['splits']} split{'s' if launch['splits'] != 1 else ''}): read {read:.3f}, "
                     f"written {write:.2f}")
    return [f"* Nsight Compute beside flashsim (`decode_ncu_h200.json`, {d['provenance']['date'][:10]}; "
            "the default launch at each point; DRAM bytes read and written over flashsim's "
            "count of the launch's bytes below shared memory, `launch.plan().count()`, which "
            "has no L2: the split partials the combine reads back, and the small outputs, may "
            "stay in the L2 and never reach DRAM): " + "; ".join(parts) + "."]


def decode_splits(sw: dict, name: str = "decode_splits_h200.json", role: str = "") -> list[str]:
    """What a splits sweep (decode_splits_h200.json; on pages, decode_splits_p<P>_h200.json)
    says of the split rules: each rule's time over the fastest count timed, the default for
    that cache (``default_split_rule``) first; ``role``: what the sweep was to the choice."""
    from gpu_kernels.cupy import decode as dk

    P = next((p["page_size"] for p in sw["points"] if p.get("page_size")), 0)
    default = dk.default_split_rule(P)
    names = {"sm": '"sm" (one block per SM)', "wave": "one-wave", "fa2": "FlashAttention-2's"}
    names[default] = names[default][:-1] + ", the default)" if default == "sm" else \
        names[default] + " (the default)"
    rules = [r for r in dk.SPLIT_RULES if all(x.get(f"{r}_over_best") for x in sw["summary"])]
    if not rules:
        return []
    rules.sort(key=lambda r: r != default)
    n = len(sw["summary"])
    parts = []
    for r in rules:
        over = [x[f"{r}_over_best"] for x in sw["summary"]]
        parts.append(f"{names.get(r, r)} median {statistics.median(over):.3f}, worst {max(over):.3f}, "
                     f"the fastest count at {sum(o == 1 for o in over)}")
    cfg = sw.get("config") or {}
    tiles = (f"tiles {cfg['block_cols']} x {cfg['stages']} stages as tuned in that run"
             if "block_cols" in cfg else "the default tiles")
    cache = f"on pages of {P} (\"NHD\", random order)" if P else "on the contiguous cache"
    return [f"* The split rules {cache}, from `flashsim/measured/data/{name}` ("
            f"{role + '; ' if role else ''}ours at split counts around each rule's choice, "
            f"{n} points with B <= 8 where splits are chosen, {tiles}): time over the fastest "
            "count timed: " + "; ".join(parts) + "."]


def _key(p: dict) -> tuple:
    """A row's decode point (B, kv_heads, kv_len, q_len)."""
    return p["batch"], p["kv_heads"], p["kv_len"], p["q_len"]


def _fastest(r: dict, over: str, ref_time: str) -> str:
    """One point of a --configs summary: the fastest configuration's ratio ``over`` the
    reference, the defaults' beside (the reference's time ``ref_time`` over theirs)."""
    dflt = r[ref_time] / r["defaults_time_s"]
    return f"{_pt(_key(r))}: {r[over]:.3f} (" + (
        "the defaults" if r["best_config"] == "defaults" else
        f"{r['best_config']}; the defaults {dflt:.3f}") + ")"


def _pt(k) -> str:
    """A decode point (B, kv_heads, kv_len, q_len) as the lines name it."""
    return f"B {k[0]}, kv_heads {k[1]}, {k[2] // 1024}k" + (f", q_len {k[3]}" if k[3] != 1 else "")


def decode_configs(c: dict) -> list[str]:
    """What ``--configs`` (decode_configs_h200.json) found where ours fell short of PyTorch's
    best: per point the fastest configuration over the best peer (the faster of its two
    timings), the defaults beside; the chunked plain read over the grid-stride one."""
    rows = c.get("summary") or []
    if not rows:
        return []
    parts = [_fastest(r, "best_over_peer", "best_peer_time_s") for r in rows]
    pts = c["points"]
    key = lambda p: (p["batch"], p["kv_heads"], p["kv_len"], p["q_len"], p.get("pass"))  # noqa: E731
    chunked = []
    for k in dict.fromkeys(key(p) for p in pts if p["impl"] == "plain_read"):
        grid = next(p["time_s"] for p in pts if p["impl"] == "plain_read" and key(p) == k)
        chunked += [p["time_s"] / grid for p in pts if p["impl"] == "plain_read_chunked" and key(p) == k]
    n = sum(p["impl"] == "cupy_decode" for p in pts)
    return [f"* Other configurations where ours fell short (`decode_configs_h200.json`, "
            f"{c['provenance'].get('date', '')[:10]}; {n} timings of ours at {len(rows)} points, on "
            "PyTorch's own tensors, between two timings of each peer): the fastest configuration's "
            "bandwidth over PyTorch's best: " + "; ".join(parts) + ".",
            f"* The chunked plain read (each block one contiguous run of K and of V, "
            f"{len(c['configs']['plain_read_chunked_grids'])} grids) over the grid-stride one "
            f"(the table's): {_span(chunked, '.3f')}; the table keeps the grid-stride read."]


def decode_configs_ncu() -> list[str]:
    """What PyTorch's cuDNN call and our step run at the --configs points, as Nsight Compute
    saw them (``views.decode.configs_profile``)."""
    from flashsim.views import decode as dv

    calls = dv.configs_profile()
    if not calls:
        return []

    def kernels(c):
        return " + ".join(f"{x['time_s'] * 1e6:.1f} us on {x['grid']} blocks of {x['block']}"
                          for x in c["kernels"])
    parts = []
    for k in dict.fromkeys(_key(c) for c in calls):
        here = {c["what"]: c for c in calls if _key(c) == k}
        parts.append(f"{_pt(k)}: cuDNN {kernels(here['peer'])}; ours {kernels(here['ours'])}")
    return ["* What each runs there (Nsight Compute, its cache flushed before each kernel, "
            "`decode_configs_ncu_h200.csv`; kernel durations, one call each): " + "; ".join(parts) + "."]


def decode_v8(d: dict) -> list[str]:
    """v8 (the defaults: the "sm" rule's splits) over the same launch at the wave rule's
    splits, v7 where v8 merges in decode_split (``default_fused``: the "sm" splits always fit
    one wave) and v6 where not, same point and layout, where the two rules' splits differ."""
    from gpu_kernels.cupy import decode as dk

    t = _ours_times(d)
    r = []
    for (B, H, kvh, n, ql, lay, var), (time_s, splits) in t.items():
        other = t.get((B, H, kvh, n, ql, lay, "v7" if dk.default_fused(splits) else "v6"))
        if var == "v8" and other and other[1] != splits:
            r.append((time_s / other[0], B, kvh, n, ql, splits, other[1]))
    if not r:
        return []
    worst, best = max(r), min(r)
    f = lambda x: f"B = {x[1]}, kv_heads = {x[2]}, kv_len = {x[3]}, q_len = {x[4]} ({x[6]} -> {x[5]} splits)"  # noqa: E731
    return [f"* v8 (the defaults: the \"sm\" rule's splits) over the same launch at the wave rule's "
            f"splits (v6 or v7), same layout, the {len(r)} timings where the splits differ: "
            f"{_over(x[0] for x in r)}; the largest gain at {f(best)}, the largest loss at {f(worst)}."]


def decode_v9(d: dict) -> list[str]:
    """v9 (the defaults: the wgmma loop's K/V by the TMA unit, two warpgroups' ping-pong) over
    v8's launch at the same point, layout and splits (v8's row, or v7's or v6's, as
    ``default_fused`` picks, where the benchmark found v8 equal to it and timed it once), at
    the wgmma points (32 packed rows or more a KV head), by rows."""
    from gpu_kernels.cupy import decode as dk

    t = _ours_times(d)
    out = []
    for rows, r in _over_by_rows(t, "v9", lambda k, splits: t.get(k + ("v8",)) or t.get(
            k + ("v7" if dk.default_fused(splits) else "v6",))):
        what = ("two warpgroups: the TMA unit's loads and the ping-pong" if rows > 64 else
                "one warpgroup: the TMA unit's loads")
        out.append(f"* v9 ({what}) over v8's launch, {rows} packed rows a KV head, same splits "
                   f"and layout, {len(r)} timings: {_over(r)}.")
    return out


def decode_v10(d: dict, name: str = "decode_h200.json", what: str = "") -> list[str]:
    """v10 (decode_combine v4: its row's L_s and O_s in one round of loads) over v9 (v3's
    combine), the same split kernel, splits and layout, where a combine launch follows it."""
    pts = {}
    for p in d["points"]:
        if p["impl"] == "cupy_decode" and p["check_ok"] and p.get("variant") in ("v9", "v10") \
                and p["splits"] > 1 and not p["fused"]:
            pts[(p["batch"], p["kv_heads"], p["kv_len"], p["q_len"], p["layout"], p["variant"])] = p
    r = sorted((pts[k[:-1] + ("v10",)]["time_s"] / v9["time_s"], k) for k, v9 in pts.items()
               if k[-1] == "v9" and (k[:-1] + ("v10",)) in pts
               and pts[k[:-1] + ("v10",)]["splits"] == v9["splits"])
    if not r:
        return []
    return [f"* v10 (decode_combine in one round of loads{what}) over v9 (v3's combine: L_s, "
            f"then O_s), the same split kernel, splits and layout, `{name}`, {len(r)} timings "
            f"with a combine launch: {_over((a for a, _ in r), 'v10 ')} (the lowest ratio at "
            f"{_pt(r[0][1][:4])}, the highest at {_pt(r[-1][1][:4])})."]


def decode_v11(d: dict) -> list[str]:
    """v9_s3 (3 stages of 128-key tiles: two loading) and v11 (those stages with the softmax
    of S_j beside P_{j-1} V_{j-1}: one tile loading, as v9) over v9 at the same point, layout
    and splits, by packed rows a KV head."""
    t = _ours_times(d)
    what = {"v9_s3": "three 128-key stages, two tiles loading",
            "v11": "the softmax of S_j beside P_{j-1} V_{j-1}, one tile loading as in v9"}
    out = []
    for var in ("v9_s3", "v11"):
        out += [f"* {var} ({what[var]}) over v9, {rows} packed rows a KV head, same splits and "
                f"layout, {len(r)} timings: {_over(r, var + ' ')}."
                for rows, r in _over_by_rows(t, var, lambda k, splits: t.get(k + ("v9",)))]
    return out


def decode_configs_q4(c: dict) -> list[str]:
    """What ``--configs-q4`` (decode_configs_q4_h200.json) found at the MQA points of q_len 4:
    per point the fastest configuration over the plain read (the faster of its two timings),
    the defaults beside, and the tensor-core rate each implies: R packed rows a KV head do
    4 R d FLOPs per key for 4 d bytes of K and V, R FLOPs a byte, so TFLOP/s = R x TB/s."""
    rows = c.get("summary") or []
    if not rows:
        return []
    rates = []
    for r in rows:
        p = next(p for p in c["points"] if _key(p) == _key(r))
        R, kv_bytes = r["q_len"] * p["heads"] // r["kv_heads"], p["kv_bytes"]
        rates.append((R * kv_bytes / r["best_time_s"] / 1e12,
                      0.9 * R * kv_bytes / r["plain_read_time_s"] / 1e12))
    line = decode_configs_over_read(c, "MQA at q_len 4", "decode_configs_q4_h200.json")
    return [line[:-1] + f". At 128 packed rows a KV head a step does 128 FLOPs per byte "
            f"of K and V: the fastest configurations ran the tensor cores at {_span([a for a, _ in rates], '.0f')} "
            f"TFLOP/s, where 0.9 of the plain read would take {_span([b for _, b in rates], '.0f')}."]


def decode_configs_mqa(c: dict) -> list[str]:
    """What ``--configs-mqa`` (decode_configs_mqa_h200.json) found: MQA at q_len 1, B 8."""
    return [decode_configs_over_read(c, "MQA at q_len 1, B 8", "decode_configs_mqa_h200.json")] \
        if c.get("summary") else []


def decode_configs_over_read(c: dict, what: str, name: str) -> str:
    """One line of a --configs run whose points fell short of 0.9 of the plain read: per point
    the fastest configuration over the plain read (the faster of its two timings), the
    defaults beside."""
    parts = [_fastest(r, "best_over_plain_read", "plain_read_time_s") for r in c["summary"]]
    n = sum(p["impl"] == "cupy_decode" for p in c["points"])
    return (f"* {what} (`{name}`, {c['provenance'].get('date', '')[:10]}; {n} timings of ours at "
            f"{len(c['summary'])} points, on PyTorch's own tensors, between two timings of the plain "
            "read): the fastest configuration's bandwidth over the plain read's: " + "; ".join(parts) + ".")


def decode_flashinfer(f: dict) -> list[str]:
    """FlashInfer beside ours (``--flashinfer``, decode_flashinfer_h200.json): per point its
    fastest kernel and page size; ours (the defaults, one configuration chosen before timing)
    on the contiguous cache and on the same pages over it, against the issue's targets'
    split of the points, and FlashInfer over the plain read where the issue asks 0.9 of ours."""
    rows = f.get("summary") or []
    if not rows:
        return []
    version = f["provenance"].get("packages", {}).get("flashinfer-python", "?")
    out = [f"* FlashInfer (`decode_flashinfer_h200.json`, {f['provenance'].get('date', '')[:10]}; "
           f"flashinfer-python {version}, its modules built for sm_90a by "
           "`benchmarks/peers/flashinfer_aot.py`; its decode kernel on CUDA and on tensor cores at q_len 1, "
           "its prefill kernel at q_len 4; pages of "
           + ", ".join(str(P) for P in f["configs"]["pages"]) + ", the fastest of them; "
           f"{len(rows)} points, {f.get('failed_checks', 0)} failed checks of ours; FlashInfer's "
           f"checks failed at {sum(not p['check_ok'] for p in f['points'] if p['impl'].startswith('flashinfer'))} "
           "of its timings):"]
    for what, pick in (("q_len = 1", lambda r: r["q_len"] == 1), ("q_len = 4", lambda r: r["q_len"] == 4)):
        here = [r for r in rows if pick(r)]
        for who, name in (("ours", "ours (the defaults, contiguous)"),
                          ("ours_paged", "ours (the defaults) on FlashInfer's fastest page size")):
            vals = [(r[f"{who}_over_flashinfer"], r) for r in here if r.get(f"{who}_over_flashinfer")]
            if not vals:
                continue
            worst, r = min(vals, key=lambda v: v[0])
            out.append(f"  * {what}, {name} over FlashInfer: {_ratios([v for v, _ in vals])} "
                       f"(the lowest at {_pt(_key(r))}).")
    big = [r for r in rows if r["batch"] >= 8 and r["kv_len"] >= 32768 and r.get("flashinfer_over_plain_read")]
    if big:
        xs = [r["flashinfer_over_plain_read"] for r in big]
        out.append(f"  * FlashInfer over the plain read, B >= 8 and kv_len >= 32k: {_span(xs, '.3f')}; "
                   f"at least 0.9 at {sum(x >= 0.9 for x in xs)} of {len(xs)} points ("
                   + "; ".join(f"{_pt(_key(r))}: {r['flashinfer_over_plain_read']:.3f}"
                               for r in big if r["flashinfer_over_plain_read"] < 0.9) + ").")
    return out


def decode_flashinfer_table(f: dict) -> list[str]:
    """The whole FlashInfer comparison, a row a point (TB/s); its kernel as the fastest row
    of the point ran it (the decode kernel on CUDA or tensor cores, the prefill's backend)."""
    def kernel(r):
        p = next(p for p in f["points"] if _key(p) == _key(r) and p["impl"] == r["flashinfer_impl"]
                 and p["page_size"] == r["flashinfer_page_size"] and p["tbps"] == r["flashinfer_tbps"])
        how = p.get("backend") or ("tensor cores" if p.get("use_tensor_cores") else "CUDA cores")
        return f"{p['impl'].replace('flashinfer_', '')} ({how}), {p['page_size']}"
    return _table(["B", "kv_heads", "kv_len", "q_len", "FlashInfer", "its kernel, page", "ours paged",
                   "ours contiguous", "PyTorch's best", "plain read"],
                  [[r["batch"], r["kv_heads"], r["kv_len"], r["q_len"], _f(r["flashinfer_tbps"]),
                    kernel(r), _f(r["ours_paged_tbps"]), _f(r["ours_tbps"]), _f(r["best_torch_tbps"]),
                    _f(r["plain_read_tbps"])] for r in f["summary"]])


def decode_clock_ramp(k: dict) -> list[str]:
    """What ``--clock-ramp`` (decode_clock_ramp_h200.json) saw: per warm-up the largest
    median over the fastest repeat of a timing, the timings slower than 1.3 x their fastest
    repeat, and the clocks NVML read before and after each timing."""
    rows = k.get("rows") or []
    if not rows:
        return []
    c = k["config"]
    worst = {w: max(r["time_s"] / r["min_s"] for r in rows if r["warmup"] == w) for w in c["warmups"]}
    slow = sum(r["time_s"] > 1.3 * r["min_s"] for r in rows)
    clocks = [x for r in rows for x in (r["clocks_before"], r["clocks_after"]) if x]
    seen = (f"SM {_span([x[0] for x in clocks], '.0f')} MHz, memory {_span([x[1] for x in clocks], '.0f')} MHz"
            if clocks else "not read (no NVML)")
    return [f"* Timings after the host idles (`decode_clock_ramp_h200.json`, "
            f"{k['provenance'].get('date', '')[:10]}; the default step at "
            + " and ".join(_pt(tuple(p)) for p in c["points"]) + f"; {len(rows)} timings of "
            f"{c['repeats']} repeats after {' or '.join(f'{x:g}' for x in c['idle_s'])} s of host "
            f"sleep, {c['cycles']} rounds): the median over the fastest repeat at most "
            + ", ".join(f"{worst[w]:.3f} ({w})" for w in c["warmups"])
            + f"; {slow} timings slower than 1.3x their fastest repeat; NVML's clocks before and "
            f"after each timing: {seen}."]


def decode_clocks(d: dict, log: dict) -> list[str]:
    """NVML's samples through the table's run (decode_h200_clocks.json) over the whole run and
    during its slow timings (rows whose median is above 1.3x their fastest repeat, by the host
    times the row carries): clocks, power and the clock-event reasons seen, each with the share
    of samples that had it."""
    samples = log.get("samples") or []
    if not samples:
        return []
    col = {f: i for i, f in enumerate(log["fields"])}

    def seen(xs) -> str:
        if not xs:
            return "no sample"
        reasons = [n for n, bit in log["reason_bits"].items()
                   if any(x[col["reasons"]] & bit for x in xs)]
        share = {n: sum(bool(x[col["reasons"]] & log["reason_bits"][n]) for x in xs) / len(xs)
                 for n in reasons}
        return (f"{len(xs)} samples, SM {_span([x[col['sm_mhz']] for x in xs], '.0f')} MHz, memory "
                f"{_span([x[col['mem_mhz']] for x in xs], '.0f')} MHz, power "
                f"{_span([x[col['power_w']] for x in xs], '.0f')} W, clock-event reasons "
                + (", ".join(f"{n} {share[n]:.0%}" for n in reasons) if reasons else "none"))
    ts = [x[col["t_s"]] for x in samples]       # in order: the log's thread appends them so

    def within(rows):
        """The samples inside any of the rows' host times, in order."""
        idx = {i for p in rows for i in range(bisect.bisect_left(ts, p["host_t"][0]),
                                               bisect.bisect_right(ts, p["host_t"][1]))}
        return [samples[i] for i in sorted(idx)]
    timed = [p for p in d["points"] if p.get("host_t")]
    slow = [p for p in timed if p["time_s"] > 1.3 * p["min_s"]]
    # the points whose rows saw a clock-event reason other than an idle GPU, most first
    busy = {k: within([p for p in timed if _key(p) == k]) for k in dict.fromkeys(map(_key, d["points"]))}
    idle = log["reason_bits"].get("GpuIdle", 0)
    capped = sorted(((sum(bool(x[col["reasons"]] & ~idle) for x in xs) / len(xs), k, xs)
                     for k, xs in busy.items() if xs), key=lambda c: -c[0])
    capped = [c for c in capped if c[0] > 0]
    where = "; ".join(f"{_pt(k)}: {share:.0%} of its {len(xs)} samples, SM down to "
                      f"{min(x[col['sm_mhz']] for x in xs):.0f} MHz" for share, k, xs in capped)
    return [f"* NVML through the table's run (`decode_h200_clocks.json`, every {log['period_s'] * 1e3:.0f} ms): "
            f"{seen(samples)}; during its {len(slow)} timing{'' if len(slow) == 1 else 's'} slower than "
            f"1.3x {'its' if len(slow) == 1 else 'their'} fastest repeat: "
            f"{seen(within(slow))}. Points whose timings saw a reason other than an idle GPU: "
            + (where or "none") + "."]


def decode_v9_w4(d: dict) -> list[str]:
    """v9_w4 (one warpgroup's wgmma wherever) over the defaults' launch at the same point and
    layout: above 64 packed rows a KV head against v9's one 128-row block of two warpgroups
    (by whether the step's K/V fits the L2: the chunks' second reads may come from it), below
    32 against the defaults' mma.sync kernels (v8's row, as v9 adds nothing there)."""
    from flashsim.hardware.presets import gpu

    t = _ours_times(d)
    l2 = gpu("h200").l2_bytes
    groups: dict = {}
    for (B, H, kvh, n, ql, lay, var), (time_s, _) in t.items():
        rows = ql * H // kvh
        base = t.get((B, H, kvh, n, ql, lay, "v9" if rows > 64 else "v8"))
        if var != "v9_w4" or not base or 32 <= rows <= 64:
            continue
        key = ("past" if 2 * B * n * kvh * 128 * 2 > l2 else "within") if rows > 64 else "few"
        groups.setdefault(key, []).append((time_s / base[0], B, kvh, n, ql))
    what = {"within": "two 64-row chunks on twice the blocks at half the splits, over v9's one "
                      "128-row block of two warpgroups, K/V within the L2",
            "past": "two 64-row chunks on twice the blocks at half the splits, over v9's one "
                    "128-row block of two warpgroups, K/V past the L2",
            "few": "fewer than 32 packed rows a KV head, wgmma on 64-row blocks of padding, over "
                   "the defaults' mma.sync kernels (v8's launch)"}
    out = []
    for key in ("within", "past", "few"):
        r = groups.get(key)
        if not r:
            continue
        best = min(r)
        out.append(f"* v9_w4 (one warpgroup; {what[key]}), {len(r)} timings: "
                   f"{_over(x[0] for x in r)} (the best at B = {best[1]}, kv_heads = "
                   f"{best[2]}, kv_len = {best[3]}, q_len = {best[4]}).")
    return out


def decode_table(d: dict) -> list[str]:
    """Per point: our kernel (its fastest correct configuration), paged, PyTorch, FlashInfer
    (a column where the run has it), the read."""
    rows = d["summary"]
    fi = any(r.get("flashinfer_tbps") for r in rows)
    return _table(["B", "kv_heads", "kv_len", "q_len", "ours TB/s", "configuration",
                   "token-major TB/s", "head-major TB/s",
                   "paged best TB/s", "best PyTorch TB/s"] + (["FlashInfer TB/s"] if fi else [])
                  + ["plain read TB/s", "ours / PyTorch", "ours / read", "ours / q_len 1"],
                  [[r["batch"], r["kv_heads"], r["kv_len"], r["q_len"], _f(r["ours_tbps"]),
                    " ".join(x for x in (r.get("ours_variant") or "v1",
                                         (r.get("ours_layout") or "").replace("_", "-")) if x),
                    _f(r.get("ours_token_major_tbps")), _f(r.get("ours_head_major_tbps")),
                    _f(r["ours_paged_best_tbps"]), _f(r["best_torch_tbps"])]
                   + ([_f(r.get("flashinfer_tbps"))] if fi else [])
                   + [_f(r["plain_read_tbps"]), _f(r["ours_over_best_torch"]),
                      _f(r["ours_over_plain_read"]), _f(r["ours_over_q1"])]
                   for r in sorted(rows, key=lambda r: (r["q_len"], r["kv_heads"], r["batch"],
                                                        r["kv_len"]))])


def _overhead_rows(d: dict) -> list[dict]:
    """Per point of decode_overheads_h200.json: its step, kernels alone, empty launch and
    plain read in us, after the table's (dirty) flush and after a clean one."""
    key = lambda p: (p["batch"], p["kv_heads"], p["kv_len"], p["q_len"])  # noqa: E731
    rows = []
    for k in dict.fromkeys(key(p) for p in d["points"]):
        here = [p for p in d["points"] if key(p) == k]

        def us(impl, flush="dirty", part=None):
            t = [p["time_s"] for p in here if p["impl"] == impl and p.get("flush") == flush
                 and p.get("part") == part and p.get("check_ok", True)]
            return t[0] * 1e6 if t else None
        step = next((p for p in here if p.get("part") == "step"), None)
        if step is None:
            continue
        rows.append({"point": k, "splits": step["splits"], "fused": step["fused"],
                     "kernels": step["kernels"], "kv_bytes": step["kv_bytes"],
                     "step": us("cupy_decode", part="step"),
                     "step_clean": us("cupy_decode", "clean", "step"),
                     "split": us("cupy_decode", part="decode_split"),
                     "combine": us("cupy_decode", part="decode_combine"),
                     "empty": us("empty_launch"), "empty_clean": us("empty_launch", "clean"),
                     "read": us("plain_read"), "read_clean": us("plain_read", "clean")})
    return rows


def _span(xs, spec=".1f") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return f"{lo:{spec}}" if f"{lo:{spec}}" == f"{hi:{spec}}" else f"{lo:{spec}} to {hi:{spec}}"


def decode_overheads(d: dict) -> list[str]:
    """Where a small step's time goes: the lines docs/decode.md shows."""
    rows = _overhead_rows(d)
    if not rows:
        return []

    def diff(a, b):
        return [r[a] - r[b] for r in rows if r[a] is not None and r[b] is not None]
    from flashsim.hardware.presets import gpu

    l2 = gpu("h200").l2_bytes
    combined = [r for r in rows if r["combine"] is not None]
    big = [r for r in rows if r["kv_bytes"] > 2 * l2 and r["read_clean"] and r["step_clean"]]
    least = min(big, key=lambda r: r["step"] - r["step_clean"])
    return [
        f"* Where a small step's time goes (`decode_overheads_h200.json`, {d['provenance'].get('date', '')[:10]}, "
        f"{len(rows)} points; the table's flush unless said): an empty kernel on the split "
        f"kernel's grid takes {_span(r['empty'] for r in rows)} us between the events (the "
        f"launch and the events, in every step). The split kernel alone takes "
        f"{_span(diff('split', 'read'))} us more than the plain read of the same bytes; the "
        f"step with its combine launch (programmatic dependent launch) "
        f"{_span(r['step'] - r['split'] for r in combined)} us more than its split kernel alone "
        f"(the combine alone: {_span(r['combine'] for r in combined)} us).",
        f"* The flush's dirty lines: after a clean flush (the same write, then a read of as many "
        f"other bytes) the plain read is {_span(diff('read', 'read_clean'))} us faster and the "
        f"step {_span(diff('step', 'step_clean'))} us; at the {len(big)} points whose K/V bytes "
        f"exceed twice the L2, the plain read {_span(r['read'] - r['read_clean'] for r in big)} us "
        f"and the step {_span(r['step'] - r['step_clean'] for r in big)} us (the least at B "
        f"{least['point'][0]}, kv_heads {least['point'][1]}, q_len {least['point'][3]})."]


NCU_STALLS = ["gpu__time_duration.sum", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
              "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
              "smsp__issue_active.avg.pct_of_peak_sustained_active"]


def decode_stalls_ncu() -> list[str]:
    """Where the defaults' split kernel spends its cycles at MQA, B 8, 32k (Nsight Compute's
    sections, ``--profile-point`` under ncu: decode_stalls_ncu_h200.json and .csv), and where
    its warps wait, instruction by instruction (source counters of one launch, its SASS
    page: decode_loop_sass_ncu_h200*.csv): the share of the warp-state samples at each kind of
    instruction (its opcode's first word) and at the instructions that hold the most."""
    out = []
    d = _load("decode_stalls_ncu_h200.json")
    if d and measured.path("decode_stalls_ncu_h200.csv").exists():
        parts = []
        for p, mine in _profiled_launches(d, "decode_stalls_ncu_h200.csv", NCU_STALLS):
            for r in mine:
                parts.append(f"{r['kernel_name']} at {_pt(_key(p['point']))}: {r['gpu__time_duration.sum'] / 1e3:.1f} us"
                             + (f", tensor pipe busy {r[NCU_STALLS[1]]:.0f} % of the active cycles, the "
                                f"XU pipe (exp2) {r[NCU_STALLS[2]]:.0f} %, an instruction issued in "
                                f"{r[NCU_STALLS[3]]:.0f} % of them" if r["kernel_name"] == "decode_split" else ""))
        out.append(f"* Where the defaults' step goes (Nsight Compute, `decode_stalls_ncu_h200.json`, "
                   f"{d['provenance']['date'][:10]}, the defaults then, v18; its own L2 flush and clocks "
                   "unlocked): " + "; ".join(parts) + ".")
    for name, who, at in (("decode_loop_sass_ncu_h200.csv", "v18, the defaults then", "32k"),
                          ("decode_loop_sass_ncu_h200_v21.csv", "v21, the defaults then", "32k"),
                          ("decode_loop_sass_ncu_h200_v23.csv", "v23, the defaults since", "128k")):
        path = measured.path(name)
        if not path.exists():
            continue
        rows = list(csv.reader(io.StringIO(path.read_text())))
        head = next(r for r in rows if "Source" in r and "Warp Stall Sampling (All Samples)" in r)
        src, n = head.index("Source"), head.index("Warp Stall Sampling (All Samples)")
        why = {h[len("stall_"):]: i for i, h in enumerate(head)
               if h.startswith("stall_") and "Not Issued" not in h}         # the sampled reasons
        sampled = [r for r in rows[rows.index(head) + 1:]
                   if len(r) > max(src, n) and r[n].replace(",", "").replace(".", "").isdigit()]
        body = [(float(r[n].replace(",", "")), r[src].split()) for r in sampled]
        total = sum(x for x, _ in body)
        kinds = {}
        for x, words in body:
            words = words[1:] if words and words[0].startswith("@") else words   # a predicate
            kind = words[0].split(".")[0] if words else "?"
            kinds[kind] = kinds.get(kind, 0) + x
        top = sorted(kinds.items(), key=lambda kv: -kv[1])[:6]
        heavy = sorted(body, key=lambda b: -b[0])[:4]
        reasons = {k: sum(float(r[i] or 0) for r in sampled if len(r) > i) for k, i in why.items()}
        out.append(f"* Where the split kernel's warps wait ({who}; Nsight Compute's warp-state samples "
                   f"of one launch at B 8, kv_heads 1, {at}, q_len 4, `{name}`, {int(total)} samples): by "
                   "instruction kind " + ", ".join(f"{k} {100 * x / total:.1f} %" for k, x in top)
                   + "; by reason " + ", ".join(f"{k} {100 * x / total:.1f} %" for k, x in sorted(
                       reasons.items(), key=lambda kv: -kv[1])[:4])
                   + "; the instructions holding the most: " + ", ".join(
                       f"`{' '.join(w)}` {100 * x / total:.1f} %" for x, w in heavy) + ".")
    return out


def decode_sanitizer() -> list[str]:
    """compute-sanitizer's summaries of the decode kernel's ``--sanitize`` launches (every
    variant and option on tiny ragged shapes, each checked against the float64 reference)."""
    logs = [f"decode_h200_{t}.log" for t in ("memcheck", "racecheck")]
    if not all(measured.path(x).exists() for x in logs):
        return []
    sync = "decode_h200_synccheck.log"          # the named barriers' and mbarriers' use (since v22)
    logs += [sync] if measured.path(sync).exists() else []
    summaries = [_sanitizer_summary(x) for x in logs]
    ok = [y for y in measured.path(logs[0]).read_text().splitlines()
          if y.endswith("tiny launches match the reference")]
    return [f"* compute-sanitizer on `decode_h200 --sanitize` (every version and option on tiny ragged "
            f"shapes; {ok[-1].strip() if ok else 'no check line'}): "
            + ", ".join(f"{x.split('_')[-1][:-4]} `{m}`" for x, m in zip(logs, summaries))
            + " (" + ", ".join(f"`{x}`" for x in logs) + ")."]


def decode_overheads_ncu() -> list[str]:
    """Nsight Compute without its own cache control (``--overheads-profile``): the DRAM bytes
    written during the plain read and the step after each flush
    (``views.decode.overhead_profile``)."""
    from flashsim.views import decode as dv

    launches = dv.overhead_profile()
    if not launches:
        return []
    written = {}
    for x in launches:
        k = (x["batch"], x["kv_heads"], x["kv_len"], x["q_len"], x["what"], x["flush"])
        written[k] = written.get(k, 0) + x["dram_write_bytes"]
    parts = []
    for k in dict.fromkeys(k[:5] for k in written):
        B, kvh, n, ql, what = k
        parts.append(f"{what.replace('_', ' ')} at B {B}, kv_heads {kvh}, {n // 1024}k: "
                     f"{written[(*k, 'dirty')] / 1e6:.1f} MB after the table's flush, "
                     f"{written[(*k, 'clean')] / 1e6:.1f} MB after a clean one")
    flush = launches[0]["l2_flush_bytes"]
    return [f"* What reaches DRAM as writes during a launch that follows the flush (Nsight "
            f"Compute, `--cache-control none`, `decode_overheads_ncu_h200.csv`; the flush writes "
            f"{flush / 1e6:.0f} MB): " + "; ".join(parts) + "."]


def decode_l2_hints_ncu() -> list[str]:
    """Nsight Compute without its own cache control (``--l2-hints-profile``): per hint, the
    split kernel's DRAM bytes read and L2 sectors requested over the K/V bytes, its DRAM
    bytes written after the table's flush, and the no-hint time over its time after each."""
    from flashsim.views import decode as dv

    launches = [x for x in dv.flush_profile("decode_l2_hints_ncu_h200", ("dram__bytes_read.sum",
                "lts__t_sectors_srcunit_tex_op_read.sum", "gpu__time_duration.sum"))
                if x["what"] == "step" and x["kernel"] == "decode_split"]
    if not launches:
        return []
    t = {(_key(x), x["flush"], x["hint"]): x["gpu__time_duration.sum"] for x in launches}

    def span(xs, fmt="{:.3f}"):
        return fmt.format(min(xs)) + ("" if round(min(xs), 3) == round(max(xs), 3) else " to " + fmt.format(max(xs)))
    parts = []
    for hint in dict.fromkeys(x["hint"] for x in launches):
        mine = [x for x in launches if x["hint"] == hint]
        part = (f"{hint}: DRAM read {span([x['dram__bytes_read.sum'] / x['kv_bytes'] for x in mine])}, "
                f"L2 sectors requested {span([32 * x['lts__t_sectors_srcunit_tex_op_read.sum'] / x['kv_bytes'] for x in mine])}, "
                f"written after the table's flush {span([x['dram_write_bytes'] / 1e6 for x in mine if x['flush'] == 'dirty'], '{:.1f}')} MB")
        if hint != "none":
            part += "; the time without a hint over the time with it, after " + ", after ".join(
                f"{FLUSHES[f]} {span([t[(_key(x), f, 'none')] / t[(_key(x), f, hint)] for x in mine if x['flush'] == f])}"
                for f in ("dirty", "clean"))
        parts.append(part)
    pts = "; ".join(_pt(k) for k in dict.fromkeys(_key(x) for x in launches))
    return [f"* What the hints do to the split kernel's traffic (Nsight Compute, `--cache-control none`, "
            f"`decode_l2_hints_ncu_h200.csv`; once after each flush at {pts}; bytes over the K/V bytes): "
            + "; ".join(parts) + "."]


DECODE_CALIBRATION_KV_LEN = 32768     # the decode time model's split, made before its change


def decode_model(d: dict) -> list[str]:
    """flashsim's predicted step time against the measured one (notebook 08's picture), at
    the calibration points (kv_len 32k) and the held-out ones (4k, 128k), starting from the
    L2 the flush leaves and, as before that term, from a clean one."""
    from flashsim.views import decode as dv

    dirty = dv.flush_dirty_bytes()
    if not dirty:
        return []

    def cells(rows):
        r = [x["time_s"] / x["predicted_s"] for x in rows]
        return (f"median {statistics.median(r):.2f}, {min(r):.2f} to {max(r):.2f}, within 1.25x "
                f"at {sum(1 / 1.25 <= x <= 1.25 for x in r)} of {len(r)}, within 1.5x at "
                f"{sum(1 / 1.5 <= x <= 1.5 for x in r)}")

    parts = []
    for label, amount in (("from the flush's dirty lines", dirty), ("from a clean L2", 0)):
        rows = dv.measured_table(dirty_bytes=amount)
        cal = [x for x in rows if x["kv_len"] == DECODE_CALIBRATION_KV_LEN]
        held = [x for x in rows if x["kv_len"] != DECODE_CALIBRATION_KV_LEN]
        parts.append(f"{label}: calibration (kv_len 32k) {cells(cal)}; held out (4k, 128k) "
                     f"{cells(held)}")
    return [f"* flashsim's predicted step time against the measured one (measured / predicted, "
            f"our fastest configuration of each point and page size, as notebook 08 draws them; the memory-bound model has no "
            f"fitted constant; the flush's {dirty / 1e6:.1f} MB of dirty lines are Nsight "
            f"Compute's): " + "; ".join(parts) + "."]


def decode_overheads_table(d: dict) -> list[str]:
    def f(x):
        return "" if x is None else f"{x:.1f}"
    return _table(["B", "kv_heads", "kv_len", "q_len", "splits", "step us", "step us, clean flush",
                   "split kernel alone us", "combine alone us", "empty launch us",
                   "plain read us", "plain read us, clean flush"],
                  [[*r["point"], f"{r['splits']}{' fused' if r['fused'] else ''}", f(r["step"]),
                    f(r["step_clean"]), f(r["split"]), f(r["combine"]), f(r["empty"]), f(r["read"]),
                    f(r["read_clean"])] for r in _overhead_rows(d)])


def decode(lines):
    d = _load("decode_h200.json")
    if not d:
        return
    lines += ["## Decode step (H200)", "", f"Provenance: {_prov(d['provenance'])}.", "",
              "One decode step, H = 32 query heads, d = 128, fp16; bandwidth = the K/V bytes a "
              "step must read over its time. Ours is `cupy_decode` (the fastest correct of the "
              "configurations timed in the run, versions and cache layouts; v1 where the file "
              "names none): token-major, the cache (B, kv_len, kv_heads, d) itself; head-major, "
              "PyTorch's own (B, kv_heads, kv_len, d) tensors through transposed views. Paged: "
              "`cupy_decode_paged` (pages of 1, 16, 64, \"NHD\" and \"HND\"), PyTorch SDPA's flash, cuDNN and math "
              "backends and flex_attention where they ran; every implementation checked against "
              f"a float64 reference first ({d.get('failed_checks', 0)} failed checks).", ""]
    lines += decode_done_when(d) + decode_done_when_rerun() + decode_ties_runs() + decode_vs_flashinfer(d) \
        + decode_layouts(d) + [""]
    lines += decode_table(d)
    lines.append("")
    o = _load("decode_overheads_h200.json")
    if o:
        lines += ["### Where a small step's time goes", "", f"Provenance: {_prov(o['provenance'])}.", "",
                  "Ours (the default launch), each of its kernels alone, an empty kernel on the split "
                  "kernel's grid and the plain read, in us (CUDA events, median), after the table's "
                  "flush (a write of 2 x L2, which leaves dirty lines) and after a clean one (that "
                  "write, then a read of as many other bytes):", ""]
        lines += decode_overheads(o) + decode_overheads_ncu() + [""]
        lines += decode_overheads_table(o) + [""]
    cf = _load("decode_configs_h200.json")
    if cf:
        lines += ["### Other configurations where ours fell short", "",
                  f"Provenance: {_prov(cf['provenance'])}.", ""]
        lines += decode_configs(cf) + decode_configs_ncu() + [""]
    c4 = _load("decode_configs_q4_h200.json")
    if c4:
        lines += ["### MQA at q_len 4: other configurations", "",
                  f"Provenance: {_prov(c4['provenance'])}.", ""]
        lines += decode_configs_q4(c4) + [""]
    cm = _load("decode_configs_mqa_h200.json")
    if cm and cm.get("summary"):
        lines += ["### MQA at q_len 1, B 8: other configurations", "",
                  f"Provenance: {_prov(cm['provenance'])}.", ""] + decode_configs_mqa(cm) + [""]
    fi = _load("decode_flashinfer_h200.json")
    if fi:
        lines += ["### FlashInfer beside ours", "", f"Provenance: {_prov(fi['provenance'])}.", ""]
        lines += decode_flashinfer(fi) + [""] + decode_flashinfer_table(fi) + [""]


def _with_block(md: pathlib.Path, block: list[str]) -> str:
    """The text of ``md`` with the lines between its START and END markers made ``block``."""
    text = md.read_text()
    a, b = text.index(START), text.index(END) + len(END)
    return text[:a] + "\n".join([START, *block, END]) + text[b:]


def decode_md_text() -> str:
    """docs/decode.md with its measured block regenerated from decode_h200.json."""
    d = _load("decode_h200.json")
    block = ["The kernel against the issue's targets, from `flashsim/measured/data/decode_h200.json`"
             " (the whole table: [measurements](measurements.md#decode-step-h200)):", ""]
    block += (decode_done_when(d) + decode_done_when_rerun() + decode_ties_runs() + decode_vs_flashinfer(d)
              + decode_layouts(d) + decode_v5_w4(d) + decode_v6(d)
              + decode_v7(d) + decode_v8(d) + decode_v9(d) + decode_v9_w4(d) + decode_v10(d)
              + decode_v11(d) + decode_v14(d)) if d \
        else ["Not measured yet."]
    v10a = _load("decode_h200_v10a.json")
    block += decode_v10(v10a, "decode_h200_v10a.json", "; its first build, 16 loads a warp in "
                        "107 registers, 4 blocks an SM") if v10a else []
    sw = _load("decode_splits_h200.json")
    block += decode_splits(sw) if sw else []
    for P, role in ((16, "the paged default's rule chosen here"), (1, "held out"), (64, "held out")):
        swp = _load(f"decode_splits_p{P}_h200.json")
        block += decode_splits(swp, f"decode_splits_p{P}_h200.json", role) if swp else []
    nc = _load("decode_ncu_h200.json")
    block += decode_ncu(nc) if nc else []
    o = _load("decode_overheads_h200.json")
    block += decode_overheads(o) if o else []
    block += decode_overheads_ncu()
    cf = _load("decode_configs_h200.json")
    block += decode_configs(cf) if cf else []
    block += decode_configs_ncu()
    c4 = _load("decode_configs_q4_h200.json")
    block += decode_configs_q4(c4) if c4 else []
    cm = _load("decode_configs_mqa_h200.json")
    block += decode_configs_mqa(cm) if cm else []
    fi = _load("decode_flashinfer_h200.json")
    block += decode_flashinfer(fi) if fi else []
    lh = _load("decode_l2_hints_h200.json")
    block += decode_rounds(lh, "decode_l2_hints_h200.json", "hint", "L2 hints on the K/V copies (v13; "
                           "the defaults with each hint)") if lh else []
    block += decode_l2_hints_ncu()
    for name, what in (("decode_phased_h200.json", "K and V loaded apart (v14's loop; \"phased\" at the "
                        "defaults' splits, and at the wave rule's)"),
                       ("decode_phased_heldout_h200.json", "The phased loop off the table's grid, "
                        "held out (8 points without splits, at most 16 rows a KV head)")):
        ph = _load(name)
        block += decode_rounds(ph, name, "config", what) if ph else []
    for name, note in (("decode_half_rows_first_h200.json", "; the run that chose it, its \"defaults\" v9"),
                       ("decode_half_rows_h200.json", "; again, after v16 became the default")):
        hr = _load(name)
        block += decode_half_rows(hr, name, d["configs"], note) if hr and d else []
    pr = _load("decode_producer_h200.json")
    block += decode_rounds_split(
        pr, "decode_producer_h200.json", d["configs"], "v17 (a producer warp issues the tiles; no "
        "barrier of the whole block a tile)", ("at the table's MQA points below 0.9 of the plain read "
                                               "and beside them, where it was tried; its \"defaults\" the "
                                               "defaults before v17 (v9 at two warpgroups, v16 at one)",
                                               "held out in the same run: off the grid, chosen before "
                                               "v17 was first timed")) if pr and d else []
    ph = _load("decode_producer_heldout_h200.json")
    block += decode_rounds(ph, "decode_producer_heldout_h200.json", "config", "v17 held out at long "
                           "loops: off the grid, two warpgroups, 34 to 128 tiles a block, chosen after "
                           "the run above and before any timing there") if ph else []
    kl = _load("decode_kv_lens_h200.json")
    block += decode_rounds_split(
        kl, "decode_kv_lens_h200.json", d["configs"], "v18 (the kv_lens by value, a kernel parameter)",
        ("at the table's short steps where ours fell behind PyTorch's best or near it, and MQA at B 8 "
         "32k, where it was tried", "held out: off the grid, chosen before v18 was first timed")) if kl and d else []
    sg = _load("decode_stagger_h200.json")
    block += decode_rounds_split(
        sg, "decode_stagger_h200.json", d["configs"], "v19 (v17's producer asking for its first tiles one "
        "at a time; an option, not the defaults)", ("at the table's MQA points of q_len 4, where it was tried",
                                                    "held out: off the grid, two warpgroups, short loops, chosen "
                                                    "before v19 was first timed")) if sg and d else []
    block += decode_stalls_ncu()                     # v18's warp samples, which v21 answers, and v21's
    held = "held out: off the grid, {}chosen before {} was first timed"
    for name, what, parts in (
            ("decode_overlap_producer_h200.json", "v20 (v17's producer with v11's overlap: a tile's softmax "
             "while the previous tile's P V is on the tensor cores, 3 stages; an option, not the defaults)",
             ("at the table's MQA points of q_len 4, where it was tried", held.format("two warpgroups, ", "v20"))),
            ("decode_q_first_h200.json", "v21 (Q_i's loads issued before the K/V tiles'; the defaults since; "
             "the first run)", ("at the table's short MQA steps and B 8 at 32k, where it was chosen",
                                held.format("", "v21"))),
            ("decode_q_first_h200_rerun.json", "v21 (Q_i's loads issued before the K/V tiles'; the defaults "
             "since; again, in another run)", ("at the table's short MQA steps and B 8 at 32k, where it was "
                                               "chosen", held.format("", "v21"))),
            ("decode_stages_h200.json", "v21 at 3 stages of 128-key tiles, alone and with v19's prologue "
             "(options, not the defaults)", ("at the table's MQA points of q_len 4 and B 8 MQA 32k, where it "
                                             "was tried", "held out: off the grid, chosen before any timing there")),
            ("decode_pingpong_producer_h200_first.json", "v22 (v21 with strict ping-pong turns of the two "
             "consumer warpgroups; an option, not the defaults; the first run, its turns' barrier id computed)",
             ("at the table's MQA points of q_len 4, where it was tried", held.format("two warpgroups, ", "v22"))),
            ("decode_pingpong_producer_h200.json", "v22 again, its barrier ids constants",
             ("at the table's MQA points of q_len 4", "at the same held-out points")),
            ("decode_pingpong_producer_h200_lambdas.json", "v22 once more, its turns v23's lambdas (the "
             "kernel since; a 3 ms lead)", ("at the table's MQA points of q_len 4", "at the same held-out points")),
            ("decode_turn_pv_h200.json", "v23 (v22 whose turn issues P_{j-1} V_{j-1} with S_j, "
             "FlashAttention-3's grouping; at 2 and 3 stages)", ("at the table's MQA points of q_len 4, "
                                                                 "where its rule was read off",
                                                                 held.format("two warpgroups, ", "v23"))),
            ("decode_turn_pv_heldout_h200.json", "The rule for v23 (default_turn_pv: 3 stages, more than 16 "
             "tiles a split; \"defaults\"; the defaults since)", ("at the table's points",
                                                                  "held out: off the grid, chosen after the "
                                                                  "run above and before any timing there; "
                                                                  "18 to 64 tiles a split, and 4 and 8, where "
                                                                  "the rule keeps v21")),
            ("decode_turn_overlap_h200.json", "v24 (v23's turns with v20's overlap inside a warpgroup; an "
             "option, not the defaults)", ("at the table's MQA points of q_len 4, where it was tried",
                                           held.format("", "v24"))),
            ("decode_tree_softmax_h200.json", "v25 (the softmax's row max and sum in 4 partial chains, on "
             "the defaults; an option, not the defaults)", ("at the table's MQA points of q_len 4 and of "
                                                            "q_len 1 with B >= 8, where it was tried",
                                                            held.format("", "v25"))),
            ("decode_chunks_q4_h200.json", "One warpgroup on each 64-row chunk of a KV head's rows (v9_w4's "
             "layout with v21's loads; configure's warps=4, wgmma=1; not the defaults) at short MQA steps of "
             "q_len 4", ("at the table's points", "held out: off the grid, chosen before any timing there")),
            ("decode_chunks_rule_first_h200.json", "--chunks-rule's first run: v23 against one warpgroup a "
             "64-row chunk (128- and 64-key tiles; not then the defaults), timed with the harness's 0.5 ms "
             "lead, which our host's issue of a call outlasted (ours scattered between rounds)",
             ("at the table's MQA points of q_len 4", "held out: off the grid, chosen before this run"))):
        r = _load(name)
        block += decode_rounds_split(r, name, d["configs"], what, parts) if r and d else []
    for name, what in (("decode_chunks_rule_h200.json", "--chunks-rule again, the same 0.5 ms lead"),
                       ("decode_chunks_rule_lead3_h200.json", "--chunks-rule with a 3 ms lead (the "
                        "benchmark's since)")):
        r = _load(name)
        block += decode_chunks_rule(r, name, d["configs"], what) if r and d else []
    block += decode_launch_times(d) if d else []
    hi = _load("decode_host_issue_h200.json")
    block += decode_host_issue(hi) if hi else []
    ab = _load("decode_host_issue_ab_h200.json")
    block += decode_host_issue_ab(ab) if ab else []
    block += decode_sanitizer()
    tl = _load("decode_timeline_h200.json")
    block += decode_timeline(tl) if tl else []
    ck = _load("decode_clock_ramp_h200.json")
    block += decode_clock_ramp(ck) if ck else []
    cl = _load("decode_h200_clocks.json")
    block += decode_clocks(d, cl) if d and cl else []
    block += decode_model(d) if d else []
    return _with_block(DECODE_MD, block)


HOPPER_VERSIONS = ("cupy_flash3_v1", "cupy_flash3_v2", "cupy_flash3_v3", "cupy_flash3_v4")
HOPPER_PEERS = ("cupy_flash2_tc", "torch_flash", "torch_cudnn", "torch_efficient", "torch_flex")


def _sanitizer_summary(name: str) -> str | None:
    """The summary line compute-sanitizer printed at the end of a committed log."""
    if not measured.path(name).exists():
        return None
    lines = [x for x in measured.path(name).read_text().splitlines() if "SUMMARY:" in x]
    return lines[-1].split("SUMMARY:", 1)[1].strip() if lines else None


def hopper_facts(d: dict) -> list[str]:
    """What hopper_h200.json (and the sanitizer logs) say about the Hopper kernel, as bullets."""
    checks = d["correctness"]
    shapes = sorted({c["N"] for c in checks})
    by = {(p["impl"], p["d"], p["N"], p["causal"]): p["tflops"] for p in d["points"]}
    keys = sorted({k[1:] for k in by if k[0] in HOPPER_VERSIONS})
    best = [max(HOPPER_VERSIONS, key=lambda v: by.get((v, *k), 0.0)) for k in keys]
    v43 = [by[("cupy_flash3_v4", *k)] / by[("cupy_flash3_v3", *k)] for k in keys
           if ("cupy_flash3_v4", *k) in by and ("cupy_flash3_v3", *k) in by]
    r = d["best_vs_torch_flash"]
    goal = [x for x in r if x["d"] in (64, 128) and x["N"] >= 2048]
    out = [f"* Correct first: {sum(c['ok'] and c.get('lse_ok', True) for c in checks)} of "
           f"{len(checks)} checks passed (versions {', '.join(map(str, d['versions_passed']))}; "
           f"d = {', '.join(map(str, sorted({c['d'] for c in checks})))}; "
           f"{' and '.join(sorted({c['dtype'] for c in checks}))}; causal or not; N = "
           f"{', '.join(map(str, shapes))}), O against the float64 reference with "
           "flash-attention's rule and L against the float64 logsumexp."]
    mem, race = (_sanitizer_summary(f"hopper_h200_{t}.log") for t in ("memcheck", "racecheck"))
    if mem and race:
        out.append(f"* compute-sanitizer on the `--sanitize` launches (every version, every d, "
                   f"causal or not): memcheck `{mem}`, racecheck `{race}` "
                   "(`hopper_h200_memcheck.log`, `hopper_h200_racecheck.log`).")
    v3 = [by[("cupy_flash3_v3", *k)] / by[(v, *k)] for v, k in zip(best, keys)]
    out.append("* Fastest version: " + ", ".join(
        f"{v.rsplit('_', 1)[1]} at {best.count(v)}" for v in HOPPER_VERSIONS if best.count(v))
        + f" of {len(keys)} points; v3 / the fastest at least {min(v3):.2f}; v4 / v3 from "
        f"{min(v43):.2f} to {max(v43):.2f}.")
    out.append(f"* Best version / PyTorch's flash backend: {min(x['ratio'] for x in r):.2f} to "
               f"{max(x['ratio'] for x in r):.2f}; at d = 64 and 128, N >= 2048: at least 1 at "
               f"{sum(x['ratio'] >= 1 for x in goal)} of {len(goal)} points (issue 19's bar).")
    cud = [by[(v, *k)] / by[("torch_cudnn", *k)] for v, k in zip(best, keys)
           if ("torch_cudnn", *k) in by]
    if cud:
        out.append(f"* Best version / cuDNN's backend: {min(cud):.2f} to {max(cud):.2f}.")
    return out


def hopper_gains(d: dict) -> list[str]:
    """Each step's measured gain (``step_gains``) beside the Hopper chapter's schedule model
    (``flashsim.hardware.schedules.FLASH3_VERSIONS``) at the same points."""
    from flashsim.hardware import schedules   # noqa: PLC0415 - only for this table
    predicted = {(g["d"], g["causal"], g["step"]): g["geomean_gain"]
                 for g in schedules.step_gains(schedules.flash3_versions(d))}

    def how(step):
        return " / ".join(f"{s}, {lo} loads" for s, lo in (schedules.FLASH3_VERSIONS[int(v)]
                          for v in step.replace("v", "").split(" -> ")))

    return _table(["d", "causal", "step", "N", "measured gain", "predicted gain",
                   "model schedules (from / to)"],
                  [[g["d"], g["causal"], g["step"], g["points"], f"{g['geomean_gain']:.2f}",
                    f"{predicted[(g['d'], g['causal'], g['step'])]:.2f}", how(g["step"])]
                   for g in d["step_gains"]])


def hopper_points(d: dict) -> list[str]:
    """TFLOP/s of every implementation per (d, causal, N)."""
    by = {(p["impl"], p["d"], p["N"], p["causal"]): p["tflops"] for p in d["points"]}
    impls = [i for i in HOPPER_VERSIONS + HOPPER_PEERS if any(k[0] == i for k in by)]
    rows = [[dd, c, N] + [_f(by.get((i, dd, N, c)), ".1f") for i in impls]
            for dd, N, c in sorted({k[1:] for k in by}, key=lambda k: (k[0], k[2], k[1]))]
    return _table(["d", "causal", "N"] + [i.replace("cupy_flash3_", "") for i in impls], rows)


def hopper(lines):
    d = _section(lines, "hopper_h200.json", "The Hopper kernel beside PyTorch (H200)")
    if not d:
        return
    lines += ["`cupy_flash3` (`gpu_kernels/cuda/flash3.cu`, [hopper_kernel.md](hopper_kernel.md)), "
              "every version, fp16 forward, the FlashAttention-2 paper's configurations (16k "
              "tokens, hidden 2048), beside our mma.sync kernel and PyTorch's backends in the "
              "same run:", ""]
    lines += hopper_facts(d) + [""]
    lines += ["Each step's gain (geometric mean over N of TFLOP/s ratios) beside what the "
              "schedule model of [hopper.md](hopper.md) predicts at the same points:", ""]
    lines += hopper_gains(d) + ["", "TFLOP/s:", ""]
    lines += hopper_points(d)
    lines.append("")


def hopper_kernel_md_text() -> str:
    """docs/hopper_kernel.md with its measured block regenerated from hopper_h200.json."""
    d = _load("hopper_h200.json")
    block = ["From `flashsim/measured/data/hopper_h200.json` (the TFLOP/s of every point: "
             "[measurements](measurements.md#the-hopper-kernel-beside-pytorch-h200)):", ""]
    if d:
        block += hopper_facts(d) + ["", "Each step's measured gain beside the gain the schedule "
                                    "model of the Hopper chapter predicts for it:", ""]
        block += hopper_gains(d)
        if _split_summaries():
            block += ["", "The model on its Nsight Compute points (`flashsim predict`, "
                      "`python -m flashsim.measured.validation`; docs/model.md says why it "
                      f"misses where it does): {_kernel_targets('cupy_flash3')}."]
    else:
        block += ["Not measured yet."]
    return _with_block(HOPPER_MD, block)


MASK_FAMILIES = ("sliding", "document", "causal", "prefix")


def _sanitizer_checks(name: str) -> tuple[int, int]:
    """(launches that passed, launches) of the ``--sanitize`` run a committed log records."""
    checks = [x for x in measured.path(name).read_text().splitlines() if x.startswith("  check ")]
    return sum(": ok " in x for x in checks), len(checks)


def masks_facts(d: dict) -> list[str]:
    """What masks_h200.json, the sanitizer logs and the masked time model say, as bullets."""
    from flashsim.measured import masked_time as mt   # noqa: PLC0415 - only for this block
    checks = d["correctness"]
    out = [f"* Correct first: {sum(c['ok'] for c in checks)} of {len(checks)} checks passed "
           f"(every family and a mask with rows that see no key; N = "
           f"{', '.join(map(str, sorted({c['N'] for c in checks})))}; d = "
           f"{', '.join(map(str, sorted({c['d'] for c in checks})))}; fp16), O against the "
           "float64 reference with flash-attention's rule, L against the float64 logsumexp, "
           "O = 0 and L = -inf where a row sees no key; every timed point checked on its own "
           f"inputs ({sum(not p['check_ok'] for p in d['points'])} failed)."]
    logs = [f"masks_h200_{t}.log" for t in ("memcheck", "racecheck")]
    if all(measured.path(x).exists() for x in logs):
        (mem, race), (ok, n) = (_sanitizer_summary(x) for x in logs), _sanitizer_checks(logs[0])
        out.append(f"* compute-sanitizer on the `--sanitize` launches ({ok} of {n} passed: every "
                   f"family, N = 333, d = 64 and 128): memcheck `{mem}`, racecheck `{race}` "
                   f"(`{logs[0]}`, `{logs[1]}`).")
    by = {(p["impl"], p["d"], p["N"], p["mask"]): p["time_ms"] for p in d["points"]}
    ours = [k[1:] for k in by if k[0] == "cupy_flash3_mask"]
    flex = [(k, by[("cupy_flash3_mask", *k)] / by[("torch_flex", *k)]) for k in ours
            if ("torch_flex", *k) in by]
    if flex:
        fam = sorted({k[2].split(":")[0] for k, _ in flex})
        out.append(f"* Ours / `flex_attention` with a block mask (N = "
                   f"{', '.join(map(str, sorted({k[1] for k, _ in flex})))}; {', '.join(fam)}): "
                   f"{min(r for _, r in flex):.2f} to {max(r for _, r in flex):.2f} of its time; "
                   f"faster at {sum(r < 1 for _, r in flex)} of {len(flex)} points.")
    sdpa = [by[("torch_sdpa_mask", *k)] / by[("cupy_flash3_mask", *k)] for k in ours
            if ("torch_sdpa_mask", *k) in by]
    if sdpa:
        out.append(f"* SDPA with the dense boolean mask takes {min(sdpa):.1f}x to {max(sdpa):.1f}x "
                   f"our masked kernel's time ({len(sdpa)} points).")
    rs = mt.all_rows()
    cons = "; ".join(f"d = {hd}: " + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} "
                                               f"{v * 1e6:.2f} us" for k, v in c.items())
                     for hd, c in mt.CONSTANTS.items())
    out.append(f"* The time model (`flashsim.measured.masked_time`), fitted at N = "
               f"{mt.CALIBRATION_N} only: {cons}.")
    for split, s in mt.summary(rs).items():
        out.append(f"* {split.capitalize()} ({s['points']} masked points): ratio within "
                   f"{mt.TOLERANCE:.0%} at {s['ratio_within']} (worst {s['worst_ratio_error']:.1%}); "
                   f"time within {s['worst_time_error']:.1%}, the unmasked kernel's within "
                   f"{s['worst_unmasked_time_error']:.1%}; the benchmark's s + p kappa within "
                   f"{mt.TOLERANCE:.0%} at {s['benchmark_within']} (worst "
                   f"{s['benchmark_worst_error']:.1%}).")
    worst = max((r for r in rs if r["split"] == "held-out"), key=lambda r: abs(r["time_error"]))
    out.append(f"* Largest held-out time error: d = {worst['d']}, N = {worst['N']}, "
               f"{worst['family']}, the model {worst['predicted_ms'] / worst['measured_ms']:.2f} "
               "of the measured time.")
    miss = mt.misses(rs)
    out.append("* Held-out and fresh misses: " + ("none." if not miss else "; ".join(
        f"d = {k[0]}, N = {k[1]}, {k[2]}: {mt.KNOWN_MISSES.get(k, 'not listed')}"
        for k in sorted(miss)) + "."))
    return out


def masks_readme(d: dict) -> str:
    """The README's line on the masked kernel."""
    from flashsim.measured import masked_time as mt   # noqa: PLC0415
    by = {(p["impl"], p["d"], p["N"], p["mask"]): p["time_ms"] for p in d["points"]}
    flex = [by[("cupy_flash3_mask", *k[1:])] / t for k, t in by.items()
            if k[0] == "torch_flex" and ("cupy_flash3_mask", *k[1:]) in by]
    summ = mt.summary(mt.all_rows())
    s, f = summ["held-out"], summ.get("fresh", {"ratio_within": 0, "points": 0})
    return (f"* Masked Hopper kernel (`cupy_flash3` with `mask=`, N = {min(d['configs']['N'])} to "
            f"{max(d['configs']['N'])}, {', '.join(MASK_FAMILIES)}): {min(flex):.2f}x to {max(flex):.2f}x "
            "`flex_attention`'s time at its points; time / unmasked time within "
            f"{mt.TOLERANCE:.0%} of the query-block model at {s['ratio_within']} of "
            f"{s['points']} held-out points and {f['ratio_within']} of {f['points']} launches "
            "measured after its fit (`docs/masks.md`).")


def masks_table(d: dict) -> list[str]:
    """Per masked point: tile fractions, times of ours, flex and SDPA, measured ratio to the
    unmasked kernel beside the model's and the benchmark's s + p kappa."""
    from flashsim.measured import masked_time as mt   # noqa: PLC0415
    fresh = _load(mt.FRESH) or {"points": []}
    by = {(p["impl"], p["d"], p["N"], p["mask"]): p["time_ms"] for p in d["points"] + fresh["points"]}
    return _table(["split", "d", "N", "mask", "s", "p", "ours ms", "flex ms", "SDPA ms",
                   "time / unmasked", "model", "s + p kappa"],
                  [[r["split"], r["d"], r["N"], r["family"], f"{r['non_skipped_fraction']:.3f}",
                    f"{r['partial_fraction']:.3f}", f"{r['measured_ms']:.3f}",
                    _f(by.get(("torch_flex", r["d"], r["N"], r["mask"])), ".3f") or "-",
                    _f(by.get(("torch_sdpa_mask", r["d"], r["N"], r["mask"])), ".3f") or "-",
                    f"{r['measured_ratio']:.3f}", f"{r['predicted_ratio']:.3f}",
                    f"{r['benchmark_ratio']:.3f}"] for r in mt.all_rows()])


def masks(lines):
    d = _section(lines, "masks_h200.json", "Masks on the Hopper kernel (H200)")
    if not d:
        return
    lines += ["`cupy_flash3` with `mask=` (`flash3.cu`, MASK = 1, [masks.md](masks.md)), fp16 "
              "forward, batch 1, 2048 / d heads, beside our unmasked kernel, `flex_attention` "
              "with a block mask and SDPA with the dense boolean mask, in the same run. s: the "
              "non-skipped tile fraction, p: the partial one (128 x 128 tiles):", ""]
    lines += masks_facts(d) + [""]
    lines += masks_table(d)
    lines.append("")


def masks_md_text() -> str:
    """docs/masks.md with its measured block regenerated from masks_h200.json."""
    d = _load("masks_h200.json")
    block = ["From `flashsim/measured/data/masks_h200.json` (and the sanitizer logs beside it; "
             "the section of [measurements](measurements.md#masks-on-the-hopper-kernel-h200) "
             "is the same):", ""]
    block += (masks_facts(d) + ["", *masks_table(d)]) if d else ["Not measured yet."]
    return _with_block(MASKS_MD, block)


def counters(lines):
    d = _load("ncu_h200_predictions.json")
    data = _load("ncu_h200.json")
    if not d or not data:
        return
    s = d["summary"]
    lines += ["## The model against hardware counters (H200, Nsight Compute)", "",
              f"Provenance: {_prov(data['provenance'])}.", "",
              f"{s['points']} points. Predictions are computed by `python -m flashsim.measured.validation` "
              "from each point's configuration (notebook 06 plots them).", ""]
    lines += _table(["target", "result"], [
        ["DRAM bytes within 10 % at every point", f"{s['dram_within_10pct']} of {s['points']} (worst {s['dram_worst_rel_error']:.3f})"],
        ["L2 request bytes within 15 % at every point", f"{s['l2_within_15pct']} of {s['points']} (worst {s['l2_worst_rel_error']:.3f})"],
        ["time within a factor 1.5 at every point", f"{s['time_within_1_5x']} of {s['points']} (ratios {s['time_ratio_min']:.2f} to {s['time_ratio_max']:.2f})"],
        ["Spearman rank correlation of time >= 0.9", f"{s['time_spearman']:.3f}"],
    ])
    if s.get("sm_read_points"):
        lines += ["", "Between the SMs and the L2: the model's read requests against the sectors "
                  "the SMs requested (L1 request counters), and the L2-request error once the "
                  "measured L1 hits and L2-request-coalescer merges are taken off the model's "
                  "read requests and the SMs' store requests stand for its writes:", ""]
        lines += _table(["check", "result"], [
            ["model read bytes vs SM read requests",
             f"{s['sm_read_points']} points, worst {s['sm_read_worst_rel_error']:.4f}"],
            ["L2 request bytes within 15 % after L1 hits, merges and store requests",
             f"{s['l2_after_l1_coalescer_stores_within_15pct']} of {s['points']} (worst "
             f"{s['l2_after_l1_coalescer_stores_worst_rel_error']:.3f})"],
        ])
        from flashsim.measured import validation   # noqa: PLC0415 - only for this table
        rows = validation.stored_rows()
        misses = [r for r in rows if validation.errors(r)["l2"] > 0.15]

        def share(r, key):          # of the SMs' read requests; none counted for TMA loads
            sm = r["measured"]["sm_read_bytes"]
            return f"{r['measured'][key] / sm:.3f}" if sm else "TMA"

        lines += ["", f"The {len(misses)} points that miss the L2 target, with their counters "
                  "(TMA: the kernel loads through the tensor memory accelerator, which no L1 "
                  "request counter sees; such points are not in the SM read request row "
                  "above):", ""]
        lines += _table(["point (kernel, N, d, causal, B_r, B_c)", "L2 error", "L1 hits",
                         "coalescer merges", "store requests / model sectors", "error after"],
                        [[str(validation.point_key(r["point"])),
                          f"{validation.errors(r)['l2']:.3f}",
                          share(r, "l1_hit_read_bytes"), share(r, "lrc_merged_read_bytes"),
                          f"{r['measured']['sm_write_bytes'] / r['predicted']['l2_write_bytes']:.2f}",
                          f"{validation.filtered_l2_error(r):.3f}"] for r in misses])
    lines.append("")


def _measure_shape(config: dict) -> str:
    """A decode row's shape as flashsim measure's table says it."""
    from flashsim import measure   # noqa: PLC0415 - only for this table

    return measure.shape_line(config).removeprefix("decode: ")


def measure_all(lines):
    d = _load("measure_h200.json")
    if not d:
        return
    lines += ["## `flashsim measure --all --ncu` (H200)", "",
              f"Provenance: {_prov(d['provenance'])}.", "",
              f"`{d['command']}` at its default shape: each registered forward kernel"
              + (" (each decode kernel at its default decode step, "
                 + "; ".join(dict.fromkeys(_measure_shape(r["config"]) for r in d["rows"]
                                           if "kv_heads" in r["config"])) + ")"
                 if any("kv_heads" in r["config"] for r in d["rows"]) else "")
              + " checked against the float64 reference, timed by the harness, profiled once "
              "by Nsight Compute, beside `flashsim predict` for the same launch (measured / "
              "predicted):", ""]

    def cells(a, b, scale):
        """measured, predicted and their ratio (blank when either is missing)."""
        if a is None or not b:
            return "", "", ""
        return f"{a * scale:.4g}", f"{b * scale:.4g}", f"{a / b:.2f}"

    def dram(x):
        return (x.get("dram_read_bytes") or 0) + (x.get("dram_write_bytes") or 0)

    rows = []
    for r in d["rows"]:
        m, p = r.get("measured") or {}, r.get("predicted") or {}
        t = cells(m.get("time_s"), p.get("predicted_time_s"), 1e3)
        l2 = cells(m.get("l2_read_bytes"), p.get("l2_read_bytes"), 1e-6)
        rows.append([r["kernel"], r["config"]["dtype"],
                     f"{r['tiles']['block_rows']}x{r['tiles']['block_cols']}",
                     "ok" if r["check_ok"] else "FAILED", *t, *cells(dram(m), dram(p), 1e-6), *l2])
    lines += _table(["kernel", "dtype", "tiles", "check", "time ms", "predicted", "ratio",
                     "DRAM MB", "predicted", "ratio", "L2 read requests MB", "predicted", "ratio"],
                    rows)
    lines.append("")


def sfu(lines):
    d = _load("sfu_h200.json")
    if not d:
        return
    from flashsim.measured import sfu as model   # noqa: PLC0415 - only for this table
    rows = model.compare(d)
    lines += ["## Special-function instructions (H200, Nsight Compute)", "",
              f"Provenance: {_prov(d['provenance'])}.", "",
              "The tensor-core kernel's MUFU (XU pipe) warp instructions against flashsim's "
              "exponentials, one instruction per 32 lanes (`flashsim/measured/sfu.py` gives the "
              f"kernel's exact count; the target is within {model.TOLERANCE:.0%}):", ""]
    lines += _table(["N", "d", "causal", "version", "exp_ops / 32", "kernel's exact count",
                     "measured", "measured / predicted"],
                    [[r["N"], r["d"], r["causal"], r["version"], f"{r['predicted']:,.0f}",
                      f"{r['kernel_exact']:,}", f"{r['measured']:,.0f}", f"{r['ratio']:.3f}"]
                     for r in rows if r["measured"] is not None])
    lines.append("")


def reruns(lines):
    from flashsim.measured import reruns as rr   # noqa: PLC0415 - only for this table
    names = rr.available()
    if not names:
        return
    lines += ["## Run to run (H200)", "",
              "The same benchmarks run again after the code moved to one harness and one kernel "
              "registry. A full re-run replaced its dataset (`cupy_h200.json`, "
              "`sm_placement.json`); a shorter one, or one the model's stored predictions do not "
              "read, is kept beside it as `NAME_rerun.json`. Per point, re-run over committed "
              "(min / median / max):", ""]
    rows = []
    for n in names:
        c = rr.compare(n)
        qs = [q for q in ("time_ratio", "dram_read_ratio", "dram_write_ratio",
                          "l2_read_request_ratio", "coalescer_merged_ratio") if c.get(q)]
        for q in qs:
            lo, med, hi = c[q]
            rows.append([n, f"{c['points']} of {c['committed_points']}", q.replace("_", " "),
                         f"{lo:.3f} / {med:.3f} / {hi:.3f}",
                         f"{c['committed_date']} / {c['rerun_date']}"])
    lines += _table(["dataset", "points shared", "quantity", "ratio", "dates (committed / re-run)"],
                    rows)
    lines.append("")
    if "ncu_h200_heldout.json" in names:
        lines += heldout_rerun_lines(rr)


def heldout_rerun_lines(rr) -> list[str]:
    """The held-out sweep measured again, scored as a prediction of the committed run with
    issue 13's targets: how far the counters repeat themselves."""
    from flashsim.measured import validation   # noqa: PLC0415 - only for these lines
    s = rr.as_prediction()
    out = ["The held-out sweep measured again (`ncu_h200_heldout_rerun.json`, the same "
           "launches, `python -m benchmarks.ncu_sweep run --heldout`), scored as if it were a "
           "model's prediction of the committed run, with issue 13's held-out targets: what "
           "a model that reproduced the hardware up to its run-to-run noise would reach.", ""]
    out += _table(["target", *(f"{k} ({v['points']})" for k, v in s.items()), "held-out target"],
                  validation.summary_table(s))
    pairs = rr.write_pairs()
    if pairs:
        out += ["", "Held-out points whose two runs' DRAM write bytes differ by more than 15 % "
                "(committed / re-run): " + "; ".join(
                    f"{p['kernel']} B {p['batch']}, H {p['heads']}, N {p['N']}, d {p['d']}"
                    f"{', causal' if p['causal'] else ''}: {a:.0f} / {b:.0f} B"
                    for p, a, b in pairs) + "."]
    return out + [""]


def _kernel_targets(kernel: str) -> str:
    """Issue 19's two model targets (DRAM bytes, time) for ``kernel``'s stored predictions,
    in-sample, calibration and held-out."""
    from flashsim.measured import validation   # noqa: PLC0415
    ks = validation.stored_split_summaries(kernel)
    return "; ".join(f"{label}: " + ", ".join(f"{k} {s[key]}/{s['points']}" for k, s in ks.items())
                     for label, key, _ in validation.HELDOUT_TARGETS[:3:2])


def _split_summaries():
    """In-sample, calibration and held-out summaries of the stored predictions, or None."""
    if not (_load("ncu_h200_predictions.json") and _load("ncu_h200_heldout_predictions.json")):
        return None
    from flashsim.measured import validation   # noqa: PLC0415 - only for these tables
    return validation.stored_split_summaries()


def heldout(lines):
    """Issue 13: the launches the model was never fitted to, beside the in-sample points."""
    sums = _split_summaries()
    data = _load("ncu_h200_heldout.json")
    if not sums or not data:
        return
    from flashsim.measured import validation   # noqa: PLC0415
    lines += ["## Launches the model was never fitted to (held-out sweep)", "",
              f"Provenance: {_prov(data['provenance'])}.", "",
              "`flashsim.measured.heldout` drew 12 launches per kernel with a fixed seed (any "
              "batch and heads, N off every tile multiple and up to 65536, grids below one "
              "wave, both d, causal or not) and split each kernel's draws into 4 calibration "
              "and 8 held-out points before any model change (`cupy_flash3`'s draws were "
              "profiled later, on their own: `ncu_h200_heldout_cupy_flash3.json`). "
              "Predictions come from `flashsim predict` (`python -m flashsim.measured."
              "validation`); constants are fitted on the in-sample points only. Points "
              "meeting each target:", ""]
    lines += _table(["target", *(f"{k} ({v['points']})" for k, v in sums.items()),
                     "held-out target"], validation.summary_table(sums))
    lines += ["", "Worst cases per split:", ""]
    lines += _table(["split", "DRAM worst error", "time ratios", "L2 worst error",
                     "L2 within 15 % after measured L1 hits, merges, stores"],
                    [[k, f"{v['dram_worst_rel_error']:.3f}",
                      f"{v['time_ratio_min']:.2f} to {v['time_ratio_max']:.2f}",
                      f"{v['l2_worst_rel_error']:.3f}",
                      f"{v['l2_after_l1_coalescer_stores_within_15pct']} of {v['points']}"]
                     for k, v in sums.items()])
    for kernel in validation.PARTS:
        lines += ["", f"`{kernel}` alone (its in-sample points are `{validation.DATASET.stem}_"
                  f"{kernel}.json`; its efficiency per d was fitted on them):", ""]
        ks = validation.stored_split_summaries(kernel)
        lines += _table(["target", *(f"{k} ({v['points']})" for k, v in ks.items()),
                         "held-out target"], validation.summary_table(ks))
    lines.append("")


def timed_block() -> list[str]:
    """docs/model.md's table of numba's FlashAttention (a launch per K/V block) against its
    harness-timed points: the stored predictions (``validation.timed_rows``), the ratios,
    and what Nsight Compute timed of the launch at ``flashsim measure``'s shape."""
    from flashsim.measured import validation   # noqa: PLC0415 - only for this table
    if not validation.TIMED_PREDICTIONS.exists():
        return ["Not predicted yet: run `python -m flashsim.measured.validation`."]
    rows = validation.timed_rows()
    out = ["From `flashsim/measured/data/timed_h200_predictions.json` (`python -m "
           "flashsim.measured.validation`): each point's median time from the harness "
           "(`cupy_h200.json`, `measure_h200.json`) beside `flashsim predict` for the same "
           "launches at the stated efficiency.", ""]
    def t_c(p):                             # launches of flash1_step: one per K/V block
        return -(-p["N"] // p["plan"]["block_cols"])

    out += _table(["split", "file", "B", "H", "N", "d", "causal", "tiles", "T_c",
                   "measured ms", "predicted ms", "predicted / measured"],
                  [[r["point"]["split"], r["point"]["source"], r["point"]["batch"],
                    r["point"]["heads"], r["point"]["N"], r["point"]["d"], r["point"]["causal"],
                    f"{r['point']['plan']['block_rows']}x{r['point']['plan']['block_cols']}",
                    t_c(r["point"]),
                    f"{r['point']['time_s'] * 1e3:.3f}",
                    f"{r['predicted']['time_s'] * 1e3:.3f}", f"{r['time_ratio']:.3f}"]
                   for r in rows])
    held = [r["time_ratio"] for r in rows if r["point"]["split"] == "heldout"]
    cal = [r["time_ratio"] for r in rows if r["point"]["split"] == "calibration"]
    out += ["", f"Held out: {sum(1 / 1.5 <= x <= 1.5 for x in held)} of {len(held)} within "
            f"1.5x (ratios {min(held):.2f} to {max(held):.2f}); calibration: "
            + ", ".join(f"{x:.3f}" for x in cal) + "."]
    d = _load("measure_h200.json")
    row = next((r for r in (d or {}).get("rows", []) if r["kernel"] == "numba_flash1"
                and r.get("ncu_launches")), None)
    mine = next((r for r in rows if r["point"]["source"] == "measure_h200.json"), None)
    if row and mine:
        steps = [x["gpu__time_duration.sum"] * 1e-9 for x in row["ncu_launches"]
                 if "flash1_step" in x["kernel_name"]]
        ncu_s, t = row["measured"]["ncu_time_s"], row["measured"]["time_s"]
        cupy = [r for r in rows if r["point"]["source"] == "cupy_h200.json"]
        bh = [r["point"]["batch"] * r["point"]["heads"] for r in cupy]
        out += ["", f"At `flashsim measure`'s shape Nsight Compute timed the {len(steps)} "
                f"`flash1_step` kernels at {min(steps) * 1e6:.1f} to {max(steps) * 1e6:.1f} us "
                f"each, {ncu_s * 1e3:.3f} ms for all {len(row['ncu_launches'])} launches with "
                f"the fills: the model's {mine['predicted']['time_s'] * 1e3:.3f} ms is "
                f"{mine['predicted']['time_s'] / ncu_s:.2f}x that. The harness's events around "
                f"the call saw {t * 1e3:.3f} ms, {t / len(row['ncu_launches']) * 1e6:.1f} us per "
                f"launch; at `cupy_h200.json`'s points ({min(bh)} to {max(bh)} heads in all) "
                "they saw " + " to ".join(f"{x * 1e6:.0f}" for x in (
                    f(r["point"]["time_s"] / (3 + t_c(r["point"])) for r in cupy)
                    for f in (min, max))) + " us per launch."]
    return out


def model_md_text() -> str:
    """docs/model.md with its measured block regenerated from the stored predictions."""
    return _with_block(MODEL_MD, timed_block())


README = ROOT / "README.md"
DECODE_MD = ROOT / "docs" / "decode.md"
HOPPER_MD = ROOT / "docs" / "hopper_kernel.md"
MASKS_MD = ROOT / "docs" / "masks.md"
MODEL_MD = ROOT / "docs" / "model.md"
START, END = "<!-- measured: generated by docs/make_measurements.py -->", "<!-- /measured -->"


def readme_summary() -> str:
    """The README's few lines of results, from the same data as the page."""
    out = []
    nb = _load("numba_h200.json")
    if nb and nb["all_checks_passed"]:
        t = nb["summary"]["targets"]
        sp = nb["summary"]["flash2_over_standard"]
        lo, hi = (min(x["speedup"] for x in sp), max(x["speedup"] for x in sp))
        out.append(f"* numba FA2, fp32, N = 4096, d = 64: {t['flash2_N4096_d64_tflops']:.1f} "
                   f"TFLOP/s (target 10); {lo:.2f}x to {hi:.2f}x the standard pipeline's speed "
                   f"over N = {min(x['N'] for x in sp)} to {max(x['N'] for x in sp)}, d = 64 "
                   "and 128, flashsim's default tiles.")
    cp = _load("cupy_h200.json")
    if cp and cp.get("ratio_vs_torch_flash"):
        r = [x["ratio"] for x in cp["ratio_vs_torch_flash"]]
        out.append(f"* Tensor-core FA2 (CuPy, fp16): {min(r):.2f}x to {max(r):.2f}x PyTorch's "
                   "flash backend, measured in the same run.")
    pr = _load("ncu_h200_predictions.json")
    if pr:
        s = pr["summary"]
        out.append(f"* Model against Nsight Compute, {s['points']} points: DRAM bytes within "
                   f"10 % at {s['dram_within_10pct']}; time within 1.5x at "
                   f"{s['time_within_1_5x']} (Spearman {s['time_spearman']:.3f}); L2 requests "
                   f"within 15 % at {s['l2_within_15pct']}, and at "
                   f"{s.get('l2_after_l1_coalescer_stores_within_15pct')} once the measured L1 "
                   "hits, L2-request-coalescer merges and store requests are used (the "
                   "model's read requests are the SMs' requests: worst error "
                   f"{s.get('sm_read_worst_rel_error') or 0:.4f}).")
    sums = _split_summaries()
    if sums:
        from flashsim.measured import validation   # noqa: PLC0415
        cells = "; ".join(f"{label}: " + ", ".join(f"{k} {s[key]}/{s['points']}"
                                                    for k, s in sums.items())
                          for label, key, _ in validation.HELDOUT_TARGETS)
        out.append("* In-sample beside launches never fitted to (`flashsim predict`, no "
                   f"per-point counter inputs): {cells}. Held-out targets: "
                   + ", ".join(f"{f:.0%}" for _, _, f in validation.HELDOUT_TARGETS)
                   + " of points; docs/model.md says which are missed and why.")
        out += [f"* `{kernel}` alone: {_kernel_targets(kernel)}." for kernel in validation.PARTS]
    mk = _load("masks_h200.json")
    if mk:
        out.append(masks_readme(mk))
    return "\n".join([START] + out + [END])


def readme_text() -> str:
    text = README.read_text()
    a, b = text.index(START), text.index(END) + len(END)
    return text[:a] + readme_summary() + text[b:]


def main() -> str:
    lines = ["# Measurements", "",
             "Generated by `python docs/make_measurements.py` from `benchmarks/results/*.json`; "
             "do not edit by hand. Each section names the command that produced its data.", ""]
    for part in (core, slider, numba, cupy, hopper, masks, backward, decode, counters, heldout,
                 sfu,
                 measure_all, reruns):
        part(lines)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    text = main()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text and README.read_text() == readme_text()
                 and DECODE_MD.read_text() == decode_md_text()
                 and HOPPER_MD.read_text() == hopper_kernel_md_text()
                 and MASKS_MD.read_text() == masks_md_text()
                 and MODEL_MD.read_text() == model_md_text() else 1)
    OUT.write_text(text)
    README.write_text(readme_text())
    DECODE_MD.write_text(decode_md_text())
    HOPPER_MD.write_text(hopper_kernel_md_text())
    MASKS_MD.write_text(masks_md_text())
    MODEL_MD.write_text(model_md_text())
    print(f"wrote {OUT} and the measured lines of {README}, {DECODE_MD}, {HOPPER_MD}, "
          f"{MASKS_MD} and {MODEL_MD}")
