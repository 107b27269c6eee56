"""The figures the jobs draw (training curves, alignment matrices, phrase maps, scatter plots):
matplotlib's Figure drawn by its file-only Agg canvas (no pyplot: no global figure state, and
most of a second less to import), each PNG written atomically."""

from __future__ import annotations

import os


def new_figure(width: float, height: float):
    """(figure, axes) of a new ``width`` x ``height`` inch figure, drawn by the Agg backend (no
    display needed)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    return figure, figure.subplots()


def save_figure(fig, path: str, dpi: int = 100) -> None:
    """Write ``fig`` to ``path`` (PNG) atomically, under a hidden temporary name beside it that
    is renamed into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.png")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
