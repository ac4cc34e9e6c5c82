"""Run-to-run noise: a benchmark re-run on the same GPU against the dataset it repeats.

After the house moved (issue 11: one harness, one registry), every GPU benchmark ran again
on the H200. Where the re-run covers all the points of the committed dataset it replaced
it (``cupy_h200.json``, ``sm_placement.json``); where its time limit cut it short (the
numba and backward sweeps in ``benchmarks.all``) or where the model's stored predictions
are computed from the committed one (the Nsight Compute sweep), it is kept beside it as
``NAME_rerun.json``, and this module sets the points they share side by side:

    compare("numba_h200.json")   # {"points": 12, "time_ratio": (min, median, max), ...}

A ratio is re-run over committed, point by point; nothing is averaged away.

The held-out sweep of issue 13 was measured again for another reason: to see how closely
the counters repeat themselves at the launches the model is judged on. ``as_prediction``
takes the re-run as if it were a model's prediction of the committed run and scores it
with the held-out targets (``validation.summary``): what a model that reproduced the
hardware exactly, up to its run-to-run noise, would reach.
"""

from __future__ import annotations

import statistics

from . import load, path


def _counters(key):
    """A quantity of an Nsight Compute point: its launches' counters summed, as
    ``validation.measured`` sums them."""
    from .validation import measured
    return lambda p: measured(p)[key]


# dataset: (list of points, the key that names a point, {quantity: value of a point})
DATASETS = {
    "numba_h200.json": (
        "results", lambda p: (p["algorithm"], p["variant"], p["N"], p["d"], p["causal"]),
        {"time_ratio": lambda p: p["time_ms"]}),
    "backward_h200.json": (
        "points", lambda p: (p["impl"], p["batch"], p["N"], p["d"], p["causal"]),
        {"time_ratio": lambda p: p["time_ms"]}),
    "ncu_h200.json": (
        "points", lambda p: (p["kernel"], p["N"], p["d"], p["causal"], p.get("block_rows"),
                             p.get("block_cols")),
        {"time_ratio": _counters("time_s"), "dram_read_ratio": _counters("dram_read_bytes"),
         "dram_write_ratio": _counters("dram_write_bytes"),
         "l2_read_request_ratio": _counters("l2_read_bytes")}),
    "ncu_h200_heldout.json": (
        "points", lambda p: (p["kernel"], p["batch"], p["heads"], p["N"], p["d"], p["causal"]),
        {"time_ratio": _counters("time_s"), "dram_read_ratio": _counters("dram_read_bytes"),
         "dram_write_ratio": _counters("dram_write_bytes"),
         "l2_read_request_ratio": _counters("l2_read_bytes"),
         "coalescer_merged_ratio": _counters("lrc_merged_read_bytes")}),
}
# Re-runs made after the move to one harness (issue 11), held to agree within noise; the
# held-out sweep's re-run measures the noise itself (``as_prediction``).
HARNESS_MOVE = ("numba_h200.json", "backward_h200.json", "ncu_h200.json")


def committed(name: str) -> dict:
    """The committed dataset ``name`` with its parts (the held-out sweep's Hopper kernel
    points live in their own file, ``validation.PARTS``)."""
    from .validation import load as with_parts
    return with_parts(path(name)) if name == "ncu_h200_heldout.json" else load(name)


def rerun_name(name: str) -> str:
    return name.replace(".json", "_rerun.json")


def available() -> list[str]:
    """The datasets that have a committed re-run."""
    return [n for n in DATASETS if path(rerun_name(n)).exists()]


def compare(name: str) -> dict:
    """The points ``name`` and its re-run share, and per quantity the (min, median, max)
    of re-run over committed, with the dates of both runs."""
    field, key, quantities = DATASETS[name]
    old, new = committed(name), load(rerun_name(name))
    shared = _shared(name, old, new)
    out = {"dataset": name, "points": len(shared), "committed_points": len(old[field]),
           "rerun_points": len(new[field]),
           "committed_date": _date(old["provenance"]), "rerun_date": _date(new["provenance"])}
    for q, value in quantities.items():
        r = sorted(value(b) / value(a) for a, b in shared if value(a))
        out[q] = (r[0], statistics.median(r), r[-1]) if r else None
    return out


def _shared(name: str, old: dict, new: dict) -> list[tuple[dict, dict]]:
    """(committed, re-run) of each point the two runs share, in the re-run's order."""
    field, key, _ = DATASETS[name]
    by_key = {key(p): p for p in old[field]}
    return [(by_key[key(p)], p) for p in new[field] if key(p) in by_key]


def as_prediction(name: str = "ncu_h200_heldout.json") -> dict:
    """``{split: validation.summary}`` of the re-run scored as a prediction of the committed
    run, point by point (``measured`` the committed counters, ``predicted`` the re-run's),
    for the splits of the committed points."""
    from .validation import SPLITS, measured, summary
    rows = [{"point": a, "measured": measured(a), "predicted": measured(b)}
            for a, b in _shared(name, committed(name), load(rerun_name(name)))]
    split = [r["point"].get("split", "in-sample") for r in rows]
    return {s: summary([r for r, t in zip(rows, split) if t == s])
            for s in SPLITS if s in split}


def write_pairs(name: str = "ncu_h200_heldout.json", split: str = "heldout") -> list:
    """``(point, committed, re-run DRAM write bytes)`` of the ``split`` points whose two runs
    differ by more than 15 % (``validation.write_error``'s rule, the target's)."""
    from .validation import measured, write_error
    out = []
    for a, b in _shared(name, committed(name), load(rerun_name(name))):
        ma, mb = measured(a), measured(b)
        if a.get("split") == split and write_error({"measured": ma, "predicted": mb}) > 0.15:
            out.append((a, ma["dram_write_bytes"], mb["dram_write_bytes"]))
    return out


def _date(prov: dict) -> str | None:
    return prov.get("date") or prov.get("date_utc")
