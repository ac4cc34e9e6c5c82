"""Each kernel's default tiles against flashsim's default tile rule for the kernel's own
placement of buffers (issue 12): every registered kernel's module says in one line
("Tiles against flashsim's default rule: ...") whether they are the same, and this test
holds what it says. No GPU: launches are configured, not run."""

import pytest

import flashsim
from gpu_kernels import registry

LINE = "Tiles against flashsim's default rule"
# The rule for each kernel's placement: everything in shared memory (two-level, M = the
# kernel's 48 KiB); S_ij and accumulators in registers (the H200 preset, M = 48 KiB of
# static shared memory); the tensor-core kernel: the preset's shared memory and its warps.
RULE = {"cupy_standard": dict(sram="48KiB"), "cupy_flash1": dict(sram="48KiB"),
        "cupy_flash2": dict(sram="48KiB"),
        "numba_standard": dict(gpu="h200", sram="48KiB"),
        "numba_standard_bwd": dict(gpu="h200", sram="48KiB"),
        "numba_flash1": dict(gpu="h200", sram="48KiB"),
        "numba_flash2": dict(gpu="h200", sram="48KiB"),
        "numba_flash2_bwd": dict(gpu="h200", sram="48KiB"),
        "cupy_flash2_tc": dict(gpu="h200"), "cupy_flash3": dict(gpu="h200")}
SAME = {"cupy_standard", "cupy_flash1", "cupy_flash2", "numba_standard", "numba_standard_bwd"}
SHAPES = [(N, d) for N in (100, 4096) for d in (16, 32, 64, 128)]   # N capping B, and not


def _pairs(name):
    """(N, d, the kernel's tiles, the rule's tiles) wherever the kernel takes (N, d)."""
    k = registry.get(name)
    out = []
    for N, d in SHAPES:
        if k.head_dims and d not in k.head_dims:
            continue
        launch = k.launch(batch=1, heads=1, seq_len=N, head_dim=d)
        warps = {"warps": launch.PLAN_WARPS(launch)} if launch.PLAN_WARPS else {}
        p = flashsim.plan(k.algorithm, N, d, dtype=launch.dtype, pass_=k.pass_, **RULE[name],
                          **warps)
        out.append((N, d, (launch.block_rows, launch.block_cols), (p.block_rows, p.block_cols)))
    assert out
    return out


def test_every_kernel_states_its_tiles_against_the_rule():
    assert set(RULE) == set(registry.KERNELS)
    for name, k in registry.KERNELS.items():
        assert LINE in (k.module().__doc__ or ""), f"{k.module_name}: no line '{LINE}: ...'"


@pytest.mark.parametrize("name", sorted(SAME))
def test_kernels_that_say_the_same_take_the_rules_tiles(name):
    said = "the same for ``standard_bwd``" if name == "numba_standard_bwd" else LINE + ": the same"
    assert said in " ".join(registry.get(name).module().__doc__.split())
    for N, d, got, rule in _pairs(name):
        assert got == rule, (name, N, d)


@pytest.mark.parametrize("name", sorted(set(RULE) - SAME))
def test_kernels_that_say_they_differ_take_smaller_tiles_than_the_rule(name):
    pairs = _pairs(name)
    for N, d, (br, bc), (rr, rc) in pairs:
        # the rule caps its tiles at N; a kernel's fixed tile past N covers N rows of it
        assert min(br, N) * min(bc, N) <= rr * rc, (name, N, d)
    assert any(got != rule for *_, got, rule in pairs)
    if name == "numba_flash2_bwd":      # the same at d = 64 and 128, as its line says
        assert all(got == rule for _, d, got, rule in pairs if d >= 64)
