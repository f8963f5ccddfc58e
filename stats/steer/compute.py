"""Steering estimates (pure). Definitions (this project's extension of the gap paper; docs/paper-map.md):

- Per held-out scenario and condition, p_X(cell) is the read's violating mass normalized over the letters, averaged
  over its option orders (X: D, J0, control). g = p_D - p_J0 per cell; E = g(primary) - g(twin), the paired excess
  with the letter-only judgment J0 in place of J (the first-token readouts only, as in the depth readout).
- Each condition is compared with the unsteered read of the same scenarios: dE = E - E(unsteered), the twin's move
  p_D(twin) - p_D(twin, unsteered), and J0's moves in the primary and twin cells; all with the paired scenario
  bootstrap (the same resampled scenarios for the condition and the unsteered read).
- The random band at a layer and strength: the 5th, 50th and 95th percentiles of each quantity over the random
  directions of the steered direction's norm (a quantile band: a min..max range widens with every direction drawn).
- The verdict (the point chosen on the selection part, read on the test part): stats.steer.experiment.
- Capability: the capability text's mean per-token loss under the condition over the unsteered loss (a ratio).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract.names import RANDOM_DIRECTION, STEER_PARTS, UNSTEERED
from stats.core.bootstrap import scenario_bootstrap
from stats.gap.names import CONTROL, J0, PRIMARY, TWIN, D

CONDITION = ["direction", "direction_seed", "layer", "strength"]
COLUMNS = ("p_D", "p_J0", "p_D_twin", "p_J0_twin", "control", "E")
"""Per scenario and condition: p_D, p_J0 (primary), p_D and p_J0 of the twin, p_D under the known-gap control, E."""
MOVES = {"dE": "E", "twin_move": "p_D_twin", "J0_move": "p_J0", "J0_twin_move": "p_J0_twin", "control_move": "control"}
"""Quantity -> the column whose change against the unsteered read it is."""
QUANTITIES = ("E", *MOVES, "p_D", "p_D_twin", "p_J0")


def scenario_values(steering: pd.DataFrame) -> pd.DataFrame:
    """One row per condition x scenario with its part and COLUMNS (scenarios read in both primary and twin by D and
    J0). A table without parts (a two-way split) has every scenario in the test part."""
    d = steering.copy()
    d["direction_seed"] = d.direction_seed.astype("Int64").fillna(-1).astype(int)
    d["layer"] = d.layer.astype("Int64").fillna(-1).astype(int)
    d["part"] = d["part"].astype(object).where(d["part"].notna(), STEER_PARTS[2]) if "part" in d else STEER_PARTS[2]
    means = d.groupby([*CONDITION, "part", "scenario_id", "readout", "cell"]).p_violating.mean()
    wide = means.unstack(["readout", "cell"])
    want = {"p_D": (D, PRIMARY), "p_J0": (J0, PRIMARY), "p_D_twin": (D, TWIN), "p_J0_twin": (J0, TWIN),
            "control": (CONTROL, PRIMARY)}
    out = pd.DataFrame({name: wide[col] if col in wide.columns else np.nan for name, col in want.items()}, index=wide.index)
    out = out.dropna(subset=["p_D", "p_J0", "p_D_twin", "p_J0_twin"])
    out["E"] = (out.p_D - out.p_J0) - (out.p_D_twin - out.p_J0_twin)
    return out.reset_index()


def estimates(steering: pd.DataFrame, rng: np.random.Generator, n_boot: int = 10_000) -> pd.DataFrame:
    """Per part, condition and quantity (QUANTITIES): value, 95% CI (paired scenario bootstrap), n; plus E0, the
    unsteered E on the same scenarios of the same part."""
    values = scenario_values(steering)
    rows = []
    for part, pv in values.groupby("part", sort=True):
        base = pv[pv.direction == UNSTEERED].set_index("scenario_id")[list(COLUMNS)]
        for cond, g in pv.groupby(CONDITION, sort=True):
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
                rows.append(dict(part=part, **dict(zip(CONDITION, cond)), quantity=q, value=value[k], low=low[k],
                                 high=high[k], n=int(keep.sum())))
    out = pd.DataFrame(rows)
    if len(out):
        for c in ("direction_seed", "layer"):
            out[c] = out[c].where(out[c] >= 0, pd.NA).astype("Int64")
    return out


def random_band(est: pd.DataFrame, upper: float = 0.95) -> pd.DataFrame:
    """Per part, layer, strength and quantity: the (1 - upper), 50th and `upper` percentiles of the value over the random
    directions (low, median, high), and how many directions (seeds)."""
    r = est[est.direction == RANDOM_DIRECTION]
    if r.empty:
        return pd.DataFrame(columns=["part", "layer", "strength", "quantity", "low", "median", "high", "seeds"])
    g = r.groupby(["part", "layer", "strength", "quantity"]).value
    return pd.DataFrame({"low": g.quantile(1 - upper), "median": g.median(), "high": g.quantile(upper),
                         "seeds": g.size()}).reset_index()


def capability(cap: pd.DataFrame) -> pd.DataFrame:
    """Per condition: the capability text's loss and its ratio to the unsteered loss."""
    if cap.empty:
        return cap.assign(ratio=pd.Series(dtype=float))
    base = cap[cap.direction == UNSTEERED].loss
    if base.empty:
        return cap.assign(ratio=np.nan)
    return cap.assign(ratio=cap.loss / float(base.iloc[0]))[[*CONDITION, "positions", "loss", "tokens", "ratio"]]
