"""FlashInfer for the GPU machine, which can neither download nor (in its time budget) build it:
its modules built here, on a machine without a GPU, for sm_90a.

    python -m benchmarks.peers.flashinfer_aot --out .whl/aot      # needs torch, flashinfer-python, nvcc

builds the modules that ``decode_h200 --flashinfer`` calls (fp16, d = 128, int32 indices, no
positional encoding, sliding window or soft cap): the batch decode kernel on CUDA cores, and
the batch prefill kernels of backends fa2 (the tensor-core decode, and q_len > 1) and fa3
(q_len > 1 on Hopper), each with FlashInfer's own JIT (ninja, nvcc) and copied to
OUT/<name>/<name>.so, the layout of FlashInfer's AOT folder (``flashinfer/data/aot``). FlashInfer
loads a module found there and compiles nothing. The modules link to the CUDA runtime and,
through tvm-ffi's DLPack interface, to no PyTorch: a CPU build of torch here builds them.
Where no driver is installed (no libcuda to link against) an empty stub stands in; the GPU
machine's driver provides the real one at load time. fa3's sources include cuRAND's device
header: where the toolkit lacks it, the nvidia-curand wheel has it
(``NVCC_APPEND_FLAGS=-I<its nvidia/cu13/include>``).

Written against flashinfer-python 0.5.3, as the committed data ran it: a module's name follows
the arguments its wrapper passes to these generators, which another version may change.
On the GPU machine (the device tool's README: wheels travel in an ignored folder named in
``carry``; 0.7.4's wheel alone is over its 64 MiB), with ``.whl`` holding the wheels for its
Python 3.12::

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .whl flashinfer-python==0.5.3 apache-tvm-ffi==0.1.15.post2

and ``.whl/aot`` this script's output, the run is::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    mkdir -p /tmp/site/flashinfer/data/aot && cp -r .whl/aot/* /tmp/site/flashinfer/data/aot/
    FLASHINFER_DISABLE_JIT=1 PYTHONPATH=/tmp/site python3 -m benchmarks.decode_h200 --flashinfer --out DIR
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

ARCH = "9.0a"        # the H200: wgmma and the TMA unit need the "a" target


def specs(backends=("fa2", "fa3")):
    """FlashInfer's JitSpecs of the modules decode_h200 --flashinfer calls."""
    import torch
    from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module

    h, i32 = torch.float16, torch.int32
    # (dtype_q, dtype_kv, dtype_o, dtype_idx, d_qk, d_vo, pos_encoding, sliding window, soft cap):
    # the arguments FlashInfer's wrappers pass for these calls, so the names (URIs) match
    common = (h, h, h, i32, 128, 128, 0, False, False)
    out = [gen_batch_decode_module(*common)]
    out += [gen_batch_prefill_module(b, *common, False) for b in backends]   # no fp16 QK reduction
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for <name>/<name>.so")
    ap.add_argument("--backends", default="fa2,fa3", help="the prefill backends (comma-separated)")
    args = ap.parse_args(argv)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", ARCH)
    try:
        import flashinfer
    except ImportError as exc:
        print(f"flashinfer_aot: needs torch and flashinfer-python ({exc})", file=sys.stderr)
        return 2
    if ctypes.util.find_library("cuda") is None:        # no driver here: link against a stub
        stub = tempfile.mkdtemp(prefix="libcuda-stub-")
        c = os.path.join(stub, "empty.c")
        open(c, "w").close()
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                        os.path.join(stub, "libcuda.so"), c], check=True)
        os.environ["LIBRARY_PATH"] = os.pathsep.join(
            [stub, os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64"),
             os.environ.get("LIBRARY_PATH", "")])
    for spec in specs(tuple(args.backends.split(","))):
        t0 = time.time()
        spec.build(verbose=False)
        dst = os.path.join(args.out, spec.name)
        os.makedirs(dst, exist_ok=True)
        shutil.copy(spec.jit_library_path, os.path.join(dst, f"{spec.name}.so"))
        print(f"{spec.name}: {time.time() - t0:.0f} s (flashinfer {flashinfer.__version__}, "
              f"sm_{ARCH.replace('.', '')})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
