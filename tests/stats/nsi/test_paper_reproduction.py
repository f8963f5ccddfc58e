"""Reproduction: `readout nsi-stats` on reply tables whose counts match the negation paper's Tables 2, 4 and 5
(tests/stats/nsi/paper_corpus.py) gives the paper's group rates, swings, acquiescence, NSI values, null
corrections, tiers and group tests. Every number below is the paper's; every computed one comes from the
real pipeline (run_nsi_stats writing CSV files), so a change to any of those computations fails here."""

import pandas as pd
import pytest

from stats.nsi import run_nsi_stats
from tests.stats.nsi.paper_corpus import GROUPS, write_corpus

# Table 2 (F0..F3), sec. 4.1 contrasts (pp) and sec. 4.2 pooled p0 + p1 - 1, per category.
TABLE2 = {"CN": (0.37, 0.21, 0.39, 0.44), "US": (0.25, 0.34, 0.32, 0.57), "OSS": (0.24, 0.77, 0.31, 1.00)}
CONTRAST_PP = {"OSS": 61.5, "US": 16.7, "CN": -5.8}
ACQUIESCENCE = {"OSS": -0.54, "US": -0.08, "CN": 0.16}
# Table 5: financial-1, percentage of responses pooled within category.
TABLE5 = {"CN": (25, 41, 20, 50), "US": (40, 98, 44, 0), "OSS": (52, 100, 100, 98)}
# Table 4: observed and corrected NSI.
TABLE4 = {
    "Phi-4-mini-3.8B": (0.857, 0.813), "LLaMA-3.2-1B": (0.857, 0.804), "Gemma-3-4B": (0.770, 0.718),
    "Claude-Haiku-4.5": (0.710, 0.670), "Granite-3.3-2B": (0.643, 0.602), "Grok-4.1-non-reasoning": (0.467, 0.435),
    "Claude-Sonnet-4.5": (0.421, 0.391), "GPT-5.2": (0.369, 0.340), "GLM-4.6": (0.356, 0.312),
    "Qwen3-8B": (0.341, 0.291), "GPT-5-mini": (0.334, 0.305), "Kimi-K2": (0.324, 0.293),
    "DeepSeek-V3.2": (0.213, 0.181), "Grok-4.1-reasoning": (0.202, 0.178), "Gemini-3-Flash": (0.181, 0.073),
    "GPT-5.1": (0.179, 0.157),
}
# Sec. 4.2: the most acquiescent and the most coherent models, |p0 + p1 - 1|.
ACQ_MODELS = {"LLaMA-3.2-1B": 0.68, "Phi-4-mini-3.8B": 0.50, "Granite-3.3-2B": 0.50, "GLM-4.6": 0.01,
              "Grok-4.1-reasoning": 0.01, "GPT-5.1": 0.06}
COUNT_STEP = 1 / 840  # half of one reply in 420: how closely a count can match a 3-decimal NSI


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper")
    dirs = write_corpus(root / "runs")
    run_nsi_stats(dirs, root / "stats", groups=GROUPS, seed=0, n_null=2000, n_boot=2000)
    return root / "stats"


def _csv(out, name):
    return pd.read_csv(out / f"{name}.csv")


def test_table2_group_rates_swings_and_acquiescence(out):
    groups = _csv(out, "nsi_endorsement_groups").set_index("group")
    for g, rates in TABLE2.items():
        assert [round(groups.loc[g, f], 2) for f in ("F0", "F1", "F2", "F3")] == list(rates), g
        assert round(100 * groups.loc[g, "neg_minus_aff"], 1) == CONTRAST_PP[g], g
        assert groups.loc[g, "neg_minus_aff_ci_low"] <= groups.loc[g, "neg_minus_aff"] <= groups.loc[g, "neg_minus_aff_ci_high"]
        assert round(groups.loc[g, "acquiescence"], 2) == ACQUIESCENCE[g], g
    acq = _csv(out, "nsi_acquiescence").set_index("model")
    for g, v in ACQUIESCENCE.items():  # the pooled diamonds of Fig. 4
        assert round(acq.loc[f"[{g}]", "acquiescence"], 2) == v
    for m, v in ACQ_MODELS.items():
        assert round(abs(acq.loc[m, "acquiescence"]), 2) == v, m


