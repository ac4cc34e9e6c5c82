"""The Hopper kernel's mask path (cupy_flash3 with mask=) against PyTorch's masked attention.

    python -m benchmarks.masks_h200 --out DIR            # check, then time every point
    python -m benchmarks.masks_h200 --quick --out DIR    # N = 16384 only
    python -m benchmarks.masks_h200 --fresh --out DIR    # other N, window, documents: held out
    compute-sanitizer --tool memcheck python -m benchmarks.masks_h200 --sanitize --out DIR

Writes DIR/masks_h200.json (``--sanitize``: masks_h200_sanitize.json). Configurations: fp16
forward, batch 1, heads 2048 / d, d = 64 and 128, N = 8192, 16384, 32768; masks (flashsim
specs) sliding:1024, document:N/4 x 4:causal (four equal documents, causal within), causal,
prefix:N/4. Implementations, all in the same run:
  cupy_flash3_mask   our kernel with the mask (flash3.cu, MASK = 1, v3): skipped tiles neither
                     loaded nor multiplied, partial ones masked in registers
  cupy_flash3        our unmasked kernel (v3), the denominator of the time ratio
  torch_flex         torch.compile(flex_attention) with create_block_mask of one mask_mod that
                     reads the same FlashMask vectors (the mask's tiles skipped, partial ones
                     masked); N in FLEX_N only, since it compiles per shape
  torch_sdpa_mask    SDPA with the dense (N, N) boolean mask
Per point: time_ms, tflops_useful (4 d H x the visible (query, key) pairs / time), check_ok,
flashsim's tile classes at the kernel's 128 x 128 tiles (non-skipped and partial fractions),
and flashsim's predicted time ratio against the unmasked kernel (see ``predicted_ratio``).

Method: first the masked kernel is checked against the float64 reference (flashsim.reference
with the dense mask) on ragged N = 97 and 4097, d = 64 and 128, fp16, for every mask family
and a mask with rows that see no key, with flash-attention's rule (gpu_kernels.harness.
Reference: error at most twice that of a plain same-dtype implementation) and L against the
float64 logsumexp; if any fails nothing of ours is timed. Then each timed point is checked
on the very inputs it is timed on (error against SDPA in fp32 with the dense mask at most
twice SDPA's fp16 error with it; peers are timed anyway, their verdict recorded), then timed
by the harness (gpu_kernels.harness: warm-up, CUDA events, a 2 x L2 flush before every
repeat, the median). A point that fails, raises or is past --deadline-s is listed in
"skipped" with the reason.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np

from benchmarks.common import Recorder
from flashsim import masks
from flashsim.hardware.presets import DEFAULT_GPU, gpu as gpu_preset
from gpu_kernels import harness, registry
from gpu_kernels.cupy import flash3

HIDDEN = 2048                       # heads = 2048 / d
SIZES = (8192, 16384, 32768)
QUICK_SIZES = (16384,)
FLEX_N = (16384,)                   # flex_attention compiles once per (N, d): one size
CHECK_N = (97, 4097)
FAMILIES = ("sliding", "document", "causal", "prefix")
# The partial-tile overhead model: an element of a partial tile costs MASK_OPS more CUDA-core
# instructions (two range tests: four compares, an or, a select), issued at the SM's fp32
# rate, on top of the full tile's time; column vector loads (L1 hits) are left out.
MASK_OPS = 6


# --fresh: launches measured only after masked_time's constants were fitted and committed
# (other N, window and document count), all of them held out.
FRESH_SIZES, FRESH_WINDOW, FRESH_DOCUMENTS = (12288, 24576), 2048, 8


def mask_spec(family: str, N: int, window: int = 1024, documents: int = 4) -> str:
    """The flashsim spec of a family at N (document: ``documents`` equal documents, causal
    within; prefix: N / 4)."""
    return {"sliding": f"sliding:{window}", "causal": "causal", "prefix": f"prefix:{max(1, N // 4)}",
            "document": "document:" + ",".join(map(str, masks.documents(N, documents))) + ":causal"}[family]


def check_mask(family: str, N: int) -> masks.Mask:
    """The masks the checks use at N: each family (the window N / 5) and ``nokey``."""
    if family == "nokey":
        return no_key_rows(N)
    return masks.parse(mask_spec(family, N, window=max(1, N // 5)), N)


def visible_pairs(mask: masks.Mask) -> int:
    """(query, key) pairs the mask leaves visible: N^2 less each column's two hidden ranges
    (less their overlap)."""
    lo = np.maximum(mask.lts, mask.uts)
    hi = np.minimum(mask.lte, mask.ute)
    hidden = (mask.lte - mask.lts) + (mask.ute - mask.uts) - np.maximum(0, hi - lo)
    return int(mask.n * mask.n - hidden.sum())


def tile_fractions(mask: masks.Mask, block_rows: int = flash3.BLOCK_R, block_cols: int = 128) -> dict:
    """flashsim's classification at the kernel's tiles: the fractions of all T_r T_c tiles
    that are computed (non-skipped) and partial, the tile count, and the bytes of the tile
    list (4 (T_r + 1) + 4 x computed tiles) and of FlashMask's vectors (16 N)."""
    t = mask.classify(block_rows, block_cols)
    computed = int((t != masks.SKIP).sum())
    return {"tiles": int(t.size), "non_skipped_fraction": computed / t.size,
            "partial_fraction": float((t == masks.PARTIAL).mean()),
            # what the masked kernel reads besides Q, K, V: the tile list and the vectors
            "mask_input_bytes": 4 * (t.shape[0] + 1) + 4 * computed + masks.flashmask_bytes(mask.n)}


