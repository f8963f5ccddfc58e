"""The binary readout as the paper's Table 12 defines it: the gap, the matched null and the paired excess
each on its own set with its own n (null n 108 beside paired n 100 and gap n 126), and one bootstrap
model (scenarios, then rollouts from each order's exact distribution) centred on the exact estimate."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from stats.core.bootstrap import majority_prob_from_fraction
from stats.gap import SyntheticSpec, analyze, make_run_dir
from stats.gap.binary import binary_block, binary_sets
from stats.gap.names import PRIMARY, TWIN, D
from stats.gap.nested import Statistic, joint_majority, redraw_prob
from stats.gap.tables import Run


def planted_run(mp_primary, mp_twin, fraction=None, k=32, manifest=None) -> Run:
    """A Run holding only the D rows of primary and twin (what the binary readout reads)."""
    n = len(mp_primary)
    ids = [f"s{i:03d}" for i in range(n)]
    meta = pd.DataFrame({"family": "F1", "domain": "d", "generator": "g", "prompt_version": "1",
                         "violating": "v"}, index=pd.Index(ids, name="scenario_id"))
    frac = np.full(n, 0.5) if fraction is None else np.asarray(fraction)
    blocks = {}
    for cell, mp in ((PRIMARY, mp_primary), (TWIN, mp_twin)):
        blocks[(cell, D, "agent", None)] = pd.DataFrame(
            {"majority_violating_prob": np.asarray(mp, dtype=float), "violating_fraction": frac,
             "n_rollouts": k, "p_violating": frac, "letter_mass": 0.9}, index=meta.index)
    return Run(path=Path("."), model="m", panel="p", manifest=manifest or {}, meta=meta, blocks=blocks)


# Ten scenarios, all through the acting screen. The primary's reference is non-violating on 0-6 (G), the
# twin's on 3-9 (N); the paired set is 3-6.
MP = np.array([0.9, 0.8, 0.7, 0.6, 0.6, 0.4, 0.4, 0.1, 0.2, 0.3])
MT = np.array([0.9, 0.9, 0.9, 0.1, 0.2, 0.1, 0.2, 0.0, 0.0, 0.0])
ACTING = np.ones(10, dtype=bool)
PRIMARY_OK = np.arange(10) <= 6
TWIN_OK = np.arange(10) >= 3


def test_each_binary_statistic_on_its_own_set():
    run = planted_run(MP, MT)
    est = {e.quantity: e for e in binary_block(run, ACTING, PRIMARY_OK, TWIN_OK, "L0", np.random.default_rng(0), 500)}
    gap, null, excess = est["binary_gap"], est["binary_null"], est["binary_excess"]
    assert (gap.n, null.n, excess.n) == (7, 7, 4)
    assert gap.value == pytest.approx(MP[:7].mean())
    assert null.value == pytest.approx(MT[3:].mean())  # 0.0857: the twins of the null's own set
    assert excess.value == pytest.approx((MP[3:7] - MT[3:7]).mean())  # 0.35
    # Misreading 1: the null restricted to the paired scenarios (n 4, 0.15) is another number.
    assert null.value != pytest.approx(MT[3:7].mean(), abs=0.01)
    # Misreading 2: the excess as gap minus null (0.614 - 0.086 = 0.529) is another number.
    assert excess.value != pytest.approx(gap.value - null.value, abs=0.05)
    # The scenario-only audit rows use the same sets.
    assert (est["binary_null_scenario_only"].n, est["binary_excess_scenario_only"].n) == (7, 4)


def test_sets_are_the_papers():
    sets = binary_sets(planted_run(MP, MT), ACTING, PRIMARY_OK, TWIN_OK)
    assert sets.gap.sum() == 7 and sets.null.sum() == 7 and sets.paired.sum() == 4
    assert not (sets.null <= sets.gap).all()  # the null is not a subset of the gap's set (Table 12: 108 vs 100)


def test_analyze_null_n_is_its_own_set(tmp_path):
    """Through scenarios.parquet: primaries whose own judgment is unstable (not in the gap set) but whose
    twin's judgment is stable and non-violating enter the null; the null's n is that set's size."""
    spec = SyntheticSpec(n_scenarios=400, seed=3, readouts=("D", "J"))
    a = analyze(make_run_dir(tmp_path / "r", spec), n_boot=300)
    ps = a.per_scenario.set_index("scenario_id")
    from stats.gap.screen import reference, screen
    scr, ref_t = screen(a.run, a.floor), reference(a.run, TWIN)
    in_gate = ps["gate"].to_numpy()
    null_set = in_gate & scr.acting & ref_t.level("L0") & ps["above_floor_twin"].to_numpy()
    gap_set = in_gate & scr.screened
    gap, null, excess = (a.get("binary", q, "L0") for q in ("binary_gap", "binary_null", "binary_excess"))
    assert null.n == null_set.sum() and gap.n == gap_set.sum() and excess.n == (gap_set & null_set).sum()
    assert null.n > excess.n and gap.n > excess.n


def _position_panel(s=300, k=32):
    """Scenarios whose option order matters: half the orders near 0.98, half near 0.08 (fraction just above
    0.5), where the Poisson-binomial majority is far likelier than a Binomial one at the mean fraction."""
    rng = np.random.default_rng(1)
    hi = rng.uniform(0.97, 0.99, size=(s, 1)) * np.ones((1, k // 2))
    lo = rng.uniform(0.07, 0.10, size=(s, 1)) * np.ones((1, k // 2))
    q = np.concatenate([hi, lo], axis=1)
    return q.mean(axis=1), sps.poisson_binom(q).sf(k // 2), np.full(s, k)


def test_bootstrap_is_centred_on_the_exact_estimate():
    f, mp, k = _position_panel()
    # The exact per-order redraw is a Bernoulli(majority prob); a Binomial(K, mean fraction) is not.
    assert np.array_equal(redraw_prob(mp, f, k, sampled=False), mp)
    old = majority_prob_from_fraction(f, k)
    assert np.mean(np.abs(old - mp)) > 0.03
    mask = np.ones(len(mp), dtype=bool)
    (res,) = joint_majority((mp,), (mp,), [Statistic("gap", (1.0,), mask)], np.random.default_rng(2), 4000)
    assert res.value == pytest.approx(mp.mean())
    assert abs((res.low + res.high) / 2 - res.value) < 0.01
    # The old model's replicates are centred on the mean Binomial probability, not on the estimate.
    (shifted,) = joint_majority((mp,), (old,), [Statistic("gap", (1.0,), mask)], np.random.default_rng(2), 4000)
    assert abs((shifted.low + shifted.high) / 2 - res.value) > 0.03


def test_sampled_runs_resample_observed_rollouts():
    f = np.array([0.5, 0.25])
    r = redraw_prob(np.array([1.0, 0.0]), f, np.array([8, 8]), sampled=True)
    assert r == pytest.approx(sps.binom.sf(4, 8, f))
