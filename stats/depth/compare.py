"""`readout compare` on depth runs: the checkpoints' E-by-layer and judge-closure curves overlaid (where in depth
each post-training stage moves the gap), with depth_compare.csv holding every curve."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.ticker import MaxNLocator

from contract.names import PATCH_SOURCES
from contract.tables import DEPTH, DEPTH_ADDED, PATCHING
from stats.core.figures import NULL, colormap, legend_of_drawn, new_figure, save
from stats.core.seeding import rng_for
from stats.core.tables import read_table
from stats.depth.compute import closure_estimates, depth_estimates

COMPARE_FIGURE = "depth_compare.png"
COMPARE_TABLE = "depth_compare.csv"


def run_label(run_dir: Path, roles: dict) -> str:
    """The run's `lineage:stage` from --role, else its manifest's, else the model's name."""
    if str(run_dir) in roles:
        return roles[str(run_dir)]
    try:
        m = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return run_dir.name
    model = m.get("model") or {}
    lineage, stage = model.get("lineage"), model.get("stage")
    return f"{lineage}:{stage}" if lineage and stage else (model.get("name") or run_dir.name)


def depth_curves(run_dirs, roles: dict | None = None, seed: int = 0, n_boot: int = 10_000) -> pd.DataFrame:
    """One row per run x curve (E, closure of the judge patch) x layer: value, 95% CI, n."""
    rows = []
    for path in map(Path, run_dirs):
        label = run_label(path, roles or {})
        est = depth_estimates(read_table(path / DEPTH.file, DEPTH, optional=DEPTH_ADDED), rng_for(seed, "depth", "layers"), n_boot)
        for r in est[est.quantity == "E"].itertuples():
            rows.append(dict(run=label, path=str(path), curve="E", layer=r.layer, value=r.value, low=r.low, high=r.high, n=r.n))
        if (path / PATCHING.file).is_file():
            c = closure_estimates(read_table(path / PATCHING.file, PATCHING), rng_for(seed, "depth", "closure"), n_boot)
            for r in c[c.source == PATCH_SOURCES[0]].itertuples():
                rows.append(dict(run=label, path=str(path), curve="closure", layer=r.layer, value=r.closure, low=r.low,
                                 high=r.high, n=r.n))
    return pd.DataFrame(rows, columns=["run", "path", "curve", "layer", "value", "low", "high", "n"])


def compare_figure(curves: pd.DataFrame, path: Path) -> Path:
    fig, axes = new_figure(10, 3.6, 2)
    runs = list(dict.fromkeys(curves.run))
    cmap = colormap("viridis")
    for ax, curve, title in zip(axes, ("E", "closure"), ("paired excess E by layer", "judge patch closure by layer")):
        for k, run in enumerate(runs):
            d = curves[(curves.run == run) & (curves.curve == curve)].sort_values("layer")
            if len(d):
                colour = cmap(k / max(1, len(runs) - 1) * 0.85)
                ax.plot(d.layer, d.value, color=colour, marker="o", ms=3, label=f"{run} (n={int(d.n.iloc[0])})")
                ax.fill_between(d.layer, d.low, d.high, color=colour, alpha=0.15, lw=0)
        ax.axhline(0, color=NULL, lw=0.8)
        ax.set_title(title + " (logit lens), 95% CI", fontsize=9)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        legend_of_drawn(ax, [ax], fontsize=7, frameon=False)
    return save(fig, path)


def depth_compare(run_dirs, out_dir, roles: dict | None = None, seed: int = 0, n_boot: int = 10_000) -> list[str]:
    """Write depth_compare.csv and depth_compare.png into `out_dir` for runs that hold depth.parquet."""
    runs = [p for p in map(Path, run_dirs) if (p / DEPTH.file).is_file()]
    if not runs:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    curves = depth_curves(runs, roles, seed, n_boot)
    curves.to_csv(out / COMPARE_TABLE, index=False)
    compare_figure(curves, out / COMPARE_FIGURE)
    return [f"depth: {len(runs)} depth runs overlaid: wrote {COMPARE_TABLE}, {COMPARE_FIGURE} to {out}"]
