"""Context parallelism: one attention spread over P devices, each with its own HBM and SRAM.

A sequence too long for one GPU is cut into P slices along N; device p keeps the queries,
keys and values of its slice (its *positions*), and the devices exchange K/V until every
query has met every key it may see. Each device runs FlashAttention-2's own loop nest
(``flashsim.algorithms.flash2``) on its Q slice against one K/V slice at a time, and the
partial results merge exactly as FlashAttention merges K/V blocks: (m, l, O) states,
``online_softmax.merge``. Nothing here is a new engine: every kernel is a loop nest,
counted and run by ``flashsim.nest``.

Schedules (``SCHEDULES``: how K/V travel, and which positions each device holds):

    ring        contiguous slices; P steps; at step s device p attends to the K/V slice of
                device (p - s) mod P while it sends that slice on to p + 1 and receives the
                next from p - 1 (Liu, Zaharia, Abbeel, "Ring Attention with Blockwise
                Transformers", arXiv:2310.01889)
    allgather   contiguous slices; all K/V gathered first (NCCL's ring all-gather: the same
                P - 1 transfers per device), then one kernel over all of it, no overlap
                (context parallelism in Llama 3's training, arXiv:2407.21783)
    zigzag      ring, but the sequence is cut into 2P chunks and device p holds chunks p and
                2P - 1 - p, so under a causal mask every device has the same work per step
                (ring-flash-attn's zigzag layout)
    striped     ring, device p holds positions p, p + P, p + 2P, ... (Brandon et al.,
                "Striped Attention", arXiv:2311.09431)

Under a causal mask the contiguous split leaves devices idle: device p's queries see only
slices 0..p, so at step s > p it has nothing to do (and K/V it will not use still pass
through it). Slices may be ragged (N not a multiple of P): sizes differ by at most one row
(zigzag: chunk sizes by one).

Forward, per device p (n_p rows), each step s whose K/V slice (n_k rows) it sees at all:

    attention   flash2's nest on (Q_p, K_src, V_src): O_s, L_s  (the first step writes O, L)
    merge       (O, L) <- merge((O, L), (O_s, L_s)) row by row, over the rows the step wrote:
                read O, L, O_s, L_s; write O, L   (R d b + 4 R each)

Backward (FlashAttention-2's backward per step, with the forward's final O and L, so each
step's P_ij = exp(S_ij - L_i) is already the global probability and the contributions add):
K/V travel as in the forward, and the dK, dV accumulators (fp32) travel with them, each
device adding its contribution to the slice it holds (ring-flash-attn's backward):

    attention   flash2_bwd's nest on (Q_p, dO_p, O_p, L_p; K_src, V_src): dQ_s, dK_s, dV_s
    accumulate  dQ_acc += dQ_s (fp32);  dK_acc = dK_s + dK_acc received (fp32), dV likewise
    after the last step, dK_acc and dV_acc go one more hop, home to the slice's owner, and
    (fp16/bf16) dQ, dK, dV are converted from fp32 to the data type.

Traffic, per head, b bytes per element, d the head dimension, n_p the rows of device p:

    link bytes (all devices)   forward   2 (P - 1) N d b               (every slice's K and V
                                                                        reach P - 1 devices)
                               backward  2 (P - 1) N d b + 2 P N d 4   (+ dK, dV in fp32,
                                                                        P hops each)
    HBM bytes of device p      sum over its steps of flash2's closed form for that step
                               (``flash2.closed_form(..., kv_len, q_pos, k_pos)``) and the
                               merge's; every transfer is also read from the sender's HBM
                               and written into the receiver's: forward ring sends
                               2 d b (N - n_{p+1}) and receives 2 d b (N - n_p).

Each transfer is counted once (NCCL's staging buffers, if any, are not modelled).

Time (``CPPlan.timeline``): each kernel takes its roofline time on the preset (HBM bytes at
the datasheet bandwidth, FLOPs at ``efficiency`` times the peak), each transfer
``latency + bytes / bandwidth`` on one direction of a ring link (``presets.LINKS``). Device
p starts step s + 1 when it has finished step s and the K/V slice for step s + 1 has
arrived; that transfer starts when the sender has begun step s (it has the slice) and the
receiver has too (its spare buffer is free: double buffering). When every device has the
same work, with t_0 the first step's compute (attention), t_c a later step's (attention
and merge) and t_x a transfer, the ring takes (``uniform_ring_seconds``)

    T = max(t_0, t_x) + (P - 2) max(t_c, t_x) + t_c

so the transfers hide completely when t_0 >= t_x: per step, compute >= transfer. Without
a mask and with n = N/P rows per device, compute-bound steps (4 n^2 d FLOPs per head at
rate F) against 2 n d b bytes per head over a link of bandwidth beta:

    4 n^2 d / F >= 2 n d b / beta   <=>   n >= F b / (2 beta)

(plus the link latency; ``min_rows_for_overlap``): on an H200 in bf16 at the datasheet's
989 TFLOP/s and 450 GB/s one way, n >= 2199 rows per device. The backward must also hide
the dK, dV accumulators (4-byte elements) on the same link.

    cp = flashsim.context_parallel.cp_plan(flashsim.plan("flash2", 8192, 128, dtype="bf16",
                                           causal=True), devices=4, schedule="zigzag")
    cp.count().link_bytes;  cp.closed_form().hbm_bytes_per_device
    O, rep = cp.run(Q, K, V)          # float64 values: equal to one device's attention
    cp.timeline().total_s
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from . import nest as _nest
from .algorithms import flash2, flash2_bwd
from .algorithms._common import block_extent, visible_stop_j
from .algorithms.online_softmax import State, merge
from .errors import FlashsimError
from .hardware.presets import DEFAULT_GPU, GPU, Link, gpu as _gpu, link as _link, preset_name
from .nest import Alloc, Compute, Load, Loop, Nest, Store, Tensor
from .units import STAT_BYTES, positive_int

ACC_BYTES = 4                   # dQ, dK, dV accumulate in fp32 across steps
LAYOUTS = ("contiguous", "zigzag", "striped")
# schedule -> (how K/V travel, which positions each device holds)
SCHEDULES = {"ring": ("ring", "contiguous"), "allgather": ("allgather", "contiguous"),
             "zigzag": ("ring", "zigzag"), "striped": ("ring", "striped")}


# ------------------------------------------------------------------------------ layouts

def layout(kind: str, seq_len: int, devices: int) -> list[np.ndarray]:
    """The global positions each device holds, ascending: a list of P int arrays that
    together cover 0..N-1 once. Ragged N: slice (or chunk) sizes differ by at most one."""
    N, P = positive_int(seq_len, "seq_len"), positive_int(devices, "devices")
    if kind not in LAYOUTS:
        raise FlashsimError(f"unknown layout {kind!r}: choose one of {', '.join(LAYOUTS)}")
    need = 2 * P if kind == "zigzag" else P
    if N < need:
        raise FlashsimError(f"{kind} over {P} devices needs N >= {need} rows (each device "
                            f"at least one{' per chunk' if kind == 'zigzag' else ''}); "
                            f"N = {N}")
    pos = np.arange(N)
    if kind == "contiguous":
        return list(np.array_split(pos, P))
    if kind == "striped":
        return [pos[p::P] for p in range(P)]
    chunks = np.array_split(pos, 2 * P)
    return [np.concatenate([chunks[p], chunks[2 * P - 1 - p]]) for p in range(P)]


def sees(q_pos: np.ndarray, k_pos: np.ndarray, causal: bool) -> bool:
    """Whether any query of ``q_pos`` sees any key of ``k_pos`` (positions ascending)."""
    return (not causal) or bool(k_pos[0] <= q_pos[-1])


# ------------------------------------------------------------------------ the schedule

@dataclass(frozen=True)
class Kernel:
    """One launch on one device: a loop nest, which device tensor each of its tensors is,
    and for K/V-side tensors whose slice (``src``) they hold."""
    name: str
    step: int
    src: int
    nest: Nest
    names: dict


@dataclass(frozen=True)
class Transfer:
    """One send over the link ``src -> dst`` at ``step``: ``what`` of slice ``owner``."""
    step: int
    src: int
    dst: int
    what: str                   # "K,V" or "dK,dV"
    owner: int
    nbytes: int                 # per head


@dataclass
class DeviceCounts:
    """One device's HBM traffic by tensor and direction, matmul FLOPs (both over batch x
    heads), and the HBM bytes its transfers read (sending) and write (receiving)."""
    per_tensor: dict = field(default_factory=dict)
    flops: int = 0
    send_bytes: int = 0
    recv_bytes: int = 0

    def add(self, name: str, read: int = 0, write: int = 0) -> None:
        t = self.per_tensor.setdefault(name, {"read_bytes": 0, "write_bytes": 0})
        t["read_bytes"] += int(read)
        t["write_bytes"] += int(write)

    @property
    def hbm_read_bytes(self) -> int:
        return sum(t["read_bytes"] for t in self.per_tensor.values()) + self.send_bytes

    @property
    def hbm_write_bytes(self) -> int:
        return sum(t["write_bytes"] for t in self.per_tensor.values()) + self.recv_bytes

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    def to_dict(self) -> dict:
        return {"hbm_read_bytes": self.hbm_read_bytes, "hbm_write_bytes": self.hbm_write_bytes,
                "hbm_bytes": self.hbm_bytes, "flops": self.flops,
                "link_send_hbm_bytes": self.send_bytes, "link_recv_hbm_bytes": self.recv_bytes,
                "per_tensor": {k: dict(v) for k, v in self.per_tensor.items()}}


@dataclass
class CPReport:
    """Traffic of a context-parallel run: one :class:`DeviceCounts` per device and the bytes
    sent over all links, all devices, over batch x heads."""
    cp: "CPPlan"
    devices: list
    link_bytes: int
    max_abs_error: float | None = None

    @property
    def hbm_bytes_per_device(self) -> list[int]:
        return [d.hbm_bytes for d in self.devices]

    @property
    def flops_per_device(self) -> list[int]:
        return [d.flops for d in self.devices]

    def to_dict(self) -> dict:
        cp = self.cp
        out = {"devices": cp.devices, "cp_schedule": cp.schedule, "cp_layout": cp.layout,
               "cp_rows_per_device": [len(x) for x in cp.positions],
               "link_bytes": self.link_bytes,
               "hbm_bytes_per_device": self.hbm_bytes_per_device,
               "hbm_read_bytes_per_device": [d.hbm_read_bytes for d in self.devices],
               "hbm_write_bytes_per_device": [d.hbm_write_bytes for d in self.devices],
               "flops_per_device": self.flops_per_device,
               "cp_per_device": [d.to_dict() for d in self.devices]}
        if self.max_abs_error is not None:
            out["cp_max_abs_error"] = self.max_abs_error
        return out


@dataclass(frozen=True)
class CPPlan:
    """A single-device flash2 plan spread over ``devices`` with ``schedule``.

    ``plan`` gives the shape, dtype, tiles, mask and pass (fwd, bwd or fwd+bwd); each device
    runs flash2's nest with those tiles. Build it with :func:`cp_plan`."""
    plan: object
    devices: int
    schedule: str
    positions: tuple

    @property
    def comm(self) -> str:
        return SCHEDULES[self.schedule][0]

    @property
    def layout(self) -> str:
        return SCHEDULES[self.schedule][1]

    @property
    def heads(self) -> int:
        return self.plan.batch * self.plan.heads

    @property
    def passes(self) -> tuple:
        return {"fwd": ("fwd",), "bwd": ("bwd",), "fwd+bwd": ("fwd", "bwd")}[self.plan.pass_]

    def rows(self, p: int) -> int:
        return len(self.positions[p])

    def step_plan(self, p: int):
        """The flash2 plan of device p's kernels: its rows as N, the base plan's tiles."""
        return replace(self.plan, seq_len=self.rows(p))

    # ---------------------------------------------------------------- steps and kernels

    def sources(self, p: int) -> list[tuple[int, int]]:
        """(step, src) for each step at which device p runs a kernel: the K/V slice of
        device ``src``, if p's queries see any of its keys. All-gather: one step, src -1
        (all of K/V, in device order)."""
        if self.comm == "allgather":
            return [(0, -1)]
        causal, P = self.plan.causal, self.devices
        return [(s, (p - s) % P) for s in range(P)
                if sees(self.positions[p], self.positions[(p - s) % P], causal)]

    def kv_positions(self, src: int) -> np.ndarray:
        return np.concatenate(self.positions) if src == -1 else self.positions[src]

    def forward_kernels(self, p: int) -> list[Kernel]:
        """Device p's forward launches in order: attention per step, merges after the first."""
        sp, out = self.step_plan(p), []
        for k, (s, src) in enumerate(self.sources(p)):
            k_pos = self.kv_positions(src)
            nest = flash2.build(sp, kv_len=len(k_pos), q_pos=self.positions[p], k_pos=k_pos)
            first = k == 0
            out.append(Kernel("attention", s, src, nest, {
                "Q": "Q", "K": "K", "V": "V", "O": "O" if first else "O_s",
                "L": "L" if first else "L_s"}))
            if not first:
                out.append(Kernel("merge", s, src, merge_nest(
                    sp, _first_q_block(sp, self.positions[p], k_pos)), {}))
        return out

    def backward_kernels(self, p: int) -> list[Kernel]:
        """Device p's backward launches in order: per step the FA2 backward and the fp32
        accumulation, then (fp16/bf16) the conversion of dQ and of its returned dK, dV."""
        sp, out = self.step_plan(p), []
        b, n = sp.elem_bytes, self.rows(p)
        acc = flash2_bwd.accumulator(b)
        for k, (s, src) in enumerate(self.sources(p)):
            k_pos = self.kv_positions(src)
            n_k = len(k_pos)
            nest = flash2_bwd.build(sp, kv_len=n_k, q_pos=self.positions[p], k_pos=k_pos)
            names = {"Q": "Q", "K": "K", "V": "V", "O": "O", "dO": "dO", "L": "L", "D": "D",
                     "dQ": "dQ_s", "dK": "dK_s", "dV": "dV_s"}
            if acc != "dQ":
                names[acc] = "dQ_s_acc"
            out.append(Kernel("attention_bwd", s, src, nest, names))
            q_terms = [("dQ_s", b)] if k == 0 else [("dQ_acc", ACC_BYTES), ("dQ_s", b)]
            out.append(Kernel("accumulate dQ", s, src,
                              add_nest(sp, n, "dQ_acc", ACC_BYTES, q_terms), {}))
            for g in ("dK", "dV"):
                terms = [(f"{g}_s", b)] + ([] if s == 0 else [(f"{g}_acc_in", ACC_BYTES)])
                out.append(Kernel(f"accumulate {g}", s, src,
                                  add_nest(sp, n_k, f"{g}_acc", ACC_BYTES, terms), {}))
        if b != ACC_BYTES:
            for g, src_name in (("dQ", "dQ_acc"), ("dK", "dK_home"), ("dV", "dV_home")):
                out.append(Kernel(f"convert {g}", self.devices, p,
                                  add_nest(sp, n, g, b, [(src_name, ACC_BYTES)]), {}))
        return out

    def kernels(self, p: int, pass_: str) -> list[Kernel]:
        return self.forward_kernels(p) if pass_ == "fwd" else self.backward_kernels(p)

    def transfers(self, pass_: str = "fwd") -> list[Transfer]:
        """Every send, in step order. Ring and all-gather move the same K/V slices (NCCL's
        all-gather is itself a ring): at step s device p sends slice (p - s) mod P to p + 1,
        s = 0..P-2. The backward adds the dK, dV accumulators, P hops each (the last one
        home); they move even past a device that had nothing to add."""
        P, d, b = self.devices, self.plan.head_dim, self.plan.elem_bytes
        out = []
        if P == 1:
            return out
        for s in range(P - 1):
            for p in range(P):
                owner = (p - s) % P
                out.append(Transfer(s, p, (p + 1) % P, "K,V", owner, 2 * self.rows(owner) * d * b))
            if pass_ == "bwd":
                out += self._dkv(s)
        if pass_ == "bwd":
            out += self._dkv(P - 1)
        return out

    def _dkv(self, s: int) -> list[Transfer]:
        P, d = self.devices, self.plan.head_dim
        return [Transfer(s, p, (p + 1) % P, "dK,dV", (p - s) % P,
                         2 * self.rows((p - s) % P) * d * ACC_BYTES) for p in range(P)]

    # --------------------------------------------------------------------- counting

    def count(self) -> CPReport:
        """Exact traffic: every kernel's nest counted by ``nest.count``, every transfer
        read from the sender's HBM and written into the receiver's."""
        devs = [DeviceCounts() for _ in range(self.devices)]
        for pass_ in self.passes:
            for p, dev in enumerate(devs):
                for k in self.kernels(p, pass_):
                    c = _nest.count(k.nest)
                    for name in k.nest.tensors:
                        dev.add(k.names.get(name, name), self.heads * c.read.get(name, 0),
                                self.heads * c.write.get(name, 0))
                    dev.flops += self.heads * c.flops
        return CPReport(self, devs, self._add_transfers(devs))

    def _add_transfers(self, devs: list) -> int:
        """Every transfer's bytes on its sender and receiver (and tensors a device never
        touched dropped from its table); returns the bytes over all links."""
        link = 0
        for pass_ in self.passes:
            for t in self.transfers(pass_):
                devs[t.src].send_bytes += self.heads * t.nbytes
                devs[t.dst].recv_bytes += self.heads * t.nbytes
                link += self.heads * t.nbytes
        for dev in devs:
            dev.per_tensor = {k: v for k, v in dev.per_tensor.items()
                              if v["read_bytes"] or v["write_bytes"]}
        return link

    def step_forms(self, p: int, pass_: str):
        """Device p's traffic from formulas, kernel group by kernel group, per head:
        yields (step, group, [(tensor, read, write), ...], flops) with group "attention"
        (flash2 or flash2_bwd's closed form for that step) or "rest" (the merge, the
        accumulation; step P: the final conversions)."""
        d, b, s4 = self.plan.head_dim, self.plan.elem_bytes, STAT_BYTES
        sp, n = self.step_plan(p), self.rows(p)
        for k, (s, src) in enumerate(self.sources(p)):
            k_pos = self.kv_positions(src)
            n_k = len(k_pos)
            kw = dict(kv_len=n_k, q_pos=self.positions[p], k_pos=k_pos)
            rest = []
            if pass_ == "fwd":
                read, write, flops = flash2.closed_form(sp, **kw)
                rename = {} if k == 0 else {"O": "O_s", "L": "L_s"}
                if k:          # merge: read O, L, O_s, L_s; write O, L over the R rows
                    stop = (visible_stop_j(self.positions[p], k_pos, sp.block_rows,
                                           sp.block_cols) if sp.causal else None)
                    i = np.arange(-(-n // sp.block_rows))
                    R = int((block_extent(i, sp.block_rows, n)
                             * (1 if stop is None else stop > 0)).sum())
                    for name, nb in (("O", R * d * b), ("L", s4 * R)):
                        rest += [(name, nb, nb), (name + "_s", nb, 0)]
            else:
                read, write, flops = flash2_bwd.closed_form(sp, **kw)
                rename = {"dQ": "dQ_s", "dK": "dK_s", "dV": "dV_s", "dQ_acc": "dQ_s_acc"}
                rest += [("dQ_s", n * d * b, 0),
                         ("dQ_acc", 0 if k == 0 else 4 * n * d, 4 * n * d)]
                for g in ("dK", "dV"):
                    rest += [(g + "_s", n_k * d * b, 0), (g + "_acc", 0, 4 * n_k * d)]
                    if s:
                        rest.append((g + "_acc_in", 4 * n_k * d, 0))
            yield s, "attention", [(rename.get(x, x), read[x], write[x]) for x in read], flops
            if rest:
                yield s, "rest", rest, 0
        if pass_ == "bwd" and b != ACC_BYTES:            # fp32 -> data type, n rows each
            yield self.devices, "rest", [
                x for g, src_name in (("dQ", "dQ_acc"), ("dK", "dK_home"), ("dV", "dV_home"))
                for x in ((src_name, 4 * n * d, 0), (g, 0, n * d * b))], 0

    def closed_form(self) -> CPReport:
        """The same report from formulas (see the module header): flash2's and flash2_bwd's
        closed forms per step, the merge and accumulation passes, the link bytes."""
        P, N, d, b = self.devices, self.plan.seq_len, self.plan.head_dim, self.plan.elem_bytes
        H = self.heads
        devs = [DeviceCounts() for _ in range(P)]
        link = 0
        for pass_ in self.passes:
            for p, dev in enumerate(devs):
                for _, _, updates, flops in self.step_forms(p, pass_):
                    for name, read, write in updates:
                        dev.add(name, H * read, H * write)
                    dev.flops += H * flops
                if P > 1:      # every slice but the next device's out, every other one in
                    dev.send_bytes += H * 2 * d * b * (N - self.rows((p + 1) % P))
                    dev.recv_bytes += H * 2 * d * b * (N - self.rows(p))
                    if pass_ == "bwd":                   # all P accumulators out and in
                        dev.send_bytes += H * 2 * N * d * ACC_BYTES
                        dev.recv_bytes += H * 2 * N * d * ACC_BYTES
            if P > 1:
                link += H * 2 * (P - 1) * N * d * b
                if pass_ == "bwd":
                    link += H * 2 * P * N * d * ACC_BYTES
        for dev in devs:
            dev.per_tensor = {k: v for k, v in dev.per_tensor.items()
                              if v["read_bytes"] or v["write_bytes"]}
        return CPReport(self, devs, link)

    # ---------------------------------------------------------------------- values

    def run(self, Q, K, V, dO=None):
        """Run every device's kernels with float64 values. Q, K, V (and dO with a backward
        pass): (..., N, d), the whole sequence; each device gets its slice. Returns O (or
        ``Gradients``) assembled in position order, and the report (the same counts as
        :meth:`count`). ``report.max_abs_error`` is left for the caller to fill."""
        from .plan import Gradients, _check_inputs
        backward = self.plan.pass_ != "fwd"
        if backward != (dO is not None):
            raise FlashsimError("dO is needed exactly when the plan has a backward pass")
        arrays = _check_inputs(self.plan.seq_len, self.plan.head_dim, Q=Q, K=K, V=V,
                               **({"dO": dO} if backward else {}))
        P, pos = self.devices, self.positions
        hbm = [{name: a[..., pos[p], :] for name, a in arrays.items()} for p in range(P)]
        devs = [DeviceCounts() for _ in range(P)]
        fwd_counted = "fwd" in self.passes
        self._run_forward(hbm, devs if fwd_counted else None)
        if backward:
            self._run_backward(hbm, devs)
        report = CPReport(self, devs, self._add_transfers(devs))

        def gather(name):
            out = np.empty(arrays["Q"].shape[:-1] + (hbm[0][name].shape[-1],))
            for p in range(P):
                out[..., pos[p], :] = hbm[p][name]
            return out

        if backward:
            out = "dQ" if self.plan.elem_bytes != ACC_BYTES else "dQ_acc"
            grads = [gather(out)] + [gather(g if self.plan.elem_bytes != ACC_BYTES
                                            else g + "_home") for g in ("dK", "dV")]
            report.hbm = {"O": gather("O"), "L": gather("L")}
            return Gradients(*grads), report
        report.hbm = {"O": gather("O"), "L": gather("L")}
        return report.hbm["O"], report

    def _launch(self, k: Kernel, dev_hbm: dict, kv: dict, dev: DeviceCounts | None):
        """Execute kernel ``k`` on a device's arrays; K/V-side tensors come from ``kv``."""
        bound = {}
        lead = dev_hbm["Q"].shape[:-2]
        for name, t in k.nest.tensors.items():
            dname = k.names.get(name, name)
            store = kv if dname in kv else dev_hbm
            if dname not in store or store[dname].shape[-2:] != (t.rows, t.cols):
                store[dname] = np.full(lead + (t.rows, t.cols), np.nan)   # poisoned
            bound[name] = store[dname]
        c = _nest.execute(k.nest, bound, sram_limit=self.plan.sram_bytes)   # in place
        if dev is not None:
            for name in k.nest.tensors:
                dev.add(k.names.get(name, name), self.heads * c.read.get(name, 0),
                        self.heads * c.write.get(name, 0))
            dev.flops += self.heads * c.flops

    def _slice(self, hbm: list, src: int, name: str) -> np.ndarray:
        if src == -1:
            return np.concatenate([h[name] for h in hbm], axis=-2)
        return hbm[src][name]

    def _run_forward(self, hbm: list, devs) -> None:
        originals = [{"K": h["K"], "V": h["V"]} for h in hbm]
        for p in range(self.devices):
            for k in self.forward_kernels(p):
                kv = {"K": self._slice(originals, k.src, "K"),
                      "V": self._slice(originals, k.src, "V")}
                if k.name == "attention" and k.names["O"] == "O_s":
                    hbm[p].pop("O_s", None), hbm[p].pop("L_s", None)
                self._launch(k, hbm[p], kv, None if devs is None else devs[p])

    def _run_backward(self, hbm: list, devs: list) -> None:
        P = self.devices
        originals = [{"K": h["K"], "V": h["V"]} for h in hbm]
        # The accumulators travel: acc[q] is slice q's (dK, dV) wherever it is now.
        acc = [dict() for _ in range(P)]
        by_step = {p: {} for p in range(P)}
        for p in range(P):
            for k in self.backward_kernels(p):
                by_step[p].setdefault(k.step, []).append(k)
        for s in range(P + 1):               # steps in lockstep, then the conversions
            for p in range(P):
                for k in by_step[p].get(s, []):
                    if k.name.startswith("convert"):
                        if k.name != "convert dQ":
                            hbm[p][k.name[-2:] + "_home"] = acc[p][k.name[-2:]]
                        self._launch(k, hbm[p], {}, devs[p])
                        continue
                    src = k.src
                    kv = {"K": originals[src]["K"], "V": originals[src]["V"]}
                    if k.name == "attention_bwd":
                        for name in ("dQ_s", "dK_s", "dV_s", "dQ_s_acc", "D"):
                            hbm[p].pop(name, None)
                    if k.name in ("accumulate dK", "accumulate dV"):
                        g = k.name[-2:]
                        kv = {f"{g}_s": hbm[p][f"{g}_s"]}
                        if f"{g}_acc_in" in k.nest.tensors:
                            kv[f"{g}_acc_in"] = acc[src][g]
                        self._launch(k, hbm[p], kv, devs[p])
                        acc[src][g] = hbm[p].pop(f"{g}_acc")    # it travels on
                        continue
                    self._launch(k, hbm[p], kv, devs[p])
        if self.plan.elem_bytes == ACC_BYTES:        # fp32: the accumulators are the result
            for p in range(P):
                for g in ("dK", "dV"):
                    hbm[p][g + "_home"] = acc[p][g]

    # ------------------------------------------------------------------------ time

    def timeline(self, *, efficiency: float = 1.0, link: Link | None = None,
                 link_bandwidth: float | None = None, gpu: str | None = None,
                 pass_: str | None = None) -> "Timeline":
        """When each device computes and each transfer runs (the module header's model).
        ``efficiency``: the fraction of the peak FLOP rate the kernels reach; ``gpu`` the
        preset (default: the plan's, else h200); ``link``/``link_bandwidth`` override its
        link. ``pass_``: "fwd" or "bwd" (default: the plan's first pass)."""
        g = _gpu(gpu) if gpu is not None else (self.plan.gpu or _gpu(DEFAULT_GPU))
        ln = link or _link(preset_name(g))
        if link_bandwidth is not None:
            ln = replace(ln, bandwidth=float(link_bandwidth))
        if not 0 < efficiency <= 1:
            raise FlashsimError(f"efficiency must be in (0, 1], got {efficiency!r}")
        pass_ = pass_ or self.passes[0]
        return _timeline(self, g, ln, efficiency, pass_)


def cp_plan(plan, devices: int, schedule: str = "ring") -> CPPlan:
    """Spread ``plan`` (a flash2 plan from ``flashsim.plan``) over ``devices`` devices."""
    if plan.algorithm != "flash2":
        raise FlashsimError(f"context parallelism runs flash2's nest on every device, not "
                            f"{plan.algorithm!r}: use flashsim.plan('flash2', ...)")
    P = positive_int(devices, "devices")
    if schedule not in SCHEDULES:
        raise FlashsimError(f"unknown schedule {schedule!r}: choose one of "
                            f"{', '.join(SCHEDULES)}")
    if schedule == "allgather" and plan.pass_ != "fwd":
        raise FlashsimError("the all-gather schedule's backward (a reduce-scatter of dK, dV) "
                            "is not modelled: use ring, zigzag or striped with a backward pass")
    return CPPlan(plan, P, schedule, tuple(layout(SCHEDULES[schedule][1], plan.seq_len, P)))


def _first_q_block(sp, q_pos, k_pos) -> int:
    """The first Q block that sees a key of ``k_pos`` (flash2's nest skips the ones before)."""
    if not sp.causal:
        return 0
    return int((visible_stop_j(q_pos, k_pos, sp.block_rows, sp.block_cols) == 0).sum())


def merge_nest(sp, first_block: int = 0) -> Nest:
    """(O, L) <- merge((O, L), (O_s, L_s)), row block by row block from ``first_block``.

    A normalised output with its logsumexp is the state m = L, l = 1, o = O; the merged
    state is written back normalised. Traffic over the R rows merged: read O, O_s: R d b
    each, L, L_s: 4 R each; write O: R d b, L: 4 R."""
    n, d, Br, b = sp.seq_len, sp.head_dim, sp.block_rows, sp.elem_bytes
    tensors = {"O": Tensor("O", n, d, b), "L": Tensor("L", n, 1, STAT_BYTES),
               "O_s": Tensor("O_s", n, d, b), "L_s": Tensor("L_s", n, 1, STAT_BYTES)}

    def fn(sram, ctx):
        ones = np.ones(sram["L_i"].shape[:-1])
        c = merge(State(sram["L_i"][..., 0], ones, sram["O_i"]),
                  State(sram["Ls_i"][..., 0], ones, sram["Os_i"]))
        with np.errstate(divide="ignore", invalid="ignore"):
            sram["O_i"] = np.where(c.l[..., None] > 0, c.output, 0.0)
            sram["L_i"] = (c.m + np.log(c.l))[..., None]

    body = (Loop("i", Br, n, label="merge (O, L) with a step's (O_s, L_s)", parallel=True,
                 start=(lambda ctx: first_block) if first_block else None, body=(
                     Load("O_i", "O", rows="i"), Load("L_i", "L", rows="i"),
                     Load("Os_i", "O_s", rows="i"), Load("Ls_i", "L_s", rows="i"),
                     Compute("O_i, L_i = merge((O_i, L_i), (O_s,i, L_s,i))", fn),
                     Store("O_i", "O", rows="i"), Store("L_i", "L", rows="i"))),)
    return Nest(tensors, body)


def add_nest(sp, rows: int, out: str, out_bytes: int, terms: list) -> Nest:
    """``out = sum(terms)``, elementwise over ``rows`` x d, row block by row block (the
    backward's accumulation and conversion passes). ``terms``: [(tensor, bytes), ...]."""
    d, Br = sp.head_dim, sp.block_rows
    tensors = {name: Tensor(name, rows, d, nb) for name, nb in terms}
    tensors[out] = Tensor(out, rows, d, out_bytes)
    bufs = [f"t{k}_i" for k in range(len(terms))]

    def fn(sram, ctx):
        sram["out_i"] = sum(sram[x] for x in bufs)

    body = tuple(Load(buf, name, rows="i") for buf, (name, _) in zip(bufs, terms))
    body += (Alloc("out_i", "i", d, out_bytes),
             Compute(f"{out} = {' + '.join(n for n, _ in terms)}", fn),
             Store("out_i", out, rows="i"))
    return Nest(tensors, (Loop("i", Br, rows, label=f"{out} = sum", parallel=True,
                               body=body),))


# ------------------------------------------------------------------------------- time

@dataclass
class Timeline:
    """Seconds. ``compute[p]``: [(step, src, start, end)] of device p's kernels per step
    (attention and merge or accumulation together); ``transfers``: [(Transfer, start,
    end)]; ``total_s`` when the last device is done; ``busy_s[p]`` its compute time;
    ``overlapped``: no device ever waited for a transfer."""
    cp: CPPlan
    gpu: GPU
    link: Link
    efficiency: float
    pass_: str
    compute: list
    transfers: list
    total_s: float
    busy_s: list
    overlapped: bool
    step_s: dict = field(default_factory=dict)      # (p, step) -> compute seconds
    step_start: list = field(default_factory=list)  # [p][s]: when device p starts step s
    step_end: list = field(default_factory=list)    # [p][s]: when it finishes it (ring)

    def step_seconds(self, p: int) -> list:
        """Device p's step durations, start to start (the last: start to its end): what a
        program that records an event at each step's start measures."""
        st, en = self.step_start[p], self.step_end[p]
        return [b - a for a, b in zip(st, st[1:])] + [en[-1] - st[-1]]

    @property
    def idle_s(self) -> list:
        return [self.total_s - b for b in self.busy_s]


def seconds(nbytes: float, flops: float, g: GPU, dtype: str, efficiency: float) -> float:
    """A kernel's roofline time: max(HBM bytes / bandwidth, FLOPs / (efficiency x peak))."""
    return max(nbytes / g.hbm_bandwidth, flops / (efficiency * g.peak_flops(dtype)))


def kernel_seconds(nest: Nest, heads: int, g: GPU, dtype: str, efficiency: float) -> float:
    """:func:`seconds` of one kernel's loop nest, counted (the timeline takes the same
    numbers from the closed forms, which tests hold equal to the counts)."""
    c = _nest.count(nest)
    nbytes = heads * (sum(c.read.values()) + sum(c.write.values()))
    return seconds(nbytes, heads * c.flops, g, dtype, efficiency)


def transfer_seconds(nbytes: float, ln: Link) -> float:
    return ln.latency + nbytes / ln.bandwidth


def _timeline(cp: CPPlan, g: GPU, ln: Link, eff: float, pass_: str) -> Timeline:
    P, H, dtype = cp.devices, cp.heads, cp.plan.dtype
    steps = {}                          # (p, step) -> (src, attention s, merge etc. s)
    final = np.zeros(P)                 # the backward's conversions after the last step
    for p in range(P):
        srcs = dict(cp.sources(p))
        for s, group, updates, flops in cp.step_forms(p, pass_):
            nbytes = H * sum(r + w for _, r, w in updates)
            sec = seconds(nbytes, H * flops, g, dtype, eff)
            if s == P:
                final[p] += sec
                continue
            src, attn, rest = steps.get((p, s), (srcs[s], 0.0, 0.0))
            steps[(p, s)] = ((src, attn + sec, rest) if group == "attention"
                             else (src, attn, rest + sec))
    xfers = cp.transfers(pass_)
    compute, placed, overlapped = [[] for _ in range(P)], [], True
    if cp.comm == "allgather":
        arrive = np.zeros(P)                         # when p holds the slice for step s
        for s in range(P - 1):
            nxt = np.zeros(P)
            for t in (x for x in xfers if x.step == s):
                t0 = arrive[t.src]
                t1 = t0 + transfer_seconds(H * t.nbytes, ln)
                placed.append((t, float(t0), float(t1)))
                nxt[t.dst] = t1
            arrive = nxt
        for p in range(P):
            src, attn, rest = steps[(p, 0)]
            compute[p].append((0, src, float(arrive[p]), float(arrive[p] + attn + rest)))
        overlapped = P == 1
        total = max(c[-1][3] for c in compute)
    else:
        bwd = pass_ == "bwd"
        start = np.zeros(P)                          # device p starts step s
        dkv_in = np.zeros(P)                         # the accumulator p needs at step s
        link_free = np.zeros(P)                      # link p -> p + 1 is free from
        st_log, en_log = [], []
        for s in range(P):
            ends = np.zeros(P)
            for p in range(P):
                src, attn, rest = steps.get((p, s), ((p - s) % P, 0.0, 0.0))
                ready = dkv_in[p] if bwd and s > 0 else 0.0   # accumulate needs dK, dV in
                ends[p] = max(start[p] + attn, ready) + rest
                if ready > start[p] + attn and (p, s) in steps:
                    overlapped = False                # had work, waited for the link
                if (p, s) in steps:
                    compute[p].append((s, src, float(start[p]), float(ends[p])))
            arrive, dkv_next = np.zeros(P), np.zeros(P)
            for t in (x for x in xfers if x.step == s):
                if t.what == "K,V":                  # sender has it, receiver's buffer free
                    t0 = max(start[t.src], start[t.dst], link_free[t.src])
                else:                                # the accumulator, once added to
                    t0 = max(ends[t.src], link_free[t.src])
                t1 = t0 + transfer_seconds(H * t.nbytes, ln)
                link_free[t.src] = t1
                placed.append((t, float(t0), float(t1)))
                (arrive if t.what == "K,V" else dkv_next)[t.dst] = t1
            st_log.append(start.copy())
            en_log.append(ends.copy())
            if s < P - 1:
                if any(arrive[p] > ends[p] and (p, s + 1) in steps for p in range(P)):
                    overlapped = False                # had work, waited for the link
                start = np.maximum(ends, arrive)
            dkv_in = dkv_next
        done = np.maximum(ends, dkv_in) if bwd and P > 1 else ends   # dK, dV home
        total = float(np.max(done + final))
    busy = [sum(c[3] - c[2] for c in compute[p]) for p in range(P)]
    step_s = {k: v[1] + v[2] for k, v in steps.items()}
    tl = Timeline(cp, g, ln, eff, pass_, compute, placed, float(total), busy, overlapped,
                  step_s)
    if cp.comm == "ring":
        tl.step_start = [[float(x[p]) for x in st_log] for p in range(P)]
        tl.step_end = [[float(x[p]) for x in en_log] for p in range(P)]
    return tl


def min_rows_for_overlap(gpu: str = DEFAULT_GPU, dtype: str = "bf16", *,
                         efficiency: float = 1.0, link_bandwidth: float | None = None) -> float:
    """n = N / P rows per device above which a compute-bound, unmasked ring step hides its
    K/V transfer (latency neglected): 4 n^2 d / F >= 2 n d b / beta, i.e. n >= F b / (2 beta)
    with F = efficiency x the preset's peak in ``dtype``."""
    from .units import dtype_bytes
    g = _gpu(gpu)
    beta = _link(gpu).bandwidth if link_bandwidth is None else link_bandwidth
    return efficiency * g.peak_flops(dtype) * dtype_bytes(dtype) / (2 * beta)


def measured_efficiency(head_dim: int, causal: bool = False) -> float | None:
    """The fraction of the H200's fp16 tensor peak that PyTorch's flash kernel reached in
    ``benchmarks/cupy_h200.py``'s measurements (``torch_flash``, fp16, this head dimension
    and mask, at the longest sequence measured), or None where it was not measured. The
    ring benchmark's kernels are that kernel, so this is the stated efficiency its time
    model uses (one number per kernel, never fitted to the ring's own timings)."""
    from . import measured
    pts = [x for x in measured.load("cupy_h200.json")["points"]
           if x["impl"] == "torch_flash" and x["d"] == head_dim and x["causal"] == causal]
    if not pts:
        return None
    best = max(pts, key=lambda x: x["N"])
    return best["tflops"] * 1e12 / _gpu("h200").peak_tensor_fp16


def uniform_ring_seconds(t_first: float, t_step: float, t_transfer: float,
                         devices: int) -> float:
    """The forward ring's time when every device has the same work: the first step's
    compute t_0 (attention only), each later step's t_c (attention and merge), each
    transfer t_x:  T = max(t_0, t_x) + (P - 2) max(t_c, t_x) + t_c  (P >= 2; t_0 for
    P = 1). Every transfer is hidden iff t_0 >= t_x (then t_c >= t_x too)."""
    if devices == 1:
        return t_first
    return max(t_first, t_transfer) + (devices - 2) * max(t_step, t_transfer) + t_step


# ------------------------------------------------------------------------- for the CLI

def cli_fields(cp: CPPlan, inputs=None) -> tuple[dict, list]:
    """What ``flashsim io --devices P --cp-schedule S`` adds: (JSON fields, table lines).
    ``inputs``: (Q, K, V, dO, ref) from ``--verify``, to run with values as well."""
    plan = cp.plan
    if inputs is None:
        rep = cp.count()
    else:
        Q, K, V, dO, ref = inputs
        got, rep = cp.run(Q, K, V, dO=dO)
        if dO is None:
            rep.max_abs_error = float(np.max(np.abs(got - ref["O"])))
        else:                                   # fwd+bwd and bwd: O is checked too
            got = {"O": rep.hbm["O"], **got._asdict()}
            rep.max_abs_error = max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)
    fields = rep.to_dict()
    lines = [f"context parallel: {cp.devices} devices, {cp.schedule} ({cp.comm}, "
             f"{cp.layout} slices of {', '.join(str(len(x)) for x in cp.positions)} rows)",
             f"{'link bytes (all)':<22}{rep.link_bytes:>25,}"]
    for p, dev in enumerate(rep.devices):
        lines.append(f"{'  device ' + str(p) + ' HBM':<22}{dev.hbm_bytes:>25,}"
                     f"{dev.flops:>25,} FLOPs")
    if plan.gpu is not None:
        tl = [cp.timeline(pass_=ps) for ps in cp.passes]
        fields["cp_predicted_time_s"] = sum(t.total_s for t in tl)
        fields["cp_overlapped"] = all(t.overlapped for t in tl)
        fields["link_bandwidth"] = tl[0].link.bandwidth
        lines.append(f"{'ring time (model)':<22}{fields['cp_predicted_time_s'] * 1e3:>22.4f} ms"
                     f"   ({tl[0].link.name}, {tl[0].link.bandwidth / 1e9:.0f} GB/s one way; "
                     f"{'transfers hidden' if fields['cp_overlapped'] else 'waits on links'})")
    if rep.max_abs_error is not None:
        lines.append(f"{'max |cp - ref|':<22}{rep.max_abs_error:>25.3e}")
    return fields, lines
