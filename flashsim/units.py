"""Parsing and printing sizes and dtypes.

Sizes follow SI and IEC strictly: ``KB`` is 1000 bytes, ``KiB`` is 1024 bytes. NVIDIA's
datasheets say "228 KB" of shared memory meaning 228 KiB, so type ``228KiB`` for that;
every report prints the byte count, so the reading is never ambiguous.
"""

from __future__ import annotations

import math
import numbers
import re

from .errors import FlashsimError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Softmax statistics (m, l and the logsumexp L) stay fp32 whatever the data type, as in
# every FlashAttention kernel.
STAT_BYTES = 4

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9,
    "kib": 2**10, "mib": 2**20, "gib": 2**30,
    "k": 2**10, "m": 2**20,  # bare K / M: the binary reading, as in "48K of shared memory"
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``100KiB`` -> 102400, ``228KB`` -> 228000, ``1MiB``, ``65536``."""
    if isinstance(text, bool):
        raise FlashsimError(f"size must be a number of bytes, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise FlashsimError(
                f"cannot read size {text!r}: use forms like 65536, 100KiB, 228KB, 1MiB")
        number = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if number != math.floor(number):
            raise FlashsimError(f"size {text!r} is not a whole number of bytes")
        value = int(number)
    if value <= 0:
        raise FlashsimError(f"size must be positive, got {text!r}")
    return value


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers: the number of blocks of ``b`` covering ``a``."""
    return -(-a // b)


def positive_int(value, name: str) -> int:
    """``value`` as an int > 0, or a FlashsimError naming ``name`` (floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise FlashsimError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        raise FlashsimError(
            f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}") from None


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.50 KiB``; exact byte counts are printed beside it by the reports."""
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
