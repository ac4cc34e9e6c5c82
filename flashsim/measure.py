"""``flashsim measure``: run one of our GPU kernels on this machine and print what flashsim
predicted for exactly that launch beside what the GPU did.

    flashsim measure --kernel numba_flash2 --seq-len 4096 --head-dim 64 --batch 4 --heads 16
    flashsim measure --kernel cupy_decode_paged --kv-len 32768 --kv-heads 8 --page-size 16
    flashsim measure --all --ncu --json      # every forward and decode kernel; with counters

For each kernel (``--kernel NAME`` of ``gpu_kernels.registry``, or ``--all``: every forward
kernel and every decode kernel) at one configuration (the ``flashsim io`` shape flags; by
default B = 2, H = 8, N = 2048, d = 64 and each kernel's first dtype; a decode kernel takes
the decode flags ``--q-len --kv-len|--kv-lens --kv-heads --splits --page-size --no-causal``,
by default ``DEFAULT_DECODE_SHAPE``: B = 8, H = 32, kv_heads = 8, q_len = 1, kv_len = 32768,
d = 128, pages of 16 for the paged kernel):

* **measured**: ``gpu_kernels.measure`` (a decode kernel: ``gpu_kernels.measure_decode``,
  checked as benchmarks/decode_h200.py checks it): random inputs, checked against the float64
  reference first (a launch that fails is not timed), then timed by the one harness
  (``gpu_kernels.harness``: CUDA events, warm-up, an L2 flush before every repeat, the
  median). With ``--ncu`` (Nsight Compute's ``ncu`` on PATH) the checked launches are also
  run once each in a child process under ncu (``gpu_kernels.ncu``): DRAM bytes read and
  written, the L2 sectors the SMs requested, and the kernels' own time.
* **predicted** (``predict``): flashsim's plan for that launch (``launch.plan()``: the same
  tiles, N, d, batch, heads, dtype and mask), its DRAM and L2 request bytes from the L2 model
  (``flashsim.hardware.l2``) and its time from the time model (``flashsim.hardware.timing``)
  on the H200 preset, as ``flashsim predict`` gives it (``flashsim.predict``: the kernel's
  stated efficiency, fitted on the calibration points), as ``flashsim.measured.validation``
  predicts the datasets; a decode kernel's is ``flashsim.predict_decode`` (the memory-bound
  time model on the L2 model's DRAM bytes).

Exit status: 0 when every launch passed its check, 1 when one failed (or could not run), 2
for bad input or no GPU to run on: without the ``gpu`` extra, without an NVIDIA GPU, or
under numba's CUDA simulator (which runs kernels on the CPU and is not a GPU), one line on
stderr before anything runs. Nothing here imports ``gpu_kernels``, numba or CuPy until the
command runs.
"""

from __future__ import annotations

import json
import sys

from .errors import FlashsimError
from .hardware.presets import DEFAULT_GPU

DEFAULT_SHAPE = {"batch": 2, "heads": 8, "seq_len": 2048, "head_dim": 64}
# the decode kernels' (issue 14's reference point: B8, kv_heads 8, kv_len 32k)
DEFAULT_DECODE_SHAPE = {"batch": 8, "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 32768,
                        "head_dim": 128, "page_size": 16}
# what each backend imports (numba through gpu_kernels, which fixes NumPy for it first)
BACKEND_MODULES = {"numba": "gpu_kernels.numba.common", "cupy": "cupy"}


class NoGPUError(FlashsimError):
    """Nothing to measure on: no ``gpu`` extra, no NVIDIA GPU, the simulator, no ncu."""


class Answer(str):
    """The text to print and the exit status that goes with it."""
    exit_status = 0


