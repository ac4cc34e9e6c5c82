"""Ring attention on real GPUs, one process per GPU, beside flashsim's context-parallel model.

    # two GPUs, one process each, NCCL (the check the model is held to):
    python -m benchmarks.ring_attention --nproc 2 --out $OUT/ring_attention_h200x2.json
    # one GPU: P ranks emulated as CUDA streams, K/V "sent" by device-to-device copies
    python -m benchmarks.ring_attention --emulate --nproc 2 --out $OUT/ring_emulated.json
    # CPU, gloo, tiny shapes, float64 (what the test suite runs when PyTorch is installed)
    python -m benchmarks.ring_attention --backend gloo --device cpu --nproc 2 --smoke

Each rank holds the queries, keys and values of its positions (flashsim's layouts: ring and
allgather contiguous, zigzag, striped). At step s rank r attends to the K/V slice of rank
(r - s) mod P with PyTorch's flash kernel (``aten._scaled_dot_product_flash_attention``,
which returns the logsumexp L beside O; the CPU twin on CPU) while it sends that slice on
to r + 1 and receives the next from r - 1 (``batch_isend_irecv``), and merges the step's
(O_s, L_s) into its running (O, L): the (m, l, O) merge of online softmax with m = L, l = 1
(``flashsim.algorithms.online_softmax.merge``). A step whose keys the rank's queries cannot
see under the causal mask is skipped; within a step, the kernel runs on the rows and
columns that see each other (zigzag: all queries against the first key chunk, or the last
query chunk against all keys; striped: the strict lower triangle as Q[1:] against K[:-1]),
so every call is square-causal or unmasked. ``allgather`` gathers all K/V first
(``all_gather_into_tensor``), then runs the same calls with no overlap.

NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 are set
in the environment of every process before torch is imported: NVLink multicast is never used.

Method. Check before timing: the ranks' outputs, gathered in position order, are compared
on 64 query rows per head with a float64 reference (softmax(QK^T/sqrt(d))V of the same
inputs) and must be within twice the error of single-GPU flash attention on the whole
sequence (plus 1e-12 for float64 runs), and the whole output is compared with that
single-GPU output. Then warm-up, and per repeat: a barrier, an event (CPU: a clock) at the
start of every step and at the end of the last, the median of the repeats. Beside the ring:
the same step kernels with no communication (compute only), and the P - 1 transfers with
no compute (link only). Link bytes are what the program hands to the communicator (summed
over ranks), and, where ``nvidia-smi nvlink -gt d`` answers, NVLink's own data counters
over the timed repeats. The model: flashsim's CPPlan for the same shape and schedule on the
h200 preset, its kernels at the efficiency PyTorch's flash kernel reached on this H200
(``context_parallel.measured_efficiency``, from the committed single-GPU measurements:
stated, not fitted) and, second, at the efficiency this run's compute-only steps show.
"""

from __future__ import annotations

import os

# Before torch is imported, in this process and every process it starts: no NVLink multicast.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from gpu_kernels.harness import provenance  # noqa: E402
from flashsim import context_parallel as cpm  # noqa: E402
from flashsim.measure import Progress  # noqa: E402

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
REF_ROWS = 64


# ------------------------------------------------------------------------ the kernels

def attend(q, k, v, causal: bool):
    """(O_s, L_s): flash attention of q against k, v with its logsumexp (natural log).
    q: (B, H, n_q, d), k, v: (B, H, n_k, d); L_s: (B, H, n_q) fp32 (CPU: q's dtype).
    Square when causal: the mask is top-left, which every call here needs."""
    import torch
    if q.device.type == "cuda":
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    else:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out[0], out[1]


def merge_into(O, L, rows, O_s, L_s) -> None:
    """(O, L)[rows] <- merge((O, L)[rows], (O_s, L_s)) in place: online softmax's merge of
    two states (m = L, l = 1, o = O each): m = max, scale each by e^{L - m}, renormalise."""
    import torch
    o, lse = O[:, :, rows], L[:, :, rows]
    L_s = L_s.to(L.dtype)
    m = torch.maximum(lse, L_s)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)      # both empty: stay empty
    a, b = torch.exp(lse - m), torch.exp(L_s - m)
    l = a + b
    O[:, :, rows] = (a / l).unsqueeze(-1) * o + (b / l).unsqueeze(-1) * O_s.to(O.dtype)
    L[:, :, rows] = m + torch.log(l)


