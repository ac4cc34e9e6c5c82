"""Our kernels from PyTorch: ``attention(q, k, v)`` on CUDA tensors, with autograd where a
backward kernel exists, and an attention function for Hugging Face models.

    import torch
    from gpu_kernels.torch import attention
    q, k, v = (torch.randn(2, 8, 1024, 64, device="cuda", requires_grad=True) for _ in range(3))
    o = attention(q, k, v, causal=True)          # (B, H, N, d), like q
    o.sum().backward()                           # fp32: numba_flash2_bwd

Forward: ``gpu_kernels.attention`` on the tensors themselves, without copies: CuPy views
them over their own memory (``cupy.common.as_cupy``), numba through the CUDA Array Interface
(``numba.cuda.as_cuda_array``), and O comes back as a tensor over the kernel's own buffer
(``torch.from_dlpack`` / the CUDA Array Interface). A tensor that is not C-contiguous (a
transposed view, as Hugging Face models pass) is made contiguous first: one copy. fp16 and
bf16 on ``backend="cupy"`` run the tensor-core kernel (``cupy_flash2_tc``, d = 64 or 128);
fp32 runs ``cupy_flash2`` or the numba kernels.

Backward (``torch.autograd.Function``): the registry's backward kernel for the algorithm in
that dtype (``registry.find(algorithm, "numba", dtype, pass_="bwd")``): ``numba_flash2_bwd``
(FlashAttention-2's Algorithm 2, fp32) reads the O and L = logsumexp the forward saved;
``numba_standard_bwd`` (fp32) recomputes P with its own forward kernels. There is none for
fp16/bf16 (the tensor-core kernel is forward-only) nor for flash1: asking for gradients
through them raises KernelInputError saying so.

Every kernel runs on the default CUDA stream; a call made while PyTorch's current stream is
another one is refused (the kernels would race the tensors' producers). PyTorch is imported
when a function is called, never at import: without it, calls raise KernelInputError.

``hf_attention_fn`` has the signature of a Hugging Face attention function (transformers
4.5x / 5.x, ``AttentionInterface``); ``register_hf()`` registers it (see docs/pytorch.md).
"""

from __future__ import annotations

import functools
import math

from .common import KernelInputError

__all__ = ["attention", "hf_attention_fn", "register_hf"]


def _torch():
    try:
        import torch
    except ImportError:
        raise KernelInputError("gpu_kernels.torch needs PyTorch (pip install torch); for NumPy "
                               "or CuPy arrays call gpu_kernels.attention") from None
    return torch


def attention(q, k, v, *, causal: bool = False, backend: str = "cupy", algorithm: str = "flash2",
              block_rows=None, block_cols=None):
    """softmax(q k^T / sqrt(d)) v for PyTorch CUDA tensors q, k, v of shape (B, H, N, d)
    (or (N, d)), all one dtype (fp32, fp16, bf16), by ``algorithm`` (standard, flash1,
    flash2) on ``backend`` (cupy, numba); ``block_rows``/``block_cols``: B_r, B_c (None:
    the kernel's tile rule). Returns O, a tensor of q's shape and dtype, differentiable
    where a backward kernel exists (see the module docstring). Bad input raises
    KernelInputError before anything is launched."""
    torch = _torch()
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(x, torch.Tensor):
            raise KernelInputError(f"{name} must be a torch.Tensor, got {type(x).__name__}; "
                                   "for NumPy or CuPy arrays call gpu_kernels.attention")
        if not x.is_cuda:
            raise KernelInputError(f"{name} is a PyTorch tensor on {x.device}; move it to the GPU")
    if torch.cuda.current_stream(q.device).cuda_stream != torch.cuda.default_stream(q.device).cuda_stream:
        raise KernelInputError("gpu_kernels.torch runs on the default CUDA stream; call it "
                               "outside torch.cuda.stream(...)")
    return _function().apply(q, k, v, causal, backend, algorithm, block_rows, block_cols)


@functools.lru_cache(maxsize=None)
def _function():
    """The autograd Function (made on first use, so that importing needs no PyTorch)."""
    torch = _torch()

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, backend, algorithm, block_rows, block_cols):
            import gpu_kernels

            # detached: PyTorch gives no CUDA Array Interface for tensors that require grad
            q, k, v = (x.detach().contiguous() for x in (q, k, v))
            O, L = gpu_kernels.attention(q, k, v, algorithm=algorithm, backend=backend,
                                         causal=causal, block_rows=block_rows,
                                         block_cols=block_cols)
            ctx.save_for_backward(q, k, v, O, L)
            ctx.causal, ctx.algorithm = causal, algorithm
            return O

        @staticmethod
        def backward(ctx, dO):
            q, k, v, O, L = (None if x is None else x.detach() for x in ctx.saved_tensors)
            dq, dk, dv = _backward(q, k, v, O, L, dO, ctx.causal, ctx.algorithm)
            return dq, dk, dv, None, None, None, None, None

    return Attention


