"""Check, then time, the numba.cuda kernels on a GPU; write JSON with flashsim beside it.

    PYTHONPATH=. python3 benchmarks/numba_h200.py --out "$OUT" --explore 2   # the sweep
    PYTHONPATH=. python3 benchmarks/numba_h200.py --out "$OUT" --quick       # N = 1024, 4096

Writes $OUT/numba_h200.json (provenance, checks, times, flashsim's predictions).

For each head dimension d in (64, 128) and N from 512 to 16384: batch x heads holds 16384
tokens x 2048/d heads, as in the FlashAttention-2 paper, except that standard attention's
S and P (2 x 4 N^2 bytes per head) are capped at 16 GiB, so B*H = min(16384 * 2048 /
(d N), 2^31 / N^2); the algorithms run the same B, H at each point: standard, FA1 and FA2
at their default tiles (flashsim's rule at 48 KiB for standard, flashsim's
``fastest_blocks`` for the flash kernels), and FA2 at the square tiles of flashsim's SRAM
rule (``SQUARE_FLASH2``). Causal runs are added at N = 4096.

Correct first (llm.c's order): every algorithm is checked at a ragged N = 1000, with and
without the mask, then at each (N, d) every launch is checked against the float64
reference (heads 0 and B*H-1 up to N = 4096, the last head above, for the reference's
cost) before that (N, d) is timed; a mismatch stops the script (exit status 1, the JSON
says where). The rule is flash-attention's: max |O - ref| over the checked heads at most
twice that of a plain fp32 NumPy implementation, plus 2 ulp of max |ref|.

Timing: each launch is warmed up twice, then timed with CUDA events around one call (all
its kernel launches), median of 5 to 10 repeats, with the 60 MB L2 flushed by writing a
256 MiB buffer before every repeat. Standard attention's three kernels are also timed
one by one. ``--explore K`` first times FA2 with the K best-scored thread layouts per tile.

Beside each measurement: flashsim's predicted HBM bytes for exactly that launch (same
B_r, B_c, N, d, B, H, causal; fp32; SRAM 48 KiB, or what flashsim's model needs for the
flash kernels' tiles) and its roofline time on the H200 preset (max(bytes / 4.8 TB/s, FLOPs /
66.9 TFLOP/s), flashsim.hardware.presets), the achieved TFLOP/s (4 B H N^2 d / time) and the
effective bandwidth (flashsim's bytes / time).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from gpu_kernels import numba_common, numba_flash1, numba_flash2, numba_standard
from gpu_kernels.numba_common import cuda, fill

import flashsim

MODULES = {"standard": numba_standard, "flash1": numba_flash1, "flash2": numba_flash2}
TOKENS, WIDTH = 16384, 2048          # batch * N and heads * d, as in the FA2 paper
SP_CAP_BYTES = 16 * 2**30            # S + P of standard attention
FLUSH_BYTES = 256 * 2**20            # > 60 MB of L2
EPS32 = float(np.finfo(np.float32).eps)
# FA2 beside its default tiles (flashsim's fastest_blocks for this kernel): the square tiles
# of flashsim's SRAM rule at 48 KiB, which counts O_i and S_ij in SRAM where this kernel keeps
# them in registers (the default before fastest_blocks).
SQUARE_FLASH2 = {64: (32, 32), 128: (16, 16)}
# FA2 tiles timed by --explore at N = 4096 (None: the default); (112, 16) and (48, 16) move
# the fewest bytes of the tiles that fit
EXPLORE_TILES = {64: (None, (112, 16), (96, 16), (64, 16), (32, 32)),
                 128: (None, (48, 16), (32, 32), (16, 16))}
HEAD_DIMS = (64, 128)
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQ_LENS = (1024, 4096)
CAUSAL_AT = 4096                      # N at which causal runs are added
RAGGED_N = 1000                       # N of the correctness-only ragged check
EXPLORE_N = 4096


def shape_for(N: int, d: int) -> tuple[int, int]:
    """(batch, heads) at sequence length N and head dimension d."""
    heads = WIDTH // d
    bh = min(TOKENS * heads // N, SP_CAP_BYTES // (8 * N * N))
    batch = max(1, bh // heads)
    return batch, min(heads, bh)


def fp32_baseline(Q, K, V, causal):
    S = (Q @ K.T) * np.float32(1 / np.sqrt(Q.shape[-1]))
    if causal:
        S[np.triu_indices(S.shape[0], 1)] = -np.inf
    S -= S.max(-1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(-1, keepdims=True)
    return S @ V


class Timer:
    def __init__(self):
        self.flush_buf = cuda.device_array(FLUSH_BYTES // 4, dtype=np.float32)

    def flush(self):
        fill(self.flush_buf, 1.0)

    def __call__(self, fn, repeats: int, split: bool = False):
        """Median-ready list of milliseconds per call of ``fn``; with ``split``, also the
        per-kernel milliseconds (``fn(marks)`` records an event after each kernel)."""
        fn()
        fn()
        cuda.synchronize()
        times, parts = [], []
        for _ in range(repeats):
            self.flush()
            start, end = cuda.event(), cuda.event()
            marks = [] if split else None
            start.record()
            fn(marks) if split else fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if split:
                edges = [start] + marks
                parts.append([a.elapsed_time(b) for a, b in zip(edges, edges[1:])])
        return times, parts


def provenance(args) -> dict:
    dev = cuda.get_current_device()
    versions = {}
    for pkg in ("numpy", "numba", "numba-cuda", "cuda-bindings", "cuda-python"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                              "clocks.max.sm", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = None
    try:
        res = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        commit = res.stdout.strip() if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
        "gpu": _try(lambda: dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)),
        "compute_capability": _try(lambda: list(dev.compute_capability)),
        "sm_count": _try(lambda: dev.MULTIPROCESSOR_COUNT),
        "nvidia_smi": smi,
        "cuda_driver_version": _try(lambda: list(cuda.cudadrv.driver.driver.get_version())),
        "cuda_runtime_version": _try(lambda: list(cuda.runtime.get_version())),
        "python": platform.python_version(),
        "packages": versions,
        "numpy_row_stack_restored": bool(numba_common.ROW_STACK_RESTORED),
        "git_commit": commit,
        "host": platform.node(),
        "method": {"warmup_runs": 2, "timer": "CUDA events around one call (all launches)",
                   "statistic": "median", "l2_flush_bytes": FLUSH_BYTES,
                   "tolerance": "max over checked heads: |O - ref| <= 2 x (fp32 baseline "
                                "error) + 2 ulp of max|ref|, ref = float64"},
    }


def _try(fn):
    try:
        return fn()
    except Exception as exc:     # provenance is best effort; say what failed
        return f"unavailable: {type(exc).__name__}"


def check(O, refs) -> dict:
    """flash-attention's rule over the checked heads: max |O - ref| <= 2 x the max error
    of the fp32 baseline + 2 ulp of max |ref| (``refs``: {head: (ref, baseline O)})."""
    err = base = scale = 0.0
    for h, (ref, baseline) in refs.items():
        out = O[h].copy_to_host().astype(np.float64)
        err = max(err, float(np.abs(out - ref).max()) if np.isfinite(out).all() else np.inf)
        base = max(base, float(np.abs(baseline - ref).max()))
        scale = max(scale, float(np.abs(ref).max()))
    tol = 2 * base + 2 * EPS32 * scale
    return {"max_abs_error": err, "baseline_error": base, "tolerance": tol,
            "ok": bool(err <= tol), "heads_checked": sorted(refs)}


def check_ragged() -> list:
    """Correctness only, at a ragged N (not a multiple of any tile) with and without the
    causal mask, for every algorithm at its default tiles and FA2 at the square tiles."""
    rng = np.random.default_rng(2)
    failures = []
    for d in HEAD_DIMS:
        N, BH = RAGGED_N, 4
        Qh, Kh, Vh = (rng.standard_normal((BH, N, d), dtype=np.float32) for _ in range(3))
        Q, K, V = (cuda.to_device(x) for x in (Qh, Kh, Vh))
        for causal in (False, True):
            refs = {h: (flashsim.reference.attention(Qh[h], Kh[h], Vh[h], causal=causal),
                        fp32_baseline(Qh[h], Kh[h], Vh[h], causal)) for h in range(BH)}
            for alg, variant, tiles in variants_for(d):
                launch = MODULES[alg].configure((1, BH, N, d), causal=causal, **tiles)
                verdict = check(launch.run(Q, K, V), refs)
                print(f"check {alg:8s} {variant:11s} N={N:5d} d={d:3d} causal={causal!s:5s} "
                      f"err={verdict['max_abs_error']:.2e} tol={verdict['tolerance']:.2e} "
                      f"{'ok' if verdict['ok'] else 'FAIL'}", flush=True)
                if not verdict["ok"]:
                    failures.append(dict(algorithm=alg, variant=variant, N=N, d=d,
                                         causal=causal, check=verdict))
    return failures


def variants_for(d: int):
    return [(alg, "default", {}) for alg in MODULES] + [
        ("flash2", "square-tiles", dict(zip(("block_rows", "block_cols"), SQUARE_FLASH2[d])))]


def sweep(args, baseline):
    timer = Timer()
    rng = np.random.default_rng(0)
    Ns = QUICK_SEQ_LENS if args.quick else SEQ_LENS
    rows, failures = [], []
    for d in HEAD_DIMS:
        for N in Ns:
            B, H = shape_for(N, d)
            BH = B * H
            t0 = time.time()
            Qh, Kh, Vh = (rng.standard_normal((BH, N, d), dtype=np.float32) for _ in range(3))
            Q, K, V = (cuda.to_device(x) for x in (Qh, Kh, Vh))
            O = cuda.device_array((BH, N, d), np.float32)
            causal_list = [False, True] if N == CAUSAL_AT else [False]
            for causal in causal_list:
                heads = sorted({0, BH - 1}) if N <= 4096 else [BH - 1]   # reference cost
                refs = {h: (flashsim.reference.attention(Qh[h], Kh[h], Vh[h], causal=causal),
                            baseline(Qh[h], Kh[h], Vh[h], causal)) for h in heads}
                for alg, variant, tiles in variants_for(d):
                    launch = MODULES[alg].configure((B, H, N, d), causal=causal, **tiles)
                    def fn(marks=None, launch=launch):
                        if launch.algorithm == "standard":
                            return launch.run(Q, K, V, out=O, marks=marks)
                        return launch.run(Q, K, V, out=O)
                    fn()
                    cuda.synchronize()
                    verdict = check(O, refs)
                    row = describe(launch, variant, verdict)
                    if not verdict["ok"]:
                        failures.append(row)
                    rows.append((row, fn, launch))
                    print(f"check {alg:8s} {variant:11s} N={N:5d} d={d:3d} causal={causal!s:5s} "
                          f"err={verdict['max_abs_error']:.2e} tol={verdict['tolerance']:.2e} "
                          f"{'ok' if verdict['ok'] else 'FAIL'}", flush=True)
            # time this (N, d) only after all its checks pass
            if failures:
                break
            for row, fn, launch in [r for r in rows if r[0]["N"] == N and r[0]["d"] == d
                                    and "time_ms" not in r[0]]:
                est = row_time_estimate(fn)
                repeats = args.repeats or (10 if est < 0.05 else 5)
                times, parts = timer(fn, repeats, split=launch.algorithm == "standard")
                finish(row, times, parts)
                print(f"time  {row['algorithm']:8s} {row['variant']:11s} N={N:5d} d={d:3d} "
                      f"causal={row['causal']!s:5s} B*H={BH:4d} {row['time_ms']:9.3f} ms "
                      f"{row['tflops']:6.2f} TFLOP/s  predicted {row['predicted_time_ms']:8.3f}"
                      f" ms", flush=True)
            del Q, K, V, O
            for _, _, launch in rows:
                launch.workspace.clear()
            print(f"(N={N}, d={d}) done in {time.time() - t0:.1f} s", flush=True)
        if failures:
            break
    return [r[0] for r in rows], failures


def row_time_estimate(fn) -> float:
    t = time.perf_counter()
    fn()
    cuda.synchronize()
    return time.perf_counter() - t


def describe(launch, variant: str, verdict: dict) -> dict:
    rep = launch.predicted_traffic("h200")
    tl = launch.tiling if isinstance(launch.tiling, tuple) else (launch.tiling,)
    return {
        "algorithm": launch.algorithm, "variant": variant, "N": launch.N, "d": launch.d,
        "batch": launch.batch, "heads": launch.heads, "causal": launch.causal,
        "block_rows": launch.block_rows, "block_cols": launch.block_cols,
        "threads": [dict(TR=t.TR, TC=t.TC, RM=t.RM, CN=t.CN, DN=t.DN) for t in tl],
        "shared_bytes": launch.shared_bytes,
        "check": verdict,
        "flops_4BHN2d": launch.flops,
        "predicted": rep.to_dict(),
        "predicted_time_ms": rep.predicted_time_s * 1e3,
    }


def finish(row, times, parts) -> None:
    t = statistics.median(times) / 1e3
    row["times_ms"] = times
    row["time_ms"] = t * 1e3
    row["tflops"] = row["flops_4BHN2d"] / t / 1e12
    row["effective_GBps"] = row["predicted"]["hbm_bytes"] / t / 1e9
    row["roofline_fraction"] = row["predicted_time_ms"] / row["time_ms"]
    if parts:                               # standard: S = tau Q K^T, softmax, P V
        row["kernel_ms_median"] = dict(zip(("scores", "softmax", "pv"),
                                           (statistics.median(p) for p in zip(*parts))))


def summarise(rows, complete: bool) -> dict:
    """Speed-ups per (N, d); the targets only for a complete run with every check passed."""
    out = {"flash2_over_standard": [], "targets": {}}
    for d in HEAD_DIMS:
        for N in sorted({r["N"] for r in rows}):
            pick = {(r["algorithm"], r["variant"]): r for r in rows
                    if r["N"] == N and r["d"] == d and not r["causal"] and "time_ms" in r}
            if ("standard", "default") in pick and ("flash2", "default") in pick:
                std, fa2 = pick["standard", "default"], pick["flash2", "default"]
                out["flash2_over_standard"].append({
                    "N": N, "d": d, "speedup": std["time_ms"] / fa2["time_ms"],
                    "flash1_over_standard": (std["time_ms"] / pick["flash1", "default"]["time_ms"]
                                             if ("flash1", "default") in pick else None),
                    "square_flash2_over_standard": (
                        std["time_ms"] / pick["flash2", "square-tiles"]["time_ms"]
                        if ("flash2", "square-tiles") in pick else None)})
    if not complete:
        out["targets"] = "not evaluated: the run stopped at a failed check"
        return out
    t = [r for r in rows if r["algorithm"] == "flash2" and r["variant"] == "default"
         and r["N"] == 4096 and r["d"] == 64 and not r["causal"] and "tflops" in r]
    if t:
        out["targets"]["flash2_N4096_d64_tflops"] = t[0]["tflops"]
        out["targets"]["flash2_N4096_d64_at_least_10"] = t[0]["tflops"] >= 10
    faster = [s["speedup"] > 1 for s in out["flash2_over_standard"] if s["N"] >= 1024]
    if faster:
        out["targets"]["flash2_faster_than_standard_every_N_ge_1024"] = all(faster)
    return out


def explore(args):
    """Time FA2 with the best-scored thread layouts (one per thread count) at N = 4096,
    for each of ``EXPLORE_TILES``: the evidence for ``choose_tiling``'s model and for the
    least-traffic default."""
    from gpu_kernels.numba_common import Tiling, _score
    timer = Timer()
    rng = np.random.default_rng(1)
    out = []
    for d in HEAD_DIMS:
        N = EXPLORE_N
        B, H = shape_for(N, d)
        Qh, Kh, Vh = (rng.standard_normal((B * H, N, d), dtype=np.float32) for _ in range(3))
        Q, K, V = (cuda.to_device(x) for x in (Qh, Kh, Vh))
        O = cuda.device_array((B * H, N, d), np.float32)
        ref = flashsim.reference.attention(Qh[0], Kh[0], Vh[0])
        for tiles in EXPLORE_TILES[d]:
            alg = "flash2"
            mod = MODULES[alg]
            try:
                base = mod.configure((B, H, N, d), **dict(zip(("block_rows", "block_cols"),
                                                              tiles or (None, None))))
            except ValueError as e:       # the kernel cannot hold these tiles
                print(f"explore {alg} d={d} tiles={tiles}: {e}", flush=True)
                continue
            Br, Bc = base.block_rows, base.block_cols
            ranked = []
            for TR in range(1, min(Br, 32) + 1):
                for TC in range(1, min(max(Bc, d), 32) + 1):
                    if TR * TC > 256 or TR * TC < 32:
                        continue
                    for RM in {-(-Br // TR), -(-Br // (4 * TR)) * 4}:
                        for CN in {-(-Bc // TC), -(-Bc // (4 * TC)) * 4}:
                            for DN in {-(-d // TC), -(-d // (4 * TC)) * 4}:
                                tl = Tiling(Br, Bc, d, TR, TC, RM, CN, DN)
                                ranked.append((_score(tl, mod.ARRAYS), tl))
            ranked.sort(key=lambda x: -x[0])
            seen, picks = set(), []
            for sc, tl in ranked:
                key = (tl.TR * tl.TC)
                if sc > 0 and key not in seen:
                    seen.add(key)
                    picks.append((sc, tl))
                if len(picks) == args.explore:
                    break
            for sc, tl in picks:
                launch = mod.configure((B, H, N, d), block_rows=Br, block_cols=Bc, threads=tl)
                fn = (lambda launch=launch: launch.run(Q, K, V, out=O))
                fn()
                cuda.synchronize()
                err = float(np.abs(O[0].copy_to_host() - ref).max())
                times, _ = timer(fn, 3)
                t = statistics.median(times)
                out.append(dict(algorithm=alg, N=N, d=d, batch=B, heads=H, block_rows=Br,
                                block_cols=Bc, threads=dict(TR=tl.TR, TC=tl.TC, RM=tl.RM,
                                                            CN=tl.CN, DN=tl.DN),
                                score=sc, max_abs_error=err, time_ms=t,
                                tflops=launch.flops / t / 1e9))
                print(f"explore {alg} d={d} tiles=({Br},{Bc}) TRxTC={tl.TR}x{tl.TC} "
                      f"RM={tl.RM} CN={tl.CN} DN={tl.DN} score={sc:.2f} err={err:.1e} "
                      f"{t:8.3f} ms {launch.flops / t / 1e9:6.2f} TFLOP/s", flush=True)
        del Q, K, V, O
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    ap.add_argument("--quick", action="store_true", help="N = 1024 and 4096 only")
    ap.add_argument("--repeats", type=int, default=0, help="timed repeats (default 5-10)")
    ap.add_argument("--explore", type=int, default=0,
                    help="also time this many thread layouts per tile at N = 4096")
    args = ap.parse_args()
    if (not cuda.is_available() or numba_common.numba.config.ENABLE_CUDASIM) and \
            os.environ.get("NUMBA_H200_DRY_RUN") != "1":
        sys.exit("needs a CUDA GPU (and NUMBA_ENABLE_CUDASIM unset)")
    t0 = time.time()
    prov = provenance(args)
    layouts = explore(args) if args.explore else []
    prov["method"]["tolerance_baseline"] = f"numpy {np.__version__} fp32 (host BLAS)"
    failures = check_ragged()
    rows, more = sweep(args, fp32_baseline) if not failures else ([], [])
    failures += more
    result = {"provenance": prov, "wall_s": None, "all_checks_passed": not failures,
              "summary": summarise(rows, not failures), "results": rows,
              "thread_layouts": layouts}
    result["failures"] = failures
    if failures:
        print("MISMATCH: timing stopped; see 'failures'", flush=True)
    result["wall_s"] = round(time.time() - t0, 1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "numba_h200.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["summary"], indent=1))
    print("wrote", path)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
