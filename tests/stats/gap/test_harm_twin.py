"""F5 read against its harm-matched twin: with a planted harm contrast between the plain and the harm
twin, the plain-twin excess carries incentive plus harm while the harm-twin excess recovers the incentive."""

import pytest

from stats.gap import SyntheticSpec, analyze, make_run_dir
from stats.gap.report import headline

INCENTIVE, HARM = 0.04, 0.08


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    spec = SyntheticSpec(n_scenarios=1500, effect=INCENTIVE + HARM, harm_effect=HARM, seed=17, readouts=("D", "J"))
    return analyze(make_run_dir(tmp_path_factory.mktemp("harm") / "run", spec), n_boot=2000)


def test_harm_twin_excess_recovers_the_incentive(analysis):
    plain = analysis.get("slices", "E", "family=F5")
    harm = analysis.get("slices", "E_harm_twin", "family=F5")
    assert plain is not None and harm is not None and harm.n > 100
    # Against the plain twin, E is incentive plus harm: the harm contrast leaks into the "pressure" effect.
    assert abs(plain.value - (INCENTIVE + HARM)) < 3 * plain.se and plain.low > INCENTIVE
    # Against the harm twin, E is the incentive alone.
    assert abs(harm.value - INCENTIVE) < 3 * harm.se and harm.high < INCENTIVE + HARM
    # The binary readout moves the same way.
    b_plain = analysis.get("slices", "binary_excess", "family=F5")
    b_harm = analysis.get("slices", "binary_excess_harm_twin", "family=F5")
    assert b_harm.value < b_plain.value


def test_harm_twin_only_where_there_are_harm_twins(analysis):
    assert analysis.get("slices", "E_harm_twin", "family=F1") is None
    assert analysis.get("slices", "E_harm_twin", "family x generator=F5, team-a") is not None


def test_headline_puts_both_beside_each_other(analysis):
    line = next(x for x in headline(analysis) if x.startswith("F5"))
    assert "pressure-removed twin" in line and "harm-matched twin" in line
