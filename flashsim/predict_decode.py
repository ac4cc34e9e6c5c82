"""One step of a registered decode kernel, predicted from its configuration alone.

    from flashsim.predict_decode import predict_decode
    predict_decode("cupy_decode", batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768,
                   head_dim=128, dtype="fp16", gpu="h200")

    flashsim predict --kernel cupy_decode_paged --batch 8 --heads 32 --kv-heads 8 --q-len 1 \\
        --kv-len 32768 --head-dim 128 --dtype fp16 --page-size 16 --gpu h200 --json

``flashsim.predict`` answers for the square-attention kernels (``--seq-len``); this module
for the decode kernels of ``gpu_kernels.registry.DECODE_KERNELS`` (``--q-len``, ``--kv-len``
or ``--kv-lens``), and ``flashsim.cli`` sends each kernel to its own.

What goes in: the kernel's launch as its loader configures it (``DecodeKernel.launch``, that
is ``gpu_kernels.cupy.decode.configure``: the splits its heuristic picks, the row warps that
pack a KV head's query rows into one block, B_c, the page size and a block table), and
flashsim's plan of exactly that launch (``launch.plan(gpu)``: the same kv_lens, splits,
B_r, B_c, pages and warps). What comes out:

* each kernel launch (``decode_split``; ``decode_combine`` when there are splits, or with
  the merge in decode_split (v7, ``fused``), decode_split beside both phases of flashsim's
  plan, the combine phase without a launch of its own): grid,
  blocks, threads, shared memory and the blocks resident per SM that the L2 model runs with
  (``decode_split``: the loader's ``blocks_per_sm``, its shared memory and registers, the
  number its split heuristic counts; ``decode_combine``: ``flashsim.predict.occupancy`` of
  its threads, no shared memory);
* the counted bytes (``DecodePlan.count``): the K/V cache read (``kv_bytes``), the fp32
  partial O and logsumexp the splits write and the combine reads back
  (``partial_bytes``), the int32 block-table reads (``block_table_bytes``), and every
  tensor's reads and writes (``bytes_by_tensor``, a ragged batch's sequences summed);
* the L2 model's request and DRAM bytes (``flashsim.hardware.l2``);
* ``predicted_time_s``: the memory-bound time model (``DecodePlan.predict``, docs/decode.md:
  waves, per-SM bandwidth, the combine, launch latency) on the L2 model's DRAM bytes, as
  ``flashsim io`` answers for a decode plan. No efficiency is fitted for it.

No GPU library is imported (the loader's configure runs on the host).
"""

from __future__ import annotations

import argparse
import math

from .errors import FlashsimError
from .hardware import l2 as _l2
from .hardware.presets import gpu as _gpu
from .nest import launches as _nest_launches

# flashsim predict/measure's decode options (flashsim.decode.add_cli_args) -> the flag
DECODE_FLAGS = {"q_len": "--q-len", "kv_len": "--kv-len", "kv_lens": "--kv-lens",
                "kv_heads": "--kv-heads", "splits": "--splits", "page_size": "--page-size",
                "no_causal": "--no-causal", "variant": "--variant"}


def decode_kernels() -> dict:
    """``gpu_kernels.registry.DECODE_KERNELS`` (imported when asked)."""
    from gpu_kernels import registry

    return registry.DECODE_KERNELS


def variant_options(variant: str | None, **given) -> dict:
    """The configure keywords of ``variant`` (``gpu_kernels.cupy.decode.VARIANTS``; None: the
    defaults, none) with those of ``given`` that are not None over them; another name is
    refused."""
    from gpu_kernels.cupy import decode as loader

    from .predict import PredictError

    if variant is not None and variant not in loader.VARIANTS:
        raise PredictError(f"--variant {variant!r}: one of {', '.join(loader.VARIANTS)} (the "
                           "versions benchmarks/decode_h200.py times; without it, the defaults)")
    return {**(loader.VARIANTS[variant] if variant else {}),
            **{k: v for k, v in given.items() if v is not None}}


