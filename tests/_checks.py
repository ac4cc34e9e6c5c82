"""Checks several test files share (imported as ``_checks``: pytest puts tests/ on the path)."""


def assert_count_is_closed_form(p) -> None:
    """The count engine and the closed form beside the algorithm agree exactly."""
    counted, formula = p.count(), p.closed_form()
    assert counted.per_tensor == formula.per_tensor
    assert counted.flops == formula.flops
    assert counted.sram_peak_bytes == formula.sram_peak_bytes


def assert_grid_reaches_the_hard_cases(shapes) -> None:
    """``shapes``: (N, B_r, B_c, causal) of a test grid: at least 50, some with N not a
    multiple of the tiles, some causal."""
    assert len(shapes) >= 50
    assert any(N % Br or N % Bc for N, Br, Bc, _ in shapes)
    assert any(c for *_, c in shapes)


def measured_in_a_process(*args: str) -> tuple[dict, bool]:
    """``flashsim measure --json ARGS`` as a user runs it (its own process, numba's simulator
    off; ``--ncu`` added when ncu is on PATH): the row, checked against the reference and
    timed and predicted, and whether it has Nsight Compute's counters."""
    import json
    import os
    import subprocess
    import sys

    from gpu_kernels import ncu

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    with_ncu = ncu.executable() is not None
    p = subprocess.run([sys.executable, "-m", "flashsim.cli", "measure", "--json", *args]
                       + (["--ncu"] if with_ncu else []), capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(p.stdout)
    assert row["check_ok"] and row["max_error"] <= row["bound"], row
    assert row["measured"]["time_s"] > 0 and row["predicted"]["predicted_time_s"] > 0
    if with_ncu:
        assert row["measured"]["ncu_time_s"] > 0
    return row, with_ncu


def stale_predictions(dataset=None, predictions=None) -> str | None:
    """Why the predictions stored beside ``dataset`` (default: the in-sample sweep) may not
    be what the model computes now, or None. They carry the hash of everything they are a
    pure function of (``validation.inputs``); a test fails with this reason at once rather
    than recomputing every point (minutes of CI), and ``python -m flashsim.measured.validation``
    refreshes them and says how many rows moved."""
    import json

    from flashsim.measured import validation

    dataset = dataset or validation.DATASET
    predictions = predictions or validation.PREDICTIONS
    with open(predictions) as f:
        stored = json.load(f)
    now = validation.inputs(dataset)
    if stored.get("inputs_sha256") == validation.inputs_sha256(dataset, files=now):
        return None
    old = stored.get("inputs", {})
    changed = sorted(k for k in old.keys() | now.keys() if old.get(k) != now.get(k))
    return (f"{predictions.name} is stale: its inputs changed "
            f"({', '.join(changed) or 'hash only'}); run python -m flashsim.measured.validation "
            "(a few minutes; it says how many rows moved) and commit the file")


def numba_compiled(part: str, keys) -> dict:
    """``{key: result}`` of the numba compiles ``keys`` (of ``gpu_kernels.compile``'s
    numba_forward or numba_backward rows: ``part``): from gpu_kernels/compile_cache.json
    when it holds them all, else from ``python -m gpu_kernels.compile --numba PART`` (a
    process without the CUDA simulator, which compiles what the file lacks)."""
    import json
    import os
    import subprocess
    import sys

    from gpu_kernels import compile as cuda_compile

    have = cuda_compile.committed()
    if all(k in have for k in keys):
        return {k: have[k].get("ptx", have[k].get("log")) for k in keys}
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-m", "gpu_kernels.compile", "--numba", part], env=env,
                         cwd=root, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def stale_compiles() -> str | None:
    """Why gpu_kernels/compile_cache.json may not hold every compile CI checks, or None. A
    compile it lacks still runs in its test (minutes where seconds would do); this makes a
    forgotten refresh visible."""
    from gpu_kernels import compile as cuda_compile

    missing, unused, wheels = cuda_compile.stale()
    if not missing and not unused:
        return None
    total = len(cuda_compile.wanted())
    compilers = "; ".join(f"{w} {old} in the file, {now} here" for w, (old, now) in wheels.items())
    return (f"compile_cache.json is stale: {len(missing)} of the {total} compiles CI checks are not "
            f"in it ({'; '.join(missing[:5])}{'; ...' if len(missing) > 5 else ''}) and {unused} of "
            f"its entries no compile asks for{f' ({compilers})' if compilers else ''}; run "
            "python -m gpu_kernels.compile --refresh-cache (it compiles only what is missing) "
            "and commit the file")
