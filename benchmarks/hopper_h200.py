"""The Hopper kernel (cupy_flash3, every version) against PyTorch's attention backends.

    python -m benchmarks.hopper_h200 --out DIR            # check every version, then time
    python -m benchmarks.hopper_h200 --quick --out DIR    # d = 64, 128 and N = 2048, 4096, 16384
    python -m benchmarks.hopper_h200 --probe --out DIR    # SASS opcode histogram per version
    compute-sanitizer --tool memcheck python -m benchmarks.hopper_h200 --sanitize --out DIR

Writes DIR/hopper_h200.json (``--probe``: hopper_h200_probe.json; ``--sanitize``:
hopper_h200_sanitize.json). Configurations: the FlashAttention-2 paper's (16k tokens in
total, batch = 16384 / N; hidden 2048, heads = 2048 / d; d = 64, 128, 256; N = 512 ... 16384;
causal and not; fp16). Implementations, all in the same run:
  cupy_flash3_v1 .. v4   our Hopper kernel, one name per version (gpu_kernels/cuda/flash3.cu)
  cupy_flash2_tc         our mma.sync kernel at its tuned default (d = 64, 128)
  torch_flash, torch_cudnn, torch_efficient   PyTorch SDPA backends
  torch_flex             torch.compile(flex_attention) (causal: a block mask); skipped with
                         the reason when it fails; d = 64, 128 at N = 16384 (each shape compiles)
TFLOP/s = 4 B H N^2 d / time, halved for causal (the useful work, for every implementation).

Method: first every version is checked against the float64 reference (flashsim.reference) on
ragged sizes N = 97, 1025, 4097 at every d, fp16 and bf16, causal and not, with
flash-attention's rule (gpu_kernels.harness.Reference: error at most twice that of a plain
implementation in the same dtype), and L against the float64 logsumexp; a version that fails
any check is not timed (its checks say why). Then each timed point is checked again on the
very inputs it is timed on (error against an fp32 SDPA reference at most twice PyTorch SDPA's
fp16 error), then timed by the harness (gpu_kernels.harness: warm-up, CUDA events, a 2 x L2
flush before every repeat, the median). A point that fails, raises or is past --deadline-s is
absent from "points" and listed in "skipped" with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

from benchmarks.common import write_json
from benchmarks.cupy_h200 import HIDDEN, PAPER_N, TOTAL_TOKENS, Bench, flops
from flashsim.hardware import schedules
from gpu_kernels import harness
from gpu_kernels.cupy import flash3

CHECK_N = (97, 1025, 4097)
QUICK_N = (2048, 4096, 16384)
FLEX_N = (16384,)            # flex_attention compiles once per shape: one size


def impl_name(version: int) -> str:
    return f"cupy_flash3_v{version}"


def sass_histogram(sass: str) -> dict[str, int]:
    """{opcode: count} of ``cuobjdump --dump-sass`` text (predicates and modifiers dropped)."""
    counts: dict[str, int] = {}
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", sass):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def diagnose(O, ref, L, L_ref) -> dict:
    """Where a failing output is wrong: NaNs, the largest error by 16-row group of the 128-row
    query block (warp / warpgroup), by 8-column chunk of d (swizzle, descriptor panels), by
    128-row query block, and the rows whose L is off."""
    err = np.abs(np.nan_to_num(O.astype(np.float64), nan=1e30) - ref)          # (B, H, N, d)
    N, d = err.shape[-2:]
    rows = err.max(axis=(0, 1, 3))                                              # (N,)
    cols = err.max(axis=(0, 1, 2))                                              # (d,)
    pad = np.full(-N % 128, 0.0)
    by_block_row = np.concatenate([rows, pad]).reshape(-1, 128)
    lerr = np.abs(np.nan_to_num(L, nan=1e30) - L_ref).max(axis=(0, 1))
    return {"nan": int(np.isnan(O).sum()), "by_row16_in_block": by_block_row.max(0).reshape(8, 16).max(1).tolist(),
            "by_col8": cols.reshape(-1, 8).max(1).tolist(), "by_query_block": by_block_row.max(1).tolist(),
            "lse_bad_rows": np.nonzero(lerr > 1e-3)[0][:20].tolist(), "first_bad_row": int(np.argmax(rows > 1e-2))}


def cuobjdump() -> str | None:
    return shutil.which("cuobjdump") or next(
        (p for p in ("/usr/local/cuda/bin/cuobjdump",) if os.path.exists(p)), None)


class HopperBench(Bench):
    """cupy_h200's Bench (SDPA peers, fp16 rule, timing, points) with this file's phases."""

    def __init__(self, args, name="hopper_h200.json"):
        import torch

        from benchmarks.common import Recorder

        self.torch = torch
        self.harness = harness.Harness("cupy")
        Recorder.__init__(self, args, name, __doc__.split("Method: ")[1].strip(),
                          timing=self.harness.method(), correctness=[], kernel_resources={})
        self.versions = list(getattr(args, "versions", None) or flash3.VERSIONS)
        self.passed = list(self.versions)
        self.crashed: dict[int, str] = {}      # version -> why its child process failed

    def smoke_children(self, timeout_s: float = 90.0) -> None:
        """Run each version's tiny checks (``--smoke --versions V``) in its own process, all at
        once, each under a time limit: a version that hangs (an mbarrier or named barrier never
        completing) or crashes (an illegal address leaves the CUDA context unusable) is dropped
        here, and cannot stop the rest of the run. Versions with TMA run twice: tensor maps
        as kernel parameters and from global memory (FLASHSIM_FLASH3_TMAP=global); where only
        the second works, the rest of the run uses it."""
        procs = {}
        for v in self.versions:
            for mode in ("parameter", "global") if v >= 2 else ("parameter",):
                folder = tempfile.mkdtemp(prefix=f"flash3-smoke-v{v}-")
                cmd = [sys.executable, "-m", "benchmarks.hopper_h200", "--smoke", "--versions", str(v),
                       "--out", folder]
                env = dict(os.environ, FLASHSIM_FLASH3_TMAP=mode)
                procs[(v, mode)] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                    text=True, env=env)
        verdict = {}
        for (v, mode), p in procs.items():
            try:
                out, _ = p.communicate(timeout=timeout_s)
                why = None if p.returncode in (0, 1) else f"crashed (exit {p.returncode}): {out[-600:]}"
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                why = f"hung: no answer within {timeout_s:.0f} s"
            verdict[(v, mode)] = (p.returncode, why)
            tail = "\n    ".join(out.strip().splitlines()[-4:])
            print(f"  smoke v{v} ({mode}): exit {p.returncode} {why or ''}\n    {tail}", flush=True)
        self.results["smoke"] = {f"v{v} {m}": {"exit": rc, "problem": why} for (v, m), (rc, why) in verdict.items()}
        tma = [v for v in self.versions if v >= 2]
        if tma and all(verdict[(v, "parameter")][1] for v in tma) and any(
                not verdict[(v, "global")][1] for v in tma):
            flash3.TMAP_BY_VALUE = False
        mode = "parameter" if flash3.TMAP_BY_VALUE else "global"
        self.results["tensor_maps"] = mode
        for v in self.versions:
            why = verdict[(v, mode if v >= 2 else "parameter")][1]
            if why:
                self.crashed[v] = why
                self.results["correctness"].append({"impl": impl_name(v), "ok": False, "error": why})

    # -------------------------------------------------------------- correct first
    def inputs(self, B, H, N, d, dtype, seed):
        """Q, K, V (torch, on the GPU) whose running row maximum changes between blocks: a
        few late keys align with their queries (large logits), as tests/test_cupy_kernels."""
        rng = np.random.default_rng(seed)
        Q, K, V = (rng.standard_normal((B, H, N, d)) for _ in range(3))
        late = rng.choice(np.arange(N // 2, N), size=max(1, N // 50), replace=False)
        K[:, :, late] = 3.0 * Q[:, :, late]
        return [self.torch.tensor(x, device="cuda", dtype=getattr(self.torch, dtype)) for x in (Q, K, V)]

    def check_one(self, version, q, k, v, causal, ref, lse_ref, dtype) -> dict:
        O, L = self.ours_raw(version, q, k, v, causal)
        On, Ln = O.float().cpu().numpy(), L.cpu().numpy()
        verdict = ref.check(On)
        lse_err = float(np.abs(Ln - lse_ref).max())
        lse_ok = bool(np.isfinite(lse_err) and np.allclose(Ln, lse_ref, rtol=1e-5, atol=1e-4))
        out = {**verdict, "lse_max_abs_error": lse_err, "lse_ok": lse_ok, "ok": verdict["ok"] and lse_ok}
        if not out["ok"]:
            out["diagnosis"] = diagnose(On, ref.ref, Ln, lse_ref)
        return out

    def ours_raw(self, version, q, k, v, causal):
        """(O, L) of cupy_flash3 at ``version`` as torch tensors."""
        from gpu_kernels import registry

        B, H, N, d = q.shape
        launch = registry.launch("cupy_flash3", batch=B, heads=H, seq_len=N, head_dim=d,
                                 dtype=str(q.dtype).removeprefix("torch."), causal=causal, version=version)
        res = launch.run(q, k, v)
        torch = self.torch
        O = torch.as_tensor(res.O, device="cuda").view(q.shape)     # bf16 travels as int16
        return (O.view(torch.bfloat16) if q.dtype == torch.bfloat16 else O), torch.as_tensor(res.L, device="cuda")

    def check_versions(self, head_dims, sizes=CHECK_N, dtypes=("float16", "bfloat16")):
        """Every version x d x dtype x causal x N against the float64 reference."""
        import flashsim

        failed = set(self.crashed)
        for d in head_dims:
            for dtype in dtypes:
                for causal in (False, True):
                    for N in sizes:
                        B, H = (1, 2) if N <= 2048 else (1, 1)
                        q, k, v = self.inputs(B, H, N, d, dtype, seed=N + d + causal)
                        Qn, Kn, Vn = (x.float().cpu().numpy().astype(np.float64) for x in (q, k, v))
                        ref = harness.Reference.of(Qn, Kn, Vn, causal, "fp16" if dtype == "float16" else "bf16")
                        lse_ref = flashsim.reference.logsumexp(Qn, Kn, causal=causal)[..., 0]
                        for version in [ver for ver in self.versions if ver not in self.crashed]:
                            what = {"impl": impl_name(version), "d": d, "N": N, "B": B, "H": H,
                                    "causal": causal, "dtype": dtype}
                            try:
                                verdict = self.check_one(version, q, k, v, causal, ref, lse_ref, dtype)
                            except Exception as exc:
                                verdict = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                            self.results["correctness"].append({**what, **verdict})
                            if not verdict["ok"]:
                                failed.add(version)
                            print(f"  check {what['impl']} d={d} {dtype} causal={causal:d} N={N}: "
                                  f"{'ok' if verdict['ok'] else 'FAIL'} "
                                  f"{verdict.get('max_abs_error', float('nan')):.2e} <= "
                                  f"{verdict.get('bound', float('nan')):.2e} {verdict.get('error', '')}", flush=True)
                        del q, k, v
        self.passed = [v for v in self.versions if v not in failed]
        self.results["versions_passed"] = self.passed
        self.save()
        return not failed

    def resources(self, head_dims):
        """Registers, shared memory and spills of every compiled variant (ptxas, sm_90a), one
        at a time (compiled in threads, the first run's ptxas logs came back empty)."""
        from gpu_kernels.compile import parse_ptxas_log

        for d in head_dims:
            for version in flash3.VERSIONS:
                D = flash3.defines(d, "float16", version=version)
                try:
                    res = parse_ptxas_log(flash3.ptxas_log(D)).get("flash3_fwd", {})
                except Exception as exc:
                    res = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                self.results["kernel_resources"][f"d={d} v{version}"] = {
                    **res, "dynamic_smem": flash3.smem_bytes(d, D["BLOCK_C"], D["KV_STAGES"])}

    # -------------------------------------------------------------- timing
    def flex(self):
        """torch.compile(flex_attention): run(q, k, v, causal) -> O (a block mask when causal)."""
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention)
        masks = {}

        def run(q, k, v, causal):
            if not causal:
                return compiled(q, k, v)
            N = q.shape[-2]
            if N not in masks:
                masks[N] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, N, N, device="cuda")
            return compiled(q, k, v, block_mask=masks[N])
        return run

    def timing(self, head_dims, sizes):
        impls_fast = [("torch_flash", self.sdpa("FLASH_ATTENTION")),
                      ("torch_cudnn", self.sdpa("CUDNN_ATTENTION")),
                      ("torch_efficient", self.sdpa("EFFICIENT_ATTENTION"))]
        flex = self.flex_or_none(self.flex)
        for d in sorted(head_dims, key=lambda d: (d != 128, d)):   # d = 128 first: the target
            ours = [(impl_name(v), self.ours("cupy_flash3", version=v)) for v in self.passed]
            if d in (64, 128):
                ours.append(("cupy_flash2_tc", self.ours("cupy_flash2_tc")))
            for causal in (False, True):
                for N in sizes:
                    with_flex = flex is not None and N in FLEX_N and d in (64, 128)
                    self.paper_point(d, N, causal, lambda q, k, v: (
                        ours + impls_fast + ([("torch_flex", flex)] if with_flex else [])))

    def sweep(self, head_dims, sizes=(4096, 16384)):
        """Other tiles and stage counts for the versions that passed (fp16): B_c in {64, 128}
        x {2, 3} stages where they fit; recorded under "tuning", not in the main table."""
        torch = self.torch
        self.results["tuning"] = []
        for d in (d for d in (128, 64) if d in head_dims):
            for causal in (False, True):
                for N in sizes:
                    B, H = TOTAL_TOKENS // N, HIDDEN // d
                    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
                    ref, bound = self.reference(q, k, v, causal)
                    for version in self.passed:
                        for bc in (64, 128):
                            for st in (2, 3):
                                if flash3.smem_bytes(d, bc, st) > flash3.SMEM_LIMIT or (version < 3 and st == 3):
                                    continue
                                what = {"impl": impl_name(version), "d": d, "N": N, "causal": causal,
                                        "block_cols": bc, "stages": st}
                                if not self.due(what):
                                    continue
                                fn = self.ours("cupy_flash3", version=version, block_cols=bc, stages=st)
                                try:
                                    ok, err = self.check_fp16(fn(q, k, v, causal), ref, bound)
                                    if not ok:
                                        self.skip(what, f"check failed: error {err:.3e} > {bound:.3e}")
                                        continue
                                    ms, _ = self.time_fn(lambda: fn(q, k, v, causal), repeats=5)
                                except Exception as exc:
                                    self.failed(what, exc)
                                    continue
                                tf = flops(B, H, N, d, causal) / ms / 1e9
                                self.results["tuning"].append({**what, "time_ms": ms, "tflops": tf})
                                print(f"  sweep {what}: {tf:.1f} TFLOP/s", flush=True)
                    del q, k, v, ref
                    torch.cuda.empty_cache()
                    self.save()

    def table(self):
        self.results["tensor_maps"] = "parameter" if flash3.TMAP_BY_VALUE else "global"
        lines, ratios, gains = gain_table(self.results["points"])
        print("\n".join(lines))
        self.results["best_vs_torch_flash"] = ratios
        self.results["step_gains"] = gains


