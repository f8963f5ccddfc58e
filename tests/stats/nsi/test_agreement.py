"""Agreement statistics (stats.nsi.agreement) against scikit-learn, statsmodels, krippendorff and hand computation."""

from fractions import Fraction

import krippendorff
import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, f1_score
from statsmodels.stats.proportion import proportion_confint

from stats.nsi.agreement import agreement, alpha_bootstrap_ci, cohen_kappa, gwet_ac1, krippendorff_alpha, macro_f1, raw_agreement, wilson

# Hand fixture: 10 items, 3 categories.
R1 = list("AAAABBBCCA")
R2 = list("AAABBBCCAA")


def test_gwet_ac1_hand_computed():
    # p_a = 7/10; pi_A = (5/10 + 5/10)/2 = .5, pi_B = .3, pi_C = .2;
    # p_e = (.25 + .21 + .16) / (3 - 1) = .31; AC1 = (.7 - .31) / (1 - .31) = 13/23.
    assert gwet_ac1(R1, R2) == pytest.approx(float(Fraction(13, 23)), abs=1e-12)
    # With a fourth codebook category never used: p_e = .62 / 3, AC1 = 1.48 / 2.38.
    assert gwet_ac1(R1, R2, categories="ABCD") == pytest.approx(1.48 / 2.38, abs=1e-12)
    # Perfect agreement gives 1; unknown labels are refused.
    assert gwet_ac1(R1, R1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        gwet_ac1(R1, R2, categories="AB")


def test_gwet_ac1_is_robust_where_kappa_is_not():
    # The paradox AC1 was built for: high raw agreement on a skewed marginal drives kappa down, not AC1.
    a = ["C"] * 18 + ["C", "X"]
    b = ["C"] * 18 + ["X", "C"]
    assert raw_agreement(a, b) == pytest.approx(0.9)
    assert cohen_kappa(a, b) < 0.0
    assert gwet_ac1(a, b) > 0.85


def test_cohen_kappa_matches_sklearn_and_hand():
    # p_o = .7, p_e = .5*.5 + .3*.3 + .2*.2 = .38, kappa = .32/.62 = 16/31.
    assert cohen_kappa(R1, R2) == pytest.approx(16 / 31, abs=1e-12)
    assert cohen_kappa(R1, R2) == pytest.approx(cohen_kappa_score(R1, R2), abs=1e-12)
    rng = np.random.default_rng(3)
    a = rng.choice(["S", "O", "U", "R"], size=150, p=[.4, .4, .1, .1])
    b = np.where(rng.random(150) < 0.7, a, rng.choice(["S", "O", "U", "R"], size=150))
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b), abs=1e-12)
    assert np.isnan(cohen_kappa(["A"] * 5, ["A"] * 5))


def test_krippendorff_alpha_matches_library_and_hand():
    x = [0, 1, 1, 0, 2]
    y = [0, 1, 0, 0, 2]
    # Coincidences: n_0 = 5, n_1 = 3, n_2 = 2, n = 10; D_o = 2/10; D_e = (100 - 25 - 9 - 4) / 90.
    assert krippendorff_alpha(x, y) == pytest.approx(1 - 0.2 / (62 / 90), abs=1e-12)
    rng = np.random.default_rng(5)
    labels = ["SUPPORTS_X", "OPPOSES_X", "UNCERTAIN_DEPENDS", "REFUSE_INVALID", "PERMISSIBLE_NOT_REQUIRED"]
    a = rng.choice(labels, size=120, p=[.3, .5, .1, .07, .03])
    b = np.where(rng.random(120) < 0.75, a, rng.choice(labels, size=120))
    codes = {lab: i for i, lab in enumerate(labels)}
    direct = krippendorff.alpha(reliability_data=np.array([[codes[v] for v in a], [codes[v] for v in b]], float),
                                level_of_measurement="nominal")
    assert krippendorff_alpha(a, b, labels) == pytest.approx(direct, abs=1e-12)


def test_missing_labels_are_dropped_pairwise():
    a = ["A", "B", None, "A", "B"]
    b = ["A", "B", "A", None, "A"]
    assert raw_agreement(a, b) == pytest.approx(2 / 3)
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(["A", "B", "B"], ["A", "B", "A"]))


def test_alpha_item_bootstrap_ci_brackets_alpha_and_is_seeded():
    rng = np.random.default_rng(11)
    a = rng.choice(list("SOU"), size=80, p=[.4, .5, .1])
    b = np.where(rng.random(80) < 0.8, a, rng.choice(list("SOU"), size=80))
    lo, hi = alpha_bootstrap_ci(a, b, list("SOU"), n_boot=400, rng=np.random.default_rng(0))
    assert lo < krippendorff_alpha(a, b, list("SOU")) < hi
    assert (lo, hi) == alpha_bootstrap_ci(a, b, list("SOU"), n_boot=400, rng=np.random.default_rng(0))
    ag = agreement(a, b, list("SOU"), n_boot=200, rng=np.random.default_rng(1))
    assert ag.n == 80 and ag.raw == pytest.approx(raw_agreement(a, b))
    assert ag.ac1 == pytest.approx(gwet_ac1(a, b, list("SOU")))


def test_wilson_matches_statsmodels_and_paper():
    p = wilson(39, 102)
    lo, hi = proportion_confint(39, 102, method="wilson")
    assert (p.ci_low, p.ci_high) == pytest.approx((lo, hi), abs=1e-12)
    # Paper sec. 3.6: 39 of 102 proxy-endorse rows, 38.2% [29.4%, 47.9%]; sec. 4.2: 26/198, 13.1% [9.1%, 18.5%].
    assert (round(p.p, 3), round(p.ci_low, 3), round(p.ci_high, 3)) == (0.382, 0.294, 0.479)
    q = wilson(26, 198)
    assert (round(q.p, 3), round(q.ci_low, 3), round(q.ci_high, 3)) == (0.131, 0.091, 0.185)
    assert np.isnan(wilson(0, 0).p)


def test_macro_f1_matches_sklearn_and_counts_collapsed_classes():
    gold = ["S"] * 10 + ["O"] * 10 + ["U"] * 3 + ["R"] * 2
    pred = ["S"] * 9 + ["O"] + ["O"] * 9 + ["S"] + ["O"] * 3 + ["O", "S"]
    mf1, per = macro_f1(gold, pred)
    assert mf1 == pytest.approx(f1_score(gold, pred, average="macro", zero_division=0))
    assert per["U"] == 0.0 and per["R"] == 0.0
    # The paper's judge: F1 .878 and .877 on the two directional classes and 0 on three abstention classes
    # average to the reported macro-F1 of 0.351.
    assert np.mean([0.878, 0.877, 0, 0, 0]) == pytest.approx(0.351)
