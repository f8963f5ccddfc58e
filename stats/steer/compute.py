"""Steering estimates (pure). Definitions (this project's extension of the gap paper; docs/paper-map.md):

- Per held-out scenario and condition, p_X(cell) is the read's violating mass normalized over the letters, averaged
  over its option orders (X: D, J0, control). g = p_D - p_J0 per cell; E = g(primary) - g(twin), the paired excess
  with the letter-only judgment J0 in place of J (the first-token readouts only, as in the depth readout).
- Each condition is compared with the unsteered read of the same scenarios: dE = E - E(unsteered), the twin's move
  p_D(twin) - p_D(twin, unsteered), and J0's moves in the primary and twin cells; all with the paired scenario
  bootstrap (the same resampled scenarios for the condition and the unsteered read).
- The random band at a layer and strength: the least and greatest E (and twin and J0 moves) over the random
  directions of the steered direction's norm.
- Capability: the capability text's mean per-token loss under the condition over the unsteered loss (a ratio).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract.names import RANDOM_DIRECTION, UNSTEERED
from stats.core.bootstrap import scenario_bootstrap
from stats.gap.names import CONTROL, J0, PRIMARY, TWIN, D

CONDITION = ["direction", "direction_seed", "layer", "strength"]
COLUMNS = ("p_D", "p_J0", "p_D_twin", "p_J0_twin", "control", "E")
"""Per scenario and condition: p_D, p_J0 (primary), p_D and p_J0 of the twin, p_D under the known-gap control, E."""
MOVES = {"dE": "E", "twin_move": "p_D_twin", "J0_move": "p_J0", "J0_twin_move": "p_J0_twin", "control_move": "control"}
"""Quantity -> the column whose change against the unsteered read it is."""
QUANTITIES = ("E", *MOVES, "p_D", "p_D_twin", "p_J0")


def scenario_values(steering: pd.DataFrame) -> pd.DataFrame:
    """One row per condition x scenario with COLUMNS (scenarios read in both primary and twin by D and J0)."""
    d = steering.copy()
    d["direction_seed"] = d.direction_seed.astype("Int64").fillna(-1).astype(int)
    d["layer"] = d.layer.astype("Int64").fillna(-1).astype(int)
    means = d.groupby([*CONDITION, "scenario_id", "readout", "cell"]).p_violating.mean()
    wide = means.unstack(["readout", "cell"])
    want = {"p_D": (D, PRIMARY), "p_J0": (J0, PRIMARY), "p_D_twin": (D, TWIN), "p_J0_twin": (J0, TWIN),
            "control": (CONTROL, PRIMARY)}
    out = pd.DataFrame({name: wide[col] if col in wide.columns else np.nan for name, col in want.items()}, index=wide.index)
    out = out.dropna(subset=["p_D", "p_J0", "p_D_twin", "p_J0_twin"])
    out["E"] = (out.p_D - out.p_J0) - (out.p_D_twin - out.p_J0_twin)
    return out.reset_index()


def _paired(values: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """The unsteered row of each scenario beside every condition's (scenarios read unsteered and steered)."""
    base = values[values.direction == UNSTEERED].set_index("scenario_id")[list(COLUMNS)]
    return base, sorted(base.index)


def estimates(steering: pd.DataFrame, rng: np.random.Generator, n_boot: int = 10_000) -> pd.DataFrame:
    """Per condition and quantity (QUANTITIES): value, 95% CI (paired scenario bootstrap), n; plus E0, the
    unsteered E on the same scenarios."""
    values = scenario_values(steering)
    base, _ = _paired(values)
    rows = []
    for cond, g in values.groupby(CONDITION, sort=True):
        g = g.set_index("scenario_id")
        ids = sorted(set(g.index) & set(base.index))
        if not ids:
            continue
        cur, ref = g.loc[ids, list(COLUMNS)], base.loc[ids]
        cols = {"E": cur.E, **{m: cur[c] - ref[c] for m, c in MOVES.items()},
                "p_D": cur.p_D, "p_D_twin": cur.p_D_twin, "p_J0": cur.p_J0, "E0": ref.E}
        mat = np.column_stack([cols[q].to_numpy(float) for q in cols])
        keep = ~np.isnan(mat).any(axis=1)  # the control may be missing in a cell: drop those scenarios' rows here
        value, low, high, _ = scenario_bootstrap(mat[keep], rng, n_boot)
        for k, q in enumerate(cols):
            rows.append(dict(zip(CONDITION, cond), quantity=q, value=value[k], low=low[k], high=high[k], n=int(keep.sum())))
    out = pd.DataFrame(rows)
    if len(out):
        for c in ("direction_seed", "layer"):
            out[c] = out[c].where(out[c] >= 0, pd.NA).astype("Int64")
    return out


