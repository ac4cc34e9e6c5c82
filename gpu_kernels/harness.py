"""The one measuring harness: check, then time; and where, when and with what it ran.

    h = Harness()                                  # CUDA events through CuPy (numba without it)
    row = h.check_then_time(lambda: launch.run(Q, K, V), check)
    # row: {"check": {...}, "time_s": median, "times_s": [...], "repeats": n, ...}, or
    # {"check": {..., "ok": False}} and nothing timed

Method (every benchmark and ``gpu_kernels.measure`` use it, and store ``Harness.method()``
beside their numbers):

* correct first: ``check(result)`` runs on the output of the very inputs that are timed,
  and a launch whose check fails is not timed;
* ``warmup`` calls (2) outside the timing (compiles, caches, clocks);
* each timed call runs between two CUDA events on the default stream, after a write of an
  L2 flush buffer of 2 x the device's L2 (cudaDeviceProp.l2CacheSize), so every repeat starts
  with a cold L2;
* ``clean=True`` (a measurement of the flush itself, not the default): after that write, a
  read of a second buffer of 2 x the L2, so the call starts with an L2 of clean lines. The
  write leaves up to an L2 of dirty lines, and the timed call's first misses write them
  back to DRAM beside its own traffic (``benchmarks.decode_h200 --overheads`` times both);
* between the flush and the start event the GPU spins ``lead_s`` (0.5 ms), so the host's
  time to launch the call happens while the GPU is busy and is not timed as a gap; that
  issue time is recorded per call (``Timing.launch_s``), so a call that outlasts the lead
  shows it;
* the median of the repeats; with ``repeats=None`` as many as fill ``target_s`` (0.2 s),
  at least ``min_repeats`` (5) and at most ``max_repeats`` (30).

``provenance()`` is the one record of where and how a measurement was made: GPU, driver,
CUDA runtime, package versions, date, command, git commit. ``max_error_rule``,
``Reference`` / ``reference_check`` and ``backward_check`` are the correctness rules
(float64 reference; flash-attention's rule for fp16/bf16 and for the backward). Importing
this module imports neither numba nor CuPy.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

PACKAGES = ("numpy", "numba", "numba-cuda", "cupy-cuda13x", "torch", "cuda-core", "cuda-bindings",
            "nvidia-cuda-nvrtc", "flashsim")
EPS32 = float(np.finfo(np.float32).eps)


# --------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    """Seconds per call of the timed repeats; ``parts_s``: per-kernel medians (split runs);
    ``launch_s``: the host's seconds to issue each timed call (from the start event to the
    end event's record), which the GPU's ``lead_s`` spin must outlast for the call to be
    timed without an idle gap."""
    times_s: list
    parts_s: list = field(default_factory=list)
    launch_s: list = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def as_dict(self) -> dict:
        out = {"time_s": self.median_s, "times_s": self.times_s, "repeats": len(self.times_s),
               "min_s": min(self.times_s), "max_s": max(self.times_s)}
        if self.parts_s:
            out["parts_s"] = [statistics.median(p) for p in zip(*self.parts_s)]
        if self.launch_s:
            out |= {"launch_s": statistics.median(self.launch_s), "launch_max_s": max(self.launch_s)}
        return out


SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}
"""


