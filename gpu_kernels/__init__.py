"""GPU kernels that run flashsim's algorithms with the same tiles.

    import gpu_kernels
    O, L = gpu_kernels.attention(Q, K, V, algorithm="flash2", backend="numba")
    rep = gpu_kernels.predicted_traffic((B, H, N, d), algorithm="flash2", backend="numba")
    row = gpu_kernels.measure("cupy_flash2_tc", batch=4, heads=16, seq_len=4096, head_dim=128)
    row = gpu_kernels.measure_decode("cupy_decode", batch=8, heads=32, kv_heads=8, head_dim=128,
                                     kv_len=32768)
    O, L = gpu_kernels.decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=bt)

Layout: ``common`` (the one error type, input checks, the tile policy, ``Launch``),
``registry`` (every kernel by name), ``numba/`` (numba.cuda kernels, fp32), ``cupy/`` (loaders
of the CUDA C++ in ``cuda/`` through CuPy), ``compile`` (NVRTC for sm_90 without a GPU),
``harness`` (check, then time; provenance). Nothing here touches a GPU at import time: numba
and CuPy are imported when a kernel is first configured or run.
"""

from __future__ import annotations

from .common import KernelInputError, Result, describe

__all__ = ["attention", "decode_attention", "predicted_traffic", "measure", "measure_decode",
           "gpu_available", "KernelInputError", "Result"]


def gpu_available() -> bool:
    """Asked only when called (never at import): is a CUDA GPU usable through CuPy?"""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no"
        return False


def _entry(algorithm, backend, dtype, kernel):
    from . import registry

    if kernel is not None:
        return registry.get(kernel)
    if backend not in ("numba", "cupy"):
        raise KernelInputError(f"backend {backend!r}: choose numba or cupy")
    return registry.find(algorithm, backend, dtype)


def _launch_for(shape, *, algorithm, backend, causal, block_rows, block_cols, dtype, kernel,
                options):
    from .common import check_shape, flashsim_dtype

    B, H, N, d = check_shape(shape)
    entry = _entry(algorithm, backend, flashsim_dtype(dtype), kernel)
    return entry.launch(batch=B, heads=H, seq_len=N, head_dim=d, dtype=dtype, causal=causal,
                        block_rows=block_rows, block_cols=block_cols, **options)


def attention(Q, K, V, *, algorithm: str = "flash2", backend: str = "numba", causal: bool = False,
              block_rows=None, block_cols=None, dtype=None, kernel: str | None = None,
              out=None, lse=None, **options) -> Result:
    """softmax(Q K^T / sqrt(d)) V by ``algorithm`` (standard, flash1, flash2) on ``backend``.

    Q, K, V: (B, H, N, d) or (N, d), all NumPy arrays or all GPU arrays (CuPy, PyTorch CUDA
    tensors, numba device arrays). ``dtype`` (fp32, fp16, bf16): run in it, converting the
    inputs first (None: theirs); fp16/bf16 on CuPy run the tensor-core kernel. ``kernel``:
    a registry name instead of (algorithm, backend). ``block_rows``/``block_cols``: B_r, B_c
    (None: the kernel's tile rule). ``options``: the kernel's own (numba: ``threads``; CuPy
    fp32: ``sram``; tensor cores: ``version``, ``min_blocks``). ``out``/``lse``: buffers for
    O and L (tensor-core kernel), returned as given.

    Returns ``Result(O, L)`` in the inputs' framework and shape (NumPy in, NumPy out); L, the
    logsumexp of each row of tau Q K^T, is None for standard attention. Bad input raises
    KernelInputError before anything is launched."""
    from . import registry
    from .common import check_flag, check_qkv, dtype_name

    check_flag(causal, "causal")
    entry = registry.get(kernel) if kernel is not None else None
    dtypes = ("float32", "float16", "bfloat16") if entry is None else \
        tuple(dtype_name(t) for t in entry.dtypes)
    head_dims = None if entry is None else entry.head_dims
    if dtype is not None and dtype_name(dtype) != check_qkv(Q, K, V, head_dims=head_dims).dtype:
        Q, K, V = (_convert(x, dtype_name(dtype)) for x in (Q, K, V))
    inputs = check_qkv(Q, K, V, dtypes=dtypes, head_dims=head_dims)
    run_options = {k: v for k, v in (("out", out), ("lse", lse)) if v is not None}
    launch = _launch_for(inputs.shape, algorithm=algorithm, backend=backend, causal=causal,
                         block_rows=block_rows, block_cols=block_cols, dtype=inputs.dtype,
                         kernel=kernel, options=options)
    if run_options and launch.kernel != "cupy_flash2_tc":
        raise KernelInputError(f"out= and lse= are for the tensor-core kernel, not {launch.kernel}")
    res = launch.run(*_to_backend(launch, (Q, K, V), inputs.kind), **run_options)
    L = res.L if res.L is not None else launch.logsumexp()
    O_shape, L_shape = inputs.shape, inputs.shape[:-1]
    return Result(out if out is not None else _from_backend(launch, res.O, inputs, O_shape),
                  lse if lse is not None else
                  (None if L is None else _from_backend(launch, L, inputs, L_shape, "float32")))


