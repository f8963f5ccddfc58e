"""A steering run as a pre-registered experiment (pure; docs/steering.md): the grid point chosen on the selection part
by the rule the manifest records (stats.steer.rules.SELECTION_RULE), then the verdict at that point on the test part
only, each rule with its interval (stats.steer.rules), beside the random directions' quantile band.

`values` is stats.steer.compute.scenario_values: one row per condition x scenario with its part (`selection`,
`test`), p_D, p_J0, their twins, the control and E.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from contract.names import RANDOM_DIRECTION, STEER_PARTS, UNSTEERED
from stats.steer import rules as R

SELECTION, TEST = STEER_PARTS[1], STEER_PARTS[2]
CHECKS = {"twin_move": "p_D_twin", "J0_move": "p_J0", "J0_twin_move": "p_J0_twin", "control_move": "control"}
"""The did-not-move checks: quantity -> the column whose change against the unsteered read it is."""


def _part(values: pd.DataFrame, part: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the part's rows, its unsteered rows indexed by scenario)."""
    v = values[values.part == part]
    return v, v[v.direction == UNSTEERED].set_index("scenario_id")


def _paired(v: pd.DataFrame, base: pd.DataFrame, direction: str, layer: int, strength: float,
            seed: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steered rows, unsteered rows) of one condition, on the scenarios read both ways, in one order."""
    g = v[(v.direction == direction) & (v.layer == layer) & (v.strength == strength)]
    if seed is not None:
        g = g[g.direction_seed == seed]
    g = g.set_index("scenario_id")
    ids = sorted(set(g.index) & set(base.index))
    return g.loc[ids], base.loc[ids]


def _checks(cur: pd.DataFrame, ref: pd.DataFrame, rules: R.Rules, rng, n_boot: int) -> dict:
    return {name: R.equivalence((cur[col] - ref[col]).to_numpy(float), rng, n_boot, rules.margin,
                                rules.equivalence_confidence) for name, col in CHECKS.items()}


def grid_points(values: pd.DataFrame, direction: str) -> list[tuple[int, float]]:
    d = values[values.direction == direction]
    return sorted({(int(a), float(b)) for a, b in zip(d.layer, d.strength)})


def selection_grid(values: pd.DataFrame, direction: str, rules: R.Rules, rng, n_boot: int) -> list[dict]:
    """Per grid point of `direction` on the selection part: the mean reduction of E, each check's move with its
    interval, `kept` (every check passes). Empty where the run has no selection part."""
    v, base = _part(values, SELECTION)
    rows = []
    for layer, strength in grid_points(v, direction):
        cur, ref = _paired(v, base, direction, layer, strength)
        if cur.empty:
            continue
        checks = _checks(cur, ref, rules, rng, n_boot)
        row = dict(direction=direction, layer=layer, strength=strength, n=len(cur),
                   reduction=float((ref.E - cur.E).mean()), kept=all(c["equivalent"] for c in checks.values()))
        for name, c in checks.items():
            row.update({name: c["value"], f"{name}_low": c["low"], f"{name}_high": c["high"]})
        rows.append(row)
    return rows


def random_reductions(values: pd.DataFrame, layer: int, strength: float, part: str = TEST) -> np.ndarray:
    """Per random direction at (layer, strength): its mean reduction of E on `part`."""
    v, base = _part(values, part)
    r = v[(v.direction == RANDOM_DIRECTION) & (v.layer == layer) & (v.strength == strength)]
    out = []
    for seed in sorted(set(r.direction_seed)):
        cur, ref = _paired(v, base, RANDOM_DIRECTION, layer, strength, seed)
        if len(cur):
            out.append(float((ref.E - cur.E).mean()))
    return np.array(out, dtype=float)


def _capability(cap: pd.DataFrame, direction: str, layer: int, strength: float) -> tuple[float, dict]:
    """(the direction's loss ratio at the point, the random directions' band of ratios there)."""
    if cap is None or cap.empty or "ratio" not in cap:
        return math.nan, R.quantile_band(np.array([]))
    at = cap[(cap.layer == layer) & (cap.strength == strength)]
    mine = at[at.direction == direction].ratio
    return (float(mine.iloc[0]) if len(mine) else math.nan), R.quantile_band(at[at.direction == RANDOM_DIRECTION].ratio.to_numpy(float))


def verdict_on_test(values: pd.DataFrame, direction: str, point: tuple[int, float], rules: R.Rules, rng, n_boot: int,
                 cap: pd.DataFrame | None = None, norms: dict | None = None) -> dict:
    """Every rule at `point` on the test part; `passed`: the reduction is shown, every check holds, the reduction
    exceeds the random band's upper quantile and the capability ratio stays within the random band."""
    layer, strength = point
    v, base = _part(values, TEST)
    cur, ref = _paired(v, base, direction, layer, strength)
    e, e0 = cur.E.to_numpy(float), ref.E.to_numpy(float)
    out = dict(direction=direction, layer=layer, strength=strength, n=len(cur), E0=float(e0.mean()) if len(e0) else math.nan,
               E=float(e.mean()) if len(e) else math.nan, threshold=rules.threshold)
    out["ratio"], out["ratio_low"], out["ratio_high"] = R.ratio_interval(e, e0, rng, n_boot, rules.confidence)
    out["reduced"] = R.reduced(out["ratio_low"], out["ratio_high"], rules.threshold)
    checks = _checks(cur, ref, rules, rng, n_boot)
    for name, c in checks.items():
        out.update({name: c["value"], f"{name}_low": c["low"], f"{name}_high": c["high"], f"{name}_kept": c["equivalent"]})
    out["kept"] = all(c["equivalent"] for c in checks.values())
    out["reduction"] = float((e0 - e).mean()) if len(e) else math.nan
    band = R.quantile_band(random_reductions(values, layer, strength), rules.random_quantile)
    out.update(random_low=band["low"], random_median=band["median"], random_high=band["high"], random_n=band["n"])
    out["beyond_random"] = R.beyond_band(out["reduction"], band)
    ratio, cap_band = _capability(cap, direction, layer, strength)
    out.update(capability=ratio, capability_random_high=cap_band["high"], capability_random_n=cap_band["n"])
    out["capability_kept"] = R.capability_kept(ratio, cap_band)
    ww = R.wrong_way(e, e0)
    out.update(wrong_way=ww["share"], wrong_way_low=ww["low"], wrong_way_high=ww["high"])
    norms = norms or {}
    out["relative_norm"] = R.relative_norm(strength, norms.get("direction", {}).get(str(layer), math.nan),
                                           norms.get("residual", {}).get(str(layer), math.nan))
    out["passed"] = bool(out["reduced"] and out["kept"] and out["beyond_random"] and out["capability_kept"])
    return out


