"""The lines `readout steer` prints at the end: the held-out E unsteered and at each layer and strength of the
steered direction, beside the random directions' range (means only; `readout stats` gives the CIs)."""

from __future__ import annotations

import pandas as pd

from contract.names import RANDOM_DIRECTION, UNSTEERED
from stats.steer.compute import scenario_values


def summary_lines(steering: pd.DataFrame, capability: pd.DataFrame) -> list[str]:
    if steering.empty:
        return ["summary: no reads"]
    v = scenario_values(steering)
    means = v.groupby(["direction", "direction_seed", "layer", "strength"])[["E", "p_D_twin", "p_J0"]].mean().reset_index()
    base = means[means.direction == UNSTEERED]
    if base.empty:
        return ["summary: no unsteered reads"]
    e0, twin0, j0 = (float(base[c].iloc[0]) for c in ("E", "p_D_twin", "p_J0"))
    lines = [f"held-out E unsteered {e0:.3f} (p_D twin {twin0:.3f}, J0 {j0:.3f}; {v.scenario_id.nunique()} scenarios)"]
    main = means[~means.direction.isin([UNSTEERED, RANDOM_DIRECTION])]
    rand = means[means.direction == RANDOM_DIRECTION]
    for (layer, strength), g in main.groupby(["layer", "strength"]):
        r = rand[(rand.layer == layer) & (rand.strength == strength)].E
        band = f"; random E {r.min():.3f} .. {r.max():.3f}" if len(r) else ""
        lines.append(f"layer {layer} strength {strength:+g}: E {g.E.iloc[0]:.3f}, p_D twin {g.p_D_twin.iloc[0] - twin0:+.3f}, "
                     f"J0 {g.p_J0.iloc[0] - j0:+.3f}{band}")
    return lines
