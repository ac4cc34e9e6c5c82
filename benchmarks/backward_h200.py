"""The backward pass on one GPU: our numba fp32 kernels beside flashsim's predictions.

    python -m benchmarks.backward_h200 --out DIR     # writes DIR/backward_h200.json
    python -m benchmarks.backward_h200 --smoke       # tiny sizes, any machine (simulator)

Implementations (fp32 throughout, ``gpu_kernels/numba/backward.py``, the registry's
``numba_flash2_bwd`` and ``numba_standard_bwd``):
  numba_flash2_bwd      FlashAttention-2's backward: D = rowsum(dO o O) and dQ = 0, then one
                        thread block per K/V block, dQ by atomic adds
  numba_standard_bwd    the standard backward: dV = P^T dO, dP = dO V^T, dS = softmax
                        backward, dQ = dS K, dK = dS^T Q, with P, dP, dS in HBM
  torch_eager_bwd       PyTorch autograd through matmul, softmax, matmul (fp32), if PyTorch is
                        there: the same pipeline, as a framework runs it
  torch_efficient_bwd   PyTorch SDPA's memory-efficient backend, backward only (fp32)
Both numba pipelines read the saved tensors of one forward run of our own kernels (O, L for
FA2; P for the standard one); only the backward is timed. Shapes: the FlashAttention paper's
Figure 2 (batch 64, 16 heads, N = 1024, d = 64) causal and not, a longer sequence (N = 4096)
and d = 128.

Method: each implementation is checked on the very inputs it is timed on before it is
timed: on the first and last head, its error against a float64 NumPy reference must be at
most twice the error of a plain float32 NumPy implementation of the same formulas, plus
twice the float32 rounding of the reference (flash-attention's rule, ``harness.
backward_check``). Then the harness (gpu_kernels.harness: warm-up, CUDA events around each
call, a 2 x L2 flush before every repeat, the median of the repeats). A point that fails
its check, runs out of memory or raises is absent from "points" and listed in "skipped"
with the reason.

Beside each measurement: flashsim's backward plan for exactly that launch (same tiles,
fp32, the h200 preset): bytes between SRAM and the level below, per tensor, matmul FLOPs,
and the roofline time max(bytes / 4.8 TB/s, FLOPs / 66.9 TFLOP/s). The two-level count
predicts L2 request traffic; the 60 MB L2 absorbs much of FA2's Q/dO/dQ re-reads before
DRAM (docs/model.md).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

import numpy

from benchmarks.common import Progress, Recorder, parser
from flashsim import reference
from gpu_kernels import harness, registry

# (batch, heads, N, d, causal)
SHAPES = [(64, 16, 1024, 64, False), (64, 16, 1024, 64, True), (4, 16, 4096, 64, False),
          (8, 8, 2048, 128, False)]
SMOKE_SHAPES = [(1, 2, 24, 8, False), (1, 2, 24, 8, True)]


def _heads(x, heads):
    """Heads ``heads`` of a device array (batch*heads, ...), copied to the host."""
    return numpy.stack([x[h].copy_to_host() for h in heads])


def _verdicts(check: dict) -> dict:
    """Per gradient: {max_abs_err, bound, ok} (the file's keys)."""
    return {n: {"max_abs_err": v["max_abs_error"], "bound": v["bound"], "ok": v["ok"]}
            for n, v in check["per_gradient"].items()}


class Bench(Recorder):
    def __init__(self, args):
        from gpu_kernels.numba.common import cuda

        self.cuda = cuda
        self.harness = harness.Harness(None if not args.smoke else "numba", flush=not args.smoke,
                                       **({"warmup": 1, "min_repeats": 1, "max_repeats": 2}
                                          if args.smoke else {}))
        super().__init__(args, "backward_h200.json", __doc__.split("Method: ")[1].strip(),
                         timing=self.harness.method(), correctness=[])
        try:
            import torch
            self.torch = torch if torch.cuda.is_available() and not args.smoke else None
        except ImportError:
            self.torch = None

    def time_fn(self, fn):
        """(median ms, all ms) of fn() by the harness."""
        t = self.harness.time(fn, repeats=self.args.reps)
        return t.median_s * 1e3, [x * 1e3 for x in t.times_s]

    def predict(self, launch) -> dict:
        rep = launch.plan("h200").count()
        return {"flashsim_hbm_bytes": rep.hbm_bytes, "flashsim_read_bytes": rep.hbm_read_bytes,
                "flashsim_write_bytes": rep.hbm_write_bytes, "flashsim_flops": rep.flops,
                "flashsim_per_tensor": rep.per_tensor,
                "roofline_time_ms": rep.predicted_time_s * 1e3,
                "plan": {k: v for k, v in rep.to_dict().items()
                         if k in ("algorithm", "pass", "block_rows", "block_cols",
                                  "sram_bytes", "gpu", "softmax_bwd_rows")}}

    def shape(self, B, H, N, d, causal):
        cuda = self.cuda
        BH = B * H
        rng = numpy.random.default_rng(0)
        host = {n: rng.standard_normal((BH, N, d)).astype(numpy.float32) for n in "QKV"}
        host["dO"] = rng.standard_normal((BH, N, d)).astype(numpy.float32)
        dev = {n: cuda.to_device(x) for n, x in host.items()}
        launches = {a: registry.launch(f"numba_{a}_bwd", batch=B, heads=H, seq_len=N, head_dim=d,
                                       causal=causal, **({"threads": 32} if self.args.smoke else {}))
                    for a in ("flash2", "standard")}
        # The saved tensors: one forward run of our own (standard) kernels.
        O, P, L = launches["standard"].forward(dev["Q"], dev["K"], dev["V"])
        cuda.synchronize()
        saved_dev = {"O": O, "P": P, "L": L}
        heads = sorted({0, BH - 1})
        sel = {n: host[n][heads] for n in host}
        saved_host = {n: _heads(x, heads) for n, x in saved_dev.items()}
        ref = reference.attention_backward(sel["Q"], sel["K"], sel["V"], sel["dO"], causal)
        for algorithm, launch in launches.items():
            what = {"impl": f"numba_{algorithm}_bwd", "batch": B, "heads": H, "N": N, "d": d,
                    "causal": causal}
            saved = {"O": saved_host["O"], "L": saved_host["L"]} if algorithm == "flash2" else \
                {"P": saved_host["P"]}
            try:
                def run(launch=launch):
                    return launch.run(dev["Q"], dev["K"], dev["V"], dev["dO"], saved_dev)

                def check(grads):
                    return harness.backward_check([_heads(g, heads) for g in grads], sel["Q"],
                                                  sel["K"], sel["V"], sel["dO"], causal, ref,
                                                  **saved)
                row = self.harness.check_then_time(run, check, repeats=self.args.reps)
                errors = _verdicts(row["check"])
                self.results["correctness"].append({**what, "heads_checked": heads,
                                                    "errors": errors})
                if not row["check"]["ok"]:
                    raise AssertionError(f"error above bound: {errors}")
                ms, times = row["time_s"] * 1e3, [x * 1e3 for x in row["times_s"]]
            except Exception as exc:
                self.skip(what, f"{type(exc).__name__}: {str(exc)[:400]}")
                traceback.print_exc()
                continue
            pred = self.predict(launch)
            point = {**what, "block_rows": launch.block_rows, "block_cols": launch.block_cols,
                     "threads": launch.threads, "time_ms": ms, "times_ms": times,
                     "max_abs_err": {n: e["max_abs_err"] for n, e in errors.items()},
                     "tflops_model_flops": pred["flashsim_flops"] / ms / 1e9,
                     "bytes_per_s_model_bytes": pred["flashsim_hbm_bytes"] / ms * 1e3,
                     **pred}
            self.results["points"].append(point)
            print(f"  {what['impl']:<20} B={B} H={H} N={N} d={d} causal={causal:d}: "
                  f"{ms:8.3f} ms  model {pred['flashsim_hbm_bytes'] / 1e9:7.2f} GB, roofline "
                  f"{pred['roofline_time_ms']:7.3f} ms", flush=True)
            self.save()
        if self.torch is not None:
            self.torch_points(B, H, N, d, causal, host, heads, dict(zip(("dQ", "dK", "dV"), ref)))
        del dev, saved_dev, O, P, L
        for launch in launches.values():
            launch.workspace.clear()

    def torch_points(self, B, H, N, d, causal, host, heads, ref):
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        torch.backends.cuda.matmul.allow_tf32 = False       # fp32 means fp32
        tau = 1 / math.sqrt(d)
        # (batch, heads, N, d): SDPA's fused kernels take 4-D tensors only
        q, k, v, do = (torch.from_numpy(host[n]).cuda().view(B, H, N, d)
                       for n in ("Q", "K", "V", "dO"))
        mask = torch.ones(N, N, dtype=torch.bool, device="cuda").triu_(1) if causal else None

        def eager(q, k, v):
            S = (q @ k.transpose(-2, -1)) * tau
            if mask is not None:
                S = S.masked_fill(mask, float("-inf"))
            return torch.softmax(S, dim=-1) @ v

        def efficient(q, k, v):
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        for name, fwd in (("torch_eager_bwd", eager), ("torch_efficient_bwd", efficient)):
            what = {"impl": name, "batch": B, "heads": H, "N": N, "d": d, "causal": causal}
            try:
                qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                out = fwd(qq, kk, vv)

                def run():
                    return torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
                got = {n: g.reshape(B * H, N, d)[heads].cpu().numpy()
                       for n, g in zip(("dQ", "dK", "dV"), run())}
                errors = {n: float(numpy.abs(got[n] - ref[n]).max()) for n in got}
                # A peer's sanity check: within 1e-4 of the largest gradient entry.
                ok = all(errors[n] <= 1e-4 * float(numpy.abs(ref[n]).max()) for n in got)
                self.results["correctness"].append({**what, "heads_checked": heads,
                                                    "max_abs_err": errors, "ok": ok})
                if not ok:
                    raise AssertionError(f"error above 1e-4 of the largest entry: {errors}")
                torch.cuda.synchronize()
                ms, times = self.time_fn(run)
                del out
            except Exception as exc:
                self.skip(what, f"{type(exc).__name__}: {str(exc)[:400]}")
                continue
            self.results["points"].append({**what, "time_ms": ms, "times_ms": times,
                                           "max_abs_err": errors})
            print(f"  {name:<20} B={B} H={H} N={N} d={d} causal={causal:d}: {ms:8.3f} ms",
                  flush=True)
            self.save()
        torch.cuda.empty_cache()

    def run(self):
        self.results["provenance"] = harness.provenance()
        print("provenance:", json.dumps(self.results["provenance"]), flush=True)
        for B, H, N, d, causal in Progress(SMOKE_SHAPES if self.args.smoke else SHAPES,
                                           quiet=self.args.quiet, desc="backward_h200"):
            if not self.due({"batch": B, "heads": H, "N": N, "d": d, "causal": causal}):
                continue
            print(f"shape B={B} H={H} N={N} d={d} causal={causal}", flush=True)
            try:
                self.shape(B, H, N, d, causal)
            except Exception as exc:
                self.skip({"batch": B, "heads": H, "N": N, "d": d, "causal": causal},
                          f"{type(exc).__name__}: {str(exc)[:400]}")
                traceback.print_exc()
        print(f"wrote {self.save()} ({len(self.results['points'])} points, "
              f"{len(self.results['skipped'])} skipped) in {self.deadline.elapsed():.0f} s")
        return 0 if not self.results["skipped"] else 1


def main(argv=None) -> int:
    ap = parser(__doc__, deadline_s=100.0, smoke=True)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        args.reps = min(args.reps, 2)
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
