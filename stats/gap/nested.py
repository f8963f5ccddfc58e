"""The binary readout's one bootstrap model: resample scenarios, then redraw each drawn scenario's rollouts.

Owns: `redraw_prob` (the probability that a redrawn set of a scenario's rollouts has a violating majority)
and `joint_majority` (several majority-rate statistics, each a mean over its own scenario set, from the
same resampled scenarios and the same redrawn rollouts).

Why this model. An exact first-token readout knows each option order's violating probability q_k; the
table's `majority_violating_prob` is the Poisson-binomial P(sum_k Bernoulli(q_k) > K/2), the point estimate.
Redrawing one rollout per order from that exact per-order distribution and taking the majority is a
Bernoulli(majority_violating_prob) indicator, so the bootstrap is centred on the exact point estimate. Drawing
Binomial(K, mean fraction) instead would treat the orders as interchangeable and be off by
0.01-0.03 per scenario when the order matters (P(Binomial) != P(Poisson-binomial) for unequal q_k).
A `--sample` run holds observed rollouts only; there the redraw resamples them with replacement,
Binomial(K, observed fraction), the classical nested bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as sps

#: Resampled scenario cells per batch (B x S booleans per component).
_CELLS_PER_BATCH = 1_000_000


def redraw_prob(majority_prob: np.ndarray, fraction: np.ndarray, n_rollouts: np.ndarray,
                sampled: bool) -> np.ndarray:
    """P(a redrawn set of a scenario's rollouts has a violating majority).

    Exact runs: the majority probability itself (one fresh rollout per order from its exact distribution).
    Sampled runs: K observed rollouts resampled with replacement, Binomial(K, observed fraction).
    """
    mp = np.asarray(majority_prob, dtype=np.float64)
    if not sampled:
        return np.clip(mp, 0.0, 1.0)
    k = np.nan_to_num(np.asarray(n_rollouts, dtype=np.float64), nan=1.0).astype(np.int64)
    return sps.binom.sf(k // 2, k, np.clip(np.asarray(fraction, dtype=np.float64), 0.0, 1.0))


@dataclass(frozen=True)
class Statistic:
    """A signed sum of components' majority rates, averaged over its own scenario set."""

    name: str
    weights: tuple[float, ...]
    """One weight per component (gap: (1, 0); null: (0, 1); paired excess: (1, -1))."""
    mask: np.ndarray
    """(S,) the scenarios this statistic is defined on."""


@dataclass(frozen=True)
class Result:
    name: str
    n: int
    value: float
    low: float
    high: float
    se: float


def joint_majority(point: Sequence[np.ndarray], redraw: Sequence[np.ndarray] | None, stats: Sequence[Statistic],
                   rng: np.random.Generator, n_boot: int = 10_000, confidence: float = 0.95) -> list[Result]:
    """Point estimates and nested percentile CIs of several statistics from one bootstrap.

    point: per component, (S,) the exact majority probability (the point estimate's unit values).
    redraw: per component, (S,) the redraw probability (`redraw_prob`); None: no rollout redraw, each
    drawn scenario keeps its exact value (the scenario-only bootstrap of the bias audit).
    Each replicate draws the union of the statistics' sets with replacement (so a scenario in two sets
    moves both together: the gap, the null and the excess share every draw), then one majority indicator
    per drawn scenario and component; each statistic is the mean of its weighted indicators over the
    drawn scenarios of its own set. A replicate that drew none of a set is left out of that statistic.
    Values are NaN where a set is empty; CIs are NaN where fewer than two scenarios define them.
    """
    union = np.logical_or.reduce([s.mask for s in stats])
    u = np.flatnonzero(union)
    pts = np.array([np.asarray(p, dtype=np.float64)[u] for p in point])  # (c, U)
    rds = None if redraw is None else np.array([np.nan_to_num(np.asarray(r, dtype=np.float64)[u]) for r in redraw])
    masks = np.array([s.mask[u] for s in stats], dtype=np.float64)  # (q, U)
    w = np.array([s.weights for s in stats], dtype=np.float64)  # (q, c)
    unit = np.einsum("qc,cu->qu", w, np.nan_to_num(pts))  # each statistic's per-scenario value
    counts = masks.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = (unit * masks).sum(axis=1) / counts
    dist = np.full((len(stats), n_boot), np.nan)
    size = len(u)
    if size >= 2:
        batch = max(1, min(n_boot, _CELLS_PER_BATCH // size))
        done = 0
        while done < n_boot:
            nb = min(batch, n_boot - done)
            idx = rng.integers(0, size, size=(nb, size))
            if rds is None:
                ind = np.nan_to_num(pts)[:, idx]  # (c, nb, U)
            else:
                ind = np.stack([rng.random((nb, size)) < r[idx] for r in rds]).astype(np.float64)
            stat_units = np.einsum("qc,cbu->qbu", w, ind)
            m = masks[:, idx]  # (q, nb, U)
            with np.errstate(invalid="ignore", divide="ignore"):
                dist[:, done:done + nb] = (stat_units * m).sum(axis=2) / m.sum(axis=2)
            done += nb
    alpha = (1 - confidence) / 2
    out = []
    for i, s in enumerate(stats):
        d = dist[i][~np.isnan(dist[i])]
        n = int(counts[i])
        if n < 2 or len(d) < 2:
            low = high = se = float("nan")
        else:
            low, high = (float(x) for x in np.quantile(d, [alpha, 1 - alpha]))
            se = float(d.std(ddof=1))
        out.append(Result(s.name, n, float(values[i]) if n else float("nan"), low, high, se))
    return out
