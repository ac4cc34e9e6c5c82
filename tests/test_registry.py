"""The kernel registry (gpu_kernels/registry.py) and the one way to call a kernel.

Without a GPU: every entry's launch follows flashsim's plan for it (the same tiles, N, d,
batch, heads, mask, dtype and pass; every kernel launch's grid is the plan's thread blocks,
except where the entry says why not); under the CUDA simulator the numba launches launch
exactly what ``launches()`` lists; the CuPy fp32 kernels' shared-memory formulas are what
ptxas allocates; bad input raises KernelInputError (a FlashsimError) before anything is
launched, for both backends.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashsim
import gpu_kernels
from flashsim import nest
from gpu_kernels import KernelInputError, registry

SHAPES = [dict(batch=2, heads=3, seq_len=1000, head_dim=64, causal=False),
          dict(batch=1, heads=2, seq_len=300, head_dim=128, causal=True),
          dict(batch=1, heads=1, seq_len=2400, head_dim=64, causal=True)]


def _launch(entry, shape, **kw):
    kw = {**shape, **kw}
    if entry.pass_ == "bwd" and entry.algorithm == "standard":
        kw["seq_len"] = min(kw["seq_len"], 1024)          # its row kernels hold N <= 4096
    return entry.launch(**kw)


def _nest_blocks(p) -> list[int]:
    """Thread blocks per head of each launch of the plan's loop nest."""
    out = []
    for launch in nest.launches(p.nest()):
        out.append(1 if launch.loop is None else sum(1 for _ in nest.blocks(launch)))
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s['seq_len']}d{s['head_dim']}")
@pytest.mark.parametrize("name", list(registry.KERNELS))
def test_plan_is_what_the_kernel_launches(name, shape):
    entry = registry.get(name)
    launch = _launch(entry, shape)
    p = launch.plan()
    # the plan is flashsim's for exactly this launch
    assert (p.algorithm, p.pass_, p.dtype) == (entry.algorithm, entry.pass_, launch.dtype)
    assert (p.seq_len, p.head_dim, p.batch, p.heads, p.causal) == (
        launch.N, launch.d, launch.batch, launch.heads, launch.causal)
    assert (p.block_rows, p.block_cols) == (launch.block_rows, launch.block_cols)
    # ... and the kernel is compiled for those tiles
    if entry.backend == "cupy":
        D = launch.defines()
        assert (D["BLOCK_R"], D["BLOCK_C"], D["HEAD_DIM"]) == (p.block_rows, p.block_cols, p.head_dim)
    elif entry.pass_ == "fwd":
        for tl in (launch.tiling if isinstance(launch.tiling, tuple) else (launch.tiling,)):
            assert (tl.B_r, tl.B_c, tl.d) == (p.block_rows, p.block_cols, p.head_dim)
    # every kernel launch runs one launch of the nest with its thread blocks, or the entry
    # says which launch of the nest it replaces and why
    blocks = _nest_blocks(p)
    covered = set()
    for kl in launch.launches():
        if kl.step is None:
            assert kl.kernel in entry.unlike_plan, (name, kl)
            covered.add(entry.unlike_plan[kl.kernel][0])
        else:
            assert kl.blocks == blocks[kl.step] * launch.BH, (name, kl, blocks)
            covered.add(kl.step)
    assert covered == set(range(len(blocks))), (name, covered, blocks)
    main = launch.main_launch()           # grid and threads: the main kernel's
    assert (launch.grid, launch.threads) == (main.grid, main.threads)
    assert main.kernel != "fill_flat"
    # the report is the plan's count
    rep = launch.predicted_traffic()
    assert rep.per_tensor == p.count().per_tensor and rep.predicted_time_s > 0


def test_the_forward_entries_are_predicted_by_the_public_call():
    shape = (2, 3, 1000, 64)
    for name, kw in [("numba_flash2", dict(algorithm="flash2", backend="numba")),
                     ("cupy_flash2_tc", dict(algorithm="flash2", backend="cupy", dtype="fp16")),
                     ("cupy_standard", dict(algorithm="standard", backend="cupy"))]:
        want = registry.launch(name, batch=2, heads=3, seq_len=1000, head_dim=64,
                               dtype=kw.get("dtype")).predicted_traffic()
        got = gpu_kernels.predicted_traffic(shape, **kw)
        assert got.per_tensor == want.per_tensor and got.plan.block_rows == want.plan.block_rows


def test_stored_plan_records_rebuild_the_plan():
    """``plan_record()`` is what the ncu sweep stores and flashsim.measured.validation reads."""
    from flashsim.measured import validation

    for name in ("numba_flash2", "cupy_flash2", "cupy_standard", "cupy_flash2_tc", "numba_flash1"):
        launch = registry.launch(name, batch=2, heads=4, seq_len=1024, head_dim=64)
        pt = dict(N=1024, d=64, batch=2, heads=4, causal=False, plan=launch.plan_record())
        assert validation.point_plan(pt).count().per_tensor == launch.plan().count().per_tensor
    rec = registry.launch("cupy_flash2_tc", batch=1, heads=1, seq_len=64, head_dim=64).plan_record()
    assert rec["version"] == 5 and rec["sram"] is None and rec["gpu"] == "h200"


# ------------------------------------------------------------------ the simulator runs them

TINY = dict(batch=1, heads=2, seq_len=20, head_dim=8)


