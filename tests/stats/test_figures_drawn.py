"""Figures say only what they draw: every legend entry is an artist drawn on the figure's axes with that
label, and every labelled artist drawn is in a legend (no proxy marker for a series that is missing, a NaN point,
or an empty scatter); every text placed at a data point (a bar's value, "no CI") lies inside its axes' frame, also
when the data span 0.014 (autoscaling fits the data, not the labels beside them)."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import Container
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

import stats.gap.figures as gap_figures
import stats.nsi.figures as nsi_figures
from stats.core.estimate import Estimate
from stats.gap.analysis import RunAnalysis


def est(quantity, value, low=None, high=None, n=12, analysis="continuous", subset="L0"):
    low = value - 0.002 if low is None else low
    high = value + 0.002 if high is None else high
    return Estimate(analysis=analysis, quantity=quantity, subset=subset, n=n, value=value, low=low, high=high, se=0.001,
                    mde=0.003, method="test")


def analysis(estimates, verdict=None, per_scenario=None):
    """A RunAnalysis holding only the given estimates (the figures read estimates, the verdict and per_scenario)."""
    return RunAnalysis(run=SimpleNamespace(model="m"), floor=0.3, gate=("F1",), seed=0, n_boot=10, screen_rows=(),
                       floors=(), estimates=tuple(estimates), verdict_level=verdict or {"continuous": None, "binary": None},
                       skipped=(), per_scenario=pd.DataFrame() if per_scenario is None else per_scenario)


PATH = object()
"""Where a figure function takes its output path."""


@pytest.fixture()
def drawn(monkeypatch, tmp_path):
    """drawn(module, name, *args): call the figure function with PATH replaced by a file in tmp_path (the real
    save runs: layout and the fitting of texts) and return its Figure."""
    figures = []

    def call(module, name, *args):
        real = module.save
        monkeypatch.setattr(module, "save", lambda fig, path, **kw: figures.append(fig) or real(fig, path, **kw))
        getattr(module, name)(*(tmp_path / f"{name}.png" if x is PATH else x for x in args))
        return figures[-1]

    return call


def _finite(xy) -> bool:
    a = np.ma.filled(np.ma.asarray(xy, dtype=float), np.nan).reshape(-1, 2) if np.size(xy) else np.zeros((0, 2))
    return bool(np.isfinite(a).all(axis=1).any())


def plotted(artist) -> bool:
    """The test's own reading of "drawn": a finite point, a bar of nonzero size."""
    if isinstance(artist, Container):
        return any(plotted(c) for c in artist.get_children())
    if isinstance(artist, Line2D):
        return _finite(artist.get_xydata())
    if isinstance(artist, PathCollection):
        return _finite(artist.get_offsets())
    if isinstance(artist, Rectangle):
        return bool(np.isfinite([artist.get_width(), artist.get_height()]).all() and artist.get_width() and artist.get_height())
    return any(_finite(p.vertices) for p in artist.get_paths()) if hasattr(artist, "get_paths") else True


def labels_drawn(fig) -> set[str]:
    out = set()
    for ax in fig.axes:
        for a in [*ax.lines, *ax.collections, *ax.patches, *ax.containers]:
            label = a.get_label()
            if label and not label.startswith("_") and plotted(a):
                out.add(label)
    return out


def legend_entries(fig) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def texts_outside(fig) -> list[str]:
    """Texts at data points that reach past their axes' frame (by more than a pixel), as 'text (axes title)'."""
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for t in ax.texts:
            if not t.get_text() or getattr(t, "xycoords", "data") != "data":
                continue
            e = t.get_window_extent(renderer)
            if e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1:
                out.append(f"{t.get_text()!r} ({ax.get_title()[:30]})")
    return out


def check(fig):
    entries = legend_entries(fig)
    assert len(entries) == len(set(entries)), entries
    assert set(entries) == labels_drawn(fig), (entries, labels_drawn(fig))
    assert not texts_outside(fig)


