"""The negation paper's hand-written measures (no maintained library has them): the NSI, its simulated
no-framing-effect null, the acquiescence index, and the effect sizes of the group test.

* NSI = max_f P_a^f - min_f P_a^f (eq. 2) over the framings compared.
* The null (``NULL_MODES``, declared with their descriptions in contract.NSI_NULLS), selectable by
  ``null_mode`` and recorded in every output. "No framing effect" says that a dilemma's endorsement rate
  does not depend on the framing; it does not say that a model's dilemmas share one rate.

  - ``dilemma-rates`` (the default): a model's NSI is eq. 2 on its endorsement rates pooled over its
    dilemmas (P_a^f = sum_s k_sf / sum_s n_sf, dilemmas with a parsed reply under every framing
    compared). Under no framing effect each dilemma keeps its own rate p_s (its replies pooled over the
    framings compared), each cell's n_sf observed replies are Binomial(n_sf, p_s), and each draw's NSI is
    eq. 2 on the draw's model-pooled rates, aggregated exactly as the observed one. Table 4: "'Corrected'
    subtracts the simulated null expectation E[NSI | no framing effect]"; sec. 4.4: "each model's observed
    NSI exceeding all 2,000 null simulations". Dilemmas far from 1/2 make a smaller null (Table 4's
    corrections for its least sensitive models are 0.022-0.032), and a framing whose replies fail to parse
    on some dilemmas moves the simulated pooled rate as it moves the observed one (composition).
  - ``common-rate``: the same NSI; the null draws each framing's N_f = sum_s n_sf replies as
    Binomial(N_f, p), p the model's rate pooled over dilemmas and framings. At about 420 replies per
    framing it cannot go below about 0.046 for p between 0.3 and 0.7, and it reads a change of the pooled
    rate by composition alone as a framing effect.
  - ``per-dilemma`` (a second reading, kept for comparison): a model's NSI is the mean over dilemmas of
    the per-dilemma NSI, and each dilemma's n_f replies are Binomial(n_f, p_s) with p_s that dilemma's
    rate; at 30 replies per cell its expectation is 3-4x Table 4's corrections.

  corrected = observed - expected; the one-sided p is (1 + #draws >= observed) / (1 + draws).
* Acquiescence p0 + p1 - 1 with p0, p1 the raw *agree* rates on F0, F1.
* epsilon^2 = H / (n - 1) and eta^2_H = (H - k + 1) / (n - k) of a Kruskal-Wallis H.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import FRAMINGS, NSI_NULLS
from stats.core.seeding import ENTROPY, rng_for

N_NULL = 2000
"""Simulated null draws (the paper's 2,000)."""
NULL_MODES = tuple(NSI_NULLS)
"""How a model's NSI and its null are computed (module docstring); the first is the default."""
DEFAULT_NULL = NULL_MODES[0]
POOLED_NSI = ("dilemma-rates", "common-rate")
"""The modes whose NSI is eq. 2 on the model-pooled rates (the others take the mean of per-dilemma NSI)."""


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
    """The model's NSI: of its pooled rates (POOLED_NSI modes) or the mean of its per-dilemma NSI (``per-dilemma``)."""
    expected: float
    """E[NSI | no framing effect] (mean of the null draws)."""
    corrected: float
    """observed - expected."""
    p_value: float
    """One-sided (1 + #draws >= observed) / (1 + draws)."""
    per_dilemma_expected: tuple
    """E[NSI | no effect] per dilemma (NaN where the dilemma's NSI is undefined; NaN throughout for POOLED_NSI)."""
    mode: str = "per-dilemma"
    """Which null (NULL_MODES)."""


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


def pooled_rates(n: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts (S, F) -> (pooled rate per framing, pooled valid replies per framing, dilemmas kept).

    Dilemmas without a parsed reply under every framing are left out, so that every framing's rate pools
    the same dilemmas.
    """
    keep = (n > 0).all(axis=1)
    n_f, k_f = n[keep].sum(axis=0), k[keep].sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(n_f > 0, k_f / np.maximum(n_f, 1), np.nan)
    return rates, n_f, keep


def _pooled_observed(n: np.ndarray, k: np.ndarray, framing_idx):
    """(selected counts of the dilemmas kept, pooled counts per framing, observed NSI) or None if none is kept."""
    n_sel, k_sel = n[:, framing_idx], k[:, framing_idx]
    rates, n_f, keep = pooled_rates(n_sel, k_sel)
    if not keep.any():
        return None
    return n_sel[keep], k_sel[keep], n_f, float(rates.max() - rates.min())


def _against(observed: float, draws: np.ndarray, n_rows: int, mode: str) -> NullResult:
    expected = float(draws.mean())
    p_value = (1 + int(np.sum(draws >= observed - 1e-12))) / (1 + len(draws))
    return NullResult(observed, expected, observed - expected, p_value, tuple([float("nan")] * n_rows), mode)


def _no_dilemma(n_rows: int, mode: str) -> NullResult:
    nan = float("nan")
    return NullResult(nan, nan, nan, nan, tuple([nan] * n_rows), mode)


def common_rate_null(n: np.ndarray, k: np.ndarray, framing_idx, rng: np.random.Generator, n_draws: int = N_NULL) -> NullResult:
    """The common-rate null for one model: eq. 2 on the model-pooled rates against Binomial(N_f, p) draws.

    ``n``, ``k``: (S, 4) counts; ``framing_idx`` selects the framings compared.
    """
    got = _pooled_observed(n, k, framing_idx)
    if got is None:
        return _no_dilemma(n.shape[0], "common-rate")
    _, k_kept, n_f, observed = got
    p = k_kept.sum() / n_f.sum()
    draws = null_nsi_draws(n_f, np.asarray(p), n_draws, rng)  # (B,)
    return _against(observed, draws, n.shape[0], "common-rate")


def dilemma_rates_draws(n_kept: np.ndarray, p_s: np.ndarray, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """(n_draws,) NSI of the model-pooled rates when each dilemma's ``n_kept`` (S, F) replies are
    Binomial(n_sf, p_s): no framing effect, every dilemma at its own rate, the observed cell sizes."""
    kk = rng.binomial(np.broadcast_to(n_kept, (n_draws,) + n_kept.shape),
                      np.broadcast_to(p_s[:, None], (n_draws,) + n_kept.shape))  # (B, S, F)
    rates = kk.sum(axis=1) / n_kept.sum(axis=0)  # (B, F): pooled over dilemmas as the observed P_a^f
    return rates.max(axis=1) - rates.min(axis=1)


def dilemma_rates_null(n: np.ndarray, k: np.ndarray, framing_idx, rng: np.random.Generator,
                       n_draws: int = N_NULL) -> NullResult:
    """The default null for one model: eq. 2 on the model-pooled rates against draws in which every
    dilemma keeps its own rate (pooled over the framings compared) and every cell its observed size.

    ``n``, ``k``: (S, 4) counts; ``framing_idx`` selects the framings compared.
    """
    got = _pooled_observed(n, k, framing_idx)
    if got is None:
        return _no_dilemma(n.shape[0], "dilemma-rates")
    n_kept, k_kept, _, observed = got
    p_s = k_kept.sum(axis=1) / n_kept.sum(axis=1)
    return _against(observed, dilemma_rates_draws(n_kept, p_s, n_draws, rng), n.shape[0], "dilemma-rates")


def nsi_null(n: np.ndarray, k: np.ndarray, framing_idx, rng: np.random.Generator, n_draws: int = N_NULL,
             mode: str = DEFAULT_NULL) -> NullResult:
    """A model's NSI against its null, by ``mode`` (NULL_MODES)."""
    if mode == "dilemma-rates":
        return dilemma_rates_null(n, k, framing_idx, rng, n_draws)
    if mode == "common-rate":
        return common_rate_null(n, k, framing_idx, rng, n_draws)
    if mode == "per-dilemma":
        return model_null(n, k, framing_idx, rng, n_draws)
    raise ValueError(f"null mode {mode!r}: expected one of {', '.join(NULL_MODES)}")
