"""The dose arm (the paper's Table 8 and Figure 8): paired contrasts between forced-answer arms.

Owns: for each cell (primary, and the pressure-removed twin as amendment P1-A12 adds), on the model's
own screened scenarios, the per-scenario difference of the violating mass at the forced answer between
two arms, with a scenario bootstrap CI, and each arm's completed fraction (how often the generated text
ended within its budget: "reasoning finishes within 512 tokens").
An arm read at more than one budget appears once per budget; a contrast pairs equal budgets where both
arms have them, else the other arm's largest budget.
"""

from __future__ import annotations

import numpy as np

from stats.core.bootstrap import estimates_from
from stats.core.estimate import Estimate
from stats.gap.names import DOSE, DOSE_BRIEF, DOSE_FILLER, DOSE_NORM, DOSE_REASONING, DOSE_TRUNCATED, PAIRED, PRIMARY
from stats.gap.tables import Run

ARMS = DOSE
CONTRASTS = (
    (DOSE_REASONING, DOSE_FILLER),
    (DOSE_REASONING, DOSE_TRUNCATED),
    (DOSE_TRUNCATED, DOSE_FILLER),
    (DOSE_BRIEF, DOSE_FILLER),
    (DOSE_NORM, DOSE_FILLER),
)
"""The paired contrasts of Table 8 (arm minus arm)."""


def arm_label(readout: str, budget, several: bool) -> str:
    name = readout.removeprefix("dose_").replace("_", " ")
    return f"{name} ({budget})" if several and budget is not None else name


def dose_estimates(run: Run, mask: np.ndarray, floor: float, rng, n_boot: int) -> list[Estimate]:
    out: list[Estimate] = []
    for cell in PAIRED:
        budgets = {a: run.budgets(a, cell) for a in ARMS if run.has(a, cell)}
        several = any(len(b) > 1 for b in budgets.values())
        columns: list[tuple[str, np.ndarray, np.ndarray]] = []  # (quantity, per-scenario value, defined)
        for a, b in CONTRASTS:
            if a not in budgets or b not in budgets:
                continue
            for ba in budgets[a]:
                bb = ba if ba in budgets[b] else max(budgets[b], key=lambda v: -1 if v is None else v)
                va, vb = run.col(cell, a, "p_violating", budget=ba), run.col(cell, b, "p_violating", budget=bb)
                ma, mb = run.col(cell, a, "letter_mass", budget=ba), run.col(cell, b, "letter_mass", budget=bb)
                ok = ~np.isnan(va - vb) & (np.nan_to_num(ma, nan=-1) >= floor) & (np.nan_to_num(mb, nan=-1) >= floor)
                columns.append((f"{arm_label(a, ba, several)} - {arm_label(b, bb, several)}", va - vb, ok))
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
    order = {(e.subset, e.quantity): i for i, e in enumerate(out)}
    return sorted(out, key=lambda e: (e.subset != PRIMARY, e.quantity.startswith("completed"), order[(e.subset, e.quantity)]))
