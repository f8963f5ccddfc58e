"""NSI per model x dilemma, per model (the paper's Table 4) and per model x domain (Tables 3 and 7), with
the null correction, cluster or nested CIs and audit tiers; and the temperature ablation (Appendix B).

A model's (or a model x domain's) NSI depends on the null mode (`measures.NULL_MODES`, recorded in the
``null`` column): ``dilemma-rates`` (the default) and ``common-rate`` take eq. 2 on the rates pooled over
the unit's dilemmas and correct it with their null (`measures`); ``per-dilemma`` takes the mean of the
per-dilemma NSI with the per-dilemma null. Both values are always reported (``nsi_pooled``, ``nsi_dilemma_mean``). CIs of a model's
NSI are percentile scenario-cluster bootstraps (dilemmas resampled), centred on the observed value as in
Table 4; a model x domain has only two dilemmas, whose cluster bootstrap has three distinct resamples, so
its CI is nested (dilemmas, then replies within each cell). The null's one-sided p is Bonferroni-adjusted
over the models read (sec. 4.4: "each surviving Bonferroni correction across the 16 tests"; statsmodels
``multipletests``). Tiers: ``tier`` is Table 6/7's band of the point estimate (sec. 5.2 places models by
their observed NSI), ``tier_conservative_ci`` the band of the CI's upper end. The temperature ablation
compares the NSI of the greedy (T = 0) replies with the sampled one, per model on the dilemmas where both
are defined, with a paired cluster-bootstrap CI of the difference, and both response-pooled values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from contract import FRAMINGS
from stats.core.bootstrap import cluster_ci, nested_binomial_ci
from stats.core.seeding import ENTROPY, rng_for
from stats.nsi.cells import ALL_IDX, PAIR_IDX, Cells, build_cells, greedy
from stats.nsi.intervals import pooled_cluster_ci, pooled_nested_ci
from stats.nsi.measures import DEFAULT_NULL, POOLED_NSI, acquiescence_index, model_null, nsi_array, nsi_from_rates, nsi_null, pooled_rates
from stats.nsi.tiers import TABLE6, domain_bands, tier_on_ci

N_BOOT = 10_000
"""Bootstrap resamples of the cluster CIs."""


def mean_nsi(rates: np.ndarray) -> np.ndarray:
    """Mean over dilemmas of the per-dilemma NSI: rates (B, S, F) -> (B,)."""
    return nsi_array(rates).mean(axis=1)


def scenario_table(cells: Cells, groups: dict | None, seed: int, n_null: int) -> pd.DataFrame:
    """One row per model x dilemma: rates per framing, NSI, polarity NSI, null expectations."""
    rates, agree = cells.rates, cells.agree_rates
    rows = []
    for m_i, model in enumerate(cells.models):
        null4 = model_null(cells.n[m_i], cells.k[m_i], ALL_IDX, rng_for(seed, "null", model, "all", mix=ENTROPY), n_null)
        null2 = model_null(cells.n[m_i], cells.k[m_i], PAIR_IDX, rng_for(seed, "null", model, "pair", mix=ENTROPY), n_null)
        for s_i, dil in enumerate(cells.dilemmas):
            r = rates[m_i, s_i]
            row = {"model": model, "group": (groups or {}).get(model), "dilemma_id": dil, "domain": cells.domains[s_i]}
            for f_i, f in enumerate(FRAMINGS):
                row[f"n_{f}"] = int(cells.n[m_i, s_i, f_i])
                row[f"endorse_{f}"] = r[f_i]
            for f_i, f in enumerate(FRAMINGS):
                row[f"agree_{f}"] = agree[m_i, s_i, f_i]
            row["nsi"] = nsi_from_rates(r)
            row["nsi_null"] = null4.per_dilemma_expected[s_i]
            row["nsi_corrected"] = row["nsi"] - row["nsi_null"]
            row["nsi_01"] = nsi_from_rates(r[PAIR_IDX])
            row["nsi_01_null"] = null2.per_dilemma_expected[s_i]
            row["acquiescence"] = acquiescence_index(*agree[m_i, s_i, PAIR_IDX])
            rows.append(row)
    return pd.DataFrame(rows)


def _observed_ci(n, k, rates, idx, rng, n_boot, mode):
    """Scenario-cluster CI of the observed NSI over framings ``idx``, in the unit of ``mode``."""
    if mode in POOLED_NSI:
        return pooled_cluster_ci(n[:, idx], k[:, idx], rng, n_boot)
    return cluster_ci(nsi_array(rates[:, idx]), rng, n_boot)


def model_table(cells: Cells, groups: dict | None, seed: int, n_null: int, n_boot: int,
                null_mode: str = DEFAULT_NULL) -> pd.DataFrame:
    """Table 4: per model, observed and corrected NSI (all four and F0/F1) with scenario-cluster CIs."""
    rates = cells.rates
    rows = []
    for m_i, model in enumerate(cells.models):
        n, k = cells.n[m_i], cells.k[m_i]
        per4 = nsi_array(rates[m_i])
        null4 = nsi_null(n, k, ALL_IDX, rng_for(seed, "null", model, "all", mix=ENTROPY), n_null, null_mode)
        null2 = nsi_null(n, k, PAIR_IDX, rng_for(seed, "null", model, "pair", mix=ENTROPY), n_null, null_mode)
        lo4, hi4 = _observed_ci(n, k, rates[m_i], ALL_IDX, rng_for(seed, "boot", model, "all", mix=ENTROPY), n_boot, null_mode)
        lo2, hi2 = _observed_ci(n, k, rates[m_i], PAIR_IDX, rng_for(seed, "boot", model, "pair", mix=ENTROPY), n_boot, null_mode)
        pooled, _, keep = pooled_rates(n, k)
        call = tier_on_ci(null4.observed, lo4, hi4, TABLE6)
        rows.append({
            "model": model, "group": (groups or {}).get(model), "null": null_mode,
            "nsi": null4.observed, "nsi_corrected": null4.corrected, "nsi_ci_low": lo4, "nsi_ci_high": hi4,
            "nsi_null": null4.expected, "p_null": null4.p_value,
            "nsi_01": null2.observed, "nsi_01_corrected": null2.corrected, "nsi_01_ci_low": lo2, "nsi_01_ci_high": hi2,
            "nsi_01_null": null2.expected, "p_null_01": null2.p_value,
            "nsi_pooled": nsi_from_rates(pooled) if keep.any() else float("nan"),
            "nsi_dilemma_mean": float(np.nanmean(per4)) if np.isfinite(per4).any() else float("nan"),
            "tier": call.tier, "tier_conservative_ci": call.tier_conservative, "tier_range": call.tier_range,
            "n_dilemmas": int(np.isfinite(per4).sum()), "n_replies": int(n.sum()),
        })
    df = pd.DataFrame(rows).sort_values("nsi", ascending=False, kind="stable").reset_index(drop=True)
    df = bonferroni_over(df, np.ones(len(df), dtype=bool))
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    return df


def bonferroni_over(df: pd.DataFrame, family: np.ndarray) -> pd.DataFrame:
    """The null tests' p values Bonferroni-adjusted over the models in `family` (sec. 4.4: "across the 16 tests",
    the models kept by the 80% compliance rule); a model outside the family gets NaN."""
    df = df.copy()
    for col in ("p_null", "p_null_01"):
        adjusted = np.full(len(df), np.nan)
        adjusted[family] = _bonferroni(df[col].to_numpy(dtype=float)[family])
        df[f"{col}_bonferroni"] = adjusted
    return df


def _bonferroni(p: np.ndarray) -> np.ndarray:
    """Bonferroni over the finite p values (statsmodels); NaN stays NaN."""
    out = np.full(p.shape, np.nan)
    fin = np.isfinite(p)
    if fin.any():
        out[fin] = multipletests(p[fin], method="bonferroni")[1]
    return out


def _domain_nsi(n, k, rates, rng_null, rng_ci, n_null, n_boot, mode):
    """(observed, corrected, CI low, CI high, F0/F1 observed) of one model x domain, in the unit of ``mode``."""
    null = nsi_null(n, k, ALL_IDX, rng_null, n_null, mode)
    if mode in POOLED_NSI:
        lo, hi = pooled_nested_ci(n, k, rng_ci, min(n_boot, 4000))
        pr, _, keep = pooled_rates(n[:, PAIR_IDX], k[:, PAIR_IDX])
        nsi01 = nsi_from_rates(pr) if keep.any() else float("nan")
        return null.observed, null.corrected, lo, hi, nsi01
    lo, hi = nested_binomial_ci(n, k, mean_nsi, rng_ci, min(n_boot, 4000))
    per2 = nsi_array(rates[:, PAIR_IDX])
    nsi01 = float(np.nanmean(per2)) if np.isfinite(per2).any() else float("nan")
    return null.observed, null.corrected, lo, hi, nsi01


def model_domain_table(cells: Cells, groups: dict | None, seed: int, n_null: int, n_boot: int,
                       null_mode: str = DEFAULT_NULL) -> pd.DataFrame:
    """Per model x domain: NSI over the domain's dilemmas, null-corrected, nested CI, Table 7 tier."""
    rates = cells.rates
    domains = list(dict.fromkeys(cells.domains))
    rows = []
    for m_i, model in enumerate(cells.models):
        for dom in domains:
            sel = [i for i, d in enumerate(cells.domains) if d == dom]
            n, k = cells.n[m_i][sel], cells.k[m_i][sel]
            per = nsi_array(rates[m_i][sel])
            obs, corr, lo, hi, nsi01 = _domain_nsi(
                n, k, rates[m_i][sel], rng_for(seed, "null", model, "domain", dom, mix=ENTROPY),
                rng_for(seed, "nested", model, dom, mix=ENTROPY), n_null, n_boot, null_mode)
            bands = domain_bands(dom)
            call = tier_on_ci(obs, lo, hi, bands)
            rows.append({
                "model": model, "group": (groups or {}).get(model), "domain": dom, "null": null_mode,
                "nsi": obs, "nsi_corrected": corr, "nsi_ci_low": lo, "nsi_ci_high": hi, "nsi_01": nsi01,
                "tier": call.tier, "tier_conservative_ci": call.tier_conservative, "tier_range": call.tier_range,
                "bands": f"A<{bands.a_below:.2f}, C>={bands.c_from:.2f}",
                "n_dilemmas": int(np.isfinite(per).sum()),
            })
    return pd.DataFrame(rows)