def add_arguments(p, *, seq_len, head_dim, batch, heads, tile, dtype, repeats) -> None:
    """``flashsim measure``'s options; the ``type`` readers are ``flashsim.cli``'s."""
    from .predict_decode import add_arguments as decode_arguments

    p.add_argument("--kernel", "-k", help="a kernel of gpu_kernels.registry (see --all)")
    p.add_argument("--all", action="store_true", help="every registered forward kernel and "
                   "every decode kernel (the decode flags go to the decode kernels, --seq-len "
                   "and the tiles to the others)")
    p.add_argument("--seq-len", "-N", type=seq_len, help=f"N (default {DEFAULT_SHAPE['seq_len']})")
    p.add_argument("--head-dim", "-d", type=head_dim,
                   help=f"d (default {DEFAULT_SHAPE['head_dim']})")
    p.add_argument("--batch", type=batch, help=f"default {DEFAULT_SHAPE['batch']}")
    p.add_argument("--heads", type=heads, help=f"default {DEFAULT_SHAPE['heads']}")
    p.add_argument("--dtype", type=dtype, help="default: the kernel's first (fp32; fp16 for "
                   "the tensor-core kernel); with --all, kernels without it are skipped")
    p.add_argument("--causal", action="store_true", help="causal mask")
    p.add_argument("--block-rows", type=tile, help="B_r (default: the kernel's tile rule)")
    p.add_argument("--block-cols", type=tile, help="B_c (default: the kernel's tile rule)")
    p.add_argument("--repeats", type=repeats, help="timed repeats (default: the harness's, "
                   "enough for 0.2 s, 5 to 30)")
    p.add_argument("--ncu", action="store_true", help="also DRAM and L2 request bytes from "
                   "Nsight Compute (ncu on PATH): each kernel run once more under ncu, all in "
                   "one child process")
    p.add_argument("--json", action="store_true", help="one JSON object (a list with --all)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    decode_arguments(p)


# ------------------------------------------------------------------ the prediction
def predict(launch) -> dict:
    """``flashsim predict``'s answer for exactly ``launch`` (a ``gpu_kernels`` Launch) on the
    H200 preset (``flashsim.predict.predict``: the kernel's tiles, occupancy from its compiled
    resources, the L2 and time models at its stated efficiency), with the launch's plan
    record. Past the L2 model's work limit the time and DRAM bytes are left out, with why in
    ``note``; with no stated efficiency ``predicted_time_s`` is None (not a guess). A decode
    kernel's: ``flashsim.predict_decode`` for the same launch (``spec``)."""
    from . import predict as _predict
    from .predict_decode import predict_decode

    try:
        if is_decode(launch):
            kw = spec(launch)
            out = predict_decode(kw.pop("kernel"), gpu=DEFAULT_GPU, **kw)
        else:
            out = _predict.predict(launch.kernel, batch=launch.batch, heads=launch.heads,
                                   seq_len=launch.N, head_dim=launch.d, dtype=launch.dtype,
                                   causal=launch.causal, block_rows=launch.block_rows,
                                   block_cols=launch.block_cols, gpu=DEFAULT_GPU)
    except FlashsimError as e:
        return {"gpu": DEFAULT_GPU, "plan": launch.plan_record(),
                "note": f"time and DRAM bytes left out: {e}"}
    return dict(out, plan=launch.plan_record())


# ------------------------------------------------------------------ before any work
def _require_backends(backends) -> None:
    """The ``gpu`` extra's modules for ``backends`` import (numba.cuda, CuPy)."""
    for b in sorted(backends):
        try:
            __import__(BACKEND_MODULES[b])
        except ImportError as e:
            raise NoGPUError(f"flashsim measure needs the gpu extra for its {b} kernels ({e}); "
                             "install it with pip install -e '.[gpu]'") from None


def _require_gpu(backends) -> None:
    """A real NVIDIA GPU for every backend in ``backends``; never numba's simulator."""
    if "numba" in backends:
        from gpu_kernels.numba.common import cuda, numba

        if numba.config.ENABLE_CUDASIM:
            raise NoGPUError("numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it runs "
                             "kernels on the CPU and is not a GPU; unset it to measure")
        if not cuda.is_available():
            raise NoGPUError("no NVIDIA GPU: numba.cuda finds no CUDA device")
    if "cupy" in backends:
        import gpu_kernels

        if not gpu_kernels.gpu_available():
            raise NoGPUError("no NVIDIA GPU: CuPy finds no CUDA device")


def _shape(args) -> dict:
    return {k: DEFAULT_SHAPE[k] if getattr(args, k) is None else getattr(args, k)
            for k in DEFAULT_SHAPE}


def is_decode(launch) -> bool:
    """Whether ``launch`` is a decode kernel's (``gpu_kernels.registry.DECODE_KERNELS``)."""
    from gpu_kernels import registry

    return launch.kernel in registry.DECODE_KERNELS


def _launches(args) -> tuple[list, list]:
    """(configured launches, skipped rows): every input checked before anything runs."""
    from gpu_kernels import KernelInputError, registry
    from . import validate
    from .predict_decode import check_flags, launch_options

    if bool(args.kernel) == bool(args.all):
        raise FlashsimError("give --kernel NAME or --all (one of them)")
    names = [k.name for k in registry.KERNELS.values() if k.pass_ == "fwd"] + \
        list(registry.DECODE_KERNELS) if args.all else \
        [validate.choice(args.kernel, [*registry.KERNELS, *registry.DECODE_KERNELS], "--kernel")]
    if not args.all:
        check_flags(args, names[0] in registry.DECODE_KERNELS, names[0])
    kw = dict(_shape(args), dtype=args.dtype, causal=args.causal, block_rows=args.block_rows,
              block_cols=args.block_cols)
    _require_backends({registry.get(n).backend for n in names})
    launches, skipped = [], []
    for n in names:
        entry = registry.get(n)
        try:
            if n in registry.DECODE_KERNELS:
                launches.append(entry.launch(**launch_options(
                    entry, args, DEFAULT_DECODE_SHAPE, every=args.all)))
            else:
                launches.append(entry.launch(**kw))
        except KernelInputError as e:
            if not args.all:
                raise
            skipped.append({"kernel": n, "skipped": str(e)})
    if not launches:
        raise FlashsimError("no registered kernel runs this configuration: "
                            + "; ".join(s["skipped"] for s in skipped))
    for x in launches:
        _check_host_memory(x)
    return launches, skipped


def _check_host_memory(launch) -> None:
    """Refuse, before anything runs, a check whose float64 reference would not fit in this
    process's memory: the checked heads' N x N matrices (about 4 float64 forward, 7 backward,
    as ``flashsim io --verify`` counts them, and 4 float32 of the plain baseline) and the
    host copies of the inputs. A decode step's: per checked (sequence, KV head) its K and V
    rows (float32 copies, float64 and the plain baseline's: about 48 bytes per element) and
    its query rows' scores against them (about 8 float64 matrices)."""
    from gpu_kernels import harness
    from . import validate

    if is_decode(launch):
        from gpu_kernels.cupy import decode

        pairs = len(decode.checked_pairs(launch))
        need = pairs * launch.N * (48 * launch.d + 64 * launch.group_rows)
    else:
        heads = len(harness.checked_heads(launch.BH, launch.N))
        bwd = launch.pass_ == "bwd"
        need = (heads * launch.N ** 2 * (8 * (7 if bwd else 4) + 4 * 4)
                + (4 if bwd else 3) * 4 * launch.BH * launch.N * launch.d)
    allowed = int(validate.VERIFY_MEMORY_SHARE * validate.memory_allowance())
    if need > allowed:
        raise FlashsimError(
            f"checking {launch.kernel} at N = {launch.N} against the float64 reference needs "
            f"about {need:,} B of host memory, but this process may use {allowed:,} B (half "
            "of the memory still free to it); use a smaller N or batch x heads")


# ------------------------------------------------------------------ the work
def measure_launch(launch, repeats=None, harness=None) -> dict:
    """Check, then time, ``launch`` (``gpu_kernels.measure``, a decode kernel's
    ``gpu_kernels.measure_decode``, with its own harness unless ``harness`` is given) beside
    ``predict(launch)``."""
    import gpu_kernels

    if is_decode(launch):
        what = spec(launch)
        m = gpu_kernels.measure_decode(what.pop("kernel"), **what, repeats=repeats, harness=harness)
        checked, rate = "pairs_checked", "tbps"
    else:
        m = gpu_kernels.measure(launch.kernel, batch=launch.batch, heads=launch.heads,
                                seq_len=launch.N, head_dim=launch.d, dtype=launch.dtype,
                                causal=launch.causal, block_rows=launch.block_rows,
                                block_cols=launch.block_cols, repeats=repeats, harness=harness)
        checked, rate = "heads_checked", "tflops"
    keep = ("kernel", "config", "tiles", "threads", "static_smem", "dynamic_smem", "launches",
            "check_ok", "max_error", "bound", checked, "method")
    row = {k: m[k] for k in keep}
    row["measured"] = {k: m[k] for k in ("time_s", "times_s", rate) if m[k] is not None}
    row["predicted"] = predict(launch)
    return row


def spec(launch) -> dict:
    """What ``gpu_kernels.ncu.profile`` (and a decode kernel's ``gpu_kernels.measure_decode``
    and ``predict_decode``) needs to build ``launch`` again: a decode launch's configure
    keywords (``DecodeLaunch.options``: its splits, tiles, warps and versions); a paged launch's
    block table is ``DecodeKernel.launch``'s own (seeded), so the same again."""
    if is_decode(launch):
        return {"kernel": launch.kernel, "batch": launch.batch, "heads": launch.heads,
                "kv_heads": launch.kv_heads, "head_dim": launch.d, "q_len": launch.q_len,
                **launch.lens(), "dtype": launch.dtype, "causal": launch.causal,
                "page_size": launch.page_size or None, **launch.options()}
    return {"kernel": launch.kernel, "batch": launch.batch, "heads": launch.heads,
            "seq_len": launch.N, "head_dim": launch.d, "dtype": launch.dtype,
            "causal": launch.causal, "block_rows": launch.block_rows,
            "block_cols": launch.block_cols}


def add_counters(rows: list, launches: list) -> None:
    """Nsight Compute's counters of every launch that passed its check, into its row's
    "measured" (``flashsim.measured.validation.measured``: bytes and seconds); a failure of
    ncu goes into each row's ``ncu_error``."""
    from gpu_kernels import ncu
    from .measured import validation

    todo = [(r, x) for r, x in zip(rows, launches) if r.get("check_ok")]
    if not todo:
        return
    try:
        profiled = ncu.profile([spec(x) for _, x in todo])
    except ncu.NcuError as e:
        for r, _ in todo:
            r["ncu_error"] = str(e)
        return
    for (r, _), launch_rows in zip(todo, profiled):
        got = validation.measured({"launches": launch_rows})
        r["measured"].update(
            dram_read_bytes=got["dram_read_bytes"], dram_write_bytes=got["dram_write_bytes"],
            l2_read_bytes=got["l2_read_bytes"], l2_write_bytes=got["l2_write_bytes"],
            ncu_time_s=got["time_s"])
        r["ncu_launches"] = launch_rows


class Progress:
    """A progress bar (tqdm) on stderr over ``items``, or over ``total`` steps counted by
    ``update()`` until ``close()``; none with ``quiet`` or when stderr is no terminal. While
    it is shown, each line the program prints goes above it (the bar is cleared, the line
    written to stdout, the bar drawn again), so lines and bar do not mix; nothing printed
    changes. Without tqdm installed (a bare GPU image) there is no bar, and nothing else
    changes."""

    def __init__(self, items=None, *, quiet: bool = False, desc: str | None = None,
                 total: int | None = None):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = _NoBar
        self.bar = tqdm(items, total=total, desc=desc, file=sys.stderr, leave=False,
                        disable=quiet or not sys.stderr.isatty() or tqdm is _NoBar)
        self._stdout = None
        if not self.bar.disable:
            self._stdout, sys.stdout = sys.stdout, _AboveTheBar(sys.stdout, self.bar)

    @property
    def disable(self) -> bool:
        return self.bar.disable

    def __iter__(self):
        try:
            yield from self.bar
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        if self._stdout is not None:
            sys.stdout.flush_pending()
            sys.stdout, self._stdout = self._stdout, None
        self.bar.close()


class _NoBar:
    """What Progress needs of a tqdm bar, showing nothing."""

    def __init__(self, items=None, **kw):
        self.items, self.disable = items, True

    def __iter__(self):
        return iter(self.items)

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class _AboveTheBar:
    """sys.stdout while a bar is shown: whole lines written above the bar (print writes a
    line in pieces, so text is held until its newline)."""

    def __init__(self, out, bar):
        self.out, self.bar, self.pending = out, bar, ""

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            lines, self.pending = self.pending.rsplit("\n", 1)
            self.bar.clear()
            self.out.write(lines + "\n")
            self.out.flush()
            self.bar.refresh()
        return len(text)

    def flush_pending(self) -> None:
        if self.pending:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()

    def __getattr__(self, name):
        return getattr(self.out, name)


def run(args) -> tuple[list, list]:
    """(rows, skipped) for the parsed ``args`` of ``flashsim measure``."""
    launches, skipped = _launches(args)
    from gpu_kernels import registry

    _require_gpu({registry.get(x.kernel).backend for x in launches})
    if args.ncu:
        from gpu_kernels import ncu

        if ncu.executable() is None:
            raise NoGPUError("--ncu needs Nsight Compute: no ncu on PATH")
    rows = []
    for launch in Progress(launches, quiet=args.quiet, desc="flashsim measure"):
        try:
            rows.append(measure_launch(launch, args.repeats))
        except Exception as e:  # noqa: BLE001 - a kernel that cannot run is a result, not a crash
            rows.append({"kernel": launch.kernel, "config": spec(launch), "check_ok": False,
                         "error": _one_line(f"{type(e).__name__}: {e}")})
    if args.ncu:
        add_counters(rows, launches)
    return rows, skipped


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ the output
def _ratio(pred, meas) -> str:
    if pred is None or meas is None or not meas:
        return "-"
    return f"{pred / meas:.2f}x"


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.1f}"