SHORT = {**{impl_name(v): f"v{v}" for v in flash3.VERSIONS}, "cupy_flash2_tc": "fa2tc",
         "torch_flash": "flash", "torch_cudnn": "cudnn", "torch_efficient": "effic", "torch_flex": "flex"}


def gain_table(points: list[dict]) -> tuple[list[str], list[dict], list[dict]]:
    """(printed lines, best version / torch_flash per point, each step's gain): one line per
    (d, causal, N) with every implementation's TFLOP/s; a step's gain is the geometric mean
    over N of v(k) / v(k-1) per (d, causal) (``flashsim.hardware.schedules.step_gains``)."""
    pts = {(p["impl"], p["d"], p["N"], p["causal"]): p["tflops"] for p in points}
    impls = list(SHORT)
    lines = ["", "TFLOP/s (fp16 forward; best = best cupy_flash3 version / torch_flash)",
             f"{'d':>3} {'c':>1} {'N':>5} " + " ".join(f"{SHORT[i]:>6}" for i in impls) + "   best/flash"]
    ratios = []
    for d, c, N in sorted({(d, c, N) for (_, d, N, c) in pts}):
        row = [pts.get((i, d, N, c)) for i in impls]
        best = max((x for x in row[:len(flash3.VERSIONS)] if x is not None), default=None)
        fl = pts.get(("torch_flash", d, N, c))
        cells = " ".join(f"{x:6.1f}" if x is not None else f"{'-':>6}" for x in row)
        if best and fl:
            ratios.append({"d": d, "N": N, "causal": c, "best_tflops": best, "torch_flash_tflops": fl,
                           "ratio": best / fl})
            cells += f"   {best / fl:.2f}"
        lines.append(f"{d:>3} {c:d} {N:>5} {cells}")
    gains = schedules.step_gains(points, flash3.VERSIONS)
    if gains:
        lines.append("each step's gain (geometric mean over N of TFLOP/s ratios):")
        lines += [f"  d={g['d']:>3} causal={g['causal']:d} {g['step']}: x{g['geomean_gain']:.2f} "
                  f"({g['points']} N)" for g in gains]
    return lines, ratios, gains


