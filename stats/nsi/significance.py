"""Significance of framing effects and of group differences (the negation paper's sec. 4.2 and 4.4).

* Cochran's Q per model x dilemma over the four framings, blocks = sample index (the paper's matching unit:
  the shared dilemma, with the k-th sample of each framing as one block), complete blocks only; NaN when no
  block varies (Q is 0/0). Benjamini-Hochberg (scipy ``false_discovery_control``) across all finite p.
* Kruskal-Wallis across user-supplied model groups on the per-model corrected NSI, with two effect sizes.
  The paper's "epsilon^2 = 0.46" for H = 7.96, n = 16, k = 3 is what is usually called
  eta^2_H = (H - k + 1) / (n - k); it is reported under the paper's symbol (``epsilon_sq_paper``), and the
  classical epsilon^2 = H / (n - 1) (Tomczak & Tomczak 2014; 0.53 on the same H) beside it
  (``epsilon_sq_classical``). Pairwise Mann-Whitney with the exact test
  when there are no ties: two-sided and one-sided "first group greater" p (the paper's .004/.014 are
  one-sided, its .68 two-sided).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats.contingency_tables import cochrans_q

from contract import FRAMINGS
from stats.nsi.measures import epsilon_squared, eta_squared_h

ALPHA_FDR = 0.05
"""Benjamini-Hochberg false discovery rate of the Cochran's Q calls."""
GROUP_METRICS = ("nsi_corrected", "nsi_01_corrected")
"""The per-model values the group tests compare."""


@dataclass(frozen=True)
class CochranResult:
    """Cochran's Q for one model x dilemma over the four framings."""

    q: float
    """Q statistic (NaN when no block varies)."""
    p_value: float
    """Chi-square p with 3 df (NaN when untestable)."""
    n_blocks: int
    """Complete blocks (sample indices with a parsed reply under every framing)."""


def cochran_q_blocks(x: np.ndarray) -> CochranResult:
    """Cochran's Q on a (blocks, treatments) 0/1 matrix via statsmodels; NaN when every block is constant."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2:
        return CochranResult(float("nan"), float("nan"), int(x.shape[0]) if x.ndim == 2 else 0)
    row = x.sum(axis=1)
    if np.all((row == 0) | (row == x.shape[1])):
        return CochranResult(float("nan"), float("nan"), int(x.shape[0]))
    res = cochrans_q(x)
    return CochranResult(float(res.statistic), float(res.pvalue), int(x.shape[0]))


def bh_adjust(p_values) -> np.ndarray:
    """Benjamini-Hochberg adjusted p (scipy ``false_discovery_control``) over the finite entries; NaN stays NaN."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    fin = np.isfinite(p)
    if fin.any():
        out[fin] = sps.false_discovery_control(p[fin], method="bh")
    return out


def cochran_table(sampled: pd.DataFrame) -> pd.DataFrame:
    """One Cochran's Q per model x dilemma (blocks = sample index, complete blocks), with BH across all."""
    ok = sampled[sampled["parse_ok"]]
    rows = []
    for (model, dil), g in ok.groupby(["model", "dilemma_id"], sort=True):
        wide = g.pivot_table(index="sample", columns="framing", values="endorse", aggfunc="first")
        wide = wide.reindex(columns=list(FRAMINGS)).dropna()
        res = cochran_q_blocks(wide.to_numpy())
        rows.append({"model": model, "dilemma_id": dil, "domain": g["domain"].iloc[0], **asdict(res)})
    df = pd.DataFrame(rows, columns=["model", "dilemma_id", "domain", "q", "p_value", "n_blocks"])
    df["q_bh"] = bh_adjust(df["p_value"].to_numpy()) if len(df) else []
    df["significant"] = df["q_bh"] < ALPHA_FDR
    return df


@dataclass(frozen=True)
class PairTest:
    """Mann-Whitney between two groups of per-model values."""

    group_a: str
    """The group with the larger median (the 'greater' side of the one-sided test)."""
    group_b: str
    """The other group."""
    n_a: int
    """Models in group a."""
    n_b: int
    """Models in group b."""
    u: float
    """U statistic of group a."""
    p_two_sided: float
    """Two-sided p."""
    p_greater: float
    """One-sided p for 'group a greater'."""
    rank_biserial: float
    """2U / (n_a n_b) - 1."""