def step_calls(layout: str, rank: int, src: int, n: int, causal: bool) -> list:
    """[(query rows, key rows, causal)] for rank's step against src's slice (n rows each,
    equal slices): the parts that see each other, each call square-causal or unmasked."""
    full = slice(0, n)
    if not causal:
        return [(full, full, False)]
    if src == rank:
        return [(full, full, True)]
    h = n // 2
    if layout == "contiguous":
        return [(full, full, False)] if src < rank else []
    if layout == "zigzag":
        return [(full, slice(0, h), False)] if src < rank else [(slice(h, n), full, False)]
    if layout == "striped":
        return [(full, full, True)] if src < rank else [(slice(1, n), slice(0, n - 1), True)]
    raise ValueError(layout)


# ------------------------------------------------------------------- communication

class Ring:
    """Send to rank + 1 and receive from rank - 1 at once (torch.distributed)."""

    def __init__(self, rank: int, P: int):
        self.rank, self.P, self.sent = rank, P, 0

    def start(self, tensors):
        import torch.distributed as dist
        bufs = [torch_empty_like(t) for t in tensors]
        ops = []
        for t, b in zip(tensors, bufs):
            ops.append(dist.P2POp(dist.isend, t, (self.rank + 1) % self.P))
            ops.append(dist.P2POp(dist.irecv, b, (self.rank - 1) % self.P))
            self.sent += t.numel() * t.element_size()
        return dist.batch_isend_irecv(ops), bufs

    @staticmethod
    def finish(pending):
        reqs, bufs = pending
        for r in reqs:
            r.wait()
        return bufs


def torch_empty_like(t):
    import torch
    return torch.empty_like(t)


class Clock:
    """CUDA events on the current stream, or a wall clock on CPU."""

    def __init__(self, device):
        import torch
        self.cuda = device.type == "cuda"
        self.torch = torch

    def mark(self, stream=None):
        if not self.cuda:
            return time.perf_counter()
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(stream) if stream is not None else e.record()
        return e

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


# ---------------------------------------------------------------------- one rank's ring

def ring_forward(q, k, v, rank, P, schedule, causal, ring, clock, comm=True, gathered=None):
    """Rank's (O, L) over all K/V slices, and the marks at each step's start and the end.
    ``comm=False``: the same kernels on the rank's own K/V (compute only). ``gathered``:
    all ranks' K, V already here (allgather), one (k, v) per source."""
    import torch
    layout = cpm.SCHEDULES[schedule][1]
    n = q.shape[2]
    O = torch.zeros(q.shape, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype,
                    device=q.device)
    L = torch.full(q.shape[:-1], -math.inf, dtype=O.dtype, device=q.device)
    marks, cur = [], (k, v)
    for s in range(P):
        src = (rank - s) % P
        if gathered is not None:
            cur = gathered[src]
        pending = ring.start(cur) if comm and gathered is None and s < P - 1 else None
        marks.append(clock.mark())
        for rows, cols, c in step_calls(layout, rank, src, n, causal):
            O_s, L_s = attend(q[:, :, rows], cur[0][:, :, cols], cur[1][:, :, cols], c)
            merge_into(O, L, rows, O_s, L_s)
        if pending is not None:
            cur = tuple(Ring.finish(pending))
    marks.append(clock.mark())
    return O, L, marks


def reference_rows(Q, K, V, causal, rows):
    """float64 softmax(QK^T/sqrt d)V for query rows ``rows``: (B, H, len(rows), d)."""
    import torch
    q, k, v = (x.double() for x in (Q[:, :, rows], K, V))
    S = q @ k.transpose(-1, -2) / math.sqrt(Q.shape[-1])
    if causal:
        S = S.masked_fill(torch.arange(K.shape[2], device=S.device)[None, :]
                          > rows.to(S.device)[:, None], -math.inf)
    return torch.softmax(S, dim=-1) @ v


