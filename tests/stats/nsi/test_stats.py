"""Framing-stability statistics (stats.nsi): the paper's derived values, the null, Cochran's Q, tiers, and the
whole ``run_nsi_stats`` pass over synthetic run directories with planted effects."""

import ast
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import cochrans_q
from statsmodels.stats.multitest import multipletests

from contract import FRAMINGS
from stats.nsi import (
    DILEMMAS,
    TABLE6,
    NSITableError,
    acquiescent_rates,
    bh_adjust,
    build_cells,
    cochran_q_blocks,
    cochran_table,
    coherent_rates,
    domain_bands,
    epsilon_squared,
    eta_squared_h,
    expected_null_nsi,
    kruskal_groups,
    load_runs,
    model_null,
    pairwise_mannwhitney,
    read_replies,
    run_nsi_stats,
    synthetic_tables,
    tier_of,
    tier_on_ci,
    write_synthetic_run,
)
from tests.helpers import ROOT

# ---------------------------------------------------------------------------------------------------
# the paper's published rates and the values it derives from them

# Table 4: bias-corrected NSI per model, with Table 1's categories.
TABLE4_CORRECTED = {
    "Phi-4-mini-3.8B": ("OSS", 0.813), "LLaMA-3.2-1B": ("OSS", 0.804), "Gemma-3-4B": ("OSS", 0.718),
    "Claude-Haiku-4.5": ("US", 0.670), "Granite-3.3-2B": ("OSS", 0.602), "Grok-4.1-non-reasoning": ("US", 0.435),
    "Claude-Sonnet-4.5": ("US", 0.391), "GPT-5.2": ("US", 0.340), "GLM-4.6": ("CN", 0.312), "Qwen3-8B": ("CN", 0.291),
    "GPT-5-mini": ("US", 0.305), "Kimi-K2": ("CN", 0.293), "DeepSeek-V3.2": ("CN", 0.181),
    "Grok-4.1-reasoning": ("US", 0.178), "Gemini-3-Flash": ("US", 0.073), "GPT-5.1": ("US", 0.157),
}
TABLE4_OBSERVED = {"Phi-4-mini-3.8B": 0.857, "LLaMA-3.2-1B": 0.857, "Gemma-3-4B": 0.770, "Claude-Haiku-4.5": 0.710,
                   "Granite-3.3-2B": 0.643, "Grok-4.1-non-reasoning": 0.467, "Claude-Sonnet-4.5": 0.421,
                   "GPT-5.2": 0.369, "GLM-4.6": 0.356, "Qwen3-8B": 0.341, "GPT-5-mini": 0.334, "Kimi-K2": 0.324,
                   "DeepSeek-V3.2": 0.213, "Grok-4.1-reasoning": 0.202, "Gemini-3-Flash": 0.181, "GPT-5.1": 0.179}


def test_group_tests_reproduce_section_4_2():
    values = {m: v for m, (_, v) in TABLE4_CORRECTED.items()}
    groups = {m: g for m, (g, _) in TABLE4_CORRECTED.items()}
    kw = kruskal_groups(values, groups)
    # "Kruskal-Wallis on bias-corrected NSI, H = 7.96, p = .019, epsilon^2 = 0.46".
    assert kw["n_models"] == 16 and kw["k_groups"] == 3
    assert kw["h"] == pytest.approx(7.96, abs=0.005)
    assert kw["p_value"] == pytest.approx(0.019, abs=0.0005)
    assert kw["epsilon_sq_paper"] == pytest.approx(0.46, abs=0.005)  # eta^2_H = (H - k + 1) / (n - k)
    assert kw["epsilon_sq_classical"] == pytest.approx(7.9632 / 15, abs=1e-3)  # H / (n - 1)
    # "open-source models exceed both commercial groups (pairwise Mann-Whitney p = .004 and .014), while the US
    # and Chinese-origin groups are statistically indistinguishable (p = .68)".
    pairs = {(t.group_a, t.group_b): t for t in pairwise_mannwhitney(values, groups)}
    assert pairs[("OSS", "US")].p_greater == pytest.approx(0.004, abs=0.0005)
    assert pairs[("OSS", "CN")].p_greater == pytest.approx(0.014, abs=0.0005)
    assert pairs[("US", "CN")].p_two_sided == pytest.approx(0.68, abs=0.005)
    assert pairs[("OSS", "CN")].rank_biserial == pytest.approx(1.0)


