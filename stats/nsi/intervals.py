"""Confidence intervals of a model's NSI on its pooled rates (the paper's unit, `measures.pooled_null`).

* ``pooled_cluster_ci``: Table 4's "scenario-cluster bootstrap of the observed NSI (hence centered on the
  observed, not the corrected, value)": dilemmas resampled with replacement, each resample's counts pooled
  per framing and eq. 2 taken on the pooled rates; ``scipy.stats.bootstrap`` (paired over the count
  columns, percentile interval).
* ``pooled_nested_ci``: the same statistic with a nested resample (dilemmas, then each cell's binary
  replies, a Binomial(n, k/n) redraw of its count), for units with few dilemmas (a model x domain has two,
  whose cluster bootstrap has three distinct resamples). Hand-written: no library does nested resampling.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats as sps

from stats.core.bootstrap import nested_binomial_draws, percentile_ci


def _complete(n: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = (n > 0).all(axis=1)
    return n[keep], k[keep]


def _pooled_range(ns: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Eq. 2 on pooled rates: counts (..., S, F) summed over S -> (...,)."""
    rates = ks.sum(axis=-2) / ns.sum(axis=-2)
    return rates.max(axis=-1) - rates.min(axis=-1)


def pooled_cluster_ci(n: np.ndarray, k: np.ndarray, rng: np.random.Generator, n_boot: int = 10_000,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile scenario-cluster CI of the pooled-rate NSI; ``n``, ``k``: (S, F) counts of the framings compared."""
    n, k = _complete(np.asarray(n), np.asarray(k))
    s, f = n.shape
    if s < 2:
        return float("nan"), float("nan")
    point = float(_pooled_range(n, k))
    if (n == n[0]).all() and (k == k[0]).all():
        return point, point

    def statistic(*cols, axis=-1):
        ns = np.stack(cols[:f], axis=-1)  # (..., S, F)
        ks = np.stack(cols[f:], axis=-1)
        return _pooled_range(ns, ks)

    data = tuple(n[:, j].astype(float) for j in range(f)) + tuple(k[:, j].astype(float) for j in range(f))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resample distributions: handled below
        res = sps.bootstrap(data, statistic, paired=True, vectorized=True, n_resamples=n_boot, method="percentile",
                            confidence_level=level, rng=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (point, point) if not (np.isfinite(lo) and np.isfinite(hi)) else (lo, hi)


def pooled_nested_ci(n: np.ndarray, k: np.ndarray, rng: np.random.Generator, n_boot: int = 4000,
                     level: float = 0.95) -> tuple[float, float]:
    """Nested CI of the pooled-rate NSI: dilemmas resampled, then each cell's replies (binomial redraw)."""
    draws = nested_binomial_draws(np.asarray(n), np.asarray(k), rng, n_boot)
    if draws is None:
        return float("nan"), float("nan")
    return percentile_ci(_pooled_range(*draws), level)


def ratio_sum_ci(num: np.ndarray, den: np.ndarray, weights, rng: np.random.Generator, n_boot: int = 10_000,
                 const: float = 0.0, level: float = 0.95) -> tuple[float, float, float]:
    """(value, CI low, CI high) of sum_j w_j * sum_s num_sj / sum_s den_sj + const, scenario-cluster bootstrap.

    ``num``, ``den``: (S, J) per-dilemma counts; dilemmas with a zero denominator anywhere are left out. A
    pooled rate, a contrast of pooled rates (weights 1, -1) or p0 + p1 - 1 (weights 1, 1, const -1), with
    the dilemmas resampled (``scipy.stats.bootstrap``, paired over the columns, percentile interval).
    """
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    keep = (den > 0).all(axis=1)
    num, den = num[keep], den[keep]
    w = np.asarray(weights, dtype=float)
    if num.shape[0] == 0:
        return float("nan"), float("nan"), float("nan")
    value = float(w @ (num.sum(0) / den.sum(0)) + const)
    if num.shape[0] < 2 or ((num == num[0]).all() and (den == den[0]).all()):
        return value, value, value
    j = num.shape[1]

    def statistic(*cols, axis=-1):
        nm = np.stack(cols[:j], axis=-1).sum(axis=-2)
        dn = np.stack(cols[j:], axis=-1).sum(axis=-2)
        return (nm / dn) @ w + const

    data = tuple(num[:, i] for i in range(j)) + tuple(den[:, i] for i in range(j))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap(data, statistic, paired=True, vectorized=True, n_resamples=n_boot, method="percentile",
                            confidence_level=level, rng=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (value, value, value) if not (np.isfinite(lo) and np.isfinite(hi)) else (value, lo, hi)
