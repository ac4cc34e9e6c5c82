"""flashsim: see, byte by byte, why FlashAttention is fast.

A NumPy model of a GPU's memory hierarchy (HBM and the SRAM of one thread block) on which
standard attention, FlashAttention (Algorithm 1) and FlashAttention-2 run with real values,
every transfer counted by tensor and direction, beside exact closed forms.

    import flashsim
    p = flashsim.plan("flash2", seq_len=4096, head_dim=64, sram="100KiB")
    print(flashsim.format_report(p.count()))
"""

from . import reference
from .hardware import presets
from .errors import FlashsimError, SramOverflowError
from .plan import Gradients, Plan, Report, fastest_blocks, plan
from .hardware.presets import GPUS, roofline_time
from .report import format_compare, format_report
from .units import parse_size

__all__ = ["plan", "fastest_blocks", "Plan", "Report", "Gradients", "FlashsimError",
           "SramOverflowError", "GPUS",
           "presets", "reference", "roofline_time", "parse_size", "format_report",
           "format_compare"]
__version__ = "0.1.0"
