"""The L2 level: its request bytes agree with the two-level count, re-reads by co-resident
blocks hit, and the grouped simulation equals a plain block-by-block one."""

from collections import OrderedDict

import pytest

import flashsim
from flashsim.hardware import l2
from flashsim.hardware.l2 import block_steps
from flashsim.nest import blocks, launches


def naive_dram(plan, cap, slots):
    """Block by block, request by request: the definition the fast simulation must meet.
    An LRU of ``cap`` bytes, write-back, write-allocate; and a dirty line is written back
    (and stays, clean) as soon as the lines used since it, with it, weigh more than ``cap``
    (2 per byte of a line only read, 1 per byte of a line written: its home half)."""
    nest = plan.nest()
    heads = plan.batch * plan.heads
    total_r = total_w = 0
    for launch in launches(nest):
        progs = [block_steps(launch.ops, nest.tensors, ctx, launch.var, {}, {})
                 for ctx in blocks(launch)]
        order = [(h, i) for h in range(heads) for i in range(len(progs))]
        active, cache, used = [], OrderedDict(), 0      # key -> [bytes, dirty, written]
        while order or active:
            while len(active) < slots and order:
                h, i = order.pop(0)
                active.append([h, progs[i], 0])
            reqs = {}
            for a in active:
                h, prog, pos = a
                shared, private, _, _ = prog[pos]
                for key, nb, w in shared + private:
                    reqs.setdefault((h,) + key, [nb, set()])[1].add(w)
                a[2] += 1
            active = [a for a in active if a[2] < len(a[1])]
            for k, (nb, kinds) in reqs.items():
                for w in sorted(kinds):          # reads (False) before writes (True)
                    if k in cache:
                        cache.move_to_end(k)
                        cache[k][1] |= w
                        cache[k][2] |= w
                    else:
                        if not w:
                            total_r += nb
                        cache[k] = [nb, w, w]
                        used += nb
                    weight = 0
                    for line in reversed(cache.values()):     # the most recent first
                        weight += line[0] * (1 if line[2] else 2)
                        if weight > cap and line[1]:
                            line[1] = False
                            total_w += line[0]
                    while used > cap:
                        _, (b, dirty, _) = cache.popitem(last=False)
                        used -= b
                        total_w += b if dirty else 0
    return total_r, total_w


