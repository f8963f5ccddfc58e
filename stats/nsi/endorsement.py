"""Endorsement rates by framing (per model and per group, the paper's Table 2), acquiescence p0 + p1 - 1
(sec. 4.2), inter-model agreement by framing (sec. 4.1) and the parse outcomes (Appendix C.4).

* endorsement a = d XOR neg(f), d = 1 for "agree", neg(f) = 1 for the negated framings (eq. 1).
* Acquiescence p0 + p1 - 1 with p0, p1 the raw *agree* rates on F0, F1: a coherent responder has 0, negative
  values are negation-blind under-flipping, positive ones over-flipping. Since p0 = P_a^F0 and
  p1 = 1 - P_a^F1, it equals P_a^F0 - P_a^F1: the signed polarity NSI.
* Inter-model agreement: over model pairs and shared dilemmas, the probability that a reply of one model
  and a reply of the other carry the same endorsement, r_i r_j + (1 - r_i)(1 - r_j); also the agreement of
  the two models' majority labels (ties left out).
"""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import pandas as pd

from contract import FRAMINGS, NEGATED, POLARITY_PAIR
from stats.core.bootstrap import cluster_ci
from stats.core.seeding import ENTROPY, rng_for
from stats.nsi.cells import AFF_IDX, NEG_IDX, PAIR_IDX, Cells
from stats.nsi.measures import acquiescence_from_endorsement, acquiescence_index, nsi_from_rates


