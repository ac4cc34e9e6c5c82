"""Compile the CUDA C++ kernels in ``gpu_kernels/cuda/`` for sm_90 without a GPU.

NVRTC through ``cuda.core`` turns each ``.cu`` file (with the compile-time constants of one
variant) into a cubin and ptxas reports, per kernel, its registers, static shared memory,
stack frame and spills. CI runs this (``tests/test_cupy_kernels.py``); by hand::

    python -m gpu_kernels.compile                  # every registered variant, one table
    python -m gpu_kernels.compile --refresh-cache  # compile_cache.json after a kernel edit

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

Across sessions, what the tests read of a compile is committed: ``compile_cache.json``
holds the ptxas log of every variant CI checks (and what the numba compile checks read of
numba's PTX), each under the SHA-256 of the compile's inputs and of the compiler wheels'
versions. :func:`compile_variant` reads a log from there when the key is found, so CI
compiles only what changed since the file was written; see "compile_cache.json" below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import glob
import hashlib
import inspect
import json
import os
import re
import sys
import sysconfig
import types

ARCH = "sm_90"
# Files that need the architecture-specific target (wgmma, setmaxnreg exist only in sm_90a),
# and the constant that asks for it in a file whose other variants do not (decode.cu's v5).
FILE_ARCH = {"flash3.cu": "sm_90a"}
ARCH_DEFINE = {"WGMMA": "sm_90a"}


def arch_for(cu_file: str, defines: dict[str, int] | None = None) -> str:
    """The target one variant of ``cu_file`` compiles for: sm_90a for flash3.cu and for a
    variant that sets a constant of ARCH_DEFINE, else ARCH."""
    for name, arch in ARCH_DEFINE.items():
        if (defines or {}).get(name):
            return arch
    return FILE_ARCH.get(cu_file, ARCH)
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


def _options(defines: dict[str, int] | None, arch: str, name: str) -> dict:
    """``ProgramOptions`` of one compile (as CuPy compiles RawModule code)."""
    return dict(
        name=name,
        arch=arch,
        std="c++17",
        include_path=cuda_include_dirs() + cupy_include_dirs(),
        # in name order: the same constants in any order are the same compile (and one key)
        define_macro=[(k, str(v)) for k, v in sorted((defines or {}).items())] or None,
        device_as_default_execution_space=True,  # as CuPy compiles RawModule code
        ptxas_options="-v",
    )


def compile_cubin(source: str, defines: dict[str, int] | None = None, *, arch: str = ARCH,
                  name: str = "kernel.cu") -> tuple[bytes, str]:
    """Compile CUDA C++ source to a cubin with NVRTC (cuda.core); returns (cubin, ptxas log).

    Raises ``RuntimeError`` with NVRTC's log on a compile or ptxas error. With
    ``FLASHSIM_CUBIN_CACHE`` set (a test session), an identical compile is done once.
    """
    options = _options(defines, arch, name)
    with _cached(source, options) as cached:
        if cached.value is None:
            cached.value = _compile(source, options, defines)
        return cached.value


def ptxas_log(source: str, defines: dict[str, int] | None = None, *, arch: str = ARCH,
              name: str = "kernel.cu") -> str:
    """:func:`compile_cubin`'s ptxas log, read from ``compile_cache.json`` when it holds this
    compile (then nothing is compiled)."""
    entry = committed().get(_nvrtc_key(source, _options(defines, arch, name)))
    if entry:
        return entry["log"]
    return compile_cubin(source, defines, arch=arch, name=name)[1]


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

    log = ptxas_log(read_source(cu_file), defines, arch=arch_for(cu_file, defines), name=cu_file)
    return [KernelResources(file=cu_file, variant=variant_label(defines), kernel=k, dynamic_smem=dynamic_smem, **r)
            for k, r in parse_ptxas_log(log).items()]


def all_variants() -> list[tuple[str, dict[str, int], int, tuple[str, ...]]]:
    """Every (cu file, defines, dynamic smem bytes, hot kernel names) the CuPy loaders register."""
    from gpu_kernels import registry

    modules = dict.fromkeys(k.module() for k in registry.KERNELS.values() if k.backend == "cupy")
    return [v for m in modules for v in m.compile_variants()]


def cached_variants() -> list[tuple[str, dict[str, int], int, tuple[str, ...]]]:
    """The variants whose ptxas logs ``compile_cache.json`` holds: :func:`all_variants` and
    the decode kernel's (tests/test_decode_kernel.py)."""
    from gpu_kernels.cupy import decode

    return all_variants() + decode.compile_variants()