def test_strictness_ladder_without_a_verdict_level_lists_no_filled_marker(drawn):
    """Fewer than 40 scenarios at every level: no verdict level, so no filled point, and no legend entry for one."""
    a = analysis([est("E", 0.01 + 0.001 * i, subset=lv) for i, lv in enumerate(("L0", "L1", "L2"))]
                 + [est("binary_excess", 0.2, 0.1, 0.3, analysis="binary", subset=lv) for lv in ("L0", "L1", "L2")])
    fig = drawn(gap_figures, "strictness_ladder", a, PATH)
    check(fig)
    assert legend_entries(fig) == ["other level"]


def test_dose_arm_without_dose_estimates_has_no_legend(drawn):
    fig = drawn(gap_figures, "dose_arm", analysis([]), PATH)
    check(fig)
    assert legend_entries(fig) == []


def test_control_vs_excess_lists_only_what_each_row_has(drawn):
    rows = [{"model": "m", "control": None, "excess": est("E", 0.008), "screened": None, "base": None}]
    fig = drawn(gap_figures, "control_vs_excess", rows, PATH, 0.1)
    check(fig)
    assert set(legend_entries(fig)) == {"excess E, all above floor", "validation bar (0.10, 95% lower bound)"}


def test_checkpoint_sweep_without_base_or_screened_set(drawn):
    stages = [{"stage": "sft", "unscreened": est("E", 0.01)}, {"stage": "final", "unscreened": est("E", 0.02)}]
    fig = drawn(gap_figures, "checkpoint_sweep", "lin", stages, None, est("E", 0.02), PATH, 0.1)
    check(fig)
    assert "base, raw frame (descriptive)" not in legend_entries(fig)


def test_three_cell_and_bridge_list_the_markers_drawn(drawn):
    shared = [est(f"{side} {m}", 0.3 + 0.01 * k, subset="shared with twins") for k, (side, m) in
              enumerate((("p_D", "base"), ("p_J", "base"), ("p_D", "instruct"), ("p_J", "instruct")))]
    fig = drawn(gap_figures, "three_cell", "lin", shared, PATH)  # no twin estimates: no hollow marker in the legend
    check(fig)
    assert not any("twin" in e for e in legend_entries(fig))
    fig = drawn(gap_figures, "bridge", [("m", [est("g (chat)", 0.01), est("E (chat)", 0.004)])], PATH)
    check(fig)
    assert legend_entries(fig) == ["chat template"]


def test_scatter_without_screened_scenarios_lists_no_series(drawn):
    per = pd.DataFrame({"L0": [False, False], "family": ["F1", "F3"], "p_D": [0.2, 0.3], "p_J": [0.1, 0.2],
                        "p_D_twin": [0.1, 0.2], "p_J_twin": [0.1, 0.2]})
    fig = drawn(gap_figures, "scatter", analysis([], per_scenario=per), PATH)
    check(fig)
    assert legend_entries(fig) == ["p_D = p_J"]


def test_labels_over_a_span_of_0_014_stay_inside_the_frame(drawn):
    """One generator row of F4 whose estimates have no CI (n = 1) and span 0.014: each "no CI" label inside its
    panel (it sat above the frame and across its edge), the points inside their row's slot; and the calibration
    ladder's value labels over the same span."""
    sub = "family x generator=F4,team-a"
    ests = [est(q, v, analysis="slices", subset=sub, n=1) for q, v in
            (("binary_gap", 0.016), ("binary_null", 0.002), ("g", 0.016), ("g_twin", 0.002))]
    ests = [dataclasses.replace(e, low=None, high=None) for e in ests]
    fig = drawn(gap_figures, "f4_by_generator", analysis(ests), PATH)
    assert not texts_outside(fig)
    assert all(ax.get_ylim() == (0.5, -0.5) for ax in fig.axes)  # the row's slot, top down
    check(fig)
    a = analysis([est("binary_null", 0.004, analysis="binary"), est("binary_gap", 0.012, analysis="binary"),
                  est("binary_excess", 0.009, 0.005, 0.013, analysis="binary"),
                  est("paraphrase_floor", 0.001), est("g_twin", 0.005), est("g", 0.012, 0.010, 0.014), est("E", 0.007)])
    fig = drawn(gap_figures, "calibration_ladder", a, PATH)
    assert not texts_outside(fig)
    check(fig)


