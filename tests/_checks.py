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
