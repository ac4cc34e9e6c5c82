"""What was measured, as data: the committed datasets (package data under ``data/``, each
with its provenance), the papers' own published figures (``papers``, quoted, never
computed), and the model held against the hardware counters (``validation``).

    from flashsim import measured
    measured.load("ncu_h200.json")["provenance"]

The benchmark scripts in the repository's ``benchmarks/`` folder write these files
(``benchmarks/results`` is a link to ``data/``); nothing in this package runs on a GPU.
"""

from __future__ import annotations

import json
import pathlib

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"


def path(name: str) -> pathlib.Path:
    """The committed file ``name`` (e.g. ``"ncu_h200.json"``)."""
    return DATA_DIR / name


def load(name: str) -> dict:
    """The committed dataset ``name``, parsed."""
    with open(path(name)) as f:
        return json.load(f)
