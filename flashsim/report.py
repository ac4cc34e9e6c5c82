"""A run's report (traffic by tensor and direction, FLOPs, on-chip peaks, and the L2 model's
figures when it ran), and one fixed-format table for every run, so standard and tiled
results line up row by row.

What the numbers are. The loop nest counts the bytes SRAM *requests from the level below
it*: in the paper's two-level model that level is HBM, so the paper (and this project's
older names, ``hbm_*``) calls them HBM traffic. On a GPU the level below shared memory is
the L2 cache, and only its misses and write-backs reach DRAM (HBM): those are the L2
model's ``dram_*`` bytes, which stand beside the requests whenever a GPU preset applies."""

from __future__ import annotations

from dataclasses import dataclass, field

from .algorithms import standard_bwd
from .hardware.presets import roofline_time
from .units import format_bytes

@dataclass
class Report:
    """Traffic of one run, totalled over batch x heads: ``per_tensor`` holds the bytes SRAM
    requests from the level below, by tensor and direction. ``sram_peak_bytes`` is the
    shared-memory peak of one block (all of SRAM in the two-level model) and
    ``register_peak_bytes`` its registers' (0 in the two-level model)."""
    plan: "Plan"  # noqa: F821 - flashsim.plan.Plan
    per_tensor: dict
    flops: int
    sram_peak_bytes: int
    max_abs_error: float | None = None
    hbm: dict = field(default_factory=dict, repr=False)
    max_abs_errors: dict | None = None     # by tensor (O, dQ, dK, dV) when checked
    l2: object | None = None               # flashsim.hardware.l2.L2Report, when the L2 model ran
    exp_ops: int = 0                       # exponentials (special-function unit work)
    nonmatmul_flops: int = 0               # every operation outside the matmuls, exps included
    register_peak_bytes: int = 0

    @property
    def requested_read_bytes(self) -> int:
        """Bytes SRAM reads from the level below it (the two-level count)."""
        return sum(t["read_bytes"] for t in self.per_tensor.values())

    @property
    def requested_write_bytes(self) -> int:
        return sum(t["write_bytes"] for t in self.per_tensor.values())

    @property
    def requested_bytes(self) -> int:
        return self.requested_read_bytes + self.requested_write_bytes

    # The same counts under the paper's name: in the two-level model the level below SRAM
    # is HBM. On a GPU, DRAM (HBM) sees ``dram_bytes``.
    hbm_read_bytes = requested_read_bytes
    hbm_write_bytes = requested_write_bytes
    hbm_bytes = requested_bytes

    @property
    def dram_bytes(self) -> int | None:
        """Bytes the L2 model sends to or from DRAM, counting what is still dirty in L2 when
        the kernels end (it reaches DRAM later); None when the L2 model has not run."""
        x = self.l2
        if x is None:
            return None
        return x.dram_read_bytes + x.dram_write_bytes + x.dirty_at_end_bytes

    @property
    def smem_peak_bytes(self) -> int:
        return self.sram_peak_bytes

    @property
    def predicted_time_s(self) -> float | None:
        """The roofline with the requested bytes at HBM bandwidth: as if no request hit in
        L2 (``predicted_dram_time_s`` uses the L2 model's DRAM bytes)."""
        p = self.plan
        return None if p.gpu is None else roofline_time(self.hbm_bytes, self.flops, p.gpu, p.dtype)

    @property
    def predicted_dram_time_s(self) -> float | None:
        p = self.plan
        if p.gpu is None or self.l2 is None:
            return None
        return roofline_time(self.dram_bytes, self.flops, p.gpu, p.dtype)

    def to_dict(self) -> dict:
        p = self.plan
        d = {
            "algorithm": p.algorithm, "pass": p.pass_, "seq_len": p.seq_len, "head_dim": p.head_dim,
            "batch": p.batch, "heads": p.heads, "dtype": p.dtype, "causal": p.causal,
            "extra_passes": list(p.extra_passes), "sram_bytes": p.sram_bytes,
            "block_rows": p.block_rows, "block_cols": p.block_cols, "placement": p.placement,
            "requested_read_bytes": self.requested_read_bytes,
            "requested_write_bytes": self.requested_write_bytes,
            "requested_bytes": self.requested_bytes,
            # the same three under the two-level model's names (kept for scripts)
            "hbm_read_bytes": self.hbm_read_bytes, "hbm_write_bytes": self.hbm_write_bytes,
            "hbm_bytes": self.hbm_bytes, "flops": self.flops,
            "exp_ops": self.exp_ops, "nonmatmul_flops": self.nonmatmul_flops,
            "per_tensor": self.per_tensor,
            "sram_peak_bytes": self.sram_peak_bytes,
        }
        if p.algorithm == "standard":
            d["softmax_rows"] = p.softmax_rows
            if p.pass_ != "fwd":
                d["softmax_bwd_rows"] = standard_bwd.softmax_bwd_rows(
                    p.seq_len, p.sram_bytes, p.elem_bytes)
        if p.gpu is not None:
            d["gpu"] = p.gpu.name
            d["smem_peak_bytes"] = self.smem_peak_bytes
            d["register_peak_bytes"] = self.register_peak_bytes
            d["register_budget_bytes"] = p.register_budget
            d["predicted_time_s"] = self.predicted_time_s
        if self.max_abs_error is not None:
            d["max_abs_error"] = self.max_abs_error
        if self.max_abs_errors is not None:
            d["max_abs_error_by_tensor"] = dict(self.max_abs_errors)
        if self.l2 is not None:
            d.update({"l2_bytes": self.l2.l2_bytes, "blocks_per_sm": self.l2.blocks_per_sm,
                      "l2_request_read_bytes": self.l2.l2_read_bytes,
                      "l2_request_write_bytes": self.l2.l2_write_bytes,
                      "dram_read_bytes": self.l2.dram_read_bytes,
                      "dram_write_bytes": self.l2.dram_write_bytes,
                      "dram_dirty_at_end_bytes": self.l2.dirty_at_end_bytes,
                      "dram_bytes": self.dram_bytes,
                      "predicted_dram_time_s": self.predicted_dram_time_s})
        return d