def nvlink_bytes(index: int):
    """(tx, rx) bytes from ``nvidia-smi nvlink -gt d`` summed over links, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "nvlink", "-gt", "d", "-i", str(index)],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    unit = {"B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30}
    tx = rx = 0
    found = False
    for kind, value, u in re.findall(r"Data (Tx|Rx):\s*([0-9]+)\s*(B|KiB|MiB|GiB)", out):
        found = True
        if kind == "Tx":
            tx += int(value) * unit[u]
        else:
            rx += int(value) * unit[u]
    return (tx, rx) if found else None


def one_point(rank, P, args, device, schedule, causal, N, mode):
    """Check, then time, one configuration; returns rank 0's record (others: None)."""
    import torch
    import torch.distributed as dist
    dtype = getattr(torch, DTYPES[args.dtype])
    B, H, d = args.batch, args.heads, args.head_dim
    layout = cpm.SCHEDULES[schedule][1]
    pos = cpm.layout(layout, N, P)
    if len({len(x) for x in pos}) != 1 or (layout == "zigzag" and N % (2 * P)):
        raise ValueError(f"the program needs equal slices: N = {N} over {P} ranks ({layout})")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    Q, K, V = (torch.randn((B, H, N, d), generator=gen, device=device, dtype=dtype)
               for _ in range(3))
    idx = torch.as_tensor(pos[rank], device=device)
    q, k, v = (X.index_select(2, idx).contiguous() for X in (Q, K, V))
    clock, ring = Clock(device), Ring(rank, P)

    def run_once(comm=True):
        if schedule == "allgather":
            ks, vs = ([torch.empty_like(x) for _ in range(P)] for x in (k, v))
            if comm:
                t0 = clock.mark()
                dist.all_gather(ks, k)
                dist.all_gather(vs, v)
                ring.sent += (P - 1) * 2 * k.numel() * k.element_size()
            else:
                t0 = None
                ks, vs = [k] * P, [v] * P
            O, L, marks = ring_forward(q, k, v, rank, P, schedule, causal, ring, clock,
                                       gathered=list(zip(ks, vs)))
            return O, L, ([t0] + marks if t0 is not None else marks)
        return ring_forward(q, k, v, rank, P, schedule, causal, ring, clock, comm=comm)

    # ---- check before timing
    O, L, _ = run_once()
    outs = [torch.empty_like(O) for _ in range(P)]
    dist.all_gather(outs, O)
    check = None
    if rank == 0:
        O_ring = torch.empty((B, H, N, d), dtype=O.dtype, device=device)
        for r in range(P):
            O_ring[:, :, torch.as_tensor(pos[r], device=device)] = outs[r]
        O_single, _ = attend(Q, K, V, causal)
        rows = torch.linspace(0, N - 1, min(REF_ROWS, N), device=device).round().long()
        ref = reference_rows(Q, K, V, causal, rows)
        err_ring = float((O_ring[:, :, rows].double() - ref).abs().max())
        err_single = float((O_single[:, :, rows].double() - ref).abs().max())
        floor = 1e-12 if dtype == torch.float64 else 0.0
        check = {"max_abs_err_ring_vs_float64": err_ring,
                 "max_abs_err_single_gpu_vs_float64": err_single,
                 "max_abs_diff_ring_vs_single_gpu": float((O_ring - O_single.to(O_ring.dtype))
                                                          .abs().max()),
                 "rows_checked_per_head": len(rows), "bound": 2 * err_single + floor,
                 "check_ok": err_ring <= 2 * err_single + floor}
    ok = [check["check_ok"] if check else True]
    dist.broadcast_object_list(ok, src=0)
    if not ok[0]:
        return {"check": check, "skipped": "check failed"} if rank == 0 else None

    # ---- timing: the ring, compute only, link only
    def timed(fn, reps):
        out = []
        for _ in range(reps):
            dist.barrier()
            marks = fn()
            clock.sync()
            out.append([clock.ms(a, b) for a, b in zip(marks, marks[1:])])
        return out

    for _ in range(args.warmup):
        run_once()
    clock.sync()
    ring.sent = 0
    nv0 = nvlink_bytes(rank) if device.type == "cuda" and rank == 0 else None
    ring_steps = timed(lambda: run_once()[2], args.reps)
    nv1 = nvlink_bytes(rank) if nv0 is not None else None
    sent = torch.tensor([ring.sent], dtype=torch.float64, device=device)
    dist.all_reduce(sent)                                  # bytes handed over, all ranks
    compute_steps = timed(lambda: run_once(comm=False)[2], args.reps)

    def link_only():
        marks = [clock.mark()]
        cur = (k, v)
        for s in range(P - 1):
            cur = tuple(Ring.finish(ring.start(cur)))
        marks.append(clock.mark())
        return marks

    link = [x[0] / max(P - 1, 1) for x in timed(link_only, args.reps)] if P > 1 else [0.0]
    med = [statistics.median(col) for col in zip(*ring_steps)]
    med_c = [statistics.median(col) for col in zip(*compute_steps)]
    per_rank = [None] * P
    dist.all_gather_object(per_rank, {"ring_step_ms": med, "compute_step_ms": med_c,
                                      "ring_total_ms": statistics.median(sum(x) for x in ring_steps),
                                      "link_ms_per_transfer": statistics.median(link)})
    if rank != 0:
        return None
    record = {"schedule": schedule, "layout": layout, "causal": causal, "N": N, "d": d,
              "B": B, "H": H, "dtype": args.dtype, "devices": P, "mode": mode,
              "check": check, "reps": args.reps,
              "measured": {"per_rank": per_rank,
                           "total_ms": max(r["ring_total_ms"] for r in per_rank),
                           "link_bytes_sent_per_run": float(sent.item()) / args.reps,
                           "nvlink_counter_bytes": (None if nv0 is None or nv1 is None else
                                                    {"tx": nv1[0] - nv0[0], "rx": nv1[1] - nv0[1],
                                                     "runs": args.reps})}}
    record["model"] = model(record, P, args, Q.element_size())
    return record


