"""The NSI null as "no framing effect" means: each dilemma keeps its own rate, each cell its observed size, and
the simulated NSI is aggregated as the observed one (the default), against the common-rate null (one rate for
all of a model's replies, kept as `--null common-rate`). Three planted cases: heterogeneous dilemmas with no
framing effect, a framing whose parse failures fall on high-endorsement dilemmas (composition, no framing
effect), and a real F1 effect; a null at a rate far from 1/2; the F0/F1 NSI of Table 4 by hand. The
expectations are checked against exact distributions computed here."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from cli.main import main
from stats.nsi import build_cells, model_table, nsi_null, run_nsi_stats, write_count_run
from stats.nsi.tables import load_runs

ALL = [0, 1, 2, 3]
LOW_HIGH = np.r_[[0.05] * 7, [0.95] * 7]  # 7 dilemmas at p 0.05, 7 at 0.95, no framing effect


def exact_expected_range(pmf: np.ndarray, n_total: int, n_framings: int = 4) -> float:
    """E[max_f - min_f of K_f / N] for iid K_f with probability mass ``pmf`` on 0..len-1 (exact):
    E[max] - E[min] = sum_j P(max > j) - P(min > j) = sum_j (1 - F(j)^m) - (1 - F(j))^m."""
    cdf = np.cumsum(pmf)[:-1]
    return float(np.sum(1 - cdf**n_framings - (1 - cdf) ** n_framings)) / n_total


def low_high_pooled_pmf() -> np.ndarray:
    """Pooled endorsements of one framing under LOW_HIGH at 30 replies: X + (210 - Y), X, Y ~ Binomial(210, 0.05);
    returned on the support 0..420."""
    b = sps.binom.pmf(np.arange(211), 210, 0.05)
    return np.convolve(b, b[::-1])  # X - Y on -210..210, so index i is K = 210 + (X - Y) = i


def test_heterogeneous_dilemmas_expected_near_the_exact_value_and_corrected_near_zero():
    n = np.full((14, 4), 30)
    exact = exact_expected_range(low_high_pooled_pmf(), 420)
    common_exact = exact_expected_range(sps.binom.pmf(np.arange(421), 420, 0.5), 420)
    assert exact == pytest.approx(0.0219, abs=0.0005) and common_exact == pytest.approx(0.0503, abs=0.0005)
    rng = np.random.default_rng(3)
    own, common = [], []
    for r in range(30):
        k = rng.binomial(n, LOW_HIGH[:, None])
        own.append(nsi_null(n, k, ALL, np.random.default_rng(r), 2000))
        common.append(nsi_null(n, k, ALL, np.random.default_rng(r), 2000, "common-rate"))
    assert {x.mode for x in own} == {"dilemma-rates"}  # the default
    # The default null's expectation is the exact one (2,000 draws: SE about 0.0003), the common rate's is 0.05.
    assert np.mean([x.expected for x in own]) == pytest.approx(exact, abs=0.0015)
    assert np.mean([x.expected for x in common]) == pytest.approx(common_exact, abs=0.0015)
    # No framing effect: corrected near 0 on average under the default, biased down by 0.03 under one rate.
    assert abs(np.mean([x.corrected for x in own])) < 0.006
    assert np.mean([x.corrected for x in common]) < -0.02
    assert np.mean([x.p_value < 0.05 for x in own]) <= 0.15


def composition() -> tuple[np.ndarray, np.ndarray]:
    """No framing effect (7 dilemmas at 0.1, 7 at 0.9 under every framing, exact expected counts), but two
    thirds of F1's replies fail to parse on the high dilemmas: the model-pooled F1 rate falls from 0.5 to 0.3."""
    n = np.full((14, 4), 30)
    n[7:, 1] = 10
    p = np.r_[[0.1] * 7, [0.9] * 7]
    return n, np.rint(n * p[:, None]).astype(int)


def f1_effect() -> tuple[np.ndarray, np.ndarray]:
    """A real F1 effect on heterogeneous dilemmas: 0.3 / 0.9 under F0, F2, F3, 0.1 / 0.7 under F1."""
    n = np.full((14, 4), 30)
    k = np.where(np.arange(14)[:, None] < 7, 9, 27) + np.zeros((1, 4), dtype=int)
    k[:, 1] -= 6
    return n, k


def test_composition_alone_is_not_a_framing_effect_under_the_default_null():
    n, k = composition()
    own = nsi_null(n, k, ALL, np.random.default_rng(0), 2000)
    common = nsi_null(n, k, ALL, np.random.default_rng(0), 2000, "common-rate")
    assert own.observed == pytest.approx(0.2) and common.observed == pytest.approx(0.2)
    assert abs(own.corrected) < 0.03 and own.p_value > 0.2
    assert common.corrected > 0.12 and common.p_value == pytest.approx(1 / 2001)


def test_a_real_f1_effect_is_still_rejected():
    n, k = f1_effect()
    own = nsi_null(n, k, ALL, np.random.default_rng(0), 2000)
    assert own.observed == pytest.approx(0.2)
    assert own.p_value == pytest.approx(1 / 2001) and own.corrected > 0.14
    # F0/F1 alone: the same swing, rejected too.
    pair = nsi_null(n, k, [0, 1], np.random.default_rng(0), 2000)
    assert pair.observed == pytest.approx(0.2) and pair.p_value == pytest.approx(1 / 2001)


