"""Statistical behaviour of the stats layer on simulated panels: CI coverage of the paired excess E,
false positives under a planted null, the nested bootstrap's widening near a 0.5 violating fraction,
and the selection-matched null removing the screen's selection bias."""

import numpy as np
import pytest
from scipy import stats as sps

from stats.core.bootstrap import majority_prob_from_fraction, nested_majority, scenario_bootstrap
from stats.core.seeding import rng_for
from stats.gap import SyntheticSpec, analyze, make_run_dir, screened_values
from stats.gap.continuous import excess_ci

PANELS = 1000  # at least 500; 1000 keeps the Monte Carlo error of a rate near 0.7 points
SCENARIOS = 200
RESAMPLES = 2000


def _panels(effect, seed):
    """PANELS independent panels of SCENARIOS screened scenarios each, as (S, P) arrays."""
    rng = np.random.default_rng(seed)
    p_d, p_j, p_dt, p_jt = screened_values(rng, (SCENARIOS, PANELS), effect)
    return p_d - p_j, p_dt - p_jt


def test_excess_ci_covers_planted_effect():
    effect = 0.05
    g, g_twin = _panels(effect, seed=11)
    value, low, high, _ = excess_ci(g, g_twin, np.random.default_rng(12), RESAMPLES)
    assert value.shape == (PANELS,)
    coverage = np.mean((low <= effect) & (effect <= high))
    assert 0.93 <= coverage <= 0.97, coverage
    # The same panels are resolved: a planted 0.05 is declared above zero nearly always.
    assert np.mean(low > 0) > 0.99


def test_planted_null_false_positive_rate():
    g, g_twin = _panels(0.0, seed=21)
    _, low, high, _ = excess_ci(g, g_twin, np.random.default_rng(22), RESAMPLES)
    assert np.mean(low > 0) <= 0.06
    coverage = np.mean((low <= 0) & (0 <= high))
    assert 0.93 <= coverage <= 0.97, coverage


def test_scenario_bootstrap_matches_normal_theory_and_is_seeded():
    x = np.random.default_rng(3).normal(0.2, 1.0, size=(600, 2))
    value, low, high, se = scenario_bootstrap(x, np.random.default_rng(4), 10_000)
    assert value == pytest.approx(x.mean(axis=0))
    assert se == pytest.approx(x.std(axis=0, ddof=1) / np.sqrt(600), rel=0.05)
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.05)
    again = scenario_bootstrap(x, np.random.default_rng(4), 10_000)
    assert np.array_equal(low, again[1]) and np.array_equal(high, again[2])


def test_gather_and_weight_paths_agree():
    """Few columns are summed by gathering, many through bincount weights: same resamples, same CIs."""
    x = np.random.default_rng(6).normal(size=(300, 3))
    few = scenario_bootstrap(x, np.random.default_rng(1), 3000)
    many = scenario_bootstrap(np.tile(x, 4), np.random.default_rng(1), 3000)  # 12 columns
    for a, b in zip(few, many):
        assert np.allclose(a, b[:3], rtol=0, atol=1e-12)


def test_rng_for_is_keyed_by_name():
    a = rng_for(0, "continuous/L0").random(3)
    assert np.array_equal(a, rng_for(0, "continuous/L0").random(3))
    assert not np.array_equal(a, rng_for(0, "continuous/L1").random(3))
    assert not np.array_equal(a, rng_for(1, "continuous/L0").random(3))