def test_effect_size_formulas():
    assert epsilon_squared(7.963235294117652, 16) == pytest.approx(0.5309, abs=1e-4)
    assert eta_squared_h(7.963235294117652, 16, 3) == pytest.approx(0.4587, abs=1e-4)
    assert np.isnan(epsilon_squared(1.0, 1))


def test_tiers_tables_6_and_7():
    # Table 6 on Table 4's point estimates: the four open models and Claude-Haiku-4.5 are tier C (sec. 5.2).
    c = sorted(m for m, v in TABLE4_OBSERVED.items() if tier_of(v) == "C")
    assert c == sorted(["Phi-4-mini-3.8B", "LLaMA-3.2-1B", "Gemma-3-4B", "Claude-Haiku-4.5", "Granite-3.3-2B"])
    assert tier_of(0.179) == "A" and tier_of(0.20) == "B" and tier_of(0.499) == "B" and tier_of(0.50) == "C"
    # The main tier is the point estimate's; the CI's upper end gives the labelled conservative call:
    # Gemini-3-Flash, 0.18 observed with CI [0.03, 0.36], is A on the point, B on the CI.
    call = tier_on_ci(0.181, 0.03, 0.36, TABLE6)
    assert (call.tier, call.tier_conservative, call.tier_range) == ("A", "B", "A-B")
    # On Table 4's own CIs the conservative call puts more models in C than sec. 5.2's five.
    assert tier_on_ci(0.421, 0.20, 0.67, TABLE6).tier_conservative == "C"
    # Table 7: stricter bands for financial/business/military, then legal.
    assert domain_bands("financial").a_below == 0.10 and domain_bands("Military").c_from == 0.35
    assert domain_bands("legal").a_below == 0.15 and domain_bands("legal").c_from == 0.40
    assert domain_bands("medical") == domain_bands("science")
    assert domain_bands("astrology").source == "Table 6"
    # Table 3's domain means: financial 0.65 is C, legal 0.45 is C (>= 0.40), medical 0.36 is B.
    assert tier_of(0.65, domain_bands("financial")) == "C"
    assert tier_of(0.45, domain_bands("legal")) == "C"
    assert tier_of(0.36, domain_bands("medical")) == "B"
    assert tier_of(float("nan")) is None


# ---------------------------------------------------------------------------------------------------
# the null

def test_null_expectation_falls_with_more_samples_per_cell():
    e = [expected_null_nsi([n] * 4, 0.5, n_draws=2000, seed=0) for n in (5, 10, 30, 100, 1000)]
    assert all(a > b for a, b in zip(e, e[1:]))
    # Roughly 1/sqrt(n): the expected range of four proportions.
    assert e[2] / e[4] == pytest.approx(np.sqrt(1000 / 30), rel=0.15)
    # Degenerate rates have no sampling noise; two framings have less range than four.
    assert expected_null_nsi([30] * 4, 0.0) == 0.0 and expected_null_nsi([30] * 4, 1.0) == 0.0
    assert expected_null_nsi([30] * 2, 0.5) < expected_null_nsi([30] * 4, 0.5)


def test_null_has_nominal_false_positive_rate_and_finds_planted_effects():
    rng = np.random.default_rng(123)
    p_vals = []
    for _ in range(200):
        rates = coherent_rates(rng)
        n = np.full((14, 4), 30)
        k = rng.binomial(n, rates)
        p_vals.append(model_null(n, k, list(range(4)), np.random.default_rng(rng.integers(1 << 32)), 500).p_value)
    share = np.mean(np.array(p_vals) < 0.05)
    assert 0.01 <= share <= 0.10
    # A negation-blind model: observed NSI is far above every null draw. Sampling noise inflates the observed
    # NSI; the correction subtracts the noise range of a *flat* null, which overstates the noise of cells
    # that really differ, so the planted (noise-free) NSI lies between the corrected and the observed value.
    rates = acquiescent_rates(rng, strength=1.0)
    n = np.full((14, 4), 30)
    k = rng.binomial(n, rates)
    res = model_null(n, k, list(range(4)), np.random.default_rng(0), 2000)
    assert res.p_value == pytest.approx(1 / 2001)  # above all 2,000 draws: p < 5e-4, as sec. 4.4
    truth = float(np.mean(rates.max(1) - rates.min(1)))
    assert res.corrected < truth < res.observed + 0.02
    assert res.observed - truth < res.expected


# ---------------------------------------------------------------------------------------------------
# Cochran's Q and BH