def predict_decode(kernel: str, *, batch: int = 1, heads: int = 1, kv_heads=None, q_len: int = 1,
                   kv_len=None, kv_lens=None, head_dim: int, dtype=None, page_size=None,
                   splits=None, causal: bool = True, block_cols=None, gpu: str | None = None,
                   work_limit: int | None = _l2.WORK_LIMIT, variant: str | None = None,
                   **options) -> dict:
    """The prediction for one step of decode kernel ``kernel`` on preset ``gpu``.

    ``splits`` None or "auto": the loader's heuristic; ``page_size`` (``cupy_decode_paged``
    only) None: 16, vLLM's default. ``variant``: a version the benchmark times
    (``gpu_kernels.cupy.decode.VARIANTS``: its configure keywords; None: the defaults);
    ``options``: more of configure's keywords (stages, warps, combine, fused, ...), over the
    variant's. Bad names and shapes raise a FlashsimError (the loader's KernelInputError is
    one) before any work is done."""
    from gpu_kernels.cupy import decode as loader

    from .decode import DEFAULT_PAGE
    from .predict import PredictError, occupancy

    if gpu is None:
        raise PredictError("flashsim predict needs --gpu NAME (the preset the launch runs on)")
    g = _gpu(gpu)
    entry = decode_kernels().get(kernel)
    if entry is None:
        raise PredictError(f"{kernel!r} is not a decode kernel: choose one of "
                           f"{', '.join(decode_kernels())} (flashsim.predict.predict answers "
                           "for the others)")
    if entry.paged and page_size is None:
        page_size = DEFAULT_PAGE
    launch = entry.launch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                          kv_len=kv_len, kv_lens=kv_lens, q_len=q_len, dtype=dtype,
                          causal=causal, page_size=page_size,
                          **variant_options(variant, **options, block_cols=block_cols,
                                            splits=None if splits == "auto" else splits))
    p = launch.plan(gpu)
    rep = p.count()
    labels = [x.label for x in _nest_launches(p.nest())]
    kernel_launches = launch.launches()
    if p.fused_combine:               # v7: decode_split runs both phases of flashsim's plan
        kernel_launches = kernel_launches * len(labels)
    if len(labels) != len(kernel_launches):
        raise PredictError(f"{kernel}: {len(kernel_launches)} kernel launches but flashsim's "
                           f"plan has {len(labels)} ({labels})")
    rows, bps = [], {}
    for label, kl in zip(labels, kernel_launches):
        shared = launch.static_smem + kl.dynamic_smem
        if kl.kernel == launch.MAIN:
            n = loader.blocks_per_sm(kl.dynamic_smem, launch.d, launch.warps, launch.wgmma)
            source = "the loader's blocks_per_sm (shared memory, REGISTER_BLOCKS)"
        else:
            n = occupancy(kl.threads, None, shared, g)["blocks_per_sm"]
            source = "flashsim.predict.occupancy (threads; registers not stated)"
        bps[label] = n
        rows.append({"label": label, "kernel": kl.kernel, "grid": list(kl.grid),
                     "blocks": math.prod(kl.grid),
                     "threads": kl.threads, "shared_bytes": shared, "blocks_per_sm": n,
                     "blocks_per_sm_source": source})
    rep.l2 = _l2.simulate(p.engine_view(), blocks_per_sm=bps, work_limit=work_limit)
    times = p.predict(l2=rep.l2)
    for row, t in zip(rows, times):
        row.update(seconds=t.seconds, memory_s=t.dram_s, compute_s=t.compute_s, launched=t.launched)
    by_tensor: dict = {}
    for name, t in rep.per_tensor.items():
        b = by_tensor.setdefault(name.split("[")[0], {"read_bytes": 0, "write_bytes": 0})
        b["read_bytes"] += t["read_bytes"]
        b["write_bytes"] += t["write_bytes"]

    def moved(*names):
        return sum(by_tensor.get(n, {}).get(k, 0) for n in names
                   for k in ("read_bytes", "write_bytes"))
    return {
        "kernel": kernel, "variant": variant, "gpu": gpu, "batch": launch.batch, "heads": launch.heads,
        "kv_heads": launch.kv_heads, "q_len": launch.q_len, "kv_len": launch.N,
        "kv_lens": launch.lens().get("kv_lens", [launch.N]), "head_dim": launch.d,
        "dtype": launch.dtype, "causal": launch.causal, "page_size": launch.page_size or None,
        "splits": launch.splits, "block_rows": launch.plan_block_rows,
        "block_cols": launch.block_cols, "row_warps": launch.row_warps,
        "chunks": launch.chunks, "warps": launch.warps, "plan": launch.plan_record(),
        "launches": rows,
        "kv_bytes": rep.kv_bytes, "partial_bytes": moved("O_part", "L_part"),
        "block_table_bytes": moved("block_table"), "bytes_by_tensor": by_tensor,
        "two_level_bytes": rep.hbm_bytes,
        "l2_read_bytes": rep.l2.l2_read_bytes, "l2_write_bytes": rep.l2.l2_write_bytes,
        "dram_read_bytes": rep.l2.dram_read_bytes, "dram_write_bytes": rep.l2.dram_write_bytes,
        "dirty_at_end_bytes": rep.l2.dirty_at_end_bytes,
        "predicted_time_s": sum(t.seconds for t in times),
        "time_model": "memory-bound (flashsim.hardware.timing.predict_memory_bound, "
                      "docs/decode.md)",
    }