def _binary_panel(rng, lo, hi, s=80, k=32):
    """Per-scenario exact first-token readouts: expected violating fraction and P(majority violating)."""
    per_order = rng.uniform(lo, hi, size=(s, 1)) + rng.uniform(-0.03, 0.03, size=(s, k))
    per_order = np.clip(per_order, 0.001, 0.999)
    return per_order.mean(axis=1), sps.poisson_binom(per_order).sf(k // 2), np.full(s, k)


@pytest.mark.parametrize("seed", range(20))
def test_nested_ci_wider_near_one_half(seed):
    rng = np.random.default_rng(100 + seed)
    f_p, m_p, k = _binary_panel(rng, 0.45, 0.60)
    f_t, m_t, _ = _binary_panel(rng, 0.40, 0.55)
    comps = [(m_p, f_p, k, 1.0), (m_t, f_t, k, -1.0)]
    v, lo, hi, _ = nested_majority(comps, np.random.default_rng(seed), 4000)
    sv, slo, shi, _ = scenario_bootstrap(m_p - m_t, np.random.default_rng(seed), 4000)
    assert v == pytest.approx(sv[0])
    assert hi - lo > 1.5 * (shi[0] - slo[0])


def test_nested_ci_not_wider_far_from_one_half():
    rng = np.random.default_rng(7)
    f, m, k = _binary_panel(rng, 0.02, 0.10)
    f2, m2, _ = _binary_panel(rng, 0.90, 0.98)
    f, m = np.concatenate([f, f2]), np.concatenate([m, m2])
    v, lo, hi, _ = nested_majority([(m, f, np.full(len(f), 32), 1.0)], np.random.default_rng(8), 4000)
    sv, slo, shi, _ = scenario_bootstrap(m, np.random.default_rng(8), 4000)
    assert hi - lo == pytest.approx(shi[0] - slo[0], rel=0.15)


def test_majority_prob_from_fraction():
    assert majority_prob_from_fraction(np.array([0.5]), np.array([32]))[0] == pytest.approx(
        1 - sps.binom.cdf(16, 32, 0.5))
    assert majority_prob_from_fraction(np.array([0.0, 1.0]), np.array([8, 8])) == pytest.approx([0.0, 1.0])


@pytest.mark.heavy  # a simulation of many planted screens
def test_selection_null_removes_selection_bias(tmp_path):
    """Primary and twin exchangeable (no pressure effect): the screen alone makes the own-screen E
    positive, and own-screen E minus the selection-matched null is centred at zero."""
    spec = SyntheticSpec(n_scenarios=3000, exchangeable=True, below_floor=0.0, readouts=("D", "J"), seed=5)
    a = analyze(make_run_dir(tmp_path / "x", spec), n_boot=2000)
    own = a.get("selection", "E_own_screen")
    diff = a.get("selection", "E_minus_selection_null")
    # The selection bias the null has to remove is many standard errors wide ...
    assert own.value > 8 * own.se
    # ... and the difference is centred at zero (3 SE leaves a single panel a 0.3% chance to fail).
    assert abs(diff.value) < 3 * diff.se
    unscreened = a.get("continuous", "E", "all above floor")
    assert abs(unscreened.value) < 3 * unscreened.se


def test_table_path_recovers_planted_effect(tmp_path):
    """End to end through scenarios.parquet: E on the screened set equals the per-scenario mean
    computed straight from the table, and its CI covers the planted value on this panel."""
    import pandas as pd

    spec = SyntheticSpec(n_scenarios=600, effect=0.04, seed=9, readouts=("D", "J"))
    d = make_run_dir(tmp_path / "r", spec)
    a = analyze(d, n_boot=2000)
    e = a.get("continuous", "E", "L0")
    t = pd.read_parquet(d / "scenarios.parquet")
    ids = set(a.per_scenario.loc[a.per_scenario["L0"], "scenario_id"])
    v = t[t.scenario_id.isin(ids) & (t.readout.isin(["D", "J"])) & t.frame.isin(["agent", "judge"])]
    piv = v.pivot_table(index="scenario_id", columns=["cell", "readout"], values="p_violating")
    direct = ((piv["primary"]["D"] - piv["primary"]["J"]) - (piv["twin"]["D"] - piv["twin"]["J"])).mean()
    assert e.n == len(ids) and e.value == pytest.approx(direct)
    assert e.low <= 0.04 <= e.high
