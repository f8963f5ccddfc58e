"""`readout stats` on a depth run: depth_layers.csv/.md, depth_departure.md, depth_closure.csv/.md,
depth_patch_grid.csv/.md, depth_lens_kl.csv/.md, and the figures depth_excess.png (E by layer with its band, per
lens; p_D and p_J0 beside it), depth_closure.png, depth_patch_grid.png (the patching grid's heatmaps) and
depth_lens_kl.png (each lens's KL to the final layer by layer)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.ticker import MaxNLocator

from contract.names import LENSES, PATCH_PAIRS, PATCH_SOURCES
from contract.tables import DEPTH, DEPTH_ADDED, PATCH_GRID, PATCHING
from stats.core.figures import BAND, MEASURE, NULL, legend_of_drawn, new_figure, save
from stats.core.output import md_section, write_table
from stats.core.seeding import rng_for
from stats.core.tables import read_table
from stats.depth.compute import (
    Departure,
    DepartureRule,
    band_excludes_zero,
    band_unbounded,
    closure_estimates,
    departure,
    depth_estimates,
    lens_kl,
    lenses_read,
    paired_columns,
    readability,
)
from stats.depth.names import DEPTH_FIGURES, DEPTH_MARKDOWN, DEPTH_OUTPUTS
from stats.depth.patch_grid import grid_figure, summarize

DEFINITIONS = (
    "E(l): the paired excess (p_D - p_J0) primary - twin at layer l, each read through the logit lens (final norm, "
    "then the head in fp32), on scenarios read in both cells; the departure layer is the first layer from which E's 95% "
    "CI excludes 0 at every later layer; the simultaneous band covers the whole curve at once with about 95% "
    "probability (the claim that E is 0 at every layer of a range is read from it, not from the per-layer CIs); a "
    "tuned lens (engine/tuned_lens.py) reads the same streams through a trained affine translator per layer first. "
    "The departure rule has a minimum effect size (the CIs must lie outside +-bound, bound = max(delta, final_share x "
    "|E at the last layer|)) and counts readable layers only: where the lens puts at least the set letter mass on the "
    "letters (and, where set, its KL to the final layer is below the bound); E at an unreadable layer says the lens "
    "cannot read the letters there, not that there is no gap (`readable` in depth_layers.csv; grey in the figure). "
    "KL: the lens's full-vocabulary distribution at l from the model's own (nats). "
    "Closure: the share of p_D - p_J0 (the judge patch's own gap, same orders) that "
    "replacing the agent's read-position residual after layer l closes, a ratio of means over scenarios. "
    "Definitions: docs/depth.md (this project's extension; neither paper reads below the last layer).")
SOURCE_COLOURS = dict(zip(PATCH_SOURCES, (MEASURE, BAND, NULL, NULL)))
SOURCE_LINES = dict(zip(PATCH_SOURCES, ("-", "-", "-", "--")))
"""The two foreign controls share the null's grey; the agent-frame one is dashed."""
LENS_COLOURS = dict(zip(LENSES, (MEASURE, BAND)))


def is_depth_run(run_dir) -> bool:
    return (Path(run_dir) / DEPTH.file).is_file()


def analyze_depth(run_dir, seed: int = 0, n_boot: int = 10_000, n_outer: int = 1000, n_inner: int = 400,
                  rule: DepartureRule | None = None):
    """(per-layer estimates of every lens read (a `lens` column, each layer's mean letter mass, KL and whether it is
    readable), departure per lens, closure estimates, lens KL) of a run directory holding depth.parquet."""
    rule = rule or DepartureRule()
    run_dir = Path(run_dir)
    depth = read_table(run_dir / DEPTH.file, DEPTH, optional=DEPTH_ADDED)
    parts, deps = [], {}
    for lens in lenses_read(depth):
        named = () if lens == LENSES[0] else (lens,)  # the logit lens keeps the streams it had before tuned lenses
        layers = depth_estimates(depth, rng_for(seed, "depth", "layers", *named), n_boot, lens)
        ids_layers, ids, values = paired_columns(depth, lens)
        read = readability(depth[depth.scenario_id.isin(ids)], rule, lens).set_index("layer")
        mask = read.readable.reindex(ids_layers).fillna(False).to_numpy(bool)
        deps[lens] = departure(values[:, 3, :], ids_layers, layers, rng_for(seed, "depth", "departure", *named), n_outer,
                               n_inner, rule=rule, readable=mask)
        layers = layers.join(read[["letter_mass", "kl_final", "readable"]], on="layer")
        parts.append(layers.assign(lens=lens))
    layers = pd.concat(parts, ignore_index=True) if parts else depth_estimates(depth.iloc[:0], None, n_boot).assign(lens=[])
    layers = layers[["lens", *[c for c in layers.columns if c != "lens"]]]
    patch_path = run_dir / PATCHING.file
    patching = read_table(patch_path, PATCHING) if patch_path.is_file() else None
    closure = closure_estimates(patching, rng_for(seed, "depth", "closure"), n_boot) if patching is not None and len(patching) else None
    return layers, deps, closure, lens_kl(depth)