# ---------------------------------------------------------------- --probe and --sanitize

def probe(args) -> int:
    """Compile every version (fp16, each d) for sm_90a and print its SASS opcode histogram
    (where cuobjdump is; without it, each version's registers from ptxas' log, which
    ``compile_cache.json`` holds)."""
    from gpu_kernels.compile import parse_ptxas_log

    tool = cuobjdump()
    out = {"provenance": harness.provenance(), "sass": {}, "cuobjdump": tool}
    folder = tempfile.mkdtemp(prefix="flash3-sass-")
    for d in flash3.HEAD_DIMS:
        for version in flash3.VERSIONS:
            D = flash3.defines(d, "float16", version=version)
            key = f"d={d} v{version}"
            try:
                if tool:
                    data, log = flash3.cubin(tuple(sorted(D.items())))
                    path = os.path.join(folder, f"flash3_d{d}_v{version}.cubin")
                    with open(path, "wb") as f:
                        f.write(data)
                else:   # nothing to disassemble: ptxas' log, committed or compiled
                    log = flash3.ptxas_log(D)
                rec = {"ptxas": parse_ptxas_log(log).get("flash3_fwd", {})}
                if tool:
                    sass = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True).stdout
                    rec["histogram"] = sass_histogram(sass)
            except Exception as exc:
                rec = {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
            out["sass"][key] = rec
            hist = rec.get("histogram", {})
            top = ", ".join(f"{k} {v}" for k, v in list(hist.items())[:10])
            print(f"{key}: HGMMA {hist.get('HGMMA', 0)}, HMMA {hist.get('HMMA', 0)}, "
                  f"UTMALDG {hist.get('UTMALDG', 0)}, LDGSTS {hist.get('LDGSTS', 0)}, regs "
                  f"{rec.get('ptxas', {}).get('registers')}; top: {top} {rec.get('error', '')}", flush=True)
    print(f"wrote {write_json(args.out, 'hopper_h200_probe.json', out)}")
    ok = all("error" not in r and (not tool or r["histogram"].get("HGMMA", 0) > 0) for r in out["sass"].values())
    return 0 if ok else 1


def sanitize(args) -> int:
    """Tiny launches of every version (or --versions), d, causal (fp16), each checked; nothing
    timed. Run under compute-sanitizer (memcheck, racecheck); --smoke is the same, in the
    child processes of the main run."""
    bench = HopperBench(args, "hopper_h200_smoke.json" if args.smoke else "hopper_h200_sanitize.json")
    bench.results["provenance"] = harness.provenance()
    ok = bench.check_versions(flash3.HEAD_DIMS, sizes=(333,), dtypes=("float16",))
    raised = any("error" in c for c in bench.results["correctness"])
    print(f"wrote {bench.save()}; sanitize launches {'all passed' if ok else 'FAILED'}"
          f"{' (a launch raised: the CUDA context may be unusable)' if raised else ''}")
    return 0 if ok else (3 if raised else 1)      # 3: the main run must not launch this version


def main(argv=None) -> int:
    from benchmarks.common import parser

    ap = parser(__doc__, deadline_s=240.0)
    ap.add_argument("--quick", action="store_true", help="d = 64, 128; N = 2048, 4096, 16384")
    ap.add_argument("--probe", action="store_true", help="SASS opcode histogram of every version")
    ap.add_argument("--sweep", action="store_true", help="after the table: other B_c and stage counts")
    ap.add_argument("--no-flex", action="store_true", help="leave flex_attention out (it compiles per shape)")
    ap.add_argument("--sanitize", action="store_true", help="tiny checked launches, no timing")
    ap.add_argument("--table", metavar="FILE", help="print the gain table of a hopper_h200.json")
    ap.add_argument("--smoke", action="store_true", help="as --sanitize (the main run's child processes)")
    ap.add_argument("--versions", type=lambda t: [int(x) for x in t.split(",")], default=None,
                    help="versions to run (default: all)")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print("\n".join(gain_table(json.load(f)["points"])[0]))
        return 0
    if args.probe:
        return probe(args)
    if args.sanitize or args.smoke:
        return sanitize(args)

    import torch

    bench = HopperBench(args)
    bench.results["provenance"] = harness.provenance(
        extra={"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()})
    head_dims = (64, 128) if args.quick else flash3.HEAD_DIMS
    sizes = QUICK_N if args.quick else PAPER_N
    bench.results["configs"] = {"total_tokens": TOTAL_TOKENS, "hidden": HIDDEN, "N": list(sizes),
                                "head_dims": list(head_dims), "check_N": list(CHECK_N),
                                "kernel_configs": {str(d): flash3.CONFIGS[d] for d in head_dims}}
    print(json.dumps(bench.results["provenance"], indent=1), flush=True)
    checks = {}

    def run():
        for phase in (bench.resources, lambda _: bench.smoke_children()):   # neither stops the run
            try:
                phase(flash3.HEAD_DIMS)
            except Exception:
                traceback.print_exc()
                bench.results.setdefault("phase_errors", []).append(traceback.format_exc())
        checks["ok"] = bench.check_versions(flash3.HEAD_DIMS)   # every d, also with --quick
        print(f"versions passing every check: {bench.passed}. Starting benchmarks.", flush=True)
        bench.timing(head_dims, sizes)
        if args.sweep:
            bench.sweep(head_dims)

    ok = bench.guarded(run)
    bench.table()
    bench.finish(f"; versions passed {bench.passed}")
    return 0 if ok and checks.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
