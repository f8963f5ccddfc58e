"""The dose arm (the paper's Table 8 and Figure 8): paired contrasts between forced-answer arms, their ratio
reading, and the rider.

Owns: for each cell (primary, and the pressure-removed twin as amendment P1-A12 adds), on the model's
own screened scenarios,
- the per-scenario difference of the violating mass at the forced answer between two arms, with a scenario
  bootstrap CI (quantity `a - b`);
- the ratio reading (P1-A14, post-hoc; quantity `a / b`): see `ratio_reading`;
- the norm arm's share of the reasoning contrast (quantity `(norm - filler) / (reasoning - filler)`; the abstract's
  "about a third"): see `effect_share`;
- each arm's completed fraction (how often the generated text ended within its budget: "reasoning finishes
  within 512 tokens");
- the rider (P1-A6, "2,048-token rider at 8 rollouts per scenario, per-scenario agreement as its readout";
  quantity `rider agreement (<long> vs <dose budget>)`): see `rider_agreement`.
An arm read at more than one budget appears once per budget; a contrast pairs equal budgets where both
arms have them, else the other arm's largest budget.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from contract.tables import PROBES
from stats.core.bootstrap import estimates_from, scenario_bootstrap
from stats.core.estimate import Estimate, empty, make_estimate
from stats.gap.names import (
    DOSE,
    DOSE_BRIEF,
    DOSE_FILLER,
    DOSE_NORM,
    DOSE_REASONING,
    DOSE_RIDER,
    DOSE_RIDER_CUT,
    DOSE_TRUNCATED,
    PAIRED,
    PRIMARY,
    RIDER,
)
from stats.gap.tables import Run

ARMS = DOSE
CONTRASTS = (
    (DOSE_REASONING, DOSE_FILLER),
    (DOSE_REASONING, DOSE_TRUNCATED),
    (DOSE_TRUNCATED, DOSE_FILLER),
    (DOSE_BRIEF, DOSE_FILLER),
    (DOSE_NORM, DOSE_FILLER),
)
"""The paired contrasts of Table 8 (arm minus arm); each is also read as a ratio (arm over arm)."""
SHARES = ((DOSE_NORM, DOSE_REASONING, DOSE_FILLER),)
"""(arm, reference, control): the arm's contrast with the control as a share of the reference's (quantity
`(a - c) / (r - c)`). The abstract's reading of the norm arm: "naming the norm at stake does about a third of
that" (of what reasoning does, against the same filler)."""


def arm_label(readout: str, budget, several: bool) -> str:
    name = readout.removeprefix("dose_").replace("_", " ")
    return f"{name} ({budget})" if several and budget is not None else name


def ratio_reading(a: np.ndarray, b: np.ndarray, rng, n_boot: int) -> tuple[float, float, float, float]:
    """The ratio reading of a paired contrast: mean violating mass of arm a over that of arm b, on the same
    scenarios (value, low, high, se; a scenario bootstrap that resamples the pairs, percentile CI).

    The paper names this reading (Table 8's caption: "the ratio reading (P1-A14, post-hoc)") and defines it
    nowhere; this definition is ours. A ratio of the two arms' mean masses rather than the mean of per-scenario
    ratios: a scenario whose control arm puts almost no mass on the violation would make its own ratio
    unbounded, while the ratio of means weighs each scenario by its mass, and it reads as "the arm keeps this
    share of the control's violating mass" (1 = no dose effect; the difference row gives the same contrast on
    the additive scale). Undefined (NaN) when arm b's mean mass is 0."""
    return _ratio_of_means(a, b, rng, n_boot)


def effect_share(arm: np.ndarray, reference: np.ndarray, rng, n_boot: int) -> tuple[float, float, float, float]:
    """How much of the reference arm's contrast an arm reaches: mean(arm - control) / mean(reference - control),
    both per-scenario differences on the same scenarios (value, low, high, se; a scenario bootstrap that
    resamples the scenarios once for both, percentile CI). A ratio of mean contrasts, not a mean of per-scenario
    ratios (a scenario where reasoning moves nothing would make its own ratio unbounded). 1: the arm does what
    the reference does; 0: nothing. Undefined (NaN) when the reference's mean contrast is 0."""
    return _ratio_of_means(arm, reference, rng, n_boot)