def model(record, P, args, elem_bytes: int) -> dict:
    """flashsim's prediction for the same run (h200 preset), and the ratios. flashsim has
    no fp64: its link count, in elements, is scaled to the program's element size."""
    import flashsim
    dtype = "fp16" if args.dtype == "fp16" else "bf16" if args.dtype == "bf16" else "fp32"
    plan = flashsim.plan("flash2", record["N"], record["d"], batch=record["B"],
                         heads=record["H"], dtype=dtype, causal=record["causal"], gpu="h200")
    cp = cpm.cp_plan(plan, P, record["schedule"])
    out = {"link_bytes": cp.count().link_bytes // plan.elem_bytes * elem_bytes,
           "gpu_preset": "h200", "link_bandwidth": cpm._link("h200").bandwidth}
    effs = {"stated": cpm.measured_efficiency(record["d"], False)}
    meas = record["measured"]["per_rank"]
    steady = [ms for r in meas for ms in r["compute_step_ms"][1:] if ms > 0]
    tl1 = cp.timeline(efficiency=1.0)
    flops_step = [tl1.step_s.get((r, s)) for r in range(P) for s in range(1, P)]
    if steady and cp.comm == "ring" and not record["causal"] and P > 1:
        # this run's own kernel rate: the model's step seconds at peak over the measured ones
        effs["this_run"] = min(1.0, statistics.median(
            [f for f in flops_step if f]) / (statistics.median(steady) * 1e-3))
    for name, eff in effs.items():
        if eff is None:
            continue
        tl = cp.timeline(efficiency=eff)
        entry = {"efficiency": eff, "total_ms": tl.total_s * 1e3,
                 "overlapped": tl.overlapped,
                 "transfer_ms": cpm.transfer_seconds(
                     cp.heads * cp.transfers("fwd")[0].nbytes, tl.link) * 1e3 if P > 1 else 0.0}
        if tl.step_start:
            entry["step_ms"] = [[x * 1e3 for x in tl.step_seconds(p)] for p in range(P)]
        entry["measured_over_model_total"] = record["measured"]["total_ms"] / entry["total_ms"]
        out[name] = entry
    return out


# ----------------------------------------------------------------------------- drivers

