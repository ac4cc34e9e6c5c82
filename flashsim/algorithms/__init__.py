"""The algorithms, one file each: ``standard``, ``flash1``, ``flash2``, and their backward
passes ``standard_bwd``, ``flash1_bwd``, ``flash2_bwd``.

Each module gives ``build(plan) -> Nest`` (the loop nest, the one description everything
reads), ``closed_form(plan)`` (exact bytes and FLOPs from formulas, written independently of
the nest so tests can hold the two equal), ``default_blocks`` and ``working_set_bytes``.
"""

from . import flash1, flash1_bwd, flash2, flash2_bwd, standard, standard_bwd

ALGORITHMS = {"standard": standard, "flash1": flash1, "flash2": flash2}
BACKWARD = {"standard": standard_bwd, "flash1": flash1_bwd, "flash2": flash2_bwd}
