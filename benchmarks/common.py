"""What the benchmark scripts share: the command line (``--out DIR``, ``--quiet``), writing
the JSON file, a deadline after which remaining points are skipped (and recorded as
skipped), the progress bar over a script's points (``Progress``: tqdm on stderr, none
with ``--quiet`` or when stderr is no terminal), and ``ClockLog``: NVML's clocks through a run."""

from __future__ import annotations

import traceback

import argparse
import json
import os
import time

from flashsim import measured
from flashsim.measure import Progress  # noqa: F401  (the scripts' progress bar)


def parser(doc: str, out_required: bool = False, deadline_s: float | None = None,
           smoke: bool = False) -> argparse.ArgumentParser:
    """A parser whose description is the script's first line, with ``--out DIR`` and, when
    asked, ``--deadline-s`` (default ``deadline_s``) and ``--smoke`` (tiny sizes under the
    CUDA simulator: checks the script on a machine without a GPU, times nothing)."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    if out_required:
        ap.add_argument("--out", required=True, help="folder for the JSON files and logs")
    else:
        ap.add_argument("--out", default=str(measured.DATA_DIR),
                        help="folder for the JSON file (default: the committed data folder)")
    if deadline_s is not None:
        ap.add_argument("--deadline-s", type=float, default=deadline_s,
                        help="start no new point after this many seconds (skipped, recorded)")
    if smoke:
        ap.add_argument("--smoke", action="store_true",
                        help="tiny sizes under the CUDA simulator (no GPU; times mean nothing)")
    return ap


def write_json(out_dir: str, name: str, data: dict, indent: int | None = 1) -> str:
    """Write ``data`` to OUT/name (indented, so diffs of committed data stay readable;
    ``indent=None`` for long per-block records)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(data, f, indent=indent)
        f.write("\n")
    return path


class Deadline:
    """Seconds left of a budget that started when this was made."""

    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.time()

    def left(self) -> float:
        return self.seconds - (time.time() - self.t0)

    def elapsed(self) -> float:
        return time.time() - self.t0


class ClockLog:
    """NVML's view of GPU 0 while a run goes on: ``sample()`` once, or ``start()`` a thread
    that samples every ``period_s`` until ``stop()``. A sample is (host ``time.perf_counter()``
    seconds, SM MHz, memory MHz, the clock-event ("throttle") reasons bitmask, power in W,
    temperature in C); without NVML (no pynvml, no driver) ``sample()`` is None and the log
    stays empty. ``as_dict()`` is what a benchmark stores beside its timings, so that a slow
    timing can be set beside what the GPU's clocks did meanwhile."""

    FIELDS = ("t_s", "sm_mhz", "mem_mhz", "reasons", "power_w", "temp_c")
    REASONS = ("GpuIdle", "ApplicationsClocksSetting", "SwPowerCap", "HwSlowdown", "SyncBoost",
               "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown", "DisplayClockSetting")

    def __init__(self, period_s: float = 0.02):
        self.period_s, self.samples, self._thread, self._stop = period_s, [], None, None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:           # noqa: BLE001 - no NVML here: nothing is logged
            self._nv = self._h = None

    def sample(self) -> tuple | None:
        if self._h is None:
            return None
        nv, h = self._nv, self._h
        return (time.perf_counter(), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
                nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))

    def start(self) -> "ClockLog":
        import threading

        if self._h is not None and self._thread is None:
            self._stop = threading.Event()

            def loop():
                while not self._stop.is_set():
                    self.samples.append(self.sample())
                    self._stop.wait(self.period_s)
            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def as_dict(self) -> dict:
        bits = {}
        if self._nv is not None:
            for name in self.REASONS:
                bit = getattr(self._nv, f"nvmlClocksThrottleReason{name}", None)
                if bit is not None:
                    bits[name] = int(bit)
        return {"source": "NVML" if self._h is not None else "none (no NVML here)",
                "period_s": self.period_s, "fields": list(self.FIELDS), "reason_bits": bits,
                "samples": [list(x) for x in self.samples]}


class Recorder:
    """A benchmark's results, saved as they grow: "points", "skipped" (each with its reason)
    and whatever else the script adds, under a deadline (``args.deadline_s``)."""

    def __init__(self, args, name: str, method: str, **sections):
        self.args, self.name = args, name
        self.deadline = Deadline(args.deadline_s)
        self.results = {"provenance": None, "method": method, **sections, "points": [],
                        "skipped": []}

    def left(self) -> float:
        return self.deadline.left()

    def due(self, what: dict) -> bool:
        """Time is left for ``what``; else it is recorded as skipped for the deadline."""
        if self.left() >= 0:
            return True
        self.skip(what, "deadline")
        return False

    def skip(self, what: dict, reason: str) -> None:
        self.results["skipped"].append({**what, "reason": reason})
        print(f"  skip {what}: {reason}", flush=True)

    def save(self) -> str:
        return write_json(self.args.out, self.name, self.results)

    def flex_or_none(self, make):
        """``make()`` (a torch.compile(flex_attention) runner), or None with the reason under
        "flex_note": ``--no-flex`` given, or flex_attention unavailable."""
        if self.args.no_flex:
            self.results["flex_note"] = "not run (--no-flex)"
            return None
        try:
            return make()
        except Exception as exc:     # noqa: BLE001 - recorded; the run goes on without it
            self.results["flex_note"] = f"flex_attention unavailable: {type(exc).__name__}: {exc}"
            return None

    def guarded(self, *steps) -> bool:
        """Run ``steps`` in order. An exception is printed and kept under "error", not
        raised, so what was measured before it is still saved; returns whether all ran."""
        try:
            for step in steps:
                step()
        except Exception:                # noqa: BLE001 - recorded, and the run ends well
            traceback.print_exc()
            self.results["error"] = traceback.format_exc()
            return False
        return True

    def finish(self, note: str = "") -> str:
        """Record the elapsed time, save, and say where (``note`` after the time)."""
        self.results["elapsed_s"] = self.deadline.elapsed()
        path = self.save()
        print(f"wrote {path} in {self.results['elapsed_s']:.0f} s{note}", flush=True)
        return path
