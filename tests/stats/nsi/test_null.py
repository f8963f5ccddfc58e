"""The null of the negation paper: a model's NSI on its pooled rates, corrected by a null on its pooled
counts (Table 4, sec. 4.4; the default keeps each dilemma's rate, test_null_dilemma_rates.py; the common-rate
null here), against the per-dilemma reading, and the choice recorded in every output."""

import numpy as np
import pandas as pd
import pytest

from stats.nsi import (
    NULL_MODES,
    POOLED_NSI,
    coherent_rates,
    nsi_null,
    pooled_cluster_ci,
    pooled_nested_ci,
    run_nsi_stats,
    write_count_run,
)

ALL = [0, 1, 2, 3]


def phi_like() -> tuple[np.ndarray, np.ndarray]:
    """12 of 14 dilemmas flip F0 -> F1 (no endorsement under F0, all 30 endorse under F1), 30 replies per cell."""
    n = np.full((14, 4), 30)
    k = np.zeros((14, 4), dtype=int)
    k[:12, 1] = 30
    return n, k


def test_phi_like_pattern_corrects_at_the_papers_magnitude():
    n, k = phi_like()
    res = nsi_null(n, k, ALL, np.random.default_rng(0), 2000, "common-rate")
    # Table 4, Phi-4-mini: observed 0.857, corrected 0.813 (corrections of 15 of 16 models: 0.022-0.053).
    assert res.observed == pytest.approx(12 / 14)
    assert 0.02 <= res.expected <= 0.06
    assert res.corrected == pytest.approx(0.81, abs=0.02)
    assert res.p_value == pytest.approx(1 / 2001)  # above all 2,000 null draws, as sec. 4.4
    own = nsi_null(n, k, ALL, np.random.default_rng(0), 2000)  # the default: each dilemma keeps its rate
    assert own.observed == res.observed and 0.02 <= own.expected <= res.expected + 0.005
    assert own.corrected == pytest.approx(0.82, abs=0.02) and own.p_value == pytest.approx(1 / 2001)
    # The per-dilemma reading subtracts 3-4x as much on the same counts.
    per = nsi_null(n, k, ALL, np.random.default_rng(0), 2000, "per-dilemma")
    assert per.observed == pytest.approx(12 / 14)
    assert per.expected > 2.5 * res.expected and per.corrected < 0.75


def test_planted_no_framing_effect_gives_corrected_nsi_near_zero():
    rng = np.random.default_rng(11)
    corrected = []
    for _ in range(40):
        rates = coherent_rates(rng)  # the same rate under every framing of a dilemma
        n = np.full((14, 4), 30)
        k = rng.binomial(n, rates)
        corrected.append(nsi_null(n, k, ALL, np.random.default_rng(rng.integers(1 << 32)), 1000).corrected)
    corrected = np.array(corrected)
    assert abs(corrected.mean()) < 0.01
    assert np.abs(corrected).max() < 0.06


def test_cancelling_swings_separate_the_papers_nsi_from_the_per_dilemma_reading():
    """Seven dilemmas flip one way, seven the other: the model's pooled rates do not move with the framing
    (paper's NSI ~0), while every single dilemma swings fully (per-dilemma mean 1)."""
    n = np.full((14, 4), 30)
    k = np.zeros((14, 4), dtype=int)
    k[:7, [0, 2]] = 30  # endorse under the affirmative framings
    k[7:, [1, 3]] = 30  # endorse under the negated framings
    pooled = nsi_null(n, k, ALL, np.random.default_rng(1), 1000)
    per = nsi_null(n, k, ALL, np.random.default_rng(1), 1000, "per-dilemma")
    assert pooled.observed == 0.0 and pooled.corrected < 0 and pooled.p_value == 1.0
    assert per.observed == 1.0 and per.corrected > 0.8 and per.p_value < 0.001


def test_cluster_ci_of_the_pooled_nsi_resamples_dilemmas():
    n, k = phi_like()
    lo, hi = pooled_cluster_ci(n, k, np.random.default_rng(0), 4000)
    # Table 4, Phi-4-mini: [0.64, 1.00]: the resampled share of flipping dilemmas.
    assert lo == pytest.approx(9 / 14, abs=0.001) and hi == pytest.approx(1.0)


def test_nested_ci_resamples_replies_within_cells():
    """Two identical dilemmas (a model x domain): resampling dilemmas alone gives a point; the replies'
    binomial noise must widen it."""
    n = np.full((2, 4), 30)
    k = np.tile([9, 21, 12, 15], (2, 1))
    lo, hi = pooled_nested_ci(n, k, np.random.default_rng(0), 4000)
    observed = (21 - 9) / 30
    assert lo < observed - 0.05 and hi > observed + 0.05
    assert 0.1 < hi - lo < 0.6


def _write(tmp_path):
    n, k = phi_like()
    dirs = [write_count_run(tmp_path / "phi", "phi-like", n, k, seed=1)]
    rng = np.random.default_rng(5)
    flat = rng.binomial(np.full((14, 4), 30), coherent_rates(rng))
    dirs.append(write_count_run(tmp_path / "flat", "flat", np.full((14, 4), 30), flat, seed=2))
    return dirs


@pytest.mark.parametrize("mode", NULL_MODES)
def test_the_null_is_recorded_in_every_output(tmp_path, mode):
    dirs = _write(tmp_path)
    out = tmp_path / mode
    lines = run_nsi_stats(dirs, out, seed=0, n_null=500, n_boot=500, null_mode=mode)
    assert f"null: {mode}" in "\n".join(lines)
    for name in ("nsi_models", "nsi_model_domain", "nsi_domains", "nsi_tiers"):
        assert set(pd.read_csv(out / f"{name}.csv")["null"]) == {mode}, name
    assert f"null: {mode}" in (out / "nsi_models.md").read_text()
    models = pd.read_csv(out / "nsi_models.csv").set_index("model")
    if mode in POOLED_NSI:
        assert models.loc["phi-like", "nsi_corrected"] == pytest.approx(0.81, abs=0.02)
        assert abs(models.loc["flat", "nsi_corrected"]) < 0.05
        assert (models["nsi"] == models["nsi_pooled"]).all()
    else:
        assert models.loc["phi-like", "nsi_corrected"] < 0.75
        assert (models["nsi"] == models["nsi_dilemma_mean"]).all()
    # sec. 4.4: the null's p Bonferroni-adjusted over the models read.
    assert models.loc["phi-like", "p_null_bonferroni"] == pytest.approx(min(1.0, 2 * models.loc["phi-like", "p_null"]))


def test_default_null_keeps_each_dilemmas_rate(tmp_path):
    dirs = _write(tmp_path)
    lines = run_nsi_stats(dirs, tmp_path / "d", seed=0, n_null=300, n_boot=300)
    assert set(pd.read_csv(tmp_path / "d" / "nsi_models.csv")["null"]) == {"dilemma-rates"}
    assert "null: dilemma-rates (the default): " in "\n".join(lines)


def test_unknown_null_mode_is_refused(tmp_path):
    dirs = _write(tmp_path)
    with pytest.raises(ValueError, match="null mode 'pool'"):
        run_nsi_stats(dirs, tmp_path / "x", seed=0, n_null=50, n_boot=50, null_mode="pool")