@pytest.mark.parametrize("alg", ["standard", "flash1", "flash2"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cap", [4096, 20000, 10**6])
def test_grouped_simulation_equals_block_by_block(alg, causal, cap):
    p = flashsim.plan(alg, 72, 8, batch=2, heads=3, block_rows=16, block_cols=16,
                      causal=causal, sram="1MiB")
    rep = l2.simulate(p, l2_bytes=cap, sms=2, blocks_per_sm=2)
    r, w = naive_dram(p, cap, 4)
    assert (rep.dram_read_bytes, rep.dram_write_bytes) == (r, w)


@pytest.mark.parametrize("alg", ["standard", "flash1", "flash2"])
def test_l2_requests_are_the_two_level_bytes_when_tiles_are_sector_aligned(alg):
    p = flashsim.plan(alg, 256, 64, batch=2, heads=2, block_rows=32, block_cols=32,
                      sram="1MiB", causal=True)
    rep, two = l2.simulate(p), p.count()
    assert rep.l2_read_bytes == two.hbm_read_bytes
    assert rep.l2_write_bytes == two.hbm_write_bytes


def test_ragged_tiles_round_up_to_sectors():
    # fp16 rows of 7 elements (14 bytes) straddle 32-byte sectors.
    p = flashsim.plan("standard", 7 * 9, 8, block_rows=7, block_cols=7, sram="1MiB",
                      dtype="fp16")
    assert l2.simulate(p).l2_read_bytes > p.count().hbm_read_bytes


def test_big_l2_reads_each_input_once_from_dram():
    """With an L2 that holds everything, flash2's K/V re-reads all hit: DRAM sees Q, K, V
    once, whatever the number of Q blocks."""
    p = flashsim.plan("flash2", 1024, 64, batch=2, heads=4, block_rows=64, block_cols=64,
                      gpu="h200")
    rep = l2.simulate(p)
    assert rep.dram_read_bytes == 3 * 2 * 4 * 1024 * 64 * 4
    assert rep.l2_read_bytes > 5 * rep.dram_read_bytes
    # O and L are written once: what DRAM has not seen yet is still dirty in L2.
    assert rep.dram_write_bytes + rep.dirty_at_end_bytes == p.count().hbm_write_bytes


def test_tiny_l2_sends_every_request_to_dram():
    p = flashsim.plan("flash2", 1024, 64, batch=1, heads=2, block_rows=64, block_cols=64,
                      gpu="h200")
    rep = l2.simulate(p, l2_bytes=64 * 64 * 4, sms=1, blocks_per_sm=1)
    assert rep.dram_read_bytes == p.count().hbm_read_bytes


def test_flash1_rereads_of_O_miss_when_a_head_does_not_fit():
    """flash1 reads O_i and writes it back in one step, for every j: with an L2 far smaller
    than one head's Q and O, every one of those reads reaches DRAM."""
    p = flashsim.plan("flash1", 512, 64, batch=1, heads=4, block_rows=32, block_cols=32,
                      gpu="h200")
    rep = l2.simulate(p, l2_bytes=16 * 1024)
    t = p.count().per_tensor
    assert rep.dram_read_bytes >= t["Q"]["read_bytes"] + t["O"]["read_bytes"]


def test_standard_streams_S_and_P_through_dram():
    p = flashsim.plan("standard", 2048, 64, batch=1, heads=8, gpu="h200")
    rep = l2.simulate(p, l2_bytes=8 * 2**20)
    nn = 8 * 2048 * 2048 * 4
    assert rep.dram_write_bytes + rep.dirty_at_end_bytes >= 2 * nn
    assert rep.dram_read_bytes >= 2 * nn


def test_a_dirty_line_is_written_back_once_its_home_half_has_turned_over():
    """A stored line is written back as soon as the lines used after it, with it, weigh
    more than the capacity (2 per byte read, 1 per byte written: one half of the L2 holds
    it and sees every read but half the stores); it stays, clean, and a re-read hits."""
    t = l2.LaunchTraffic("x", 1)
    lru = l2._LRU(100, t)
    lru.access("O", 10, True)
    for k in range(45):                         # 10 + 2 x 45 = 100: not more than 100
        lru.access(("K", k), 1, False)
    assert (t.dram_write_bytes, lru.dirty_bytes()) == (0, 10)
    lru.access(("K", 45), 1, False)             # 102: out of its home half
    assert (t.dram_write_bytes, lru.dirty_bytes()) == (10, 0)
    read = t.dram_read_bytes
    lru.access("O", 10, False)                  # still in the L2 (56 of 100 bytes used)
    assert t.dram_read_bytes == read


def test_a_kernel_that_only_writes_keeps_the_whole_l2_dirty():
    """Stores alone weigh 1 per byte: a full L2 of them stays dirty, and only what leaves
    the L2 is written back (standard attention's S)."""
    t = l2.LaunchTraffic("x", 1)
    lru = l2._LRU(100, t)
    for k in range(10):
        lru.access(("S", k), 10, True)
    assert (t.dram_write_bytes, lru.dirty_bytes()) == (0, 100)
    lru.access(("S", 10), 10, True)
    assert (t.dram_write_bytes, lru.dirty_bytes()) == (10, 100)


def test_flash2_leaves_only_the_output_stored_in_the_last_half_l2_of_reads_dirty():
    """At long N the K/V stream passes each O_i within a few waves: what stays dirty is far
    less than the L2, and every byte of O and L is either written or still dirty."""
    p = flashsim.plan("flash2", 16384, 128, batch=1, heads=4, gpu="h200")
    rep = l2.simulate(p)
    assert rep.dram_write_bytes + rep.dirty_at_end_bytes == p.count().hbm_write_bytes
    assert 0 < rep.dirty_at_end_bytes < p.gpu.l2_bytes / 4


# -- the fast engine (l2_lockstep) against the stepping one ------------------------------
FIELDS = ("label", "blocks", "l2_read_bytes", "l2_write_bytes", "dram_read_bytes",
          "dram_write_bytes", "dirty_at_end_bytes", "steps")


def _both(p, **kw):
    fast = l2.simulate(p, **kw)
    steps = l2.simulate(p, method="steps", **kw)
    assert [[getattr(x, f) for f in FIELDS] for x in fast.launches] == \
        [[getattr(x, f) for f in FIELDS] for x in steps.launches]
    return fast


# (N, d, B_r, B_c, dtype, batch, heads, sms, blocks per SM): several waves per head, several
# heads per wave, ragged N, fp16 rows that straddle 32-byte sectors (d = 3: 6-byte rows).
GRID = [
    (200, 8, 16, 16, "fp32", 1, 2, 2, 1),
    (203, 3, 12, 20, "fp16", 2, 3, 1, 3),
    (96, 16, 32, 16, "fp16", 3, 5, 2, 2),
    (257, 5, 7, 9, "fp32", 1, 1, 1, 2),
    (48, 8, 8, 8, "fp32", 1, 5, 3, 1),          # waves of 3 tile each head's 6 blocks
]


@pytest.mark.parametrize("alg", ["standard", "flash1", "flash2"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", GRID)
@pytest.mark.parametrize("cap", [100, 6000, 10**7])
def test_folded_simulation_equals_the_stepping_one(alg, pass_, causal, shape, cap):
    N, d, Br, Bc, dtype, batch, heads, sms, bps = shape
    p = flashsim.plan(alg, N, d, block_rows=Br, block_cols=Bc, dtype=dtype, batch=batch,
                      heads=heads, causal=causal, pass_=pass_, sram="1MiB")
    _both(p, l2_bytes=cap, sms=sms, blocks_per_sm=bps)


def test_folding_happens_and_keeps_every_byte(monkeypatch):
    """A long loop and many waves per head and many heads: the engine folds periods (the
    skip path runs) and still equals the stepping engine field for field."""
    from flashsim.hardware import l2_lockstep
    skips = []
    real = l2_lockstep._Engine.skip
    monkeypatch.setattr(l2_lockstep._Engine, "skip",
                        lambda self, m, *a: (skips.append(m), real(self, m, *a))[1])
    for alg, heads in (("flash2", 6), ("standard", 2), ("flash1", 9)):
        p = flashsim.plan(alg, 1000, 8, block_rows=8, block_cols=8, heads=heads,
                          sram="1MiB")
        _both(p, l2_bytes=3000, sms=2, blocks_per_sm=2)
    assert len(skips) >= 3 and max(skips) >= 10


def test_a_million_tokens_answers_fast_and_small():
    """flash2 at N = 2^20 on an H200: DRAM reads are Q once plus K and V once per wave of
    132 blocks, since one head's K and V (1 GiB) stream through an L2 of 60 MiB and every
    wave starts over from K_0: no re-read can hit."""
    p = flashsim.plan("flash2", 2**20, 128, gpu="h200")
    rep = l2.simulate(p)
    T = -(-2**20 // p.block_rows)
    waves = -(-T // 132)
    kv = 2**20 * 128 * 4
    assert rep.l2_read_bytes == p.count().hbm_read_bytes
    assert rep.dram_read_bytes == kv * (1 + 2 * waves)
    assert rep.dram_write_bytes + rep.dirty_at_end_bytes == p.count().hbm_write_bytes


def test_sector_bytes_equal_the_row_by_row_definition():
    def rows(r, c, w, b):
        (r0, r1), (c0, c1) = r, c
        if c0 == 0 and c1 == w:
            return l2._sector_bytes(r, c, w, b)
        return sum(((r_ * w + c0) * b + (c1 - c0) * b - 1) // 32 - (r_ * w + c0) * b // 32 + 1
                   for r_ in range(r0, r1)) * 32
    for w in (1, 3, 5, 8, 24, 33):
        for b in (2, 4):
            for r0 in range(0, 40, 7):
                for n in (1, 5, 16, 17, 40):
                    for c0, c1 in ((0, 1), (1, w), (w // 2, w)):
                        if c0 < c1:
                            got = l2._sector_bytes((r0, r0 + n), (c0, c1), w, b)
                            assert got == rows((r0, r0 + n), (c0, c1), w, b)


def test_owned_sectors_cover_a_matrix_once_under_any_tiling():
    """A sector is owned by the tile its first byte lies in: over any tiling the owned
    bytes add up to the matrix's sectors, once each, while the touched bytes count a
    sector two neighbouring tiles share twice."""
    for w in (5, 8, 33, 100):
        for b in (2, 4):
            for br, bc in ((16, 16), (7, 3), (5, w)):
                n = 23
                tiles = [((r, min(r + br, n)), (c, min(c + bc, w)))
                         for r in range(0, n, br) for c in range(0, w, bc)]
                owned = sum(l2._sectors(r, c, w, b)[1] for r, c in tiles)
                touched = sum(l2._sectors(r, c, w, b)[0] for r, c in tiles)
                assert owned == -(-n * w * b // 32) * 32 <= touched


def test_a_sector_neighbouring_tiles_share_reaches_dram_once():
    """fp32 S at N = 100 (rows of 400 bytes, not a multiple of 32): a 16-column tile row
    touches three sectors or two, so the L2 is asked for more than S, but DRAM sees S's
    sectors once (held to the cupy standard kernel at N = 16573: S 2.197 GB, the counters
    2.200 GB written, touched sectors 2.616 GB)."""
    p = flashsim.plan("standard", 100, 8, batch=1, heads=2, block_rows=16, block_cols=16,
                      sram="1MiB")
    s_bytes = 2 * 100 * 100 * 4
    first = l2.simulate(p, l2_bytes=10**6, sms=4, blocks_per_sm=2).launches[0]
    assert first.dram_write_bytes + first.dirty_at_end_bytes == s_bytes
    assert first.l2_write_bytes > 1.2 * s_bytes


def test_work_limit_is_one_clear_error():
    p = flashsim.plan("flash2", 4096, 8, block_rows=8, block_cols=8, causal=True,
                      sram="1MiB")
    with pytest.raises(flashsim.FlashsimError, match="L2 model"):
        l2.simulate(p, l2_bytes=4096, sms=2, blocks_per_sm=1, work_limit=10_000)


# -- a loop of launches: flash1 as numba's kernel runs it, a launch per K/V block --------
def _kv_launches(N, d, Br, Bc, causal=False, **kw):
    return flashsim.plan("flash1", N, d, block_rows=Br, block_cols=Bc, causal=causal,
                         kv_launches=True, **{"sram": "1MiB", **kw})


def test_a_loop_of_launches_is_one_launch_per_iteration():
    """Line 2's launch, then launch j: one thread block per Q block that K/V block j reaches
    (from floor(j B_c / B_r) under the mask), each block's context holding j."""
    p = _kv_launches(100, 8, 16, 32, causal=True)
    got = launches(p.nest())
    assert len(got) == 1 + 4 and got[0].outer == () and got[0].var == "i"
    for j, launch in enumerate(got[1:]):
        assert [(loop.var, k) for loop, k in launch.outer] == [("j", j)]
        ctxs = [dict(ctx.idx) for ctx in blocks(launch)]
        assert ctxs == [{"j": j, "i": i} for i in range(j * 32 // 16, 7)]
    assert len({x.label for x in got[1:]}) == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cap", [4096, 20000, 10**6])
def test_a_loop_of_launches_equals_block_by_block(causal, cap):
    p = _kv_launches(72, 8, 16, 16, causal, batch=2, heads=3)
    rep = l2.simulate(p, l2_bytes=cap, sms=2, blocks_per_sm=2)
    assert (rep.dram_read_bytes, rep.dram_write_bytes) == naive_dram(p, cap, 4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", GRID)
@pytest.mark.parametrize("cap", [100, 6000, 10**7])
def test_a_loop_of_launches_folded_equals_the_stepping_one(causal, shape, cap):
    """Launches that are renamings of one another (l2_lockstep.launch_class) are simulated
    once: the same numbers as stepping every launch, field for field."""
    N, d, Br, Bc, dtype, batch, heads, sms, bps = shape
    p = _kv_launches(N, d, Br, Bc, causal, dtype=dtype, batch=batch, heads=heads)
    _both(p, l2_bytes=cap, sms=sms, blocks_per_sm=bps)


def test_a_loop_of_launches_simulates_one_launch_per_class(monkeypatch):
    """At N = 16384 (342 launches of K/V blocks of 48 rows) the launches fall into two
    classes, the full blocks and the ragged last one (a block moves K by whole sectors), so
    two launches are simulated besides line 2's, and every launch still has its traffic."""
    from flashsim.hardware import l2_lockstep
    ran = []
    real = l2_lockstep.simulate_launch
    monkeypatch.setattr(l2_lockstep, "simulate_launch",
                        lambda launch, *a: (ran.append(launch), real(launch, *a))[1])
    p = _kv_launches(16384, 64, 32, 48, sram=None, gpu="h200", heads=16)
    rep = l2.simulate(p)
    assert len(ran) == 3 and len(rep.launches) == 1 + 342
    assert rep.l2_read_bytes == p.count().hbm_read_bytes      # 48 x 64 x 4: whole sectors
    full = rep.launches[1]
    assert all(vars(x) == vars(full) for x in rep.launches[2:-1])


def test_launches_stepped_one_by_one_claim_the_limit_together_before_any_is_stepped(monkeypatch):
    """Flash-Decoding under the mask (q_len 4): its split launch (224 tile requests here)
    and its combine (80) are both stepped block by block. Under a limit of 300 either one
    fits but not both: refused, from the counts alone, before either is stepped."""
    p = flashsim.plan("flashdecoding", q_len=4, kv_len=64, head_dim=8, heads=4, kv_heads=2,
                      batch=2, splits=4, block_cols=8, gpu="h200")
    assert l2.simulate(p, work_limit=304).launches          # exactly enough: it runs
    stepped = []
    monkeypatch.setattr(l2, "block_steps", lambda *a: stepped.append(a))
    with pytest.raises(flashsim.FlashsimError, match=r"304 tile requests .* for '2 launches'"):
        l2.simulate(p, work_limit=300)
    assert stepped == []