TABLE3_RISK = {"financial": "High", "military": "High", "business": "High", "legal": "Moderate", "science": "Moderate",
               "education": "Moderate", "medical": "Lower"}
"""Table 3's "Risk Level" column as published. The paper gives no rule that derives it from the mean NSI
(education 0.37 is "Moderate", medical 0.36 "Lower"), so it is carried as the paper's label, not computed."""


def domain_table(model_domain: pd.DataFrame) -> pd.DataFrame:
    """Table 3: mean NSI per domain over models, sorted from most to least sensitive, with the paper's risk label."""
    g = model_domain.groupby("domain").agg(
        nsi=("nsi", "mean"), nsi_corrected=("nsi_corrected", "mean"), nsi_01=("nsi_01", "mean"),
        nsi_min=("nsi", "min"), nsi_max=("nsi", "max"), n_models=("model", "nunique"),
    )
    out = g.sort_values("nsi", ascending=False).reset_index()
    out.insert(1, "null", model_domain["null"].iloc[0] if "null" in model_domain and len(model_domain) else None)
    out["risk_level_paper"] = [TABLE3_RISK.get(str(d).lower()) for d in out["domain"]]
    return out


def temperature_table(replies: pd.DataFrame, sampled_cells: Cells, seed: int, n_boot: int) -> pd.DataFrame:
    """NSI at T = 0 (greedy replies) against the sampled NSI, per model, on shared dilemmas."""
    greedy_replies = greedy(replies)
    if greedy_replies.empty:
        return pd.DataFrame()
    gc = build_cells(greedy_replies, models=sampled_cells.models, dilemmas=sampled_cells.dilemmas)
    rows = []
    for m_i, model in enumerate(sampled_cells.models):
        g = nsi_array(gc.rates[m_i])
        s = nsi_array(sampled_cells.rates[m_i])
        both = np.isfinite(g) & np.isfinite(s)
        if not both.any():
            continue
        lo, hi = cluster_ci(g[both] - s[both], rng_for(seed, "boot", model, "temperature", mix=ENTROPY), n_boot)
        gn, sn = gc.n[m_i][both], sampled_cells.n[m_i][both]
        gk, sk = gc.k[m_i][both], sampled_cells.k[m_i][both]
        rows.append({
            "model": model, "n_dilemmas": int(both.sum()),
            "nsi_t0": float(g[both].mean()), "nsi_sampled": float(s[both].mean()),
            "diff": float((g[both] - s[both]).mean()), "diff_ci_low": lo, "diff_ci_high": hi,
            "nsi_pooled_t0": nsi_from_rates(gk.sum(0) / np.maximum(gn.sum(0), 1)),
            "nsi_pooled_sampled": nsi_from_rates(sk.sum(0) / np.maximum(sn.sum(0), 1)),
        })
    return pd.DataFrame(rows)
