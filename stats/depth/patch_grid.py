"""The patching grid's summary (pure): per prompt pair, direction, group of positions and depth, how far patching
moves the violating letter's logit difference, over scenarios (readouts/gap/span_patch.py writes the rows).

- `moved`: the mean over scenarios of ld - ld_clean (the patched read's logit difference less the unpatched read's
  of the same prompt), with a percentile bootstrap CI over scenarios.
- `restored`: the share of the pair's difference the patch carries across, a ratio of sums over scenarios,
  sum(ld - ld_clean) / sum(ld_source - ld_clean) (noising: how much of the second prompt's reading its streams at
  that group and depth bring into the first; denoising: the converse), with its CI from the same resamples of
  scenarios. A ratio of sums, so a scenario whose own difference is near 0 does not blow it up; undefined (NaN) when
  the pair's mean difference is 0. For the `filler_swap` control (two prompts without pressure) the difference is
  near 0 by design and `moved` is its figure: what any change of the sentence moves, beside the pressure pair's move.
Each scenario's rows are first averaged over its option orders.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract.names import PATCH_DIRECTIONS, PATCH_GROUPS, PATCH_PAIRS
from stats.core.bootstrap import percentile_ci
from stats.core.figures import colormap, new_figure, save
from stats.depth.names import MIN_MOVE

KEYS = ["pair", "direction", "group", "layer"]
PAIR_TITLES = dict(zip(PATCH_PAIRS, ("pressure prompt and twin", "control: twin and twin with another scenario's filler")))


def summarize(rows: pd.DataFrame, rng: np.random.Generator, n_boot: int = 2000, level: float = 0.95) -> pd.DataFrame:
    """One row per pair, direction, group and layer: n scenarios, `moved` and `restored` with their CIs (module docstring)."""
    per = rows.assign(moved=rows.ld - rows.ld_clean, gap=rows.ld_source - rows.ld_clean)
    per = per.groupby(KEYS + ["scenario_id"], sort=False)[["moved", "gap"]].mean().reset_index()
    out = []
    for key, part in per.groupby(KEYS, sort=False):
        part = part.dropna()
        moved, gap = part.moved.to_numpy(), part.gap.to_numpy()
        n = len(part)
        idx = rng.integers(0, n, size=(n_boot, n)) if n > 1 else None
        m_draws = moved[idx].mean(1) if idx is not None else np.array([])
        with np.errstate(divide="ignore", invalid="ignore"):
            r_draws = moved[idx].sum(1) / gap[idx].sum(1) if idx is not None else np.array([])
            restored = moved.sum() / gap.sum() if n and gap.sum() != 0 else np.nan
        out.append(dict(zip(KEYS, key), n=n, moved=moved.mean() if n else np.nan, moved_ci=percentile_ci(m_draws, level),
                        restored=restored, restored_ci=percentile_ci(r_draws, level)))
    frame = pd.DataFrame(out)
    for name in ("moved", "restored"):
        frame[[f"{name}_low", f"{name}_high"]] = pd.DataFrame(frame.pop(f"{name}_ci").tolist(), index=frame.index)
    return frame


def grid_figure(summary: pd.DataFrame, path):
    """Heatmaps of `moved` (nats) by group (rows) and layer (columns), one per pair (rows of panels) and direction, on
    one colour scale so the control's moves read against the pressure pair's; a dot where `moved`'s 95% CI lies
    outside +-MIN_MOVE."""
    pairs = [p for p in PATCH_PAIRS if p in set(summary.pair)]
    fig, axes = new_figure(10.5, 0.4 + 3.0 * len(pairs), len(PATCH_DIRECTIONS), nrows=len(pairs), layout="constrained")
    layers = sorted(summary.layer.unique())
    scale = max(MIN_MOVE, float(np.nanmax(np.abs(summary.moved.to_numpy()))) if len(summary) else MIN_MOVE)
    image = None
    panels = [(pair, direction) for pair in pairs for direction in PATCH_DIRECTIONS]
    for ax, (pair, direction) in zip(axes, panels):
        d = summary[(summary.pair == pair) & (summary.direction == direction)].set_index(["group", "layer"])
        grid = np.full((len(PATCH_GROUPS), len(layers)), np.nan)
        for i, g in enumerate(PATCH_GROUPS):
            for j, layer in enumerate(layers):
                if (g, layer) in d.index:
                    row = d.loc[(g, layer)]
                    grid[i, j] = row.moved
                    if row.moved_low > MIN_MOVE or row.moved_high < -MIN_MOVE:
                        ax.plot(j, i, "o", color="black", ms=2.5)
        image = ax.imshow(grid, aspect="auto", cmap=colormap("RdBu_r"), vmin=-scale, vmax=scale, interpolation="nearest")
        ax.set_yticks(range(len(PATCH_GROUPS)), PATCH_GROUPS, fontsize=8)
        step = max(1, len(layers) // 8)
        ax.set_xticks(range(0, len(layers), step), [str(x) for x in layers[::step]], fontsize=8)
        ax.set_xlabel("patched layer (0: embeddings)")
        n = int(d.n.max()) if len(d) else 0
        ax.set_title(f"{PAIR_TITLES[pair]}, {direction} ({n} scenarios)", fontsize=8)
    fig.suptitle("mean move of the violating letter's logit difference when a group is patched at a layer", fontsize=9)
    fig.colorbar(image, ax=list(axes), shrink=0.85, label="moved (nats)")
    return save(fig, path)
