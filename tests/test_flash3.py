"""The Hopper kernel (gpu_kernels/cuda/flash3.cu, loaded by gpu_kernels/cupy/flash3.py).

Without a GPU: every version x d x dtype compiles for sm_90a through NVRTC (cuda.core, as CI
has it), the resource table (registers, shared memory, stack, spills) goes into the test log,
nothing spills, shared memory fits; each version's PTX holds the instructions its header
names (wgmma from v1, the bulk tensor copy from v2, setmaxnreg from v3, named barriers in
v4); the header lists exactly the versions the code has; the shared-memory formula is the
kernel's; bad launches are refused before anything is compiled; the benchmark's SASS
histogram parses cuobjdump's text, and its probe runs without a GPU.

On a GPU (``@pytest.mark.gpu``): every version, d, dtype and mask against the float64
reference on ragged N = 97, 1025, 4097 with flash-attention's rule (at most twice the error
of a plain implementation in the same dtype, gpu_kernels.harness.Reference), and L against
the float64 logsumexp; outputs are poisoned first, so an unwritten row fails.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import flashsim
from gpu_kernels import KernelInputError, harness, registry
from gpu_kernels.cupy import flash3
from gpu_kernels.cupy.common import read_source


# ------------------------------------------------------------------ compile checks (no GPU)

@pytest.fixture(scope="module")
def resources(request):
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import FILE_ARCH, compile_variant, format_table

    assert FILE_ARCH[flash3.CU_FILE] == flash3.ARCH      # the compile flash3.cubin loads
    rows = []
    for cu_file, defines, dyn, _hot in flash3.compile_variants():
        rows.extend(compile_variant(cu_file, defines, dyn))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\nflash3.cu for sm_90a\n" + format_table(rows))
    return rows


def test_every_version_compiles_for_sm90a_without_spills(resources):
    from gpu_kernels.compile import SMEM_LIMIT_OPTIN

    assert len(resources) == (len(flash3.HEAD_DIMS) * 2 * len(flash3.VERSIONS) + len(flash3.VERSIONS) - 1
                              + len(flash3.MASK_HEAD_DIMS) * 2)
    for r in resources:
        assert r.kernel == "flash3_fwd" and r.registers > 0, r
        assert not r.spills and r.stack_frame == 0, r
        assert r.smem <= SMEM_LIMIT_OPTIN, r
        version = int(re.search(r"VERSION=(\d)", r.variant).group(1))
        # 384 threads from v3 on: the launch's register cap is 65536 / 384 -> 168
        assert r.registers <= (168 if version >= 3 else 255), r


def _ptx(defines: dict) -> str:
    """The PTX of flash3.cu with these constants (NVRTC through cuda.bindings, no driver)."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(read_source(flash3.CU_FILE).encode(), b"flash3.cu", 0, [], [])
    opts = [b"--gpu-architecture=compute_90a", b"-std=c++17", b"--device-as-default-execution-space"]
    opts += [f"-D{k}={v}".encode() for k, v in defines.items()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.decode()


@pytest.mark.parametrize("version", flash3.VERSIONS)
def test_each_version_uses_the_instructions_it_names(version):
    pytest.importorskip("cuda.core")
    ptx = _ptx(flash3.defines(128, "fp16", version=version))
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx      # S = Q K^T, O += P V
    assert ("cp.async.bulk.tensor.3d" in ptx) == (version >= 2)
    assert ("cp.async.cg.shared.global" in ptx) == (version == 1)
    assert ("setmaxnreg.inc.sync.aligned.u32 240" in ptx) == (version >= 3)
    assert ("bar.arrive" in ptx) == (version == 4)                          # the ping-pong
    if version >= 2:      # the fallback build reads the maps from global memory, acquired first
        ptx = _ptx(dict(flash3.defines(128, "fp16", version=version), TMAP_GLOBAL=1))
        assert "fence.proxy.tensormap::generic.acquire.gpu" in ptx


def test_plain_sm90_is_refused():
    """wgmma exists only on sm_90a: the file says so instead of failing in ptxas."""
    pytest.importorskip("cuda.core")
    from gpu_kernels.compile import compile_cubin

    with pytest.raises(RuntimeError, match="needs the sm_90a target"):
        compile_cubin(read_source(flash3.CU_FILE), {}, arch="sm_90", name=flash3.CU_FILE)


def test_header_lists_the_versions_in_the_code():
    src = read_source(flash3.CU_FILE)
    header = src.split("#ifndef")[0]
    listed = sorted(int(v) for v in re.findall(r"^//\s+v(\d+)\s", header, flags=re.M))
    assert listed == list(flash3.VERSIONS)
    assert f"VERSION >= 1 && VERSION <= {max(listed)}" in src
    for v in listed[1:]:
        assert re.search(rf"VERSION (>=|==|<=) {v}\b", src), v


def test_smem_formula_matches_the_kernel():
    src = read_source(flash3.CU_FILE)
    assert ("#define SMEM_BYTES (1024 + TILE_BYTES(BLOCK_R) + 2 * KV_STAGES * TILE_BYTES(BLOCK_C) "
            "+ 8 * (1 + 3 * KV_STAGES))") in src
    assert "#define TILE_BYTES(rows) (PANEL_BYTES(rows) * (HEAD_DIM / 64))" in src
    assert "#define PANEL_BYTES(rows) ((rows) * 128)" in src
    # the same closed form: 1024 + (B_r + 2 stages B_c) d 2 + 8 (1 + 3 stages)
    assert flash3.smem_bytes(128, 128, 2) == 1024 + (128 + 4 * 128) * 128 * 2 + 8 * 7
    assert flash3.smem_bytes(256, 64, 2) == 1024 + (128 + 4 * 64) * 256 * 2 + 8 * 7


@pytest.mark.parametrize("version", flash3.VERSIONS)
@pytest.mark.parametrize("d", flash3.HEAD_DIMS)
def test_launch_threads_grid_and_shared_memory(d, version):
    launch = registry.launch("cupy_flash3", batch=2, heads=3, seq_len=1000, head_dim=d,
                             causal=True, version=version)
    assert launch.threads == (384 if version >= 3 else 256)
    assert launch.grid == (8, 6)                  # ceil(1000 / 128) query blocks x B * H
    assert launch.dynamic_smem == flash3.smem_bytes(d, launch.block_cols, launch.stages)
    assert launch.block_cols == (64 if d == 256 else 128)
    p = launch.plan()
    assert (p.block_rows, p.block_cols, p.head_dim) == (128, launch.block_cols, d)


@pytest.mark.parametrize("kw, match", [
    (dict(version=5), "version 5 does not exist"),
    (dict(head_dim=96), "d = 96"),
    (dict(dtype="fp32"), "fp32"),
    (dict(head_dim=256, block_cols=128), "shared memory"),
    (dict(block_rows=64), "block_rows = 128"),
    (dict(stages=4), "2 or 3 stages"),
])
def test_bad_launches_are_refused_before_compiling(kw, match):
    args = {**dict(batch=1, heads=1, seq_len=64, head_dim=64), **kw}
    with pytest.raises(KernelInputError, match=match):
        registry.launch("cupy_flash3", **args)


def test_sass_histogram_reads_cuobjdump_text():
    from benchmarks.hopper_h200 import sass_histogram

    text = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0090*/              @!P0 BRA 0x120 ;                            /* 0x0000000000008947 */
        /*01a0*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT ;  /* 0x0 */
        /*01b0*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24 ;       /* 0x0 */
        /*01c0*/              @P1 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ ;           /* 0x0 */
    """
    assert sass_histogram(text) == {"HGMMA": 2, "LDC": 1, "BRA": 1, "SYNCS": 1}


def test_probe_runs_without_a_gpu(tmp_path):
    """--probe records every version's (fp16) ptxas registers (read from the committed
    compile cache where there is no cuobjdump); the opcode histogram is there only where
    cuobjdump is (the GPU machine), and then it holds HGMMA."""
    pytest.importorskip("cuda.core")
    import json

    from benchmarks import hopper_h200

    hopper_h200.main(["--probe", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "hopper_h200_probe.json").read_text())["sass"]
    assert set(rec) == {f"d={d} v{v}" for d in flash3.HEAD_DIMS for v in flash3.VERSIONS}
    for r in rec.values():
        assert r["ptxas"]["registers"] > 0, r
        if "histogram" in r:
            assert r["histogram"].get("HGMMA", 0) > 0 and r["histogram"].get("HMMA", 0) == 0, r


# ------------------------------------------------------------------ on the GPU

def _hopper_or_skip():
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
        cc = int(cupy.cuda.Device().compute_capability)
    except Exception as exc:
        pytest.skip(f"no usable CUDA device ({exc})")
    if cc != 90:
        pytest.skip(f"compute capability {cc}: the kernel is built for sm_90a")
    return cupy, torch


def _inputs(rng, B, H, N, d):
    """Random Q, K, V whose running row maximum changes between K/V blocks: a few late keys
    align with their queries and carry large logits."""
    Q, K, V = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    late = rng.choice(np.arange(N // 2, N), size=max(1, N // 50), replace=False)
    K[:, :, late] = 3.0 * Q[:, :, late]
    return Q, K, V


@pytest.mark.gpu
@pytest.mark.parametrize("version", flash3.VERSIONS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", flash3.HEAD_DIMS)
@pytest.mark.parametrize("N", [97, 1025, 4097])
def test_matches_float64_reference_within_flash_attentions_rule(N, d, dtype, causal, version):
    _, torch = _hopper_or_skip()
    B, H = (1, 2) if N <= 2048 else (1, 1)
    q, k, v = (torch.tensor(x, device="cuda", dtype=getattr(torch, dtype))
               for x in _inputs(np.random.default_rng(N + d + causal), B, H, N, d))
    launch = registry.launch("cupy_flash3", batch=B, heads=H, seq_len=N, head_dim=d, dtype=dtype,
                             causal=causal, version=version)
    O = torch.full_like(q, float("nan"))                    # poisoned: unwritten stays NaN
    L = torch.full((B, H, N), float("nan"), device="cuda")
    launch.run(q, k, v, out=O, lse=L)
    Qn, Kn, Vn = (x.double().cpu().numpy() for x in (q, k, v))
    verdict = harness.reference_check(O.double().cpu().numpy(), Qn, Kn, Vn, causal,
                                      "fp16" if dtype == "float16" else "bf16")
    assert verdict["ok"], verdict
    L_ref = flashsim.reference.logsumexp(Qn, Kn, causal=causal)[..., 0]
    np.testing.assert_allclose(L.cpu().numpy(), L_ref, rtol=1e-5, atol=1e-4)


def test_gain_table_is_computed_from_the_points():
    from benchmarks.hopper_h200 import gain_table

    pts = [dict(impl=i, d=128, N=N, causal=False, tflops=t)
           for i, N, t in [("cupy_flash3_v1", 2048, 200.0), ("cupy_flash3_v2", 2048, 300.0),
                           ("cupy_flash3_v1", 4096, 200.0), ("cupy_flash3_v2", 4096, 600.0),
                           ("torch_flash", 2048, 400.0), ("torch_flash", 4096, 300.0)]]
    lines, ratios, gains = gain_table(pts)
    assert [(r["N"], r["ratio"]) for r in ratios] == [(2048, 0.75), (4096, 2.0)]
    (g,) = gains
    assert g["step"] == "v1 -> v2" and g["points"] == 2
    assert abs(g["geomean_gain"] - (1.5 * 3.0) ** 0.5) < 1e-12
    assert any(line.startswith("128 0  4096") and line.endswith("2.00") for line in lines)
