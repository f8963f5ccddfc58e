"""The lines `readout steer` prints at the end: for the steered direction and its label-shuffled null, the grid point
chosen on the selection part and the verdict on the test part, each rule with its interval (stats.steer.experiment;
`readout stats` writes the same with the tables and figure)."""

from __future__ import annotations

import pandas as pd

from contract.names import RANDOM_DIRECTION, UNSTEERED
from stats.core.seeding import rng_for
from stats.steer.compute import capability, scenario_values
from stats.steer.experiment import experiment, verdict_lines
from stats.steer.rules import Rules

N_BOOT = 2000
"""Resamples of the end-of-run verdict (`readout stats` uses its own --n-boot)."""


def summary_lines(steering: pd.DataFrame, cap: pd.DataFrame, rules: Rules | None = None, norms: dict | None = None) -> list[str]:
    if steering.empty:
        return ["summary: no reads"]
    v = scenario_values(steering)
    if v[v.direction == UNSTEERED].empty:
        return ["summary: no unsteered reads"]
    lines = []
    for direction in [d for d in dict.fromkeys(v.direction) if d not in (UNSTEERED, RANDOM_DIRECTION)]:
        grid, verdict = experiment(v, direction, rules or Rules(), rng_for(0, "steer", "verdict", direction), N_BOOT,
                                   capability(cap), norms)
        lines += verdict_lines(grid, verdict)
    return lines
