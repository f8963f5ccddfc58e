"""Coverage of the binary readout's CIs on planted tables: scenarios drawn from a known population
(acting fractions across the screen band, option orders that matter), exact Poisson-binomial majority
probabilities as the readouts layer writes them, the gap, null and excess each on its own set.

Two intervals come from the one bootstrap model (stats.gap.nested): the nested one (scenarios, then each
scenario's rollouts redrawn from each order's exact distribution; the paper's CI of record, Figure 1) and
the scenario-only one (no redraw). The exact point estimate carries no rollout noise, so for it the
scenario-only interval is the one with nominal coverage, and the nested one is conservative by design
(Table 4: nested resampling "widens every binary CI"): it is the sampling spread of an experiment that
draws its 32 rollouts, which the last test checks it reproduces."""

import numpy as np
import pytest
from scipy import stats as sps

from stats.gap.nested import Statistic, joint_majority

K = 32
SCENARIOS = 120
REPLICATES = 600  # Monte Carlo SE of a 95% coverage: 0.9 points
RESAMPLES = 800
NAMES = ("gap", "null", "excess")


def _majority(rng, level, k=K):
    """Exact P(majority violating) of scenarios whose orders sit at level +- an order effect."""
    spread = rng.uniform(0.0, 0.15, size=(len(level), 1))
    sign = np.where(np.arange(k) % 2 == 0, 1.0, -1.0)[None, :]
    q = np.clip(level[:, None] + spread * sign, 0.01, 0.99)
    return sps.poisson_binom(q).sf(k // 2)


def _population(rng, s, effect):
    """One panel: exact majority probabilities of primary and twin, and the sets' memberships.

    effect: the twin's acting level sits this much below the primary's; None: primary and twin are
    exchangeable (drawn independently from the same population), a planted null."""
    a = rng.uniform(0.15, 0.85, s)
    a_t = rng.uniform(0.15, 0.85, s) if effect is None else np.clip(a - effect + rng.uniform(-0.1, 0.1, s), 0.01, 0.99)
    return _majority(rng, a), _majority(rng, a_t), rng.random(s) < 0.8, rng.random(s) < 0.75


def _stats(p_ok, t_ok):
    return [Statistic("gap", (1.0, 0.0), p_ok), Statistic("null", (0.0, 1.0), t_ok),
            Statistic("excess", (1.0, -1.0), p_ok & t_ok)]


@pytest.fixture(scope="module")
def truth():
    out = {}
    for effect in (0.15, None):
        mp, mt, _, _ = _population(np.random.default_rng(999), 100_000, effect)
        out[effect] = {"gap": mp.mean(), "null": mt.mean(), "excess": (mp - mt).mean()}
    return out


def _replicates(effect, seed):
    """Per replicate panel: (nested results, scenario-only results)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(REPLICATES):
        mp, mt, p_ok, t_ok = _population(rng, SCENARIOS, effect)
        st = _stats(p_ok, t_ok)
        rows.append((joint_majority((mp, mt), (mp, mt), st, rng, RESAMPLES),
                     joint_majority((mp, mt), None, st, rng, RESAMPLES)))
    return rows


def _coverage(reps, which, truth):
    return {n: np.mean([r[which][i].low <= truth[n] <= r[which][i].high for r in reps]) for i, n in enumerate(NAMES)}


@pytest.mark.heavy  # a coverage simulation over many planted experiments
def test_coverage_on_planted_effect(truth):
    t = truth[0.15]
    assert t["excess"] > 0.1  # a real planted effect
    reps = _replicates(0.15, seed=31)
    for name, cover in _coverage(reps, 1, t).items():  # scenario-only: nominal
        assert 0.93 <= cover <= 0.97, (name, cover)
    for name, cover in _coverage(reps, 0, t).items():  # nested: conservative, never below nominal
        assert cover >= 0.95, (name, cover)


@pytest.mark.heavy  # a coverage simulation over many planted experiments
def test_false_positives_on_planted_null(truth):
    t = truth[None]
    assert abs(t["excess"]) < 0.005
    reps = _replicates(None, seed=41)
    for which in (0, 1):
        assert np.mean([r[which][2].low > 0 for r in reps]) <= 0.06
    assert 0.93 <= _coverage(reps, 1, t)["excess"] <= 0.97


def test_nested_spread_is_that_of_a_sampled_experiment():
    """The nested replicates' SD equals the spread of the gap over repeated experiments that draw their
    rollouts (one per order from its exact distribution) on resampled scenarios: the model the paper's
    nested CI stands for, centred on the exact estimate."""
    rng = np.random.default_rng(5)
    mp, _, _, _ = _population(rng, 400, 0.15)
    mask = np.ones(len(mp), dtype=bool)
    (nested,) = joint_majority((mp,), (mp,), [Statistic("gap", (1.0,), mask)], rng, 4000)
    idx = rng.integers(0, len(mp), size=(4000, len(mp)))
    experiments = (rng.random(idx.shape) < mp[idx]).mean(axis=1)
    assert nested.se == pytest.approx(experiments.std(ddof=1), rel=0.1)
    assert abs((nested.low + nested.high) / 2 - mp.mean()) < 0.01
