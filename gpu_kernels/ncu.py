"""Nsight Compute counters for launches of our kernels: the ncu command, its CSV, and a
child process that runs each launch exactly once inside an NVTX range.

    rows = ncu.profile([{"kernel": "numba_flash2", "batch": 2, "heads": 8, "seq_len": 2048,
                         "head_dim": 64}, ...])
    # rows[i]: the kernel launches spec i made, each {"kernel_name", metric: value, "units"}

``profile`` writes the specs to a file and runs ``python -m gpu_kernels.ncu workload --specs
FILE`` under ``ncu --clock-control none --nvtx --nvtx-include RANGE/ --metrics ... --csv
--page raw`` (ncu's default cache control flushes and invalidates the L2 before every
profiled kernel). The child builds each launch from ``gpu_kernels.registry`` and its inputs
as ``gpu_kernels.measure`` does, runs it once outside the range (compile, warm-up), then
inside the range a marker kernel and exactly one run. Rows between two markers belong to the
spec the first opened (``assign``). ``benchmarks/ncu_sweep.py`` uses the same command, parser
and markers for its sweep.

``COUNTERS`` (what ``flashsim measure --ncu`` reads):

    dram__bytes_read.sum, dram__bytes_write.sum        bytes that crossed DRAM
    lts__t_sectors_srcunit_tex_op_read.sum / _write    32-byte L2 sectors the SMs asked for
    gpu__time_duration.sum                             kernel time

Values are kept as ncu printed them, with their units; ``parse_csv`` refuses a unit other
than the base one it expects, so nothing is rescaled by guess. Importing this module imports
neither numba nor CuPy.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

COUNTERS = [
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
    "gpu__time_duration.sum",
]
# the unit ncu's raw page prints for each counter; any other is refused (see parse_csv)
BASE_UNITS = {"dram__bytes_read.sum": "byte", "dram__bytes_write.sum": "byte",
              "lts__t_sectors_srcunit_tex_op_read.sum": "sector",
              "lts__t_sectors_srcunit_tex_op_write.sum": "sector",
              "gpu__time_duration.sum": "ns"}
MARKER = "flashsim_point_marker"
RANGE = "m"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class NcuError(RuntimeError):
    """ncu was not found, failed, or printed what this parser cannot read."""


def executable() -> str | None:
    """The ``ncu`` on PATH, or None."""
    return shutil.which("ncu")


def command(metrics, program: list, nvtx_range: str = RANGE) -> list:
    """The ncu command line that profiles ``program``'s kernels inside ``nvtx_range``."""
    return ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", f"{nvtx_range}/",
            "--metrics", ",".join(metrics), "--csv", "--page", "raw", *program]


def child_env() -> dict:
    """The environment of a profiled child: the real GPU (never numba's simulator), this
    checkout first on the path, unbuffered output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def parse_csv(text: str, metrics=COUNTERS) -> list[dict]:
    """Rows of ``ncu --csv --page raw``: one per profiled kernel, metric columns (floats
    where they are numbers) and ``units``."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, body = rows[0], rows[1], rows[2:]
    for m, unit in BASE_UNITS.items():
        if m in metrics and m in header and units[header.index(m)] != unit:
            raise NcuError(f"ncu printed {m} in {units[header.index(m)]!r}, not {unit!r}")
    out = []
    for r in body:
        rec = dict(zip(header, r))
        row = {"kernel_name": rec.get("Kernel Name"), "id": rec.get("ID")}
        for m in metrics:
            v = rec.get(m)
            if v is None or v == "":
                row[m] = None
                continue
            try:
                row[m] = float(v.replace(",", ""))
            except ValueError:
                row[m] = v
        row["units"] = {m: units[header.index(m)] for m in metrics if m in header}
        out.append(row)
    return out


def assign(rows: list[dict], points: list[dict]) -> list[dict]:
    """Kernel rows between markers belong to the point the marker opened: each point
    returned with its ``launches``."""
    out, cur = [], None
    for row in rows:
        if MARKER in (row["kernel_name"] or ""):
            cur = len(out)
            if cur >= len(points):
                raise NcuError("more markers than points")
            out.append(dict(points[cur], launches=[]))
            continue
        if cur is None:
            raise NcuError(f"kernel {row['kernel_name']} before the first marker")
        out[-1]["launches"].append(row)
    if len(out) != len(points):
        raise NcuError(f"{len(out)} markers for {len(points)} points")
    return out


class Marker:
    """A tiny CuPy kernel named ``MARKER``, launched before each profiled point."""

    def __init__(self):
        import cupy

        self.kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", MARKER)
        self.scratch = cupy.zeros(32, dtype=cupy.float32)

    def __call__(self) -> None:
        self.kernel(self.scratch, self.scratch)


def profile(specs: list[dict], metrics=COUNTERS, timeout_s: float = 600) -> list[list[dict]]:
    """The kernel launches of each spec (``{"kernel", "batch", "heads", "seq_len",
    "head_dim"}`` and optionally ``dtype, causal, block_rows, block_cols``; a decode kernel's
    as ``flashsim.measure.spec`` writes it: ``kv_heads, q_len, kv_len`` or ``kv_lens``,
    ``page_size, splits``), profiled once each under ncu in one child process. NcuError if
    ncu is missing or fails."""
    if executable() is None:
        raise NcuError("Nsight Compute's ncu is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "specs.json")
        with open(path, "w") as f:
            json.dump(specs, f)
        cmd = command(metrics, [sys.executable, "-m", "gpu_kernels.ncu", "workload",
                                "--specs", path])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(),
                                  cwd=ROOT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise NcuError(f"ncu ran past {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        last = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise NcuError(f"ncu exited {proc.returncode}: {last[-1] if last else 'no output'}")
    return [p["launches"] for p in assign(parse_csv(proc.stdout, metrics), specs)]


def version() -> str | None:
    """ncu's version line, or None without ncu."""
    if executable() is None:
        return None
    out = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else None


# ------------------------------------------------------------------ the child (on the GPU)
def workload(specs: list[dict]) -> None:
    """Each spec once inside the NVTX range, after a run outside it (compile, warm-up)."""
    import cupy

    from . import _backward_case, _random_inputs, harness, registry

    marker = Marker()
    for spec in specs:
        spec = dict(spec)
        launch = registry.get(spec.pop("kernel")).launch(**spec)
        if launch.kernel in registry.DECODE_KERNELS:      # one decode step, as measure_decode's
            from .cupy import decode

            data = decode.device_inputs(launch, 0)

            def fn(launch=launch, data=data):
                return launch.run(*data)
        elif launch.pass_ == "bwd":
            data = _random_inputs(launch, 0)
            fn, _ = _backward_case(launch, data, harness.checked_heads(launch.BH, launch.N))
        else:
            data = _random_inputs(launch, 0)

            def fn(launch=launch, data=data):
                return launch.run(*data["dev"][:3])
        fn()
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.nvtx.RangePush(RANGE)
        marker()
        fn()
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.nvtx.RangePop()
        del fn, data, launch            # the next spec's inputs may need the memory
        free_device_memory()


def free_device_memory() -> None:
    """Give back what CuPy's pool and numba's deferred deallocations still hold."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    if "numba.cuda" in sys.modules:        # numba frees device memory lazily
        import gc

        gc.collect()
        sys.modules["numba.cuda"].current_context().deallocations.clear()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="the program ncu profiles (see gpu_kernels.ncu)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("workload").add_argument("--specs", required=True)
    args = ap.parse_args(argv)
    with open(args.specs) as f:
        workload(json.load(f))


if __name__ == "__main__":
    main()
