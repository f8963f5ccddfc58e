"""The negation statistics on the continuous readout, this project's extension (the paper leaves token
probabilities to future work, sec. 6): p_endorse, the exact probability of the endorsing answer at the
decision field (no sampling, hence no null correction). NSI per model (mean over dilemmas of the
per-dilemma NSI, since there are no reply counts to pool) with cluster CIs beside the binary NSI, NSI per
model x domain, and the continuous p0, p1 of the acquiescence figure. Not tiered: Tables 6-7's bands were
set on sampled binary NSI, and a probability's NSI is on another scale.

Read at two settings: T = 1 (the full softmax, ``p_endorse``) and the run's sampling settings (T 0.7, top-p
0.95 under the paper profile, ``p_endorse_tempered``: the probability that a sampled first token starts the
word, normalized over the two words). Runs written before the second reading are reported at T = 1 only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from stats.core.bootstrap import cluster_ci
from stats.core.seeding import ENTROPY, rng_for
from stats.nsi.cells import PAIR_IDX, Cells, continuous_arrays
from stats.nsi.measures import nsi_array

TEMPERED = "_tempered"
"""The column suffix of the reading at the sampling settings (contract.tables.NSI_TEMPERED)."""
CONTINUOUS_COLUMNS = ("model", "nsi_continuous", "ci_low", "ci_high", "nsi_01_continuous", "acquiescence_continuous",
                      "nsi_binary", "spearman_per_dilemma", "n_dilemmas")
"""The columns of nsi_continuous; nsi_continuous_tempered adds SETTINGS_COLUMNS. An empty table keeps them."""
SETTINGS_COLUMNS = ("temperature", "top_p")
DOMAIN_COLUMNS = ("model", "domain", "nsi", "nsi_01", "n_dilemmas")
"""The columns of nsi_continuous_domain (an empty table keeps them: no model x domain with a finite read)."""
POINT_COLUMNS = ("model", "p0", "p1")


def continuous_table(cont: pd.DataFrame, cells: Cells, models_tab: pd.DataFrame, seed: int, n_boot: int,
                     suffix: str = "") -> pd.DataFrame:
    """Per model: NSI on p_endorse (all four, F0/F1) with cluster CIs, next to the binary NSI (untiered).

    ``suffix`` "_tempered": the same on p_endorse_tempered, the reading at the run's sampling settings (their
    temperature and top-p as columns); models whose run has no such reading are left out."""
    pe, pa = continuous_arrays(cont, cells, suffix)
    binary = models_tab.set_index("model")
    rows = []
    for m_i, model in enumerate(cells.models):
        per4 = nsi_array(pe[m_i])
        if not np.isfinite(per4).any():
            continue
        per2 = nsi_array(pe[m_i][:, PAIR_IDX])
        lo, hi = cluster_ci(per4, rng_for(seed, "boot", model, "continuous" + suffix, mix=ENTROPY), n_boot)
        p0s, p1s = (pa[m_i, :, i] for i in PAIR_IDX)
        both = np.isfinite(p0s) & np.isfinite(p1s)
        b4 = nsi_array(cells.rates[m_i])
        pair = np.isfinite(b4) & np.isfinite(per4)
        rho = sps.spearmanr(b4[pair], per4[pair]).statistic if pair.sum() > 2 and np.ptp(b4[pair]) > 0 and np.ptp(per4[pair]) > 0 else np.nan
        rows.append({
            "model": model, "nsi_continuous": float(np.nanmean(per4)), "ci_low": lo, "ci_high": hi,
            "nsi_01_continuous": float(np.nanmean(per2)) if np.isfinite(per2).any() else np.nan,
            "acquiescence_continuous": float(np.mean(p0s[both] + p1s[both] - 1.0)) if both.any() else np.nan,
            "nsi_binary": float(binary.loc[model, "nsi"]) if model in binary.index else np.nan,
            "spearman_per_dilemma": float(rho),
            "n_dilemmas": int(np.isfinite(per4).sum()),
            **(_settings(cont, model) if suffix else {}),
        })
    return pd.DataFrame(rows, columns=list(CONTINUOUS_COLUMNS + (SETTINGS_COLUMNS if suffix else ())))


def _settings(cont: pd.DataFrame, model: str) -> dict:
    """The temperature and top-p of a model's tempered reading (one setting per model: a run has one profile)."""
    mine = cont[cont["model"] == model]
    return dict(zip(SETTINGS_COLUMNS, (float(mine["tempered_temperature"].iloc[0]), float(mine["tempered_top_p"].iloc[0]))))


def continuous_domain_table(cont: pd.DataFrame, cells: Cells) -> pd.DataFrame:
    """Per model x domain: NSI on p_endorse (mean over the domain's dilemmas), untiered."""
    pe, _ = continuous_arrays(cont, cells)
    rows = []
    for m_i, model in enumerate(cells.models):
        for dom in dict.fromkeys(cells.domains):
            sel = [i for i, d in enumerate(cells.domains) if d == dom]
            per = nsi_array(pe[m_i][sel])
            if not np.isfinite(per).any():
                continue
            v = float(np.nanmean(per))
            rows.append({"model": model, "domain": dom, "nsi": v,
                         "nsi_01": float(np.nanmean(nsi_array(pe[m_i][sel][:, PAIR_IDX]))),
                         "n_dilemmas": int(np.isfinite(per).sum())})
    return pd.DataFrame(rows, columns=list(DOMAIN_COLUMNS))


def continuous_points(cont: pd.DataFrame, cells: Cells) -> pd.DataFrame:
    """Per model: continuous p0, p1 (mean p_agree on F0, F1 over dilemmas) for the acquiescence figure."""
    _, pa = continuous_arrays(cont, cells)
    rows = []
    for m_i, model in enumerate(cells.models):
        p0s, p1s = (pa[m_i, :, i] for i in PAIR_IDX)
        both = np.isfinite(p0s) & np.isfinite(p1s)
        if both.any():
            rows.append({"model": model, "p0": float(p0s[both].mean()), "p1": float(p1s[both].mean())})
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))