def departure_text(dep: Departure) -> str:
    if dep.layer is None:
        where = f"no departure: E's 95% CI is not outside +-{dep.bound:g} at the last layer"
    else:
        where = f"departure layer {dep.layer} (E's 95% CI outside +-{dep.bound:g} there and at every later readable layer)"
    if dep.n_outer:
        hi = "none" if math.isinf(dep.high) else f"{dep.high:g}"
        where += (f"; bootstrap CI [{dep.low:g}, {hi}] ({dep.n_outer} outer x {dep.n_inner} inner resamples, "
                  f"{dep.p_none:.1%} of them without a departure)")
    if dep.unreadable:
        where += f"; unreadable (skipped): {layer_ranges(dep.unreadable)}"
    return where


def layer_ranges(layers) -> str:
    """`1-22, 25` for layers 1..22 and 25."""
    out, xs = [], sorted(int(x) for x in layers)
    for x in xs:
        if out and x == out[-1][1] + 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def band_text(excluded: list[int], unbounded: list[int] = ()) -> str:
    def layers(xs):
        return f"layer{'s' if len(xs) > 1 else ''} " + ", ".join(str(x) for x in xs)

    if excluded:
        text = f"E's 95% simultaneous band over the layers excludes 0 at {layers(excluded)}"
    else:
        text = "E's 95% simultaneous band over the layers covers 0 at every layer (no layer's E is distinguishable from 0)"
    if unbounded:
        text += (f"; it is unbounded at {layers(unbounded)} (too many scenarios share one value there for the studentized "
                 "bootstrap), where covering 0 says nothing")
    return text


