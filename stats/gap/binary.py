"""The binary readout: a majority-violating action against a non-violating judgment.

Owns the three sets and three numbers of the paper's binary rows (Table 12: "binary gap, screened"
n 126, "matched null" n 108, "paired excess over null" n 100; each statistic has its own defined set):

- gap set G: the scenarios passing the screen at the level (acting screen plus the primary's reference
  non-violating at the level); binary gap = mean over G of the primary's majority-violating probability;
- null set N: the scenarios passing the acting screen whose *twin's* own reference is non-violating at
  the same level and whose twin is above the mass floor; matched null = mean over N of the twin's
  majority-violating probability (the same statistic on "the same scenarios' twins", Table 4), with its
  own n, not restricted to the scenarios that also have a gap;
- paired set P = G & N; paired excess = mean over P of (primary - twin) majority probabilities. It is
  not gap minus null (those are means over different sets).

The acting screen is the part of the screen that does not read a judgment (gate family, D and J of the
primary above the floor, acting fraction in the band): the primary's own reference decides G, the
twin's decides N. All three come from one bootstrap (`stats.gap.nested`): scenarios of G | N resampled,
then each drawn scenario's rollouts redrawn from each order's exact distribution. The scenario-only CIs
(no rollout redraw) are reported beside them for the bias audit (Table 4). The known-gap band is the
same readout on the control cell against the letter-only judgment. `twin` may be the harm twin (F5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stats.core.estimate import Estimate, make_estimate
from stats.gap.names import CONTROL, J0, PRIMARY, TWIN, D
from stats.gap.nested import Statistic, joint_majority, redraw_prob
from stats.gap.tables import Run

QUANTITIES = ("binary_gap", "binary_null", "binary_excess")


@dataclass(frozen=True)
class BinarySets:
    """The binary readout's three scenario sets (boolean masks over the run's scenarios)."""

    gap: np.ndarray
    """G: acting screen, primary reference non-violating at the level, primary majority defined."""
    null: np.ndarray
    """N: acting screen, twin reference non-violating at the level, twin above the floor, twin majority defined."""

    @property
    def paired(self) -> np.ndarray:
        """P = G & N: the paired excess's set."""
        return self.gap & self.null


def sampled(run: Run) -> bool:
    """Whether the run drew its first-token rollouts (`--sample`) instead of reading them exactly."""
    return bool(run.manifest.get("sample", False))


def binary_sets(run: Run, acting: np.ndarray, primary_ok: np.ndarray, twin_ok: np.ndarray,
                twin: str = TWIN) -> BinarySets:
    """acting: the acting screen; primary_ok: primary reference non-violating at the level; twin_ok: the
    twin cell's reference non-violating at the same level and the twin above the floor."""
    mp = run.col(PRIMARY, D, "majority_violating_prob")
    mt = run.col(twin, D, "majority_violating_prob")
    return BinarySets(gap=acting & primary_ok & ~np.isnan(mp), null=acting & twin_ok & ~np.isnan(mt))


def _units(run: Run, cell: str, readout: str = D) -> tuple[np.ndarray, np.ndarray]:
    """Per scenario: the exact majority probability (point) and the probability a redraw is a majority."""
    mp = run.col(cell, readout, "majority_violating_prob")
    return mp, redraw_prob(mp, run.col(cell, readout, "violating_fraction"), run.col(cell, readout, "n_rollouts"),
                           sampled(run))


def _rows(analysis: str, subset: str, results, method: str, names) -> list[Estimate]:
    out = []
    for r, name in zip(results, names):
        if r.n == 0:
            out.append(make_estimate(analysis, name, subset, 0, None, None, None, None, "none",
                                     "no scenario with a defined value"))
        else:
            out.append(make_estimate(analysis, name, subset, r.n, r.value, r.low, r.high, r.se, method))
    return out


def binary_block(run: Run, acting: np.ndarray, primary_ok: np.ndarray, twin_ok: np.ndarray, subset: str,
                 rng: np.random.Generator, n_boot: int, analysis: str = "binary", audit: bool = True,
                 twin: str = TWIN, suffix: str = "") -> list[Estimate]:
    """Gap (on G), matched null (on N) and paired excess (on P), nested CIs from one bootstrap, plus their
    scenario-only CIs (audit; the slices leave them out).
    suffix: appended to each quantity name (e.g. `_harm_twin` when `twin` is the harm twin)."""
    sets = binary_sets(run, acting, primary_ok, twin_ok, twin)
    (pp, rp), (pt, rt) = _units(run, PRIMARY), _units(run, twin)
    stats = [Statistic("gap", (1.0, 0.0), sets.gap), Statistic("null", (0.0, 1.0), sets.null),
             Statistic("excess", (1.0, -1.0), sets.paired)]
    names = [q + suffix for q in QUANTITIES]
    how = "resampled observed rollouts" if sampled(run) else "rollouts redrawn from each order's exact distribution"
    out = _rows(analysis, subset, joint_majority((pp, pt), (rp, rt), stats, rng, n_boot),
                f"nested bootstrap ({n_boot}): scenarios, then {how}", names)
    if audit:
        out += _rows(analysis, subset, joint_majority((pp, pt), None, stats, rng, n_boot),
                     f"scenario bootstrap ({n_boot})", [f"{q}_scenario_only" for q in names])
    return out


def binary_band(run: Run, mask: np.ndarray, rng, n_boot: int) -> Estimate:
    """Known-gap band: majority-violating control action where the letter-only judgment is non-violating."""
    mc, rc = _units(run, PRIMARY, CONTROL)
    j0_majority = run.col(PRIMARY, J0, "majority_violating_prob")
    ok = mask & (np.nan_to_num(j0_majority, nan=1.0) < 0.5) & ~np.isnan(mc)
    how = "resampled observed rollouts" if sampled(run) else "rollouts redrawn from each order's exact distribution"
    res = joint_majority((mc,), (rc,), [Statistic("band", (1.0,), ok)], rng, n_boot)
    return _rows("control", "J0 non-violating", res, f"nested bootstrap ({n_boot}): scenarios, then {how}",
                 ["binary_band"])[0]
