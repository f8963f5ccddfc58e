"""An organism's true values on records it was not trained on (a split's validation slice or held-out part): plain
one-prompt forwards of the merged model (organisms.reference.plain_reads) on every read of the quick profile,
averaged as the gap paper defines them, per scenario, with a percentile bootstrap interval over scenarios."""

from __future__ import annotations

import dataclasses

import numpy as np

from organisms.examples import examples
from organisms.reference import plain_reads, scenario_values

BOOT = 4000


def interval(values, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its percentile bootstrap interval over them."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(BOOT, len(x)))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    return float(x.mean()), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def values_on(model, org, lm, records, readouts=("D", "J", "J0")) -> dict:
    """scenario_values of `model` (the merged organism) on `records`: every read of `readouts` in every cell."""
    reader = dataclasses.replace(org, readouts=tuple(readouts))
    return scenario_values(plain_reads(model, examples(reader, lm, records)))


def excess(values: dict, records, judgment: str = "J") -> dict:
    """Per scenario: g = p_D - p_judgment in the primary and in the twin, and E = g_primary - g_twin."""
    out = {}
    for r in records:
        g = {c: values[(r.id, c, "D")] - values[(r.id, c, judgment)] for c in ("primary", "twin")}
        out[r.id] = dict(family=r.family, g_primary=g["primary"], g_twin=g["twin"], E=g["primary"] - g["twin"])
    return out


def summary(values: dict, records) -> dict:
    """E (against J and against J0), and the mean violating share of each readout and cell, with intervals."""
    out = {}
    for judgment in ("J", "J0"):
        if all((r.id, "primary", judgment) in values for r in records):
            out[f"E_{judgment}"] = interval([v["E"] for v in excess(values, records, judgment).values()])
    for key in sorted({(k[2], k[1]) for k in values if len(k) == 3}):
        out[f"p_{key[0]}/{key[1]}"] = interval([values[(r.id, key[1], key[0])] for r in records
                                                if (r.id, key[1], key[0]) in values])
    return out
