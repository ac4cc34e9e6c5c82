"""``flashsim io`` and ``flashsim compare``: the simulator from a terminal.

The counts are the bytes SRAM requests from the level below it (the two-level model's
"HBM traffic"); whenever a GPU preset applies (``--gpu``, or no ``--sram``), the L2 model's
DRAM bytes stand beside them.

Every input gets an answer (exit status 0) or one line on stderr (exit status 2) and
nothing on stdout: arguments are read by :mod:`flashsim.validate` (the API's checks, with
its stated limits), the work an answer needs is checked before it starts (``--verify``'s
memory and tile count, the L2 model's work), and the output is printed whole at the end.

The arguments live in one table per command (:func:`build_parser`); a new option is one
``add_argument`` whose ``type`` is a reader below, so it fails the same way as the others.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from . import (context_parallel, decode, masks, measure as _measure, nest as _nest,
               predict_decode, reference, validate)
from .algorithms import ALGORITHMS
from .algorithms._common import PLACEMENTS
from .errors import FlashsimError
from .hardware import l2, schedules
from .hardware.l2_lockstep import Budget
from .hardware.presets import DEFAULT_GPU, GPUS
from .hardware.schedules import LOADS, SCHEDULES
from .numerics import Recipe, error_table, hadamard
from .plan import PASSES, plan
from .report import format_compare, format_report
from .units import DTYPE_BYTES, format_bytes

DECODE_ONLY = [a for a in decode.ALGORITHMS if a not in ALGORITHMS]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage too: one line is enough
        raise FlashsimError(message)


def _reader(check, *args, **kw):
    """An argparse ``type`` from a validator: argparse names the argument in its message."""
    def read(text: str):
        try:
            return check(text, "", *args, **kw)
        except FlashsimError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    read.__name__ = check.__name__
    return read


def _name(options):
    """Case-insensitive choice among ``options``."""
    return _reader(lambda text, name: validate.choice(text, list(options), name))


_count = _reader(validate.whole, hi=validate.MAX_SEQ_LEN)
_seq_len = _reader(validate.whole, hi=validate.MAX_SEQ_LEN, what="tokens")
_head_dim = _reader(validate.whole, hi=validate.MAX_HEAD_DIM)
_batch = _reader(validate.whole, hi=validate.MAX_BATCH)
_heads = _reader(validate.whole, hi=validate.MAX_HEADS)
_size = _reader(validate.size)
_seed = _reader(validate.whole, lo=0, hi=validate.MAX_SEED)
_bps = _reader(validate.whole, hi=validate.MAX_BLOCKS_PER_SM)
_stages = _reader(validate.whole, hi=64)
_devices = _reader(validate.whole, hi=2**16)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:                      # NaN fails here too
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text!r}")
    return value

def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:                      # NaN fails here too
        raise argparse.ArgumentTypeError(f"must be a probability p with 0 <= p < 1, got "
                                         f"{text!r}")
    return value

# numerics runs seven emulated methods in float64 on the CPU: heads x N^2 x d at most 2^33
# (16 times the default recipe's work; about a minute here)
NUMERICS_MAX_WORK = 2**33


def _passes(text: str) -> tuple:
    from .algorithms.standard import PASSES as EXTRA
    try:
        return validate.names(text, EXTRA, "")
    except FlashsimError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seq-len", "-N", type=_seq_len,
                   help=f"sequence length N (at most {validate.MAX_SEQ_LEN:,}; decoding "
                        "takes --q-len and --kv-len instead)")
    p.add_argument("--head-dim", "-d", type=_head_dim, help="head dimension d")
    p.add_argument("--batch", type=_batch, default=1)
    p.add_argument("--heads", type=_heads, default=1)
    p.add_argument("--dtype", type=_name(DTYPE_BYTES), default="fp32",
                   help=f"{', '.join(DTYPE_BYTES)}: sets bytes per element (values are "
                        "computed in float64)")
    p.add_argument("--gpu", type=_name(GPUS),
                   help=f"hardware preset ({', '.join(GPUS)}): sets M (shared memory a "
                        "block) and the register budget, and adds the L2 model's DRAM bytes "
                        "and the roofline time (default h200 unless --sram is given alone)")
    p.add_argument("--sram", type=_size,
                   help="SRAM size M per thread block, e.g. 100KiB, 228KB, 65536 "
                        "(KB = 1000 B, KiB = 1024 B); overrides the preset's M")
    p.add_argument("--placement", type=_name(PLACEMENTS),
                   help="two-level: every buffer in SRAM (the paper's model and block rules, "
                        "Theorem 2); registers: S_ij, accumulators and statistics in "
                        "registers, tiles from HBM in shared memory, as real kernels (default "
                        "with a GPU preset)")
    p.add_argument("--block-rows", type=_count, help="B_r (default: the algorithm's rule)")
    p.add_argument("--block-cols", type=_count, help="B_c (default: the algorithm's rule)")
    p.add_argument("--causal", action="store_true", help="causal mask; masked tiles skipped")
    p.add_argument("--mask", help="a mask (flashsim/masks.py, docs/masks.md): causal, "
                                  "sliding:W, document:L1,L2,...[:causal], prefix:P, "
                                  "padding:V, blocksparse:DENSITY:SEED; flash2 skips the "
                                  "tiles it hides, standard reads it as a dense N x N bool")
    p.add_argument("--dropout", type=_probability, default=0.0,
                   help="dropout probability p on P: standard stores its keep mask, flash2 "
                        "regenerates it from --dropout-seed")
    p.add_argument("--dropout-seed", type=_seed, default=0)
    p.add_argument("--pass", dest="pass_", type=_name(PASSES), default="fwd",
                   help="fwd (default), bwd (the backward alone: the forward's saved tensors "
                        "are inputs) or fwd+bwd (both, traffic added tensor by tensor)")
    p.add_argument("--verify", action="store_true",
                   help="run with values on random inputs and report max |O - O_ref| (with "
                        "a backward pass, also |dQ - dQ_ref|, |dK - dK_ref|, |dV - dV_ref|); "
                        "refused when its arrays would not fit in memory")
    p.add_argument("--seed", type=_seed, default=0, help="random inputs for --verify")
    p.add_argument("--extra-passes", type=_passes, default=(),
                   help="standard only: eager elementwise passes over S, e.g. scale,mask")
    p.add_argument("--l2", type=_size,
                   help="L2 cache size, e.g. 60MiB: adds the three-level model's DRAM bytes "
                        "(also on with --gpu, at the preset's L2)")
    p.add_argument("--blocks-per-sm", type=_bps,
                   help="resident thread blocks per SM for the L2 model (default: as many "
                        "as the SRAM working set allows); needs --gpu or --l2")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flashsim", description="Exact HBM <-> SRAM traffic of attention.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    io = sub.add_parser("io", help="traffic of one algorithm")
    io.add_argument("--algorithm", "-a", type=_name(list(ALGORITHMS) + DECODE_ONLY),
                    required=True, help=", ".join(list(ALGORITHMS) + DECODE_ONLY))
    decode.add_cli_args(io)
    _shape_args(io)
    io.add_argument("--schedule", type=_name(SCHEDULES),
                    help="flash2 forward, fp16/bf16: predict the time under a schedule of "
                         "the tensor cores, special-function units and loads "
                         "(flashsim/hardware/schedules.py)")
    io.add_argument("--loads", type=_name(LOADS), default="producer",
                    help="with --schedule: how K_j, V_j reach shared memory (default "
                         "producer: a warp-specialised producer)")
    io.add_argument("--stages", type=_stages, default=2,
                    help="with --schedule and --loads producer: K/V stages in shared memory")
    io.add_argument("--devices", type=_devices,
                    help="context parallelism over P devices (flash2): adds link_bytes and "
                         "per-device HBM bytes")
    io.add_argument("--cp-schedule", type=_name(context_parallel.SCHEDULES),
                    help="with --devices: ring (default), allgather, zigzag or striped")
    cmp_ = sub.add_parser("compare", help="standard, flash1 and flash2 side by side")
    _shape_args(cmp_)
    sub.add_parser("gpus", help="list the hardware presets")
    pred = sub.add_parser("predict", help="one launch of one registered kernel: tiles, "
                                          "occupancy, L2 and DRAM bytes, time (flashsim.predict)")
    pred.add_argument("--kernel", required=True, help="a gpu_kernels.registry name")
    pred.add_argument("--batch", type=_batch, default=1)
    pred.add_argument("--heads", type=_heads, default=1)
    pred.add_argument("--seq-len", "-N", type=_seq_len,
                      help="N (the square kernels; a decode kernel takes --q-len, --kv-len)")
    pred.add_argument("--head-dim", "-d", type=_head_dim, required=True)
    pred.add_argument("--dtype", type=_name(DTYPE_BYTES), help="default: the kernel's first")
    pred.add_argument("--causal", action="store_true")
    pred.add_argument("--block-rows", type=_count, help="B_r (default: the kernel's rule)")
    pred.add_argument("--block-cols", type=_count, help="B_c (default: the kernel's rule)")
    pred.add_argument("--gpu", type=_name(GPUS), required=True, help=", ".join(GPUS))
    pred.add_argument("--json", action="store_true", help="print one JSON object")
    predict_decode.add_arguments(pred)
    num = sub.add_parser("numerics", help="the FlashAttention-3 paper's FP16/FP8 error table "
                                          "(Table 3), on emulated numbers")
    r = Recipe()
    num.add_argument("--seq-len", "-N", type=_reader(validate.whole, hi=2**16),
                     default=r.seq_len)
    num.add_argument("--head-dim", "-d", type=_reader(validate.whole, hi=2**12),
                     default=r.head_dim, help="a power of two (the Hadamard rotation)")
    num.add_argument("--heads", type=_reader(validate.whole, hi=2**12), default=r.heads)
    num.add_argument("--outlier-fraction", type=_fraction, default=r.outlier_fraction,
                     help="fraction of entries with an added N(0, 100) term, in (0, 1] "
                          "(paper: 0.001)")
    num.add_argument("--block-rows", type=_count, default=r.block_rows,
                     help="B_r: FP8 scale blocks of Q")
    num.add_argument("--block-cols", type=_count, default=r.block_cols,
                     help="B_c: FP8 scale blocks of K, V and the K/V tiles")
    num.add_argument("--seed", type=_reader(validate.whole, lo=0, hi=2**32 - 1),
                     default=r.seed)
    num.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    ms = sub.add_parser("measure", help="run our kernels on this machine's GPU: predicted "
                        "beside measured (flashsim/measure.py)")
    _measure.add_arguments(ms, seq_len=_seq_len, head_dim=_head_dim, batch=_batch, heads=_heads,
                           tile=_count, dtype=_name(DTYPE_BYTES),
                           repeats=_reader(validate.whole, hi=1000))
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


def _numerics(args) -> str:
    work = args.heads * args.seq_len ** 2 * args.head_dim
    if work > NUMERICS_MAX_WORK:
        raise FlashsimError(
            f"numerics would multiply heads x N^2 x d = {work:,}, more than the limit of "
            f"{NUMERICS_MAX_WORK:,} (the emulated methods run in float64 on the CPU); use a "
            "smaller N, d or fewer heads")
    recipe = Recipe(seq_len=args.seq_len, head_dim=args.head_dim, heads=args.heads,
                    outlier_fraction=args.outlier_fraction, block_rows=args.block_rows,
                    block_cols=args.block_cols, seed=args.seed)
    hadamard(recipe.head_dim)                   # refuse a bad d before any work
    rows = error_table(recipe)
    if args.json:
        return json.dumps(rows)
    lines = [f"N={recipe.seq_len} d={recipe.head_dim} heads={recipe.heads} outliers "
          f"{recipe.outlier_fraction} (N(0,100)); RMSE of O against float64\n"
          f"{'method':<28}{'ours':>10}{'paper':>10}{'ours/paper':>12}  how"]
    for row in rows:
        lines.append(f"{row['method']:<28}{row['rmse']:>10.2e}{row['paper_rmse']:>10.2e}"
                     f"{row['rmse'] / row['paper_rmse']:>12.2f}  {row['how']}")
    return "\n".join(lines)


def _plan(args, algorithm: str):
    # compare: the passes are the standard column's; io: plan() refuses them elsewhere
    passes = args.extra_passes if algorithm == "standard" or args.command == "io" else ()
    return plan(algorithm, args.seq_len, args.head_dim, batch=args.batch, heads=args.heads,
                dtype=args.dtype, sram=args.sram, gpu=args.gpu, block_rows=args.block_rows,
                block_cols=args.block_cols, causal=args.causal, extra_passes=passes,
                pass_=args.pass_, placement=args.placement, mask=args.mask,
                dropout=args.dropout, dropout_seed=args.dropout_seed)


def _check_verify(plans, args) -> None:
    """Refuse ``--verify`` before it starts when its float64 arrays would not fit in this
    process's memory, or its tiles and FLOPs would take minutes."""
    heads, N, d = args.batch * args.heads, args.seq_len, args.head_dim
    backward = args.pass_ != "fwd"
    nd, nn = 8 * heads * N * d, 8 * heads * N * N
    inputs = (4 if backward else 3) * nd                    # Q, K, V (, dO)
    refs = (3 if backward else 1) * nd                      # O_ref (or dQ, dK, dV refs)
    # The reference holds a few N x N matrices at once (S, P, and in the backward dP, dS
    # and their products); the causal mask is one N x N bool matrix and its copy.
    # (measured: about 3 N x N forward at N = 8192; one more is kept for safety).
    masked = args.causal or args.mask is not None or args.dropout
    reference_peak = (7 if backward else 4) * nn + (2 * nn if args.dropout else 0) + (
        2 * N * N if masked else 0)
    transfers, flops, run_peak = 0, heads * N * N * d * (12 if backward else 4), 0
    for p in plans:
        nests = [p.nest()] + ([p.module.build(p)] if args.pass_ == "bwd" else [])
        tensors: dict = {}
        for n in nests:                     # with pass bwd the forward runs first, uncounted
            counted = _nest.count(n)
            transfers += counted.transfers
            flops += heads * counted.flops
            tensors.update(n.tensors)
        run_peak = max(run_peak, inputs + sum(
            8 * heads * t.rows * t.cols for t in tensors.values()))
    need = inputs + refs + max(reference_peak, run_peak)
    allowed = int(validate.VERIFY_MEMORY_SHARE * validate.memory_allowance())
    if need > allowed:
        raise FlashsimError(
            f"--verify needs about {need:,} B ({format_bytes(need)}) for its float64 arrays "
            f"(inputs, the N x N reference, every HBM tensor) but this process may use "
            f"{allowed:,} B ({format_bytes(allowed)}: half of the memory still free to it); "
            "use a smaller N or batch x heads, or leave out --verify")
    if transfers > validate.VERIFY_MAX_TRANSFERS:
        raise FlashsimError(
            f"--verify would step through {transfers:,} tile loads and stores with values, "
            f"more than the limit of {validate.VERIFY_MAX_TRANSFERS:,}; use larger blocks or "
            "a smaller N, or leave out --verify (the counts need no values)")
    if flops > validate.VERIFY_MAX_FLOPS:
        raise FlashsimError(
            f"--verify would compute {flops:,} float64 FLOPs (run and reference), more than "
            f"the limit of {validate.VERIFY_MAX_FLOPS:,}; use a smaller N, d or batch x "
            "heads, or leave out --verify")