def format_rows(rows: list, skipped: list) -> str:
    """One fixed-format line per kernel: check, then time, DRAM bytes and L2 request bytes,
    each measured / predicted (predicted over measured)."""
    head = (f"{'kernel':<18}{'dtype':<6}{'tiles':>9}  {'check':<7}{'time ms: meas':>14}"
            f"{'pred':>9}{'ratio':>7}  {'DRAM MB: meas':>14}{'pred':>9}{'ratio':>7}"
            f"  {'L2 req MB: meas':>16}{'pred':>9}{'ratio':>7}")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['kernel']:<18}could not run: {r['error']}")
            continue
        m, p = r["measured"], r["predicted"]
        tiles = f"{r['tiles']['block_rows']}x{r['tiles']['block_cols']}"
        t_m, t_p = m.get("time_s"), p.get("predicted_time_s")
        dram_m = _sum(m, "dram")
        dram_p, l2_p, l2_m = _sum(p, "dram"), _sum(p, "l2"), _sum(m, "l2")
        lines.append(
            f"{r['kernel']:<18}{r['config']['dtype']:<6}{tiles:>9}  "
            f"{'ok' if r['check_ok'] else 'FAILED':<7}"
            f"{'-' if t_m is None else f'{t_m * 1e3:.4f}':>14}"
            f"{'-' if t_p is None else f'{t_p * 1e3:.4f}':>9}{_ratio(t_p, t_m):>7}  "
            f"{_mb(dram_m):>14}{_mb(dram_p):>9}{_ratio(dram_p, dram_m):>7}  "
            f"{_mb(l2_m):>16}{_mb(l2_p):>9}{_ratio(l2_p, l2_m):>7}")
    shapes = dict.fromkeys(shape_line(r["config"]) for r in rows)
    lines.append("; ".join(shapes) + f"; predicted: flashsim on the {DEFAULT_GPU} preset at "
                 "each kernel's stated efficiency (decode: the memory-bound model); measured: "
                 "the harness's median time"
                 + ("" if any("dram_read_bytes" in r.get("measured", {}) for r in rows)
                    else " (DRAM and L2 bytes: add --ncu)"))
    for r in rows:
        if "ncu_error" in r:
            lines.append(f"{r['kernel']}: counters left out: {r['ncu_error']}")
        p = r.get("predicted", {})
        if "note" in p:
            lines.append(f"{r['kernel']}: {p['note']}")
        elif p and p.get("predicted_time_s") is None:
            lines.append(f"{r['kernel']}: {p['efficiency_source']}")
    lines += [f"{s['kernel']}: skipped: {s['skipped']}" for s in skipped]
    return "\n".join(lines)