def excess_figure(layers: pd.DataFrame, deps: dict, path: Path) -> Path:
    fig, (ax_e, ax_p) = new_figure(9.5, 3.6, 2)
    lenses = [x for x in LENSES if x in set(layers.lens)]
    curves = [(ax_e, "E", lens, LENS_COLOURS[lens], "E" + ("" if lenses == [LENSES[0]] else f" ({lens} lens)")) for lens in lenses]
    curves += [(ax_p, name, LENSES[0], colour, name) for name, colour in zip(("p_D", "p_J0"), (MEASURE, BAND))]
    for ax, name, lens, colour, label in curves:
        d = layers[(layers.quantity == name) & (layers.lens == lens)].sort_values("layer")
        ax.plot(d.layer, d.value, color=colour, marker="o", ms=3, label=label)
        ax.fill_between(d.layer, d.low, d.high, color=colour, alpha=0.2, lw=0)
        if ax is ax_e and "band_low" in d and d.band_low.notna().any():
            # An unbounded layer (stats.depth.compute.band_unbounded) is left as a gap in the dotted lines.
            low, high = (d[c].where(d[c].abs() < math.inf) for c in ("band_low", "band_high"))
            ax.plot(d.layer, low, color=colour, ls=":", lw=1, label=f"{label}: simultaneous band")
            ax.plot(d.layer, high, color=colour, ls=":", lw=1)
    for ax in (ax_e, ax_p):
        ax.set_xlabel("layer (0: embeddings; logit lens)" if ax is ax_p or len(lenses) == 1 else "layer (0: embeddings)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_e.axhline(0, color=NULL, lw=0.8)
    logit = layers[(layers.lens == LENSES[0]) & (layers.quantity == "E")]
    if "readable" in logit:
        for k, x in enumerate(sorted(int(v) for v in logit[~logit.readable.astype(bool)].layer)):
            ax_e.axvspan(x - 0.5, x + 0.5, color=NULL, alpha=0.15, lw=0, label="unreadable (logit lens)" if k == 0 else None)
    dep = deps.get(LENSES[0])
    if dep is not None and dep.layer is not None:
        ax_e.axvline(dep.layer, color=NULL if len(lenses) > 1 else BAND, ls="--", lw=1,
                     label=f"departure ({dep.layer}" + (", logit lens)" if len(lenses) > 1 else ")"))
    n = int(layers.n.iloc[0]) if len(layers) else 0
    ax_e.set_title(f"paired excess E by layer, 95% CI and simultaneous band ({n} scenarios)", fontsize=9)
    ax_e.set_ylabel("E = (p_D - p_J0) primary - twin")
    ax_p.set_title("primary cell: p_D and p_J0 by layer", fontsize=9)
    ax_p.set_ylabel("violating mass (normalized)")
    ax_p.set_ylim(-0.02, 1.02)
    for ax in (ax_e, ax_p):
        legend_of_drawn(ax, [ax], fontsize=7, frameon=False)
    return save(fig, path)


def lens_kl_figure(kl: pd.DataFrame, path: Path) -> Path:
    fig, (ax,) = new_figure(5.5, 3.6)
    for lens in (x for x in LENSES if x in set(kl.lens)):
        d = kl[(kl.lens == lens) & (kl.layer < kl.layer.max())].sort_values("layer")  # the last layer's KL is 0
        ax.plot(d.layer, d["mean"], color=LENS_COLOURS[lens], marker="o", ms=3, label=f"{lens} lens, mean")
        ax.plot(d.layer, d.p90, color=LENS_COLOURS[lens], ls=":", lw=1, label=f"{lens} lens, 90th percentile")
    ax.set_yscale("log")
    n = int(kl.n.iloc[0]) if len(kl) else 0
    ax.set_title(f"KL(final || lens) at the read positions ({n} reads)", fontsize=9)
    ax.set_xlabel("layer (0: embeddings)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("nats")
    legend_of_drawn(ax, [ax], fontsize=7, frameon=False)
    return save(fig, path)


def closure_figure(closure: pd.DataFrame, path: Path) -> Path:
    fig, (ax,) = new_figure(5.5, 3.6)
    for source in PATCH_SOURCES:
        d = closure[closure.source == source].sort_values("layer")
        if len(d):
            colour = SOURCE_COLOURS[source]
            ax.plot(d.layer, d.closure, color=colour, ls=SOURCE_LINES[source], marker="o", ms=3, label=f"{source} (n={int(d.n.iloc[0])})")
            ax.fill_between(d.layer, d.low, d.high, color=colour, alpha=0.2, lw=0)
    for y in (0.0, 1.0):
        ax.axhline(y, color=NULL, lw=0.8, ls=":" if y else "-")
    gap = closure.gap.iloc[0] if len(closure) else float("nan")
    ax.set_title(f"share of p_D - p_J0 (mean {gap:.3f}) closed by the patch", fontsize=9)
    ax.set_xlabel("patched layer (agent read position)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("closure")
    legend_of_drawn(ax, [ax], fontsize=7, frameon=False)
    return save(fig, path)


def write_grid(grid: pd.DataFrame, out: Path, seed: int, n_boot: int, written: list) -> pd.DataFrame:
    """The patching grid's summary (stats.depth.patch_grid) as depth_patch_grid.csv/.md and its heatmap."""
    summary = summarize(grid, rng_for(seed, "depth", "patch_grid"), min(n_boot, 2000))
    write_table(summary, out, "depth_patch_grid", "Patching grid: logit difference moved and share restored")
    grid_figure(summary, out / DEPTH_FIGURES[3])
    written += ["depth_patch_grid.csv", DEPTH_FIGURES[3]]
    return summary


def grid_lines(summary: pd.DataFrame) -> list[str]:
    """Per direction and group below the last layer: where the pressure pair's patch restores the most, with its CI
    and its move, and the control pair's (PATCH_PAIRS) largest move at any of those layers."""
    lines = []
    below = summary[summary.layer < summary.layer.max()]
    pressure, control = (below[below.pair == p] for p in PATCH_PAIRS)
    for (direction, group), d in pressure.groupby(["direction", "group"], sort=False):
        if not d.restored.notna().any():
            continue
        top = d.loc[d.restored.idxmax()]
        line = (f"depth: patching grid, {direction} {group}: at most {top.restored:.3f} [{top.restored_low:.3f}, "
                f"{top.restored_high:.3f}] of the logit difference restored, at layer {int(top.layer)} (moved "
                f"{top.moved:+.3f} [{top.moved_low:+.3f}, {top.moved_high:+.3f}] nats, n={int(top.n)})")
        c = control[(control.direction == direction) & (control.group == group)]
        if len(c):
            big = c.loc[c.moved.abs().idxmax()]
            line += (f"; the filler swap moves at most {big.moved:+.3f} [{big.moved_low:+.3f}, {big.moved_high:+.3f}] "
                     f"nats (layer {int(big.layer)}, n={int(big.n)})")
        lines.append(line)
    return lines


def uneven_sources(closure: pd.DataFrame) -> list[str]:
    """A line when the two foreign controls (one partner each) rest on different scenarios: a run resumed across the
    change that added `foreign_agent` has its rows in the newer chunks only."""
    n = closure.groupby("source").n.max()
    judge_side, agent_side = PATCH_SOURCES[2], PATCH_SOURCES[3]
    if judge_side in n and n.get(agent_side, 0) != n[judge_side]:
        return [f"depth: warning: {agent_side} rests on {int(n.get(agent_side, 0))} scenarios and {judge_side} on "
                f"{int(n[judge_side])} (chunks computed before {agent_side} existed have no such rows)"]
    return []


def run_depth_report(run_dir, out_dir=None, seed: int = 0, n_boot: int = 10_000, rule: DepartureRule | None = None) -> list[str]:
    """Write the depth tables and figures of one run into `out_dir` (default RUN_DIR/stats); the summary lines."""
    layers, deps, closure, kl = analyze_depth(run_dir, seed, n_boot, rule=rule)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "stats"
    out.mkdir(parents=True, exist_ok=True)
    for name in DEPTH_OUTPUTS:
        (out / name).unlink(missing_ok=True)
    written = []
    lenses = ", ".join(f"{x} lens" for x in deps) or "logit lens"
    write_table(layers, out, "depth_layers", f"Through depth: p_D, p_J0, g (primary) and E by layer ({lenses})")
    written.append("depth_layers.csv")
    lines = []
    for lens, dep in deps.items():
        name = "depth" + ("" if lens == LENSES[0] else f" ({lens} lens)")
        own = layers[layers.lens == lens]
        lines += [f"{name}: {departure_text(dep)}", f"{name}: {band_text(band_excludes_zero(own), band_unbounded(own))}"]
    if not deps:
        lines.append(f"depth: {departure_text(Departure(None, float('nan'), float('nan'), float('nan'), 0, 0))}")
    if len(layers):
        excess_figure(layers, deps, out / DEPTH_FIGURES[0])
        written.append(DEPTH_FIGURES[0])
    if closure is not None and len(closure):
        write_table(closure, out, "depth_closure", "Patch closure by layer and source")
        closure_figure(closure, out / DEPTH_FIGURES[1])
        written += ["depth_closure.csv", DEPTH_FIGURES[1]]
        lines += uneven_sources(closure)
        # At the last layer the judge patch is the judge's own read (closure 1 by construction): left out here.
        best = closure[(closure.source == PATCH_SOURCES[0]) & (closure.layer < closure.layer.max())]
        if len(best):
            top = best.loc[best.closure.idxmax()]
            lines.append(f"depth: below the last layer the judge patch closes at most {top.closure:.3f} "
                         f"[{top.low:.3f}, {top.high:.3f}] of p_D - p_J0 (mean {top.gap:.3f}), at layer {int(top.layer)}")
    grid_path = Path(run_dir) / PATCH_GRID.file
    grid = read_table(grid_path, PATCH_GRID) if grid_path.is_file() else None
    if grid is not None and len(grid):
        lines += grid_lines(write_grid(grid, out, seed, n_boot, written))
    if len(kl):
        write_table(kl, out, "depth_lens_kl", "KL(final || lens) in nats at the read positions, by lens and layer")
        lens_kl_figure(kl, out / DEPTH_FIGURES[2])
        written += ["depth_lens_kl.csv", DEPTH_FIGURES[2]]
        below = kl[kl.layer < kl.layer.max()].groupby("lens")["mean"].mean()
        lines.append("depth: mean KL(final || lens) over the layers below the last: "
                     + ", ".join(f"{lens} lens {below[lens]:.3f} nats" for lens in LENSES if lens in below.index))
    body = "\n".join(f"- {line.removeprefix('depth: ')}" for line in lines) + "\n\n" + DEFINITIONS
    (out / DEPTH_MARKDOWN).write_text(md_section(f"Through depth ({lenses})", body))
    lines.append(f"depth: wrote {', '.join([*written, DEPTH_MARKDOWN])} to {out}")
    return lines
