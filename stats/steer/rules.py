"""The rules of a steering verdict (pure; docs/steering.md). Each takes per-scenario arrays of one part of the split
and returns its estimate with an interval, and whether the rule holds:

- reduction: the paired-bootstrap interval (over scenarios) of mean E_steered / mean E0 lies below `threshold`
  (0.5: "halved"); the point estimate alone does not decide;
- did not move: a move (the twin's p_D, J0 in either cell, the known-gap control) is equivalent to 0 when its 90%
  paired-bootstrap interval lies inside (-margin, margin) (two one-sided tests at 5%);
- beyond the random band: the steered reduction of E exceeds the band's upper quantile (the 95th percentile of the
  random directions' reductions), not their maximum: the band is a quantile band, so it does not widen with the
  number of directions drawn;
- capability: the loss ratio under the steering is at most the random band's upper quantile of loss ratios;
- wrong way: the share of scenarios whose E rises under the steering, with a Wilson interval (reported);
- relative norm: |strength| x the direction's norm over the residual stream's mean norm at that depth (reported);
- pass rate over split seeds, with a Wilson interval.
The selection rule (`select_point`) picks the grid point on the selection part; the verdict is read elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from stats.core.bootstrap import scenario_bootstrap

SELECTION_RULE = ("the grid point (layer, strength) of the steered direction with the largest mean reduction of E "
                  "(E0 - E) on the selection part among those whose did-not-move checks (the twin's p_D, J0 in both "
                  "cells, the known-gap control: equivalence within the margin) pass there; ties: the weaker "
                  "strength, then the lower layer; none: no point is selected and the verdict fails")
"""The selection rule as the manifest records it before the run."""


@dataclass(frozen=True)
class Rules:
    """The verdict's parameters (recorded in the manifest before the run; `readout steer` options)."""

    threshold: float = 0.5
    """E_steered / E0 must lie below this over its whole interval (0.5: halved)."""
    margin: float = 0.05
    """Equivalence margin of the did-not-move checks."""
    confidence: float = 0.95
    """Level of the reduction's interval."""
    equivalence_confidence: float = 0.90
    """Level of the did-not-move intervals (two one-sided tests at (1 - level) / 2 each)."""
    random_quantile: float = 0.95
    """The random band's upper quantile the steered reduction must exceed."""

    def as_dict(self) -> dict:
        return {**asdict(self), "selection_rule": SELECTION_RULE}

    @classmethod
    def from_dict(cls, d: dict | None) -> Rules:
        d = d or {}
        return cls(**{k: float(d[k]) for k in asdict(cls()) if k in d})


def ratio_interval(e: np.ndarray, e0: np.ndarray, rng: np.random.Generator, n_boot: int,
                   confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean E / mean E0, low, high): the ratio of means with its paired percentile bootstrap interval over scenarios
    (a resample whose mean E0 is not positive has no ratio and is dropped). NaN where mean E0 is not positive."""
    e, e0 = np.asarray(e, float), np.asarray(e0, float)
    if len(e) == 0 or e0.mean() <= 0:
        return math.nan, math.nan, math.nan
    value, low, high, _ = scenario_bootstrap(
        np.column_stack([e, e0]), rng, n_boot, confidence=confidence,
        combine=lambda s: np.where(s[..., 1:2] > 0, s[..., 0:1] / np.where(s[..., 1:2] > 0, s[..., 1:2], 1.0), np.nan))
    return float(value[0]), float(low[0]), float(high[0])


def reduced(low: float, high: float, threshold: float) -> bool:
    """E's reduction is shown when the ratio's whole interval lies below `threshold`."""
    return bool(np.isfinite(high) and high < threshold)


def equivalence(moves: np.ndarray, rng: np.random.Generator, n_boot: int, margin: float = 0.05,
                confidence: float = 0.90) -> dict:
    """The mean move with its paired bootstrap interval at `confidence`, and `equivalent`: the interval lies inside
    (-margin, margin). No scenarios (e.g. no control reads): not equivalent."""
    m = np.asarray(moves, float)
    m = m[~np.isnan(m)]
    if len(m) == 0:
        return dict(value=math.nan, low=math.nan, high=math.nan, n=0, equivalent=False)
    value, low, high, _ = scenario_bootstrap(m[:, None], rng, n_boot, confidence=confidence)
    lo, hi = float(low[0]), float(high[0])
    if len(m) < 2:
        lo = hi = float(value[0])  # one scenario: no interval; its value is all there is
    return dict(value=float(value[0]), low=lo, high=hi, n=len(m), equivalent=bool(-margin < lo and hi < margin))


def quantile_band(values: np.ndarray, upper: float = 0.95) -> dict:
    """The random directions' band of a quantity: its (1 - upper) and `upper` quantiles and median (not min..max,
    which widens with every direction drawn), and how many directions it rests on."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return dict(low=math.nan, median=math.nan, high=math.nan, n=0)
    low, median, high = np.quantile(v, [1 - upper, 0.5, upper])
    return dict(low=float(low), median=float(median), high=float(high), n=len(v))


def beyond_band(reduction: float, band: dict) -> bool:
    """The steered reduction of E exceeds the random band's upper quantile (False without a band)."""
    return bool(band["n"] > 0 and reduction > band["high"])


def capability_kept(ratio: float, band: dict) -> bool:
    """The capability loss ratio under the steering is at most the random band's upper quantile of ratios."""
    return bool(band["n"] > 0 and np.isfinite(ratio) and ratio <= band["high"])


def wrong_way(e: np.ndarray, e0: np.ndarray, confidence: float = 0.95) -> dict:
    """The share of scenarios whose E rises under the steering (E - E0 > 0), with its Wilson interval."""
    d = np.asarray(e, float) - np.asarray(e0, float)
    n, k = len(d), int((d > 0).sum())
    if n == 0:
        return dict(share=math.nan, low=math.nan, high=math.nan, k=0, n=0)
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return dict(share=k / n, low=float(ci.low), high=float(ci.high), k=k, n=n)


def relative_norm(strength: float, direction_norm: float, residual_norm: float) -> float:
    """|strength| x the direction's norm over the residual stream's mean norm at that depth (NaN if unknown)."""
    if not residual_norm or not np.isfinite(residual_norm):
        return math.nan
    return abs(strength) * direction_norm / residual_norm


def pass_rate(passed: list[bool], confidence: float = 0.95) -> dict:
    """How many of the split seeds' verdicts pass, with a Wilson interval of the rate."""
    n, k = len(passed), int(sum(bool(p) for p in passed))
    if n == 0:
        return dict(passed=0, n=0, rate=math.nan, low=math.nan, high=math.nan)
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return dict(passed=k, n=n, rate=k / n, low=float(ci.low), high=float(ci.high))


def select_point(grid: list[dict]) -> dict | None:
    """SELECTION_RULE over `grid` (one dict per point of the steered direction on the selection part: layer,
    strength, reduction (mean E0 - E) and `kept` (every did-not-move check passes)); None when no point is kept."""
    kept = [g for g in grid if g["kept"] and np.isfinite(g["reduction"])]
    if not kept:
        return None
    return min(kept, key=lambda g: (-g["reduction"], abs(g["strength"]), g["layer"]))
