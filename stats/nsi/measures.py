"""The negation paper's hand-written measures (no maintained library has them): the NSI, its simulated
no-framing-effect null, the acquiescence index, and the effect sizes of the group test.

* NSI = max_f P_a^f - min_f P_a^f (eq. 2) over the framings compared.
* Null: under no framing effect, each framing's n_f valid replies in a dilemma are Binomial(n_f, p) with p
  the dilemma's rate pooled over the framings compared; seeded draws give E[NSI | no effect] per dilemma
  and, averaged over dilemmas, per model. corrected = observed - expected; the one-sided p is
  (1 + #draws >= observed) / (1 + draws).
* Acquiescence p0 + p1 - 1 with p0, p1 the raw *agree* rates on F0, F1.
* epsilon^2 = H / (n - 1) and eta^2_H = (H - k + 1) / (n - k) of a Kruskal-Wallis H.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import FRAMINGS
from stats.core.seeding import ENTROPY, rng_for

N_NULL = 2000
"""Simulated null draws (the paper's 2,000)."""


def nsi_from_rates(rates, framings=FRAMINGS) -> float:
    """NSI = max - min of the endorsement rates over ``framings`` (eq. 2); NaN if any rate is missing.

    ``rates`` maps framing -> rate, or is a sequence in ``framings`` order.
    """
    if isinstance(rates, dict):
        vals = np.array([rates.get(f, np.nan) for f in framings], dtype=float)
    else:
        vals = np.asarray(rates, dtype=float)
    if vals.size == 0 or np.isnan(vals).any():
        return float("nan")
    return float(vals.max() - vals.min())


def nsi_array(rates: np.ndarray) -> np.ndarray:
    """NSI over the last axis of an array of rates; NaN wherever a rate is NaN."""
    rates = np.asarray(rates, dtype=float)
    out = rates.max(axis=-1) - rates.min(axis=-1)
    return np.where(np.isnan(rates).any(axis=-1), np.nan, out)


def acquiescence_index(p0: float, p1: float) -> float:
    """p0 + p1 - 1 from the raw agree rates on "should X" (p0) and "should not X" (p1) (sec. 4.2)."""
    return float(p0) + float(p1) - 1.0


def acquiescence_from_endorsement(e0: float, e1: float) -> float:
    """The same index from endorsement rates: p0 = e0 and p1 = 1 - e1, so p0 + p1 - 1 = e0 - e1."""
    return acquiescence_index(e0, 1.0 - float(e1))


def null_nsi_draws(n: np.ndarray, p: np.ndarray, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """NSI under no framing effect: ``n`` (..., F) valid replies per framing, ``p`` (...) the common rate.

    Returns (n_draws, ...) draws of max_f - min_f of Binomial(n_f, p) / n_f. Cells with n_f = 0 give NaN.
    """
    n = np.asarray(n, dtype=np.int64)
    p = np.broadcast_to(np.asarray(p, dtype=float), n.shape[:-1])
    if (n < 0).any():
        raise ValueError("negative counts")
    pp = np.where(np.isfinite(p), np.clip(p, 0.0, 1.0), 0.0)[..., None]
    k = rng.binomial(np.broadcast_to(n, (n_draws,) + n.shape), np.broadcast_to(pp, (n_draws,) + n.shape))
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(n > 0, k / np.maximum(n, 1), np.nan)
    out = nsi_array(rates)
    return np.where(np.isfinite(p), out, np.nan)


def expected_null_nsi(n_per_framing, p: float, n_draws: int = N_NULL, seed: int = 0) -> float:
    """E[NSI | no framing effect] for one cell set: Monte Carlo with ``n_draws`` seeded draws."""
    draws = null_nsi_draws(np.asarray(n_per_framing), np.asarray(p), n_draws, rng_for(seed, mix=ENTROPY))
    return float(np.nanmean(draws))


def epsilon_squared(h: float, n: int) -> float:
    """Epsilon squared of a Kruskal-Wallis H: H / ((n^2 - 1) / (n + 1)) = H / (n - 1) (Tomczak & Tomczak 2014)."""
    return float(h) / (n - 1) if n > 1 else float("nan")


def eta_squared_h(h: float, n: int, k: int) -> float:
    """eta^2_H = (H - k + 1) / (n - k): the paper's 'epsilon^2 = 0.46' for H = 7.96, n = 16, k = 3."""
    return (float(h) - k + 1) / (n - k) if n > k else float("nan")


@dataclass(frozen=True)
class NullResult:
    """Observed NSI of one model against its simulated no-framing-effect null."""

    observed: float
    """Mean over dilemmas of the per-dilemma NSI."""
    expected: float
    """E[NSI | no framing effect] (mean of the null draws)."""
    corrected: float
    """observed - expected."""
    p_value: float
    """One-sided (1 + #draws >= observed) / (1 + draws)."""
    per_dilemma_expected: tuple
    """E[NSI | no effect] per dilemma (NaN where the dilemma's NSI is undefined)."""


def model_null(n: np.ndarray, k: np.ndarray, framing_idx, rng: np.random.Generator, n_draws: int = N_NULL) -> NullResult:
    """Null correction for one model: ``n``, ``k`` are (S, 4) counts; ``framing_idx`` selects the framings."""
    n_sel = n[:, framing_idx]
    k_sel = k[:, framing_idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(n_sel > 0, k_sel / np.maximum(n_sel, 1), np.nan)
        pooled = np.where(n_sel.sum(1) > 0, k_sel.sum(1) / np.maximum(n_sel.sum(1), 1), np.nan)
    obs_s = nsi_array(rates)
    defined = np.isfinite(obs_s)
    if not defined.any():
        nan = float("nan")
        return NullResult(nan, nan, nan, nan, tuple([nan] * len(obs_s)))
    draws = null_nsi_draws(n_sel[defined], pooled[defined], n_draws, rng)  # (B, S_def)
    per = np.full(len(obs_s), np.nan)
    per[defined] = draws.mean(axis=0)
    model_draws = draws.mean(axis=1)
    observed = float(obs_s[defined].mean())
    expected = float(model_draws.mean())
    p = (1 + int(np.sum(model_draws >= observed - 1e-12))) / (1 + n_draws)
    return NullResult(observed, expected, observed - expected, p, tuple(per))
