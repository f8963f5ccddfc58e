"""Endorsement-side statistics on hand-built counts: inter-model agreement (sec. 4.1, Fig. 3) and the pooled
negated-vs-affirmative contrast (sec. 4.1)."""

import numpy as np
import pytest

from stats.nsi import Cells, agreement_table, endorsement_table, ratio_sum_ci


def _cells(k_by_model: dict, n: int = 10) -> Cells:
    models = tuple(k_by_model)
    k = np.array([k_by_model[m] for m in models])  # (M, S, 4)
    nn = np.full(k.shape, n)
    agree = np.where(np.array([False, True, False, True]), nn - k, k)
    return Cells(models, tuple(f"d{i}" for i in range(k.shape[1])), ("x",) * k.shape[1], nn, k, agree)


def test_agreement_is_the_chance_two_replies_carry_the_same_label():
    # Model a endorses 2 of 10 under every framing, model b 2 of 10 too: two replies agree with probability
    # 0.2 * 0.2 + 0.8 * 0.8 = 0.68; a third model that always endorses agrees with them 0.2 of the time.
    k = {"a": np.full((3, 4), 2), "b": np.full((3, 4), 2)}
    tab = agreement_table(_cells(k), seed=0, n_boot=200).set_index("framing")
    assert tab.loc["F0", "agreement"] == pytest.approx(0.68)
    k["c"] = np.full((3, 4), 10)
    tab = agreement_table(_cells(k), seed=0, n_boot=200).set_index("framing")
    assert tab.loc["F1", "agreement"] == pytest.approx((0.68 + 0.2 + 0.2) / 3)
    assert tab.loc["F1", "n_pairs"] == 3


def test_contrast_pools_replies_and_resamples_dilemmas():
    # Dilemma 0: all 10 replies endorse under F3, none elsewhere; the other dilemmas never endorse. Pooled
    # over F1 and F3 (80 replies) against F0 and F2: 10/80 - 0.
    k = {"m": np.array([[0, 0, 0, 10], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])}
    tab = endorsement_table(_cells(k), None, seed=0, n_boot=2000).set_index("model")
    assert tab.loc["m", "neg_minus_aff"] == pytest.approx(10 / 80)
    assert tab.loc["m", "F3"] == pytest.approx(10 / 40) and tab.loc["m", "F1"] == 0.0
    # Resampling the four dilemmas: the flipping one is drawn 0..4 times; the 97.5th percentile is 3 draws.
    assert tab.loc["m", "neg_minus_aff_ci_low"] == pytest.approx(0.0)
    assert tab.loc["m", "neg_minus_aff_ci_high"] == pytest.approx(30 / 80)
    value, lo, hi = ratio_sum_ci(np.array([[1, 0], [0, 1]]), np.array([[2, 2], [2, 2]]), [1.0, -1.0],
                                 np.random.default_rng(0), 500)
    assert value == 0.0 and lo == pytest.approx(-0.5) and hi == pytest.approx(0.5)