def predicted_ratio(fractions: dict, unmasked_s: float, heads: int, gpu: str = DEFAULT_GPU,
                    block_rows: int = flash3.BLOCK_R, block_cols: int = 128) -> dict:
    """flashsim's predicted time / unmasked time: s + p kappa. s, p: non-skipped and partial
    fractions; a computed tile costs what an unmasked tile costs, t_tile = unmasked time x SMs
    / (tiles x heads) (the SMs share the tiles evenly), and a partial tile MASK_OPS B_r B_c
    instructions more at the SM's fp32 rate: kappa = that time / t_tile."""
    hw = gpu_preset(gpu)
    t_tile = unmasked_s * hw.sms / (fractions["tiles"] * heads)
    t_mask = MASK_OPS * block_rows * block_cols / (hw.fp32_ops_per_clk_sm * hw.tensor_clock_hz)
    kappa = t_mask / t_tile
    return {"predicted_ratio": fractions["non_skipped_fraction"] + fractions["partial_fraction"] * kappa,
            "partial_overhead_kappa": kappa}


def _inputs(torch, B, H, N, d, dtype, seed):
    """Q, K, V whose running row maximum changes between K/V blocks (as tests/test_flash3)."""
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    late = rng.choice(np.arange(N // 2, N), size=max(1, N // 50), replace=False)
    K[:, :, late] = 3.0 * Q[:, :, late]
    return [torch.tensor(x, device="cuda", dtype=getattr(torch, dtype)) for x in (Q, K, V)]


def no_key_rows(N: int) -> masks.Mask:
    """Causal, except rows N/2 .. N/2 + 40, which see no key (every column hides them)."""
    r0, r1 = N // 2, min(N, N // 2 + 41)
    return masks.from_vectors(np.full(N, r0), np.full(N, r1), np.zeros(N, np.int64), np.arange(N),
                              "causal with rows that see nothing")


def check_masked(torch, mask: masks.Mask, d: int, dtype: str, seed: int = 0) -> dict:
    """Our masked kernel at (mask.n, d, dtype) against the float64 reference with the dense
    mask (flash-attention's rule) and L against the float64 logsumexp; a row that sees no key
    must have O = 0 and L = -inf. Outputs are poisoned first (an unwritten row fails)."""
    import flashsim

    N = mask.n
    B, H = (1, 2) if N <= 2048 else (1, 1)
    q, k, v = _inputs(torch, B, H, N, d, dtype, seed)
    launch = registry.launch("cupy_flash3", batch=B, heads=H, seq_len=N, head_dim=d, dtype=dtype,
                             mask=mask)
    O = torch.full_like(q, float("nan"))
    L = torch.full((B, H, N), float("nan"), device="cuda")
    launch.run(q, k, v, out=O, lse=L)
    Qn, Kn, Vn = (x.double().cpu().numpy() for x in (q, k, v))
    On, Ln = O.double().cpu().numpy(), L.cpu().numpy()
    dense = mask.dense()
    verdict = harness.reference_check(On, Qn, Kn, Vn, False, "fp16" if dtype == "float16" else "bf16",
                                      mask=dense)
    none = ~dense.any(axis=1)
    L_ref = flashsim.reference.logsumexp(Qn, Kn, mask=dense)[..., 0]
    lse_err = float(np.abs(Ln[..., ~none] - L_ref[..., ~none]).max())
    lse_ok = bool(np.allclose(Ln[..., ~none], L_ref[..., ~none], rtol=1e-5, atol=1e-4))
    empty_ok = bool(np.isneginf(Ln[..., none]).all() and (On[..., none, :] == 0).all())
    return {**verdict, "lse_max_abs_error": lse_err, "lse_ok": lse_ok, "rows_without_keys": int(none.sum()),
            "empty_rows_ok": empty_ok, "ok": verdict["ok"] and lse_ok and empty_ok}


class MaskBench(Recorder):
    def __init__(self, args, name="masks_h200.json"):
        import torch

        self.torch = torch
        self.harness = harness.Harness("cupy")
        super().__init__(args, name, __doc__.split("Method: ")[1].strip(), timing=self.harness.method(),
                         overhead_model=predicted_ratio.__doc__.strip() + f" MASK_OPS = {MASK_OPS}.",
                         correctness=[])

    def spec(self, family: str, N: int) -> str:
        """The timed mask of ``family`` at N (``--fresh``: its own window and documents)."""
        if getattr(self.args, "fresh", False):
            return mask_spec(family, N, window=FRESH_WINDOW, documents=FRESH_DOCUMENTS)
        return mask_spec(family, N)

    # -------------------------------------------------------------- correct first
    def check_all(self, sizes=CHECK_N, head_dims=flash3.MASK_HEAD_DIMS, dtypes=("float16",)) -> bool:
        ok = True
        for d in head_dims:
            for dtype in dtypes:
                for N in sizes:
                    for family in FAMILIES + ("nokey",):
                        mask = check_mask(family, N)
                        what = {"impl": "cupy_flash3_mask", "mask": mask.spec, "N": N, "d": d, "dtype": dtype}
                        try:
                            verdict = check_masked(self.torch, mask, d, dtype, seed=N + d)
                        except Exception as exc:
                            verdict = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                        ok &= verdict["ok"]
                        self.results["correctness"].append({**what, **verdict})
                        print(f"  check {mask.spec[:40]} N={N} d={d} {dtype}: {'ok' if verdict['ok'] else 'FAIL'} "
                              f"{verdict.get('max_abs_error', float('nan')):.2e} <= "
                              f"{verdict.get('bound', float('nan')):.2e} {verdict.get('error', '')}", flush=True)
        self.results["checks_passed"] = ok
        self.save()
        return ok

    # -------------------------------------------------------------- implementations
    def dense(self, mask: masks.Mask):
        """The (N, N) bool mask on the GPU (True: visible), built there from the vectors."""
        torch = self.torch
        lts, lte, uts, ute = (torch.as_tensor(v, device="cuda")[None, :]
                              for v in (mask.lts, mask.lte, mask.uts, mask.ute))
        r = torch.arange(mask.n, device="cuda")[:, None]
        return ~(((r >= lts) & (r < lte)) | ((r >= uts) & (r < ute)))

    def flex(self):
        """run(q, k, v, mask) with torch.compile(flex_attention) and create_block_mask of one
        mask_mod reading FlashMask's vectors from a buffer per N (filled per mask, so each
        (N, d) compiles once for all masks)."""
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention)
        per_n, block_masks = {}, {}

        def vectors_and_mask_mod(N):
            """One buffer of the four vectors and one mask_mod per N (one compile per shape)."""
            vec = torch.empty(4, N, dtype=torch.int32, device="cuda")

            def mask_mod(b, h, q_idx, kv_idx):
                hidden_lt = (q_idx >= vec[0][kv_idx]) & (q_idx < vec[1][kv_idx])
                hidden_ut = (q_idx >= vec[2][kv_idx]) & (q_idx < vec[3][kv_idx])
                return ~(hidden_lt | hidden_ut)
            return vec, mask_mod

        def run(q, k, v, mask):
            N = q.shape[-2]
            if mask.key() not in block_masks:
                if N not in per_n:
                    per_n[N] = vectors_and_mask_mod(N)
                vec, mask_mod = per_n[N]
                vec.copy_(torch.as_tensor(np.stack([mask.lts, mask.lte, mask.uts, mask.ute]).astype(np.int32),
                                          device="cuda"))
                block_masks.clear()        # one mask's vectors in the buffer at a time
                block_masks[mask.key()] = create_block_mask(mask_mod, None, None, N, N, device="cuda")
            return compiled(q, k, v, block_mask=block_masks[mask.key()])
        return run

    def ours(self, masked: bool):
        torch, launches = self.torch, {}

        def run(q, k, v, mask):
            B, H, N, d = q.shape
            key = (N, d, mask.key() if masked else None)
            if key not in launches:
                launches.clear()
                launches[key] = registry.launch("cupy_flash3", batch=B, heads=H, seq_len=N, head_dim=d,
                                                dtype="float16", **({"mask": mask} if masked else {}))
            return torch.as_tensor(launches[key].run(q, k, v).O, device="cuda").view(q.shape)
        return run

    def sdpa_mask(self, q, k, v, dense):
        """SDPA with the dense boolean mask (True: visible)."""
        import torch.nn.functional as F

        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)

    def reference(self, q, k, v, dense):
        """(SDPA in fp32 with the dense mask, one head at a time so that no backend needs an
        N x N score matrix per head; 2 x the max error of SDPA in q's dtype against it)."""
        torch = self.torch
        ref = torch.empty(q.shape, dtype=torch.float32, device="cuda")
        for h in range(q.shape[1]):
            ref[:, h:h + 1] = self.sdpa_mask(*(x[:, h:h + 1].float() for x in (q, k, v)), dense)
        return ref, 2 * (self.sdpa_mask(q, k, v, dense).float() - ref).abs().max().item()

    # -------------------------------------------------------------- timing
    def time_point(self, what, fn, ref, bound, extra) -> float | None:
        torch = self.torch
        if not self.due(what):
            return None
        try:
            err = (fn().float() - ref).abs().max().item()
            ok = bool(np.isfinite(err) and err <= bound)
            if not ok and what["impl"].startswith("cupy"):
                self.skip(what, f"check failed: error {err:.3e} > 2 x SDPA error {bound:.3e}")
                return None
            t = self.harness.time(fn)
        except Exception as exc:
            self.skip(what, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            torch.cuda.empty_cache()
            return None
        ms = t.median_s * 1e3
        self.results["points"].append({**what, "time_ms": ms, "reps": len(t.times_s), "min_ms": min(t.times_s) * 1e3,
                                       "max_ms": max(t.times_s) * 1e3, "max_abs_err": err, "err_bound": bound,
                                       "check_ok": ok, **extra(ms)})
        p = self.results["points"][-1]
        print(f"{what['impl']:>17} d={what['d']:>3} N={what['N']:>5} {what['mask'][:24]:<24} {ms:9.3f} ms "
              f"{p.get('tflops_useful', float('nan')):7.1f} TFLOP/s"
              + (f"  ratio {p['time_ratio']:.3f} (predicted {p['predicted_ratio']:.3f})" if "time_ratio" in p else ""),
              flush=True)
        return ms

    def timing(self, head_dims, sizes, ours_ok: bool):
        torch = self.torch
        flex = self.flex_or_none(self.flex)
        ours, plain = self.ours(True), self.ours(False)
        # N = 16384 first (flex's size, the reference point): the deadline cuts others
        for N, d in [(N, d) for N in sorted(sizes, key=lambda n: (n not in FLEX_N, n)) for d in head_dims]:
            H = HIDDEN // d
            q, k, v = (torch.randn(1, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
            unmasked_ms = None
            for family in FAMILIES:
                mask = masks.parse(self.spec(family, N), N)
                frac = tile_fractions(mask)
                useful = 4 * d * H * visible_pairs(mask)
                dense = self.dense(mask)
                try:
                    ref, bound = self.reference(q, k, v, dense)
                except Exception as exc:
                    self.skip({"d": d, "N": N, "mask": mask.spec}, f"reference: {type(exc).__name__}: {exc}")
                    torch.cuda.empty_cache()
                    continue
                base = {"d": d, "N": N, "B": 1, "H": H, "dtype": "float16", "mask": mask.spec}
                if unmasked_ms is None and ours_ok:
                    # the unmasked kernel, timed once per (d, N); checked unmasked
                    import torch.nn.functional as F

                    uref = torch.empty(q.shape, dtype=torch.float32, device="cuda")
                    for h in range(H):
                        uref[:, h:h + 1] = F.scaled_dot_product_attention(
                            *(x[:, h:h + 1].float() for x in (q, k, v)))
                    ubound = 2 * (F.scaled_dot_product_attention(q, k, v).float() - uref).abs().max().item()
                    unmasked_ms = self.time_point({**base, "impl": "cupy_flash3", "mask": "none"},
                                                  lambda: plain(q, k, v, None), uref, ubound,
                                                  lambda ms: {"tflops_useful": 4 * d * H * N * N / ms / 1e9})
                    del uref

                def extra(ms, masked=False):
                    out = {"tflops_useful": useful / ms / 1e9, **frac, "visible_fraction": useful / (4 * d * H * N * N)}
                    if masked and unmasked_ms:
                        out.update(predicted_ratio(frac, unmasked_ms / 1e3, H), time_ratio=ms / unmasked_ms,
                                   unmasked_ms=unmasked_ms)
                    return out
                impls = []
                if ours_ok:
                    impls.append(("cupy_flash3_mask", lambda: ours(q, k, v, mask), lambda ms: extra(ms, True)))
                if flex is not None and N in FLEX_N:
                    impls.append(("torch_flex", lambda: flex(q, k, v, mask), extra))
                impls.append(("torch_sdpa_mask", lambda: self.sdpa_mask(q, k, v, dense), extra))
                for name, fn, ex in impls:
                    self.time_point({**base, "impl": name}, fn, ref, bound, ex)
                del dense, ref
                torch.cuda.empty_cache()
                self.save()
            del q, k, v
            torch.cuda.empty_cache()

    def table(self):
        """time / unmasked and the prediction, ours against flex, per (d, N, mask)."""
        pts = {(p["impl"], p["d"], p["N"], p["mask"]): p for p in self.results["points"]}
        lines = ["", f"{'d':>3} {'N':>5} {'mask':<26} {'s':>6} {'p':>6} {'ours ms':>8} {'ratio':>6} "
                     f"{'pred':>6} {'flex ms':>8} {'sdpa ms':>8}"]
        rows = []
        for (impl, d, N, m), p in sorted(pts.items(), key=lambda kv: kv[0][1:]):
            if impl != "cupy_flash3_mask":
                continue
            fl, sd = pts.get(("torch_flex", d, N, m)), pts.get(("torch_sdpa_mask", d, N, m))
            row = {"d": d, "N": N, "mask": m, "ours_ms": p["time_ms"], "flex_ms": fl and fl["time_ms"],
                   "sdpa_mask_ms": sd and sd["time_ms"], "time_ratio": p.get("time_ratio"),
                   "predicted_ratio": p.get("predicted_ratio")}
            rows.append(row)
            f = lambda x, w=8, fmt=".3f": f"{x:{w}{fmt}}" if x is not None else f"{'-':>{w}}"   # noqa: E731
            lines.append(f"{d:>3} {N:>5} {m[:26]:<26} {p['non_skipped_fraction']:6.3f} {p['partial_fraction']:6.3f} "
                         f"{f(p['time_ms'])} {f(row['time_ratio'], 6)} {f(row['predicted_ratio'], 6)} "
                         f"{f(row['flex_ms'])} {f(row['sdpa_mask_ms'])}")
        print("\n".join(lines), flush=True)
        self.results["table"] = rows


def sanitize(args) -> int:
    """Tiny checked launches of the masked kernel (N = 333, every family and a mask with rows
    that see no key, d = 64 and 128, fp16); nothing timed. Run under compute-sanitizer."""
    bench = MaskBench(args, "masks_h200_sanitize.json")
    bench.results["provenance"] = harness.provenance()
    ok = bench.check_all(sizes=(333,))
    print(f"wrote {bench.save()}; sanitize launches {'all passed' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv=None) -> int:
    from benchmarks.common import parser

    ap = parser(__doc__, deadline_s=270.0)
    ap.add_argument("--quick", action="store_true", help="N = 16384 only")
    ap.add_argument("--no-flex", action="store_true", help="leave flex_attention out (it compiles per shape)")
    ap.add_argument("--sanitize", action="store_true", help="tiny checked launches, no timing")
    ap.add_argument("--fresh", action="store_true",
                    help=f"N = {FRESH_SIZES}, window {FRESH_WINDOW}, {FRESH_DOCUMENTS} documents, "
                         "no flex -> masks_h200_fresh.json (held out from the fitted time model)")
    args = ap.parse_args(argv)
    if args.sanitize:
        return sanitize(args)

    import torch

    bench = MaskBench(args, "masks_h200_fresh.json") if args.fresh else MaskBench(args)
    if args.fresh:
        args.no_flex = True
    bench.results["provenance"] = harness.provenance(
        extra={"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()})
    sizes = FRESH_SIZES if args.fresh else QUICK_SIZES if args.quick else SIZES
    bench.results["configs"] = {"hidden": HIDDEN, "N": list(sizes), "head_dims": list(flash3.MASK_HEAD_DIMS),
                                "masks": {N: [bench.spec(f, N) for f in FAMILIES] for N in sizes},
                                "flex_N": list(FLEX_N), "check_N": list(CHECK_N), "tiles": [flash3.BLOCK_R, 128]}
    print(json.dumps(bench.results["provenance"], indent=1), flush=True)
    checks = {}

    def run():
        checks["ok"] = bench.check_all()
        verdict = "passes every check. Starting benchmarks." if checks["ok"] else \
            "FAILED a check: timing the peers only."
        print(f"masked kernel {verdict}", flush=True)
        bench.timing(flash3.MASK_HEAD_DIMS, sizes, checks["ok"])

    ok = bench.guarded(run)
    try:
        bench.table()
    except Exception:
        traceback.print_exc()
    bench.finish()
    return 0 if ok and checks.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
