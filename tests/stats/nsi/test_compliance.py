"""Sec. 3.3's 80% compliance rule: a model with usable replies on fewer than 80% of its dilemmas is left out
of the cross-model statistics, and said so."""

import numpy as np
import pandas as pd

from stats.nsi import run_nsi_stats, write_count_run


def test_model_below_80_percent_usable_is_left_out_of_the_analysis(tmp_path):
    rng = np.random.default_rng(0)
    dirs = []
    for i, m in enumerate(["a", "b", "c", "d"]):
        n = np.full((14, 4), 10)
        if m == "d":
            n[:3, 1] = 0  # no parsed reply under F1 on 3 dilemmas: 11 of 14 usable (79%)
        k = rng.binomial(n, 0.4)
        dirs.append(write_count_run(tmp_path / m, m, n, k, seed=i, n_samples=10))
    groups = {"a": "G1", "b": "G1", "c": "G2", "d": "G2"}
    lines = run_nsi_stats(dirs, tmp_path / "out", groups=groups, seed=0, n_null=100, n_boot=100)
    comp = pd.read_csv(tmp_path / "out" / "nsi_compliance.csv").set_index("model")
    assert comp.loc["d", "usable_dilemmas"] == 11 and not comp.loc["d", "compliant"]
    assert comp.loc[["a", "b", "c"], "compliant"].all()
    assert any(x.startswith("compliance: 3 of 4") and x.endswith(": d") for x in lines)
    g = pd.read_csv(tmp_path / "out" / "nsi_endorsement_groups.csv").set_index("group")
    assert g.loc["G2", "n_models"] == 1
    tests = pd.read_csv(tmp_path / "out" / "nsi_group_tests.csv")
    assert tests[tests["test"] == "kruskal-wallis"]["n"].eq(3).all()
    assert pd.read_csv(tmp_path / "out" / "nsi_agreement.csv")["n_pairs"].eq(3).all()
    models = pd.read_csv(tmp_path / "out" / "nsi_models.csv").set_index("model")
    assert not models.loc["d", "compliant"] and np.isfinite(models.loc["d", "nsi"])  # still reported, flagged
    # ... but outside the families: Bonferroni over the 3 compliant models, BH over their pairs only.
    assert np.isnan(models.loc["d", "p_null_bonferroni"])
    kept = models.loc[["a", "b", "c"]]
    assert np.allclose(kept["p_null_bonferroni"], np.minimum(1.0, 3 * kept["p_null"]))
    assert "d" not in set(pd.read_csv(tmp_path / "out" / "nsi_cochran.csv")["model"])


def test_cochran_share_divides_by_the_tested_family(tmp_path):
    """Pairs where no block varies are untestable and left out of the BH family; the headline's share is of the
    family (the paper's 61.9% is a share of its 224 tests), with the untestable ones counted apart."""
    rng = np.random.default_rng(1)
    n = np.full((14, 4), 12)
    steady = write_count_run(tmp_path / "s", "steady", n, np.zeros((14, 4), dtype=int), seed=0)  # never endorses
    k = rng.binomial(n, np.tile([0.1, 0.9, 0.1, 0.9], (14, 1)))
    flips = write_count_run(tmp_path / "f", "flips", n, k, seed=1)
    lines = run_nsi_stats([steady, flips], tmp_path / "out", seed=0, n_null=50, n_boot=50)
    coch = pd.read_csv(tmp_path / "out" / "nsi_cochran.csv").set_index("model")
    assert coch.loc["steady", "tested"] == 0 and coch.loc["flips", "tested"] == 14
    sig = int(coch.loc["flips", "significant"])
    line = next(x for x in lines if x.startswith("Cochran's Q:"))
    assert line.startswith(f"Cochran's Q: {sig}/14 tested model x dilemma pairs ({sig / 14:.1%})")
    assert "family of 14" in line and "14 of 28 pairs untestable" in line
