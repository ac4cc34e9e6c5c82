"""A plan: one algorithm, one shape, one SRAM size, validated; and the report it produces.

    p = flashsim.plan("flash2", seq_len=4096, head_dim=64, gpu="h200")
    p.count()            # exact traffic SRAM asks of the level below, no arithmetic
    O, rep = p.run(Q, K, V)   # real float64 values, and the same counts
    p.closed_form()      # the same numbers from the formulas beside each algorithm

    b = flashsim.plan("flash2", seq_len=4096, head_dim=64, pass_="bwd")  # or "fwd+bwd"
    (dQ, dK, dV), rep = b.run(Q, K, V, dO=dO)  # gradients; the forward's O, L are inputs

Where buffers live (``placement``). ``"two-level"`` is the paper's model: every buffer in one
SRAM of M bytes, the rule Theorem 2 is about. ``"registers"`` places them as real kernels
do: the tiles loaded from HBM in shared memory (M bytes a block), the S_ij tile, fp32
accumulators and statistics in registers (the preset's register budget a block); see each
algorithm's ``REGISTERS``. A GPU preset's M (no ``sram`` given) means the GPU: placement
"registers"; an ``sram`` without a ``gpu`` means the paper's SRAM: "two-level".
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

import numpy as np

from . import nest as _nest
from .algorithms import ALGORITHMS, BACKWARD, standard
from .algorithms._common import PLACEMENTS
from .errors import FlashsimError, SramOverflowError
from .hardware.presets import DEFAULT_GPU, GPU, gpu as _gpu, roofline_time
from .report import Report
from . import masks as _masks, validate
from .units import DTYPE_BYTES, dtype_bytes

# What a plan runs: the forward, the backward (the forward's saved tensors are its inputs),
# or both, one after the other, their traffic added tensor by tensor.
PASSES = ("fwd", "bwd", "fwd+bwd")


class Gradients(NamedTuple):
    """What a plan with a backward pass returns: each (..., N, d), float64."""
    dQ: np.ndarray
    dK: np.ndarray
    dV: np.ndarray


@dataclass(frozen=True)
class Plan:
    algorithm: str
    seq_len: int
    head_dim: int
    batch: int
    heads: int
    dtype: str
    sram_bytes: int
    block_rows: int
    block_cols: int
    causal: bool
    extra_passes: tuple
    gpu: GPU | None
    softmax_rows: int = 0          # standard only: whole rows of S per softmax block
    pass_: str = "fwd"             # "fwd", "bwd" or "fwd+bwd"
    placement: str = "two-level"   # "two-level" (all in SRAM) or "registers" (as kernels)
    mask: object = None            # a flashsim.masks.Mask, or None (see ``causal`` too)
    dropout: float = 0.0           # dropout probability p on P, 0 <= p < 1
    dropout_seed: int = 0          # the seed its random numbers are regenerated from
    kv_launches: bool = False      # flash1 only: one launch per K/V block (its version 2)

    @property
    def register_budget(self) -> int | None:
        """Bytes of registers one block may hold (the preset's), or None in the two-level
        model, where registers are not a level."""
        if self.placement != "registers":
            return None
        return self.gpu.register_bytes_per_block

    @property
    def elem_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def module(self):
        return ALGORITHMS[self.algorithm]

    @property
    def modules(self) -> tuple:
        """The algorithm modules this plan runs, in order."""
        fwd, bwd = ALGORITHMS[self.algorithm], BACKWARD[self.algorithm]
        return {"fwd": (fwd,), "bwd": (bwd,), "fwd+bwd": (fwd, bwd)}[self.pass_]

    def nest(self) -> _nest.Nest:
        """The loop nest: the one description of this algorithm's schedule. For fwd+bwd,
        the forward's ops then the backward's, over the union of their tensors."""
        nests = [m.build(self) for m in self.modules]
        if len(nests) == 1:
            return nests[0]
        return _nest.Nest({k: v for n in nests for k, v in n.tensors.items()},
                          tuple(op for n in nests for op in n.body))

    def working_set(self) -> list[tuple[str, int]]:
        """Shared-memory buffers (all of SRAM in the two-level model) resident at the peak,
        with their bytes: what must fit in M."""
        return list(self._working_set)

    def register_set(self) -> list[tuple[str, int]]:
        """Register buffers resident at the register peak, with their bytes (empty in the
        two-level model): what must fit in ``register_budget``."""
        return list(self._register_set)

    @cached_property
    def _working_set(self) -> tuple:
        return tuple(_nest.working_set(self.nest()))

    @cached_property
    def _register_set(self) -> tuple:
        return tuple(_nest.working_set(self.nest(), _nest.REGISTERS))

    def count(self) -> "Report":
        """Exact traffic without values (innermost loops summed with NumPy)."""
        return self._report(_nest.count(self.nest()))

    def closed_form(self) -> "Report":
        """The same report from the closed-form formulas (SRAM peak from the working set)."""
        read, write, flops, exps, nonmatmul = {}, {}, 0, 0, 0
        for module in self.modules:        # fwd+bwd: the two passes' counts added
            r, w, f = module.closed_form(self)
            for name in r:
                read[name] = read.get(name, 0) + r[name]
                write[name] = write.get(name, 0) + w[name]
            flops += f
            e, n = module.closed_form_nonmatmul(self)
            exps, nonmatmul = exps + e, nonmatmul + n
        peak = sum(b for _, b in self.working_set())
        registers = sum(b for _, b in self.register_set())
        return self._report(_nest.Counts(read, write, flops, peak, register_peak=registers,
                                         exp_ops=exps, nonmatmul_flops=nonmatmul))

    def run(self, Q, K, V, dO=None) -> tuple:
        """Run with values. Q, K, V: (..., N, d) with N = seq_len, d = head_dim; the leading
        dimensions are independent heads. Returns O (..., N, d) in float64 and the report;
        every intermediate the algorithm writes to HBM is in ``report.hbm``.

        With a backward pass, ``dO`` (..., N, d) is the gradient of the output and the
        result is ``Gradients(dQ, dK, dV)`` with the report (O is ``report.hbm["O"]``).
        For ``bwd`` the forward runs first, uncounted, to put its saved tensors in HBM."""
        backward = self.pass_ != "fwd"
        if backward and dO is None:
            raise FlashsimError(f"a plan with pass {self.pass_!r} needs dO, the output's "
                                "gradient: run(Q, K, V, dO=dO)")
        if not backward and dO is not None:
            raise FlashsimError("dO is for a plan with a backward pass: plan(..., "
                                "pass_='bwd') or pass_='fwd+bwd'")
        arrays = _check_inputs(self.seq_len, self.head_dim, Q=Q, K=K, V=V,
                               **({"dO": dO} if backward else {}))
        Q = arrays["Q"]
        if int(np.prod(Q.shape[:-2])) != self.batch * self.heads:
            raise FlashsimError(
                f"inputs hold {int(np.prod(Q.shape[:-2]))} heads (shape {Q.shape}) but the "
                f"plan has batch x heads = {self.batch * self.heads}")
        hbm = dict(arrays)
        if self.mask is not None and self.algorithm == "standard":   # the baseline reads it
            hbm["mask"] = np.broadcast_to(
                self.mask.dense(self.block_rows, self.block_cols).astype(np.float64),
                Q.shape[:-2] + (self.seq_len, self.seq_len))
        if self.pass_ == "bwd":
            _execute(self.module.build(self), hbm, self.sram_bytes,    # saved tensors only
                     self.register_budget)
        counts = _execute(self.nest(), hbm, self.sram_bytes, self.register_budget)
        report = self._report(counts)
        report.hbm.update(hbm)
        if backward:
            return Gradients(hbm["dQ"], hbm["dK"], hbm["dV"]), report
        return hbm["O"], report

    def saved_for_backward(self) -> dict:
        """{tensor: bytes}, over batch x heads: what the forward writes to HBM and the
        backward reads back, i.e. what must stay in memory between the two passes (besides
        Q, K, V). Read from the two loop nests' counts, so it cannot disagree with them."""
        fwd, bwd = (replace(self, pass_=pass_) for pass_ in ("fwd", "bwd"))
        wrote, read = _nest.count(fwd.nest()).write, _nest.count(bwd.nest()).read
        heads = self.batch * self.heads
        return {name: heads * t.rows * t.cols * t.elem_bytes
                for name, t in bwd.nest().tensors.items()
                if wrote.get(name, 0) and read.get(name, 0)}

    def trace(self) -> list[dict]:
        """Every load, store and compute in order, as plain records (for pictures). A
        buffer's ``level`` is "smem" or "registers"; an allocation's ``bytes`` are what it
        takes on chip, a load's or store's what crosses from or to HBM."""
        out = []
        for step in _nest.walk(self.nest()):
            op = step.op
            if isinstance(op, (_nest.Load, _nest.Store, _nest.Alloc, _nest.Compute)):
                out.append({
                    "op": type(op).__name__.lower(), "buf": getattr(op, "buf", None),
                    "tensor": getattr(op, "tensor", None), "name": getattr(op, "name", None),
                    "level": getattr(op, "level", None),
                    "rows": step.rows, "cols": step.cols, "bytes": step.nbytes,
                    "blocks": dict(step.ctx.idx),
                })
            elif step.freed:
                out.append({"op": "free", "bufs": step.freed, "blocks": dict(step.ctx.idx)})
        return out

    def _report(self, c: _nest.Counts) -> "Report":
        heads = self.batch * self.heads
        per_tensor = {name: {"read_bytes": heads * c.read.get(name, 0),
                             "write_bytes": heads * c.write.get(name, 0)}
                      for name in dict.fromkeys(list(c.read) + list(c.write))}
        return Report(self, per_tensor, heads * c.flops, c.sram_peak,
                      register_peak_bytes=c.register_peak,
                      exp_ops=heads * c.exp_ops, nonmatmul_flops=heads * c.nonmatmul_flops)


def plan(algorithm: str, seq_len: int | None = None, head_dim: int | None = None, *,
         batch: int | None = None, heads: int = 1,
         dtype: str | None = None, sram: int | str | None = None, gpu: str | None = None,
         block_rows: int | None = None, block_cols: int | None = None,
         causal: bool | None = None,
         extra_passes=(), pass_: str = "fwd", placement: str | None = None,
         warps: int | None = None, mask=None, dropout: float = 0.0,
         dropout_seed: int = 0, kv_launches: bool = False, **decode_args) -> Plan:
    """Validate a configuration and choose block sizes.

    Decoding (``flashsim.decode``): algorithm ``flashdecoding``, ``paged`` or ``mla``, or
    ``flash2`` with ``q_len``/``kv_len`` (or ``kv_lens``), takes the decode arguments
    (``q_len, kv_len, kv_lens, kv_heads, splits, page_size, gqa_pack, ...``) and returns
    a ``flashsim.decode.DecodePlan`` (causal by default there; see ``docs/decode.md``).

    ``pass_`` is ``"fwd"`` (the forward), ``"bwd"`` (the backward alone: the forward's saved
    tensors, such as P or O and L, are its inputs in HBM) or ``"fwd+bwd"`` (both, their
    traffic added tensor by tensor). Both passes of a plan use the same tiles; with a
    backward pass the default blocks follow the backward's rule, whose working set is the
    larger (with registers: the largest tiles that fit both passes).

    M (``sram``, bytes or a size such as ``"100KiB"``) comes from ``sram`` if given, else
    from the ``gpu`` preset (default ``"h200"`` when neither is given).

    ``placement`` (see the module docstring) defaults to ``"registers"`` when a GPU preset
    applies (``gpu`` given, or neither ``gpu`` nor ``sram``) and to ``"two-level"`` when only
    ``sram`` is: the paper's model, whose block rules Theorem 2 is about. Block sizes
    default, in the two-level model, to each algorithm's rule (see its module); with
    registers, to :func:`placed_blocks`: the largest square tiles (multiples of 16) whose
    shared part fits M and whose register part fits the preset's register budget (standard
    attention: its fixed 64 x 64 matmul tile, halved until it fits). Where that rule finds
    no tile that fits, the largest square tile that fits is taken, so a plan is refused
    only when not even 1 x 1 blocks fit. A given ``block_rows``/``block_cols`` larger than
    N is capped at N, and a plan that overflows either level raises SramOverflowError with
    the breakdown.

    ``mask``: a spec (``"causal"``, ``"sliding:W"``, ``"document:L1,L2[:causal]"``,
    ``"prefix:P"``, ``"padding:V"``, ``"blocksparse:DENSITY:SEED"``) or a
    :class:`flashsim.masks.Mask` (FlashMask's vectors); flash2 skips the tiles it hides,
    standard attention reads it as a dense N x N boolean (``flashsim/masks.py``). ``dropout``
    p in [0, 1) with ``dropout_seed``: standard attention runs a separate pass that stores
    its keep mask, flash2 regenerates the random numbers (``docs/masks.md``).

    ``kv_launches`` (flash1 only) runs FlashAttention's j loop as one kernel launch per K/V
    block, thread blocks over (Q block i, head), each loading K_j and V_j itself (version 2
    of ``flashsim/algorithms/flash1.py``, the numba kernel's schedule) in place of one
    thread block per head; the tiles are chosen as without it.

    ``warps`` (warps per block, 1 to 32) sets the register budget of a kernel whose blocks
    are larger than the preset's ``warps_per_block`` (4, as FlashAttention-2's forward).

    Names (algorithm, dtype, gpu, pass, extra passes, placement) are case-insensitive;
    every argument is checked, with the limits in :mod:`flashsim.validate`, before anything
    is built.
    """
    from . import decode
    if decode_args or (isinstance(algorithm, str) and algorithm.lower() in decode.ALGORITHMS
                       and algorithm.lower() != "flash2"):
        if seq_len is not None or sram is not None or extra_passes or pass_ != "fwd" \
                or placement not in (None, "registers") or mask is not None or dropout:
            raise FlashsimError("a decode plan takes q_len and kv_len (or kv_lens) in place "
                                "of seq_len, a GPU preset in place of sram, and the forward "
                                "pass only (no mask or dropout)")
        given = {"batch": batch, "dtype": dtype, "causal": causal}   # None: decode's default
        return decode.plan(algorithm, head_dim=head_dim, heads=heads, gpu=gpu,
                           block_rows=block_rows, block_cols=block_cols, warps=warps,
                           **{k: v for k, v in given.items() if v is not None}, **decode_args)
    batch = 1 if batch is None else batch             # the defaults of a prefill plan
    dtype = "fp32" if dtype is None else dtype
    causal = False if causal is None else causal
    algorithm = validate.choice(algorithm, list(ALGORITHMS), "algorithm")
    N = validate.whole(seq_len, "seq_len", hi=validate.MAX_SEQ_LEN, what="tokens")
    d = validate.whole(head_dim, "head_dim", hi=validate.MAX_HEAD_DIM)
    batch = validate.whole(batch, "batch", hi=validate.MAX_BATCH)
    heads = validate.whole(heads, "heads", hi=validate.MAX_HEADS)
    dtype = validate.choice(dtype, list(DTYPE_BYTES), "dtype")
    b = dtype_bytes(dtype)
    preset = _gpu(gpu) if gpu is not None else (_gpu(DEFAULT_GPU) if sram is None else None)
    M = validate.size(sram, "sram") if sram is not None else preset.sram_per_block
    if placement is None:
        placement = "two-level" if preset is None else "registers"
    placement = validate.choice(placement, PLACEMENTS, "placement")
    if placement == "registers" and preset is None:
        raise FlashsimError("placement 'registers' needs a GPU preset for its register "
                            "file: pass gpu=... (flashsim gpus lists them)")
    if warps is not None:
        warps = validate.whole(warps, "warps", hi=32)
        if preset is None:
            raise FlashsimError("warps sets the register budget: it needs a GPU preset")
        preset = replace(preset, warps_per_block=warps)
    R = preset.register_bytes_per_block if placement == "registers" else None
    causal = validate.flag(causal, "causal")
    passes = validate.names(extra_passes, standard.PASSES, "extra_passes")
    passes = standard.check_passes(passes)
    if passes and algorithm != "standard":
        raise FlashsimError(
            f"extra passes ({','.join(passes)}) are for standard attention; "
            f"{algorithm} fuses scaling and masking")
    pass_ = validate.choice(pass_, PASSES, "pass_")
    if validate.flag(kv_launches, "kv_launches") and algorithm != "flash1":
        raise FlashsimError(f"kv_launches (one launch per K/V block) is flash1's schedule, "
                            f"not {algorithm}'s")
    mask, dropout, dropout_seed = _masks.check(algorithm, N, causal, mask, dropout,
                                               dropout_seed)
    fixed = [None if x is None else validate.tiles(
        N, validate.whole(x, name, hi=validate.MAX_SEQ_LEN), name)
        for x, name in ((block_rows, "block_rows"), (block_cols, "block_cols"))]
    module = ALGORITHMS[algorithm] if pass_ == "fwd" else BACKWARD[algorithm]
    rows = (standard.softmax_rows(N, M, b, mask is not None and "mask" not in passes)
            if algorithm == "standard" else 0)

    made: dict = {}

    def make(Br: int, Bc: int) -> Plan:         # each candidate built (and its nest) once
        if (Br, Bc) not in made:
            made[(Br, Bc)] = Plan(algorithm, N, d, batch, heads, dtype, M, Br, Bc, causal,
                                  passes, preset, rows, pass_, placement, mask, dropout,
                                  dropout_seed, kv_launches)
        return made[(Br, Bc)]

    def overflows(p: Plan) -> list[str]:
        """What does not fit, level by level (shared memory, registers), with the buffers."""
        over = []
        for level, bufs, limit in (("shared memory" if R is not None else "SRAM",
                                    p.working_set(), M), ("registers", p.register_set(), R)):
            need = sum(size for _, size in bufs)
            if limit is not None and need > limit:
                parts = " + ".join(f"{name} {size}" for name, size in bufs)
                over.append(f"{need} B of {level} ({parts}) but "
                            + (f"M = {limit} B" if level != "registers" else
                               f"a block of {preset.warps_per_block} warps holds {limit} B"))
        return over

    def fits(Br: int, Bc: int) -> bool:
        return not overflows(make(Br, Bc))

    # the algorithm's own rule in the paper's model; with registers, the largest square tile
    # (a multiple of 16) that fits both levels, as real kernels choose
    preferred = (module.default_blocks(N, d, M, b) if R is None
                 else placed_blocks(algorithm, N, fits))
    Br, Bc = search_tiles(fits, N, preferred, *fixed)
    p = make(Br, Bc)
    over = overflows(p)
    if over:
        if fixed == [None, None] or (Br, Bc) == (1, 1):
            raise SramOverflowError(
                f"no {algorithm} tiles fit in SRAM of M = {M} B"
                f"{'' if R is None else f' and {R} B of registers'} at head_dim {d} in "
                f"{dtype}: even 1 x 1 blocks need " + "; and ".join(over))
        raise SramOverflowError(
            f"{algorithm} with B_r={Br}, B_c={Bc} ({placement}) needs " + "; and ".join(over)
            + "; use smaller blocks" + (" or more SRAM" if R is None else ""))
    for B, given, name in ((Br, fixed[0], "block_rows"), (Bc, fixed[1], "block_cols")):
        if given is None and -(-N // B) > validate.MAX_TILES:
            raise FlashsimError(
                f"the {algorithm} tiles that fit in M = {M:,} B ({name} = {B}) cut N = {N:,} "
                f"into {-(-N // B):,} blocks, more than the {validate.MAX_TILES:,} the model "
                "steps through; give more SRAM or a smaller N")
    return p


def placed_blocks(algorithm: str, n: int, fit) -> tuple[int, int]:
    """The default tiles when buffers are placed as a kernel places them: the largest
    square B x B with ``fit(B, B)``, rounded down to a multiple of 16 (tensor-core friendly)
    when B >= 16, capped at N; standard attention: its fixed 64 x 64 matmul tile, halved
    until it fits. (0, 0) when nothing fits."""
    if algorithm == "standard":
        B = standard.MATMUL_TILE
        while B > 0 and not fit(min(B, n), min(B, n)):
            B //= 2
        return min(B, n), min(B, n)
    lo, hi = 0, 1
    while fit(hi, hi) and hi <= n:               # the working sets grow with B
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fit(mid, mid) else (lo, mid)
    if lo >= 16:
        lo -= lo % 16
    return min(lo, n), min(lo, n)


def working_set_bytes(p: Plan) -> int:
    """SRAM bytes at the plan's peak: what must fit in M (the sum of ``p.working_set()``)."""
    return sum(size for _, size in p.working_set())


def search_tiles(fits, n: int, preferred: tuple[int, int], block_rows: int | None = None,
                 block_cols: int | None = None) -> tuple[int, int]:
    """(B_r, B_c) for a plan of sequence length ``n``.

    ``fits(B_r, B_c)`` says whether a tile fits; it must be monotone (a tile that fits still
    fits with fewer rows or columns), as every working set here is. The algorithm's
    ``preferred`` tile (with a given ``block_rows``/``block_cols`` in place of its own) is
    taken when it fits. Otherwise, with both sides free, the largest square tile that
    fits; with one side given, the largest other side that fits beside it. When nothing
    fits, the smallest candidate comes back and the caller's check says why; so a fit is
    found whenever one exists (``tests/test_tiles.py`` holds this against brute force).
    """
    Br = min(block_rows or preferred[0], n)
    Bc = min(block_cols or preferred[1], n)
    if Br >= 1 and Bc >= 1 and fits(Br, Bc):
        return Br, Bc
    if block_rows is not None and block_cols is not None:
        return block_rows, block_cols

    def largest(ok) -> int:             # the largest x in [1, n] with ok(x), else 1
        lo, hi = 1, n
        if not ok(1):
            return 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
        return lo

    if block_rows is not None:
        return block_rows, largest(lambda c: fits(block_rows, c))
    if block_cols is not None:
        return largest(lambda r: fits(r, block_cols)), block_cols
    B = largest(lambda x: fits(x, x))
    return B, B


def fastest_blocks(algorithm: str, seq_len: int, head_dim: int, efficiency, *,
                   gpu: str = DEFAULT_GPU, dtype: str = "fp32", causal: bool = False,
                   block_rows: int | None = None, block_cols: int | None = None,
                   multiple: int = 16, largest: int = 256) -> tuple[int, int]:
    """The tiles with the shortest roofline time for a kernel that says how well it runs.

    ``plan`` picks blocks by filling on-chip memory: an SRAM of M bytes in the two-level
    model, or shared memory and registers as FlashAttention kernels place S_ij and O_i. A
    real kernel also pads shared-memory rows against bank conflicts and adds scratch, and
    the tiles that move the fewest bytes are not always the fastest: a kernel that is
    bound by arithmetic runs at the speed its thread layout allows. So the kernel answers
    ``efficiency(B_r, B_c)``: the fraction of the GPU's peak FLOP rate it expects with
    those tiles, or 0 (or None) when it cannot run them. flashsim ranks candidates by

        time = max(HBM bytes / bandwidth, FLOPs / (peak x efficiency))

    with its exact count of bytes and FLOPs (the forward's closed form, per head), and
    breaks ties by fewer bytes, then the larger tile. Candidates are the multiples of
    ``multiple`` up to ``largest`` (capped at N; at most 64 per side), or the given
    ``block_rows``/``block_cols``.
    For FlashAttention-2 the bytes depend on B_r alone (K and V are read T_r times), for
    FlashAttention (Algorithm 1) on B_c alone (Q and O are read, and O written, T_c times).
    """
    algorithm = validate.choice(algorithm, list(ALGORITHMS), "algorithm")
    if algorithm == "standard":
        raise FlashsimError("algorithm: fastest_blocks is for flash1 and flash2, not "
                            "'standard'")
    N = validate.whole(seq_len, "seq_len", hi=validate.MAX_SEQ_LEN, what="tokens")
    d = validate.whole(head_dim, "head_dim", hi=validate.MAX_HEAD_DIM)
    dtype = validate.choice(dtype, list(DTYPE_BYTES), "dtype")
    b = dtype_bytes(dtype)
    preset = _gpu(gpu)
    causal = validate.flag(causal, "causal")
    if not callable(efficiency):
        raise FlashsimError(f"efficiency must be a function (B_r, B_c) -> fraction of peak, "
                            f"got {validate.show(efficiency)}")
    module = ALGORITHMS[algorithm]

    def sizes(given, name):
        if given is not None:
            return [min(validate.whole(given, name, hi=validate.MAX_SEQ_LEN), N)]
        step = validate.whole(multiple, "multiple", hi=validate.MAX_SEQ_LEN)
        top = validate.whole(largest, "largest", hi=validate.MAX_SEQ_LEN)
        if min(top, N) // step > 64:
            raise FlashsimError(f"largest / multiple: {top} / {step} gives more than 64 "
                                "candidate sizes per side (4,096 tiles); use a larger "
                                "multiple or a smaller largest")
        return sorted({min(B, N) for B in range(step, top + 1, step)})

    ranked = []
    for Br in sizes(block_rows, "block_rows"):
        for Bc in sizes(block_cols, "block_cols"):
            eff = efficiency(Br, Bc)
            if eff is None or eff is False or (
                    isinstance(eff, numbers.Real) and not isinstance(eff, bool) and eff == 0):
                continue                                  # the kernel cannot run these
            eff = validate.fraction(eff, f"efficiency({Br}, {Bc})")
            p = plan(algorithm, N, d, dtype=dtype, causal=causal, block_rows=Br,
                     block_cols=Bc, sram=module.working_set_bytes(Br, Bc, d, b))
            read, write, flops = module.closed_form(p)
            nbytes = sum(read.values()) + sum(write.values())
            # the roofline with the compute rate scaled down: eff x peak
            t = roofline_time(nbytes, flops / eff, preset, dtype)
            ranked.append((t, nbytes, -Br * Bc, -Br, Br, Bc))
    if not ranked:
        raise SramOverflowError(f"the kernel runs none of the candidate {algorithm} tiles "
                                f"at head_dim {d}")
    return min(ranked)[-2:]


def _execute(nest: _nest.Nest, hbm: dict, sram: int, registers: int | None) -> _nest.Counts:
    lead = hbm["Q"].shape[:-2]
    for name, t in nest.tensors.items():
        if name not in hbm:
            # Poisoned: an element the algorithm forgets to write stays NaN.
            hbm[name] = np.full(lead + (t.rows, t.cols), np.nan)
    return _nest.execute(nest, hbm, sram_limit=sram, register_limit=registers)


def _check_inputs(n: int, d: int, **named) -> dict:
    arrays = {}
    for name, x in named.items():
        try:
            a = np.asarray(x)
        except (ValueError, TypeError) as e:          # ragged nested lists, say
            raise FlashsimError(f"{name} is not an array of shape (..., {n}, {d}): "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                ) from None
        if a.dtype.kind not in "fiu":
            raise FlashsimError(f"{name} must hold real numbers, got dtype {a.dtype}")
        if a.ndim < 2 or a.shape[-2:] != (n, d):
            raise FlashsimError(f"{name} has shape {a.shape}; expected (..., {n}, {d})")
        a = a.astype(np.float64)
        if not np.isfinite(a).all():
            raise FlashsimError(f"{name} contains NaN or Inf")
        arrays[name] = a
    if len({a.shape for a in arrays.values()}) != 1:
        raise FlashsimError(f"{', '.join(arrays)} shapes differ: "
                            + ", ".join(str(a.shape) for a in arrays.values()))
    return arrays
