"""The CUDA C++ kernels for CuPy (gpu_kernels/cuda/*.cu, loaded by gpu_kernels/cupy/*.py).

Without a GPU: every registered variant compiles for sm_90 through NVRTC (cuda.core), the
resource table is printed into the test log, the hot kernels do not spill
to local memory, shared memory fits the per-block limits, every file compiles on its own,
the defaults in the .cu files are flashsim's plans, and the tensor-core header lists exactly
the versions the code has, every file includes common.cuh and no file repeats its helpers.

On a GPU (``@pytest.mark.gpu``, skipped when none is usable): fp32 kernels against the
float64 reference; fp16/bf16 tensor-core kernels pass when their error against the fp32
reference is at most twice that of PyTorch's scaled_dot_product_attention in the same dtype
(flash-attention's rule); L against the float64 logsumexp; input checks; DLPack without copies.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import flashsim
import gpu_kernels
from gpu_kernels import KernelInputError
from gpu_kernels.cupy import flash2 as cupy_flash2
from gpu_kernels.cupy import flash2_tc as cupy_flash2_tc
from gpu_kernels.cupy import standard as cupy_standard
from gpu_kernels.cupy.common import KERNEL_DIR, read_source

CU_FILES = ("standard.cu", "flash1.cu", "flash2.cu", "flash2_tc.cu")


def cupy_attention(q, k, v, algorithm, **kw):
    """``gpu_kernels.attention`` on the CuPy backend."""
    return gpu_kernels.attention(q, k, v, algorithm=algorithm, backend="cupy", **kw)


# ------------------------------------------------------------------ compile checks (no GPU)

@pytest.fixture(scope="module")
def resources(request):
    pytest.importorskip("cuda.core")
    from gpu_kernels import compile as cuda_compile

    rows, hot = [], []
    for cu_file, defines, dyn, hot_names in cuda_compile.all_variants():
        got = cuda_compile.compile_variant(cu_file, defines, dyn)
        rows.extend(got)
        hot.extend(r for r in got if r.kernel in hot_names)
    # Into the CI log whatever pytest's capture setting: registers and shared memory per
    # kernel, as compiled for sm_90 here.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + cuda_compile.format_table(rows))
    return rows, hot


def test_every_variant_compiles_for_sm90(resources):
    rows, _ = resources
    kernels = {(r.file, r.kernel) for r in rows}
    assert ("flash2_tc.cu", "flash2_tc_fwd") in kernels
    assert ("standard.cu", "standard_qk") in kernels
    assert all(r.registers > 0 for r in rows)


def test_shared_memory_within_limits(resources):
    from gpu_kernels.compile import SMEM_LIMIT_DEFAULT, SMEM_LIMIT_OPTIN

    rows, _ = resources
    for r in rows:
        assert r.smem <= SMEM_LIMIT_OPTIN, r
        if r.dynamic_smem == 0:  # static only: no opt-in possible
            assert r.static_smem <= SMEM_LIMIT_DEFAULT, r


def test_no_spills_in_default_kernels(resources):
    """The kernels that run by default: fp32 kernels at flashsim's tiles, and the tensor-core
    kernel at its default configuration (CONFIGS) for both dtypes."""
    _, hot = resources
    defaults = []
    for r in hot:
        if r.file != "flash2_tc.cu":
            defaults.append(r)
            continue
        d = int(re.search(r"HEAD_DIM=(\d+)", r.variant).group(1))
        want = cupy_flash2_tc.defines(d, "float16")
        want.pop("IS_BF16")
        if all(f"{k}={v}" in r.variant.split() for k, v in want.items()):
            defaults.append(r)
    assert len([r for r in defaults if r.file == "flash2_tc.cu"]) == 4  # d 64/128 x fp16/bf16
    for r in defaults:
        assert not r.spills and r.stack_frame == 0, r


def test_tc_128x128_tiles_spill_at_d64():
    """The reason flashsim.measured.validation gives for that point's L2 write requests (ten times
    the O it stores): at B_r = B_c = 128, d = 64 the kernel spills registers to local
    memory, and local-memory traffic reaches the L2."""
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_variant
    (res,) = compile_variant("flash2_tc.cu", cupy_flash2_tc.defines(64, "float16", block_rows=128,
                                                                    block_cols=128))
    assert res.spill_stores > 0, res


@pytest.mark.parametrize("cu_file", CU_FILES)
def test_file_compiles_on_its_own(cu_file):
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_cubin

    src = read_source(cu_file)
    cubin, _ = compile_cubin(src, {}, name=cu_file)
    assert cubin[:4] == b"\x7fELF"
    for name in re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(', src):
        assert name.encode() in cubin, name


def _define(src: str, name: str) -> int:
    """The default of a compile-time constant (the value the file compiles with alone)."""
    return int(re.search(rf"^#define {name} (\d+)$", src, re.M).group(1))


@pytest.mark.parametrize("cu_file, algorithm", [("standard.cu", "standard"),
                                                ("flash1.cu", "flash1"), ("flash2.cu", "flash2")])
def test_fp32_defaults_are_flashsims_plan(cu_file, algorithm):
    src = read_source(cu_file)
    d = _define(src, "HEAD_DIM")
    p = flashsim.plan(algorithm, seq_len=4096, head_dim=d, dtype="fp32", sram="48KiB")
    assert (_define(src, "BLOCK_R"), _define(src, "BLOCK_C")) == (p.block_rows, p.block_cols)


def test_tc_header_lists_the_versions_in_the_code():
    src = read_source("flash2_tc.cu")
    header = src.split("#ifndef")[0]
    listed = sorted(int(v) for v in re.findall(r"^//\s+v(\d+)\s", header, flags=re.M))
    assert listed == list(cupy_flash2_tc.VERSIONS)
    assert f"VERSION >= 1 && VERSION <= {max(listed)}" in src
    for v in listed[1:]:  # each version changes something in the code
        assert re.search(rf"VERSION (>=|==|<=) {v}\b", src), v


def test_tc_smem_formula_matches_the_kernel():
    """SMEM_BYTES in the .cu and smem_bytes() in Python agree (defaults: d=128, 128 x 64, v4)."""
    src = read_source("flash2_tc.cu")
    assert "#define SMEM_BYTES ((BLOCK_R + 2 * KV_STAGES * BLOCK_C) * SMEM_STRIDE * 2)" in src
    assert cupy_flash2_tc.smem_bytes(128, 128, 64, 4) == (128 + 4 * 64) * 128 * 2
    assert cupy_flash2_tc.smem_bytes(64, 64, 64, 1) == (64 + 2 * 64) * 72 * 2


@pytest.mark.parametrize("d", cupy_flash2_tc.HEAD_DIMS)
def test_tc_tuning_configs_are_launches_flashsim_accepts(d):
    """Each swept variant configures without a GPU: its plan counts on the registers of all
    the kernel's warps (B_r = 256 holds O_i of 256 rows in 8 warps, twice the preset's 4)."""
    for c in cupy_flash2_tc.tuning_configs(d):
        launch = cupy_flash2_tc.configure(2, 2, 333, d, block_rows=c["BLOCK_R"],
                                          block_cols=c["BLOCK_C"], version=c["VERSION"],
                                          min_blocks=c["MIN_BLOCKS"])
        p = launch.plan()
        assert p.register_budget == min(launch.threads * 255, 65536) * 4
        assert sum(size for _, size in p.register_set()) <= p.register_budget


def test_host_arrays_are_refused_before_launch():
    """A launch's ``run`` takes GPU arrays only (``gpu_kernels.attention`` copies NumPy
    inputs first)."""
    pytest.importorskip("cupy")
    Q = np.zeros((1, 1, 8, 64), np.float32)
    with pytest.raises(KernelInputError, match="cupy.ndarray or a torch.Tensor"):
        cupy_flash2.configure(1, 1, 8, 64).run(Q, Q, Q)


def test_every_file_includes_common_and_repeats_none_of_it():
    """The helpers live once, in common.cuh: each .cu includes it and defines none of them."""
    common = open(f"{KERNEL_DIR}/common.cuh").read()
    helpers = re.findall(r"__device__ __forceinline__ \w+\s+(\w+)\(", common)
    assert {"neg_inf", "warp_max", "warp_sum", "exp_diff", "fast_exp2", "smem_addr"} <= set(helpers)
    for cu_file in CU_FILES:
        raw = open(f"{KERNEL_DIR}/{cu_file}").read()
        assert '#include "common.cuh"' in raw, cu_file
        defined = set(re.findall(r"__device__ __forceinline__ \w+\s+(\w+)\(", raw))
        assert not defined & set(helpers), (cu_file, defined & set(helpers))
        pasted = read_source(cu_file)          # what NVRTC and CuPy compile
        assert "neg_inf()" in pasted and not re.search(r"^\s*#include", pasted, re.M), cu_file


# ------------------------------------------------------------------ on the GPU

def _cupy_or_skip(min_cc: int = 80):
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
        cc = int(cupy.cuda.Device().compute_capability)
    except Exception as exc:  # no driver, no device
        pytest.skip(f"no usable CUDA device ({exc})")
    if cc < min_cc:
        pytest.skip(f"compute capability {cc} < {min_cc}")
    return cupy


def _inputs(rng, B, H, N, d, *, spike: bool = True):
    """Random Q, K, V (float64) whose running row maximum changes between K/V blocks: a few
    late keys align with the queries and carry large logits."""
    Q, K, V = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    if spike and N > 3:
        late = rng.choice(np.arange(N // 2, N), size=max(1, N // 50), replace=False)
        K[:, :, late] = 3.0 * Q[:, :, late]  # large S on the diagonal of late rows
    return Q, K, V


FP32_CASES = [(1, 1, 1, 64), (2, 3, 37, 64), (1, 2, 200, 128), (2, 1, 257, 64), (1, 1, 130, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,N,d", FP32_CASES)
@pytest.mark.parametrize("algorithm", ["standard", "flash1", "flash2"])
def test_fp32_kernels_match_float64_reference(algorithm, B, H, N, d, causal):
    cupy = _cupy_or_skip(60)
    rng = np.random.default_rng(N * 7 + d + causal)
    Q, K, V = _inputs(rng, B, H, N, d)
    q, k, v = (cupy.asarray(x, dtype=cupy.float32) for x in (Q, K, V))
    ref = flashsim.reference.attention(*(cupy.asnumpy(x).astype(np.float64) for x in (q, k, v)),
                                       causal=causal)
    O, L = cupy_attention(q, k, v, algorithm, causal=causal)
    assert isinstance(O, cupy.ndarray)
    if algorithm == "standard":
        assert L is None
    else:   # FA2's L; FA1's m + log l
        L_ref = flashsim.reference.logsumexp(cupy.asnumpy(q), cupy.asnumpy(k), causal=causal)[..., 0]
        np.testing.assert_allclose(cupy.asnumpy(L), L_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cupy.asnumpy(O), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_standard_streaming_softmax(causal):
    """Rows too long for the softmax's shared memory (R = 0): the two-pass tile path."""
    cupy = _cupy_or_skip(60)
    N, d = 2400, 64
    sram = 4 * (16 * d + 16 * d + 16 * 16)  # 16 x 16 matmul tiles fit; one row of S does not
    p = cupy_standard.configure(1, 1, N, d, causal=causal, sram=sram)
    assert p.softmax_rows == 0 and p.block_rows == 16
    assert [k.kernel for k in p.launches()][1] == "standard_softmax_streaming"
    Q, K, V = _inputs(np.random.default_rng(5), 1, 1, N, d)
    q, k, v = (cupy.asarray(x, dtype=cupy.float32) for x in (Q, K, V))
    O, _ = cupy_attention(q, k, v, "standard", causal=causal, sram=sram)
    ref = flashsim.reference.attention(*(cupy.asnumpy(x).astype(np.float64) for x in (q, k, v)),
                                       causal=causal)
    np.testing.assert_allclose(cupy.asnumpy(O), ref, rtol=1e-4, atol=1e-5)