def random_band(est: pd.DataFrame) -> pd.DataFrame:
    """Per layer, strength and quantity: the least, mean and greatest value over the random directions."""
    r = est[est.direction == RANDOM_DIRECTION]
    if r.empty:
        return pd.DataFrame(columns=["layer", "strength", "quantity", "low", "mean", "high", "seeds"])
    g = r.groupby(["layer", "strength", "quantity"]).value
    return pd.DataFrame({"low": g.min(), "mean": g.mean(), "high": g.max(), "seeds": g.size()}).reset_index()


def capability(cap: pd.DataFrame) -> pd.DataFrame:
    """Per condition: the capability text's loss and its ratio to the unsteered loss."""
    if cap.empty:
        return cap.assign(ratio=pd.Series(dtype=float))
    base = cap[cap.direction == UNSTEERED].loss
    if base.empty:
        return cap.assign(ratio=np.nan)
    return cap.assign(ratio=cap.loss / float(base.iloc[0]))[[*CONDITION, "positions", "loss", "tokens", "ratio"]]


def _at_strength(q: pd.DataFrame, band: pd.DataFrame, layer: int, strength: float, bound: float) -> dict:
    """The acceptance figures of one layer and strength (q: that layer's estimates indexed by strength, quantity)."""
    get = lambda name: q.loc[(strength, name)]  # noqa: E731
    b = band[(band.layer == layer) & (band.strength == strength) & (band.quantity == "E")]
    e0 = float(get("E0").value)
    out = dict(layer=layer, strength=strength, E=float(get("E").value), E_low=float(get("E").low),
               E_high=float(get("E").high), E0=e0, E0_low=float(get("E0").low), E0_high=float(get("E0").high),
               twin_move=float(get("twin_move").value), J0_move=float(get("J0_move").value),
               J0_twin_move=float(get("J0_twin_move").value))
    out["halved"] = out["E"] <= out["E0"] / 2 if e0 > 0 else False
    out["random_low"] = float(b["low"].iloc[0]) if len(b) else np.nan
    out["random_high"] = float(b["high"].iloc[0]) if len(b) else np.nan
    out["random_within"] = bool(len(b)) and max(abs(out["random_low"] - e0), abs(out["random_high"] - e0)) < bound
    # Not a figure of the verdict: how far J0 moves (either cell) under random directions of the same norm, beside
    # the direction's own J0 move (a direction-specific move of the judgment, or any push's).
    j = band[(band.layer == layer) & (band.strength == strength) & band.quantity.isin(("J0_move", "J0_twin_move"))]
    out["random_J0_move"] = float(j[["low", "high"]].abs().to_numpy().max()) if len(j) else np.nan
    out["judgment_kept"] = abs(out["J0_move"]) < bound and abs(out["J0_twin_move"]) < bound
    out["twin_kept"] = abs(out["twin_move"]) < bound
    out["met"] = out["halved"] and out["twin_kept"] and out["judgment_kept"] and out["random_within"]
    return out


def verdict(est: pd.DataFrame, band: pd.DataFrame, direction: str, layer: int, bound: float = 0.05) -> dict:
    """At one layer of the steered direction, the acceptance figures (E, E0, whether E fell by at least half, the
    twin's and J0's moves, the random band's E against E0, `met`: all four hold; beside them `random_J0_move`, the
    largest |J0 move| of either cell under the random directions) at the weakest strength where all
    four hold, or, where none does, at the strength whose E is least. (A claim needs one strength at which E halves
    while the twin, J0 and the random band stay: the least-E strength alone may be one that also moves the twin.)"""
    e = est[(est.direction == direction) & (est.layer == layer)]
    if e.empty:
        return {}
    q = e.set_index(["strength", "quantity"])
    rows = [_at_strength(q, band, layer, s, bound) for s in sorted(e.strength.unique())]
    met = [r for r in rows if r["met"]]
    return min(met, key=lambda r: abs(r["strength"])) if met else min(rows, key=lambda r: r["E"])