def shape_line(c: dict) -> str:
    """A row's configuration as the table's last line says it (square or decode)."""
    if "seq_len" in c:
        return (f"B = {c['batch']}, H = {c['heads']}, N = {c['seq_len']}, d = {c['head_dim']}, "
                f"causal {c['causal']}")
    lens = f"kv_len = {c['kv_len']}" if "kv_len" in c else f"kv_lens = {c['kv_lens']}"
    page = f", pages of {c['page_size']}" if c.get("page_size") else ""
    return (f"decode: B = {c['batch']}, H = {c['heads']}, kv_heads = {c['kv_heads']}, q_len = "
            f"{c['q_len']}, {lens}, d = {c['head_dim']}{page}")


def _sum(d: dict, level: str):
    a, b = d.get(f"{level}_read_bytes"), d.get(f"{level}_write_bytes")
    return None if a is None or b is None else a + b


def answer(args) -> Answer:
    """The text ``flashsim measure`` prints, with its exit status; NoGPUError or
    FlashsimError (one line, status 2) before anything runs."""
    rows, skipped = run(args)
    if args.json:
        text = json.dumps(rows + skipped if args.all else rows[0])
    else:
        text = format_rows(rows, skipped)
    out = Answer(text)
    out.exit_status = 0 if all(r.get("check_ok") and "ncu_error" not in r for r in rows) else 1
    return out

