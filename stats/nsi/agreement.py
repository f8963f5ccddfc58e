"""Agreement and proportion statistics for two raters (or a rater and a proxy/judge) on nominal labels.

Library-backed where a maintained implementation exists: Wilson intervals
(statsmodels ``proportion_confint(method='wilson')``), Cohen's kappa and F1 (scikit-learn), Krippendorff's
alpha (``krippendorff.alpha``, nominal). Gwet's AC1 has no maintained library and is written here
(Gwet 2008, two raters, nominal):

    AC1 = (p_a - p_e) / (1 - p_e),   p_e = 1/(q - 1) * sum_k pi_k (1 - pi_k),
    pi_k = (share of rater A's labels that are k + share of rater B's labels that are k) / 2,

with q the number of categories of the scale (the codebook's, not only the ones observed).

Every function takes plain sequences of labels (strings or ints) of equal length; items where either
label is missing (None/NaN) are dropped pairwise, and the number of items used is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import krippendorff
import numpy as np
import pandas as pd
from sklearn.metrics import cohen_kappa_score, f1_score
from statsmodels.stats.proportion import proportion_confint


@dataclass(frozen=True)
class Proportion:
    """A share with its Wilson interval."""

    k: int
    """Count of events."""
    n: int
    """Number of trials."""
    p: float
    """k / n (NaN when n = 0)."""
    ci_low: float
    """Lower end of the Wilson interval."""
    ci_high: float
    """Upper end of the Wilson interval."""


@dataclass(frozen=True)
class Agreement:
    """Two-rater agreement on one nominal axis."""

    n: int
    """Items labelled by both."""
    raw: float
    """Share of items with identical labels."""
    kappa: float
    """Cohen's kappa (scikit-learn)."""
    alpha: float
    """Krippendorff's alpha, nominal (krippendorff package)."""
    alpha_ci_low: float
    """Item-bootstrap percentile interval of alpha, lower end."""
    alpha_ci_high: float
    """Item-bootstrap percentile interval of alpha, upper end."""
    ac1: float
    """Gwet's AC1 (hand-written)."""


def wilson(k: int, n: int, level: float = 0.95) -> Proportion:
    """k of n with the Wilson score interval (statsmodels)."""
    k, n = int(k), int(n)
    if n <= 0:
        return Proportion(k, n, float("nan"), float("nan"), float("nan"))
    lo, hi = proportion_confint(k, n, alpha=1.0 - level, method="wilson")
    return Proportion(k, n, k / n, float(lo), float(hi))


def _pairs(a, b) -> tuple[np.ndarray, np.ndarray]:
    a = pd.Series(list(a), dtype=object)
    b = pd.Series(list(b), dtype=object)
    if len(a) != len(b):
        raise ValueError(f"label sequences differ in length ({len(a)} vs {len(b)})")
    keep = a.notna().to_numpy() & b.notna().to_numpy()
    # Re-infer one dtype (str or number) so scikit-learn sees plain labels, not an object array of ints.
    return np.array(a[keep].tolist()), np.array(b[keep].tolist())


def raw_agreement(a, b) -> float:
    """Share of items where both labels are equal (NaN when no item is labelled by both)."""
    x, y = _pairs(a, b)
    return float(np.mean(x == y)) if len(x) else float("nan")


def cohen_kappa(a, b, labels=None) -> float:
    """Cohen's kappa via scikit-learn; NaN when undefined (chance agreement is 1 or no items)."""
    x, y = _pairs(a, b)
    if len(x) == 0:
        return float("nan")
    cats = list(labels) if labels is not None else sorted(set(x) | set(y), key=str)
    pa = pd.Series(x).value_counts(normalize=True).reindex(cats, fill_value=0).to_numpy()
    pb = pd.Series(y).value_counts(normalize=True).reindex(cats, fill_value=0).to_numpy()
    if np.isclose(float(pa @ pb), 1.0):
        return float("nan")
    return float(cohen_kappa_score(x, y, labels=cats))