class _Cupy:
    name = "cupy"

    def __init__(self):
        import cupy

        self.cp = cupy

    def event(self):
        ev = self.cp.cuda.Event()
        ev.record()
        return ev

    def elapsed_s(self, start, end) -> float:
        return self.cp.cuda.get_elapsed_time(start, end) / 1e3

    def synchronize(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()

    def l2_bytes(self) -> int:
        dev = self.cp.cuda.Device().id
        return int(self.cp.cuda.runtime.getDeviceProperties(dev)["l2CacheSize"])

    def buffer(self, nbytes: int):
        return self.cp.empty(nbytes // 4, dtype=self.cp.float32)

    def write(self, buf) -> None:
        buf.fill(1.0)

    def read(self, buf) -> None:
        buf.sum()

    def spin(self, seconds: float) -> None:
        """One GPU thread busy-waits ``seconds`` on the global timer."""
        if not hasattr(self, "_spin"):
            self._spin = self.cp.RawKernel(SPIN_SOURCE, "spin")
        self._spin((1,), (1,), (self.cp.int64(int(seconds * 1e9)),))


class _Numba:
    name = "numba"

    def __init__(self):
        from .numba.common import cuda, fill

        self.cuda, self.fill = cuda, fill

    def event(self):
        ev = self.cuda.event()
        ev.record()
        return ev

    def elapsed_s(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        self.cuda.synchronize()

    def l2_bytes(self) -> int:
        return int(self.cuda.get_current_device().L2_CACHE_SIZE)

    def buffer(self, nbytes: int):
        return self.cuda.device_array(nbytes // 4, dtype=np.float32)

    def write(self, buf) -> None:
        self.fill(buf, 1.0)

    def read(self, buf) -> None:
        from .numba.common import read_all

        read_all(buf)

    def spin(self, seconds: float) -> None:
        """One GPU thread sleeps about ``seconds`` (nanosleep; nothing in the simulator)."""
        from .numba.common import numba

        if numba.config.ENABLE_CUDASIM:
            return
        if not hasattr(self, "_spin"):
            cuda = self.cuda

            def spin(n):
                for _ in range(n):
                    cuda.nanosleep(1000)
            self._spin = cuda.jit(spin)
        self._spin[1, 1](int(seconds * 1e6))


def _events(backend: str | None):
    if backend in (None, "cupy"):
        try:
            return _Cupy()
        except ImportError:
            if backend == "cupy":
                raise
    return _Numba()


class Harness:
    """Check, then time, with CUDA events, warm-up, an L2 flush and the median (see above).

    ``backend``: whose events and flush kernel to use ("cupy" or "numba"; None: CuPy if it
    is installed). Kernels of either backend, and PyTorch's, run on the same default stream,
    so one harness times them all."""

    def __init__(self, backend: str | None = None, *, warmup: int = 2, target_s: float = 0.2,
                 min_repeats: int = 5, max_repeats: int = 30, flush: bool = True,
                 lead_s: float = 5e-4, clean: bool = False):
        self.dev = _events(backend)
        self.warmup, self.target_s = warmup, target_s
        self.min_repeats, self.max_repeats = min_repeats, max_repeats
        self.flush_enabled, self.lead_s, self.clean = flush, lead_s, clean
        self._flush_buf = self._clean_buf = None

    @property
    def flush_bytes(self) -> int:
        """2 x the device's L2: what one flush writes."""
        return 2 * self.dev.l2_bytes()

    def flush(self) -> None:
        if not self.flush_enabled:
            return
        if self._flush_buf is None:
            self._flush_buf = self.dev.buffer(self.flush_bytes)
        self.dev.write(self._flush_buf)
        if self.clean:
            if self._clean_buf is None:
                self._clean_buf = self.dev.buffer(self.flush_bytes)
            self.dev.read(self._clean_buf)

    def method(self) -> dict:
        """How times are taken, stored beside every measurement."""
        return {"harness": "gpu_kernels.harness", "events": self.dev.name, "warmup_runs": self.warmup,
                "timer": "CUDA events around one call (all its launches)", "statistic": "median",
                "l2_flush_bytes": self.flush_bytes if self.flush_enabled else 0,
                "l2_flush": ("a write, then a read of as many other bytes (clean lines)" if self.clean
                             else "a write (leaves dirty lines)") if self.flush_enabled else "none",
                "repeats": f"enough for {self.target_s} s, {self.min_repeats} to {self.max_repeats}",
                "lead_s": self.lead_s,
                "check": "before timing, on the timed inputs; a failed check is not timed"}

    def time(self, fn, *, repeats: int | None = None, split: bool = False) -> Timing:
        """Seconds per call of ``fn()``. With ``split`` the timed calls are ``fn(mark)``
        (warm-ups: ``fn()``): ``mark()`` records an event after each kernel, and the
        per-kernel times come back in ``parts_s``."""
        for _ in range(self.warmup):
            fn()
        self.dev.synchronize()
        if repeats is None:
            first = self._one(fn, split)[0]
            repeats = int(min(self.max_repeats, max(self.min_repeats, self.target_s / max(first, 1e-6))))
        times, parts, launches = [], [], []
        for _ in range(repeats):
            total, part, launch = self._one(fn, split)
            times.append(total)
            launches.append(launch)
            if split:
                parts.append(part)
        return Timing(times, parts, launches)

    def _one(self, fn, split: bool):
        self.flush()
        if self.lead_s:            # the GPU busy while the host launches: no idle gap timed
            self.dev.spin(self.lead_s)
        marks = []
        start = self.dev.event()
        t0 = time.perf_counter()
        if split:
            fn(lambda: marks.append(self.dev.event()))
        else:
            fn()
        end = self.dev.event()
        launch = time.perf_counter() - t0
        end.synchronize()
        edges = [start] + marks
        return (self.dev.elapsed_s(start, end), [self.dev.elapsed_s(a, b) for a, b in zip(edges, edges[1:])],
                launch)

    def check_then_time(self, fn, check, **kw) -> dict:
        """``check(fn())`` (a dict with "ok"), then, only if it holds, ``time(fn, **kw)``."""
        result = fn()
        self.dev.synchronize()
        verdict = check(result)
        del result
        if not verdict["ok"]:
            return {"check": verdict}
        return {"check": verdict, **self.time(fn, **kw).as_dict()}


def wall_median_s(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` on the host (CPU benchmarks), after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --------------------------------------------------------------------------------------
# Correctness rules


def max_error_rule(err: float, bound: float, **extra) -> dict:
    """The verdict every check returns: max |out - ref| against its bound."""
    return {"max_abs_error": float(err), "bound": float(bound),
            "ok": bool(math.isfinite(err) and err <= bound), **extra}


def round_to(x, dtype: str):
    """``x`` (float32) rounded to fp16 or bf16 (round to nearest even) and back to float32."""
    x = np.asarray(x, np.float32)
    if dtype == "fp32":
        return x
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def plain_attention(Q, K, V, causal: bool, dtype: str = "fp32", mask=None):
    """softmax(Q K^T / sqrt(d)) V computed plainly in float32 with S, P and O rounded to
    ``dtype`` (what a framework computes in that dtype): the error baseline of the rules.
    ``mask`` (N, N) bool: query r sees key c where True (a row that sees nothing: O = 0)."""
    Q, K, V = (np.asarray(x, np.float32) for x in (Q, K, V))
    S = round_to(Q @ np.swapaxes(K, -1, -2), dtype) * np.float32(1 / np.sqrt(Q.shape[-1]))
    if causal:
        n = S.shape[-1]
        S = np.where(np.tril(np.ones((S.shape[-2], n), bool)), S, np.float32(-np.inf))
    if mask is not None:
        S = np.where(np.asarray(mask, bool), S, np.float32(-np.inf))
    m = S.max(-1, keepdims=True)
    P = np.exp(S - np.where(np.isneginf(m), np.float32(0), m))
    l = P.sum(-1, keepdims=True)
    P = round_to(P / np.where(l > 0, l, np.float32(1)), dtype)
    return round_to(P @ V, dtype)


@dataclass
class Reference:
    """The float64 reference of one set of inputs and the bound an output must meet.

    fp32: max |O - ref| <= 2 x that of ``plain_attention`` in fp32 + 2 ulp of max |ref|
    (so an exact baseline does not demand exactness). fp16 / bf16 (flash-attention's rule):
    max |O - ref| <= 2 x that of ``plain_attention`` in the same dtype."""
    ref: np.ndarray
    baseline_error: float
    bound: float
    dtype: str

    @classmethod
    def of(cls, Q, K, V, causal: bool, dtype: str = "fp32", mask=None) -> "Reference":
        """``mask``: (N, N) bool, query r sees key c where True (``Mask.dense()``)."""
        import flashsim

        ref = flashsim.reference.attention(Q, K, V, causal=causal, mask=mask)
        base = float(np.abs(plain_attention(Q, K, V, causal, dtype, mask) - ref).max())
        bound = 2 * base + (2 * EPS32 * float(np.abs(ref).max()) if dtype == "fp32" else 0.0)
        return cls(ref, base, bound, dtype)

    def check(self, O) -> dict:
        O = np.asarray(O, np.float64)
        err = float(np.abs(O - self.ref).max()) if np.isfinite(O).all() else math.inf
        return max_error_rule(err, self.bound, baseline_error=self.baseline_error, dtype=self.dtype)


def reference_check(O, Q, K, V, causal: bool, dtype: str = "fp32", mask=None) -> dict:
    """``Reference.of(Q, K, V, causal, dtype, mask).check(O)``."""
    return Reference.of(Q, K, V, causal, dtype, mask).check(O)


def plain_backward(Q, K, V, dO, causal: bool, *, P=None, O=None, L=None):
    """(dQ, dK, dV) from the formulas in plain float32, from what the backward reads: the
    saved P (standard attention), or O and L (FlashAttention-2: P = exp(S - L), D =
    rowsum(dO o O)), or else a plain softmax."""
    T = np.swapaxes
    Q, K, V, dO = (np.asarray(x, np.float32) for x in (Q, K, V, dO))
    tau = np.float32(1 / np.sqrt(Q.shape[-1]))
    if P is None:
        S = tau * (Q @ T(K, -1, -2))
        if causal:
            S = np.where(np.tril(np.ones(S.shape[-2:], bool)), S, np.float32(-np.inf))
        P = np.exp(S - (L[..., None] if L is not None else S.max(-1, keepdims=True)))
        if L is None:
            P = P / P.sum(-1, keepdims=True)
    dP = dO @ T(V, -1, -2)
    D = (dO * O).sum(-1, keepdims=True) if O is not None else (P * dP).sum(-1, keepdims=True)
    dS = P * (dP - D)
    return tau * (dS @ K), tau * (T(dS, -1, -2) @ Q), T(P, -1, -2) @ dO


def backward_check(grads, Q, K, V, dO, causal: bool, ref=None, **saved) -> dict:
    """Check (dQ, dK, dV) against the float64 reference ``ref`` (computed here when None)
    with flash-attention's rule for its backward tests: each within 2 x the error of
    ``plain_backward`` from the same float32 inputs and ``saved`` tensors, plus 2 x the
    float32 rounding of the reference itself."""
    import flashsim

    if ref is None:
        ref = flashsim.reference.attention_backward(Q, K, V, dO, causal)
    base = plain_backward(Q, K, V, dO, causal, **saved)
    per = {}
    for name, got, r, b in zip(("dQ", "dK", "dV"), grads, ref, base):
        got = np.asarray(got, np.float64)
        rounding = float(np.abs((r.astype(np.float32) + np.float32(0.3) - np.float32(0.3)) - r).max())
        err = float(np.abs(got - r).max()) if np.isfinite(got).all() else math.inf
        per[name] = max_error_rule(err, 2 * float(np.abs(b - r).max()) + 2 * rounding)
    worst = max(per.values(), key=lambda v: v["max_abs_error"] - v["bound"])
    return {**worst, "ok": all(v["ok"] for v in per.values()), "per_gradient": per}


def checked_heads(BH: int, N: int) -> list:
    """Heads the checks compare (the float64 reference costs N^2 per head): the first and
    the last up to N = 4096, the last above."""
    return sorted({0, BH - 1}) if N <= 4096 else [BH - 1]


# --------------------------------------------------------------------------------------
# Provenance


def provenance(packages=PACKAGES, extra: dict | None = None) -> dict:
    """Where, when, with what and how: stamped into every committed measurement."""
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _command(),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "host": platform.node(),
        "packages": versions,
    }
    numba_common = sys.modules.get("gpu_kernels.numba.common")
    if numba_common is not None:
        info["numpy_row_stack_restored"] = bool(numba_common.ROW_STACK_RESTORED)
    info.update(gpu_info())
    info.update(extra or {})
    return info


def gpu_info() -> dict:
    """GPU name, driver, CUDA runtime, compute capability, SMs, L2 and memory of device 0
    (through CuPy, else numba when a numba kernel was loaded); {"gpu": None} where there is
    none."""
    try:
        import cupy

        rt = cupy.cuda.runtime
        if rt.getDeviceCount() < 1:
            return {"gpu": None}
        p = rt.getDeviceProperties(cupy.cuda.Device().id)
        name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
        return {"gpu": name, "driver": _driver(rt.driverGetVersion()),
                "cuda_runtime": _version(rt.runtimeGetVersion()),
                "cuda_driver_api": _version(rt.driverGetVersion()),
                "compute_capability": f"{p['major']}.{p['minor']}",
                "sm_count": p["multiProcessorCount"], "l2_bytes": p["l2CacheSize"],
                "gpu_memory_bytes": p["totalGlobalMem"],
                "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion()))}
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: try numba, if in use
        pass
    if "gpu_kernels.numba.common" not in sys.modules:
        return {"gpu": None}
    try:
        from .numba.common import cuda, numba

        if numba.config.ENABLE_CUDASIM or not cuda.is_available():
            return {"gpu": None}
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        api = cuda.cudadrv.driver.driver.get_version()
        return {"gpu": name, "driver": _driver(api[0] * 1000 + api[1] * 10),
                "cuda_runtime": ".".join(map(str, cuda.runtime.get_version())),
                "compute_capability": ".".join(map(str, dev.compute_capability)),
                "sm_count": dev.MULTIPROCESSOR_COUNT, "l2_bytes": dev.L2_CACHE_SIZE}
    except Exception:  # noqa: BLE001
        return {"gpu": None}


def _version(v: int) -> str:
    """CUDA's 13000 -> "13.0"."""
    return f"{v // 1000}.{v % 1000 // 10}"


def _driver(api_version: int) -> str:
    """The driver's version (nvidia-smi), else the CUDA version its API reports."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        if out:
            return out.splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return f"CUDA {_version(api_version)} (driver API)"


def _command() -> str:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    argv[0] = os.path.basename(argv[0])
    return " ".join(shlex.quote(a) for a in argv)


def _git_commit() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], capture_output=True,
                             text=True, timeout=10,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return res.stdout.strip() if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
