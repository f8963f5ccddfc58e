"""`readout stats` on a steering run: steer_grid.csv/.md (every condition's estimates per part), steer_random_band.csv/.md
(the random directions' quantile band), steer_capability.csv/.md, steer_scenarios.csv/.md (per-scenario steerability
at each direction's chosen point), steer_selection.csv/.md (the selection part's grid
and checks), steer_verdict.csv/.md (the verdict of the direction and of its label-shuffled null on the test part),
steer_summary.md and the figures steer_strength.png and steer_scenarios.png."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from contract.names import RANDOM_DIRECTION, SHUFFLED_DIRECTION, STEER_PARTS, UNSTEERED
from contract.tables import STEER_ADDED, STEER_CAPABILITY, STEERING
from stats.core.figures import BAND, MEASURE, NULL, new_figure, save
from stats.core.output import md_section, write_table
from stats.core.seeding import rng_for
from stats.core.tables import read_table
from stats.steer.compute import capability, estimates, random_band, scenario_values
from stats.steer.experiment import experiment, steerability, verdict_lines
from stats.steer.names import STEER_FIGURES, STEER_MARKDOWN, STEER_OUTPUTS
from stats.steer.rules import SELECTION_RULE, Rules

TEST = STEER_PARTS[2]
DEFINITIONS = (
    "E: the paired excess (p_D - p_J0) primary - twin (J0, the letter-only judgment, in place of J: first-token "
    "readouts only), each condition against the unsteered read of the same scenarios. The grid point is chosen on the "
    "selection part by the rule the manifest recorded before the run; the verdict is read on the test part only: "
    "E_steered / E0's 95% paired-bootstrap interval below the threshold; the twin's p_D, J0 (both cells) and the "
    "known-gap control each equivalent to unsteered (90% interval inside +-margin); the reduction of E beyond the 95th "
    "percentile of the random directions' reductions (same norm, test part); the capability loss ratio (the vector "
    "added where the readouts got it) at most the random directions' 95th percentile. Reported beside it: the share of "
    "test scenarios whose E rises (Wilson interval) and the perturbation's norm over the residual stream's at that "
    "depth. Definitions: docs/steering.md (this project's extension).")


def is_steer_run(run_dir) -> bool:
    return (Path(run_dir) / STEERING.file).is_file()


def analyze_steering(run_dir, seed: int = 0, n_boot: int = 10_000):
    """(estimates, random band, capability, {direction: (selection grid, verdict)}, per-scenario steerability at each
    chosen point, manifest) of a steering run."""
    run_dir = Path(run_dir)
    steering = read_table(run_dir / STEERING.file, STEERING, optional=STEER_ADDED)
    cap_path = run_dir / STEER_CAPABILITY.file
    cap = read_table(cap_path, STEER_CAPABILITY) if cap_path.is_file() else pd.DataFrame(columns=list(STEER_CAPABILITY.names))
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    rules = Rules.from_dict((manifest.get("steering") or {}).get("rules"))
    norms = {"direction": manifest.get("steering_norms", {}), "residual": manifest.get("steering_residual_norms", {})}
    est = estimates(steering, rng_for(seed, "steer", "grid"), n_boot)
    caps = capability(cap)
    values = scenario_values(steering)
    names = [d for d in dict.fromkeys(values.direction) if d not in (UNSTEERED, RANDOM_DIRECTION)]
    found = {d: experiment(values, d, rules, rng_for(seed, "steer", "verdict", d), n_boot, caps, norms) for d in names}
    return est, random_band(est, rules.random_quantile), caps, found, scenario_changes(values, found), manifest


def strength_figure(est: pd.DataFrame, band: pd.DataFrame, direction: str, chosen: dict, path: Path) -> Path:
    """E against strength on the test part, one panel per layer, with the random directions' quantile band."""
    est = est[est.part == TEST]
    band = band[band.part == TEST] if len(band) else band
    layers = sorted(int(x) for x in est[est.direction == direction].layer.dropna().unique())
    fig, axes = new_figure(4.4 * max(1, len(layers)), 3.4, max(1, len(layers)))
    for ax, layer in zip(axes, layers):
        d = est[(est.direction == direction) & (est.layer == layer)]
        q = {name: d[d.quantity == name].sort_values("strength") for name in ("E", "E0", "J0_move", "twin_move")}
        e = q["E"]
        ax.plot(e.strength, e.value, color=MEASURE, marker="o", ms=3, label=f"E ({direction})")
        ax.fill_between(e.strength, e.low, e.high, color=MEASURE, alpha=0.2, lw=0)
        b = band[(band.layer == layer) & (band.quantity == "E")].sort_values("strength") if len(band) else band
        if len(b):
            ax.fill_between(b.strength, b["low"], b["high"], color=NULL, alpha=0.35, lw=0,
                            label=f"E, random directions (5-95%, {int(b.seeds.max())})")
        e0 = float(q["E0"].value.mean()) if len(q["E0"]) else np.nan
        ax.axhline(e0, color=NULL, ls="--", lw=1, label=f"E unsteered ({e0:.2f})")
        ax.axhline(0, color=NULL, lw=0.6)
        ax.plot(q["twin_move"].strength, q["twin_move"].value, color=BAND, marker="s", ms=3, lw=1, label="p_D(twin) move")
        ax.plot(q["J0_move"].strength, q["J0_move"].value, color=BAND, ls=":", marker="^", ms=3, lw=1, label="J0 move")
        if chosen.get("layer") == layer:
            ax.axvline(chosen["strength"], color=MEASURE, ls=":", lw=1, label="chosen on the selection part")
        ax.set_title(f"after layer {layer}: n={int(e.n.iloc[0]) if len(e) else 0} test scenarios", fontsize=9)
        ax.set_xlabel("strength")
        ax.set_ylabel("E; moves against unsteered")
        ax.legend(fontsize=6, frameon=False)
    return save(fig, path)


