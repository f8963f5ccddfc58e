"""The one figure convention of both papers: matplotlib's object API on an Agg canvas, PNG files.

No pyplot: a figure is a `Figure` with its own `FigureCanvasAgg`, so nothing touches matplotlib's global
state (no backend switch at import, no figure manager to close). Also the shared palette and resolution.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 130
NULL = "#8c8c8c"
MEASURE = "#4b3fa0"  # indigo
EXCESS = "#1f1a5c"
BAND = "#c0392b"
FLOOR = "#c9c9c9"


def new_figure(width: float, height: float, ncols: int = 1, *, layout: str | None = None, **subplot_kw):
    """A figure of `width` x `height` inches with one row of `ncols` axes: (figure, list of axes)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False, **subplot_kw)[0]
    return fig, list(axes)


def save(fig: Figure, path: Path, rect=(0, 0, 1, 1)) -> Path:
    """Fit the labels (one tight_layout pass, unless the figure has its own layout engine) and write a PNG."""
    # One tight_layout pass fits the labels; constrained layout looks the same here and costs twice as
    # much, which adds up over six figures per run.
    if fig.get_layout_engine() is None:
        fig.tight_layout(rect=rect)
    fig.savefig(path, pil_kwargs={"compress_level": 1})  # light compression: encoding was a tenth of the time
    return Path(path)


def colormap(name: str):
    """A registered matplotlib colormap by name (what pyplot's get_cmap returns)."""
    return matplotlib.colormaps[name]
