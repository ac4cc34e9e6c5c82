"""The algorithms, one file each: ``standard``, ``flash1``, ``flash2``.

Each module gives ``build(plan) -> Nest`` (the loop nest, the one description everything
reads), ``closed_form(plan)`` (exact bytes and FLOPs from formulas, written independently of
the nest so tests can hold the two equal), ``default_blocks`` and ``working_set_bytes``.
"""

from . import flash1, flash2, standard

ALGORITHMS = {"standard": standard, "flash1": flash1, "flash2": flash2}
