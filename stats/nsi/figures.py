"""Figures of the framing-stability audit: the acquiescence scatter (paper Fig. 4), the NSI heatmap (Fig. 5)
and the proxy over-count of the human-coding validation (Fig. 1).

PNG files, drawn by the convention of `stats.core.figures` (Agg canvas, no pyplot).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from contract import NEGATED
from stats.core.figures import colormap, legend_of_drawn, new_figure, save

_UNGROUPED = "(no group)"


def _group_colors(labels) -> dict:
    cmap = colormap("tab10")
    return {g: cmap(i % 10) for i, g in enumerate(dict.fromkeys(labels))}


def _place_labels(ax, points, obstacles=(), fontsize: float = 8.0) -> None:
    """Annotate points without overlaps: try offsets around each point until the text box is free.

    ``obstacles``: extra (x, y, radius in pixels) markers the labels must not cover.
    """
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    taken = []
    for x, y, rad in [(x, y, 5) for x, y, _ in points] + list(obstacles):
        px, py = ax.transData.transform((x, y))
        taken.append((px - rad, py - rad, px + rad, py + rad))
    ax_box = ax.get_window_extent(renderer)
    offsets = [(7, 3), (7, -11), (-7, 3), (-7, -11)]
    for step in range(1, 9):
        offsets += [(14, 3 + 11 * step), (14, -11 - 11 * step), (-14, 3 + 11 * step), (-14, -11 - 11 * step)]
    for x, y, text in sorted(points, key=lambda p: (-p[1], p[0])):
        placed = None
        for dx, dy in offsets:
            ha = "left" if dx > 0 else "right"
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize, ha=ha,
                            color="0.15", zorder=5,
                            arrowprops=None if abs(dy) < 14 else dict(arrowstyle="-", color="0.55", lw=0.5))
            bb = t.get_window_extent(renderer)
            box = (bb.x0, bb.y0, bb.x1, bb.y1)
            inside = bb.x0 >= ax_box.x0 and bb.x1 <= ax_box.x1 and bb.y0 >= ax_box.y0 and bb.y1 <= ax_box.y1
            clash = any(not (box[2] < o[0] or box[0] > o[2] or box[3] < o[1] or box[1] > o[3]) for o in taken)
            if inside and not clash:
                placed = box
                break
            t.remove()
        if placed is None:  # crowded: fall back to the first offset
            t = ax.annotate(text, (x, y), xytext=offsets[0], textcoords="offset points", fontsize=fontsize,
                            color="0.15", zorder=5)
            bb = t.get_window_extent(renderer)
            placed = (bb.x0, bb.y0, bb.x1, bb.y1)
        taken.append(placed)


def acquiescence_figure(acq: pd.DataFrame, path: Path, cont_points: pd.DataFrame | None = None) -> Path:
    """Agree rate on "should X" (p0) against "should not X" (p1) per model, with the anti-diagonal p0 + p1 = 1.

    ``acq``: the acquiescence table (per-model rows and, with groups, pooled rows). ``cont_points``: optional
    per-model p0, p1 from the continuous readout, drawn hollow and joined to the model's sampled point.
    """
    per = acq[~acq["pooled"]].copy()
    per["group"] = per["group"].fillna(_UNGROUPED)
    pooled = acq[acq["pooled"]]
    colors = _group_colors(per["group"])
    fig, (ax,) = new_figure(7.2, 6.6)
    ax.fill_between([0, 1], [1, 0], [0, 0], color="#d9e4f5", alpha=0.45, lw=0)
    ax.fill_between([0, 1], [1, 0], [1, 1], color="#f7e0d0", alpha=0.45, lw=0)
    ax.plot([0, 1], [1, 0], ls="--", color="0.25", lw=1.3, label="coherent: p0 + p1 = 1")
    ax.text(0.03, 0.04, "under-flipping\n(negation-blind)", fontsize=9, color="#2b4a7a", va="bottom")
    ax.text(0.97, 0.96, "over-flipping", fontsize=9, color="#8a4a1f", ha="right", va="top")
    if cont_points is not None and len(cont_points):
        cp = cont_points.set_index("model")
        for r in per.itertuples(index=False):
            if r.model in cp.index:
                x, y = cp.loc[r.model, "p0"], cp.loc[r.model, "p1"]
                ax.plot([r.p0, x], [r.p1, y], color=colors[r.group], lw=0.8, ls=":", zorder=2)
                ax.scatter([x], [y], s=46, facecolors="white", edgecolors=[colors[r.group]], linewidths=1.4, zorder=3,
                           label="continuous readout (p_agree)")
    for g, sub in per.groupby("group", sort=False):
        ax.scatter(sub["p0"], sub["p1"], s=58, color=colors[g], edgecolors="white", linewidths=0.8, zorder=4,
                   label=f"{g}" if g != _UNGROUPED else "models (sampled replies)")
    for r in pooled.itertuples(index=False):
        ax.scatter([r.p0], [r.p1], marker="D", s=140, color=colors.get(r.group, "0.3"), edgecolors="black",
                   linewidths=1.0, alpha=0.75, zorder=3.5, label=f"{r.group} pooled: p0+p1-1 = {r.acquiescence:+.2f}")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    obstacles = [(r.p0, r.p1, 10) for r in pooled.itertuples(index=False)]
    labels = [(r.p0, r.p1, f"{r.model} ({r.acquiescence:+.2f})") for r in per.itertuples(index=False)
              if np.isfinite(r.p0) and np.isfinite(r.p1)]
    if cont_points is not None and len(cont_points):
        has_binary = {r.model for r in per.itertuples(index=False) if np.isfinite(r.p0) and np.isfinite(r.p1)}
        for r in cont_points.itertuples(index=False):
            if r.model in has_binary:
                obstacles.append((r.p0, r.p1, 5))
            else:  # no parsed replies: the continuous point is all there is
                labels.append((r.p0, r.p1, f"{r.model} (continuous only, {r.p0 + r.p1 - 1:+.2f})"))
    _place_labels(ax, labels, obstacles)
    ax.set_aspect("equal")
    ax.set_xlabel('p0: agree rate on "They should X" (F0)')
    ax.set_ylabel('p1: agree rate on "They should not X" (F1)')
    ax.set_title("Acquiescence: p0 + p1 - 1 (0 = coherent)", fontsize=11)
    ax.grid(alpha=0.3, lw=0.6)
    legend_of_drawn(ax, [ax], loc="upper left", fontsize=8, framealpha=0.9)
    return save(fig, path)


def _heat_panel(ax, grid: pd.DataFrame, tiers: pd.DataFrame, title: str):
    data = grid.to_numpy(dtype=float)
    ax.set_facecolor("0.88")  # NaN cells are transparent: undefined NSI shows grey
    im = ax.imshow(data, cmap="RdYlGn_r", vmin=0.0, vmax=1.0, aspect="auto")
    n_r, n_c = grid.shape
    for i in range(n_r):
        for j in range(n_c):
            v = grid.iat[i, j]
            if np.isfinite(v):
                t = tiers.iat[i, j]
                ax.text(j, i, f"{v:.2f}" + (f"\n{t}" if isinstance(t, str) else ""), ha="center", va="center",
                        fontsize=8, color="white" if (v > 0.78 or v < 0.12) else "black")
            else:
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=7.5, color="0.35")
    ax.set_xticks(range(n_c), [d.capitalize() for d in grid.columns], fontsize=9, rotation=30, ha="right")
    ax.set_title(title, fontsize=9.5)
    return im


def heatmap_figure(model_domain: pd.DataFrame, models_tab: pd.DataFrame, path: Path,
                   continuous: pd.DataFrame | None = None) -> Path:
    """NSI by model (rows, grouped, most sensitive first) x domain (columns, most sensitive first).

    One panel from the sampled replies (the paper's Fig. 5); with ``continuous`` (the continuous model x
    domain table) a second panel with the same NSI on p_endorse. Cells with no defined NSI read "n/a".
    """
    grid = model_domain.pivot(index="model", columns="domain", values="nsi")
    tiers = model_domain.pivot(index="model", columns="domain", values="tier")
    means = grid.mean(axis=0)
    if continuous is not None:
        cgrid = continuous.pivot(index="model", columns="domain", values="nsi").reindex(index=grid.index, columns=grid.columns)
        ctiers = pd.DataFrame(None, index=grid.index, columns=grid.columns)  # the continuous NSI is not tiered
        means = means.fillna(cgrid.mean(axis=0))
    dom_order = means.sort_values(ascending=False, na_position="last").index.tolist()
    info = models_tab.set_index("model")
    group = info["group"].fillna(_UNGROUPED) if "group" in info else pd.Series(_UNGROUPED, index=info.index)
    order = models_tab.sort_values("nsi", ascending=False, na_position="last")["model"].tolist()
    rows = [m for g in dict.fromkeys(group.loc[order]) for m in order if group.get(m) == g]
    panels = [(grid.loc[rows, dom_order], tiers.loc[rows, dom_order], "sampled replies (binary proxy)")]
    if continuous is not None:
        panels.append((cgrid.loc[rows, dom_order], ctiers.loc[rows, dom_order], "continuous readout (p_endorse)"))
    n_r, n_c = len(rows), len(dom_order)
    width = max(4.5, 0.8 * n_c + 1.2) * len(panels) + 2.4
    fig, axes = new_figure(width, max(3.0, 0.48 * n_r + 2.2), len(panels), layout="constrained", sharey=True)
    for ax, (g, t, title) in zip(axes, panels):
        im = _heat_panel(ax, g, t, title)
        prev = None
        for i, m in enumerate(rows):
            if prev is not None and group[m] != prev:
                ax.axhline(i - 0.5, color="black", lw=1.6)
            prev = group[m]
    labels = [f"{m}  [{group[m]}]" if group[m] != _UNGROUPED else m for m in rows]
    axes[0].set_yticks(range(n_r), labels, fontsize=8.5)
    cb = fig.colorbar(im, ax=axes, fraction=0.035 if len(panels) > 1 else 0.04, pad=0.01)
    cb.set_label("NSI (0 robust, 1 fragile)")
    fig.suptitle("Negation Sensitivity Index by model and domain (cell: NSI over F0-F3; binary panel: Table 7 tier)", fontsize=10.5)
    return save(fig, path)


def overcount_figure(over: pd.DataFrame, path: Path) -> Path:
    """Proxy over-count per framing with Wilson whiskers and the pooled rate (paper Fig. 1)."""
    oc = over[over["quantity"] == "over-count"]
    per = oc[oc["stratum"] != "pooled"]
    pooled = oc[oc["stratum"] == "pooled"].iloc[0]
    fig, (ax,) = new_figure(6.2, 4.2)
    x = np.arange(len(per))
    rate = per["rate"].to_numpy(dtype=float)
    has = per["n"].to_numpy() > 0
    # clipped at 0: at a rate of 0 (or 1) the Wilson bound can sit a rounding error past the rate
    err = np.clip(np.vstack([rate - per["ci_low"].to_numpy(dtype=float), per["ci_high"].to_numpy(dtype=float) - rate]), 0, None)
    colors = ["#c0504d" if NEGATED.get(f) else "#4f81bd" for f in per["stratum"]]
    ax.bar(x[has], rate[has], color=[c for c, h in zip(colors, has) if h], width=0.6, alpha=0.85)
    ax.errorbar(x[has], rate[has], yerr=err[:, has], fmt="none", ecolor="black", capsize=4, lw=1)
    for xi, r, h in zip(x, per.itertuples(index=False), has):
        label = f"{r.rate:.0%}\n({r.k}/{r.n})" if h else "no rows"
        ax.text(xi, (r.ci_high if h else 0) + 0.03, label, ha="center", va="bottom", fontsize=8)
    if pooled["n"] > 0:
        ax.axhline(pooled["rate"], ls="--", color="0.3", lw=1,
                   label=f"pooled {pooled['rate']:.1%} [{pooled['ci_low']:.1%}, {pooled['ci_high']:.1%}]")
        legend_of_drawn(ax, [ax], loc="upper left", fontsize=8)
    ax.set_xticks(x, per["stratum"])
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("P(gold != SUPPORTS_X | proxy endorse)")
    ax.set_title("Binary proxy over-count of genuine endorsement (Wilson 95% CIs)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)


def composition_figure(comp: pd.DataFrame, path: Path) -> Path:
    """Gold class composition of proxy-endorse rows per framing and pooled, stacked horizontal bars (paper Fig. 2).

    ``comp``: the gold_composition table (column ``framing`` with a ``pooled`` row, one column per gold class).
    """
    classes = [c for c in comp.columns if c != "framing"]
    cmap = colormap("tab10")
    fig, (ax,) = new_figure(7.2, 0.55 * len(comp) + 1.8)
    rows = comp.set_index("framing")
    left = np.zeros(len(rows))
    y = np.arange(len(rows))[::-1]
    for i, c in enumerate(classes):
        vals = rows[c].to_numpy(dtype=float)
        ax.barh(y, vals, left=left, color=cmap(i % 10), label=c, height=0.6)
        for yi, lft, v in zip(y, left, vals):
            if v > 0:
                ax.text(lft + v / 2, yi, f"{int(v)}", ha="center", va="center", fontsize=7.5, color="white")
        left += vals
    ax.set_yticks(y, list(rows.index))
    ax.set_xlabel("proxy-endorse rows")
    ax.set_title("Gold class of rows the binary proxy labels 'endorse'", fontsize=10)
    legend_of_drawn(ax, [ax], loc="lower right", fontsize=7.5, framealpha=0.9)
    ax.grid(axis="x", alpha=0.3)
    return save(fig, path)


def agreement_figure(agr: pd.DataFrame, path: Path) -> Path:
    """Inter-model agreement by framing with its 95% CI, affirmative green and negated red (paper Fig. 3)."""
    fig, (ax,) = new_figure(5.6, 4.0)
    x = np.arange(len(agr))
    val = agr["agreement"].to_numpy(dtype=float)
    lo, hi = agr["ci_low"].to_numpy(dtype=float), agr["ci_high"].to_numpy(dtype=float)
    colors = ["#c0504d" if n else "#4f9a4f" for n in agr["negated"]]
    ax.bar(x, val, color=colors, width=0.6)
    err = np.clip(np.vstack([val - lo, hi - val]), 0, None)  # a bound a rounding error past the value
    ok = np.isfinite(err).all(axis=0)
    ax.errorbar(x[ok], val[ok], yerr=err[:, ok], fmt="none", ecolor="black", capsize=4, lw=1)
    for xi, v in zip(x, val):
        if np.isfinite(v):
            ax.text(xi, v + 0.02, f"{v:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, agr["framing"])
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("pairwise agreement (same label)")
    ax.set_title("Inter-model agreement by framing", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)