def test_table5_financial_scenario(out):
    tab = _csv(out, "nsi_endorsement_groups_by_dilemma")
    fin = tab[tab["dilemma_id"] == "financial-1"].set_index("group")
    for g, pct in TABLE5.items():
        assert [round(100 * fin.loc[g, f]) for f in ("F0", "F1", "F2", "F3")] == list(pct), g


def test_table4_observed_and_corrected_nsi(out):
    models = _csv(out, "nsi_models").set_index("model")
    assert set(models["null"]) == {"dilemma-rates"}
    for m, (observed, corrected) in TABLE4.items():
        assert models.loc[m, "nsi"] == pytest.approx(observed, abs=COUNT_STEP), m
        if m != "Gemini-3-Flash":  # its 0.108 correction needs a parse pattern the paper does not publish
            assert models.loc[m, "nsi_corrected"] == pytest.approx(corrected, abs=0.03), m
        # sec. 4.4: every model's observed NSI exceeds all 2,000 null draws and survives Bonferroni over 16.
        assert models.loc[m, "p_null"] == pytest.approx(1 / 2001)
        assert models.loc[m, "p_null_bonferroni"] < 0.05 / 1.0
    # The Phi pattern: 0.857 -> about 0.81 (Table 4: 0.813).
    assert models.loc["Phi-4-mini-3.8B", "nsi_corrected"] == pytest.approx(0.81, abs=0.01)
    # Corrected NSI orders the categories as Table 4's corrected column does (what the group tests see).
    paper = sorted(TABLE4, key=lambda m: -TABLE4[m][1])
    ours = list(models["nsi_corrected"].sort_values(ascending=False).index)
    assert [GROUPS[m] for m in ours] == [GROUPS[m] for m in paper]


def test_tiers_of_section_5_2(out):
    models = _csv(out, "nsi_models").set_index("model")
    tier_c = {"Phi-4-mini-3.8B", "LLaMA-3.2-1B", "Gemma-3-4B", "Granite-3.3-2B", "Claude-Haiku-4.5"}
    assert set(models.index[models["tier"] == "C"]) == tier_c
    assert set(models.index[models["tier"] == "A"]) == {"GPT-5.1", "Gemini-3-Flash"}
    assert (models["tier"] == "B").sum() == 9
    # The conservative column reads the CI's upper end: more models in C than the paper places there.
    assert (models["tier_conservative_ci"] == "C").sum() > 5
    assert models.loc["Gemini-3-Flash", "tier_conservative_ci"] != "A"


def test_group_tests_of_section_4_2(out):
    tests = _csv(out, "nsi_group_tests")
    t = tests[(tests["metric"] == "nsi_corrected") & (tests["test"] == "mann-whitney")].set_index("groups")
    kw = tests[(tests["metric"] == "nsi_corrected") & (tests["test"] == "kruskal-wallis")].iloc[0]
    # "Kruskal-Wallis on bias-corrected NSI, H = 7.96, p = .019, epsilon^2 = 0.46"
    assert round(kw["statistic"], 2) == 7.96
    assert round(kw["p_two_sided"], 3) == 0.019
    assert round(kw["epsilon_sq_paper"], 2) == 0.46  # eta^2_H, under the paper's symbol
    assert round(kw["epsilon_sq_classical"], 2) == 0.53  # H / (n - 1), labelled as what it is
    lines = (out / "headlines.txt").read_text(encoding="utf-8")
    assert "ε²=0.46 (the paper's ε², computed as η²_H = (H - k + 1)/(n - k)); classical ε² = H/(n - 1) = 0.53" in lines
    # "pairwise Mann-Whitney p = .004 and .014 ... US and Chinese-origin ... p = .68"
    assert round(t.loc["OSS > US", "p_greater"], 3) == 0.004
    assert round(t.loc["OSS > CN", "p_greater"], 3) == 0.014
    us_cn = t.loc["US > CN"] if "US > CN" in t.index else t.loc["CN > US"]
    assert round(us_cn["p_two_sided"], 2) == 0.68


def test_cochran_family_is_the_tested_pairs(out):
    lines = (out / "headlines.txt").read_text()
    coch = _csv(out, "nsi_scenarios")
    tested = int(coch["p_value"].notna().sum())
    assert f"family of {tested}" in lines
    assert len(coch) == 16 * 14
