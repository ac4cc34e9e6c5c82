"""Attention at inference time: a plan for q_len new query rows against a KV cache.

    p = flashsim.plan("flashdecoding", q_len=1, kv_len=32768, head_dim=128, heads=32,
                      kv_heads=8, batch=1, dtype="fp16", splits="auto", gpu="h200")
    p.count()              # exact requested bytes (``kv_bytes``: the K/V cache read)
    p.closed_form()        # the same from the formulas beside each algorithm
    p.predict()            # seconds per launch, memory-bound time model
    O, rep = p.run(Q, K, V)            # float64 values; Q (B, H, q_len, d),
                                       # K, V (B, kv_heads, capacity, d) padded caches

Algorithms (each a file in ``flashsim/algorithms``; all one loop nest, ``kvcache.py``):
``flash2`` (one launch, no splits; ``gqa_pack`` False: one block per query head),
``flashdecoding`` (``splits`` S or "auto", a combine launch), ``paged`` (``page_size`` P,
a block table; splits as flashdecoding) and ``mla`` (DeepSeek-V3's latent cache).

A ragged batch: ``kv_lens=[100, 3000, ...]`` (one per sequence; ``batch`` must match).
The cache layout for values is PyTorch SDPA's (batch, heads, seq, head_dim), padded to the
longest sequence as flash-attention's ``flash_attn_with_kvcache(..., cache_seqlens=)``;
with pages, K and V are page pools (num_pages, kv_heads, P, d) (FlashInfer's HND) and
``block_table`` (batch, pages) int, the vLLM block table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from . import nest as _nest, reference, validate
from .algorithms import flashdecoding, kvcache, mla
from .errors import FlashsimError, SramOverflowError
from .hardware import timing
from .hardware.presets import DEFAULT_GPU, GPU, gpu as _gpu
from .report import Report, format_report
from .units import DTYPE_BYTES, dtype_bytes

ALGORITHMS = ("flash2", "flashdecoding", "paged", "mla")
DEFAULT_PAGE = 16                 # vLLM's default block size
MAX_SPLITS = flashdecoding.MAX_SPLITS
MAX_Q_LEN = validate.MAX_Q_LEN


class GroupShape:
    """The grouped-query shape of a decode step, for a class with ``heads``, ``kv_heads`` and
    ``q_len`` (the plan here; the decode kernel's launch in ``gpu_kernels``)."""

    @property
    def group(self) -> int:
        """g: query heads per KV head."""
        return self.heads // self.kv_heads

    @property
    def group_rows(self) -> int:
        """G = g q_len: the query rows of one KV head's group."""
        return self.group * self.q_len


@dataclass(frozen=True)
class DecodePlan(GroupShape):
    algorithm: str
    q_len: int
    lens: tuple                   # KV lengths: one when every sequence has it, else each's
    batch: int
    head_dim: int                 # QK dimensions (576 for mla)
    v_dim: int                    # PV dimensions (512 for mla)
    heads: int
    kv_heads: int
    dtype: str
    block_rows: int
    block_cols: int
    splits: int                   # the splits used (1: no split, no combine)
    splits_requested: object      # what was asked: an int or "auto"
    page_size: int | None
    causal: bool
    gpu: GPU | None
    gqa_pack: bool
    shared_kv: bool               # one tensor KV for K and V (mla)
    scale: float
    sram_bytes: int
    placement: str = "registers"
    pass_: str = "fwd"
    extra_passes: tuple = ()
    softmax_rows: int = 0
    fused_combine: bool = False   # the combine run by the split launch's blocks (flashdecoding.py)

    # --- shapes -------------------------------------------------------------------------
    @property
    def kv_lens(self) -> tuple:
        """One KV length per sequence (built on demand: the batch may be large)."""
        return self.lens if len(self.lens) == self.batch else self.lens * self.batch

    @property
    def kv_len(self) -> int:
        return max(self.lens)

    @property
    def seq_len(self) -> int:      # what Report.to_dict calls N: the longest cache
        return self.kv_len

    @property
    def uniform(self) -> bool:
        return len(set(self.lens)) == 1

    @property
    def seqs(self) -> tuple:
        """KV lengths of the sequences the nest holds: one when the batch shares a length."""
        return (self.lens[0],) if self.uniform else self.lens

    @property
    def copies(self) -> int:
        """How many times the nest runs: its leading dimensions (batch x) kv_heads."""
        return self.kv_heads * (self.batch if self.uniform else 1)

    @property
    def elem_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def register_budget(self) -> int | None:
        return None if self.gpu is None else self.gpu.register_bytes_per_block

    # --- the nest and its readers ---------------------------------------------------------
    def nest(self) -> _nest.Nest:
        return self._nest

    @cached_property
    def _nest(self) -> _nest.Nest:
        return kvcache.build(self)

    def working_set(self) -> list:
        return _nest.working_set(self.nest())

    def register_set(self) -> list:
        return _nest.working_set(self.nest(), _nest.REGISTERS)

    def count(self) -> "DecodeReport":
        return self._report(_nest.count(self.nest()))

    def closed_form(self) -> "DecodeReport":
        read, write, flops, exps, other = kvcache.closed_form(self)
        peak = sum(b for _, b in self.working_set())
        regs = sum(b for _, b in self.register_set())
        return self._report(_nest.Counts(read, write, flops, peak, register_peak=regs,
                                         exp_ops=exps, nonmatmul_flops=other))

    def engine_view(self) -> "_EngineView":
        """This plan as the L2 and time models read a plan: ``copies`` heads of one nest."""
        return _EngineView(self)

    def predict(self, efficiency: timing.Efficiency | None = None, l2=None,
                dirty_bytes: int = 0) -> list:
        """Seconds per launch (``timing.predict_memory_bound``), on the preset (h200 if
        none); ``l2``: an L2 report whose DRAM bytes replace the requested bytes;
        ``dirty_bytes``: the L2's dirty lines (another kernel's) when the step starts, which
        its launches write back as they evict them (0: a clean L2)."""
        if efficiency is None and l2 is None and not dirty_bytes:
            return list(self._predicted)
        return self._predict(efficiency, l2, dirty_bytes)

    @cached_property
    def _predicted(self) -> tuple:                 # the default prediction, kept
        return tuple(self._predict(None, None))

    def _predict(self, efficiency, l2, dirty_bytes: int = 0) -> list:
        g = self.gpu or _gpu(DEFAULT_GPU)
        eff = efficiency or timing.Efficiency.for_dtype(self.dtype)
        dirty_bytes = validate.whole(dirty_bytes, "dirty_bytes", lo=0, hi=g.l2_bytes)
        out = timing.predict_memory_bound(self.nest(), self.copies, g, self.dtype, eff, l2,
                                          dirty_bytes)
        if self.fused_combine and len(out) == 2:      # the combine: no launch of its own
            out[1] = replace(out[1], label=out[1].label + ", in the split launch", launched=False)
        return out

    def predict_seconds(self, **kw) -> float:
        return sum(x.seconds for x in self.predict(**kw))

    def occupancy(self) -> list:
        """Thread blocks of each launch on each SM (``timing.sm_loads``): which SMs work."""
        return list(self._occupancy)

    @cached_property
    def _occupancy(self) -> tuple:
        return tuple(timing.sm_loads(self.nest(), self.copies, self.gpu or _gpu(DEFAULT_GPU)))

    def run(self, Q, K, V=None, block_table=None):
        """Values: O (B, H, q_len, d_v) float64 and the report (see the module docstring)."""
        hbm, unpack = _hbm_inputs(self, Q, K, V, block_table)
        lead = next(iter(hbm.values())).shape[:-2]
        for name, t in self.nest().tensors.items():
            if name not in hbm:                       # poisoned: a missed write stays NaN
                hbm[name] = np.full(lead + (t.rows, t.cols), np.nan)
        counts = _nest.execute(self.nest(), hbm, self.gpu.sram_per_block if self.gpu else None,
                               self.register_budget)
        rep = self._report(counts)
        rep.hbm.update(hbm)
        return unpack(hbm), rep

    def reference(self, Q, K, V=None, block_table=None) -> np.ndarray:
        """The float64 answer for the same inputs (``reference.attention_kv``)."""
        Kl, Vl = _logical_cache(self, K, V, block_table)
        Q = np.asarray(Q, dtype=np.float64)
        out = []
        for b, n in enumerate(self.kv_lens):
            out.append(reference.attention_kv(Q[b], Kl[b][:, :n], Vl[b][:, :n],
                                              causal=self.causal, scale=self.scale))
        return np.stack(out)

    def _report(self, c: _nest.Counts) -> "DecodeReport":
        k = self.copies
        per_tensor = {name: {"read_bytes": k * c.read.get(name, 0),
                             "write_bytes": k * c.write.get(name, 0)}
                      for name in dict.fromkeys(list(c.read) + list(c.write))}
        return DecodeReport(self, per_tensor, k * c.flops, c.sram_peak,
                            register_peak_bytes=c.register_peak, exp_ops=k * c.exp_ops,
                            nonmatmul_flops=k * c.nonmatmul_flops)


@dataclass(frozen=True)
class _EngineView:
    """A decode plan as ``l2.simulate`` reads a plan: batch x heads = its copies."""
    plan: DecodePlan

    @property
    def gpu(self):
        return self.plan.gpu

    batch = property(lambda self: self.plan.copies)
    heads = property(lambda self: 1)
    dtype = property(lambda self: self.plan.dtype)

    def nest(self):
        return self.plan.nest()

    def working_set(self):
        return self.plan.working_set()

    def register_set(self):
        return self.plan.register_set()


def kv_tensor(name: str) -> bool:
    """Whether tensor ``name`` is part of the K/V cache (K, V, KV of any sequence)."""
    return name.split("[")[0] in ("K", "V", "KV")


@dataclass
class DecodeReport(Report):
    """A report with the decode fields: K/V cache bytes and the memory-bound time."""

    @property
    def kv_bytes(self) -> int:
        """Bytes of the K/V cache read (requested), all sequences and heads."""
        return sum(t["read_bytes"] for n, t in self.per_tensor.items() if kv_tensor(n))

    @property
    def roofline_time_s(self) -> float | None:
        return Report.predicted_time_s.fget(self)

    @property
    def predicted_time_s(self) -> float | None:
        """The memory-bound time model (waves, per-SM bandwidth, combine, launches), on the
        L2 model's DRAM bytes when it ran."""
        if self.plan.gpu is None:
            return None
        return sum(x.seconds for x in self.plan.predict(l2=self.l2))

    def to_dict(self) -> dict:
        p = self.plan
        d = super().to_dict()
        d.update({"q_len": p.q_len, "kv_len": p.kv_len, "kv_lens": list(p.seqs),
                  "kv_heads": p.kv_heads, "v_dim": p.v_dim, "gqa_pack": p.gqa_pack,
                  "splits": p.splits, "splits_requested": p.splits_requested,
                  "page_size": p.page_size, "kv_bytes": self.kv_bytes})
        if p.gpu is not None:
            launches = p.predict(l2=self.l2)
            d["roofline_time_s"] = self.roofline_time_s
            d["launches"] = [{"label": x.label, "blocks": x.blocks, "seconds": x.seconds,
                              "memory_s": x.dram_s, "compute_s": x.compute_s}
                             for x in launches]
        return d


def format_decode(rep: DecodeReport) -> str:
    """``format_report``'s table under a line that says the decode shape."""
    p = rep.plan
    lens = (f"kv_len={p.kv_len}" if p.uniform else
            "kv_lens=" + ",".join(map(str, p.kv_lens)))
    head = (f"{p.algorithm}  q_len={p.q_len} {lens} d={p.head_dim}"
            f"{'' if p.v_dim == p.head_dim else f' d_v={p.v_dim}'} batch={p.batch} "
            f"heads={p.heads} kv_heads={p.kv_heads} {p.dtype}{' causal' if p.causal else ''}"
            f"  splits={p.splits}{f' page_size={p.page_size}' if p.page_size else ''}"
            f"  {'pack-GQA' if p.gqa_pack else 'one block per query head'}")
    lines = format_report(rep).split("\n")
    lines[0] = head
    extra = [f"{'K/V cache read':<22}{rep.kv_bytes:>25,}"]
    if p.gpu is not None:
        for x in p.predict(l2=rep.l2):
            extra.append(f"  {x.label}: {x.blocks} blocks, {x.seconds * 1e6:.2f} us "
                         f"(memory {x.dram_s * 1e6:.2f}, compute {x.compute_s * 1e6:.2f}, "
                         f"+ fill and drain {x.fill_drain_s * 1e6:.0f}, "
                         f"+ launch {timing.LAUNCH_LATENCY_S * x.launched * 1e6:.0f})")
        extra.append(f"{'predicted time':<22}{rep.predicted_time_s * 1e3:>22.4f} ms")
    return "\n".join(lines + extra)


# --------------------------------------------------------------------------- the plan

def plan(algorithm: str, *, q_len=1, kv_len=None, kv_lens=None, head_dim=None, heads=1,
         kv_heads=None, batch=None, dtype="fp16", splits=None, page_size=None,
         block_rows=None, block_cols=None, causal=True, gpu=None, gqa_pack=True,
         latent_dim=mla.LATENT_DIM, rope_dim=mla.ROPE_DIM, warps=None,
         fused_combine=False) -> DecodePlan:
    """Validate a decode configuration (every argument, before anything is built).

    ``kv_len`` (every sequence) or ``kv_lens`` (one per sequence); ``batch`` defaults to
    their count and must match it. ``kv_heads`` defaults to ``heads`` (MHA); it must divide
    ``heads``. ``causal`` (default True): the q_len rows are the last positions of each
    sequence, so q_len <= kv_len. ``splits``: flashdecoding, paged and mla take an int or
    "auto" (the default: FlashAttention-2's heuristic, flashdecoding.py; for mla
    FlashMLA's one block per SM, S = SMs // (batch x Q tiles) at least 1), flash2 only 1.
    ``page_size``
    (paged; default 16) must divide ``block_cols`` or be a multiple of it. ``gqa_pack``
    False: one block per query head (K/V read g times). B_r = q_len x the heads packed;
    B_c defaults to FlashAttention-2's split-KV rule (kvcache.default_block_cols).
    mla: kv_heads 1, QK over ``latent_dim + rope_dim``, PV over ``latent_dim``;
    ``head_dim`` is then the query-key head dimension before absorption (default 128, it
    sets the softmax scale). ``warps``: warps per block (register budget; mla default 8,
    as FlashMLA's two warpgroups). ``fused_combine`` (flashdecoding, paged): the split
    launch's blocks run the combine themselves once a sequence's splits have all written
    (the decode kernel's v7): the same bytes, one launch less in the time model.
    """
    algorithm = validate.choice(algorithm, list(ALGORITHMS), "algorithm")
    q_len = validate.whole(q_len, "q_len", hi=MAX_Q_LEN)
    if (kv_len is None) == (kv_lens is None):
        raise FlashsimError("give kv_len (every sequence) or kv_lens (one per sequence), "
                            "not " + ("both" if kv_len is not None else "neither"))
    if kv_lens is None:
        n = validate.whole(kv_len, "kv_len", hi=validate.MAX_SEQ_LEN, what="tokens")
        B = 1 if batch is None else validate.whole(batch, "batch", hi=validate.MAX_BATCH)
        lens = (n,)
    else:
        lens = kv_lens_arg(kv_lens)
        B = len(lens)
        if batch is not None and validate.whole(batch, "batch", hi=validate.MAX_BATCH) != B:
            raise FlashsimError(f"kv_lens gives {B} sequences but batch is {batch}; give one "
                                "KV length per sequence")
        if len(set(lens)) == 1:                   # every sequence alike: one nest for all
            lens = lens[:1]
    heads = validate.whole(heads, "heads", hi=validate.MAX_HEADS)
    dtype = validate.choice(dtype, list(DTYPE_BYTES), "dtype")
    causal = validate.flag(causal, "causal")
    gqa_pack = validate.flag(gqa_pack, "gqa_pack")
    fused_combine = validate.flag(fused_combine, "fused_combine")
    if fused_combine and algorithm not in ("flashdecoding", "paged"):
        raise FlashsimError(f"fused_combine: {algorithm} has no combine launch to fuse; "
                            "flashdecoding and paged have")
    is_mla = algorithm == "mla"
    if is_mla:
        if kv_heads not in (None, 1):
            raise FlashsimError(f"kv_heads: mla keeps one latent cache for all heads "
                                f"(kv_heads 1), got {validate.show(kv_heads)}")
        kvh = 1
        latent = validate.whole(latent_dim, "latent_dim", hi=validate.MAX_HEAD_DIM)
        rope = validate.whole(rope_dim, "rope_dim", lo=0, hi=validate.MAX_HEAD_DIM)
        nope = mla.NOPE_DIM if head_dim is None else validate.whole(
            head_dim, "head_dim", hi=validate.MAX_HEAD_DIM)
        d, dv = mla.dims(latent, rope)
        scale = mla.scale(nope, rope)
        gqa_pack = True
    else:
        if head_dim is None:
            raise FlashsimError("head_dim: give the head dimension d")
        d = dv = validate.whole(head_dim, "head_dim", hi=validate.MAX_HEAD_DIM)
        kvh = heads if kv_heads is None else validate.whole(kv_heads, "kv_heads",
                                                             hi=validate.MAX_HEADS)
        scale = 1.0 / math.sqrt(d)
    if heads % kvh:
        raise FlashsimError(f"heads ({heads}) must be a multiple of kv_heads ({kvh}): each "
                            "KV head serves a whole group of query heads")
    if causal and q_len > min(lens):
        raise FlashsimError(f"q_len ({q_len}) is more than the shortest KV length "
                            f"({min(lens)}): under a causal mask the new rows are the "
                            "last of their sequence, so q_len <= kv_len")
    # splits
    if splits is None:
        splits = 1 if algorithm == "flash2" else "auto"
    if isinstance(splits, str) and splits.lower() == "auto":
        splits = "auto"
    else:
        splits = validate.whole(splits, "splits", hi=MAX_SPLITS)
    if algorithm == "flash2" and splits != 1:
        raise FlashsimError("splits: flash2 runs one block per Q tile over the whole cache; "
                            "use -a flashdecoding for split-KV")
    # pages
    if algorithm == "paged" and page_size is None:
        page_size = DEFAULT_PAGE
    if page_size is not None:
        page_size = validate.whole(page_size, "page_size", hi=validate.MAX_SEQ_LEN)
    preset = _gpu(DEFAULT_GPU if gpu is None else gpu)
    if warps is None and is_mla:
        warps = 8
    if warps is not None:
        preset = replace(preset, warps_per_block=validate.whole(warps, "warps", hi=32))
    g = heads // kvh
    h = kvcache.pack_heads(g, q_len, gqa_pack)
    Br = q_len * h
    if block_rows is not None:
        Br = validate.whole(block_rows, "block_rows", hi=validate.MAX_SEQ_LEN)
        if (g * q_len) % Br or Br % q_len:
            raise FlashsimError(f"block_rows ({Br}) must be a multiple of q_len ({q_len}) "
                                f"that divides the group's rows g x q_len = {g * q_len}")
    Bc = kvcache.default_block_cols(dv if is_mla else d) if block_cols is None else \
        validate.whole(block_cols, "block_cols", hi=validate.MAX_SEQ_LEN)
    if page_size is not None and Bc % page_size and page_size % Bc:
        raise FlashsimError(f"page_size ({page_size}) must divide block_cols ({Bc}) or be a "
                            "multiple of it: a K/V tile covers whole pages or lies in one")
    if -(-max(lens) // Bc) > validate.MAX_TILES:
        raise FlashsimError(f"block_cols ({Bc}) cuts kv_len {max(lens):,} into more than "
                            f"{validate.MAX_TILES:,} tiles")
    if splits == "auto":
        tiles = -(-max(lens) // Bc)
        blocks = B * kvh * (g * q_len // Br)
        if algorithm == "flash2":
            S = 1
        elif is_mla:                 # FlashMLA: one block per SM, the tiles shared out
            S = max(1, min(tiles, preset.sms // blocks))
        else:
            S = num_splits_auto(blocks, preset, tiles)
    else:
        S = splits
    per_kv_head = sum((g * q_len // Br) * kvcache.split_geometry(n, Bc, S)[2]
                      for n in lens)
    if per_kv_head > validate.MAX_DECODE_BLOCKS:
        raise FlashsimError(
            f"the launch would have {per_kv_head:,} thread blocks per KV head (sequences x "
            f"splits x Q tiles of {Br} rows), more than the {validate.MAX_DECODE_BLOCKS:,} "
            "the model steps through; use fewer query heads per KV head, a shorter q_len "
            "or fewer splits")
    p = DecodePlan(algorithm, q_len, lens, B, d, dv, heads, kvh, dtype, Br, Bc, S, splits,
                   page_size, causal, preset, gqa_pack,
                   is_mla, scale, preset.sram_per_block, fused_combine=fused_combine)
    _check_fits(p)
    return p


def num_splits_auto(blocks: int, g: GPU, tiles: int) -> int:
    """FlashAttention-2's heuristic on preset ``g`` (flashdecoding.num_splits_heuristic)."""
    return flashdecoding.num_splits_heuristic(blocks, g.sms * flashdecoding.BLOCKS_PER_SM,
                                              tiles)


def kv_lens_arg(value) -> tuple:
    """``kv_lens``: a list of positive whole numbers, or a comma-separated string."""
    if isinstance(value, str):
        parts = [s.strip() for s in value.split(",")]
    elif isinstance(value, (list, tuple, np.ndarray)):
        parts = list(value)
    else:
        raise FlashsimError(f"kv_lens must be a list of KV lengths, got {validate.show(value)}")
    if not parts or len(parts) > validate.MAX_SEQUENCES:
        raise FlashsimError(f"kv_lens: give 1 to {validate.MAX_SEQUENCES:,} KV lengths, one "
                            "per sequence")
    return tuple(validate.whole(x.item() if isinstance(x, np.generic) else x, "kv_lens",
                                hi=validate.MAX_SEQ_LEN, what="tokens") for x in parts)


def _check_fits(p: DecodePlan) -> None:
    """Shared memory and registers of one block against the preset's; one error."""
    for level, bufs, limit in (("shared memory", p.working_set(), p.sram_bytes),
                               ("registers", p.register_set(), p.register_budget)):
        need = sum(b for _, b in bufs)
        if need > limit:
            raise SramOverflowError(
                f"{p.algorithm} with B_r={p.block_rows}, B_c={p.block_cols} needs {need} B of "
                f"{level} (" + " + ".join(f"{n} {b}" for n, b in bufs) + f") but a block "
                f"holds {limit} B; use smaller block_cols or block_rows")


# ----------------------------------------------------------------------------- values

def _array(x, name: str, ndim: int) -> np.ndarray:
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):
        raise FlashsimError(f"{name} is not an array") from None
    if a.dtype.kind not in "fiu":
        raise FlashsimError(f"{name} must hold real numbers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise FlashsimError(f"{name} has shape {a.shape}; expected {ndim} dimensions")
    return a.astype(np.float64)


def check_block_table(table, kv_lens, page_size: int, num_pages: int) -> np.ndarray:
    """The pages each sequence uses must lie in the pool and none may be shared."""
    try:
        t = np.asarray(table)
    except (ValueError, TypeError):
        raise FlashsimError("block_table is not an array") from None
    if t.dtype.kind not in "iu" or t.ndim != 2 or t.shape[0] != len(kv_lens):
        raise FlashsimError(f"block_table must be integers of shape (batch={len(kv_lens)}, "
                            f"pages), got {t.dtype} {t.shape}")
    used = []
    for b, n in enumerate(kv_lens):
        need = -(-n // page_size)
        if t.shape[1] < need:
            raise FlashsimError(f"block_table row {b} has {t.shape[1]} pages; sequence {b} "
                                f"({n} tokens) needs {need} of {page_size}")
        row = t[b, :need]
        bad = row[(row < 0) | (row >= num_pages)]
        if bad.size:
            raise FlashsimError(f"block_table[{b}] points to page {int(bad[0])}, past the "
                                f"cache of {num_pages} pages")
        used.append(row)
    allp = np.concatenate(used)
    if len(np.unique(allp)) != len(allp):
        vals, counts = np.unique(allp, return_counts=True)
        raise FlashsimError(f"block_table uses page {int(vals[counts > 1][0])} more than "
                            "once: every token needs its own slot")
    return t


def _logical_cache(p: DecodePlan, K, V, block_table):
    """Per sequence (kv_heads, n_b, d) K and V in logical order (pages gathered)."""
    B, kvh = p.batch, p.kv_heads
    if p.shared_kv:
        if V is not None:
            raise FlashsimError("mla reads one latent cache: pass it as K, and V=None")
    elif V is None:
        raise FlashsimError("V is missing: run(Q, K, V)")
    if p.page_size:
        if block_table is None:
            raise FlashsimError("a paged plan needs block_table (batch, pages)")
        pools = [_array(K, "K", 4)] + ([] if p.shared_kv else [_array(V, "V", 4)])
        for name, a in zip("KV", pools):
            want = (kvh, p.page_size, (p.head_dim if name == "K" else p.v_dim))
            if a.shape[1:] != want:
                raise FlashsimError(f"{name} pages have shape {a.shape}; expected "
                                    f"(num_pages, {want[0]}, {want[1]}, {want[2]})")
            if not np.isfinite(a).all():
                raise FlashsimError(f"{name} cache contains NaN or Inf")
        t = check_block_table(block_table, p.kv_lens, p.page_size, pools[0].shape[0])
        seqs = []                                   # per array, per sequence
        for a in pools:
            seqs.append([])
            for b, n in enumerate(p.kv_lens):
                pages = a[t[b, :-(-n // p.page_size)]]                # (np, kvh, P, d)
                seqs[-1].append(pages.transpose(1, 0, 2, 3).reshape(kvh, -1, a.shape[-1])[:, :n])
    else:
        if block_table is not None:
            raise FlashsimError("block_table is for a paged plan (page_size)")
        arrays = [_array(K, "K", 4)] + ([] if p.shared_kv else [_array(V, "V", 4)])
        for name, a in zip("KV", arrays):
            width = p.head_dim if name == "K" else p.v_dim
            if a.shape[0] != B or a.shape[1] != kvh or a.shape[3] != width or a.shape[2] < p.kv_len:
                raise FlashsimError(f"{name} has shape {a.shape}; expected ({B}, {kvh}, "
                                    f"capacity >= {p.kv_len}, {width})")
            for b, n in enumerate(p.kv_lens):
                if not np.isfinite(a[b, :, :n]).all():
                    raise FlashsimError(f"{name} cache contains NaN or Inf (sequence {b})")
        seqs = [[a[b, :, :n] for b, n in enumerate(p.kv_lens)] for a in arrays]
    if p.shared_kv:                                 # V is the latent part of the one cache
        return seqs[0], [k[..., :p.v_dim] for k in seqs[0]]
    return seqs[0], seqs[1]


def _hbm_inputs(p: DecodePlan, Q, K, V, block_table):
    """HBM tensors of the nest from (Q, K, V) and the function that unpacks O."""
    B, H, q, kvh, G = p.batch, p.heads, p.q_len, p.kv_heads, p.group_rows
    Q = _array(Q, "Q", 4)
    if Q.shape != (B, H, q, p.head_dim):
        raise FlashsimError(f"Q has shape {Q.shape}; expected ({B}, {H}, {q}, {p.head_dim})")
    if not np.isfinite(Q).all():
        raise FlashsimError("Q contains NaN or Inf")
    Kl, Vl = _logical_cache(p, K, V, block_table)
    Qg = Q.reshape(B, kvh, G, p.head_dim)               # head-major rows of each group
    hbm = {}
    if p.uniform:
        hbm["Q"] = Qg
        if p.shared_kv:
            hbm["KV"] = np.stack(Kl)
        else:
            hbm["K"], hbm["V"] = np.stack(Kl), np.stack(Vl)
    else:
        for b in range(B):
            x = f"[{b}]"
            hbm["Q" + x] = Qg[b]
            if p.shared_kv:
                hbm["KV" + x] = Kl[b]
            else:
                hbm["K" + x], hbm["V" + x] = Kl[b], Vl[b]
    if p.page_size:                              # the table's values: counted, not used
        t = np.asarray(block_table).astype(np.float64)
        pages = -(-p.kv_len // p.page_size)
        if p.uniform:                                         # (B, kv_heads, pages, 1)
            hbm["block_table"] = np.repeat(t[:, None, :pages, None], kvh, axis=1)
        else:
            for b, n in enumerate(p.kv_lens):
                rows = t[b, :-(-n // p.page_size), None]
                hbm[f"block_table[{b}]"] = np.repeat(rows[None], kvh, axis=0)

    def unpack(h):
        if p.uniform:
            return h["O"].reshape(B, H, q, p.v_dim)
        return np.stack([h[f"O[{b}]"].reshape(H, q, p.v_dim) for b in range(B)])
    return hbm, unpack


# -------------------------------------------------------------------------------- CLI

_DECODE_OPTIONS = ("q_len", "kv_len", "kv_lens", "kv_heads", "splits", "page_size",
                   "gqa_schedule", "no_causal")


def add_cli_args(p, gqa_schedule: bool = True) -> None:
    """The decode options of ``flashsim io`` (read as the API reads them); ``flashsim
    predict`` and ``measure`` take them too, but for ``--gqa-schedule`` (the decode kernel
    always packs a KV head's query rows)."""
    def reader(check):
        def read(text):
            import argparse
            try:
                return check(text)
            except FlashsimError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return read
    whole = lambda name, hi: reader(lambda t: validate.whole(t, "", hi=hi))  # noqa: E731
    p.add_argument("--q-len", type=whole("q_len", MAX_Q_LEN),
                   help="decoding: new query rows per sequence (with --kv-len or --kv-lens "
                        "in place of --seq-len)")
    p.add_argument("--kv-len", type=whole("kv_len", validate.MAX_SEQ_LEN),
                   help="decoding: cached keys per sequence")
    p.add_argument("--kv-lens", type=reader(kv_lens_arg),
                   help="decoding, a ragged batch: one KV length per sequence, e.g. 100,3000")
    p.add_argument("--kv-heads", type=whole("kv_heads", validate.MAX_HEADS),
                   help="decoding: KV heads (GQA; 1 = MQA; default --heads)")
    p.add_argument("--splits", type=reader(
        lambda t: "auto" if t.lower() == "auto" else validate.whole(t, "", hi=MAX_SPLITS)),
        help="flashdecoding, paged, mla: split the KV length over S blocks, or auto "
             "(FlashAttention-2's heuristic; the default)")
    p.add_argument("--page-size", type=reader(
        lambda t: validate.whole(t, "", hi=validate.MAX_SEQ_LEN)),
        help=f"paged: tokens per page (default {DEFAULT_PAGE})")
    if gqa_schedule:
        p.add_argument("--gqa-schedule", type=reader(
            lambda t: validate.choice(t, ["pack", "per-head"], "")),
            help="decoding: pack (a KV head's query rows in one tile, the default) or "
                 "per-head (one block per query head: K/V read once per query head)")
    p.add_argument("--no-causal", action="store_true",
                   help="decoding: no causal mask (by default the new rows are the last "
                        "positions and see the keys before them)")


def is_decode_cli(args) -> bool:
    """Whether ``flashsim io`` is asked a decode question; a decode option without one
    is refused."""
    if args.algorithm in ALGORITHMS[1:] or any(getattr(args, k) is not None
                                               for k in ("q_len", "kv_len", "kv_lens")):
        return True
    given = [k for k in _DECODE_OPTIONS if getattr(args, k) not in (None, False)]
    if given:
        raise FlashsimError(f"--{given[0].replace('_', '-')} is a decode option: give "
                            "--q-len and --kv-len (or --kv-lens)")
    return False


def cli_answer(args) -> str:
    """The text ``flashsim io`` prints for a decode plan (or a FlashsimError)."""
    import json
    from .hardware import l2
    from .hardware.l2_lockstep import Budget
    refused = [("--seq-len", args.seq_len is not None), ("--sram", args.sram is not None),
               ("--pass", args.pass_ != "fwd"), ("--extra-passes", bool(args.extra_passes)),
               ("--devices", args.devices is not None), ("--schedule", args.schedule is not None),
               ("--placement two-level", args.placement == "two-level"),
               ("--l2", args.l2 is not None)]          # --causal: already the default
    for option, bad in refused:
        if bad:
            raise FlashsimError(f"{option} is not for a decode plan (--q-len, --kv-len or "
                                "--kv-lens; a GPU preset's shared memory and L2)")
    if args.causal and args.no_causal:
        raise FlashsimError("--causal and --no-causal contradict each other")
    p = plan(args.algorithm, q_len=1 if args.q_len is None else args.q_len,
             kv_len=args.kv_len, kv_lens=args.kv_lens, head_dim=args.head_dim,
             heads=args.heads, kv_heads=args.kv_heads,
             batch=None if args.batch == 1 and args.kv_lens is not None else args.batch,
             dtype=args.dtype, splits=args.splits, page_size=args.page_size,
             block_rows=args.block_rows, block_cols=args.block_cols,
             causal=not args.no_causal, gpu=args.gpu,
             gqa_pack=args.gqa_schedule != "per-head")
    if args.verify:
        rep, err = verify(p, args.seed)
        rep.max_abs_error = err
    else:
        rep = p.count()
    notes = []
    try:
        rep.l2 = l2.simulate(p.engine_view(), blocks_per_sm=args.blocks_per_sm,
                             budget=Budget(l2.WORK_LIMIT))
    except FlashsimError as e:
        notes.append(f"DRAM bytes left out (the L2 model would exceed its limit): {e}")
    if args.json:
        return json.dumps({**rep.to_dict(), **({"notes": notes} if notes else {})})
    return "\n".join([format_decode(rep)] + notes)


def random_inputs(p: DecodePlan, seed: int = 0):
    """(Q, K, V, block_table) of random normal values; pages of a paged plan shuffled
    through the pool (a pool of the pages needed plus a few unused)."""
    rng = np.random.default_rng(seed)
    B, kvh = p.batch, p.kv_heads
    Q = rng.standard_normal((B, p.heads, p.q_len, p.head_dim))
    if not p.page_size:
        K = rng.standard_normal((B, kvh, p.kv_len, p.head_dim))
        V = None if p.shared_kv else rng.standard_normal((B, kvh, p.kv_len, p.v_dim))
        return Q, K, V, None
    P = p.page_size
    need = [-(-n // P) for n in p.kv_lens]
    pool = sum(need) + 2
    K = rng.standard_normal((pool, kvh, P, p.head_dim))
    V = None if p.shared_kv else rng.standard_normal((pool, kvh, P, p.v_dim))
    order = rng.permutation(pool)
    table = np.zeros((B, max(need)), dtype=np.int32)
    start = 0
    for b, k in enumerate(need):
        table[b, :k] = order[start:start + k]
        start += k
    return Q, K, V, table


def verify(p: DecodePlan, seed: int = 0) -> tuple:
    """(report, max |O - O_ref|) on random inputs, refused first past --verify's limits."""
    counted = _nest.count(p.nest())
    if counted.transfers > validate.VERIFY_MAX_TRANSFERS:
        raise FlashsimError(f"--verify would step through {counted.transfers:,} tile loads "
                            f"and stores with values, more than the limit of "
                            f"{validate.VERIFY_MAX_TRANSFERS:,}; use larger blocks or a "
                            "shorter cache, or leave out --verify")
    flops = 2 * p.copies * counted.flops
    if flops > validate.VERIFY_MAX_FLOPS:
        raise FlashsimError(f"--verify would compute {flops:,} float64 FLOPs, more than the "
                            f"limit of {validate.VERIFY_MAX_FLOPS:,}; leave out --verify")
    cache = p.batch * p.kv_heads * p.kv_len * (p.head_dim + p.v_dim)
    need = 8 * (3 * cache + 4 * p.batch * p.heads * p.q_len * (p.head_dim + p.v_dim)
                + 2 * p.batch * p.heads * p.q_len * p.kv_len)
    allowed = int(validate.VERIFY_MEMORY_SHARE * validate.memory_allowance())
    if need > allowed:
        raise FlashsimError(f"--verify needs about {need:,} B for its float64 arrays but "
                            f"this process may use {allowed:,} B; leave out --verify")
    Q, K, V, table = random_inputs(p, seed)
    O, rep = p.run(Q, K, V, block_table=table)
    err = float(np.max(np.abs(O - p.reference(Q, K, V, block_table=table))))
    rep.hbm.clear()
    return rep, err
