"""Reply counts per cell (model x dilemma x framing), the unit every negation statistic starts from.

A *cell* is one model's replies to one dilemma under one framing; its endorsement rate is P_a^f. Parse
failures are left out of the counts (Appendix C.4). Also the continuous readout's p_endorse / p_agree laid
out on the same axes, and the framing indices the statistics select.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import FRAMINGS, NEGATED, POLARITY_PAIR

PAIR_IDX = [FRAMINGS.index(f) for f in POLARITY_PAIR]
"""The simple polarity pair (F0, F1) of the headline NSI."""
NEG_IDX = [i for i, f in enumerate(FRAMINGS) if NEGATED[f]]
"""The negated framings (F1, F3)."""
AFF_IDX = [i for i, f in enumerate(FRAMINGS) if not NEGATED[f]]
"""The affirmative framings (F0, F2)."""
ALL_IDX = list(range(len(FRAMINGS)))


@dataclass(frozen=True)
class Cells:
    """Counts per model x dilemma x framing (framings in F0..F3 order)."""

    models: tuple
    """Model names (axis 0)."""
    dilemmas: tuple
    """Dilemma ids (axis 1)."""
    domains: tuple
    """Domain of each dilemma."""
    n: np.ndarray
    """Valid (parsed) replies, int (M, S, 4)."""
    k: np.ndarray
    """Endorsing replies, int (M, S, 4)."""
    agree: np.ndarray
    """Replies deciding 'agree', int (M, S, 4)."""

    @property
    def rates(self) -> np.ndarray:
        """Endorsement rate P_a^f (NaN for empty cells)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 0, self.k / np.maximum(self.n, 1), np.nan)

    @property
    def agree_rates(self) -> np.ndarray:
        """Raw agree rate (NaN for empty cells)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 0, self.agree / np.maximum(self.n, 1), np.nan)


def build_cells(replies: pd.DataFrame, models=None, dilemmas=None) -> Cells:
    """Count valid replies per cell from reply rows (already filtered to one temperature regime)."""
    ok = replies[replies["parse_ok"]]
    models = tuple(models) if models is not None else tuple(sorted(replies["model"].unique()))
    if dilemmas is None:
        dil = replies[["dilemma_id", "domain"]].drop_duplicates().sort_values(["domain", "dilemma_id"])
        dilemmas = tuple(dil["dilemma_id"])
    dom_map = replies.drop_duplicates("dilemma_id").set_index("dilemma_id")["domain"].to_dict()
    shape = (len(models), len(dilemmas), len(FRAMINGS))
    n, k, a = (np.zeros(shape, dtype=np.int64) for _ in range(3))
    mi = {m: i for i, m in enumerate(models)}
    si = {s: i for i, s in enumerate(dilemmas)}
    fi = {f: i for i, f in enumerate(FRAMINGS)}
    g = ok.groupby(["model", "dilemma_id", "framing"]).agg(n=("endorse", "size"), k=("endorse", "sum"), a=("agree", "sum"))
    for (m, s, f), row in g.iterrows():
        if m in mi and s in si:
            idx = (mi[m], si[s], fi[f])
            n[idx], k[idx], a[idx] = int(row["n"]), int(row["k"]), int(row["a"])
    return Cells(models, tuple(dilemmas), tuple(dom_map.get(s) for s in dilemmas), n, k, a)


def sampled(replies: pd.DataFrame) -> pd.DataFrame:
    """The sampled replies (T > 0): the audit's data."""
    return replies[replies["temperature"] > 0]


def greedy(replies: pd.DataFrame) -> pd.DataFrame:
    """The greedy replies (T = 0): the temperature ablation's."""
    return replies[replies["temperature"] == 0]


def continuous_arrays(cont: pd.DataFrame, cells: Cells, suffix: str = "") -> tuple[np.ndarray, np.ndarray]:
    """p_endorse and p_agree as (M, S, 4) arrays aligned with ``cells`` (NaN where absent); ``suffix``
    "_tempered" reads them at the sampling settings (NaN where the run has no such reading)."""
    shape = (len(cells.models), len(cells.dilemmas), len(FRAMINGS))
    pe, pa = np.full(shape, np.nan), np.full(shape, np.nan)
    mi = {m: i for i, m in enumerate(cells.models)}
    si = {s: i for i, s in enumerate(cells.dilemmas)}
    cols = ["model", "dilemma_id", "framing", f"p_endorse{suffix}", f"p_agree{suffix}"]
    for model, dil, framing, e, a in cont[cols].itertuples(index=False):
        if model in mi and dil in si:
            idx = (mi[model], si[dil], FRAMINGS.index(framing))
            pe[idx], pa[idx] = e, a
    return pe, pa


COMPLIANCE = 0.8
"""Sec. 3.3: "models below an 80% compliance rule (e.g. Gemini-3-Pro, 1 of 14 usable) are excluded from
analysis": the share of a model's dilemmas that are usable (a parsed reply under every framing)."""


def usable_dilemmas(cells: Cells) -> np.ndarray:
    """Per model, the dilemmas with at least one parsed reply under every framing (M,)."""
    return (cells.n > 0).all(axis=2).sum(axis=1)


def subset_models(cells: Cells, keep) -> Cells:
    """The same counts for the models whose flag in ``keep`` (M,) is true."""
    keep = np.asarray(keep, dtype=bool)
    return Cells(tuple(m for m, k in zip(cells.models, keep) if k), cells.dilemmas, cells.domains,
                 cells.n[keep], cells.k[keep], cells.agree[keep])
