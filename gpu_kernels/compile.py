"""Compile the CUDA C++ kernels in ``gpu_kernels/cuda/`` for sm_90 without a GPU.

NVRTC through ``cuda.core`` turns each ``.cu`` file (with the compile-time constants of one
variant) into a cubin and ptxas reports, per kernel, its registers, static shared memory,
stack frame and spills. CI runs this (``tests/test_cupy_kernels.py``); by hand::

    python -m gpu_kernels.compile          # every registered variant, one table

Nothing here needs a GPU or a driver: ``cuda.core.Program`` only calls NVRTC. The kernels
include only ``common.cuh`` (pasted in by ``read_source``, as for CuPy), but the include
folders of the CUDA headers shipped in the pip wheels (and CuPy's own) are passed anyway, as
CuPy would, so a kernel that adds ``#include <mma.h>`` or ``<cuda_fp16.h>`` still compiles
here. The variants are those of every CuPy entry of ``gpu_kernels.registry``.

Within one test session a compile is done once: the test set-up (conftest.py) names a folder
in ``FLASHSIM_CUBIN_CACHE``, and :func:`compile_cubin` keeps there each (cubin, ptxas log)
under the SHA-256 of everything the compile reads (source, constants, architecture, name,
options), so a variant that several test files check (every flash3 variant is in
:func:`all_variants` and in the flash3 tests) is compiled by whichever asks first, once, and
read back by the others. Without the variable nothing is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import re
import sys
import sysconfig
import types

ARCH = "sm_90"
# Files that need the architecture-specific target (wgmma, setmaxnreg exist only in sm_90a).
FILE_ARCH = {"flash3.cu": "sm_90a"}
SMEM_LIMIT_OPTIN = 227 * 1024  # bytes of shared memory per block on sm_90 with the opt-in
SMEM_LIMIT_DEFAULT = 48 * 1024  # without it
CACHE_ENV = "FLASHSIM_CUBIN_CACHE"


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one kernel of one variant."""

    file: str
    variant: str
    kernel: str
    registers: int
    static_smem: int  # bytes, __shared__ arrays
    dynamic_smem: int  # bytes, extern __shared__ (from the loader's formula)
    stack_frame: int  # bytes
    spill_stores: int  # bytes
    spill_loads: int  # bytes

    @property
    def smem(self) -> int:
        return self.static_smem + self.dynamic_smem

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def cuda_include_dirs() -> list[str]:
    """Folders holding the CUDA headers (mma.h, cuda_fp16.h, ...): pip wheels, then toolkit."""
    dirs: list[str] = []
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for root in sorted(roots):
        for pattern in ("nvidia/cu*/include", "nvidia/cuda_runtime/include", "nvidia/cuda_nvrtc/include",
                        "nvidia/cuda_cccl/include"):
            for d in sorted(glob.glob(os.path.join(root, pattern))):
                if os.path.isfile(os.path.join(d, "cuda_fp16.h")) or os.path.isfile(os.path.join(d, "mma.h")):
                    dirs.append(d)
    cuda_home = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if os.path.isfile(os.path.join(cuda_home, "include", "mma.h")):
        dirs.append(os.path.join(cuda_home, "include"))
    return list(dict.fromkeys(dirs))


def cupy_include_dirs() -> list[str]:
    """The -I folders CuPy passes to NVRTC (its own headers, CCCL), if CuPy is installed."""
    try:
        from cupy._core.core import assemble_cupy_compiler_options
    except ImportError:
        return []
    return [o[2:] for o in assemble_cupy_compiler_options(()) if o.startswith("-I")]


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas_log(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v output -> {kernel: {registers, static_smem, stack_frame, spill_stores, spill_loads}}."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            out[current] = dict(registers=0, static_smem=0, stack_frame=0, spill_stores=0, spill_loads=0)
        elif current and (m := _PROPS.search(line)):
            out[current].update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)),
                                spill_loads=int(m.group(3)))
        elif current and (m := _USED.search(line)):
            out[current].update(registers=int(m.group(1)), static_smem=int(m.group(2) or 0))
    return out


