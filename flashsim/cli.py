"""``flashsim io`` and ``flashsim compare``: the simulator from a terminal.

The counts are the bytes SRAM requests from the level below it (the two-level model's
"HBM traffic"); whenever a GPU preset applies (``--gpu``, or no ``--sram``), the L2 model's
DRAM bytes stand beside them. Bad input ends with one line on stderr and exit status 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from . import context_parallel, reference
from .hardware import l2
from .algorithms import ALGORITHMS
from .algorithms._common import PLACEMENTS
from .errors import FlashsimError
from .plan import PASSES, plan
from .hardware import schedules
from .hardware.presets import DEFAULT_GPU, GPUS
from .hardware.schedules import LOADS, SCHEDULES
from .numerics import Recipe, error_table, hadamard
from .report import format_compare, format_report
from .units import DTYPE_BYTES, format_bytes, parse_size


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage too: one line is enough
        raise FlashsimError(message)


def _int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _passes(text: str) -> tuple:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq-len", "-N", type=_int, required=True, help="sequence length N")
    p.add_argument("--head-dim", "-d", type=_int, required=True, help="head dimension d")
    p.add_argument("--batch", type=_int, default=1)
    p.add_argument("--heads", type=_int, default=1)
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default="fp32",
                   help="sets bytes per element (values are computed in float64)")
    p.add_argument("--gpu", choices=list(GPUS), type=str.lower,
                   help="hardware preset: sets M (shared memory a block) and the register "
                        "budget, and adds the L2 model's DRAM bytes and the roofline time "
                        "(default h200 unless --sram is given alone)")
    p.add_argument("--sram", help="SRAM size M per thread block, e.g. 100KiB, 228KB, 65536 "
                                  "(KB = 1000 B, KiB = 1024 B); overrides the preset's M")
    p.add_argument("--placement", choices=PLACEMENTS,
                   help="two-level: every buffer in SRAM (the paper's model and block rules, "
                        "Theorem 2); registers: S_ij, accumulators and statistics in "
                        "registers, tiles from HBM in shared memory, as real kernels (default "
                        "with a GPU preset)")
    p.add_argument("--block-rows", type=_int, help="B_r (default: the algorithm's rule)")
    p.add_argument("--block-cols", type=_int, help="B_c (default: the algorithm's rule)")
    p.add_argument("--causal", action="store_true", help="causal mask; masked tiles skipped")
    p.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd",
                   help="fwd (default), bwd (the backward alone: the forward's saved tensors "
                        "are inputs) or fwd+bwd (both, traffic added tensor by tensor)")
    p.add_argument("--verify", action="store_true",
                   help="run with values on random inputs and report max |O - O_ref| (with "
                        "a backward pass, also |dQ - dQ_ref|, |dK - dK_ref|, |dV - dV_ref|)")
    p.add_argument("--seed", type=int, default=0, help="random inputs for --verify")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flashsim", description="Exact HBM <-> SRAM traffic of attention.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    io = sub.add_parser("io", help="traffic of one algorithm")
    io.add_argument("--algorithm", "-a", choices=list(ALGORITHMS), required=True)
    _shape_args(io)
    io.add_argument("--extra-passes", type=_passes, default=(),
                    help="standard only: eager elementwise passes over S, e.g. scale,mask")
    io.add_argument("--l2", help="L2 cache size, e.g. 60MB: adds the three-level model's "
                                 "DRAM bytes (on whenever a GPU preset applies, at its L2)")
    io.add_argument("--blocks-per-sm", type=_int,
                    help="resident thread blocks per SM for the L2 model (default: as many "
                         "as the SRAM working set allows)")
    io.add_argument("--schedule", choices=SCHEDULES,
                    help="flash2 forward, fp16/bf16: predict the time under a schedule of "
                         "the tensor cores, special-function units and loads "
                         "(flashsim/hardware/schedules.py)")
    io.add_argument("--loads", choices=LOADS, default="producer",
                    help="with --schedule: how K_j, V_j reach shared memory (default "
                         "producer: a warp-specialised producer)")
    io.add_argument("--stages", type=_int, default=2,
                    help="with --schedule and --loads producer: K/V stages in shared memory")
    io.add_argument("--devices", type=_int,
                    help="context parallelism over P devices (flash2): adds link_bytes and "
                         "per-device HBM bytes")
    io.add_argument("--cp-schedule", choices=list(context_parallel.SCHEDULES),
                    help="with --devices: ring (default), allgather, zigzag or striped")
    cmp_ = sub.add_parser("compare", help="standard, flash1 and flash2 side by side")
    _shape_args(cmp_)
    cmp_.add_argument("--extra-passes", type=_passes, default=(),
                      help="eager elementwise passes for the standard column, e.g. scale,mask")
    sub.add_parser("gpus", help="list the hardware presets")
    num = sub.add_parser("numerics", help="the FlashAttention-3 paper's FP16/FP8 error table "
                                          "(Table 3), on emulated numbers")
    r = Recipe()
    num.add_argument("--seq-len", "-N", type=_int, default=r.seq_len)
    num.add_argument("--head-dim", "-d", type=_int, default=r.head_dim,
                     help="a power of two (the Hadamard rotation)")
    num.add_argument("--heads", type=_int, default=r.heads)
    num.add_argument("--outlier-fraction", type=float, default=r.outlier_fraction,
                     help="fraction of entries with an added N(0, 100) term (paper: 0.001)")
    num.add_argument("--block-rows", type=_int, default=r.block_rows,
                     help="B_r: FP8 scale blocks of Q")
    num.add_argument("--block-cols", type=_int, default=r.block_cols,
                     help="B_c: FP8 scale blocks of K, V and the K/V tiles")
    num.add_argument("--seed", type=int, default=r.seed)
    num.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    return parser


def _schedule(p, args) -> dict:
    """The schedule model's prediction for plan ``p`` (flash2 forward on tensor cores)."""
    if p.algorithm != "flash2" or p.pass_ != "fwd" or p.dtype == "fp32":
        raise FlashsimError("--schedule models the flash2 forward on tensor cores: use "
                            "-a flash2 --pass fwd --dtype fp16 (or bf16)")
    got = schedules.launch_seconds(
        p.seq_len, p.head_dim, batch=p.batch, heads=p.heads, causal=p.causal,
        block_rows=p.block_rows, block_cols=p.block_cols, schedule=args.schedule,
        loads=args.loads, stages=args.stages, gpu=args.gpu or DEFAULT_GPU, dtype=p.dtype)
    ph = got["phases"]
    return {"schedule": args.schedule, "loads": args.loads, "stages": args.stages,
            "predicted_time_s": got["seconds"], "tflops": got["tflops"],
            "cycles_per_block": got["cycles_per_block"],
            "phase_cycles": {"gemm0": ph.gemm0, "softmax": ph.softmax, "gemm1": ph.gemm1,
                             "load": ph.load}}


