"""Human coding across models (sec. 3.6, 4.2): one sample from several runs with the paper's allocation,
gold scored by group, separate rater files for reliability, and the exact permutation test on per-model
conflict rates."""

from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from stats.nsi import acquiescent_rates, coherent_rates, export_sample, gold_report, write_synthetic_run
from stats.nsi.gold import conflict_permutation


@pytest.fixture()
def runs(tmp_path):
    rng = np.random.default_rng(3)
    specs = {"oss-a": acquiescent_rates(rng), "oss-b": acquiescent_rates(rng), "us-a": coherent_rates(rng),
             "us-b": coherent_rates(rng), "cn-a": coherent_rates(rng)}
    return [write_synthetic_run(tmp_path / m, m, r, seed=i, n_samples=8) for i, (m, r) in enumerate(specs.items())]


def test_export_spans_runs_and_oversamples_negated_framings(runs, tmp_path):
    lines = export_sample(runs, tmp_path / "x", n=198, stratify="framing,model", seed=0, allocation="paper")
    key = pd.read_csv(tmp_path / "x" / "nsi_coding_key.csv")
    # Sample A's mix: 75 F1, 75 F3, 24 F0, 24 F2; each framing spread evenly over the five models.
    assert key["framing"].value_counts().to_dict() == {"F1": 75, "F3": 75, "F0": 24, "F2": 24}
    per = key.groupby(["framing", "model"]).size()
    assert per.groupby(level=0).agg(lambda v: v.max() - v.min()).max() <= 1
    assert set(key["model"]) == {"oss-a", "oss-b", "us-a", "us-b", "cn-a"}
    assert "of 5 model(s) (paper allocation)" in lines[0]
    equal = export_sample(runs, tmp_path / "y", n=200, stratify="framing", seed=0)
    assert pd.read_csv(tmp_path / "y" / "nsi_coding_key.csv")["framing"].value_counts().eq(50).all()
    assert "equal allocation" in equal[0]


def test_conflict_permutation_is_exact_and_one_sided():
    rates = {f"m{i}": r for i, r in enumerate([0.43, 0.30, 0.25, 0.18, 0.10, 0.05] + [0.0] * 10)}
    groups = {m: ("OSS" if i < 4 else "rest") for i, m in enumerate(rates)}
    perm = conflict_permutation(rates, groups).set_index("group")
    # The four highest rates are the group's: only the observed split of C(16, 4) = 1820 is as extreme.
    assert perm.loc["OSS", "p_one_sided_exact"] == pytest.approx(1 / 1820)
    # Against a brute-force enumeration when the group is not the top four.
    groups["m0"], groups["m5"] = "rest", "OSS"
    x = np.array(list(rates.values()))
    inside = np.array([groups[m] == "OSS" for m in rates])
    obs = x[inside].mean() - x[~inside].mean()
    count = 0
    for idx in combinations(range(16), 4):
        mask = np.zeros(16, bool)
        mask[list(idx)] = True
        count += x[mask].mean() - x[~mask].mean() >= obs - 1e-12
    perm = conflict_permutation(rates, groups).set_index("group")
    assert perm.loc["OSS", "p_one_sided_exact"] == pytest.approx(count / 1820)
    assert perm.loc["rest", "p_one_sided_exact"] > 0.5  # one-sided: the rest's rates are not greater


def test_gold_across_runs_with_groups_and_rater_files(runs, tmp_path):
    export_sample(runs, tmp_path / "x", n=100, stratify="framing,model", seed=1)
    key = pd.read_csv(tmp_path / "x" / "nsi_coding_key.csv")
    oss = key["model"].str.startswith("oss")
    gold = pd.DataFrame({"item_id": key["item_id"], "action_stance": "OPPOSES_X",
                         "integrity": np.where(oss & (key.index % 2 == 0), "DECISION_REASONING_CONFLICT", "CONSISTENT")})
    gold.to_csv(tmp_path / "gold.csv", index=False)
    a = gold.copy()
    a.loc[a.index[:10], "action_stance"] = "SUPPORTS_X"
    a.to_csv(tmp_path / "a.csv", index=False)
    a.to_csv(tmp_path / "b.csv", index=False)  # the two raters agree with each other, not with the gold file
    groups = {"oss-a": "OSS", "oss-b": "OSS", "us-a": "US", "us-b": "US", "cn-a": "CN"}
    lines = gold_report(runs, tmp_path / "gold.csv", out_dir=tmp_path / "g", groups=groups,
                        rater_a=tmp_path / "a.csv", rater_b=tmp_path / "b.csv", n_boot=200)
    rel = pd.read_csv(tmp_path / "g" / "gold_reliability.csv").set_index("axis")
    assert rel.loc["action_stance", "raw_agreement"] == 1.0
    perm = pd.read_csv(tmp_path / "g" / "gold_conflict_permutation.csv").set_index("group")
    assert perm.loc["OSS", "mean_rest"] == 0.0 and perm.loc["OSS", "p_one_sided_exact"] == pytest.approx(1 / 10)
    assert any("OSS vs the rest" in x for x in lines)
    pk = pd.read_csv(tmp_path / "g" / "gold_proxy_agreement.csv")
    assert {"group=OSS", "group=US", "group=CN"} <= set(pk["stratum"])