def compile_cubin(source: str, defines: dict[str, int] | None = None, *, arch: str = ARCH,
                  name: str = "kernel.cu") -> tuple[bytes, str]:
    """Compile CUDA C++ source to a cubin with NVRTC (cuda.core); returns (cubin, ptxas log).

    Raises ``RuntimeError`` with NVRTC's log on a compile or ptxas error. With
    ``FLASHSIM_CUBIN_CACHE`` set (a test session), an identical compile is done once.
    """
    options = dict(
        name=name,
        arch=arch,
        std="c++17",
        include_path=cuda_include_dirs() + cupy_include_dirs(),
        # in name order: the same constants in any order are the same compile (and one key)
        define_macro=[(k, str(v)) for k, v in sorted((defines or {}).items())] or None,
        device_as_default_execution_space=True,  # as CuPy compiles RawModule code
        ptxas_options="-v",
    )
    with _cached(source, options) as cached:
        if cached.value is None:
            cached.value = _compile(source, options, defines)
        return cached.value


def _compile(source: str, options: dict, defines: dict | None) -> tuple[bytes, str]:
    import io

    from cuda.core import Program, ProgramOptions

    logs = io.StringIO()
    try:
        code = Program(source, "c++", ProgramOptions(**options)).compile("cubin", logs=logs)
    except Exception as exc:  # NVRTCError / CUDAError: add the log to the message
        raise RuntimeError(f"compiling {options['name']} {defines or {}} failed:\n{exc}\n"
                           f"{logs.getvalue()}") from exc
    return bytes(code.code), logs.getvalue()


@contextlib.contextmanager
def _cached(source: str, options: dict):
    """The slot of this compile in ``FLASHSIM_CUBIN_CACHE``: ``.value`` is the stored
    (cubin, log) or None; a value set inside the block is stored. The slot is locked
    meanwhile, so a second process asking for the same compile waits and reads it. Failed
    compiles are not stored (each asker gets the error)."""
    slot = types.SimpleNamespace(value=None)
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        yield slot
        return
    key = hashlib.sha256(json.dumps([source, options], sort_keys=True).encode()).hexdigest()
    path = os.path.join(folder, key)
    os.makedirs(folder, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path + ".log"):
            with open(path + ".cubin", "rb") as f, open(path + ".log") as g:
                slot.value = (f.read(), g.read())
            yield slot
            return
        yield slot
        if slot.value is not None:
            cubin, log = slot.value
            with open(path + ".cubin", "wb") as f:
                f.write(cubin)
            with open(path + ".log", "w") as g:   # written last: its presence marks a whole entry
                g.write(log)


def variant_label(defines: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in defines.items()) or "(defaults)"


def compile_variant(cu_file: str, defines: dict[str, int], dynamic_smem: int = 0) -> list[KernelResources]:
    """Compile one variant of one file in gpu_kernels/cuda/ and return each kernel's resources."""
    from gpu_kernels.cupy.common import read_source

    _, log = compile_cubin(read_source(cu_file), defines, arch=FILE_ARCH.get(cu_file, ARCH), name=cu_file)
    return [KernelResources(file=cu_file, variant=variant_label(defines), kernel=k, dynamic_smem=dynamic_smem, **r)
            for k, r in parse_ptxas_log(log).items()]


def all_variants() -> list[tuple[str, dict[str, int], int, tuple[str, ...]]]:
    """Every (cu file, defines, dynamic smem bytes, hot kernel names) the CuPy loaders register."""
    from gpu_kernels import registry

    modules = dict.fromkeys(k.module() for k in registry.KERNELS.values() if k.backend == "cupy")
    return [v for m in modules for v in m.compile_variants()]


def format_table(rows: list[KernelResources]) -> str:
    head = f"{'file':<21} {'kernel':<26} {'variant':<66} {'regs':>4} {'smem':>8} {'stack':>5} {'spill st/ld':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.file:<21} {r.kernel:<26} {r.variant:<66} {r.registers:>4} {r.smem:>8} "
                     f"{r.stack_frame:>5} {f'{r.spill_stores}/{r.spill_loads}':>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    rows = []
    for cu_file, defines, dyn, _hot in all_variants():
        rows.extend(compile_variant(cu_file, defines, dyn))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