_RULE = "-" * 72


def _row(label: str, *cells: str) -> str:
    return f"{label:<22}" + "".join(f"{c:>25}" for c in cells)


def _cell(n: int) -> str:
    return f"{n:,}" if n < 10**6 else f"{n:,} ({format_bytes(n)})"


def _memory_line(p) -> str:
    """What M is, and where the buffers live."""
    if p.placement == "registers":
        return (f"M = {p.sram_bytes:,} B of shared memory a block, registers "
                f"{p.register_budget:,} B a block ({p.gpu.warps_per_block} warps x 32 x "
                f"{p.gpu.max_registers_per_thread} x 4 B)")
    return f"M = {p.sram_bytes:,} B of SRAM (two-level model: every buffer in SRAM)"


def format_report(rep) -> str:
    """The table ``flashsim io`` prints: the bytes SRAM requests from the level below, by
    tensor and direction, and totals; the on-chip peaks; FLOPs; with a GPU preset, what the
    L2 model sends to DRAM, and the roofline times."""
    p = rep.plan
    name = p.algorithm if p.pass_ == "fwd" else f"{p.algorithm} {p.pass_}"
    head = (f"{name}  N={p.seq_len} d={p.head_dim} batch={p.batch} heads={p.heads} "
            f"{p.dtype}{' causal' if p.causal else ''}"
            f"{' +' + ','.join(p.extra_passes) if p.extra_passes else ''}\n"
            f"{_memory_line(p)}\n"
            f"B_r = {p.block_rows}   B_c = {p.block_cols}   placement: {p.placement}"
            + (f"   softmax rows = {p.softmax_rows}" if p.algorithm == "standard" else ""))
    lines = [head, _RULE, "requested by SRAM from the level below (the two-level count: "
             "HBM in the paper's model, L2 on a GPU)", _row("", "read bytes", "write bytes")]
    for name, t in rep.per_tensor.items():
        if t["read_bytes"] or t["write_bytes"]:
            lines.append(_row(f"  {name}", _cell(t["read_bytes"]), _cell(t["write_bytes"])))
    registers = p.placement == "registers"
    lines += [
        _row("  total", _cell(rep.requested_read_bytes), _cell(rep.requested_write_bytes)),
        _RULE,
        _row("requested (r+w)", _cell(rep.requested_bytes)),
        _row("shared mem peak/block" if registers else "SRAM peak / block",
             _cell(rep.sram_peak_bytes)),
    ]
    if registers:
        lines.append(_row("registers peak/block", _cell(rep.register_peak_bytes)))
    lines += [_row("FLOPs (matmuls)", f"{rep.flops:,}"),
              _row("exponentials", f"{rep.exp_ops:,}"),
              _row("non-matmul ops", f"{rep.nonmatmul_flops:,}")]
    if getattr(rep, "l2", None) is not None:
        x = rep.l2
        lines += [
            _RULE,
            f"three levels: L2 of {x.l2_bytes:,} B, {x.blocks_per_sm} resident blocks per SM "
            f"x {x.sms} SMs (flashsim/hardware/l2.py)",
            _row("L2 requests", _cell(x.l2_read_bytes), _cell(x.l2_write_bytes)),
            _row("DRAM", _cell(x.dram_read_bytes), _cell(x.dram_write_bytes)),
            _row("  dirty in L2 at end", "", _cell(x.dirty_at_end_bytes)),
            _row("DRAM bytes (r+w+dirty)", _cell(rep.dram_bytes)),
        ]
    if rep.predicted_time_s is not None:
        g = p.gpu
        lines.append(_row("roofline, requested", f"{rep.predicted_time_s * 1e3:.4f} ms"))
        if rep.predicted_dram_time_s is not None:
            lines.append(_row("roofline, DRAM bytes",
                              f"{rep.predicted_dram_time_s * 1e3:.4f} ms"))
        lines.append(f"  (on {g.name}: max(bytes / {g.hbm_bandwidth / 1e12:.2f} TB/s, "
                     f"FLOPs / {g.peak_flops(p.dtype) / 1e12:.1f} TFLOP/s))")
    if rep.max_abs_errors is not None:
        for name, err in rep.max_abs_errors.items():
            lines.append(_row(f"max |{name} - {name}_ref|", f"{err:.3e}"))
    elif rep.max_abs_error is not None:
        lines.append(_row("max |O - O_ref|", f"{rep.max_abs_error:.3e}"))
    return "\n".join(lines)