def kruskal_groups(values: dict, groups: dict) -> dict:
    """Kruskal-Wallis across groups of per-model values, with the paper's epsilon^2 (eta^2_H) and the classical one."""
    by = {}
    for model, v in values.items():
        g = groups.get(model)
        if g is not None and np.isfinite(v):
            by.setdefault(g, []).append(float(v))
    by = {g: v for g, v in by.items() if v}
    n = sum(len(v) for v in by.values())
    k = len(by)
    out = {"k_groups": k, "n_models": n, "h": np.nan, "p_value": np.nan, "epsilon_sq_paper": np.nan,
           "epsilon_sq_classical": np.nan}
    if k < 2 or n <= k:
        return out
    try:
        h, p = sps.kruskal(*by.values())
    except ValueError:  # all values identical
        return out
    out.update(h=float(h), p_value=float(p), epsilon_sq_paper=eta_squared_h(h, n, k), epsilon_sq_classical=epsilon_squared(h, n))
    return out


def pairwise_mannwhitney(values: dict, groups: dict) -> list[PairTest]:
    """Mann-Whitney for every pair of groups (exact when small and untied, scipy's 'auto')."""
    by = {}
    for model, v in values.items():
        g = groups.get(model)
        if g is not None and np.isfinite(v):
            by.setdefault(g, []).append(float(v))
    out = []
    for a, b in combinations(list(by), 2):
        xa, xb = by[a], by[b]
        if np.median(xb) > np.median(xa):
            a, b, xa, xb = b, a, xb, xa
        if not xa or not xb:
            continue
        two = sps.mannwhitneyu(xa, xb, alternative="two-sided")
        one = sps.mannwhitneyu(xa, xb, alternative="greater")
        u = float(two.statistic)
        out.append(PairTest(str(a), str(b), len(xa), len(xb), u, float(two.pvalue), float(one.pvalue),
                            2.0 * u / (len(xa) * len(xb)) - 1.0))
    return out


def group_tests_table(models_tab: pd.DataFrame, groups: dict) -> pd.DataFrame:
    """Kruskal-Wallis and pairwise Mann-Whitney on each of GROUP_METRICS (one row per test)."""
    tests = []
    for metric in GROUP_METRICS:
        values = models_tab.set_index("model")[metric].to_dict()
        kw = kruskal_groups(values, groups)
        tests.append({"metric": metric, "test": "kruskal-wallis", "groups": f"{kw['k_groups']} groups",
                      "n": kw["n_models"], "statistic": kw["h"], "p_two_sided": kw["p_value"], "p_greater": np.nan,
                      "epsilon_sq_paper": kw["epsilon_sq_paper"], "epsilon_sq_classical": kw["epsilon_sq_classical"],
                      "rank_biserial": np.nan})
        for t in pairwise_mannwhitney(values, groups):
            tests.append({"metric": metric, "test": "mann-whitney", "groups": f"{t.group_a} > {t.group_b}",
                          "n": t.n_a + t.n_b, "statistic": t.u, "p_two_sided": t.p_two_sided,
                          "p_greater": t.p_greater, "epsilon_sq_paper": np.nan, "epsilon_sq_classical": np.nan,
                          "rank_biserial": t.rank_biserial})
    return pd.DataFrame(tests)


def scale_table(models_tab: pd.DataFrame, params: dict) -> pd.DataFrame:
    """Sec. 4.4: "a negative correlation between parameter count and NSI (r^2 = 0.25, p = 0.05)". Pearson r,
    r^2 and the two-sided p (scipy ``pearsonr``) of the per-model NSI (observed and corrected) against the
    parameter count, as given and on a log10 scale (the paper does not say which), over the models with a count."""
    rows = []
    tab = models_tab[models_tab["model"].isin(params)]
    x_raw = np.array([float(params[m]) for m in tab["model"]])
    for metric in ("nsi", "nsi_corrected"):
        y = tab[metric].to_numpy(dtype=float)
        for scale, x in (("params", x_raw), ("log10_params", np.log10(x_raw) if (x_raw > 0).all() else x_raw * np.nan)):
            ok = np.isfinite(x) & np.isfinite(y)
            r = p = np.nan
            if ok.sum() >= 3 and np.ptp(x[ok]) > 0 and np.ptp(y[ok]) > 0:
                res = sps.pearsonr(x[ok], y[ok])
                r, p = float(res.statistic), float(res.pvalue)
            rows.append({"metric": metric, "x": scale, "n": int(ok.sum()), "r": r, "r_sq": r * r, "p_two_sided": p})
    return pd.DataFrame(rows)
