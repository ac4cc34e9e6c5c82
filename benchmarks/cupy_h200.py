"""Forward attention on one GPU, side by side: our CuPy kernels against PyTorch.

    python -m benchmarks.cupy_h200 --out DIR          # writes DIR/cupy_h200.json

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
error against float64 under 1e-5); then the harness (gpu_kernels.harness: warm-up, CUDA
events around each call, a 2 x L2 flush before every repeat, the median of the repeats). A
point that fails its check, runs out of memory, raises, or is not reached before
--deadline-s is absent from "points" and listed in "skipped" with the reason. The
tensor-core tile sweep runs first and the fastest correct configuration per d (geometric
mean over its sweep points) is used for the main table.
"""

from __future__ import annotations

import json
import math
import sys

from benchmarks.common import Progress, Recorder, parser
from gpu_kernels import harness, registry
from gpu_kernels.cupy import flash2_tc
from gpu_kernels.cupy.common import get_kernel, kernel_resources

TOTAL_TOKENS = 16384
HIDDEN = 2048
PAPER_N = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)


def flops(B, H, N, d, causal):
    f = 4 * B * H * N * N * d
    return f // 2 if causal else f


class Bench(Recorder):
    def __init__(self, args):
        import torch

        self.torch = torch
        self.harness = harness.Harness("cupy")
        super().__init__(args, "cupy_h200.json", __doc__.split("Method: ")[1].strip(),
                         timing=self.harness.method(), correctness=[], tuning=[], tc_configs={},
                         kernel_resources={})

    # -------------------------------------------------------------- plumbing
    def time_fn(self, fn, *, repeats=None):
        """(median ms, all ms) of fn() by the harness."""
        t = self.harness.time(fn, repeats=repeats)
        return t.median_s * 1e3, [x * 1e3 for x in t.times_s]

    def failed(self, what: dict, exc: Exception) -> None:
        """A point that raised (out of memory, a backend that refuses): skipped, memory freed."""
        self.skip(what, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        self.torch.cuda.empty_cache()

    def point(self, what: dict, ms: float, times: list, **check) -> None:
        """Record a timed point with its TFLOP/s (useful FLOPs: halved under the mask)."""
        tf = flops(what["B"], what["H"], what["N"], what["d"], what["causal"]) / ms / 1e9
        self.results["points"].append({**what, "time_ms": ms, "tflops": tf, "reps": len(times),
                                       "min_ms": min(times), "max_ms": max(times), **check})
        print(f"{what['impl']:>18} d={what['d']} causal={what['causal']:d} N={what['N']:>5}: "
              f"{ms:9.3f} ms {tf:7.2f} TFLOP/s", flush=True)

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
        verdict = harness.max_error_rule((O.float() - ref).abs().max().item(), bound)
        return verdict["ok"], verdict["max_abs_error"]

    # -------------------------------------------------------------- implementations
    def tc(self, config):
        """Our tensor-core kernel with this configuration: run(q, k, v, causal) -> O."""
        return self.ours("cupy_flash2_tc", block_rows=config["BLOCK_R"],
                         block_cols=config["BLOCK_C"], version=config["VERSION"],
                         min_blocks=config["MIN_BLOCKS"])

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

        for d in Progress(HEAD_DIMS, quiet=self.args.quiet, desc="cupy_h200 tc sweep"):
            configs = {}
            for config in flash2_tc.tuning_configs(d):
                key = " ".join(f"{k}={v}" for k, v in config.items())
                D = flash2_tc.defines(d, "float16", **config)
                smem = flash2_tc.smem_bytes(d, D["BLOCK_R"], D["BLOCK_C"], D["VERSION"])
                try:
                    res = kernel_resources(get_kernel(flash2_tc.CU_FILE, "flash2_tc_fwd", D, smem))
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
                            ms, _ = self.time_fn(lambda: fn(q, k, v, causal), repeats=5)
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
        impls_fast = [("torch_flash", self.sdpa("FLASH_ATTENTION")),
                      ("torch_efficient", self.sdpa("EFFICIENT_ATTENTION")),
                      ("torch_cudnn", self.sdpa("CUDNN_ATTENTION"))]
        bar = Progress(total=len(HEAD_DIMS) * 2 * len(PAPER_N), quiet=self.args.quiet,
                       desc="cupy_h200 fp16 table")
        for d in HEAD_DIMS:
            tc_fn = self.tc(self.results["tc_configs"][str(d)]["config"])
            for causal in (False, True):
                for N in PAPER_N:
                    bar.update()
                    self.paper_point(d, N, causal, lambda q, k, v: (
                        [("cupy_flash2_tc", tc_fn)] + impls_fast
                        + ([] if self.args.no_eager else [("torch_eager", self.eager(q, k, v, causal))])))
        bar.close()

    def paper_point(self, d, N, causal, impls) -> None:
        """One configuration of the FA2 paper's (16k tokens, hidden 2048), fp16: every
        ``(name, fn)`` of ``impls(q, k, v)`` checked against the float64 reference (ours must
        pass to be timed; peers are timed anyway), then timed, one point each."""
        torch = self.torch
        B, H = TOTAL_TOKENS // N, HIDDEN // d
        base = {"d": d, "N": N, "B": B, "H": H, "causal": causal, "dtype": "float16"}
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
        ref, bound = self.reference(q, k, v, causal)
        for name, fn in impls(q, k, v):
            what = {"impl": name, **base}
            if not self.due(what):
                continue
            try:
                ok, err = self.check_fp16(fn(q, k, v, causal), ref, bound)
                if not ok and name.startswith("cupy"):  # peers are timed anyway
                    self.skip(what, f"check failed: error {err:.3e} > 2 x SDPA error {bound:.3e}")
                    continue
                ms, times = self.time_fn(lambda: fn(q, k, v, causal))
            except Exception as exc:  # OOM, unsupported backend, ...
                self.failed(what, exc)
                continue
            self.point(what, ms, times, max_abs_err=err, err_bound=bound, check_ok=ok)
        del q, k, v, ref
        torch.cuda.empty_cache()
        self.save()

    def fp32_table(self):
        ours = [(f"cupy_{a}_fp32", self.ours(f"cupy_{a}")) for a in ("standard", "flash1", "flash2")]
        numba = [(f"numba_{a}_fp32", self.ours(f"numba_{a}")) for a in ("standard", "flash1", "flash2")]
        for impls in (ours, numba):  # CuPy first: the deadline cuts the numba kernels first
            self._fp32_group(impls)

    def ours(self, name, **options):
        """One of our kernels (by registry name): run(q, k, v, causal) -> O (torch); torch
        tensors go in without copies (DLPack / CUDA Array Interface). The launch is made once
        per shape, outside the timed calls."""
        torch, launches = self.torch, {}

        def run(q, k, v, causal):
            key = (tuple(q.shape), str(q.dtype), causal)
            if key not in launches:
                B, H, N, d = q.shape
                launches[key] = registry.launch(name, batch=B, heads=H, seq_len=N, head_dim=d,
                                                dtype=str(q.dtype).removeprefix("torch."),
                                                causal=causal, **options)
            return torch.as_tensor(launches[key].run(q, k, v).O, device="cuda").view(q.shape)
        return run

    def _fp32_group(self, impls):
        torch = self.torch
        import cupy

        bar = Progress(total=len(HEAD_DIMS) * 2 * len(self.args.fp32_n), quiet=self.args.quiet,
                       desc=f"cupy_h200 fp32 {impls[0][0].split('_')[0]}")
        for d in HEAD_DIMS:
            for causal in (False, True):
                for N in self.args.fp32_n:
                    bar.update()
                    B, H = TOTAL_TOKENS // N, HIDDEN // d
                    base = {"d": d, "N": N, "B": B, "H": H, "causal": causal, "dtype": "float32"}
                    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float32) for _ in range(3))
                    ref = self.ref_fp64(q, k, v, causal)
                    for name, fn in impls:
                        what = {"impl": name, **base}
                        if not self.due(what):
                            continue
                        try:
                            O = fn(q, k, v, causal)
                            err = ((O.double() - ref).norm() / ref.norm()).item()
                            if not harness.max_error_rule(err, 1e-5)["ok"]:   # relative error
                                self.skip(what, f"check failed: relative error {err:.3e} > 1e-5")
                                continue
                            del O
                            ms, times = self.time_fn(lambda: fn(q, k, v, causal), repeats=5)
                        except Exception as exc:
                            self.failed(what, exc)
                            continue
                        self.point(what, ms, times, rel_err=err)
                    del q, k, v, ref
                    cupy.get_default_memory_pool().free_all_blocks()  # S, P of the standard kernels
                    torch.cuda.empty_cache()
                    self.save()
        bar.close()

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


def main(argv=None) -> int:
    ap = parser(__doc__, deadline_s=330.0)
    ap.add_argument("--fp32-n", type=lambda s: [int(x) for x in s.split(",")], default=[512, 1024, 2048])
    ap.add_argument("--sweep-n", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384])
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-fp32", action="store_true")
    args = ap.parse_args(argv)

    import torch

    bench = Bench(args)
    bench.results["provenance"] = harness.provenance(
        extra={"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()})
    bench.results["configs"] = {"total_tokens": TOTAL_TOKENS, "hidden": HIDDEN, "N": list(PAPER_N),
                                "head_dims": list(HEAD_DIMS), "fp32_N": args.fp32_n, "sweep_N": args.sweep_n}
    print(json.dumps(bench.results["provenance"], indent=1), flush=True)
    ok = bench.guarded(bench.sweep, bench.main_table, *([] if args.no_fp32 else [bench.fp32_table]))
    bench.ratios()
    bench.finish()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