def decode_attention(q, k_cache, v_cache, cache_seqlens, *, block_table=None, causal: bool = True,
                     num_splits=None, check_finite: bool = True, out=None, lse=None) -> Result:
    """One decode step (flash-attention's ``flash_attn_with_kvcache``): q (B, q_len, H, d)
    fp16/bf16 against k_cache / v_cache, contiguous (B, capacity, kv_heads, d) or paged
    (num_pages, page_size, kv_heads, d) with ``block_table`` (B, max_pages) int32, at any
    strides with d contiguous (a head-major cache as its transposed view, no copy);
    ``cache_seqlens`` (B,): the keys of each sequence, the q_len new ones included (causal:
    bottom-right aligned). The batch layout (cache_seqlens, block_table) is read on the host
    (a device array is copied) and checked; ``check_finite``: the used cache rows and q are
    checked for NaN/Inf first (NumPy: on the host; GPU arrays: one read on the device).

    Returns Result(O like q, L (B, H, q_len) float32) in the inputs' framework (NumPy in:
    copied to the GPU and back). Bad input raises KernelInputError before any launch. Runs
    ``cupy_decode`` (contiguous) or ``cupy_decode_paged``."""
    from .common import check_flag
    from .cupy import decode

    check_flag(causal, "causal")
    infos = [describe(x, n) for x, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"))]
    if len({i.kind == "numpy" for i in infos}) != 1:
        raise KernelInputError("q, k_cache, v_cache must all be host (NumPy) arrays or all be GPU "
                               f"arrays, got {', '.join(i.kind for i in infos)}")
    for info, n in zip(infos, ("q", "k_cache", "v_cache")):
        if len(info.shape) != 4:
            raise KernelInputError(f"{n} has shape {info.shape}; expected 4 dimensions")
        if info.dtype not in ("float16", "bfloat16"):
            raise KernelInputError(f"{n} has dtype {info.dtype}; the decode kernel takes float16, bfloat16")
    if len({i.dtype for i in infos}) != 1:
        raise KernelInputError(f"q, k_cache, v_cache dtypes differ: {', '.join(i.dtype for i in infos)}")
    B, q_len, H, d = infos[0].shape
    pages, page_size, kv_heads, d_kv = infos[1].shape
    if d_kv != d:
        raise KernelInputError(f"k_cache has head dimension {d_kv}; q has {d}")
    paged = block_table is not None
    launch = decode.configure(B, H, kv_heads, d, kv_lens=cache_seqlens, q_len=q_len,
                              dtype=infos[0].dtype, causal=causal,
                              page_size=page_size if paged else None, block_table=block_table,
                              num_pages=pages if paged else None, splits=num_splits)
    why = launch.cache_shape_ok(infos[1].shape)
    if why:
        raise KernelInputError(f"k_cache has shape {infos[1].shape}: {why}")
    if infos[0].kind == "numpy":
        if check_finite:
            launch.check_finite(q, k_cache, v_cache)
        import cupy

        bf16 = infos[0].dtype == "bfloat16"       # travels as its int16 bits
        dev = [cupy.asarray(x.view("int16") if bf16 else x) for x in (q, k_cache, v_cache)]
        res = launch.run(*dev)
        O = res.O.get()
        return Result(O.view(q.dtype) if bf16 else O, res.L.get())
    res = launch.run(q, k_cache, v_cache, out=out, lse=lse, check_finite=check_finite)
    from .cupy.common import wrap_like

    return Result(out if out is not None else wrap_like(res.O, infos[0].kind, infos[0].dtype),
                  lse if lse is not None else wrap_like(res.L, infos[0].kind))


def _convert(x, dtype: str):
    """``x`` in ``dtype`` (a copy), in its own framework."""
    module = type(x).__module__
    if module.startswith("torch"):
        import torch

        return x.to(getattr(torch, dtype))
    if dtype == "bfloat16":
        raise KernelInputError("only PyTorch tensors can be converted to bfloat16 here")
    return x.astype(dtype)


def _to_backend(launch, arrays, kind: str):
    """Q, K, V as the backend takes them: NumPy copied to the GPU for CuPy (numba's ``run``
    copies NumPy itself); GPU arrays viewed, never copied."""
    if launch.kernel.startswith("cupy") and kind == "numpy":
        import cupy

        return tuple(cupy.asarray(x) for x in arrays)
    return arrays


def _from_backend(launch, x, inputs, shape, dtype: str | None = None):
    """A result of ``run`` in the caller's framework and shape."""
    if launch.kernel.startswith("cupy"):
        from .cupy.common import wrap_like

        return wrap_like(x.reshape(shape), inputs.kind, dtype or inputs.dtype)
    if inputs.kind == "numpy":
        return x.copy_to_host().reshape(shape)
    x = x.reshape(shape)
    if inputs.kind == "cupy":
        import cupy

        return cupy.asarray(x)
    if inputs.kind == "torch":
        import torch

        return torch.as_tensor(x, device="cuda")
    return x


def predicted_traffic(shape, *, algorithm: str = "flash2", backend: str = "numba",
                      causal: bool = False, block_rows=None, block_cols=None, dtype="fp32",
                      kernel: str | None = None, gpu: str = "h200", **options):
    """flashsim's Report for exactly the launch ``attention`` makes for inputs of ``shape``
    ((B, H, N, d) or (N, d)) with these arguments: same tiles, N, d, batch, heads, mask,
    dtype; its ``predicted_time_s`` is the roofline on ``gpu``."""
    return _launch_for(shape, algorithm=algorithm, backend=backend, causal=causal,
                       block_rows=block_rows, block_cols=block_cols, dtype=dtype, kernel=kernel,
                       options=options).predicted_traffic(gpu)


def measure(kernel_name: str, *, batch: int, heads: int, seq_len: int, head_dim: int,
            dtype=None, causal: bool = False, block_rows=None, block_cols=None,
            repeats: int | None = None, seed: int = 0, harness=None, **options) -> dict:
    """Check, then time, one kernel on random inputs; a dict ready for JSON.

    The check compares the first and last head (the last alone above N = 4096) with the
    float64 reference (``harness.reference_check``: fp32 within 2 x a plain fp32
    implementation's error + 2 ulp; fp16/bf16 within 2 x the error of a plain implementation
    in that dtype, flash-attention's rule); a launch that fails is not timed (``time_s``
    None). ``dtype`` None is the kernel's first (fp16 for the tensor-core kernel, else fp32).
    TFLOP/s count the useful FLOPs: 4 B H N^2 d, halved under the causal mask (the backward:
    flashsim's count). Returns kernel, config, tiles, threads, time_s, times_s, tflops,
    check_ok, max_error, bound, predicted (flashsim's report for this launch), method."""
    from . import harness as hz
    from . import registry

    entry = registry.get(kernel_name)
    launch = entry.launch(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                          dtype=dtype, causal=causal, block_rows=block_rows,
                          block_cols=block_cols, **options)
    h = harness or hz.Harness(entry.backend)
    data = _random_inputs(launch, seed)
    heads_checked = hz.checked_heads(launch.BH, launch.N)
    if launch.pass_ == "bwd":
        fn, check = _backward_case(launch, data, heads_checked)
    else:
        def fn():
            return launch.run(*data["dev"][:3])

        def check(res):
            out = _host_heads(res.O, heads_checked, launch)
            q, k, v = (data["host"][n] for n in "QKV")
            return hz.reference_check(out, q, k, v, launch.causal, launch.dtype)
    row = h.check_then_time(fn, check, repeats=repeats)
    rep = launch.predicted_traffic()
    useful = rep.flops if launch.pass_ == "bwd" else launch.flops // (2 if launch.causal else 1)
    t = row.get("time_s")
    return {
        "kernel": kernel_name,
        "config": {"batch": launch.batch, "heads": launch.heads, "seq_len": launch.N,
                   "head_dim": launch.d, "dtype": launch.dtype, "causal": launch.causal,
                   "pass": launch.pass_, **{k: v for k, v in options.items()}},
        **_measured_fields(launch, row, h),
        "tflops": None if t is None else useful / t / 1e12, "heads_checked": heads_checked,
        "predicted": {**rep.to_dict(), "plan": launch.plan_record()},
    }


def _measured_fields(launch, row: dict, h) -> dict:
    """What ``measure`` and ``measure_decode`` say alike of a launch checked, then timed
    (``row``: ``Harness.check_then_time``'s): its tiles, threads, shared memory and kernel
    launches, the times, the verdict and the harness's method."""
    return {
        "tiles": {"block_rows": launch.block_rows, "block_cols": launch.block_cols},
        "threads": launch.threads, "static_smem": launch.static_smem,
        "dynamic_smem": launch.dynamic_smem,
        "launches": [dict(kernel=k.kernel, grid=list(k.grid), threads=k.threads,
                          dynamic_smem=k.dynamic_smem) for k in launch.launches()],
        "time_s": row.get("time_s"), "times_s": row.get("times_s"),
        "check_ok": row["check"]["ok"], "max_error": row["check"]["max_abs_error"],
        "bound": row["check"]["bound"], "check": row["check"], "method": h.method(),
    }


def measure_decode(kernel_name: str, *, batch: int, heads: int, head_dim: int, kv_heads=None,
                   kv_len=None, kv_lens=None, q_len: int = 1, dtype=None, repeats: int | None = None,
                   seed: int = 0, harness=None, **options) -> dict:
    """Check, then time, one step of a decode kernel (``registry.DECODE_KERNELS``) on random
    inputs; a dict ready for JSON, as ``measure`` gives for the others.

    The launch: ``registry.get(kernel_name).launch(...)`` (``options``: page_size, splits,
    causal, block_cols, ...; a paged kernel without a block table gets ``decode.page_table``'s
    with seed 0). Inputs: ``decode.device_inputs`` (standard normal, made on the GPU). The
    check (``decode.device_check``), as benchmarks/decode_h200.py checks our kernel: the
    float64 reference of the (sequence, KV head) pairs of ``decode.checked_pairs`` for every
    query row, flash-attention's rule (max error <= 2 x a plain same-dtype implementation's),
    the logsumexp within 1e-3 + 1e-5 |L|; O starts as NaN, so a row never written fails. A
    launch that fails is not timed. Time: the harness, writing into fixed O and L buffers.
    ``tbps``: the K/V bytes the step must read (``launch.kv_bytes``) over the time."""
    import cupy
    import numpy as np

    from . import harness as hz
    from . import registry
    from .cupy import decode

    if kernel_name not in registry.DECODE_KERNELS:
        raise KernelInputError(f"{kernel_name} is not a decode kernel: gpu_kernels.measure runs it")
    entry = registry.get(kernel_name)
    launch = entry.launch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                          kv_len=kv_len, kv_lens=kv_lens, q_len=q_len, dtype=dtype, **options)
    h = harness or hz.Harness(entry.backend)
    q, k, v = decode.device_inputs(launch, seed)
    check = decode.device_check(launch, q, k, v)
    O = cupy.full(q.shape, np.nan if launch.dtype == "fp16" else 0x7FC0, q.dtype)
    L = cupy.full((launch.batch, launch.heads, launch.q_len), np.nan, cupy.float32)

    def fn():
        return launch.run(q, k, v, out=O, lse=L)
    row = h.check_then_time(fn, check, repeats=repeats)
    t = row.get("time_s")
    return {
        "kernel": kernel_name,
        "config": {"batch": launch.batch, "heads": launch.heads, "kv_heads": launch.kv_heads,
                   "q_len": launch.q_len, **launch.lens(), "head_dim": launch.d, "dtype": launch.dtype,
                   "causal": launch.causal, "page_size": launch.page_size or None,
                   "splits": launch.splits, "pass": "fwd"},
        **_measured_fields(launch, row, h),
        "tbps": None if t is None else launch.kv_bytes / t / 1e12,
        "pairs_checked": row["check"]["pairs_checked"], "plan": launch.plan_record(),
    }