TC_CASES = [(1, 1, 1, 64), (2, 3, 77, 64), (1, 2, 200, 128), (2, 2, 1000, 64), (1, 2, 1031, 128),
            (1, 1, 2048, 128)]


def _sdpa_rule(torch, q, k, v, O, causal):
    """(our max error, 2 x SDPA's max error), both against the fp32 reference on the same
    fp16/bf16 inputs."""
    import torch.nn.functional as F

    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    pt = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return (O.float() - ref).abs().max().item(), 2 * (pt.float() - ref).abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("version", cupy_flash2_tc.VERSIONS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("B,H,N,d", TC_CASES)
def test_tc_kernel_within_twice_sdpa_error(B, H, N, d, dtype, causal, version):
    _cupy_or_skip(80)
    torch = pytest.importorskip("torch")
    torch.manual_seed(N + d)
    Q, K, V = _inputs(np.random.default_rng(N + d + causal), B, H, N, d)
    q, k, v = (torch.tensor(x, device="cuda", dtype=getattr(torch, dtype)) for x in (Q, K, V))
    O = torch.full_like(q, float("nan"))                       # poisoned: unwritten stays NaN
    L = torch.full((B, H, N), float("nan"), device="cuda")
    O2, L2 = cupy_attention(q, k, v, "flash2", causal=causal, version=version, out=O, lse=L)
    assert O2 is O and L2 is L
    assert torch.isfinite(O).all() and torch.isfinite(L).all()
    ours, bound = _sdpa_rule(torch, q, k, v, O, causal)
    assert ours <= bound, (ours, bound)
    L_ref = flashsim.reference.logsumexp(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                         causal=causal)[..., 0]
    np.testing.assert_allclose(L.cpu().numpy(), L_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("d,config", [(d, c) for d in cupy_flash2_tc.HEAD_DIMS
                                      for c in cupy_flash2_tc.tuning_configs(d)], ids=str)
def test_tc_tuning_configs(d, config):
    _cupy_or_skip(80)
    torch = pytest.importorskip("torch")
    Q, K, V = _inputs(np.random.default_rng(d), 2, 2, 333, d)
    q, k, v = (torch.tensor(x, device="cuda", dtype=torch.float16) for x in (Q, K, V))
    for causal in (False, True):
        O, _ = cupy_attention(q, k, v, "flash2", causal=causal, version=config["VERSION"],
                              block_rows=config["BLOCK_R"], block_cols=config["BLOCK_C"],
                              min_blocks=config["MIN_BLOCKS"])
        ours, bound = _sdpa_rule(torch, q, k, v, O, causal)
        assert ours <= bound, (causal, ours, bound)


@pytest.mark.gpu
def test_tc_input_checks():
    cupy = _cupy_or_skip(80)
    x = cupy.zeros((1, 2, 16, 64), cupy.float16)

    def f(*args, **kw):
        return gpu_kernels.attention(*args, kernel="cupy_flash2_tc", **kw)
    with pytest.raises(KernelInputError, match="dtype float32"):
        f(x.astype(cupy.float32), x, x)
    with pytest.raises(KernelInputError, match="4 dimensions"):
        f(x[0], x[0], x[0])
    with pytest.raises(KernelInputError, match="shapes differ"):
        f(x, x[:, :, :8], x)
    with pytest.raises(KernelInputError, match="C-contiguous"):
        y = cupy.zeros((1, 16, 2, 64), cupy.float16).transpose(0, 2, 1, 3)
        f(y, y, y)
    with pytest.raises(KernelInputError, match="d = 96"):
        z = cupy.zeros((1, 2, 16, 96), cupy.float16)
        f(z, z, z)
    with pytest.raises(KernelInputError, match="version 7"):
        f(x, x, x, version=7)
    with pytest.raises(KernelInputError, match="out must be"):
        f(x, x, x, out=cupy.zeros((1, 2, 16, 64), cupy.float32))


@pytest.mark.gpu
def test_torch_tensors_go_through_dlpack_without_copies():
    cupy = _cupy_or_skip(80)
    torch = pytest.importorskip("torch")
    from gpu_kernels.cupy.common import as_cupy

    t = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    view, dtype = as_cupy(t, "Q")
    assert view.data.ptr == t.data_ptr() and dtype == "float16"
    O, L = cupy_attention(t, t, t, "flash2")
    assert isinstance(O, torch.Tensor) and isinstance(L, torch.Tensor)
    assert O.dtype == torch.float16 and L.dtype == torch.float32 and L.shape == (1, 2, 64)
    b = t.to(torch.bfloat16)
    Ob, _ = cupy_attention(b, b, b, "flash2")
    assert Ob.dtype == torch.bfloat16 and Ob.shape == b.shape
    assert isinstance(cupy_attention(cupy.asarray(t), cupy.asarray(t), cupy.asarray(t),
                                     "flash2")[0], cupy.ndarray)
    h = np.zeros((1, 2, 64, 64), np.float16)       # NumPy in, NumPy out
    Oh, Lh = cupy_attention(h, h, h, "flash2")
    assert isinstance(Oh, np.ndarray) and Oh.dtype == np.float16 and isinstance(Lh, np.ndarray)
