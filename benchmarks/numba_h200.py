"""Check, then time, the numba.cuda kernels on a GPU; write JSON with flashsim beside it.

    python -m benchmarks.numba_h200 --out DIR --explore 1   # the sweep, as committed
    python -m benchmarks.numba_h200 --out DIR --quick       # N = 1024, 4096 only
    python -m benchmarks.numba_h200 --out DIR --smoke       # tiny sizes, CUDA simulator

Writes DIR/numba_h200.json (provenance, checks, times, flashsim's predictions).

For each head dimension d in (64, 128) and N from 512 to 16384: batch x heads holds 16384
tokens x 2048/d heads, as in the FlashAttention-2 paper, except that standard attention's
S and P (2 x 4 N^2 bytes per head) are capped at 16 GiB, so B*H = min(16384 * 2048 /
(d N), 2^31 / N^2); the algorithms run the same B, H at each point: standard, FA1 and FA2
at their default tiles (the registry's tile rules: flashsim's SRAM rule at 48 KiB for
standard, flashsim's ``fastest_blocks`` for the flash kernels), and FA2 at the square tiles
of flashsim's SRAM rule (``SQUARE_FLASH2``). Causal runs are added at N = 4096.

Correct first (llm.c's order): every algorithm is checked at a ragged N = 1000, with and
without the mask, then at each (N, d) every launch is checked against the float64
reference (``harness.checked_heads``: heads 0 and B*H-1 up to N = 4096, the last head
above, for the reference's cost) before that (N, d) is timed; a mismatch stops the script
(exit status 1, the JSON says where). The rule (``harness.Reference``) is flash-attention's:
max |O - ref| over the checked heads at most twice that of a plain fp32 NumPy
implementation, plus 2 ulp of max |ref|.

Timing: ``gpu_kernels.harness`` (``method`` in the JSON): warm-up, CUDA events around one
call (all its kernel launches), a 2 x L2 flush before every repeat, the median. Standard
attention's three kernels are also timed one by one. ``--explore K`` first times FA2 with
the K best-scored thread layouts per tile. Points not reached before ``--deadline-s`` are
absent from "results" and listed in "skipped".

Beside each measurement: flashsim's predicted HBM bytes for exactly that launch (same
B_r, B_c, N, d, B, H, causal; fp32; SRAM 48 KiB, or what flashsim's model needs for the
flash kernels' tiles) and its roofline time on the H200 preset (max(bytes / 4.8 TB/s, FLOPs /
66.9 TFLOP/s), flashsim.hardware.presets), the achieved TFLOP/s (4 B H N^2 d / time) and the
effective bandwidth (flashsim's bytes / time).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks.common import Deadline, Progress, parser, write_json
from gpu_kernels import harness, registry

ALGORITHMS = ("standard", "flash1", "flash2")
TOKENS, WIDTH = 16384, 2048          # batch * N and heads * d, as in the FA2 paper
SP_CAP_BYTES = 16 * 2**30            # S + P of standard attention
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
# --smoke: the same code on tiny sizes under the CUDA simulator (no GPU; its times mean nothing)
SMOKING = False
SMOKE = dict(HEAD_DIMS=(16,), SEQ_LENS=(32,), QUICK_SEQ_LENS=(32,), CAUSAL_AT=32, RAGGED_N=20,
             EXPLORE_N=32, SQUARE_FLASH2={16: (16, 16)}, EXPLORE_TILES={16: (None,)}, SMOKING=True)


def cuda():
    """numba.cuda (imported late, so that --smoke can choose the simulator first)."""
    from gpu_kernels.numba.common import cuda as numba_cuda

    return numba_cuda


def shape_for(N: int, d: int) -> tuple[int, int]:
    """(batch, heads) at sequence length N and head dimension d."""
    if SMOKING:
        return 1, 2
    heads = WIDTH // d
    bh = min(TOKENS * heads // N, SP_CAP_BYTES // (8 * N * N))
    batch = max(1, bh // heads)
    return batch, min(heads, bh)


def launch_for(alg: str, B: int, H: int, N: int, d: int, causal: bool, tiles=None, threads=None):
    kw = {} if threads is None else {"threads": threads}
    Br, Bc = tiles or (None, None)
    return registry.launch(f"numba_{alg}", batch=B, heads=H, seq_len=N, head_dim=d,
                           causal=causal, block_rows=Br, block_cols=Bc, **kw)


def variants_for(d: int):
    return [(alg, "default", None) for alg in ALGORITHMS] + [
        ("flash2", "square-tiles", SQUARE_FLASH2[d])]


def check(O, ref: harness.Reference, heads) -> dict:
    """``ref.check`` on the checked heads of the device output O (B*H, N, d)."""
    out = np.stack([O[h].copy_to_host() for h in heads])
    verdict = ref.check(out)
    return {**verdict, "tolerance": verdict["bound"], "heads_checked": list(heads)}


def check_ragged() -> list:
    """Correctness only, at a ragged N (not a multiple of any tile) with and without the
    causal mask, for every algorithm at its default tiles and FA2 at the square tiles."""
    rng = np.random.default_rng(2)
    failures = []
    for d in HEAD_DIMS:
        N, BH = RAGGED_N, 4
        Qh, Kh, Vh = (rng.standard_normal((BH, N, d), dtype=np.float32) for _ in range(3))
        Q, K, V = (cuda().to_device(x) for x in (Qh, Kh, Vh))
        for causal in (False, True):
            ref = harness.Reference.of(Qh, Kh, Vh, causal)
            for alg, variant, tiles in variants_for(d):
                launch = launch_for(alg, 1, BH, N, d, causal, tiles)
                verdict = check(launch.run(Q, K, V).O, ref, range(BH))
                print(f"check {alg:8s} {variant:11s} N={N:5d} d={d:3d} causal={causal!s:5s} "
                      f"err={verdict['max_abs_error']:.2e} tol={verdict['bound']:.2e} "
                      f"{'ok' if verdict['ok'] else 'FAIL'}", flush=True)
                if not verdict["ok"]:
                    failures.append(dict(algorithm=alg, variant=variant, N=N, d=d,
                                         causal=causal, check=verdict))
    return failures


def sweep(args, h: harness.Harness, deadline: Deadline):
    rng = np.random.default_rng(0)
    Ns = QUICK_SEQ_LENS if args.quick else SEQ_LENS
    rows, failures, skipped = [], [], []
    bar = Progress(total=len(HEAD_DIMS) * len(Ns), quiet=args.quiet, desc="numba_h200 sweep")
    for d in HEAD_DIMS:
        for N in Ns:
            if failures:
                break
            bar.update()
            B, H = shape_for(N, d)
            if deadline.left() < 0:
                skipped.append(dict(N=N, d=d, batch=B, heads=H, reason="deadline"))
                continue
            BH = B * H
            t0 = time.time()
            Qh, Kh, Vh = (rng.standard_normal((BH, N, d), dtype=np.float32) for _ in range(3))
            Q, K, V = (cuda().to_device(x) for x in (Qh, Kh, Vh))
            O = cuda().device_array((BH, N, d), np.float32)
            heads = harness.checked_heads(BH, N)
            todo = []
            for causal in ([False, True] if N == CAUSAL_AT else [False]):
                ref = harness.Reference.of(Qh[heads], Kh[heads], Vh[heads], causal)
                for alg, variant, tiles in variants_for(d):
                    launch = launch_for(alg, B, H, N, d, causal, tiles)

                    def fn(mark=None, launch=launch):
                        if launch.algorithm == "standard":
                            return launch.run(Q, K, V, out=O, mark=mark)
                        return launch.run(Q, K, V, out=O)
                    fn()
                    cuda().synchronize()
                    verdict = check(O, ref, heads)
                    row = describe(launch, variant, verdict)
                    rows.append(row)
                    print(f"check {alg:8s} {variant:11s} N={N:5d} d={d:3d} causal={causal!s:5s} "
                          f"err={verdict['max_abs_error']:.2e} tol={verdict['bound']:.2e} "
                          f"{'ok' if verdict['ok'] else 'FAIL'}", flush=True)
                    if not verdict["ok"]:
                        failures.append(row)
                    todo.append((row, fn, launch))
            if failures:            # time this (N, d) only after all its checks pass
                break
            for row, fn, launch in todo:
                t = h.time(fn, repeats=args.repeats or None, split=launch.algorithm == "standard")
                finish(row, t)
                print(f"time  {row['algorithm']:8s} {row['variant']:11s} N={N:5d} d={d:3d} "
                      f"causal={row['causal']!s:5s} B*H={BH:4d} {row['time_ms']:9.3f} ms "
                      f"{row['tflops']:6.2f} TFLOP/s  predicted {row['predicted_time_ms']:8.3f}"
                      f" ms", flush=True)
                launch.workspace.clear()
            del Q, K, V, O
            print(f"(N={N}, d={d}) done in {time.time() - t0:.1f} s", flush=True)
    bar.close()
    return rows, failures, skipped


def describe(launch, variant: str, verdict: dict) -> dict:
    rep = launch.predicted_traffic("h200")
    tl = launch.tiling if isinstance(launch.tiling, tuple) else (launch.tiling,)
    return {
        "algorithm": launch.algorithm, "variant": variant, "N": launch.N, "d": launch.d,
        "batch": launch.batch, "heads": launch.heads, "causal": launch.causal,
        "block_rows": launch.block_rows, "block_cols": launch.block_cols,
        "threads": [dict(TR=t.TR, TC=t.TC, RM=t.RM, CN=t.CN, DN=t.DN) for t in tl],
        "shared_bytes": launch.static_smem,
        "check": verdict,
        "flops_4BHN2d": launch.flops,
        "predicted": rep.to_dict(),
        "predicted_time_ms": rep.predicted_time_s * 1e3,
    }


def finish(row, t: harness.Timing) -> None:
    d = t.as_dict()
    row["times_ms"] = [x * 1e3 for x in t.times_s]
    row["time_ms"] = d["time_s"] * 1e3
    row["tflops"] = row["flops_4BHN2d"] / d["time_s"] / 1e12
    row["effective_GBps"] = row["predicted"]["hbm_bytes"] / d["time_s"] / 1e9
    row["roofline_fraction"] = row["predicted_time_ms"] / row["time_ms"]
    if "parts_s" in d:                      # standard: S = tau Q K^T, softmax, P V
        row["kernel_ms_median"] = dict(zip(("scores", "softmax", "pv"),
                                           (x * 1e3 for x in d["parts_s"])))


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
        out["targets"] = "not evaluated: the run stopped at a failed check or the deadline"
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


def explore(args, h: harness.Harness) -> list:
    """Time FA2 with the best-scored thread layouts (one per thread count) at N = 4096,
    for each of ``EXPLORE_TILES``: the evidence for ``choose_tiling``'s model and for the
    least-traffic default."""
    from gpu_kernels.numba import flash2

    cu = cuda()
    rng = np.random.default_rng(1)
    out = []
    for d in Progress(HEAD_DIMS, quiet=args.quiet, desc="numba_h200 explore"):
        N = EXPLORE_N
        B, H = shape_for(N, d)
        Qh, Kh, Vh = (rng.standard_normal((B * H, N, d), dtype=np.float32) for _ in range(3))
        Q, K, V = (cu.to_device(x) for x in (Qh, Kh, Vh))
        O = cu.device_array((B * H, N, d), np.float32)
        ref = harness.Reference.of(Qh[:1], Kh[:1], Vh[:1], False)
        for tiles in EXPLORE_TILES[d]:
            try:
                base = launch_for("flash2", B, H, N, d, False, tiles)
            except ValueError as e:       # the kernel cannot hold these tiles
                print(f"explore flash2 d={d} tiles={tiles}: {e}", flush=True)
                continue
            Br, Bc = base.block_rows, base.block_cols
            for sc, tl in best_layouts(Br, Bc, d, flash2.ARRAYS, args.explore):
                launch = launch_for("flash2", B, H, N, d, False, (Br, Bc), threads=tl)
                launch.run(Q, K, V, out=O)
                cu.synchronize()
                err = ref.check(O[0].copy_to_host()[None])["max_abs_error"]
                t = h.time(lambda launch=launch: launch.run(Q, K, V, out=O), repeats=3).median_s * 1e3
                out.append(dict(algorithm="flash2", N=N, d=d, batch=B, heads=H, block_rows=Br,
                                block_cols=Bc, threads=dict(TR=tl.TR, TC=tl.TC, RM=tl.RM,
                                                            CN=tl.CN, DN=tl.DN),
                                score=sc, max_abs_error=err, time_ms=t,
                                tflops=launch.flops / t / 1e9))
                print(f"explore flash2 d={d} tiles=({Br},{Bc}) TRxTC={tl.TR}x{tl.TC} "
                      f"RM={tl.RM} CN={tl.CN} DN={tl.DN} score={sc:.2f} err={err:.1e} "
                      f"{t:8.3f} ms {launch.flops / t / 1e9:6.2f} TFLOP/s", flush=True)
        del Q, K, V, O
    return out


def best_layouts(Br: int, Bc: int, d: int, arrays, k: int):
    """The ``k`` best-scored thread layouts with different thread counts."""
    from gpu_kernels.numba.common import Tiling, _score

    ranked = []
    for TR in range(1, min(Br, 32) + 1):
        for TC in range(1, min(max(Bc, d), 32) + 1):
            if TR * TC > 256 or TR * TC < 32:
                continue
            for RM in {-(-Br // TR), -(-Br // (4 * TR)) * 4}:
                for CN in {-(-Bc // TC), -(-Bc // (4 * TC)) * 4}:
                    for DN in {-(-d // TC), -(-d // (4 * TC)) * 4}:
                        tl = Tiling(Br, Bc, d, TR, TC, RM, CN, DN)
                        ranked.append((_score(tl, arrays), tl))
    ranked.sort(key=lambda x: -x[0])
    seen, picks = set(), []
    for sc, tl in ranked:
        if sc > 0 and tl.threads not in seen:
            seen.add(tl.threads)
            picks.append((sc, tl))
        if len(picks) == k:
            break
    return picks


def main(argv=None) -> int:
    ap = parser(__doc__, deadline_s=1e9, smoke=True)
    ap.add_argument("--quick", action="store_true", help="N = 1024 and 4096 only")
    ap.add_argument("--repeats", type=int, default=0, help="timed repeats (default: the harness's)")
    ap.add_argument("--explore", type=int, default=0,
                    help="also time this many thread layouts per tile at N = 4096")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        globals().update(SMOKE)
    from gpu_kernels.numba.common import numba

    if not args.smoke and (not cuda().is_available() or numba.config.ENABLE_CUDASIM):
        sys.exit("needs a CUDA GPU (and NUMBA_ENABLE_CUDASIM unset)")
    deadline = Deadline(args.deadline_s)
    h = harness.Harness("numba", **({"flush": False, "warmup": 0, "min_repeats": 1,
                                     "max_repeats": 1} if args.smoke else {}))
    layouts = explore(args, h) if args.explore else []
    failures = check_ragged()
    rows, more, skipped = sweep(args, h, deadline) if not failures else ([], [], [])
    failures += more
    method = {**h.method(), "tolerance": "max over checked heads: |O - ref| <= 2 x (fp32 baseline "
              "error) + 2 ulp of max|ref|, ref = float64",
              "tolerance_baseline": f"numpy {np.__version__} fp32 (host BLAS)"}
    result = {"provenance": harness.provenance(extra={"method": method}), "method": method,
              "wall_s": round(deadline.elapsed(), 1), "all_checks_passed": not failures,
              "summary": summarise(rows, not failures and not skipped), "results": rows,
              "thread_layouts": layouts, "skipped": skipped, "failures": failures}
    if failures:
        print("MISMATCH: timing stopped; see 'failures'", flush=True)
    print("wrote", write_json(args.out, "numba_h200.json", result))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