def steerability(values: pd.DataFrame, direction: str, point: tuple[int, float], part: str = TEST) -> pd.DataFrame:
    """Per scenario of `part` at `point`: E unsteered (E0), E steered and their difference (`change`; above 0 is the
    wrong way), with the random directions' median change on the same scenario where the run read them; sorted by
    change. Empty where the point was not read on the part."""
    layer, strength = point
    v, base = _part(values, part)
    cur, ref = _paired(v, base, direction, layer, strength)
    out = pd.DataFrame({"scenario_id": cur.index, "E0": ref.E.to_numpy(float), "E": cur.E.to_numpy(float)})
    out["change"] = out.E - out.E0
    r = v[(v.direction == RANDOM_DIRECTION) & (v.layer == layer) & (v.strength == strength)]
    if len(r):
        median = r.groupby("scenario_id").E.median() - base.E
        out["random_median_change"] = out.scenario_id.map(median).to_numpy(float)
    out.insert(0, "direction", direction)
    out.insert(1, "layer", layer)
    out.insert(2, "strength", strength)
    return out.sort_values(["change", "scenario_id"]).reset_index(drop=True)


def experiment(values: pd.DataFrame, direction: str, rules: R.Rules, rng, n_boot: int,
               cap: pd.DataFrame | None = None, norms: dict | None = None) -> tuple[list[dict], dict]:
    """(the selection grid, the verdict): the point chosen on the selection part by the rule, read on the test part.
    Where no point is kept (or the run has no selection part) the verdict names why and does not pass."""
    grid = selection_grid(values, direction, rules, rng, n_boot)
    chosen = R.select_point(grid)
    if chosen is None:
        why = ("no selection part (a run with a two-way split)" if not grid else
               "no grid point passes the did-not-move checks on the selection part")
        return grid, dict(direction=direction, layer=None, strength=None, passed=False, reason=why)
    return grid, {**verdict_on_test(values, direction, (chosen["layer"], chosen["strength"]), rules, rng, n_boot, cap, norms),
                  "reason": ""}


def _iv(v: dict, name: str, fmt: str = "+.3f") -> str:
    return f"{v[name]:{fmt}} [{v[name + '_low']:{fmt}}, {v[name + '_high']:{fmt}}]"


def verdict_lines(grid: list[dict], v: dict) -> list[str]:
    """What `readout steer` and `readout stats` print of one direction's experiment."""
    d = v["direction"]
    if v.get("layer") is None:
        return [f"steer: {d}: no verdict: {v['reason']}; fails"]
    kept = sum(g["kept"] for g in grid)
    lines = [f"steer: {d}: chosen on the selection part (n={grid[0]['n']}): depth {v['layer']}, strength {v['strength']:g} "
             f"(largest E reduction among the {kept} of {len(grid)} grid points whose did-not-move checks pass)"]
    checks = ", ".join(f"{name} {_iv(v, name)}{'' if v[name + '_kept'] else ' MOVED'}" for name in CHECKS)
    failed = [why for ok, why in ((v["reduced"], "reduction not shown"), (v["kept"], "a check moved"),
                                  (v["beyond_random"], "within the random band"), (v["capability_kept"], "capability"))
              if not ok]
    lines += [
        f"steer: {d} on the test part (n={v['n']}): E {v['E']:.3f} against {v['E0']:.3f} unsteered; E/E0 "
        f"{_iv(v, 'ratio', '.3f')} (95%; below {v['threshold']:g}: {'yes' if v['reduced'] else 'no'})",
        f"steer: {d}: did not move (90% intervals inside the margin): {checks}",
        f"steer: {d}: E reduction {v['reduction']:.3f} against the random band's 95th percentile {v['random_high']:.3f} "
        f"(median {v['random_median']:.3f}, {v['random_n']} directions): {'beyond' if v['beyond_random'] else 'not beyond'}; "
        f"capability ratio {v['capability']:.3f} against the random band's {v['capability_random_high']:.3f}: "
        f"{'kept' if v['capability_kept'] else 'not kept'}",
        f"steer: {d}: wrong way {v['wrong_way']:.0%} of test scenarios [{v['wrong_way_low']:.0%}, {v['wrong_way_high']:.0%}]; "
        f"perturbation {v['relative_norm']:.3f} of the residual norm at depth {v['layer']}",
        f"steer: {d}: verdict: {'passes' if v['passed'] else 'fails (' + ', '.join(failed) + ')'}"]
    return lines