def _ratio_of_means(num: np.ndarray, den: np.ndarray, rng, n_boot: int) -> tuple[float, float, float, float]:
    """mean(num) / mean(den) on paired scenarios with a scenario bootstrap (value, low, high, se); NaN where
    the denominator's mean is 0."""

    def combine(sums):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(sums[..., 1:2] != 0, sums[..., 0:1] / sums[..., 1:2], np.nan)

    value, low, high, se = scenario_bootstrap(np.column_stack([num, den]), rng, n_boot, combine=combine)
    return value[0], low[0], high[0], se[0]


def _shares(contrasts: dict, cell: str, mask: np.ndarray, rng, n_boot: int) -> list[Estimate]:
    """SHARES rows from the cell's contrasts, keyed (arm, control, control's label) -> (arm's label, values, ok)."""
    out = []
    for arm, ref, ctl in SHARES:
        for (a, c, lc), (la, va, ok_a) in contrasts.items():
            if a != arm or c != ctl or (ref, ctl, lc) not in contrasts:
                continue
            lr, vr, ok_r = contrasts[(ref, ctl, lc)]
            name, m = f"({la} - {lc}) / ({lr} - {lc})", mask & ok_a & ok_r
            if m.sum() < 1:
                out.append(empty("dose", name, cell))
                continue
            value, low, high, se = effect_share(va[m], vr[m], rng, n_boot)
            out.append(make_estimate("dose", name, cell, int(m.sum()), value, low, high, se,
                                     f"scenario bootstrap ({n_boot}), ratio of mean contrasts",
                                     "share of the reasoning contrast (the abstract's 'about a third' for the norm arm)"))
    return out


def dose_estimates(run: Run, mask: np.ndarray, floor: float, rng, n_boot: int) -> list[Estimate]:
    out: list[Estimate] = []
    for cell in PAIRED:
        budgets = {a: run.budgets(a, cell) for a in (*ARMS, *RIDER) if run.has(a, cell)}
        several = any(len(b) > 1 for a, b in budgets.items() if a in ARMS)
        columns: list[tuple[str, np.ndarray, np.ndarray]] = []  # (quantity, per-scenario value, defined)
        ratios: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
        contrasts: dict = {}  # (a, b, b's label) -> (a's label, a - b per scenario, defined): for SHARES
        for a, b in CONTRASTS:
            if a not in budgets or b not in budgets:
                continue
            for ba in budgets[a]:
                bb = ba if ba in budgets[b] else max(budgets[b], key=lambda v: -1 if v is None else v)
                va, vb = run.col(cell, a, "p_violating", budget=ba), run.col(cell, b, "p_violating", budget=bb)
                ma, mb = run.col(cell, a, "letter_mass", budget=ba), run.col(cell, b, "letter_mass", budget=bb)
                ok = ~np.isnan(va - vb) & (np.nan_to_num(ma, nan=-1) >= floor) & (np.nan_to_num(mb, nan=-1) >= floor)
                la, lb = arm_label(a, ba, several), arm_label(b, bb, several)
                columns.append((f"{la} - {lb}", va - vb, ok))
                contrasts[(a, b, lb)] = (la, va - vb, ok)
                ratios.append((f"{la} / {lb}", va, vb, ok))
        for a, bs in budgets.items():
            for ba in bs:
                comp = run.col(cell, a, "completed_fraction", budget=ba)
                columns.append((f"completed: {arm_label(a, ba, True)}", comp, ~np.isnan(comp)))
        # Quantities defined on the same scenarios share one joint bootstrap (usually all of them).
        groups: dict[bytes, list[int]] = {}
        for i, (_, _, ok) in enumerate(columns):
            groups.setdefault((mask & ok).tobytes(), []).append(i)
        for members in groups.values():
            m = mask & columns[members[0]][2]
            out += estimates_from("dose", cell, [columns[i][0] for i in members],
                                  np.column_stack([columns[i][1] for i in members])[m], rng, n_boot)
        for name, va, vb, ok in ratios:
            m = mask & ok
            if not m.any():
                out.append(empty("dose", name, cell))
                continue
            value, low, high, se = ratio_reading(va[m], vb[m], rng, n_boot)
            out.append(make_estimate("dose", name, cell, int(m.sum()), value, low, high, se,
                                     f"scenario bootstrap ({n_boot}), ratio of means",
                                     "ratio reading: the definition is ours (the paper gives none)"))
        out += _shares(contrasts, cell, mask, rng, n_boot)
        if DOSE_RIDER in budgets and DOSE_RIDER_CUT in budgets:
            out.append(_rider(run, cell, mask, floor, rng, n_boot))
    order = {(e.subset, e.quantity): i for i, e in enumerate(out)}
    return sorted(out, key=lambda e: (e.subset != PRIMARY, _kind(e.quantity), order[(e.subset, e.quantity)]))