def worker(rank, P, args, backend, results_path):
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=P,
                            **({"device_id": device} if device.type == "cuda" else {}))
    points, skipped = [], []
    t_start = time.time()
    bar = Progress(total=len(args.seq_len) * len(args.schedule) * len(args.causal),
                   quiet=args.quiet or rank != 0, desc="ring_attention")
    try:
        for N in args.seq_len:
            for schedule in args.schedule:
                for causal in args.causal:
                    bar.update()
                    if time.time() - t_start > args.deadline_s:
                        skipped.append({"N": N, "schedule": schedule, "causal": causal,
                                        "reason": "deadline"})
                        continue
                    try:
                        rec = one_point(rank, P, args, device, schedule, causal, N,
                                        f"{backend} {P} ranks on {device.type}")
                    except torch.cuda.OutOfMemoryError as e:
                        rec = {"skipped": f"out of memory: {e}"}
                    if rank == 0 and rec is not None:
                        (skipped if "skipped" in rec else points).append(
                            {**rec, "N": N, "schedule": schedule, "causal": causal})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        bar.close()
        if rank == 0:
            write(results_path, args, points, skipped, backend, device)
    finally:
        dist.destroy_process_group()


def emulated(args, results_path):
    """One GPU, P ranks as streams: each rank computes on its own stream and 'sends' K/V
    by a device-to-device copy on a copy stream, so the program's structure (steps, merge,
    overlap) runs on one card; times are not a check of the two-GPU model."""
    import torch
    device = torch.device("cuda", 0)
    dtype = getattr(torch, DTYPES[args.dtype])
    P, points = args.nproc, []
    comp = [torch.cuda.Stream() for _ in range(P)]
    copy = [torch.cuda.Stream() for _ in range(P)]
    clock = Clock(device)
    for N in args.seq_len:
        for schedule in (s for s in args.schedule if s != "allgather"):
            for causal in args.causal:
                layout = cpm.SCHEDULES[schedule][1]
                pos = cpm.layout(layout, N, P)
                gen = torch.Generator(device=device).manual_seed(args.seed)
                Q, K, V = (torch.randn((args.batch, args.heads, N, args.head_dim),
                                       generator=gen, device=device, dtype=dtype)
                           for _ in range(3))
                sl = [torch.as_tensor(x, device=device) for x in pos]
                qs, ks, vs = ([X.index_select(2, i).contiguous() for i in sl] for X in (Q, K, V))
                n = qs[0].shape[2]

                def run(record=False):
                    O = [torch.zeros(q.shape, dtype=torch.float32, device=device) for q in qs]
                    L = [torch.full(q.shape[:-1], -math.inf, device=device) for q in qs]
                    cur = list(zip(ks, vs))
                    marks = [[] for _ in range(P)]
                    ready = [None] * P
                    sent = 0
                    for st in comp + copy:       # inputs and O, L come from the default stream
                        st.wait_stream(torch.cuda.current_stream())
                    for s in range(P):
                        nxt = [None] * P
                        started = []
                        for r in range(P):
                            with torch.cuda.stream(comp[r]):
                                if ready[r] is not None:
                                    comp[r].wait_event(ready[r])
                                marks[r].append(clock.mark(comp[r]))
                                started.append(marks[r][-1])
                        for r in range(P):
                            if s < P - 1:        # r "sends" its slice to r + 1
                                with torch.cuda.stream(copy[r]):
                                    copy[r].wait_event(started[r])
                                    kk, vv = cur[r][0].clone(), cur[r][1].clone()
                                    for x in (kk, vv):   # used on the receiver's stream
                                        x.record_stream(comp[(r + 1) % P])
                                    ev = torch.cuda.Event()
                                    ev.record(copy[r])
                                    nxt[(r + 1) % P] = (kk, vv, ev)
                                    sent += 2 * kk.numel() * kk.element_size()
                            src = (r - s) % P
                            with torch.cuda.stream(comp[r]):
                                for rows, cols, c in step_calls(layout, r, src, n, causal):
                                    O_s, L_s = attend(qs[r][:, :, rows], cur[r][0][:, :, cols],
                                                      cur[r][1][:, :, cols], c)
                                    merge_into(O[r], L[r], rows, O_s, L_s)
                        if s < P - 1:
                            cur = [(x[0], x[1]) for x in nxt]
                            ready = [x[2] for x in nxt]
                    for r in range(P):
                        marks[r].append(clock.mark(comp[r]))
                    torch.cuda.synchronize()
                    return O, marks, sent

                O, _, sent = run()
                O_ring = torch.empty((args.batch, args.heads, N, args.head_dim),
                                     dtype=torch.float32, device=device)
                for r in range(P):
                    O_ring[:, :, sl[r]] = O[r]
                O_single, _ = attend(Q, K, V, causal)
                rows = torch.linspace(0, N - 1, min(REF_ROWS, N), device=device).round().long()
                ref = reference_rows(Q, K, V, causal, rows)
                err_ring = float((O_ring[:, :, rows].double() - ref).abs().max())
                err_single = float((O_single[:, :, rows].double() - ref).abs().max())
                check = {"max_abs_err_ring_vs_float64": err_ring,
                         "max_abs_err_single_gpu_vs_float64": err_single,
                         "check_ok": err_ring <= 2 * err_single}
                rec = {"schedule": schedule, "layout": layout, "causal": causal, "N": N,
                       "d": args.head_dim, "B": args.batch, "H": args.heads, "dtype": args.dtype,
                       "devices": P, "mode": f"emulated: {P} ranks as streams on one GPU",
                       "check": check, "link_bytes_copied_per_run": sent}
                if check["check_ok"]:
                    for _ in range(args.warmup):
                        run()
                    steps = []
                    for _ in range(args.reps):
                        _, marks, _ = run()
                        steps.append([[clock.ms(a, b) for a, b in zip(m, m[1:])] for m in marks])
                    rec["measured_step_ms"] = [[statistics.median(x[r][s] for x in steps)
                                                for s in range(P)] for r in range(P)]
                points.append(rec)
    write(results_path, args, points, [], "emulated", device)