def test_cochran_q_hand_and_statsmodels():
    x = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 1]])
    # Q = (k-1)(k sum C_j^2 - N^2) / (k N - sum R_i^2) = 3 (4*21 - 81) / (36 - 29) = 9/7.
    res = cochran_q_blocks(x)
    assert res.q == pytest.approx(9 / 7)
    assert res.p_value == pytest.approx(sps.chi2.sf(9 / 7, 3))
    ref = cochrans_q(x)
    assert (res.q, res.p_value) == pytest.approx((ref.statistic, ref.pvalue))
    # Untestable: every block constant (Q = 0/0) -> NaN, without a warning.
    assert np.isnan(cochran_q_blocks(np.ones((6, 4))).p_value)


def test_cochran_table_uses_sample_blocks_and_bh_is_nan_safe():
    rng = np.random.default_rng(7)
    rep, _ = synthetic_tables("m", acquiescent_rates(rng, strength=0.7), n_samples=20, rng=rng, parse_failure_rate=0.05)
    rep = rep.astype({"parse_ok": bool})
    rep["agree"] = (rep["decision"] == "agree").astype(float)
    tab = cochran_table(rep[rep["temperature"] > 0])
    assert len(tab) == 14
    one = rep[(rep["dilemma_id"] == "legal-1") & (rep["temperature"] > 0) & rep["parse_ok"]]
    wide = one.pivot(index="sample", columns="framing", values="endorse").reindex(columns=list(FRAMINGS)).dropna()
    ref = cochrans_q(wide.to_numpy(dtype=float))
    row = tab.set_index("dilemma_id").loc["legal-1"]
    assert row["n_blocks"] == len(wide) < 20
    assert row["p_value"] == pytest.approx(ref.pvalue)
    p = np.array([0.001, np.nan, 0.04, 0.5, 0.012, np.nan])
    adj = bh_adjust(p)
    assert np.isnan(adj[[1, 5]]).all()
    assert adj[~np.isnan(p)] == pytest.approx(multipletests(p[~np.isnan(p)], method="fdr_bh")[1])


# ---------------------------------------------------------------------------------------------------
# tables and the full pass

def _runs(tmp_path, n_samples=12):
    rng = np.random.default_rng(42)
    specs = {"blind-1": acquiescent_rates(rng, strength=1.0, agree_range=(0.05, 0.45)),
             "blind-2": acquiescent_rates(rng, strength=0.9, agree_range=(0.1, 0.5)),
             "steady-1": coherent_rates(rng), "steady-2": coherent_rates(rng)}
    dirs = [write_synthetic_run(tmp_path / m, m, r, seed=10 + i, n_samples=n_samples, continuous_noise=0.0)
            for i, (m, r) in enumerate(specs.items())]
    return dirs, specs