# ------------------------------------------------------------------ compile_cache.json
# What the tests read of a compile (ptxas's log; facts of numba's PTX; the log of the linker
# that assembles numba's PTX) is a pure function of what was compiled and of the compiler, so
# it is committed: each entry under the SHA-256 of the compile's inputs and of the versions
# of the compiler's wheels. A compile whose key is not there is run as before (a changed
# kernel is still checked, only slower); tests/test_compile_cache.py fails while a compile
# CI asks for is missing, and ``python -m gpu_kernels.compile --refresh-cache`` compiles
# what is missing and drops what nothing asks for.

CACHE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_cache.json")
NVRTC_WHEELS = ("nvidia-cuda-nvrtc",)                              # NVRTC, its ptxas inside
NUMBA_WHEELS = ("numba", "numba-cuda", "llvmlite", "nvidia-nvvm")  # numba's PTX
LINKER_WHEELS = ("nvidia-nvjitlink",)                              # cuda.core's Linker
# The files numba kernels are made of: the kernels, the helpers they import, and cdiv
# (flashsim.units), the one flashsim function that computes their constants. The tiles
# flashsim chooses are in each key as the Tiling itself.
NUMBA_FILES = ("gpu_kernels/numba/*.py", "gpu_kernels/common.py", "flashsim/units.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIME = re.compile(r"^.*Compile time = .*\n?", re.M)
_SYSTEM_INCLUDE = re.compile(r"^\s*#\s*include\b", re.M)


def versions(wheels: tuple[str, ...]) -> dict[str, str | None]:
    """The installed version of each wheel (None if it is not installed: a compiler from a
    CUDA toolkit instead of wheels then finds no committed entry)."""
    from importlib import metadata

    out = {}
    for w in wheels:
        try:
            out[w] = metadata.version(w)
        except metadata.PackageNotFoundError:
            out[w] = None
    return out


def _stored(log: str) -> str:
    """A log as the file keeps it: without the compile times (they differ run to run) and
    the C string's trailing NULs."""
    return _TIME.sub("", log).rstrip("\0")


def _key(inputs: list, wheels: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps([inputs, versions(wheels)], sort_keys=True).encode()).hexdigest()


def _nvrtc_key(source: str, options: dict) -> str | None:
    """The key of an NVRTC compile: the source (our headers pasted in by ``read_source``) and
    the options but the include folders, whose paths differ between machines and which are
    read only for an ``#include`` left in the source (no key then: always compiled)."""
    if _SYSTEM_INCLUDE.search(source):
        return None
    return _key(["nvrtc", source, {k: v for k, v in options.items() if k != "include_path"}],
                NVRTC_WHEELS)


@functools.cache
def _cache_file() -> dict:
    if not os.path.exists(CACHE_FILE):
        return {}
    with open(CACHE_FILE) as f:
        return json.load(f)


def committed() -> dict[str, dict]:
    """``{key: entry}`` from ``compile_cache.json`` (empty without the file)."""
    return _cache_file().get("entries", {})


@functools.cache
def _numba_files_sha256() -> str:
    files = sorted(f for pattern in NUMBA_FILES for f in glob.glob(os.path.join(ROOT, pattern)))
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as g:
            h.update(os.path.relpath(f, ROOT).encode() + b"\0" + g.read())
    return h.hexdigest()


# The launches whose numba kernels CI compiles (tests/test_numba_kernels.py): flashsim's
# tiles at d = 64 and 128, and small ragged tiles with a causal mask.
NUMBA_FORWARD = [((1, 1, 4096, 64), False, {}), ((1, 1, 4096, 128), True, {}),
                 ((1, 1, 37, 12), True, dict(block_rows=16, block_cols=8))]
# The numba backward kernels CI compiles (tests/test_numba_backward.py): the configurations
# the H200 benchmark launches (benchmarks/backward_h200.py).
NUMBA_BACKWARD = [("flash2_bwd", (32, 32, 64, 256, False)), ("flash2_bwd", (32, 32, 64, 256, True)),
                  ("flash2_bwd", (16, 16, 128, 256, False)),
                  ("flash2_bwd_preprocess", (64, 256)), ("scores", (64, 64, 64, 256)),
                  ("accumulate", (64, 64, 64, 256, True)), ("accumulate", (64, 64, 64, 256, False)),
                  ("softmax_rows", (1024, 256, True, 1)), ("softmax_bwd_rows", (4096, 256, 1))]


def ptx_facts(ptx: str) -> dict:
    """What the compile checks read of a numba kernel's PTX: its target, whether a per-thread
    array went to local memory, float64 instructions, 16-byte shared loads, static shared
    bytes."""
    shared = re.findall(r"\.shared \.align \d+ \.b8 \w+\[(\d+)\]", ptx)
    return dict(target=".target sm_90" in ptx, local=".local" in ptx,
                f64=len(re.findall(r"\.f64", ptx)), vec4=len(re.findall(r"ld\.shared\.v4\.f32", ptx)),
                smem=sum(map(int, shared)))


def numba_forward() -> list[dict]:
    """One row per kernel of each launch of ``NUMBA_FORWARD``: alg, kernel name, shape,
    causal, launch, kernel, signature and the key of its compile (works under the
    simulator: nothing is compiled)."""
    from gpu_kernels.numba import flash1, flash2, standard

    rows, reader = [], inspect.getsource(ptx_facts)      # a changed reader: new keys
    for alg, mod in {"standard": standard, "flash1": flash1, "flash2": flash2}.items():
        for shape, causal, tiles in NUMBA_FORWARD:
            launch = mod.configure(*shape, causal=causal, **tiles)
            for name, kernel, sig in mod.kernels_for(launch.tiling, causal):
                key = _key(["numba ptx", alg, name, repr(launch.tiling), causal, str(sig),
                            _numba_files_sha256(), reader], NUMBA_WHEELS)
                rows.append(dict(alg=alg, kernel=name, shape=shape, causal=causal, launch=launch,
                                 function=kernel, signature=sig, key=key))
    return rows


def numba_backward() -> list[dict]:
    """One row per entry of ``NUMBA_BACKWARD``: name, arguments, signature, key."""
    import gpu_kernels.numba.backward as nb

    return [dict(kernel=name, args=args, signature=nb.SIGNATURES[name],
                 key=_key(["numba link", name, list(args), nb.SIGNATURES[name], _numba_files_sha256()],
                          NUMBA_WHEELS + LINKER_WHEELS))
            for name, args in NUMBA_BACKWARD]


def _numba_ptx(function, signature) -> str:
    """numba's PTX for sm_90 (in a process without the CUDA simulator). Device functions ask
    the current device's compute capability while compiling: that one call is stubbed."""
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    return cuda.compile_ptx(function, signature, cc=(9, 0))[0]


def _link_log(ptx: str) -> str:
    """The info log of cuda.core's Linker assembling PTX for sm_90 (registers, shared
    memory, spills, as ptxas reports them)."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch="sm_90", verbose=True))
    linker.link("cubin")
    return linker.get_info_log()


def numba_results(parts=("forward", "backward")) -> dict[str, object]:
    """``{key: result}`` of the numba compiles CI checks (the facts of the forward kernels'
    PTX, the linker logs of the backward ones), from ``compile_cache.json`` where it holds
    them, else compiled: run it in a process without the CUDA simulator
    (``python -m gpu_kernels.compile --numba [forward|backward]``)."""
    import gpu_kernels.numba.backward as nb

    have, out, ptx = committed(), {}, {}
    for r in numba_forward() if "forward" in parts else []:
        if r["key"] in have:
            out[r["key"]] = have[r["key"]]["ptx"]
        elif r["key"] not in out:
            # kernel factories are cached (same tiles, same object): one compile for them
            at = (r["function"], str(r["signature"]))
            if at not in ptx:
                ptx[at] = ptx_facts(_numba_ptx(r["function"].py_func, r["signature"]))
            out[r["key"]] = ptx[at]
    for r in numba_backward() if "backward" in parts else []:
        out[r["key"]] = (have[r["key"]]["log"] if r["key"] in have else _stored(
            _link_log(_numba_ptx(getattr(nb, r["kernel"] + "_source")(*r["args"]), r["signature"]))))
    return out


def _cu_compiles() -> dict[str, tuple]:
    """``{key: (what, file, defines, arch)}`` of every CUDA C++ compile the cache holds."""
    from gpu_kernels.cupy.common import read_source

    out = {}
    for cu_file, defines, _dyn, _hot in cached_variants():
        arch = arch_for(cu_file, defines)
        key = _nvrtc_key(read_source(cu_file), _options(defines, arch, cu_file))
        out[key] = (f"{cu_file} {variant_label(defines)} ({arch})", cu_file, defines, arch)
    return out


def wanted(cu: dict | None = None) -> dict[str, str]:
    """``{key: what}`` of every compile ``compile_cache.json`` should hold (``cu``: the CUDA
    C++ ones, ``_cu_compiles()``, when the caller has them)."""
    out = {k: v[0] for k, v in (_cu_compiles() if cu is None else cu).items()}
    for r in numba_forward():
        out[r["key"]] = f"numba {r['alg']} {r['kernel']} {r['launch'].tiling} causal={r['causal']}"
    for r in numba_backward():
        out[r["key"]] = f"numba backward {r['kernel']}{tuple(r['args'])}"
    return out


def stale() -> tuple[list[str], int, dict]:
    """(what of each compile CI asks for that ``compile_cache.json`` lacks, how many of its
    entries nothing asks for, {wheel: (its version in the file, here)} where they differ)."""
    want, have = wanted(), committed()
    now, written = versions(NVRTC_WHEELS + NUMBA_WHEELS + LINKER_WHEELS), _cache_file().get("wheels", {})
    return ([w for k, w in want.items() if k not in have], len(have.keys() - want.keys()),
            {w: (written.get(w), v) for w, v in now.items() if written.get(w) != v})


def refresh_cache() -> str:
    """Compile what ``compile_cache.json`` lacks, drop what nothing asks for, write it;
    returns a summary line. An entry kept is not compiled again: its key holds everything
    its result is a function of."""
    from gpu_kernels.cupy.common import read_source

    cu = _cu_compiles()
    want, have = wanted(cu), committed()
    entries = {k: have[k] for k in want if k in have}
    for key, (what, cu_file, defines, arch) in cu.items():
        if key not in entries:
            log = compile_cubin(read_source(cu_file), defines, arch=arch, name=cu_file)[1]
            entries[key] = dict(what=what, log=_stored(log))
    if any(k not in entries for k in want):        # numba's: compiled where not committed
        for key, result in numba_results().items():
            kind = "ptx" if isinstance(result, dict) else "log"
            entries.setdefault(key, {"what": want[key], kind: result})
    with open(CACHE_FILE, "w") as f:
        json.dump({"note": "What tests read of each compile CI checks, under the SHA-256 of its inputs and "
                           "compiler (gpu_kernels/compile.py); written by python -m gpu_kernels.compile "
                           "--refresh-cache.",
                   "wheels": versions(NVRTC_WHEELS + NUMBA_WHEELS + LINKER_WHEELS),
                   "entries": dict(sorted(entries.items(), key=lambda kv: kv[1]["what"]))},
                  f, indent=1)
        f.write("\n")
    _cache_file.cache_clear()
    kept = len(want.keys() & have.keys())
    return (f"{CACHE_FILE}: {len(entries)} entries: {kept} kept, {len(entries) - kept} compiled, "
            f"{len(have.keys() - want.keys())} dropped")


def format_table(rows: list[KernelResources]) -> str:
    head = f"{'file':<21} {'kernel':<26} {'variant':<66} {'regs':>4} {'smem':>8} {'stack':>5} {'spill st/ld':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.file:<21} {r.kernel:<26} {r.variant:<66} {r.registers:>4} {r.smem:>8} "
                     f"{r.stack_frame:>5} {f'{r.spill_stores}/{r.spill_loads}':>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--refresh-cache"]:
        print(refresh_cache())
        return 0
    if argv[:1] == ["--numba"]:      # for the tests, which run under the simulator
        print(json.dumps(numba_results(argv[1:] or ("forward", "backward"))))
        return 0
    rows = []
    for cu_file, defines, dyn, _hot in all_variants():
        rows.extend(compile_variant(cu_file, defines, dyn))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