def scenario_changes(values: pd.DataFrame, found: dict) -> pd.DataFrame:
    """Per-scenario steerability on the test part at the point each direction chose (none where none was chosen)."""
    frames = [steerability(values, d, (v["layer"], v["strength"])) for d, (_, v) in found.items() if v.get("layer") is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def scenarios_figure(changes: pd.DataFrame, found: dict, path: Path) -> Path:
    """Each direction's per-scenario change of E at its chosen point, sorted, the wrong way in red."""
    names = list(dict.fromkeys(changes.direction))
    n = max(len(g) for _, g in changes.groupby("direction"))
    fig, axes = new_figure(4.4 * len(names), 1.6 + 0.16 * n, len(names))
    for ax, name in zip(axes, names):
        c = changes[changes.direction == name].reset_index(drop=True)
        v = found[name][1]
        y = np.arange(len(c))
        ax.barh(y, c.change, color=[BAND if x > 0 else MEASURE for x in c.change], height=0.7)
        if "random_median_change" in c and c.random_median_change.notna().any():
            ax.plot(c.random_median_change, y, "o", color=NULL, ms=3, label="random directions' median")
            ax.legend(fontsize=6, frameon=False, loc="lower right")
        ax.axvline(0, color=NULL, lw=0.6)
        ax.set_yticks(y, c.scenario_id, fontsize=5)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.set_xlabel("change of E (steered - unsteered)")
        ax.set_title(f"{name}, depth {v['layer']}, strength {v['strength']:g}: wrong way {v['wrong_way']:.0%} "
                     f"[{v['wrong_way_low']:.0%}, {v['wrong_way_high']:.0%}] of {len(c)}", fontsize=8)
    return save(fig, path)


def summary_markdown(found: dict, manifest: dict) -> str:
    st = manifest.get("steering") or {}
    rules = Rules.from_dict(st.get("rules"))
    head = (f"Direction `{st.get('direction')}`, positions `{st.get('positions')}`, split seed {st.get('split_seed')}: "
            f"{len(st.get('train', []))} direction / {len(st.get('selection', []))} selection / "
            f"{len(st.get('test', []))} test scenarios, {len(st.get('random_seeds', []))} random directions.\n\n"
            f"Selection rule (recorded before the run): {st.get('rules', {}).get('selection_rule', SELECTION_RULE)}. "
            f"Threshold {rules.threshold:g}, margin {rules.margin:g}.\n\n")
    body = "\n".join(f"- {line.removeprefix('steer: ')}" for _, (grid, v) in found.items() for line in verdict_lines(grid, v))
    return md_section("Steering (selection and test parts)", head + body + "\n\n" + DEFINITIONS)


def run_steer_report(run_dir, out_dir=None, seed: int = 0, n_boot: int = 10_000) -> list[str]:
    """Write the steering tables, figure and summary of one run into `out_dir` (default RUN_DIR/stats)."""
    est, band, cap, found, changes, manifest = analyze_steering(run_dir, seed, n_boot)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "stats"
    out.mkdir(parents=True, exist_ok=True)
    for name in STEER_OUTPUTS:
        (out / name).unlink(missing_ok=True)
    write_table(est, out, "steer_grid", "Steering: every condition's estimates against the unsteered read, per part")
    write_table(band, out, "steer_random_band", "Steering: the random directions' 5th, 50th and 95th percentiles")
    write_table(cap, out, "steer_capability", "Steering: the capability text's loss per condition")
    write_table(pd.DataFrame([g for grid, _ in found.values() for g in grid]), out, "steer_selection",
                "Steering: the selection part's grid (mean E reduction, did-not-move checks)")
    write_table(pd.DataFrame([v for _, v in found.values()]), out, "steer_verdict",
                "Steering: the verdict at the chosen point on the test part")
    write_table(changes, out, "steer_scenarios",
                "Steering: each test scenario's change of E at the chosen point (above 0: the wrong way)")
    lines = []
    main = steered_direction(found)
    if main is not None and len(est):
        strength_figure(est, band, main, found[main][1], out / STEER_FIGURES[0])
    if len(changes):
        scenarios_figure(changes, found, out / STEER_FIGURES[1])
    if found:
        (out / STEER_MARKDOWN).write_text(summary_markdown(found, manifest))
        lines += [line for grid, v in found.values() for line in verdict_lines(grid, v)]
    lines.append(f"steer: wrote {', '.join(n for n in STEER_OUTPUTS if (out / n).exists())} to {out}")
    return lines


def steered_direction(found: dict) -> str | None:
    """The steered direction's name (the first that is not the label-shuffled null)."""
    names = [d for d in found if d != SHUFFLED_DIRECTION]
    return names[0] if names else None