def _report(p, args, inputs):
    if not args.verify:
        return p.count()
    Q, K, V, dO, ref = inputs
    if dO is None:
        O, rep = p.run(Q, K, V)
        rep.max_abs_error = float(np.max(np.abs(O - ref["O"])))
    else:
        grads, rep = p.run(Q, K, V, dO=dO)
        got = {"O": rep.hbm["O"], **grads._asdict()}
        rep.max_abs_errors = {k: float(np.max(np.abs(got[k] - ref[k]))) for k in ref}
        rep.max_abs_error = max(rep.max_abs_errors.values())
    rep.hbm.clear()                     # the arrays are not printed: free them now
    return rep


def _inputs(args, p):
    """Random Q, K, V (and dO with a backward pass) and their float64 references (with
    plan ``p``'s mask and dropout, when it has them)."""
    rng = np.random.default_rng(args.seed)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    Q, K, V = (rng.standard_normal(shape) for _ in range(3))
    extra = masks.reference_args(p)
    ref = {"O": reference.attention(Q, K, V, causal=args.causal, **extra)}
    dO = None
    if args.pass_ != "fwd":
        dO = rng.standard_normal(shape)
        ref.update(zip(("dQ", "dK", "dV"),
                       reference.attention_backward(Q, K, V, dO, causal=args.causal, **extra)))
    return Q, K, V, dO, ref