def format_prediction(r: dict) -> str:
    """The text ``flashsim predict`` prints for a decode kernel."""
    lens = (f"kv_len {r['kv_len']}" if len(r["kv_lens"]) == 1 else
            "kv_lens " + ",".join(map(str, r["kv_lens"])))
    page = f", pages of {r['page_size']}" if r["page_size"] else ""
    name = r["kernel"] + (f" ({r['variant']})" if r.get("variant") else "")
    lines = [f"{name} on {r['gpu']}: B {r['batch']}, H {r['heads']}, kv_heads "
             f"{r['kv_heads']}, q_len {r['q_len']}, {lens}, d {r['head_dim']}, {r['dtype']}"
             f"{', causal' if r['causal'] else ''}{page}; {r['splits']} splits, B_r "
             f"{r['block_rows']} (packed rows of a KV head), B_c {r['block_cols']}"]
    for x in r["launches"]:
        if not x["launched"]:            # v7: the combine's phase, run by decode_split's blocks
            lines.append(f"  {'':<16} then the combine in the same blocks, no launch of its own; "
                         f"{x['seconds'] * 1e6:.2f} us")
            continue
        lines.append(f"  {x['kernel']:<16} grid {'x'.join(map(str, x['grid']))} "
                     f"({x['blocks']:,} blocks), {x['threads']} threads, "
                     f"{x['shared_bytes']:,} B shared: {x['blocks_per_sm']} blocks/SM; "
                     f"{x['seconds'] * 1e6:.2f} us")
    lines += [f"kv_bytes            {r['kv_bytes']:>16,}",
              f"partial_bytes       {r['partial_bytes']:>16,}  (fp32 O and logsumexp of the "
              "splits, written and read back by the combine)",
              f"block_table_bytes   {r['block_table_bytes']:>16,}",
              f"two-level bytes     {r['two_level_bytes']:>16,}",
              f"L2 request bytes    {r['l2_read_bytes'] + r['l2_write_bytes']:>16,}"
              f"  (read {r['l2_read_bytes']:,}, write {r['l2_write_bytes']:,})",
              f"dram_read_bytes     {r['dram_read_bytes']:>16,}",
              f"dram_write_bytes    {r['dram_write_bytes']:>16,}",
              f"predicted_time_s    {r['predicted_time_s']:.6g}  (the memory-bound model)"]
    return "\n".join(lines)


