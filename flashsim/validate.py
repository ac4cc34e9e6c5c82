"""Every argument that enters flashsim, checked in one place, and the limits it is held to.

The CLI (``flashsim.cli``) and the API (``flashsim.plan``, ``fastest_blocks``) both call these
functions, so a value means the same thing and fails with the same words on either side. A
failure is one :class:`~flashsim.errors.FlashsimError` whose message names the argument, the
value given and what would be accepted, raised before any work starts.

Rules: whole numbers are ``int`` (not bool, not float) or ASCII decimal digits; sizes are
parsed exactly (no float on the way, so ``1.5KiB`` is 1536 and a size of any length is read
digit for digit, then held to its limit); names (algorithms, data types, GPUs, passes) are
case-insensitive.

The limits below are what the model answers for quickly (seconds) and exactly; they are
stated here, printed in the errors and listed in the README.
"""

from __future__ import annotations

import numbers
import os
import re
from fractions import Fraction

from .errors import FlashsimError

# -- the limits ------------------------------------------------------------------------
MAX_SEQ_LEN = 2**22              # N: 4,194,304 tokens
MAX_HEAD_DIM = 2**16             # d
MAX_BATCH = MAX_HEADS = 2**24    # each of batch and heads
MAX_TILES = 2**20                # blocks along N: ceil(N / B_r) and ceil(N / B_c)
MAX_SIZE = 2**40                 # bytes of SRAM or L2 (1 TiB)
MAX_BLOCKS_PER_SM = 1024
MAX_SEED = 2**64 - 1
MAX_Q_LEN = 4096                 # decoding: new query rows per sequence
MAX_SEQUENCES = 256              # decoding: KV lengths in one ragged batch (kv_lens)
MAX_DECODE_BLOCKS = 2**16        # decoding: thread blocks of one launch per KV head
# --verify runs every tile with float64 values and the N x N reference beside it.
VERIFY_MAX_TRANSFERS = 200_000       # tile loads and stores the value engine performs
VERIFY_MAX_FLOPS = 2 * 10**10        # matmul FLOPs of the run plus the reference
VERIFY_MEMORY_SHARE = 0.5            # of the memory this process may still use

_DIGITS = re.compile(r"[0-9]+\Z")
_SIZE = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?\s*([A-Za-z]*)\s*\Z")
_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,   # bare K / M / G: binary, as in "48K of shared memory"
}


def _p(name: str) -> str:
    """The prefix naming the argument (the CLI's argparse names it itself)."""
    return f"{name}: " if name else ""


def show(value) -> str:
    """A value as an error message quotes it: repr, shortened, on one line."""
    try:
        text = repr(value)
    except ValueError:                  # an int past Python's digit limit for str()
        text = f"<{type(value).__name__} of {value.bit_length():,} bits>"
    return text if len(text) <= 60 else text[:45] + "..." + text[-10:]