def backward_kernel(algorithm: str, dtype: str):
    """The registry entry that computes the gradients of ``algorithm`` in ``dtype``
    (flashsim's name); KernelInputError saying why where there is none."""
    from . import registry

    try:
        return registry.find(algorithm, "numba", dtype, pass_="bwd")
    except KernelInputError:
        have = ", ".join(f"{k.name} ({k.algorithm}, {'/'.join(k.dtypes)})"
                         for k in registry.KERNELS.values() if k.pass_ == "bwd")
        why = (" (the tensor-core kernel cupy_flash2_tc is forward-only)"
               if dtype in ("fp16", "bf16") else "")
        raise KernelInputError(f"no backward kernel for {algorithm} in {dtype}{why}; the "
                               f"backward kernels: {have}. Use float32 tensors, or call "
                               "under torch.no_grad()") from None


def _backward(q, k, v, O, L, dO, causal, algorithm):
    """(dq, dk, dv) as tensors of q's shape: the backward kernel on the saved tensors."""
    torch = _torch()
    from .common import flashsim_dtype

    entry = backward_kernel(algorithm, flashsim_dtype(q.dtype))
    B, H, N, d = (1, 1) + tuple(q.shape) if q.dim() == 2 else tuple(q.shape)
    launch = entry.launch(batch=B, heads=H, seq_len=N, head_dim=d, causal=causal)
    dO = dO.detach().contiguous()
    if entry.algorithm == "flash2":
        saved = {"O": O, "L": L}
    else:                    # standard attention's backward reads P: its forward kernels make it
        saved = {"P": launch.forward(q, k, v)[1]}
    grads = launch.run(q, k, v, dO, saved)
    # numba device arrays of this launch's own buffers, viewed (CUDA Array Interface, no copy)
    return tuple(torch.as_tensor(g, device=q.device).view(q.shape) for g in grads)


# ------------------------------------------------------------------ Hugging Face
def hf_attention_fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    backend: str = "cupy", algorithm: str = "flash2", **kwargs):
    """A Hugging Face attention function (``AttentionInterface``): query (B, H, N, d), key
    and value (B, H_kv, N, d) -> (attn_output (B, N, H, d), None).

    The mask is causal as transformers says (``is_causal=`` where given, else
    ``module.is_causal``, default True); a mask from the model is taken only where it says
    no more than that (None, no padding, or exactly the causal pattern), else refused: the
    kernels take no other mask. Grouped-query heads are repeated (as ``repeat_kv``).
    Refused too: dropout, a scale other than 1/sqrt(d), sliding windows, soft-capping, and
    query and key lengths that differ (decoding with a KV cache: these kernels do prefill)."""
    _torch()                                     # one clear error without PyTorch
    B, H, N, d = query.shape
    if dropout:
        raise KernelInputError(f"dropout = {dropout}: our kernels have no dropout; set the "
                               "model's attention_dropout to 0 or call model.eval()")
    if scaling is not None and not math.isclose(scaling, d ** -0.5, rel_tol=1e-6):
        raise KernelInputError(f"scaling = {scaling}: our kernels scale by 1/sqrt(d) = {d ** -0.5}")
    if key.shape[2] != N:
        raise KernelInputError(f"query length {N} and key length {key.shape[2]} differ: these "
                               "kernels do prefill, not decoding with a KV cache (use_cache=False)")
    for name in ("sliding_window", "softcap"):
        if kwargs.get(name):
            raise KernelInputError(f"{name} = {kwargs[name]}: our kernels have none")
    is_causal = kwargs.get("is_causal")          # newer transformers may pass it
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    if not _says_no_more_than(attention_mask, N, causal):
        raise KernelInputError("attention_mask holds padding or another pattern than the causal "
                               "mask; our kernels take no mask: pass unpadded batches")
    if key.shape[1] != H:                       # grouped-query attention
        key, value = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (key, value))
    out = attention(query, key, value, causal=causal, backend=backend, algorithm=algorithm)
    return out.transpose(1, 2).contiguous(), None


def _says_no_more_than(mask, N: int, causal: bool) -> bool:
    """The model's ``attention_mask`` (None, 2-D padding (B, N) or 4-D (B, 1, N, N); bool
    True = attend, or additive 0 = attend) allows exactly the causal (or full) pattern."""
    if mask is None:
        return True
    torch = _torch()
    allowed = mask if mask.dtype == torch.bool else mask == 0
    if allowed.dim() == 2:
        return bool(allowed.all())
    if tuple(allowed.shape[-2:]) != (N, N):
        return False
    want = torch.ones(N, N, dtype=torch.bool, device=mask.device)
    return bool((allowed == (want.tril() if causal else want)).all())


def register_hf(name: str = "tiled_sim") -> str:
    """Register ``hf_attention_fn`` with transformers as ``name`` (and, where transformers
    has a mask registry, SDPA's mask builder under the same name, so padding reaches the
    function and is refused rather than silently dropped). Load a model with
    ``attn_implementation=name``. Returns ``name``.

    ``name`` must not contain "flash": transformers 5 takes any such implementation name
    for a flash-attention kernel to load from its hub (seen with 5.17 on the H200: "Could
    not find the currently requested flash attention implementation")."""
    if not isinstance(name, str) or not name or "flash" in name.lower():
        raise KernelInputError(f"register_hf: name {name!r} must be a non-empty string without "
                               "'flash' (transformers 5 reads such names as hub flash-attention "
                               "kernels), e.g. 'tiled_sim'")
    try:
        from transformers import AttentionInterface
    except ImportError:
        raise KernelInputError("register_hf needs transformers (pip install transformers)") from None
    AttentionInterface.register(name, hf_attention_fn)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    except ImportError:          # before transformers 4.53 models build their own 4-D masks
        return name
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    return name