# ------------------------------------------------------------------ the CLI's side
def check_flags(args, decode: bool, kernel: str) -> None:
    """Refuse the flags that are not for ``kernel``: a decode kernel takes --q-len and
    --kv-len (or --kv-lens), not --seq-len or --block-rows; a square kernel no decode flag."""
    if decode:
        if args.seq_len is not None:
            raise FlashsimError(f"--seq-len is for the square kernels; {kernel} is a decode "
                                "kernel: give --q-len and --kv-len (or --kv-lens)")
        if args.block_rows is not None:
            raise FlashsimError(f"--block-rows: {kernel} packs a KV head's query rows itself "
                                "(16 per row warp); it takes --block-cols")
        if args.causal and args.no_causal:
            raise FlashsimError("--causal and --no-causal contradict each other")
        return
    given = [flag for key, flag in DECODE_FLAGS.items() if getattr(args, key, None) not in (None, False)]
    if given:
        raise FlashsimError(f"{given[0]} is a decode option; {kernel} takes --seq-len (the "
                            f"decode kernels: {', '.join(decode_kernels())})")


def launch_options(entry, args, defaults: dict | None = None, every: bool = False) -> dict:
    """``DecodeKernel.launch`` keywords for decode kernel ``entry`` from the parsed arguments
    of flashsim predict or measure. A value not given takes ``defaults``' (measure's default
    decode shape); kv_heads without --kv-heads is ``defaults``' unless --heads is given, then
    --heads (MHA, as flashsim io reads it). ``every`` (measure --all): --page-size goes to
    the paged kernel only and --block-cols to none. ``--variant``: its configure keywords
    (``variant_options``), under --splits and --block-cols where those are given."""
    from .decode import DEFAULT_PAGE

    d = defaults or {}

    def get(key):
        value = getattr(args, key, None)
        return d.get(key) if value is None else value
    if args.kv_len is not None and args.kv_lens is not None:
        raise FlashsimError("give --kv-len (every sequence) or --kv-lens (one per sequence), "
                            "not both")
    kv_lens = args.kv_lens
    kv_len = None if kv_lens is not None else get("kv_len")
    if kv_len is None and kv_lens is None:
        raise FlashsimError(f"{entry.name} is a decode kernel: give --kv-len N (every "
                            "sequence) or --kv-lens N1,N2,... (one per sequence)")
    batch = get("batch")
    if kv_lens is not None and args.batch in (None, 1):
        batch = len(kv_lens)
    heads = get("heads")
    kv_heads = args.kv_heads if args.kv_heads is not None else (
        heads if args.heads is not None else d.get("kv_heads", heads))
    page_size = get("page_size") if entry.paged else (None if every else args.page_size)
    if entry.paged and page_size is None:
        page_size = DEFAULT_PAGE
    return dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=get("head_dim"),
                q_len=get("q_len") or 1, kv_len=kv_len,
                kv_lens=None if kv_lens is None else list(kv_lens), dtype=args.dtype,
                causal=not args.no_causal, page_size=page_size,
                **variant_options(getattr(args, "variant", None),
                                  splits=None if args.splits in (None, "auto") else args.splits,
                                  block_cols=None if every else args.block_cols))


def is_decode(args) -> bool:
    """Whether ``flashsim predict`` is asked about a decode kernel; the flags that are not
    for the kernel asked about are refused either way."""
    decode = args.kernel in decode_kernels()
    check_flags(args, decode, args.kernel)
    return decode


def cli_answer(args) -> str:
    """The text ``flashsim predict`` prints for a decode kernel (or a FlashsimError)."""
    import json

    opts = launch_options(decode_kernels()[args.kernel], args)
    r = predict_decode(args.kernel, gpu=args.gpu, **opts)
    r["variant"] = args.variant
    return json.dumps(r) if args.json else format_prediction(r)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The decode options of flashsim predict and measure (``flashsim.decode``'s readers)."""
    from .decode import add_cli_args

    add_cli_args(p, gqa_schedule=False)
    p.add_argument("--variant", help="a decode kernel's version as benchmarks/decode_h200.py times "
                                     "it (gpu_kernels.cupy.decode.VARIANTS: v1, v2, ...; default: "
                                     "the defaults)")
