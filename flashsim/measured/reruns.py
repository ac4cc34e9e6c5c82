"""Run-to-run noise: a benchmark re-run on the same GPU against the dataset it repeats.

After the house moved (issue 11: one harness, one registry), every GPU benchmark ran again
on the H200. Where the re-run covers all the points of the committed dataset it replaced
it (``cupy_h200.json``, ``sm_placement.json``); where its time limit cut it short (the
numba and backward sweeps in ``benchmarks.all``) or where the model's stored predictions
are computed from the committed one (the Nsight Compute sweep), it is kept beside it as
``NAME_rerun.json``, and this module sets the points they share side by side:

    compare("numba_h200.json")   # {"points": 12, "time_ratio": (min, median, max), ...}

A ratio is re-run over committed, point by point; nothing is averaged away.
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
}


def rerun_name(name: str) -> str:
    return name.replace(".json", "_rerun.json")


def available() -> list[str]:
    """The datasets that have a committed re-run."""
    return [n for n in DATASETS if path(rerun_name(n)).exists()]


def compare(name: str) -> dict:
    """The points ``name`` and its re-run share, and per quantity the (min, median, max)
    of re-run over committed, with the dates of both runs."""
    field, key, quantities = DATASETS[name]
    old, new = load(name), load(rerun_name(name))
    committed = {key(p): p for p in old[field]}
    shared = [(committed[key(p)], p) for p in new[field] if key(p) in committed]
    out = {"dataset": name, "points": len(shared), "committed_points": len(old[field]),
           "rerun_points": len(new[field]),
           "committed_date": _date(old["provenance"]), "rerun_date": _date(new["provenance"])}
    for q, value in quantities.items():
        r = sorted(value(b) / value(a) for a, b in shared if value(a))
        out[q] = (r[0], statistics.median(r), r[-1]) if r else None
    return out


def _date(prov: dict) -> str | None:
    return prov.get("date") or prov.get("date_utc")
