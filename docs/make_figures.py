"""Draws the pictures the README shows, with the same flashsim.views.pictures classes the
notebooks' panels use.

    python docs/make_figures.py         # writes docs/img/sram_slider.png

The SRAM-slider picture is notebook 04's first panel at its opening values (N = 4096,
d = 64, fp16, M = 100 KiB).
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")

from flashsim.views import pictures, widgets  # noqa: E402

IMG = pathlib.Path(__file__).resolve().parent / "img"


def main() -> None:
    IMG.mkdir(exist_ok=True)
    view = widgets.sram_view(seq_len=4096, head_dim=64, dtype="fp16", sram=100 * 1024)
    fig = pictures.draw(pictures.SramPicture, view, figsize=(9.0, 4.6), dpi=100)
    path = IMG / "sram_slider.png"
    fig.savefig(path, dpi=100, metadata={"Software": None})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