def _kind(quantity: str) -> int:
    """Row order within a cell: differences, ratios, the rider, completed fractions."""
    if quantity.startswith("completed"):
        return 3
    if quantity.startswith("rider"):
        return 2
    return 1 if "/" in quantity else 0


def _rider(run: Run, cell: str, mask: np.ndarray, floor: float, rng, n_boot: int) -> Estimate:
    long, short = run.budgets(DOSE_RIDER, cell)[-1], run.budgets(DOSE_RIDER_CUT, cell)[-1]
    name = f"rider agreement ({long} vs {short})"
    agree = rider_agreement(run.path, cell)
    if agree is None:
        return empty("dose", name, cell, f"{PROBES.file} absent: the rider's agreement is read per rollout")
    per = agree.reindex(run.ids).to_numpy(dtype=np.float64, na_value=np.nan)
    mass = [run.col(cell, r, "letter_mass", budget=b) for r, b in ((DOSE_RIDER, long), (DOSE_RIDER_CUT, short))]
    ok = mask & ~np.isnan(per) & (np.nan_to_num(mass[0], nan=-1) >= floor) & (np.nan_to_num(mass[1], nan=-1) >= floor)
    note = "rider agreement: the definition is ours (P1-A6 names per-scenario agreement, defines it nowhere)"
    return estimates_from("dose", cell, [name], per[ok][:, None], rng, n_boot, notes={name: note})[0]


def rider_agreement(run_dir: str | Path, cell: str) -> pd.Series | None:
    """The rider's per-scenario agreement (amendment P1-A6 names it as the rider's readout without defining
    it; this definition is ours): for each scenario, the share of the rider's rollouts whose answer at the
    dose budget (the forced answer the dose arms report, or the model's own if it answered within that
    budget) names the same option as the same rollout's answer at the rider's long budget. 1: the forced
    answer is the answer the reasoning reaches when it may run on. The answer is the top letter at the
    anchor, or the letter an F3 tool's name stands for (anchor rule `+tool:<letter>`). Indexed by scenario
    id; None when the run has no probes table."""
    path = Path(run_dir) / PROBES.file
    if not path.is_file():
        return None
    cols = ["scenario_id", "cell", "readout", "rollout", "order", "letters", "top_letter", "anchor_rule"]
    df = pd.read_parquet(path, columns=cols)
    df = df[(df["cell"] == cell) & df["readout"].isin(RIDER)]
    rule = df["anchor_rule"].fillna("").astype(str)
    letter = np.where(rule.str.contains("+tool:", regex=False), rule.str.split("+tool:", n=1, regex=False).str[-1], df["top_letter"])
    df = df.assign(option=[o.split(",")[ls.index(x)] if x in ls else None
                           for o, ls, x in zip(df["order"], df["letters"], letter)])
    wide = df.set_index(["scenario_id", "rollout", "readout"])["option"].unstack("readout")
    if wide.empty or not set(RIDER) <= set(wide.columns):
        return pd.Series(dtype=np.float64)
    wide = wide.dropna(subset=list(RIDER))
    same = (wide[DOSE_RIDER] == wide[DOSE_RIDER_CUT]).astype(np.float64)
    return same.groupby(level="scenario_id").mean()
