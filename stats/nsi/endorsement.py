"""Endorsement rates by framing (per model and per group, the paper's Table 2; rates pooled over replies,
the unit of the model's NSI), acquiescence p0 + p1 - 1 (sec. 4.2), inter-model agreement by framing
(sec. 4.1) and the parse outcomes (Appendix C.4).

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
from stats.nsi.intervals import ratio_sum_ci
from stats.nsi.measures import acquiescence_index, nsi_from_rates


def _polarity_counts(n: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per dilemma (S, 2) endorsing and valid counts of the negated (F1, F3) and affirmative (F0, F2) framings."""
    num = np.stack([k[:, NEG_IDX].sum(1), k[:, AFF_IDX].sum(1)], axis=1)
    den = np.stack([n[:, NEG_IDX].sum(1), n[:, AFF_IDX].sum(1)], axis=1)
    return num, den


def _rates_row(n: np.ndarray, k: np.ndarray, rng, n_boot: int) -> dict:
    """Pooled rate per framing and the pooled negated-minus-affirmative contrast with its cluster CI."""
    row = {}
    nf, kf = n.sum(0), k.sum(0)
    for f_i, f in enumerate(FRAMINGS):
        row[f] = float(kf[f_i] / nf[f_i]) if nf[f_i] else float("nan")
        row[f"n_{f}"] = int(nf[f_i])
    value, lo, hi = ratio_sum_ci(*_polarity_counts(n, k), [1.0, -1.0], rng, n_boot)
    row.update({"neg_minus_aff": value, "neg_minus_aff_ci_low": lo, "neg_minus_aff_ci_high": hi})
    return row


def endorsement_table(cells: Cells, groups: dict | None, seed: int, n_boot: int) -> pd.DataFrame:
    """Per model: endorsement rate per framing (pooled over the model's replies) and the negated-vs-affirmative
    contrast (pooled F1/F3 rate minus pooled F0/F2 rate, scenario-cluster CI)."""
    rows = []
    for m_i, model in enumerate(cells.models):
        rng = rng_for(seed, "boot", model, "contrast", mix=ENTROPY)
        rows.append({"model": model, "group": (groups or {}).get(model),
                     **_rates_row(cells.n[m_i], cells.k[m_i], rng, n_boot)})
    return pd.DataFrame(rows)


def group_endorsement_table(cells: Cells, groups: dict, seed: int, n_boot: int) -> pd.DataFrame:
    """Table 2: endorsement per framing x group, pooled over the group's replies (Table 5's "percentage of
    responses, pooled within model category"), and sec. 4.1's "pooled negated-versus-affirmative contrast
    (F1/F3 vs. F0/F2) in proxy endorsement" with its "scenario cluster-bootstrap 95% CI"."""
    rows = []
    labels = list(dict.fromkeys(groups.get(m) for m in cells.models if groups.get(m) is not None))
    for label in labels:
        mi = [i for i, m in enumerate(cells.models) if groups.get(m) == label]
        n, k = cells.n[mi].sum(0), cells.k[mi].sum(0)  # (S, 4), the group's replies pooled per dilemma
        rng = rng_for(seed, "boot", "group", str(label), mix=ENTROPY)
        row = {"group": label, "n_models": len(mi), **_rates_row(n, k, rng, n_boot)}
        row["nsi_of_rates"] = nsi_from_rates([row[f] for f in FRAMINGS])
        row["nsi_01_of_rates"] = nsi_from_rates([row[f] for f in POLARITY_PAIR])
        a0, a1 = (cells.agree[mi][:, :, i].sum() / max(cells.n[mi][:, :, i].sum(), 1) for i in PAIR_IDX)
        row["acquiescence"] = acquiescence_index(a0, a1)
        rows.append(row)
    return pd.DataFrame(rows)


def _acq_row(n: np.ndarray, a: np.ndarray, rng, n_boot: int) -> dict:
    """p0, p1 (pooled raw agree rates on F0, F1) and p0 + p1 - 1 with its scenario-cluster CI."""
    num, den = a[:, PAIR_IDX], n[:, PAIR_IDX]
    value, lo, hi = ratio_sum_ci(num, den, [1.0, 1.0], rng, n_boot, const=-1.0)
    keep = (den > 0).all(axis=1)
    p0, p1 = (float(num[keep, j].sum() / den[keep, j].sum()) if keep.any() else float("nan") for j in (0, 1))
    return {"p0": p0, "p1": p1, "acquiescence": value, "ci_low": lo, "ci_high": hi, "n_dilemmas": int(keep.sum())}


def acquiescence_table(cells: Cells, groups: dict | None, seed: int, n_boot: int) -> pd.DataFrame:
    """Per model (and pooled per group): p0, p1 and p0 + p1 - 1 with a scenario-cluster CI (sec. 4.2, Fig. 4)."""
    rows = []
    for m_i, model in enumerate(cells.models):
        rng = rng_for(seed, "boot", model, "acq", mix=ENTROPY)
        rows.append({"model": model, "group": (groups or {}).get(model), "pooled": False,
                     **_acq_row(cells.n[m_i], cells.agree[m_i], rng, n_boot)})
    labels = list(dict.fromkeys(groups.get(m) for m in cells.models if groups.get(m) is not None)) if groups else []
    for label in labels:
        mi = [i for i, m in enumerate(cells.models) if groups.get(m) == label]
        rng = rng_for(seed, "boot", "group", str(label), "acq", mix=ENTROPY)
        rows.append({"model": f"[{label}]", "group": label, "pooled": True,
                     **_acq_row(cells.n[mi].sum(0), cells.agree[mi].sum(0), rng, n_boot)})
    return pd.DataFrame(rows)


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


def group_dilemma_table(cells: Cells, groups: dict) -> pd.DataFrame:
    """Table 5 for every dilemma: endorsement per framing, pooled within each group (percentage of responses)."""
    rows = []
    labels = list(dict.fromkeys(groups.get(m) for m in cells.models if groups.get(m) is not None))
    for s_i, dil in enumerate(cells.dilemmas):
        for label in labels:
            mi = [i for i, m in enumerate(cells.models) if groups.get(m) == label]
            n, k = cells.n[mi, s_i].sum(0), cells.k[mi, s_i].sum(0)
            row = {"dilemma_id": dil, "domain": cells.domains[s_i], "group": label}
            for f_i, f in enumerate(FRAMINGS):
                row[f] = float(k[f_i] / n[f_i]) if n[f_i] else float("nan")
                row[f"n_{f}"] = int(n[f_i])
            rows.append(row)
    return pd.DataFrame(rows)