def endorsement_table(cells: Cells, groups: dict | None, seed: int, n_boot: int) -> pd.DataFrame:
    """Per model: endorsement rate per framing (mean over dilemmas) and the negated-vs-affirmative contrast."""
    rates = cells.rates
    rows = []
    for m_i, model in enumerate(cells.models):
        r = rates[m_i]
        contrast = np.nanmean(r[:, NEG_IDX], axis=1) - np.nanmean(r[:, AFF_IDX], axis=1)
        lo, hi = cluster_ci(contrast, rng_for(seed, "boot", model, "contrast", mix=ENTROPY), n_boot)
        row = {"model": model, "group": (groups or {}).get(model)}
        for f_i, f in enumerate(FRAMINGS):
            row[f] = float(np.nanmean(r[:, f_i])) if np.isfinite(r[:, f_i]).any() else float("nan")
            row[f"n_{f}"] = int(cells.n[m_i, :, f_i].sum())
        row.update({"neg_minus_aff": float(np.nanmean(contrast)), "neg_minus_aff_ci_low": lo, "neg_minus_aff_ci_high": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def group_endorsement_table(cells: Cells, groups: dict, seed: int, n_boot: int) -> pd.DataFrame:
    """Table 2: endorsement per framing x group (mean over the group's models), plus the pooled contrast."""
    rates = cells.rates
    rows = []
    labels = list(dict.fromkeys(groups.get(m) for m in cells.models if groups.get(m) is not None))
    for label in labels:
        mi = [i for i, m in enumerate(cells.models) if groups.get(m) == label]
        r = rates[mi]  # (Mg, S, 4)
        with np.errstate(invalid="ignore"):
            per_s = np.nanmean(np.nanmean(r[:, :, NEG_IDX], axis=2) - np.nanmean(r[:, :, AFF_IDX], axis=2), axis=0)
        lo, hi = cluster_ci(per_s, rng_for(seed, "boot", "group", str(label), mix=ENTROPY), n_boot)
        row = {"group": label, "n_models": len(mi)}
        for f_i, f in enumerate(FRAMINGS):
            row[f] = float(np.nanmean(np.nanmean(r[:, :, f_i], axis=1)))
        row.update({"neg_minus_aff": float(np.nanmean(per_s)), "neg_minus_aff_ci_low": lo, "neg_minus_aff_ci_high": hi})
        row["nsi_of_rates"] = nsi_from_rates([row[f] for f in FRAMINGS])
        row["nsi_01_of_rates"] = nsi_from_rates([row[f] for f in POLARITY_PAIR])
        row["acquiescence"] = acquiescence_from_endorsement(*(row[f] for f in POLARITY_PAIR))
        rows.append(row)
    return pd.DataFrame(rows)


def acquiescence_table(cells: Cells, groups: dict | None, seed: int, n_boot: int) -> pd.DataFrame:
    """Per model (and pooled per group): p0, p1 and p0 + p1 - 1 with a scenario-cluster CI."""
    a = cells.agree_rates
    rows = []
    for m_i, model in enumerate(cells.models):
        p0s, p1s = (a[m_i, :, i] for i in PAIR_IDX)
        both = np.isfinite(p0s) & np.isfinite(p1s)
        lo, hi = cluster_ci(p0s[both] + p1s[both] - 1.0, rng_for(seed, "boot", model, "acq", mix=ENTROPY), n_boot)
        p0 = float(np.mean(p0s[both])) if both.any() else float("nan")
        p1 = float(np.mean(p1s[both])) if both.any() else float("nan")
        rows.append({"model": model, "group": (groups or {}).get(model), "pooled": False, "p0": p0, "p1": p1,
                     "acquiescence": acquiescence_index(p0, p1), "ci_low": lo, "ci_high": hi,
                     "n_dilemmas": int(both.sum())})
    df = pd.DataFrame(rows)
    if groups:
        pooled = []
        for label, g in df.dropna(subset=["group"]).groupby("group", sort=False):
            p0, p1 = float(g["p0"].mean()), float(g["p1"].mean())
            pooled.append({"model": f"[{label}]", "group": label, "pooled": True, "p0": p0, "p1": p1,
                           "acquiescence": acquiescence_index(p0, p1), "ci_low": np.nan, "ci_high": np.nan,
                           "n_dilemmas": int(g["n_dilemmas"].max())})
        if pooled:
            df = pd.concat([df, pd.DataFrame(pooled)], ignore_index=True)
    return df


def agreement_table(cells: Cells, seed: int, n_boot: int) -> pd.DataFrame:
    """Inter-model agreement per framing, over model pairs and shared dilemmas (sec. 4.1, Figure 3)."""
    rates = cells.rates
    m = len(cells.models)
    rows = []
    for f_i, f in enumerate(FRAMINGS):
        per_pair_s = []
        modal = []
        for i, j in combinations(range(m), 2):
            ri, rj = rates[i, :, f_i], rates[j, :, f_i]
            per_pair_s.append(ri * rj + (1 - ri) * (1 - rj))
            li, lj = np.sign(ri - 0.5), np.sign(rj - 0.5)
            ok = np.isfinite(ri) & np.isfinite(rj) & (li != 0) & (lj != 0)
            modal.append(np.where(ok, (li == lj).astype(float), np.nan))
        if not per_pair_s:
            continue
        mat = np.array(per_pair_s)  # (pairs, S)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # dilemmas no pair shares: NaN, as intended
            per_s = np.nanmean(mat, axis=0)
        lo, hi = cluster_ci(per_s, rng_for(seed, "boot", "agreement", f, mix=ENTROPY), n_boot)
        mod = np.array(modal)
        rows.append({"framing": f, "negated": NEGATED[f],
                     "agreement": float(np.nanmean(mat)) if np.isfinite(mat).any() else np.nan,
                     "ci_low": lo, "ci_high": hi,
                     "agreement_modal": float(np.nanmean(mod)) if np.isfinite(mod).any() else np.nan,
                     "n_pairs": mat.shape[0], "n_dilemmas": int(np.isfinite(per_s).sum())})
    return pd.DataFrame(rows)


def parse_table(replies: pd.DataFrame) -> pd.DataFrame:
    """Parse outcomes per model and temperature: replies, parsed share, stage counts, truncations."""
    rows = []
    for (model, temp), g in replies.groupby(["model", "temperature"]):
        row = {"model": model, "temperature": temp, "replies": len(g), "parsed": int(g["parse_ok"].sum()),
               "parsed_share": float(g["parse_ok"].mean())}
        for st in (1, 2, 3, 4):
            row[f"stage_{st}"] = int((g["parse_stage"] == st).sum())
        row["truncated"] = int(g["truncated"].sum()) if "truncated" in g else np.nan
        rows.append(row)
    return pd.DataFrame(rows)