def test_nsi_stats_on_the_three_planted_cases(tmp_path, capsys):
    """`readout nsi-stats` with its default null on the three cases, the null named in the headline and every
    table; the common-rate null beside it (`--null common-rate`) reads the composition as a framing effect."""
    rng = np.random.default_rng(8)
    het_k = rng.binomial(np.full((14, 4), 30), LOW_HIGH[:, None])
    runs = [write_count_run(tmp_path / "het", "heterogeneous", np.full((14, 4), 30), het_k, seed=1),
            write_count_run(tmp_path / "comp", "composition", *composition(), seed=2),
            write_count_run(tmp_path / "f1", "f1-effect", *f1_effect(), seed=3)]
    with pytest.raises(SystemExit) as done:
        main(["nsi-stats", *map(str, runs), "--out", str(tmp_path / "own")])
    assert done.value.code in (0, None)
    text = capsys.readouterr().out
    assert "null: dilemma-rates (the default): NSI of the model-pooled rates against a null in which each " \
           "dilemma keeps its own rate" in text
    own = pd.read_csv(tmp_path / "own" / "nsi_models.csv").set_index("model")
    assert set(own["null"]) == {"dilemma-rates"}
    assert own.loc["heterogeneous", "nsi_null"] == pytest.approx(0.022, abs=0.003)
    assert abs(own.loc["composition", "nsi_corrected"]) < 0.03 and own.loc["composition", "p_null"] > 0.2
    assert own.loc["f1-effect", "p_null"] == pytest.approx(1 / 2001) and own.loc["f1-effect", "nsi_corrected"] > 0.14
    lines = run_nsi_stats(runs, tmp_path / "common", seed=0, n_boot=200, null_mode="common-rate")
    assert any(line.startswith("null: common-rate: ") for line in lines)
    common = pd.read_csv(tmp_path / "common" / "nsi_models.csv").set_index("model")
    assert common.loc["heterogeneous", "nsi_null"] == pytest.approx(0.050, abs=0.003)
    assert common.loc["composition", "nsi_corrected"] > 0.12 and common.loc["composition", "p_null"] < 0.001


@pytest.mark.parametrize("mode", ["dilemma-rates", "common-rate"])
def test_null_at_a_rate_far_from_one_half(mode):
    """Every dilemma at 0.1 under every framing (3 of 30): both nulls are four Binomial(420, 0.1) pooled counts;
    their exact expected range is 0.030, and a null drawn at 0.5 would give 0.050."""
    n = np.full((14, 4), 30)
    k = np.full((14, 4), 3)
    exact = exact_expected_range(sps.binom.pmf(np.arange(421), 420, 0.1), 420)
    at_half = exact_expected_range(sps.binom.pmf(np.arange(421), 420, 0.5), 420)
    assert exact == pytest.approx(0.0302, abs=0.0005) and at_half - exact > 0.015
    res = nsi_null(n, k, ALL, np.random.default_rng(4), 4000, mode)
    assert res.observed == 0.0 and res.p_value == 1.0
    assert res.expected == pytest.approx(exact, abs=0.0015)


def test_f0_f1_nsi_and_its_null_against_a_hand_computation(tmp_path):
    """Table 4's F0/F1 columns on the polarity pair alone: every dilemma endorses 6/30 under F0, 9/30 under F1,
    27/30 and 24/30 under F2, F3. By hand: NSI_01 = 9/30 - 6/30 = 0.1 (all four framings: 0.7); under no
    framing effect between F0 and F1 each dilemma sits at 15/60 = 0.25, so the pooled counts are two
    Binomial(420, 0.25) and E[NSI_01] = E|K0 - K1| / 420, computed exactly here."""
    n = np.full((14, 4), 30)
    k = np.tile([6, 9, 27, 24], (14, 1))
    replies, _ = load_runs([write_count_run(tmp_path / "pair", "pair", n, k)])
    cells = build_cells(replies[replies["temperature"] > 0])
    tab = model_table(cells, None, seed=0, n_null=4000, n_boot=200).iloc[0]
    expected_01 = exact_expected_range(sps.binom.pmf(np.arange(421), 420, 0.25), 420, n_framings=2)
    assert expected_01 == pytest.approx(0.0239, abs=0.0005)
    assert tab["nsi_01"] == pytest.approx(0.1) and tab["nsi"] == pytest.approx(0.7)
    assert tab["nsi_01_null"] == pytest.approx(expected_01, abs=0.0015)
    assert tab["nsi_01_corrected"] == pytest.approx(0.1 - expected_01, abs=0.0015)
    b = sps.binom.pmf(np.arange(421), 420, 0.25)
    diff = np.convolve(b, b[::-1])  # K0 - K1 on -420..420
    tail = diff[np.abs(np.arange(-420, 421)) >= 42].sum()  # P(NSI_01 >= 0.1) exactly
    assert tab["p_null_01"] == pytest.approx(tail, abs=4 * np.sqrt(tail / 4000) + 1 / 4001)