def test_run_nsi_stats_end_to_end(tmp_path):
    dirs, specs = _runs(tmp_path)
    groups = {"blind-1": "blind", "blind-2": "blind", "steady-1": "steady", "steady-2": "steady"}
    out = tmp_path / "out"
    lines = run_nsi_stats(dirs, out, groups=groups, seed=0, n_null=300, n_boot=500)
    for name in ("nsi_models", "nsi_scenarios", "nsi_endorsement", "nsi_endorsement_groups", "nsi_acquiescence",
                 "nsi_model_domain", "nsi_domains", "nsi_cochran", "nsi_group_tests", "nsi_agreement",
                 "nsi_temperature", "nsi_tiers", "nsi_continuous", "nsi_parse"):
        assert (out / f"{name}.csv").is_file() and (out / f"{name}.md").read_text().startswith("## ")
    for fig in ("fig_acquiescence.png", "fig_nsi_heatmap.png"):
        assert (out / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / fig).stat().st_size > 20_000
    assert any(line.startswith("Cochran's Q:") for line in lines)
    assert any(line.startswith("inter-model agreement:") for line in lines)
    assert (out / "headlines.txt").read_text().splitlines() == lines

    models = pd.read_csv(out / "nsi_models.csv").set_index("model")
    scen = pd.read_csv(out / "nsi_scenarios.csv")
    # A model's NSI is eq. 2 on its pooled rates (the paper's null mode); the per-dilemma mean is beside it.
    for m, g in scen.groupby("model"):
        assert models.loc[m, "nsi"] == models.loc[m, "nsi_pooled"]
        assert models.loc[m, "nsi_dilemma_mean"] == pytest.approx(g["nsi"].mean())
    # The scenario-cluster CI is centred on the observed NSI (Table 4); a range of pooled rates near 0 sits at
    # the edge of its resample distribution, so the containment is checked where the NSI is large.
    for m in ("blind-1", "blind-2"):
        assert models.loc[m, "nsi_ci_low"] <= models.loc[m, "nsi"] <= models.loc[m, "nsi_ci_high"]
    assert set(models.index[models["rank"] <= 2]) == {"blind-1", "blind-2"}
    # Tier: Table 6's band of the observed NSI; the conservative column reads the CI's upper end.
    for m in models.index:
        assert models.loc[m, "tier"] == tier_of(models.loc[m, "nsi"])
    assert (models.loc[["blind-1", "blind-2"], "tier"] != "A").all()
    assert (models.loc[["blind-1", "blind-2"], "tier_conservative_ci"] == "C").all()
    assert (models.loc[["blind-1", "blind-2"], "p_null"] < 0.01).all()
    # Steady models: corrected NSI near 0 (its sd is about 0.03 at 12 samples per cell).
    assert (models.loc[["steady-1", "steady-2"], "nsi_corrected"].abs() < 0.1).all()
    assert models.loc[["blind-1", "blind-2"], "nsi_corrected"].min() > 0.15
    # Acquiescence is the signed polarity NSI: p0 + p1 - 1 = P_a(F0) - P_a(F1), per dilemma and per model.
    acq = pd.read_csv(out / "nsi_acquiescence.csv").set_index("model")
    endorse = pd.read_csv(out / "nsi_endorsement.csv").set_index("model")
    for m in specs:
        assert acq.loc[m, "acquiescence"] == pytest.approx(endorse.loc[m, "F0"] - endorse.loc[m, "F1"], abs=1e-9)
    assert (acq.loc[["blind-1", "blind-2"], "acquiescence"] < -0.2).all()
    # The continuous readout (noise-free here) recovers the planted NSI exactly.
    cont = pd.read_csv(out / "nsi_continuous.csv").set_index("model")
    for m, rates in specs.items():
        planted = np.mean(rates.max(1) - rates.min(1))
        assert cont.loc[m, "nsi_continuous"] == pytest.approx(planted, abs=1e-9)
    # Greedy replies of a steady model never flip: NSI 0 at T 0.
    temp = pd.read_csv(out / "nsi_temperature.csv").set_index("model")
    assert temp.loc["steady-1", "nsi_t0"] == 0.0 and temp.loc["blind-1", "nsi_t0"] > 0.9
    tests = pd.read_csv(out / "nsi_group_tests.csv")
    kw = tests[(tests["test"] == "kruskal-wallis") & (tests["metric"] == "nsi_corrected")].iloc[0]
    assert kw["statistic"] > 0
    tiers = pd.read_csv(out / "nsi_tiers.csv")
    assert set(tiers["domain"]) == {"(all)"} | {d for _, d in DILEMMAS}
    agreement = pd.read_csv(out / "nsi_agreement.csv")
    assert list(agreement["framing"]) == list(FRAMINGS) and agreement["n_pairs"].eq(6).all()


def test_same_seed_same_tables(tmp_path):
    dirs, _ = _runs(tmp_path, n_samples=6)
    a = run_nsi_stats(dirs[:2], tmp_path / "a", seed=3, n_null=200, n_boot=300)
    b = run_nsi_stats(dirs[:2], tmp_path / "b", seed=3, n_null=200, n_boot=300)
    assert a == b
    assert (tmp_path / "a" / "nsi_models.csv").read_text() == (tmp_path / "b" / "nsi_models.csv").read_text()


def test_single_run_writes_to_run_stats(tmp_path):
    dirs, _ = _runs(tmp_path, n_samples=5)
    run_nsi_stats([dirs[0]], seed=0, n_null=100, n_boot=200)
    assert (dirs[0] / "stats" / "nsi_models.csv").is_file()
    with pytest.raises(NSITableError, match="explicit output directory"):
        run_nsi_stats(dirs, seed=0)