def _numerics(args) -> int:
    recipe = Recipe(seq_len=args.seq_len, head_dim=args.head_dim, heads=args.heads,
                    outlier_fraction=args.outlier_fraction, block_rows=args.block_rows,
                    block_cols=args.block_cols, seed=args.seed)
    hadamard(recipe.head_dim)                   # refuse a bad d before any work
    rows = error_table(recipe)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"N={recipe.seq_len} d={recipe.head_dim} heads={recipe.heads} outliers "
          f"{recipe.outlier_fraction} (N(0,100)); RMSE of O against float64\n"
          f"{'method':<28}{'ours':>10}{'paper':>10}{'ours/paper':>12}  how")
    for row in rows:
        print(f"{row['method']:<28}{row['rmse']:>10.2e}{row['paper_rmse']:>10.2e}"
              f"{row['rmse'] / row['paper_rmse']:>12.2f}  {row['how']}")
    return 0


def _plan(args, algorithm: str, passes=()):
    return plan(algorithm, args.seq_len, args.head_dim, batch=args.batch, heads=args.heads,
                dtype=args.dtype, sram=args.sram, gpu=args.gpu, block_rows=args.block_rows,
                block_cols=args.block_cols, causal=args.causal, extra_passes=passes,
                pass_=args.pass_, placement=args.placement)


