"""Our kernels from PyTorch (gpu_kernels/torch.py).

On a GPU (``@pytest.mark.gpu``; ``FLASHSIM_REAL_GPU=1`` for the numba backend): forward and
backward against ``torch.nn.functional.scaled_dot_product_attention`` with flash-attention's
rule: our error against the float64 result at most twice that of SDPA in the same dtype
(fp32: plus 2 ulp of the largest reference value, as ``gpu_kernels.harness.Reference``
allows, so an exact SDPA does not demand exactness); inputs whose running row maximum
changes between K/V blocks, N not a multiple of any tile, with and without the mask. The
Hugging Face attention function against SDPA, with grouped-query heads; a tiny Llama with
it registered (skipped without transformers).

Without a GPU or PyTorch: the module imports, and its calls fail with one clear error; the
backward kernel chosen for each algorithm and dtype, and the refusal where there is none;
with PyTorch installed (CPU), the input and mask checks.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import numpy as np
import pytest

from gpu_kernels import KernelInputError
from gpu_kernels import torch as gt

EPS32 = float(np.finfo(np.float32).eps)


# ------------------------------------------------------------------ no GPU, no PyTorch
def test_imports_without_torch_and_says_so_when_called(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)       # as if PyTorch were not installed
    module = importlib.reload(gt)
    with pytest.raises(KernelInputError, match="needs PyTorch"):
        module.attention(1, 2, 3)
    with pytest.raises(KernelInputError, match="needs PyTorch"):
        module.hf_attention_fn(None, 1, 2, 3, None)


def test_the_backward_kernel_of_each_algorithm_and_dtype():
    assert gt.backward_kernel("flash2", "fp32").name == "numba_flash2_bwd"
    assert gt.backward_kernel("standard", "fp32").name == "numba_standard_bwd"
    for dtype in ("fp16", "bf16"):
        with pytest.raises(KernelInputError, match="cupy_flash2_tc is forward-only"):
            gt.backward_kernel("flash2", dtype)
    with pytest.raises(KernelInputError, match="no backward kernel for flash1 in fp32"):
        gt.backward_kernel("flash1", "fp32")


def test_register_hf_refuses_names_transformers_reads_as_flash_kernels():
    with pytest.raises(KernelInputError, match="without 'flash'"):
        gt.register_hf("flashsim")


def test_register_hf_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(KernelInputError, match="needs transformers"):
        gt.register_hf()


def test_input_checks_on_the_cpu():
    torch = pytest.importorskip("torch")
    x = torch.zeros(1, 2, 16, 64)
    with pytest.raises(KernelInputError, match="move it to the GPU"):
        gt.attention(x, x, x)
    with pytest.raises(KernelInputError, match="must be a torch.Tensor"):
        gt.attention(np.zeros((16, 64), np.float32), x, x)


def test_hf_refusals_on_the_cpu():
    torch = pytest.importorskip("torch")
    m = types.SimpleNamespace(is_causal=True)
    q = torch.zeros(1, 2, 16, 64)
    with pytest.raises(KernelInputError, match="dropout"):
        gt.hf_attention_fn(m, q, q, q, None, dropout=0.1)
    with pytest.raises(KernelInputError, match="scaling"):
        gt.hf_attention_fn(m, q, q, q, None, scaling=0.5)
    with pytest.raises(KernelInputError, match="decoding"):
        gt.hf_attention_fn(m, q[:, :, :1], q, q, None)
    with pytest.raises(KernelInputError, match="sliding_window"):
        gt.hf_attention_fn(m, q, q, q, None, sliding_window=8)
    pad = torch.ones(1, 16, dtype=torch.bool)
    pad[0, :3] = False
    with pytest.raises(KernelInputError, match="padding"):
        gt.hf_attention_fn(m, q, q, q, pad)


def test_masks_that_say_no_more_than_causal():
    torch = pytest.importorskip("torch")
    N = 5
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    additive = torch.zeros(1, 1, N, N).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert gt._says_no_more_than(None, N, True)
    assert gt._says_no_more_than(causal[None, None], N, True)
    assert gt._says_no_more_than(additive, N, True)
    assert gt._says_no_more_than(torch.ones(2, N, dtype=torch.bool), N, True)
    assert not gt._says_no_more_than(additive, N, False)          # causal where none is asked
    padded = additive.clone()
    padded[..., 0] = torch.finfo(torch.float32).min
    assert not gt._says_no_more_than(padded, N, True)
    assert not gt._says_no_more_than(torch.zeros(1, 1, N, N + 1), N, True)


# ------------------------------------------------------------------ on a GPU
def _cuda_or_skip(backend: str = "cupy"):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    if backend == "numba":
        from gpu_kernels.numba.common import numba

        if numba.config.ENABLE_CUDASIM:
            pytest.skip("numba's simulator is on: run with FLASHSIM_REAL_GPU=1")
    else:
        pytest.importorskip("cupy")
    return torch


def _inputs(torch, B, H, N, d, dtype, seed, requires_grad=False):
    """q, k, v, dO on the GPU: standard normal, a few late keys aligned with their queries
    (large logits late: the running maximum changes between K/V blocks)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for _ in range(4))
    late = torch.randperm(N - N // 2, generator=g)[:max(1, N // 50)] + N // 2
    k[:, :, late] = 3.0 * q[:, :, late]
    dt = getattr(torch, dtype)
    return tuple(x.to(device="cuda", dtype=dt).requires_grad_(requires_grad and i < 3)
                 for i, x in enumerate((q, k, v, do)))


def _sdpa(torch, q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _bound(torch, theirs, ref, dtype) -> float:
    """flash-attention's rule: 2 x SDPA's max error in the same dtype (fp32: + 2 ulp of the
    largest reference value)."""
    err = (theirs.double() - ref).abs().max().item()
    return 2 * err + (2 * EPS32 * ref.abs().max().item() if dtype == "float32" else 0.0)


# (backend, algorithm, dtype, B, H, N, d): N a multiple of no tile; both head dimensions
# for the tensor-core kernel (its code differs per d; bf16 differs from fp16 only in its
# conversions, so once)
FWD = [(b, a, "float32", 2, 3, 200, 64) for b, a in (
           ("cupy", "flash2"), ("cupy", "standard"), ("cupy", "flash1"), ("numba", "flash2"),
           ("numba", "standard"))] + \
      [("cupy", "flash2", "float16", 2, 3, 200, 64), ("cupy", "flash2", "float16", 1, 2, 257, 128),
       ("cupy", "flash2", "bfloat16", 2, 3, 200, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend,algorithm,dtype,B,H,N,d", FWD)
def test_forward_within_twice_sdpa_error(backend, algorithm, dtype, B, H, N, d, causal):
    torch = _cuda_or_skip(backend)
    q, k, v, _ = _inputs(torch, B, H, N, d, dtype, seed=N + d + causal)
    ref = _sdpa(torch, q.double(), k.double(), v.double(), causal)
    O = gt.attention(q, k, v, causal=causal, backend=backend, algorithm=algorithm)
    assert isinstance(O, torch.Tensor) and O.shape == q.shape and O.dtype == q.dtype
    assert O.device == q.device and torch.isfinite(O).all()
    ours = (O.double() - ref).abs().max().item()
    assert ours <= _bound(torch, _sdpa(torch, q, k, v, causal), ref, dtype), ours


# (forward backend, algorithm, B, H, N, d); the backward kernels are numba's
BWD = [("numba", "flash2", 2, 2, 200, 64), ("cupy", "flash2", 2, 2, 200, 64),
       ("numba", "standard", 2, 2, 200, 64), ("numba", "flash2", 1, 2, 130, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend,algorithm,B,H,N,d", BWD)
def test_backward_within_twice_sdpa_error(backend, algorithm, B, H, N, d, causal):
    torch = _cuda_or_skip("numba")                 # every backward kernel is numba's
    _cuda_or_skip(backend)
    q, k, v, do = _inputs(torch, B, H, N, d, "float32", seed=7 * N + d + causal,
                          requires_grad=True)

    def grads(fn, *xs):
        xs = [x.detach().clone().requires_grad_() for x in xs]
        out = fn(*xs)
        out.backward(do.to(out.dtype))
        return [x.grad for x in xs]

    ref = grads(lambda *x: _sdpa(torch, *x, causal), q.double(), k.double(), v.double())
    theirs = grads(lambda *x: _sdpa(torch, *x, causal), q, k, v)
    ours = grads(lambda *x: gt.attention(*x, causal=causal, backend=backend,
                                         algorithm=algorithm), q, k, v)
    for name, o, t, r in zip(("dq", "dk", "dv"), ours, theirs, ref):
        assert o.shape == q.shape and o.dtype == torch.float32
        err = (o.double() - r).abs().max().item()
        assert err <= _bound(torch, t, r, "float32"), (name, err)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_no_backward_for_the_tensor_core_kernel(dtype):
    torch = _cuda_or_skip("cupy")
    q, k, v, do = _inputs(torch, 1, 2, 64, 64, dtype, seed=1, requires_grad=True)
    O = gt.attention(q, k, v)                       # the forward runs
    with pytest.raises(KernelInputError, match="forward-only"):
        O.backward(do)


@pytest.mark.gpu
def test_contiguous_inputs_are_viewed_and_transposed_views_taken():
    torch = _cuda_or_skip("cupy")
    from gpu_kernels.cupy.common import as_cupy

    q, k, v, _ = _inputs(torch, 1, 2, 64, 64, "float16", seed=2)
    assert as_cupy(q, "q")[0].data.ptr == q.data_ptr()
    x = q.transpose(1, 2).contiguous()              # stored (B, N, H, d), as HF models hold it
    y = x.transpose(1, 2)                           # viewed as (B, H, N, d): q's values
    assert not y.is_contiguous() and torch.equal(y, q)
    O = gt.attention(y, k, v)
    ref = _sdpa(torch, q.double(), k.double(), v.double(), False)
    assert (O.double() - ref).abs().max().item() <= _bound(torch, _sdpa(torch, q, k, v, False),
                                                           ref, "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_hf_attention_fn_matches_sdpa_with_grouped_heads(dtype):
    torch = _cuda_or_skip("cupy")
    B, H, H_kv, N, d = 2, 4, 2, 150, 64
    q, _, _, _ = _inputs(torch, B, H, N, d, dtype, seed=3)
    _, k, v, _ = _inputs(torch, B, H_kv, N, d, dtype, seed=4)
    module = types.SimpleNamespace(is_causal=True)
    out, weights = gt.hf_attention_fn(module, q, k, v, None, scaling=d ** -0.5, dropout=0.0)
    assert weights is None and out.shape == (B, N, H, d)
    rep = [x.repeat_interleave(H // H_kv, dim=1) for x in (k, v)]
    ref = _sdpa(torch, q.double(), *(x.double() for x in rep), True).transpose(1, 2)
    theirs = _sdpa(torch, q, *rep, True).transpose(1, 2)
    assert (out.double() - ref).abs().max().item() <= _bound(torch, theirs, ref, dtype)
    causal = torch.ones(N, N, dtype=torch.bool, device="cuda").tril()
    additive = torch.zeros(B, 1, N, N, device="cuda", dtype=q.dtype).masked_fill(
        ~causal, torch.finfo(q.dtype).min)
    out2, _ = gt.hf_attention_fn(module, q, k, v, additive, scaling=d ** -0.5)
    assert torch.equal(out, out2)


@pytest.mark.gpu
def test_a_hugging_face_model_with_our_attention():
    """A tiny Llama, random weights, fp32: our attention registered as attn_implementation,
    logits against the same model on SDPA, and a backward pass through it."""
    torch = _cuda_or_skip("numba")
    _cuda_or_skip("cupy")
    transformers = pytest.importorskip("transformers")
    name = gt.register_hf("tiled_sim_test")
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    ours = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=name)
    sdpa = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    sdpa.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 97, (2, 100), device="cuda")
    a, b = (m.to("cuda").eval()(ids, use_cache=False).logits for m in (ours, sdpa))
    assert math.isfinite(a.abs().max().item())
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    ours.train()
    ours(ids, labels=ids, use_cache=False).loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in ours.parameters() if p.requires_grad)
