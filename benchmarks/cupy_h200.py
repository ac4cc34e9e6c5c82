"""Forward attention on one GPU, side by side: our CuPy kernels against PyTorch.

    PYTHONPATH=. python3 benchmarks/cupy_h200.py --out benchmarks/results/cupy_h200.json

Configurations: the FlashAttention-2 paper's (16k tokens in total, batch = 16384 / N; hidden
size 2048, heads = 2048 / d; d = 64 and 128; N = 512 ... 16384; causal and not).
Implementations:
  cupy_flash2_tc      our tensor-core FlashAttention-2 (fp16), tiles chosen by the sweep below
  torch_flash         PyTorch SDPA, flash backend (fp16)
  torch_efficient     PyTorch SDPA, memory-efficient backend (fp16)
  torch_cudnn         PyTorch SDPA, cuDNN backend (fp16)
  torch_eager         matmul, scale, (mask,) softmax, matmul in PyTorch (fp16)
  cupy_{standard,flash1,flash2}_fp32   our fp32 CUDA-core kernels (fewer N: --fp32-n)
  numba_{standard,flash1,flash2}       the numba fp32 kernels, if importable (same N)
TFLOP/s = 4 B H N^2 d / time, halved for causal (the useful work, for every implementation).

Method: every implementation is checked on the very inputs it is timed on before it is
timed (fp16: error against an fp32 reference at most twice PyTorch SDPA's; fp32: relative
error against float64 under 1e-5); then warm-up, CUDA events around each call, the 512 MiB
L2 flush buffer written before every repeat, median of the repeats. A point that fails its
check, runs out of memory, raises, or is not reached before --deadline-s is absent from
"points" and listed in "skipped" with the reason. The tensor-core tile sweep runs first and
the fastest correct configuration per d (geometric mean over its sweep points) is used for
the main table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._provenance import provenance  # noqa: E402

TOTAL_TOKENS = 16384
HIDDEN = 2048
PAPER_N = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FLUSH_BYTES = 512 * 2**20


def flops(B, H, N, d, causal):
    f = 4 * B * H * N * N * d
    return f // 2 if causal else f


class Bench:
    def __init__(self, args):
        import torch

        self.torch = torch
        self.args = args
        self.t0 = time.time()
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.results = {"provenance": None, "method": __doc__.split("Method: ")[1].strip(),
                        "correctness": [], "tuning": [], "points": [], "skipped": [],
                        "tc_configs": {}, "kernel_resources": {}}

    # -------------------------------------------------------------- plumbing
    def left(self) -> float:
        return self.args.deadline_s - (time.time() - self.t0)

    def skip(self, what: dict, reason: str):
        self.results["skipped"].append({**what, "reason": reason})
        print(f"  skip {what}: {reason}", flush=True)

    def save(self):
        with open(self.args.out, "w") as f:
            json.dump(self.results, f, indent=1)

    def time_fn(self, fn, *, target_s=0.4, min_reps=3, max_reps=30):
        """Median ms of fn() over repeats, each after an L2 flush, timed with CUDA events."""
        torch = self.torch
        fn()  # warm-up (compiles, caches)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush_buf.zero_()
        s.record()
        fn()
        e.record()
        e.synchronize()
        first = s.elapsed_time(e)
        reps = int(min(max_reps, max(min_reps, target_s * 1e3 / max(first, 1e-3))))
        times = []
        for _ in range(reps):
            self.flush_buf.zero_()  # > 60 MB L2: every repeat starts cold
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times), times

    # -------------------------------------------------------------- references
    def ref_fp32(self, q, k, v, causal):
        import torch.nn.functional as F

        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)

    def reference(self, q, k, v, causal):
        """(fp32 reference output, 2 x max error of PyTorch SDPA in q's dtype against it)."""
        import torch.nn.functional as F

        ref = self.ref_fp32(q, k, v, causal)
        pt = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return ref, 2 * (pt.float() - ref).abs().max().item()

    @staticmethod
    def check_fp16(O, ref, bound):
        """(ok, our max error): flash-attention's rule, error <= 2 x SDPA's error."""
        err = (O.float() - ref).abs().max().item()
        return (math.isfinite(err) and err <= bound), err

    # -------------------------------------------------------------- implementations
    def tc(self, config):
        from gpu_kernels.cupy_flash2_tc import flash2_tc_attention

        def run(q, k, v, causal):
            return flash2_tc_attention(q, k, v, causal, version=config["VERSION"], block_m=config["BLOCK_M"],
                                       block_n=config["BLOCK_N"], min_blocks=config["MIN_BLOCKS"])[0]
        return run

    def sdpa(self, backend):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b = getattr(SDPBackend, backend)

        def run(q, k, v, causal):
            with sdpa_kernel(b):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    def eager(self, q, k, v, causal):
        torch = self.torch
        N, d = q.shape[-2], q.shape[-1]
        mask = torch.ones(N, N, dtype=torch.bool, device="cuda").triu_(1) if causal else None

        def run(q, k, v, causal):
            S = q @ k.transpose(-2, -1)
            S = S * (1.0 / math.sqrt(d))
            if mask is not None:
                S = S.masked_fill(mask, float("-inf"))
            P = torch.softmax(S, dim=-1)
            return P @ v
        return run

    # -------------------------------------------------------------- phases
    def sweep(self):
        """Time every tensor-core configuration that passes its check; pick one per d."""
        torch = self.torch
        from gpu_kernels import cupy_flash2_tc
        from gpu_kernels.cupy_common import get_kernel, kernel_resources

        for d in HEAD_DIMS:
            configs = {}
            for config in cupy_flash2_tc.tuning_configs(d):
                key = " ".join(f"{k}={v}" for k, v in config.items())
                D = cupy_flash2_tc.defines(d, "float16", **config)
                smem = cupy_flash2_tc.smem_bytes(d, D["BLOCK_M"], D["BLOCK_N"], D["VERSION"])
                try:
                    res = kernel_resources(get_kernel(cupy_flash2_tc.CU_FILE, "flash2_tc_fwd", D, smem))
                except Exception as exc:
                    self.skip({"impl": "cupy_flash2_tc", "d": d, "config": key}, f"{type(exc).__name__}: {exc}")
                    continue
                self.results["kernel_resources"][f"d={d} {key}"] = {**res, "dynamic_smem": smem}
                configs[key] = (config, [])
            for N in self.args.sweep_n:
                B, H = TOTAL_TOKENS // N, HIDDEN // d
                q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
                for causal in (False, True):
                    ref, bound = self.reference(q, k, v, causal)
                    for key, (config, times) in list(configs.items()):
                        fn = self.tc(config)
                        try:
                            ok, err = self.check_fp16(fn(q, k, v, causal), ref, bound)
                            self.results["correctness"].append(
                                {"impl": "cupy_flash2_tc", "config": key, "d": d, "N": N, "causal": causal,
                                 "dtype": "float16", "max_abs_err": err, "bound": bound, "ok": ok})
                            if not ok:
                                raise AssertionError(f"error {err} > bound {bound} (N={N}, causal={causal})")
                            ms, _ = self.time_fn(lambda: fn(q, k, v, causal), target_s=0.1, max_reps=10)
                        except Exception as exc:  # a failing variant is dropped, with the reason
                            self.skip({"impl": "cupy_flash2_tc", "d": d, "config": key},
                                      f"{type(exc).__name__}: {str(exc)[:300]}")
                            del configs[key]
                            continue
                        tf = flops(B, H, N, d, causal) / ms / 1e9
                        self.results["tuning"].append({"d": d, "N": N, "causal": causal, "config": key,
                                                       "time_ms": ms, "tflops": tf})
                        times.append(ms)
                        print(f"  sweep d={d} N={N} causal={causal:d} {key}: {ms:.3f} ms {tf:.1f} TFLOP/s "
                              f"(err {err:.2e} <= {bound:.2e})", flush=True)
                del q, k, v, ref
            if not configs:
                raise RuntimeError(f"no tensor-core configuration passed for d={d}")
            geo = {key: math.exp(sum(map(math.log, t)) / len(t)) for key, (_, t) in configs.items()}
            best = min(geo, key=geo.get)
            self.results["tc_configs"][str(d)] = {"config": configs[best][0], "label": best,
                                                  "geomean_ms": geo[best]}
            print(f"d={d}: best {best}", flush=True)
        self.save()

    def main_table(self):
        torch = self.torch
        impls_fast = [("torch_flash", self.sdpa("FLASH_ATTENTION")),
                      ("torch_efficient", self.sdpa("EFFICIENT_ATTENTION")),
                      ("torch_cudnn", self.sdpa("CUDNN_ATTENTION"))]
        for d in HEAD_DIMS:
            tc_fn = self.tc(self.results["tc_configs"][str(d)]["config"])
            for causal in (False, True):
                for N in PAPER_N:
                    B, H = TOTAL_TOKENS // N, HIDDEN // d
                    base = {"d": d, "N": N, "B": B, "H": H, "causal": causal, "dtype": "float16"}
                    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
                    ref, bound = self.reference(q, k, v, causal)
                    impls = [("cupy_flash2_tc", tc_fn)] + impls_fast
                    if not self.args.no_eager:
                        impls.append(("torch_eager", self.eager(q, k, v, causal)))
                    for name, fn in impls:
                        what = {"impl": name, **base}
                        if self.left() < 0:
                            self.skip(what, "deadline")
                            continue
                        try:
                            ok, err = self.check_fp16(fn(q, k, v, causal), ref, bound)
                            if not ok and name.startswith("cupy"):  # peers are timed anyway
                                self.skip(what, f"check failed: error {err:.3e} > 2 x SDPA error {bound:.3e}")
                                continue
                            ms, times = self.time_fn(lambda: fn(q, k, v, causal))
                        except Exception as exc:  # OOM, unsupported backend, ...
                            self.skip(what, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                            torch.cuda.empty_cache()
                            continue
                        tf = flops(B, H, N, d, causal) / ms / 1e9
                        self.results["points"].append({**what, "time_ms": ms, "tflops": tf, "reps": len(times),
                                                       "min_ms": min(times), "max_ms": max(times),
                                                       "max_abs_err": err, "err_bound": bound, "check_ok": ok})
                        print(f"{name:>16} d={d} causal={causal:d} N={N:>5}: {ms:9.3f} ms {tf:7.1f} TFLOP/s",
                              flush=True)
                    del q, k, v, ref
                    torch.cuda.empty_cache()
                    self.save()

    def fp32_table(self):
        torch = self.torch
        import importlib

        import cupy

        from gpu_kernels.cupy_flash1 import flash1_attention
        from gpu_kernels.cupy_flash2 import flash2_attention
        from gpu_kernels.cupy_standard import standard_attention

        ours = [("cupy_standard_fp32", lambda q, k, v, c: standard_attention(q, k, v, c)),
                ("cupy_flash1_fp32", lambda q, k, v, c: flash1_attention(q, k, v, c)),
                ("cupy_flash2_fp32", lambda q, k, v, c: flash2_attention(q, k, v, c)[0])]
        numba = []
        for name in ("standard", "flash1", "flash2"):
            try:
                mod = importlib.import_module(f"gpu_kernels.numba_{name}")
                numba.append((f"numba_{name}_fp32",  # numba takes CUDA arrays: CuPy views, no copy
                              lambda q, k, v, c, mod=mod: torch.as_tensor(
                                  mod.attention(*(cupy.from_dlpack(x) for x in (q, k, v)), causal=c),
                                  device="cuda")))
            except Exception as exc:
                self.skip({"impl": f"numba_{name}_fp32"}, f"import: {type(exc).__name__}: {exc}")
        for impls in (ours, numba):  # ours first: the deadline cuts the colleague's kernels first
            self._fp32_group(impls)

    def _fp32_group(self, impls):
        torch = self.torch
        import cupy

        for d in HEAD_DIMS:
            for causal in (False, True):
                for N in self.args.fp32_n:
                    B, H = TOTAL_TOKENS // N, HIDDEN // d
                    base = {"d": d, "N": N, "B": B, "H": H, "causal": causal, "dtype": "float32"}
                    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float32) for _ in range(3))
                    ref = self.ref_fp64(q, k, v, causal)
                    for name, fn in impls:
                        what = {"impl": name, **base}
                        if self.left() < 0:
                            self.skip(what, "deadline")
                            continue
                        try:
                            O = fn(q, k, v, causal)
                            err = ((O.double() - ref).norm() / ref.norm()).item()
                            if not err <= 1e-5:
                                self.skip(what, f"check failed: relative error {err:.3e} > 1e-5")
                                continue
                            del O
                            ms, times = self.time_fn(lambda: fn(q, k, v, causal), target_s=0.3, max_reps=5)
                        except Exception as exc:
                            self.skip(what, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                            torch.cuda.empty_cache()
                            continue
                        tf = flops(B, H, N, d, causal) / ms / 1e9
                        self.results["points"].append({**what, "time_ms": ms, "tflops": tf, "reps": len(times),
                                                       "min_ms": min(times), "max_ms": max(times), "rel_err": err})
                        print(f"{name:>18} d={d} causal={causal:d} N={N:>5}: {ms:9.3f} ms {tf:7.2f} TFLOP/s",
                              flush=True)
                    del q, k, v, ref
                    cupy.get_default_memory_pool().free_all_blocks()  # S, P of the standard kernels
                    torch.cuda.empty_cache()
                    self.save()

    def ref_fp64(self, q, k, v, causal):
        """float64 softmax(Q K^T / sqrt(d)) V on the GPU, a few heads at a time."""
        torch = self.torch
        out = torch.empty(q.shape, dtype=torch.float64, device="cuda")
        N, d = q.shape[-2], q.shape[-1]
        qf, kf, vf = (x.reshape(-1, N, d) for x in (q, k, v))
        of = out.view(-1, N, d)
        step = max(1, 2**30 // (N * N * 8))
        mask = torch.ones(N, N, dtype=torch.bool, device="cuda").triu_(1) if causal else None
        for h in range(0, qf.shape[0], step):
            S = qf[h:h + step].double() @ kf[h:h + step].double().transpose(-2, -1) / math.sqrt(d)
            if mask is not None:
                S.masked_fill_(mask, float("-inf"))
            of[h:h + step] = torch.softmax(S, dim=-1) @ vf[h:h + step].double()
        return out

    def ratios(self):
        pts = {(p["impl"], p["d"], p["N"], p["causal"]): p for p in self.results["points"]}
        table = []
        for (impl, d, N, causal), p in sorted(pts.items()):
            if impl != "cupy_flash2_tc" or ("torch_flash", d, N, causal) not in pts:
                continue
            fl = pts[("torch_flash", d, N, causal)]
            table.append({"d": d, "N": N, "causal": causal, "ours_tflops": p["tflops"],
                          "torch_flash_tflops": fl["tflops"], "ratio": p["tflops"] / fl["tflops"]})
        self.results["ratio_vs_torch_flash"] = table
        print("\nratio of cupy_flash2_tc to torch_flash (TFLOP/s):")
        for r in table:
            print(f"  d={r['d']:>3} causal={r['causal']:d} N={r['N']:>5}: {r['ours_tflops']:6.1f} / "
                  f"{r['torch_flash_tflops']:6.1f} = {r['ratio']:.2f}")


def gpu_info(torch, cupy) -> dict:
    p = torch.cuda.get_device_properties(0)
    info = {"gpu": p.name, "sm_count": p.multi_processor_count,
            "compute_capability": f"{p.major}.{p.minor}", "gpu_memory_bytes": p.total_memory,
            "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cuda_runtime_cupy": cupy.cuda.runtime.runtimeGetVersion(),
            "cuda_driver_api": cupy.cuda.runtime.driverGetVersion(),
            "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion()))}
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        info["driver"] = f"unknown ({exc})"
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/cupy_h200.json")
    ap.add_argument("--fp32-n", type=lambda s: [int(x) for x in s.split(",")], default=[512, 1024, 2048])
    ap.add_argument("--sweep-n", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384])
    ap.add_argument("--deadline-s", type=float, default=330.0,
                    help="after this many seconds, remaining points are skipped (recorded)")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-fp32", action="store_true")
    args = ap.parse_args(argv)

    import cupy
    import torch

    bench = Bench(args)
    bench.results["provenance"] = provenance(
        packages=("numpy", "cupy-cuda13x", "torch", "cuda-core", "numba", "numba-cuda", "nvidia-cuda-nvrtc"),
        extra=gpu_info(torch, cupy))
    bench.results["configs"] = {"total_tokens": TOTAL_TOKENS, "hidden": HIDDEN, "N": list(PAPER_N),
                                "head_dims": list(HEAD_DIMS), "fp32_N": args.fp32_n, "sweep_N": args.sweep_n}
    print(json.dumps(bench.results["provenance"], indent=1), flush=True)
    try:
        bench.sweep()
        bench.main_table()
        if not args.no_fp32:
            bench.fp32_table()
    except Exception:
        traceback.print_exc()
        bench.results["error"] = traceback.format_exc()
    bench.ratios()
    bench.results["elapsed_s"] = time.time() - bench.t0
    bench.save()
    print(f"wrote {args.out} in {bench.results['elapsed_s']:.0f} s")
    return 1 if "error" in bench.results else 0


if __name__ == "__main__":
    sys.exit(main())