def _report(p, args, inputs):
    if not args.verify:
        return p.count()
    Q, K, V, dO, ref = inputs
    if dO is None:
        O, rep = p.run(Q, K, V)
        rep.max_abs_error = float(np.max(np.abs(O - ref["O"])))
        return rep
    grads, rep = p.run(Q, K, V, dO=dO)
    got = {"O": rep.hbm["O"], **grads._asdict()}
    rep.max_abs_errors = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
    rep.max_abs_error = max(rep.max_abs_errors.values())
    return rep


def _inputs(args):
    """Random Q, K, V (and dO with a backward pass) and their float64 references."""
    rng = np.random.default_rng(args.seed)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    Q, K, V = (rng.standard_normal(shape) for _ in range(3))
    ref = {"O": reference.attention(Q, K, V, causal=args.causal)}
    dO = None
    if args.pass_ != "fwd":
        dO = rng.standard_normal(shape)
        ref.update(zip(("dQ", "dK", "dV"),
                       reference.attention_backward(Q, K, V, dO, causal=args.causal)))
    return Q, K, V, dO, ref


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "gpus":
            for key, g in GPUS.items():
                print(f"{key:<10} {g.name:<26} SMs {g.sms:>3}  shared/block "
                      f"{format_bytes(g.sram_per_block):>10}  registers/block "
                      f"{format_bytes(g.register_bytes_per_block)}  L2 "
                      f"{format_bytes(g.l2_bytes)}  HBM {g.hbm_bandwidth / 1e12:.2f} TB/s  fp16 "
                      f"{g.peak_tensor_fp16 / 1e12:.0f} / fp32 {g.peak_fp32 / 1e12:.1f} TFLOP/s"
                      f"\n{'':<11}source: {g.source}\n{'':<11}registers: {g.register_source}")
            return 0
        if args.command == "numerics":
            if not 0 <= args.outlier_fraction <= 1:
                raise FlashsimError(f"--outlier-fraction must lie in [0, 1], got "
                                    f"{args.outlier_fraction}")
            return _numerics(args)
        if args.command == "io" and args.cp_schedule and not args.devices:
            raise FlashsimError("--cp-schedule needs --devices P")
        inputs = _inputs(args) if args.verify else None
        if args.command == "io":
            p = _plan(args, args.algorithm, args.extra_passes)
            cp = (context_parallel.cp_plan(p, args.devices, args.cp_schedule or "ring")
                  if args.devices else None)
            rep = _report(p, args, inputs)
            if p.gpu is not None or args.l2 is not None:
                rep.l2 = l2.simulate(p, l2_bytes=None if args.l2 is None else parse_size(args.l2),
                                     blocks_per_sm=args.blocks_per_sm)
            sched = _schedule(p, args) if args.schedule else None
            fields, lines = context_parallel.cli_fields(cp, inputs) if cp else ({}, [])
            if sched is not None:
                fields["schedule"] = sched
                lines.append(
                    f"schedule {sched['schedule']} (loads {sched['loads']}): "
                    f"{sched['predicted_time_s'] * 1e3:.4f} ms, {sched['tflops']:.0f} TFLOP/s; "
                    "per K/V block " + ", ".join(f"{k} {v:.0f}"
                                                 for k, v in sched["phase_cycles"].items())
                    + " cycles")
            print(json.dumps({**rep.to_dict(), **fields}) if args.json
                  else "\n".join([format_report(rep)] + lines))
        else:
            reps = []
            for a in ALGORITHMS:
                p = _plan(args, a, args.extra_passes if a == "standard" else ())
                rep = _report(p, args, inputs)
                if p.gpu is not None:
                    rep.l2 = l2.simulate(p)
                reps.append(rep)
            print(json.dumps({"compare": [r.to_dict() for r in reps]}) if args.json
                  else format_compare(reps))
        return 0
    except FlashsimError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("flashsim: error: not enough memory for this size (try without --verify)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
