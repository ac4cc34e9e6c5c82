"""The measuring harness (gpu_kernels/harness.py) without a GPU: its method on a fake device
clock, its correctness rules, provenance, and ``gpu_kernels.measure`` end to end under the
CUDA simulator (whose clock says nothing, so only the check and the record are tested)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashsim
import gpu_kernels
from gpu_kernels import harness


class FakeDevice:
    """A device whose clock advances by ``step`` seconds per event, with a log of writes."""
    name = "fake"

    def __init__(self, l2: int = 1 << 20):
        self.now, self.step, self.log, self.l2 = 0.0, 1e-3, [], l2

    def event(self):
        self.now += self.step
        self.log.append("event")
        t = self.now

        class Event:
            time = t

            def synchronize(self):
                pass
        return Event()

    def elapsed_s(self, a, b):
        return b.time - a.time

    def synchronize(self):
        pass

    def l2_bytes(self):
        return self.l2

    def buffer(self, nbytes):
        self.log.append(("alloc", nbytes))
        return nbytes

    def write(self, buf):
        self.log.append("flush")

    def read(self, buf):
        self.log.append("clean read")

    def spin(self, seconds):
        self.log.append(("spin", seconds))


def _harness(**kw):
    h = harness.Harness.__new__(harness.Harness)   # (the constructor would ask for a GPU)
    h.dev, h.warmup, h.target_s = FakeDevice(), kw.get("warmup", 2), kw.get("target_s", 0.2)
    h.min_repeats, h.max_repeats = kw.get("min_repeats", 5), kw.get("max_repeats", 30)
    h.flush_enabled, h._flush_buf, h.lead_s = kw.get("flush", True), None, kw.get("lead_s", 5e-4)
    h.clean, h._clean_buf = kw.get("clean", False), None
    return h


def test_flush_is_twice_the_l2_and_comes_before_every_timed_call():
    h = _harness()
    calls = []
    h.time(lambda: calls.append(1), repeats=4)
    assert h.dev.log[0] == ("alloc", 2 * h.dev.l2) and h.flush_bytes == 2 * h.dev.l2
    timed = [i for i, e in enumerate(h.dev.log) if e == "flush"]
    assert len(timed) == 4 and all(h.dev.log[i + 1] == ("spin", 5e-4) for i in timed)
    assert all(h.dev.log[i + 2] == "event" for i in timed)       # then the start event
    assert len(calls) == 2 + 4                        # two warm-ups, four timed


def test_a_clean_flush_reads_other_bytes_after_the_write():
    h = _harness(clean=True)
    h.time(lambda: None, repeats=3)
    log = [e for e in h.dev.log if e != "event"]
    assert log[:4] == [("alloc", 2 * h.dev.l2), "flush", ("alloc", 2 * h.dev.l2), "clean read"]
    log = [e for e in log if not isinstance(e, tuple) or e[0] != "alloc"]
    assert log == ["flush", "clean read", ("spin", 5e-4)] * 3   # write, read, spin, then the call
    assert h.method()["l2_flush"].startswith("a write, then a read")
    assert _harness().method()["l2_flush"] == "a write (leaves dirty lines)"


def test_repeats_fill_the_target_within_bounds():
    for step, want in ((1e-3, 30), (0.01, 20), (0.5, 5)):
        h = _harness()
        h.dev.step = step                             # one call: from its start event to its end
        t = h.time(lambda: None)
        assert len(t.times_s) == want
        assert math.isclose(t.median_s, step)


def test_split_times_each_kernel():
    h = _harness()
    def run(mark=None):                               # warm-ups call it without a mark
        for _ in range(3):
            if mark is not None:
                mark()
    t = h.time(run, repeats=3, split=True)
    d = t.as_dict()
    assert len(d["parts_s"]) == 3 and math.isclose(sum(d["parts_s"]), d["time_s"] - h.dev.step)


def test_each_timed_call_records_the_hosts_issue_time():
    """launch_s: the host's seconds from the start event to the end event's record, per timed
    call (not the warm-ups), so a call whose issue outlasts the lead spin can be seen."""
    import time

    h = _harness()
    waits = iter([0.0, 0.0, 0.004, 0.001, 0.002])     # two warm-ups, then three timed calls
    t = h.time(lambda: time.sleep(next(waits)), repeats=3)
    assert len(t.launch_s) == 3 and t.launch_s[0] >= 0.004 and t.launch_s[1] >= 0.001
    d = t.as_dict()
    assert d["launch_max_s"] == max(t.launch_s) >= d["launch_s"] >= 0.002


def test_a_failed_check_is_not_timed():
    h = _harness()
    calls = []

    def fn():
        calls.append(1)
        return 1
    row = h.check_then_time(fn, lambda r: harness.max_error_rule(1.0, 0.5))
    assert row == {"check": {"max_abs_error": 1.0, "bound": 0.5, "ok": False}} and calls == [1]
    row = h.check_then_time(fn, lambda r: harness.max_error_rule(0.25, 0.5), repeats=5)
    assert row["check"]["ok"] and row["repeats"] == 5 and len(calls) == 1 + 1 + 2 + 5
    assert not harness.max_error_rule(math.nan, 1.0)["ok"]


def test_bf16_rounding_is_to_nearest_even():
    x = np.array([1.0, 1 + 2**-8, 1 + 2**-7 + 2**-8, 1 + 3 * 2**-9, -2.5], np.float32)
    got = harness.round_to(x, "bf16")
    assert list(got) == [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.5]
    assert harness.round_to(np.float32(1 / 3), "fp16") == np.float32(np.float16(1 / 3))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_reference_check_passes_the_reference_and_fails_a_wrong_answer(dtype):
    rng = np.random.default_rng(0)
    Q, K, V = (harness.round_to(rng.standard_normal((2, 64, 16)).astype(np.float32), dtype)
               for _ in range(3))
    ref = flashsim.reference.attention(Q, K, V, causal=True)
    ok = harness.reference_check(ref, Q, K, V, True, dtype)
    assert ok["ok"] and ok["max_abs_error"] == 0.0 and ok["bound"] > 0
    wrong = ref.copy()
    wrong[0, 5, 3] += 50 * ok["bound"] + 1e-3
    bad = harness.reference_check(wrong, Q, K, V, True, dtype)
    assert not bad["ok"] and bad["max_abs_error"] > bad["bound"]
    assert not harness.reference_check(ref * np.nan, Q, K, V, True, dtype)["ok"]


def test_provenance_says_where_when_with_what():
    p = harness.provenance()
    for key in ("date", "command", "python", "packages", "gpu", "git_commit", "processor"):
        assert key in p, key
    assert p["packages"]["numpy"] == np.__version__ and p["packages"]["flashsim"]
    assert p["gpu"] is None                           # no GPU here
    assert "pytest" in p["command"] or "python" in p["command"]


def test_checked_heads():
    assert harness.checked_heads(8, 4096) == [0, 7] and harness.checked_heads(1, 512) == [0]
    assert harness.checked_heads(8, 8192) == [7]


@pytest.mark.parametrize("name,kw", [("numba_flash2", dict(causal=True)),
                                     ("numba_flash2_bwd", dict(threads=32, block_rows=8,
                                                               block_cols=8))])
def test_measure_checks_and_records_under_the_simulator(name, kw):
    h = harness.Harness("numba", warmup=0, min_repeats=1, max_repeats=1, flush=False)
    row = gpu_kernels.measure(name, batch=1, heads=2, seq_len=24, head_dim=8, harness=h, **kw)
    assert row["check_ok"] and row["max_error"] <= row["bound"] and row["bound"] > 0
    assert row["kernel"] == name and row["heads_checked"] == [0, 1]
    launch = gpu_kernels.registry.launch(name, batch=1, heads=2, seq_len=24, head_dim=8, **kw)
    assert row["tiles"] == {"block_rows": launch.block_rows, "block_cols": launch.block_cols}
    assert row["predicted"]["hbm_bytes"] == launch.predicted_traffic().hbm_bytes
    assert len(row["times_s"]) == 1 and row["time_s"] == row["times_s"][0]
    assert row["method"]["events"] == "numba" and row["method"]["l2_flush_bytes"] == 0


def test_the_spin_kernel_compiles_for_sm90():
    """The CuPy harness's lead-in spin (a RawKernel) is valid CUDA for the H200."""
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_cubin

    cubin, _ = compile_cubin(harness.SPIN_SOURCE, name="spin.cu")
    assert b"spin" in cubin


def test_the_numba_clean_read_runs_under_the_simulator():
    from gpu_kernels.numba.common import cuda, read_all

    x = cuda.to_device(np.arange(1000, dtype=np.float32))
    read_all(x)                                       # a typing or launch error raises here
    read_all(cuda.to_device(np.zeros(3, np.float32)))