def whole(value, name: str, lo: int = 1, hi: int | None = None, what: str = "") -> int:
    """``value`` as an int in ``[lo, hi]``: an int (not bool) or a string of ASCII digits."""
    unit = f" ({what})" if what else ""
    if lo == 1:
        span = "a positive whole number" + (f" up to {hi:,}" if hi is not None else "")
    else:
        span = f"a whole number from {lo:,}" + (f" to {hi:,}" if hi is not None else "")
    if isinstance(value, str):
        text = value
        sign = -1 if text[:1] == "-" else 1
        digits = text[1:] if text[:1] in "+-" else text
        if not _DIGITS.match(digits):
            raise FlashsimError(f"{_p(name)}{show(value)} is not a whole number; give "
                                f"{span}{unit}")
        if len(digits) > 40:                          # past any limit: say so, exactly
            raise FlashsimError(f"{_p(name)}{show(value)} is too large; give {span}{unit}")
        value = sign * int(digits)
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise FlashsimError(f"{name} must be {span}{unit}, got {show(value)}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise FlashsimError(f"{_p(name)}{show(value)} is out of range; give {span}{unit}")
    return value


def size(value, name: str, hi: int = MAX_SIZE) -> int:
    """Bytes: an int, or text such as ``65536``, ``100KiB`` (1024-based), ``228KB``
    (1000-based), ``1.5MiB``; exact, whole and in ``[1, hi]``."""
    accepted = (f"give bytes from 1 to {hi:,} as a whole number or with a unit, e.g. 65536, "
                "100KiB, 228KB, 1.5MiB")
    if isinstance(value, bool):
        raise FlashsimError(f"{_p(name)}{show(value)} is not a size; {accepted}")
    if isinstance(value, numbers.Integral):
        number = Fraction(int(value))
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if not m or m.group(3).lower() not in _UNITS:
            raise FlashsimError(f"{_p(name)}cannot read {show(value)} as a size; {accepted}")
        whole_part, frac = m.group(1), m.group(2) or ""
        if len(whole_part) + len(frac) > 40:
            raise FlashsimError(f"{_p(name)}{show(value)} is too large; {accepted}")
        number = (Fraction(int(whole_part)) + Fraction(int(frac or "0"), 10**len(frac))) \
            * _UNITS[m.group(3).lower()]
    else:
        raise FlashsimError(f"{_p(name)}{show(value)} is not a size; {accepted}")
    if number.denominator != 1:
        raise FlashsimError(f"{_p(name)}{show(value)} is not a whole number of bytes "
                            f"({float(number):.1f}); {accepted}")
    if number < 1:
        raise FlashsimError(f"{_p(name)}{show(value)} is not a positive size; {accepted}")
    if number > hi:
        raise FlashsimError(f"{_p(name)}{show(value)} is more than the limit; {accepted}")
    return int(number)


def choice(value, options, name: str) -> str:
    """One of ``options`` (strings), matched case-insensitively; returns the option."""
    keys = {o.lower(): o for o in options}
    if isinstance(value, str) and value.lower() in keys:
        return keys[value.lower()]
    raise FlashsimError(f"{_p(name)}unknown {show(value)}; choose one of {', '.join(options)}")


def names(value, options, name: str) -> tuple:
    """A tuple of distinct ``options``: a list/tuple of names or one comma-separated string
    (case-insensitive; empty parts ignored)."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise FlashsimError(f"{name} must be a list of names from {', '.join(options)} "
                            f"(or one comma-separated string), got {show(value)}")
    out = tuple(choice(p, options, name) for p in parts)
    if len(set(out)) != len(out):
        raise FlashsimError(f"{_p(name)}{show(value)} repeats a name; each of "
                            f"{', '.join(options)} at most once")
    return out


def flag(value, name: str) -> bool:
    """``True`` or ``False`` (NumPy's bool too); anything else is refused, not truth-tested."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise FlashsimError(f"{name} must be True or False, got {show(value)}")


def fraction(value, name: str) -> float:
    """A finite real number in (0, 1]."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not 0 < value <= 1):         # exact comparisons: NaN and huge ints fail here
        raise FlashsimError(f"{name} must be a fraction in (0, 1] (or 0 / None: cannot "
                            f"run), got {show(value)}")
    return float(value)


def tiles(n: int, block: int, name: str) -> int:
    """A block size, capped at N, that cuts N into at most MAX_TILES blocks."""
    block = min(block, n)
    if -(-n // block) > MAX_TILES:
        raise FlashsimError(
            f"{_p(name)}{block} cuts N = {n:,} into {-(-n // block):,} blocks, more than the "
            f"{MAX_TILES:,} the model steps through; give at least {-(-n // MAX_TILES):,}")
    return block


# -- what this process may still allocate ----------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def memory_allowance() -> int:
    """Bytes this process can still allocate: the least of the memory the OS reports
    available, the cgroup's limit less its usage, and the address-space / data rlimits
    less what is mapped now."""
    caps = []
    info = _read("/proc/meminfo")
    if info:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", info, re.M)
        if m:
            caps.append(int(m.group(1)) * 1024)
    if not caps:
        try:
            caps.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    limit, usage = _read("/sys/fs/cgroup/memory.max"), _read("/sys/fs/cgroup/memory.current")
    if limit and usage and limit.strip().isdigit():
        caps.append(int(limit) - int(usage))
    try:
        import resource
        status = _read("/proc/self/status") or ""
        vm = re.search(r"^VmSize:\s+(\d+) kB", status, re.M)
        data = re.search(r"^VmData:\s+(\d+) kB", status, re.M)
        for which, used in ((resource.RLIMIT_AS, vm), (resource.RLIMIT_DATA, data)):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                caps.append(soft - (int(used.group(1)) * 1024 if used else 0))
    except (ImportError, OSError, ValueError):
        pass
    return max(0, min(caps)) if caps else 2**34