def test_bad_tables_give_one_line_errors(tmp_path):
    dirs, _ = _runs(tmp_path, n_samples=4)
    path = dirs[0] / "nsi_replies.parquet"
    df = pd.read_parquet(path)
    df.drop(columns=["endorse"]).to_parquet(path)
    with pytest.raises(NSITableError, match=r"nsi_replies.parquet: column endorse: missing"):
        read_replies(dirs[0])
    bad = df.copy()
    bad.loc[bad["parse_ok"].astype(bool).idxmax(), "endorse"] = 1 - bad.loc[bad["parse_ok"].astype(bool).idxmax(), "endorse"]
    bad.to_parquet(path)
    with pytest.raises(NSITableError, match=r"column endorse: 1 rows are not decision XOR negated") as exc:
        read_replies(dirs[0])
    assert "\n" not in str(exc.value)
    bad = df.copy()
    bad.loc[0, "framing"] = "F9"
    bad.to_parquet(path)
    with pytest.raises(NSITableError, match=r"column framing: unknown framings \['F9'\]"):
        read_replies(dirs[0])
    df.to_parquet(path)
    with pytest.raises(NSITableError, match=r"column model: 'blind-1' already read"):
        load_runs([dirs[0], dirs[0]])
    cont = pd.read_parquet(dirs[1] / "nsi_continuous.parquet")
    cont.loc[0, "p_endorse"] = 0.5 if cont.loc[0, "p_endorse"] != 0.5 else 0.25
    cont.to_parquet(dirs[1] / "nsi_continuous.parquet")
    with pytest.raises(NSITableError, match=r"nsi_continuous.parquet: column p_endorse"):
        load_runs([dirs[1]])
    with pytest.raises(NSITableError, match="file not found"):
        read_replies(tmp_path / "nowhere")


def test_cells_count_parsed_replies_only(tmp_path):
    dirs, _ = _runs(tmp_path, n_samples=10)
    rep = read_replies(dirs[0])
    cells = build_cells(rep[rep["temperature"] > 0])
    assert cells.n.sum() == int((rep["parse_ok"] & (rep["temperature"] > 0)).sum())
    assert cells.n.max() <= 10
    assert np.all((cells.rates >= 0) & (cells.rates <= 1))


def test_synthetic_replies_parse_as_recorded():
    """The synthetic generator's texts go through the real four-stage parser to the recorded columns."""
    from readouts.nsi.parse import endorsement, parse_reply

    rng = np.random.default_rng(0)
    rep, _ = synthetic_tables("m", coherent_rates(rng), n_samples=6, rng=rng, parse_failure_rate=0.1)
    for row in rep.itertuples(index=False):
        got = parse_reply(row.text)
        assert got.ok == bool(row.parse_ok)
        if got.ok:
            assert (got.stage, got.decision, got.confidence) == (row.parse_stage, row.decision, row.confidence)
            assert endorsement(got.decision, row.negated) == row.endorse
        else:
            assert got.error == row.parse_error


def test_stats_modules_import_no_model_code():
    root = ROOT
    banned = {"torch", "transformers", "engine", "readouts", "panels"}
    for path in (root / "stats").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & banned, path.name
    code = ("import sys, stats.nsi, stats.nsi.coding, stats.nsi.gold, stats.nsi.synth, stats.nsi.figures;"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (banned,))
    out = subprocess.run([sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True, cwd=root)
    assert json.loads(out.stdout) == []


def test_run_with_no_parsed_reply_still_reports(tmp_path):
    """A tiny random model parses nothing: the binary NSI is undefined, the continuous one is not."""
    rng = np.random.default_rng(1)
    run = write_synthetic_run(tmp_path / "tiny", "tiny", coherent_rates(rng), n_samples=3, parse_failure_rate=1.0,
                              greedy=False)
    lines = run_nsi_stats([run], tmp_path / "out", seed=0, n_null=50, n_boot=100)
    assert any("binary NSI undefined" in x for x in lines)
    assert any(x.startswith("tiny: continuous NSI") for x in lines)
    assert (tmp_path / "out" / "fig_nsi_heatmap.png").is_file() and (tmp_path / "out" / "fig_acquiescence.png").is_file()
    models = pd.read_csv(tmp_path / "out" / "nsi_models.csv")
    assert models["nsi"].isna().all() and models["tier"].isna().all()


def test_load_groups(tmp_path):
    from stats.nsi import load_groups

    (tmp_path / "g.json").write_text(json.dumps({"a": "OSS", "b": "US"}))
    assert load_groups(tmp_path / "g.json") == {"a": "OSS", "b": "US"}
    pd.DataFrame({"model": ["a", "b"], "group": ["OSS", "US"]}).to_csv(tmp_path / "g.csv", index=False)
    assert load_groups(tmp_path / "g.csv") == {"a": "OSS", "b": "US"}
    pd.DataFrame({"model": ["a"], "origin": ["OSS"]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(NSITableError, match=r"bad.csv: column group: missing"):
        load_groups(tmp_path / "bad.csv")