def write(path, args, points, skipped, backend, device):
    import torch
    extra = {"backend": backend, "device": str(device), "nproc": args.nproc}
    if device.type == "cuda":
        extra.update({"gpus": [torch.cuda.get_device_name(i)
                               for i in range(torch.cuda.device_count())],
                      "torch_cuda": torch.version.cuda,
                      "nccl": _version(torch.cuda.nccl.version())})
        try:
            extra["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.split()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            extra["driver"] = None
    doc = {"provenance": provenance(("numpy", "torch"), extra),
           "method": __doc__.split("Method. ")[1].strip(),
           "points": points, "skipped": skipped}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}: {len(points)} points, {len(skipped)} skipped")
    for p in points:
        m = p.get("measured", {})
        mod = p.get("model", {}).get("stated", {})
        print(f"  {p['schedule']:<9} causal={p['causal']!s:<5} N={p['N']:<6} "
              f"check_ok={p['check']['check_ok']} "
              f"total={m.get('total_ms', float('nan')):.3f} ms "
              f"model={mod.get('total_ms', float('nan')):.3f} ms "
              f"ratio={mod.get('measured_over_model_total', float('nan')):.2f}")


def _version(v) -> str:
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (one GPU each)")
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--emulate", action="store_true",
                    help="one GPU: the ranks as CUDA streams, sends as copies")
    ap.add_argument("--schedule", type=lambda s: s.split(","),
                    default=["ring", "zigzag", "striped", "allgather"])
    ap.add_argument("--causal", type=lambda s: [bool(int(x)) for x in s.split(",")],
                    default=[False, True], help="e.g. 0,1")
    ap.add_argument("--seq-len", type=lambda s: [int(x) for x in s.split(",")],
                    default=[8192, 32768])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=400.0)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, float64, 2 repeats (CPU test)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                  "ring_attention.json"))
    args = ap.parse_args(argv)
    for s in args.schedule:
        if s not in cpm.SCHEDULES:
            ap.error(f"unknown schedule {s!r}: choose from {', '.join(cpm.SCHEDULES)}")
    if args.smoke:
        args.seq_len, args.head_dim, args.heads, args.batch = [48], 16, 2, 1
        args.dtype, args.reps, args.warmup = "fp64", 2, 1
    if args.device == "cpu" and args.backend == "nccl":
        ap.error("NCCL needs GPUs: use --backend gloo with --device cpu")
    if args.emulate:
        return emulated(args, args.out)
    import torch.multiprocessing as mp
    args.port = free_port()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:          # under torchrun
        args.port = int(os.environ.get("MASTER_PORT", args.port))
        return worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args,
                      args.backend, args.out)
    mp.spawn(worker, args=(args.nproc, args, args.backend, args.out), nprocs=args.nproc,
             join=True)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