def _gpus() -> str:
    return "\n".join(
        f"{key:<10} {g.name:<26} SMs {g.sms:>3}  shared/block "
        f"{format_bytes(g.sram_per_block):>10}  registers/block "
        f"{format_bytes(g.register_bytes_per_block)}  L2 {format_bytes(g.l2_bytes)}  "
        f"HBM {g.hbm_bandwidth / 1e12:.2f} TB/s  fp16 "
        f"{g.peak_tensor_fp16 / 1e12:.0f} / fp32 {g.peak_fp32 / 1e12:.1f} TFLOP/s"
        f"\n{'':<11}source: {g.source}\n{'':<11}registers: {g.register_source}"
        for key, g in GPUS.items())


def answer(argv=None) -> str:
    """The text ``flashsim`` prints for ``argv``, or a FlashsimError; nothing printed."""
    args = build_parser().parse_args(argv)
    if args.command == "gpus":
        return _gpus()
    if args.command == "numerics":
        return _numerics(args)
    if args.command == "measure":
        return _measure.answer(args)
    if args.command == "predict":
        from . import predict
        if predict_decode.is_decode(args):
            return predict_decode.cli_answer(args)
        if args.seq_len is None:
            raise FlashsimError("the following arguments are required: --seq-len/-N")
        r = predict.predict(args.kernel, batch=args.batch, heads=args.heads,
                            seq_len=args.seq_len, head_dim=args.head_dim, dtype=args.dtype,
                            causal=args.causal, block_rows=args.block_rows,
                            block_cols=args.block_cols, gpu=args.gpu)
        return json.dumps(r) if args.json else predict.format_prediction(r)
    io = args.command == "io"
    if io and decode.is_decode_cli(args):
        if args.mask is not None or args.dropout:
            raise FlashsimError("--mask and --dropout are for prefill plans (-N), not "
                                "decoding (--q-len, --kv-len)")
        return decode.cli_answer(args)
    for value, option in ((args.seq_len, "--seq-len/-N"), (args.head_dim, "--head-dim/-d")):
        if value is None:
            raise FlashsimError(f"the following arguments are required: {option}")
    if io and args.cp_schedule and not args.devices:
        raise FlashsimError("--cp-schedule needs --devices P")
    if io and args.schedule is None and (args.loads != "producer" or args.stages != 2):
        raise FlashsimError("--loads and --stages shape the schedule model: add --schedule")
    algorithms = [args.algorithm] if io else list(ALGORITHMS)
    if not io and (args.mask is not None or args.dropout):   # flash1 takes neither
        algorithms = list(masks.MASKED_ALGORITHMS)
    plans = [_plan(args, a) for a in algorithms]
    # The L2 model runs when asked for (--gpu, --l2) and, implicitly, whenever a preset
    # applies; an implicit run past the model's work limit is left out with a note.
    explicit = args.gpu is not None or args.l2 is not None
    three_levels = explicit or plans[0].gpu is not None
    if args.blocks_per_sm is not None and not three_levels:
        raise FlashsimError("--blocks-per-sm sets the L2 model's occupancy, which runs with "
                            "a GPU preset or --l2 SIZE; add --gpu NAME or --l2")
    if (args.mask is not None or args.dropout) and io and (args.devices or args.schedule):
        raise FlashsimError("--mask and --dropout are not modelled with --devices or "
                            "--schedule; leave one out")
    cp = (context_parallel.cp_plan(plans[0], args.devices, args.cp_schedule or "ring")
          if io and args.devices else None)
    sched = _schedule(plans[0], args) if io and args.schedule else None
    if args.verify:
        _check_verify(plans, args)
    inputs = _inputs(args, plans[0]) if args.verify else None
    reps = [_report(p, args, inputs) for p in plans]
    notes = []
    if three_levels:
        budget = Budget(l2.WORK_LIMIT)              # one limit for the whole command
        try:
            runs = [l2.simulate(p, l2_bytes=args.l2, blocks_per_sm=args.blocks_per_sm,
                                budget=budget) for p in plans]
        except FlashsimError as e:
            if explicit:
                raise
            runs = [None] * len(plans)
            notes.append(f"DRAM bytes left out (the preset's L2 model was not asked for "
                         f"and would exceed its limit): {e}")
        for rep, run in zip(reps, runs):
            rep.l2 = run
    if not io:
        if args.json:
            return json.dumps({"compare": [r.to_dict() for r in reps],
                               **({"notes": notes} if notes else {})})
        return "\n".join([format_compare(reps)] + notes)
    fields, lines = context_parallel.cli_fields(cp, inputs) if cp else ({}, [])
    if sched is not None:
        fields["schedule"] = sched
        lines.append(
            f"schedule {sched['schedule']} (loads {sched['loads']}): "
            f"{sched['predicted_time_s'] * 1e3:.4f} ms, {sched['tflops']:.0f} TFLOP/s; "
            "per K/V block " + ", ".join(f"{k} {v:.0f}" for k, v in sched["phase_cycles"].items())
            + " cycles")
    fields.update(masks.cli_fields(plans[0]))
    lines += masks.cli_lines(plans[0])
    if notes:
        fields["notes"] = notes
    if args.json:
        return json.dumps({**reps[0].to_dict(), **fields})
    return "\n".join([format_report(reps[0])] + lines + notes)


def _one_line(message: str) -> str:
    """``message`` on one line whatever the input held (line breaks escaped)."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


def main(argv=None) -> int:
    try:
        text = answer(argv)
    except FlashsimError as e:
        print(f"flashsim: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except MemoryError:
        print("flashsim: error: ran out of memory before finishing; use a smaller N or "
              "batch x heads", file=sys.stderr)
        return 2
    except SystemExit as e:             # --help printed its text
        return e.code if isinstance(e.code, int) else 0
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:             # | head: the reader left; not an error of ours
        sys.stderr.close()
    return getattr(text, "exit_status", 0)      # measure: 1 when a check failed


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