def test_acquiescence_without_parsed_replies_lists_only_the_continuous_point(drawn):
    """A model with no parsed reply (p0, p1 NaN) and its continuous reading: the legend has no 'sampled replies'
    marker, since none is drawn."""
    acq = pd.DataFrame({"model": ["tiny"], "group": [None], "pooled": [False], "p0": [np.nan], "p1": [np.nan],
                        "acquiescence": [np.nan]})
    cont = pd.DataFrame({"model": ["tiny"], "p0": [0.85], "p1": [0.85]})
    fig = drawn(nsi_figures, "acquiescence_figure", acq, PATH, cont)
    check(fig)
    assert "models (sampled replies)" not in legend_entries(fig)


def test_overcount_figure_with_a_stratum_at_rate_one(drawn):
    """Every proxy-endorse row of a framing coded otherwise (k = n): the Wilson upper bound is a rounding error
    below 1, and the figure still draws (it stopped with "'yerr' must not contain negative values")."""
    from stats.nsi.agreement import wilson

    rows = []
    for stratum, k, n in (("F0", 10, 10), ("F1", 0, 7), ("pooled", 10, 17)):
        p = wilson(k, n)
        rows.append({"quantity": "over-count", "stratum": stratum, "k": k, "n": n, "rate": p.p, "ci_low": p.ci_low,
                     "ci_high": p.ci_high})
    assert rows[0]["ci_high"] < rows[0]["rate"]  # the case itself: the bound sits below the rate
    fig = drawn(nsi_figures, "overcount_figure", pd.DataFrame(rows), PATH)
    check(fig)


def test_a_missing_estimate_gets_no_placeholder_bar_and_is_named_under_the_title(drawn):
    """The calibration ladder on a planted table: the binary gap came out NaN (made through make_estimate, as the
    analysis makes it: NaN becomes None) and the known-gap band was not estimated at all. Panel (a) draws exactly
    the two present estimates, at their values, ticked with their names, and its title names the two missing
    ones; panel (b), complete, draws all five and names none."""
    from matplotlib.container import BarContainer

    from stats.core.estimate import make_estimate

    nan_gap = make_estimate("binary", "binary_gap", "L0", 12, float("nan"), float("nan"), float("nan"), None, "test")
    assert nan_gap.value is None
    a = analysis([est("binary_null", 0.04, analysis="binary"), nan_gap,
                  est("binary_excess", 0.09, 0.05, 0.13, analysis="binary"),
                  est("paraphrase_floor", 0.01), est("g_twin", 0.05), est("g", 0.12), est("E", 0.07),
                  est("control_move", 0.3, 0.2, 0.4, analysis="control", subset="control")])
    fig = drawn(gap_figures, "calibration_ladder", a, PATH)
    ax1, ax2 = fig.axes
    for ax, values in ((ax1, [0.04, 0.09]), (ax2, [0.01, 0.05, 0.12, 0.07, 0.3])):
        bars = [r for c in ax.containers if isinstance(c, BarContainer) for r in c]
        assert [round(r.get_height(), 6) for r in bars] == values
        assert [round(r.get_height(), 6) for r in ax.patches if isinstance(r, Rectangle)] == values  # no other bar
        assert len(ax.get_xticks()) == len(values)
    ticks = [t.get_text() for t in ax1.get_xticklabels()]
    assert ticks[0].startswith("matched null") and ticks[1].startswith("paired\nexcess")
    title = ax1.get_title()
    assert title.splitlines()[-1] == "not estimated on this run: gap (measurement), known-gap band"
    assert "not estimated" not in ax2.get_title()
    check(fig)
