"""Fixed-width text tables, as the views print them beside their pictures."""

from __future__ import annotations


def text_table(columns, rows) -> str:
    """One header line and a line per row. ``columns``: (title, width, spec, value) each:
    the title and each ``value(row)`` formatted as ``{x:<width><spec>}``, where ``width``
    carries the alignment (``"<28"``, ``">10"``) and ``spec`` the rest (``".2e"``, ``","``)."""
    lines = ["".join(f"{title:{width}}" for title, width, _, _ in columns)]
    lines += ["".join(f"{value(r):{width}{spec}}" for _, width, spec, value in columns)
              for r in rows]
    return "\n".join(lines)
