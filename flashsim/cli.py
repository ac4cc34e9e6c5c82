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

from . import reference
from .hardware import l2
from .algorithms import ALGORITHMS
from .algorithms._common import PLACEMENTS
from .errors import FlashsimError
from .plan import PASSES, plan
from .hardware.presets import GPUS
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
    cmp_ = sub.add_parser("compare", help="standard, flash1 and flash2 side by side")
    _shape_args(cmp_)
    cmp_.add_argument("--extra-passes", type=_passes, default=(),
                      help="eager elementwise passes for the standard column, e.g. scale,mask")
    sub.add_parser("gpus", help="list the hardware presets")
    return parser


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
        inputs = _inputs(args) if args.verify else None
        if args.command == "io":
            p = _plan(args, args.algorithm, args.extra_passes)
            rep = _report(p, args, inputs)
            if p.gpu is not None or args.l2 is not None:
                rep.l2 = l2.simulate(p, l2_bytes=None if args.l2 is None else parse_size(args.l2),
                                     blocks_per_sm=args.blocks_per_sm)
            print(json.dumps(rep.to_dict()) if args.json else format_report(rep))
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
