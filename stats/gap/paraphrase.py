"""The F4 paraphrase-swap cell (the paper's Table 14) on the binary readout.

Owns: per origin (the generator that wrote the scenario), the binary gap on the screened originals, the
same on the screened paraphrases (the other writer's rewording, read as its own cell with its own screen),
and the paired swapped - original difference on the scenarios screened in both; beside them the acting
mass's paired move p_D(paraphrase) - p_D(original), the continuous note under Table 14. All from one
bootstrap per origin (stats.gap.nested). Paraphrase cells never enter the gate or the headline.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from contract.names import PARAPHRASE_CELLS
from stats.core.bootstrap import estimates_from
from stats.core.estimate import Estimate, make_estimate
from stats.gap.binary import sampled
from stats.gap.names import PRIMARY, D
from stats.gap.nested import Statistic, joint_majority, redraw_prob
from stats.gap.screen import screen
from stats.gap.tables import Run

PARAPHRASE = next(c for c, mirrors in PARAPHRASE_CELLS.items() if mirrors == PRIMARY)
QUANTITIES = ("original_gap", "swapped_gap", "swapped_minus_original")


def _units(run: Run, cell: str):
    mp = run.col(cell, D, "majority_violating_prob")
    return mp, redraw_prob(mp, run.col(cell, D, "violating_fraction"), run.col(cell, D, "n_rollouts"), sampled(run))


def paraphrase_swap(run: Run, floor: float, rng: Callable[[str], np.random.Generator], n_boot: int) -> list[Estimate]:
    """Table 14's rows (analysis `paraphrase_swap`, subset `origin=<generator>`); [] without paraphrase cells."""
    if not run.has(D, PARAPHRASE):
        return []
    orig, para = screen(run, floor), screen(run, floor, cell=PARAPHRASE)
    if orig is None or para is None:
        return []
    has_para = ~np.isnan(run.col(PARAPHRASE, D, "p_violating"))
    gen = run.meta["generator"].astype(str).to_numpy()
    (po, ro), (pp, rp) = _units(run, PRIMARY), _units(run, PARAPHRASE)
    d_move = run.col(PARAPHRASE, D, "p_violating") - run.col(PRIMARY, D, "p_violating")
    out: list[Estimate] = []
    for g in sorted(set(gen[has_para])):
        sel = has_para & (gen == g)
        a, b = orig.screened & sel, para.screened & sel
        stats = [Statistic(QUANTITIES[0], (1.0, 0.0), a), Statistic(QUANTITIES[1], (0.0, 1.0), b),
                 Statistic(QUANTITIES[2], (-1.0, 1.0), a & b)]
        sub = f"origin={g}"
        res = joint_majority((po, pp), (ro, rp), stats, rng(f"paraphrase/{g}"), n_boot)
        for r in res:
            out.append(make_estimate("paraphrase_swap", r.name, sub, r.n, r.value, r.low, r.high, r.se,
                                     f"nested bootstrap ({n_boot})"))
        both = a & b & ~np.isnan(d_move)
        out += estimates_from("paraphrase_swap", sub, ["p_D swapped - original"], d_move[both],
                              rng(f"paraphrase-move/{g}"), n_boot)
    return out
