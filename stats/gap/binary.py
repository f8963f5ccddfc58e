"""The binary readout: a majority-violating action against a non-violating judgment.

Owns: the binary gap (mean over reference-non-violating scenarios of the probability that the majority
of the acting rollouts is violating), its matched null (the same on the pressure-removed twins whose
own judgment reference is non-violating at the same level), their paired excess, and the known-gap band
(the same on the control cell against the letter-only judgment). Every CI is the nested bootstrap
(scenarios, then rollouts); the scenario-only CI is reported beside it for the bias audit (the paper's
Table 4: nested rollout resampling widens every binary CI).
"""

from __future__ import annotations

import numpy as np

from stats.core.bootstrap import estimates_from, nested_majority, scenario_bootstrap
from stats.core.estimate import Estimate, make_estimate
from stats.gap.names import CONTROL, J0, PRIMARY, TWIN, D
from stats.gap.tables import Run


def _unit(run: Run, cell: str, readout: str = D):
    return (run.col(cell, readout, "majority_violating_prob"), run.col(cell, readout, "violating_fraction"),
            run.col(cell, readout, "n_rollouts"))


def _nested(analysis, quantity, subset, comps, mask, rng, n_boot, extra=()):
    """Nested-bootstrap Estimate(s) over the scenarios of mask; quantity is a tuple when extra is given."""
    parts = [(mp[mask], f[mask], np.nan_to_num(k[mask], nan=1).astype(int), sign) for mp, f, k, sign in comps]
    names = quantity if extra else (quantity,)
    n = int(mask.sum())
    if n == 0:
        out = [make_estimate(analysis, q, subset, 0, None, None, None, None, "none",
                             "no scenario with a defined value") for q in names]
    else:
        res = nested_majority(parts, rng, n_boot, extra=extra)
        res = res if extra else [res]
        out = [make_estimate(analysis, q, subset, n, *r, f"nested bootstrap ({n_boot})") for q, r in zip(names, res)]
    return out if extra else out[0]


def binary_block(run: Run, primary_set: np.ndarray, twin_ok: np.ndarray, subset: str,
                 rng: np.random.Generator, n_boot: int, analysis: str = "binary",
                 excess_only: bool = False) -> list[Estimate]:
    """Gap, matched null and paired excess (nested CIs) plus their scenario-only CIs.

    primary_set: scenarios whose primary reference is non-violating at this level (and above floors).
    twin_ok: scenarios whose twin reference is non-violating at the same level and above the floor.
    excess_only: just the nested paired excess (the slices need no more).
    """
    mp, fp, kp = _unit(run, PRIMARY)
    mt, ft, kt = _unit(run, TWIN)
    gap_set = primary_set & ~np.isnan(mp) & ~np.isnan(fp)
    pair_set = gap_set & twin_ok & ~np.isnan(mt) & ~np.isnan(ft)
    pair = [(mp, fp, kp, 1.0), (mt, ft, kt, -1.0)]
    if excess_only:
        return [_nested(analysis, "binary_excess", subset, pair, pair_set, rng, n_boot)]
    # The null comes from the same draws as the excess: both are over the paired scenarios.
    excess, null = _nested(analysis, ("binary_excess", "binary_null"), subset, pair, pair_set, rng, n_boot,
                           extra=[(0.0, 1.0)])
    out = [_nested(analysis, "binary_gap", subset, [(mp, fp, kp, 1.0)], gap_set, rng, n_boot), null, excess]
    out += _scenario_only(analysis, subset, mp, mt, gap_set, pair_set, rng, n_boot)
    return out


def _scenario_only(analysis, subset, mp, mt, gap_set, pair_set, rng, n_boot) -> list[Estimate]:
    """The same three numbers with scenario resampling only (no rollouts), for the bias audit.

    One joint bootstrap over the gap set; the null and the excess are means over its paired subset.
    """
    names = ["binary_gap_scenario_only", "binary_null_scenario_only", "binary_excess_scenario_only"]
    n_gap, n_pair = int(gap_set.sum()), int(pair_set.sum())
    if n_gap == 0 or n_pair == 0:
        out = estimates_from(analysis, subset, names[:1], mp[gap_set], rng, n_boot)
        return out + [make_estimate(analysis, q, subset, 0, None, None, None, None, "none",
                                    "no scenario with a defined value") for q in names[1:]]
    pair = pair_set[gap_set]
    x = np.column_stack([mp[gap_set], np.where(pair, mt[gap_set], 0.0),
                         np.where(pair, mp[gap_set] - mt[gap_set], 0.0), pair])

    def combine(sums):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.stack([sums[..., 0] / n_gap, sums[..., 1] / sums[..., 3], sums[..., 2] / sums[..., 3]], axis=-1)

    value, low, high, se = scenario_bootstrap(x, rng, n_boot, combine=combine)
    method = f"scenario bootstrap ({n_boot})"
    return [make_estimate(analysis, q, subset, n, value[i], low[i], high[i], se[i], method)
            for i, (q, n) in enumerate(zip(names, (n_gap, n_pair, n_pair)))]


def binary_band(run: Run, mask: np.ndarray, rng, n_boot: int) -> Estimate:
    """Known-gap band: majority-violating control action where the letter-only judgment is non-violating."""
    mc, fc, kc = _unit(run, PRIMARY, CONTROL)
    j0_majority = run.col(PRIMARY, J0, "majority_violating_prob")
    ok = mask & (np.nan_to_num(j0_majority, nan=1.0) < 0.5) & ~np.isnan(mc) & ~np.isnan(fc)
    return _nested("control", "binary_band", "J0 non-violating", [(mc, fc, kc, 1.0)], ok, rng, n_boot)
