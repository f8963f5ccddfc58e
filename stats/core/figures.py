"""The one figure convention of both papers: matplotlib's object API on an Agg canvas, PNG files.

No pyplot: a figure is a `Figure` with its own `FigureCanvasAgg`, so nothing touches matplotlib's global
state (no backend switch at import, no figure manager to close). Also the shared palette and resolution.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import Collection, PathCollection
from matplotlib.container import Container, ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

DPI = 130
NULL = "#8c8c8c"
MEASURE = "#4b3fa0"  # indigo
EXCESS = "#1f1a5c"
BAND = "#c0392b"
FLOOR = "#c9c9c9"


def new_figure(width: float, height: float, ncols: int = 1, *, nrows: int = 1, layout: str | None = None, **subplot_kw):
    """A figure of `width` x `height` inches with `nrows` rows of `ncols` axes: (figure, list of axes, row by row)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, list(axes.ravel())


def save(fig: Figure, path: Path, rect=(0, 0, 1, 1)) -> Path:
    """Fit the labels (one tight_layout pass, unless the figure has its own layout engine) and write a PNG."""
    # One tight_layout pass fits the labels; constrained layout looks the same here and costs twice as
    # much, which adds up over six figures per run.
    if fig.get_layout_engine() is None:
        fig.tight_layout(rect=rect)
    else:
        fig.get_layout_engine().execute(fig)
    fit_texts(fig)
    fig.savefig(path, pil_kwargs={"compress_level": 1})  # light compression: encoding was a tenth of the time
    return Path(path)


PAD = 3.0
"""Pixels kept between a text placed in data coordinates and its axes' frame."""


def fit_texts(fig: Figure) -> None:
    """Widen the limits of each linear axis so that every text placed at a data point (a bar's value, "no CI")
    lies inside its axes' frame: autoscaling fits the data, not the labels drawn beside them, so a label at the
    highest point sat above the frame. The axes keep their place; only the scale changes (text layout only,
    no draw)."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        texts = [t for t in ax.texts if t.get_visible() and t.get_text() and _in_data(t, ax)]
        box = ax.get_window_extent(renderer)
        for axis, lo_px, hi_px in (("x", box.x0, box.x1), ("y", box.y0, box.y1)):
            if not texts or getattr(ax, f"get_{axis}scale")() != "linear":
                continue
            for _ in range(2):  # widening one end rescales the other: a second pass settles it
                if not _widen(ax, axis, texts, lo_px, hi_px, renderer):
                    break


def _widen(ax, axis: str, texts, lo_px: float, hi_px: float, renderer) -> bool:
    """One pass of fit_texts on one axis: (a, b) are the limits at the near and far edge (b < a when inverted)."""
    a, b = getattr(ax, f"get_{axis}lim")()
    size = hi_px - lo_px
    if size <= 2 * PAD or a == b:
        return False
    new_a, new_b = a, b
    for t in texts:
        anchor = _anchor(t, axis)
        share = (anchor - a) / (b - a)
        if not 0 <= share <= 1:
            continue
        ext = t.get_window_extent(renderer)
        t0, t1 = (ext.x0, ext.x1) if axis == "x" else (ext.y0, ext.y1)
        at = lo_px + share * size
        beyond, before = t1 - at, at - t0  # the text's reach past its anchor toward each edge, in pixels
        if t1 > hi_px - PAD and size - PAD - beyond > 0:  # past the far edge: move the far limit out
            far = a + (anchor - a) * size / (size - PAD - beyond)
            new_b = far if abs(far - a) > abs(new_b - a) else new_b
        if t0 < lo_px + PAD and size - PAD - before > 0:  # before the near edge: move the near limit out
            near = b - (b - anchor) * size / (size - PAD - before)
            new_a = near if abs(b - near) > abs(b - new_a) else new_a
    if (new_a, new_b) == (a, b):
        return False
    getattr(ax, f"set_{axis}lim")(new_a, new_b)
    return True


def _in_data(t, ax) -> bool:
    """Whether a text's position is a data point of `ax` (an annotation's xy, or a text in data coordinates)."""
    coords = getattr(t, "xycoords", None)
    return coords == "data" if coords is not None else t.get_transform() == ax.transData


def _anchor(t, axis: str) -> float:
    x, y = t.xy if hasattr(t, "xy") else t.get_position()
    return float(x if axis == "x" else y)


def drawn(artist) -> bool:
    """Whether an artist puts something on the canvas: a line or marker with a finite point, a bar of nonzero
    size, a collection with a finite offset or vertex (a NaN point, an empty scatter, a zero bar draw nothing)."""
    if isinstance(artist, Container):  # errorbar, bar: drawn if any part is
        return any(drawn(a) for a in artist.get_children())
    if not artist.get_visible():
        return False
    if isinstance(artist, Line2D):
        x, y = (np.asarray(v, dtype=float) for v in artist.get_data())
        return bool((np.isfinite(x) & np.isfinite(y)).any()) if x.size and y.size else False
    if isinstance(artist, Rectangle):
        return bool(np.isfinite([artist.get_width(), artist.get_height()]).all() and artist.get_width() * artist.get_height())
    if isinstance(artist, PathCollection):  # a scatter: its points are the offsets (the paths are the marker)
        offsets = np.ma.filled(np.ma.asarray(artist.get_offsets(), dtype=float), np.nan)
        return bool(offsets.size and np.isfinite(offsets).all(axis=-1).any())
    if isinstance(artist, Collection):  # fill_between, error bar lines: the paths are the data
        return any(np.isfinite(path.vertices).all(axis=-1).any() for path in artist.get_paths() if len(path.vertices))
    return True


def legend_of_drawn(target, axes, **kwargs):
    """A legend on `target` (an axes or the figure) of the labelled artists drawn on `axes`, each label once in the
    order drawn: what is not plotted (a missing estimate, a NaN point) gets no entry, and no proxy handles are
    made up. None (and no legend) when nothing labelled was drawn."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if drawn(handle):  # an error bar's entry is its marker, as the points are read
                entries.setdefault(label, handle[0] if isinstance(handle, ErrorbarContainer) and handle[0] else handle)
    return target.legend(list(entries.values()), list(entries), **kwargs) if entries else None


def colormap(name: str):
    """A registered matplotlib colormap by name (what pyplot's get_cmap returns)."""
    return matplotlib.colormaps[name]
