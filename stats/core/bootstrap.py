"""Every bootstrap of the stats layer, seeded by a Generator from `stats.core.seeding`.

- `scenario_bootstrap`: percentile bootstrap over scenarios of column means (or any function of column
  sums), all columns resampled with the same scenario indices, so differences of columns are paired
  (scipy.stats.bootstrap, vectorized over one B x S index matrix, gathered per column or turned into
  bincount weights); `estimates_from` turns its output into `Estimate` rows.
- `nested_majority`: the hand-written nested bootstrap (scenarios, then rollouts within scenario) for
  majority readouts, which no maintained library does.
- `simultaneous_band`: a band over many column means at once (studentized bootstrap, min-p calibrated;
  hand-written: no maintained library gives one), for claims about every column together ("E is 0 at every
  layer").
- `cluster_ci`: percentile CI of a mean over clusters (dilemmas) via scipy.stats.bootstrap.
- `nested_binomial_ci`: clusters, then each cell's binary replies (a binomial redraw of each cell's count).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import numpy as np
from scipy import stats as sps

from stats.core.estimate import Estimate, empty, make_estimate

#: Bootstrap resamples per matrix product; keeps the weight matrix near 4 M entries whatever S is.
_CELLS_PER_BATCH = 4_000_000


def _weights(idx: np.ndarray, n: int) -> np.ndarray:
    """Resampled index rows (nb, n) -> how often each scenario was drawn (nb, n), as floats."""
    nb = idx.shape[0]
    flat = (np.arange(nb)[:, None] * n + idx).ravel()
    return np.bincount(flat, minlength=nb * n).reshape(nb, n).astype(np.float64)


#: Up to this many columns, gathering each column through the index matrix beats building bincount
#: weights for a matrix product (measured: ~9 ms per column vs ~85 ms per 4 M-cell batch).
_GATHER_MAX_COLUMNS = 8


def _resampled_sums(idx: np.ndarray, x: np.ndarray, xt: np.ndarray) -> np.ndarray:
    """Column sums of x over each resampled index row: (nb, S) indices -> (nb, k)."""
    if x.shape[1] <= _GATHER_MAX_COLUMNS:
        return np.stack([np.take(col, idx).sum(axis=1) for col in xt], axis=-1)
    return _weights(idx, x.shape[0]) @ x


def scenario_bootstrap(
    columns: np.ndarray,
    rng: np.random.Generator,
    n_boot: int = 10_000,
    combine: Callable[[np.ndarray], np.ndarray] | None = None,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Percentile bootstrap over scenarios for column means, or any function of column sums.

    columns: (S, k) per-scenario values, S scenarios, k quantities, no NaN (restrict the set first).
    Every quantity is resampled with the same scenario indices, so differences of columns are paired.
    combine: maps column sums (..., k) to statistics (..., q); default: the k means. Sums (not means)
    are handed over so that ratio statistics on subsets (masked sums over masked counts) work too.
    Returns value, low, high, se, each of shape (q,). With S < 2 the CI and SE are NaN.

    scipy.stats.bootstrap does the resampling (seeded by rng) and the percentile interval; the
    statistic sums each column through the batch of resampled index rows (or, for many columns, turns
    the rows into bincount weights and takes one matrix product), so 10,000 resamples of 600
    scenarios cost about a hundredth of a second per column.
    """
    x = np.asarray(columns, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    s = x.shape[0]
    comb = combine if combine is not None else (lambda sums: sums / s)
    value = np.asarray(comb(x.sum(axis=0)), dtype=np.float64)
    if s < 2:
        nan = np.full(value.shape, np.nan)
        return value, nan, nan.copy(), nan.copy()

    xt = np.ascontiguousarray(x.T)

    def statistic(idx, axis=-1):
        idx = np.asarray(idx)
        if idx.ndim == 1:  # scipy's call on the observed sample
            return np.asarray(comb(x[idx].sum(axis=0)))
        out = np.asarray(comb(_resampled_sums(idx, x, xt)))  # (nb, q)
        return np.moveaxis(out, -1, 0)  # scipy wants the resample axis last

    batch = max(1, min(n_boot, _CELLS_PER_BATCH // s))
    with warnings.catch_warnings():
        # A column that is constant over scenarios (e.g. every twin judged identically) is a valid
        # answer here: its CI is a point. scipy warns about it; the report shows it as such.
        warnings.simplefilter("ignore", category=sps.DegenerateDataWarning)
        res = sps.bootstrap(
            (np.arange(s),),
            statistic,
            n_resamples=n_boot,
            batch=batch,
            vectorized=True,
            paired=False,  # the one "sample" is the scenario index, so all columns are paired
            axis=-1,
            confidence_level=confidence,
            method="percentile",
            rng=rng,
        )
    low = np.atleast_1d(np.asarray(res.confidence_interval.low, dtype=np.float64))
    high = np.atleast_1d(np.asarray(res.confidence_interval.high, dtype=np.float64))
    se = np.atleast_1d(np.asarray(res.standard_error, dtype=np.float64))
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64).reshape(len(value), -1)
    gaps = np.isnan(dist).any(axis=1) & ~np.isnan(value)
    if gaps.any():
        # A ratio over a subset (combine) is undefined in a replicate that drew none of the subset;
        # those replicates are dropped (the bootstrap conditional on the subset being drawn).
        alpha = (1 - confidence) / 2
        for i in np.flatnonzero(gaps):
            d = dist[i][~np.isnan(dist[i])]
            if len(d) >= 2:
                low[i], high[i] = np.quantile(d, [alpha, 1 - alpha])
                se[i] = d.std(ddof=1)
    return value, low, high, se


def estimates_from(
    analysis: str,
    subset: str,
    names: Sequence[str],
    columns: np.ndarray,
    rng: np.random.Generator,
    n_boot: int,
    notes: dict[str, str] | None = None,
) -> list[Estimate]:
    """Column means over one scenario set, jointly resampled, as Estimate rows (one per name)."""
    if isinstance(names, str):
        raise TypeError("names must be a sequence of quantity names, not one string")
    x = np.asarray(columns, dtype=np.float64).reshape(-1, len(names))
    n = x.shape[0]
    notes = notes or {}
    if n == 0:
        return [empty(analysis, name, subset, notes.get(name)) for name in names]
    value, low, high, se = scenario_bootstrap(x, rng, n_boot)
    return [
        make_estimate(analysis, name, subset, n, value[i], low[i], high[i], se[i],
                      f"scenario bootstrap ({n_boot})", notes.get(name))
        for i, name in enumerate(names)
    ]


def simultaneous_band(columns: np.ndarray, rng: np.random.Generator, n_boot: int = 10_000,
                      confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """A simultaneous band for the k column means of `columns` (S, k), paired over scenarios: the studentized
    bootstrap with single-step min-p calibration.

    se_j is column j's standard error (its sample standard deviation over sqrt(S)). Each resample draws S
    scenarios with replacement (one index row for every column) and studentizes each column's resampled mean by
    the resample's own standard error: t*_j = |mean*_j - mean_j| / se*_j (the bootstrap-t; Hall, 1992). A
    resample's p*_j is the share of resamples whose column j is at least as extreme; the common level a is the
    (1 - `confidence`) quantile over resamples of min_j p*_j; column j's critical value c_j is the (1 - a)
    quantile of its own t*_j, and its band is mean_j +- c_j * se_j (Westfall and Young, 1993, single-step min-p;
    applied to bands as in Montiel Olea and Plagborg-Moller, 2019). So the band covers every column's true mean
    at once with probability about `confidence`, where the columns' own 95% intervals, taken together, cover them
    all far less often; and a column whose resamples are heavy-tailed (one outlying scenario) widens its own band,
    not every column's (one critical value for all, max_j t*_j, lets such a column set the width everywhere).
    Coverage measured on planted data in tests/stats/core/test_simultaneous_band.py. A column with se 0 has a band
    of its point; a resample in which a column does not vary counts as 0 where its mean is the column's, infinite
    otherwise. Hand-written: no maintained library gives a simultaneous bootstrap band.
    Returns value, low, high (each (k,)) and the common level a; with S < 2, NaN bounds and level.
    """
    x = np.asarray(columns, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    s = x.shape[0]
    value = x.mean(axis=0)
    if s < 2:
        nan = np.full(value.shape, np.nan)
        return value, nan, nan.copy(), math.nan
    se = x.std(axis=0, ddof=1) / math.sqrt(s)
    live = se > 0
    if not live.any():
        return value, value.copy(), value.copy(), 1.0 - confidence
    m = int(live.sum())
    centred = x[:, live] - value[live]  # resampled moments of deviations: no cancellation against the mean's square
    both = np.column_stack([centred, centred**2])
    bt = np.ascontiguousarray(both.T)
    batch = max(1, min(n_boot, _CELLS_PER_BATCH // s))
    parts = []
    for done in range(0, n_boot, batch):
        sums = _resampled_sums(rng.integers(0, s, size=(min(batch, n_boot - done), s)), both, bt) / s
        shift, square = sums[:, :m], sums[:, m:]  # mean* - mean, and the resample's mean squared deviation from mean
        se_star = np.sqrt(np.maximum(square - shift**2, 0.0) / (s - 1))
        diff = np.abs(shift)
        with np.errstate(divide="ignore", invalid="ignore"):
            parts.append(np.where(se_star > 0, diff / se_star, np.where(diff > 1e-12 * se[live], np.inf, 0.0)))
    t = np.concatenate(parts)
    p = sps.rankdata(-t, axis=0, method="max") / len(t)  # the share of resamples at least as extreme, per column
    level = float(np.quantile(p.min(axis=1), 1.0 - confidence))
    crit = np.quantile(t, 1.0 - level, axis=0, method="higher")
    half = np.zeros_like(value)
    half[live] = crit * se[live]
    return value, value - half, value + half, level


def majority_prob_from_fraction(fraction: np.ndarray, k: np.ndarray) -> np.ndarray:
    """P(more than half of k resampled rollouts are violating) when each is violating w.p. fraction.

    Resampling k rollouts with replacement from a scenario whose rollouts are violating with
    (expected) share f gives a Binomial(k, f) count, whether the rollouts were observed draws or
    exact tempered probabilities; only the majority indicator matters, so it is Bernoulli with this.
    """
    k = np.asarray(k, dtype=np.int64)
    return sps.binom.sf(k // 2, k, np.clip(fraction, 0.0, 1.0))


def nested_majority(
    components: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, float]],
    rng: np.random.Generator,
    n_boot: int = 10_000,
    confidence: float = 0.95,
    extra: Sequence[Sequence[float]] = (),
) -> tuple[float, float, float, float] | list[tuple[float, float, float, float]]:
    """Nested bootstrap (scenarios, then rollouts within scenario) of a signed sum of majority rates.

    components: (majority_prob, violating_fraction, n_rollouts, sign) per readout, each (S,) over the
    same scenarios, which are resampled together (paired). The statistic is
    sum_c sign_c * mean_s(majority indicator of c). Point estimate: the exact majority probabilities
    (Poisson-binomial, from the tables). Each replicate first draws S scenarios with replacement, then
    for each drawn scenario re-draws its k rollouts from its own rollouts, which flips a majority near
    a 0.5 fraction: the widening the paper's bias audit (Table 4) names.
    extra: further sign vectors (one weight per component) whose statistics come from the same draws,
    e.g. the null alone beside the paired excess; then a list of results is returned, the signed sum
    first.
    Returns value, low, high, se (CI and se NaN when S < 2).
    """
    weights = np.array([[sign for *_, sign in components], *extra], dtype=np.float64)  # (q, c)
    s = len(components[0][0])
    values = [float(w @ [np.mean(mp) for mp, *_ in components]) if s else math.nan for w in weights]
    if s < 2:
        res = [(v, math.nan, math.nan, math.nan) for v in values]
        return res if len(extra) else res[0]
    probs = [majority_prob_from_fraction(f, k) for _, f, k, _ in components]
    batch = max(1, min(n_boot, _CELLS_PER_BATCH // s))
    rates = np.empty((len(components), n_boot))
    done = 0
    while done < n_boot:
        nb = min(batch, n_boot - done)
        idx = rng.integers(0, s, size=(nb, s))
        for c, m in enumerate(probs):
            rates[c, done:done + nb] = (rng.random((nb, s)) < np.take(m, idx)).mean(axis=1)
        done += nb
    alpha = (1 - confidence) / 2
    res = []
    for v, w in zip(values, weights):
        dist = w @ rates
        low, high = np.quantile(dist, [alpha, 1 - alpha])
        res.append((v, float(low), float(high), float(dist.std(ddof=1))))
    return res if len(extra) else res[0]


def percentile_ci(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap draws (non-finite draws left out; NaN when none is left)."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(draws, [tail, 100.0 - tail])
    return float(lo), float(hi)


def cluster_ci(values, rng: np.random.Generator, n_boot: int = 10_000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over clusters (e.g. dilemmas), via ``scipy.stats.bootstrap``.

    Non-finite values are left out; fewer than two left gives NaN; a constant sample gives a point.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return float("nan"), float("nan")
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap((x,), np.mean, n_resamples=n_boot, method="percentile", confidence_level=level,
                        rng=rng, vectorized=True)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def nested_binomial_ci(n: np.ndarray, k: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray],
                       rng: np.random.Generator, n_boot: int = 2000, level: float = 0.95) -> tuple[float, float]:
    """Nested bootstrap CI: clusters resampled, then each cell's binary replies.

    ``n``, ``k``: (S, F) reply and event counts per cluster and cell; clusters with an empty cell are left
    out. Resampling a cell's n binary replies with replacement is a Binomial(n, k/n) draw of its count.
    ``statistic`` maps the resampled rates (B, S, F) to one value per replicate (B,).
    """
    draws = nested_binomial_draws(n, k, rng, n_boot)
    if draws is None:
        return float("nan"), float("nan")
    nn, kk = draws
    return percentile_ci(statistic(kk / nn), level)


def nested_binomial_draws(n: np.ndarray, k: np.ndarray, rng: np.random.Generator,
                          n_boot: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The resampled counts (nn, kk), each (B, S, F), of `nested_binomial_ci`'s nested resample (for statistics
    of counts rather than rates); None when no cluster has every cell."""
    keep = (n > 0).all(axis=1)
    n, k = n[keep], k[keep]
    s = n.shape[0]
    if s == 0:
        return None
    idx = rng.integers(0, s, size=(n_boot, s))
    nn = n[idx]
    return nn, rng.binomial(nn, k[idx] / nn)