def _random_inputs(launch, seed: int) -> dict:
    """Q, K, V (and dO for a backward) of the launch's shape: standard normal, rounded to the
    launch's dtype, made on the GPU with CuPy for the CuPy kernels (with NumPy, then copied,
    for numba's);
    "dev": the arrays the launch runs on, "host": the checked heads as float32 values."""
    import numpy as np

    from . import harness as hz

    if launch.kernel.startswith("cupy"):
        import cupy as xp
    else:
        xp = np
    names = ("Q", "K", "V", "dO") if launch.pass_ == "bwd" else ("Q", "K", "V")
    heads = hz.checked_heads(launch.BH, launch.N)
    rng = xp.random.default_rng(seed)
    dev, host = [], {}
    for n in names:
        x = rng.standard_normal((launch.batch, launch.heads, launch.N, launch.d), dtype=xp.float32)
        if launch.dtype == "fp16":
            x = x.astype(xp.float16)
        elif launch.dtype == "bf16":      # the bits of bf16 (round to nearest even), as int16
            u = x.view(xp.uint32)
            x = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(xp.uint16).view(xp.int16)
        host[n] = _host_heads(x, heads, launch)
        if xp is np:
            from .numba.common import cuda

            x = cuda.to_device(x)
        dev.append(x)
    return {"dev": dev, "host": host}


def _host_heads(x, heads, launch):
    """Heads ``heads`` of a device result (B*H, N, ...) on the host, float32 values."""
    import numpy as np

    a = x.copy_to_host() if hasattr(x, "copy_to_host") else x.get() if hasattr(x, "get") else x
    a = a.reshape((launch.BH,) + a.shape[-2:] if a.ndim >= 3 else (launch.BH, -1))[heads]
    if launch.dtype == "bf16" and a.dtype == np.int16:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def _backward_case(launch, data, heads):
    """(run, check) of a backward launch: the saved tensors from one forward run of the
    standard kernels, the gradients checked by ``harness.backward_check``."""
    from . import harness as hz

    Q, K, V, dO = data["dev"]
    O, P, L = launch.forward(Q, K, V)
    saved = {"O": O, "L": L} if launch.algorithm == "flash2" else {"P": P}

    def fn():
        return launch.run(Q, K, V, dO, saved)

    def check(grads):
        host = {n: _host_heads(x, heads, launch) for n, x in saved.items()}
        return hz.backward_check([_host_heads(g, heads, launch) for g in grads],
                                 *(data["host"][n] for n in ("Q", "K", "V", "dO")),
                                 launch.causal, **host)
    return fn, check
