"""Parsing and printing sizes and dtypes.

Sizes follow SI and IEC strictly: ``KB`` is 1000 bytes, ``KiB`` is 1024 bytes. NVIDIA's
datasheets say "228 KB" of shared memory meaning 228 KiB, so type ``228KiB`` for that;
every report prints the byte count, so the reading is never ambiguous.
"""

from __future__ import annotations

from . import validate

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Softmax statistics (m, l and the logsumexp L) stay fp32 whatever the data type, as in
# every FlashAttention kernel.
STAT_BYTES = 4


def parse_size(text: str | int, name: str = "size") -> int:
    """Bytes in ``text``: ``100KiB`` -> 102400, ``228KB`` -> 228000, ``1.5MiB``, ``65536``;
    exact (see :func:`flashsim.validate.size`)."""
    return validate.size(text, name)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers: the number of blocks of ``b`` covering ``a``."""
    return -(-a // b)


def positive_int(value, name: str) -> int:
    """``value`` as an int > 0, or a FlashsimError naming ``name`` (floats are refused)."""
    return validate.whole(value, name)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (case-insensitive)."""
    if dtype in DTYPE_BYTES:                # the common case, checked first: it is hot
        return DTYPE_BYTES[dtype]
    return DTYPE_BYTES[validate.choice(dtype, list(DTYPE_BYTES), "dtype")]


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.50 KiB``; exact byte counts are printed beside it by the reports."""
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
