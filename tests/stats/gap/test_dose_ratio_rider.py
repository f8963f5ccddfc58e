"""The dose arm's ratio reading (P1-A14) and the rider's per-scenario agreement (P1-A6): by hand on the
8-scenario fixture, in `readout stats`' dose.csv, and the ratio's CI coverage on planted ratios."""


import numpy as np
import pandas as pd
import pytest

from stats.gap import analyze, run_report
from stats.gap.dose import ratio_reading
from tests.helpers import scenario_row


def test_ratio_reading_and_rider_agreement_by_hand(dose_run):
    a = analyze(dose_run, n_boot=300)
    ratio = a.get("dose", "reasoning / filler", "primary")
    assert ratio.n == 3 and ratio.value == pytest.approx((0.3 + 0.2 + 0.5) / (0.5 + 0.4 + 0.5))
    assert ratio.low <= ratio.value <= ratio.high and "ours" in ratio.note
    rider = a.get("dose", "rider agreement (2048 vs 512)", "primary")
    assert rider.n == 3 and rider.value == pytest.approx((1 + 0.5 + 0.5) / 3)  # s3: rollouts 1 and 3 agree
    assert a.get("dose", "completed: rider (2048)", "primary").value == pytest.approx(0.75)
    quantities = [e.quantity for e in a.select("dose", "primary")]
    assert quantities.index("reasoning - filler") < quantities.index("reasoning / filler") \
        < quantities.index("rider agreement (2048 vs 512)") < quantities.index("completed: reasoning (512)")


def test_rider_agreement_without_probes_is_named_not_guessed(dose_run):
    (dose_run / "probes.parquet").unlink()
    rider = analyze(dose_run, n_boot=100).get("dose", "rider agreement (2048 vs 512)", "primary")
    assert rider.n == 0 and rider.value is None and "probes.parquet" in rider.note


def test_readout_stats_writes_the_new_dose_rows(dose_run):
    run_report(dose_run, seed=0, n_boot=200)
    dose = pd.read_csv(dose_run / "stats" / "dose.csv")
    text = dose.to_string()
    for q in ("reasoning - filler", "reasoning / filler", "rider agreement (2048 vs 512)", "completed: rider (2048)"):
        assert q in text, q


@pytest.mark.heavy  # a coverage simulation over many planted experiments
def test_ratio_reading_ci_covers_a_planted_ratio():
    """Planted: each scenario's control-arm mass b ~ Beta(2, 3) and the arm's a = rho * b * noise (mean-one
    noise, clipped at 1), so the ratio of the means is about rho in the population (`_truth`); the 95% CI should
    cover it 93-97% of the time."""
    for rho in (0.6, 1.0):
        rng = np.random.default_rng([14, int(rho * 10)])
        hits, reps = 0, 2000
        for _ in range(reps):
            b = rng.beta(2, 3, size=130)  # Table 8's scenario counts: 130 and 114
            a = np.clip(rho * b * rng.gamma(8, 1 / 8, size=b.size), 0, 1)
            _, low, high, _ = ratio_reading(a, b, rng, 999)
            hits += low <= _truth(rho) <= high
        assert 0.93 <= hits / reps <= 0.97, (rho, hits / reps)


_TRUTHS: dict = {}


def _truth(rho: float) -> float:
    if rho not in _TRUTHS:
        rng = np.random.default_rng(99)
        b = rng.beta(2, 3, size=2_000_000)
        a = np.clip(rho * b * rng.gamma(8, 1 / 8, size=b.size), 0, 1)
        _TRUTHS[rho] = a.mean() / b.mean()
    return _TRUTHS[rho]


def test_norm_share_of_the_reasoning_contrast(dose_run):
    """The abstract's reading of the norm arm ("naming the norm at stake does about a third of that"): the norm
    arm's contrast with the filler as a share of the reasoning arm's, a ratio of mean contrasts on the same
    scenarios. Planted so that a mean of per-scenario ratios (s3: reasoning moves nothing, its ratio undefined)
    and a ratio of the arms' masses (norm over reasoning) give other numbers."""
    df = pd.read_parquet(dose_run / "scenarios.parquet")
    norm = {"s1": 0.45, "s2": 0.3, "s3": 0.4}  # filler 0.5, 0.4, 0.5; reasoning 0.3, 0.2, 0.5 (the fixture)
    extra = pd.DataFrame([scenario_row(sid, "F1", "primary", "dose_norm", "norm", p, budget=512, completed_fraction=0.2)
                          for sid, p in norm.items()]).assign(violating="b")
    df = pd.concat([df, extra], ignore_index=True)
    df["budget"] = df["budget"].astype("Int64")
    df.to_parquet(dose_run / "scenarios.parquet", index=False)
    share = analyze(dose_run, n_boot=300).get("dose", "(norm - filler) / (reasoning - filler)", "primary")
    assert share.n == 3 and share.value == pytest.approx((-0.05 - 0.1 - 0.1) / (-0.2 - 0.2 + 0.0))  # 0.625
    assert share.value != pytest.approx(sum(norm.values()) / (0.3 + 0.2 + 0.5))  # not norm / reasoning masses
    assert share.low <= share.value <= share.high