@pytest.mark.parametrize("name", [n for n, k in registry.KERNELS.items() if k.backend == "numba"])
def test_numba_launches_what_it_lists(name):
    entry = registry.get(name)
    # two blocks, the last one short, under the mask (the backward's smaller tiles need
    # fewer rows for that: the simulator's time grows with rows x threads)
    kw = dict(block_rows=8, block_cols=8, threads=32, seq_len=12) if entry.pass_ == "bwd" \
        else dict(block_rows=16, block_cols=16)
    launch = entry.launch(**{**TINY, **kw}, causal=True)
    rng = np.random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal((2, launch.N, 8)).astype(np.float32) for _ in range(4))
    if entry.pass_ == "bwd":
        O, P, L = launch.forward(Q, K, V)
        launch.run(Q, K, V, dO, {"O": O, "L": L, "P": P})
    else:
        launch.run(Q, K, V)
    assert launch.launched == launch.launches()


# ------------------------------------------------------------------ shared memory

def test_cupy_fp32_shared_memory_formulas_are_what_ptxas_allocates():
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_variant
    from gpu_kernels.cupy import flash1, flash2, standard

    for mod in (standard, flash1, flash2):
        for cu_file, defines, dyn, _ in mod.compile_variants():
            d, Br, Bc = defines["HEAD_DIM"], defines["BLOCK_R"], defines["BLOCK_C"]
            formula = mod.shared_bytes(d, Br, Bc)
            for r in compile_variant(cu_file, defines, dyn):
                want = formula[r.kernel] if isinstance(formula, dict) else formula
                if r.kernel == "standard_softmax":
                    want = 0                      # all of it dynamic: 4 R (N + 2)
                assert r.static_smem == want, (r, want)
            launch = mod.configure(1, 1, 4096, d)
            smem = formula if isinstance(formula, int) else max(
                v for k, v in formula.items() if k != "standard_softmax")
            assert launch.static_smem == smem


def test_tc_launch_takes_its_tiles_threads_and_shared_memory_from_the_table():
    from gpu_kernels.cupy import flash2_tc

    for d in flash2_tc.HEAD_DIMS:
        launch = registry.launch("cupy_flash2_tc", batch=1, heads=1, seq_len=4096, head_dim=d)
        c = flash2_tc.CONFIGS[d]
        assert (launch.block_rows, launch.block_cols, launch.version) == (
            c["BLOCK_R"], c["BLOCK_C"], c["VERSION"])
        assert launch.threads == 32 * c["BLOCK_R"] // flash2_tc.warp_rows(c["VERSION"])
        assert launch.dynamic_smem == flash2_tc.smem_bytes(d, c["BLOCK_R"], c["BLOCK_C"], c["VERSION"])
        assert launch.static_smem == 0


# ------------------------------------------------------------------ bad input, both backends

def _refused(fn, *args, match=None, **kw):
    with pytest.raises(KernelInputError, match=match) as info:
        fn(*args, **kw)
    assert isinstance(info.value, flashsim.FlashsimError) and "\n" not in str(info.value)


@pytest.mark.parametrize("backend", ["numba", "cupy"])
def test_bad_inputs_are_refused_before_any_launch(backend):
    """No GPU here: any launch (or CuPy allocation) would raise a CUDA error, not this."""
    att = gpu_kernels.attention
    Q = np.zeros((1, 2, 16, 64), np.float32)
    _refused(att, Q.astype(np.float64), Q, Q, backend=backend, match="dtype float64")
    _refused(att, Q, Q[:, :1], Q, backend=backend, match="shapes differ")
    _refused(att, Q[0], Q[0], Q[0], backend=backend, match="4 dimensions")
    _refused(att, Q, Q, Q.tolist(), backend=backend, match="NumPy array")
    _refused(att, Q, Q, Q, backend=backend, algorithm="flash3", match="no .* kernel runs flash3")
    _refused(att, Q, Q, Q, backend=backend, causal=1, match="causal")
    _refused(att, Q, Q, Q, backend=backend, block_rows=-16, match="block_rows")
    _refused(att, Q, Q, Q, backend=backend, tiles=4, match="no option tiles")
    big = np.zeros((1, 1, 4096, 64), np.float32)
    _refused(att, big, big, big, backend=backend, block_rows=1024, block_cols=1024,
             match="SRAM|shared")
    _refused(att, Q, Q, Q, backend="triton", match="backend")


def test_tensor_core_inputs_are_refused_before_any_launch():
    att = gpu_kernels.attention
    x = np.zeros((1, 2, 16, 64), np.float16)
    _refused(att, x, x, x, backend="cupy", version=7, match="version 7")
    _refused(att, x, x, x, backend="cupy", block_rows=48, match="multiple of")
    z = np.zeros((1, 2, 16, 96), np.float16)
    _refused(att, z, z, z, kernel="cupy_flash2_tc", match="d = 96")
    _refused(att, x.astype(np.float32), x, x, kernel="cupy_flash2_tc", match="dtype float32")
    _refused(att, x, x, x, backend="numba", match="no numba kernel runs flash2 .* fp16")
    _refused(att, x, x, x, backend="cupy", algorithm="flash1", match="fp16")
    _refused(registry.launch, "cupy_flash2_tc", batch=1, heads=1, seq_len=16, head_dim=64,
             dtype="fp32", match="takes fp16, bf16")
    _refused(registry.get, "cupy_flash9", match="no kernel")
    _refused(gpu_kernels.measure, "cupy_flash2_tc", batch=1, heads=1, seq_len=16, head_dim=80,
             match="d = 80")