def format_compare(reports) -> str:
    """Several algorithms for one shape, side by side: the one-screen answer."""
    reports = list(reports)
    p = reports[0].plan
    width = 22 + 20 * len(reports)
    which = "" if p.pass_ == "fwd" else p.pass_ + "  "
    head = (f"{which}N={p.seq_len} d={p.head_dim} batch={p.batch} heads={p.heads} {p.dtype}"
            f"{' causal' if p.causal else ''}\n{_memory_line(p)}")

    def row(label, cells):
        return f"{label:<22}" + "".join(f"{c:>20}" for c in cells)

    names = list(dict.fromkeys(n for r in reports for n in r.per_tensor))
    lines = [head, "-" * width, row("", [r.plan.algorithm for r in reports]),
             row("B_r x B_c", [f"{r.plan.block_rows} x {r.plan.block_cols}" for r in reports]),
             "-" * width, "bytes requested by SRAM from the level below (two-level count)"]
    for name in names:
        for direction, key in (("read", "read_bytes"), ("write", "write_bytes")):
            vals = [r.per_tensor.get(name, {}).get(key, 0) for r in reports]
            if any(vals):
                lines.append(row(f"{name} {direction}", [f"{v:,}" for v in vals]))
    base = reports[0].hbm_bytes
    lines += ["-" * width,
              row("requested (r+w)", [f"{r.hbm_bytes:,}" for r in reports]),
              row("", [format_bytes(r.hbm_bytes) for r in reports]),
              row(f"vs {reports[0].plan.algorithm}", [f"{r.hbm_bytes / base:.3f}x" for r in reports]),
              row("SRAM peak / block" if p.placement == "two-level" else "shared mem peak",
                  [f"{r.sram_peak_bytes:,}" for r in reports]),
              *([row("registers peak", [f"{r.register_peak_bytes:,}" for r in reports])]
                if p.placement == "registers" else []),
              row("FLOPs (matmuls)", [f"{r.flops:,}" for r in reports]),
              row("exponentials", [f"{r.exp_ops:,}" for r in reports]),
              row("non-matmul ops", [f"{r.nonmatmul_flops:,}" for r in reports])]
    if all(r.dram_bytes is not None for r in reports):
        lines.append(row("DRAM bytes (L2 model)", [f"{r.dram_bytes:,}" for r in reports]))
        lines.append(row("", [format_bytes(r.dram_bytes) for r in reports]))
    if all(r.predicted_time_s is not None for r in reports):
        lines.append(row("roofline, requested", [f"{r.predicted_time_s * 1e3:.4f} ms"
                                                 for r in reports]))
    if all(r.predicted_dram_time_s is not None for r in reports):
        lines.append(row("roofline, DRAM", [f"{r.predicted_dram_time_s * 1e3:.4f} ms"
                                            for r in reports]))
    if all(getattr(r, "l2", None) is not None for r in reports):
        x = reports[0].l2
        lines += ["-" * width,
                  f"three levels: L2 of {x.l2_bytes:,} B, {x.sms} SMs (flashsim/hardware/l2.py)",
                  row("blocks per SM", [str(r.l2.blocks_per_sm) for r in reports]),
                  row("L2 requests read", [f"{r.l2.l2_read_bytes:,}" for r in reports]),
                  row("L2 requests write", [f"{r.l2.l2_write_bytes:,}" for r in reports]),
                  row("DRAM read", [f"{r.l2.dram_read_bytes:,}" for r in reports]),
                  row("DRAM write", [f"{r.l2.dram_write_bytes:,}" for r in reports]),
                  row("dirty in L2 at end", [f"{r.l2.dirty_at_end_bytes:,}" for r in reports])]
    if all(r.max_abs_errors is not None for r in reports):
        for name in reports[0].max_abs_errors:
            lines.append(row(f"max |{name} - {name}_ref|",
                             [f"{r.max_abs_errors[name]:.2e}" for r in reports]))
    elif all(r.max_abs_error is not None for r in reports):
        lines.append(row("max |O - O_ref|", [f"{r.max_abs_error:.2e}" for r in reports]))
    return "\n".join(lines)