def gwet_ac1(a, b, categories=None) -> float:
    """Gwet's AC1 for two raters on a nominal scale of ``categories`` (default: the labels observed)."""
    x, y = _pairs(a, b)
    if len(x) == 0:
        return float("nan")
    cats = list(categories) if categories is not None else sorted(set(x) | set(y), key=str)
    unknown = (set(x) | set(y)) - set(cats)
    if unknown:
        raise ValueError(f"labels {sorted(map(str, unknown))} are not among the categories")
    q = len(cats)
    if q < 2:
        return float("nan")
    pa = float(np.mean(x == y))
    share_a = np.array([np.mean(x == c) for c in cats])
    share_b = np.array([np.mean(y == c) for c in cats])
    pi = (share_a + share_b) / 2.0
    pe = float(np.sum(pi * (1.0 - pi)) / (q - 1))
    return (pa - pe) / (1.0 - pe)


def _codes(x: np.ndarray, y: np.ndarray, cats) -> tuple[np.ndarray, list]:
    cats = list(cats) if cats is not None else sorted(set(x) | set(y), key=str)
    index = {c: i for i, c in enumerate(cats)}
    data = np.array([[index[v] for v in x], [index[v] for v in y]], dtype=float)
    return data, list(range(len(cats)))


def krippendorff_alpha(a, b, categories=None) -> float:
    """Krippendorff's alpha (nominal) via the krippendorff package; NaN when undefined."""
    x, y = _pairs(a, b)
    if len(x) < 2:
        return float("nan")
    data, domain = _codes(x, y, categories)
    if len(np.unique(data)) < 2:
        return float("nan")  # one value in all the data: expected disagreement is zero
    return float(krippendorff.alpha(reliability_data=data, value_domain=domain, level_of_measurement="nominal"))


def alpha_bootstrap_ci(a, b, categories=None, *, n_boot: int = 2000, rng: np.random.Generator, level: float = 0.95):
    """Item-bootstrap percentile interval of nominal alpha (items resampled with replacement)."""
    x, y = _pairs(a, b)
    if len(x) < 2:
        return float("nan"), float("nan")
    data, domain = _codes(x, y, categories)
    n = data.shape[1]
    idx = rng.integers(0, n, size=(n_boot, n))
    draws = []
    for row in idx:
        d = data[:, row]
        if len(np.unique(d)) < 2:
            continue
        draws.append(krippendorff.alpha(reliability_data=d, value_domain=domain, level_of_measurement="nominal"))
    if not draws:
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(np.asarray(draws), [tail, 100.0 - tail])
    return float(lo), float(hi)


def agreement(a, b, categories=None, *, n_boot: int = 2000, rng: np.random.Generator) -> Agreement:
    """All two-rater statistics on one axis."""
    x, y = _pairs(a, b)
    lo, hi = alpha_bootstrap_ci(x, y, categories, n_boot=n_boot, rng=rng)
    return Agreement(
        n=len(x),
        raw=raw_agreement(x, y),
        kappa=cohen_kappa(x, y, labels=categories),
        alpha=krippendorff_alpha(x, y, categories),
        alpha_ci_low=lo,
        alpha_ci_high=hi,
        ac1=gwet_ac1(x, y, categories),
    )


def macro_f1(gold, pred, labels=None) -> tuple[float, dict]:
    """Macro-F1 of ``pred`` against ``gold`` over ``labels`` (default: classes in either), and per-class F1.

    A class that the predictor never uses scores 0 (zero_division=0): that is the class collapse the
    negation paper's judge gate (macro-F1 >= 0.70) is built to expose.
    """
    x, y = _pairs(gold, pred)
    if len(x) == 0:
        return float("nan"), {}
    labels = list(labels) if labels is not None else sorted(set(x) | set(y), key=str)
    per = f1_score(x, y, labels=labels, average=None, zero_division=0)
    return float(np.mean(per)), {lab: float(v) for lab, v in zip(labels, per)}
