"""Human coding round-trip (stats.nsi.coding, stats.nsi.gold): export for Label Studio / CSV, then the gold report, end to end on
synthetic run directories; and the paper's sec. 3.6 / 4.2 numbers rebuilt from counts consistent with it."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from contract import NEGATED
from contract.tables import NSI_REPLIES
from stats.nsi import (
    ACTION_STANCE,
    INTEGRITY,
    PROPOSALS,
    NSITableError,
    acquiescent_rates,
    export_sample,
    gold_report,
    item_id,
    label_config,
    read_labels,
    write_synthetic_run,
)


@pytest.fixture()
def run_dir(tmp_path):
    rng = np.random.default_rng(9)
    return write_synthetic_run(tmp_path / "run", "blind", acquiescent_rates(rng, strength=0.8), seed=1, n_samples=10)


def _panel(tmp_path):
    path = tmp_path / "panel.jsonl"
    recs = [{"id": d, "domain": d.split("-")[0], "scenario": f"Scenario of {d}.", "action": f"do {d}",
             "goal": f"reach goal {d}"} for d in
            ["medical-1", "medical-2", "financial-1", "financial-2", "business-1", "business-2", "legal-1", "legal-2",
             "military-1", "military-2", "education-1", "education-2", "science-1", "science-2"]]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


def test_export_writes_label_studio_and_csv(run_dir, tmp_path):
    out = tmp_path / "export"
    lines = export_sample(run_dir, out, n=40, stratify="framing", seed=0, panel_path=_panel(tmp_path))
    assert lines[0].startswith("nsi-export: 40 items")
    key = pd.read_csv(out / "nsi_coding_key.csv")
    # Stratified: equal allocation over the four framings; sampled (T > 0), parsed replies only.
    assert key["framing"].value_counts().to_dict() == {"F0": 10, "F1": 10, "F2": 10, "F3": 10}
    assert (key["temperature"] > 0).all() and key["item_id"].is_unique
    tasks = json.loads((out / "nsi_coding_tasks.json").read_text())
    assert len(tasks) == 40 and all(set(t["data"]) == {"item_id", "scenario", "action", "proposal", "reply"} for t in tasks)
    # Coders see neither model nor framing label; the proposal is the Appendix C.1 sentence.
    by_id = key.set_index("item_id")
    for t in tasks:
        d = t["data"]
        meta = by_id.loc[d["item_id"]]
        assert d["proposal"] == PROPOSALS[meta["framing"]].format(a=f"do {meta['dilemma_id']}", g=f"reach goal {meta['dilemma_id']}")
        assert "blind" not in json.dumps(d)
    # The labeling config is well-formed and its variables are the task's data keys; its choices are the codebook.
    root = ET.fromstring((out / "nsi_coding_config.xml").read_text())
    values = {el.get("value")[1:] for el in root.iter("Text")}
    assert values == {"scenario", "action", "proposal", "reply"}
    choices = {c.get("name"): [x.get("value") for x in c.iter("Choice")] for c in root.iter("Choices")}
    assert choices == {"action_stance": list(ACTION_STANCE), "integrity": list(INTEGRITY)}
    project = json.loads((out / "nsi_coding_project.json").read_text())
    assert project["label_config"] == label_config() and "SUPPORTS_X" in project["expert_instruction"]
    csv = pd.read_csv(out / "nsi_coding_sample.csv", keep_default_na=False)
    assert list(csv.columns) == ["item_id", "scenario", "action", "proposal", "reply", "action_stance", "integrity", "notes"]
    assert (csv["action_stance"] == "").all()
    # Seeded: the same call gives the same sample.
    export_sample(run_dir, tmp_path / "again", n=40, seed=0, panel_path=_panel(tmp_path))
    assert (tmp_path / "again" / "nsi_coding_key.csv").read_text() == (out / "nsi_coding_key.csv").read_text()


def test_export_finds_panel_by_manifest_name_or_goes_without(run_dir, tmp_path, monkeypatch):
    # From the repository root, the manifest's panel name finds panels/data/nsi-14.jsonl.
    export_sample(run_dir, tmp_path / "p", n=8, seed=1)
    tasks = json.loads((tmp_path / "p" / "nsi_coding_tasks.json").read_text())
    assert all(t["data"]["scenario"] and t["data"]["proposal"].startswith("They should") for t in tasks)
    monkeypatch.chdir(tmp_path)
    lines = export_sample(run_dir, tmp_path / "e", n=30, stratify="framing,domain", seed=1)
    assert any("panel file not found" in x for x in lines)
    key = pd.read_csv(tmp_path / "e" / "nsi_coding_key.csv")
    assert len(key) == 30 and key.groupby(["framing", "domain"]).size().max() <= 2
    with pytest.raises(NSITableError, match="column colour: not found"):
        export_sample(run_dir, tmp_path / "x", stratify="colour")


def test_round_trip_gold_report(run_dir, tmp_path):
    out = tmp_path / "export"
    export_sample(run_dir, out, n=80, seed=2)
    key = pd.read_csv(out / "nsi_coding_key.csv")
    # Planted gold: every third proxy-endorse row is really an opposition with a decision-reasoning conflict;
    # proxy non-endorse rows are oppositions, one of them a hidden support.
    gold = []
    for i, r in enumerate(key.itertuples(index=False)):
        if r.endorse == 1:
            stance = "OPPOSES_X" if i % 3 == 0 else "SUPPORTS_X"
        else:
            stance = "SUPPORTS_X" if i == int(np.flatnonzero(key["endorse"] == 0)[0]) else "OPPOSES_X"
        integ = "DECISION_REASONING_CONFLICT" if (r.endorse == 1 and stance == "OPPOSES_X") else "CONSISTENT"
        judge = "supports x" if stance == "SUPPORTS_X" else "Opposes-X"  # labels are normalized on reading
        gold.append({"item_id": r.item_id, "action_stance": stance, "integrity": integ, "judge_action_stance": judge,
                     "annotator": "a@example.org"})
    gold = pd.DataFrame(gold)
    gold.to_csv(tmp_path / "gold.csv", index=False)
    second = gold[["item_id", "action_stance", "integrity"]].copy()
    second.loc[second.index[:8], "action_stance"] = "UNCERTAIN_DEPENDS"
    second.to_csv(tmp_path / "second.csv", index=False)

    lines = gold_report(run_dir, tmp_path / "gold.csv", tmp_path / "second.csv", tmp_path / "gold_out", seed=0, n_boot=300)
    over = pd.read_csv(tmp_path / "gold_out" / "gold_overcount.csv")
    merged = key.merge(gold, on="item_id")
    e = merged[merged["endorse"] == 1]
    pooled = over[(over["quantity"] == "over-count") & (over["stratum"] == "pooled")].iloc[0]
    assert (pooled["k"], pooled["n"]) == ((e["action_stance"] != "SUPPORTS_X").sum(), len(e))
    for f in ("F0", "F1", "F2", "F3"):
        row = over[(over["quantity"] == "over-count") & (over["stratum"] == f)].iloc[0]
        ef = e[e["framing"] == f]
        assert (row["k"], row["n"]) == ((ef["action_stance"] != "SUPPORTS_X").sum(), len(ef))
    under = over[(over["quantity"] == "under-count") & (over["stratum"] == "pooled")].iloc[0]
    assert under["k"] == 1
    rel = pd.read_csv(tmp_path / "gold_out" / "gold_reliability.csv").set_index("axis")
    assert rel.loc["action_stance", "raw_agreement"] == pytest.approx(72 / 80)
    assert rel.loc["integrity", "raw_agreement"] == 1.0
    assert rel.loc["action_stance", "alpha_ci_low"] < rel.loc["action_stance", "krippendorff_alpha"] < 1
    judge = pd.read_csv(tmp_path / "gold_out" / "gold_judge.csv").set_index("axis")
    assert judge.loc["action_stance", "macro_f1"] == pytest.approx(1.0)
    conf = pd.read_csv(tmp_path / "gold_out" / "gold_conflicts.csv")
    assert conf.iloc[0]["k"] == (merged["integrity"] == "DECISION_REASONING_CONFLICT").sum()
    assert (tmp_path / "gold_out" / "fig_overcount.png").read_bytes()[:4] == b"\x89PNG"
    assert any(x.startswith("proxy over-count:") for x in lines)
    assert any(x.startswith("reliability (action_stance") for x in lines)
    assert any(x.startswith("judge (action_stance)") and "passes" in x for x in lines)
    # Without out_dir nothing is written and the same lines come back.
    assert gold_report(run_dir, tmp_path / "gold.csv", tmp_path / "second.csv", seed=0, n_boot=300) == lines


def test_gold_file_errors(run_dir, tmp_path):
    path = tmp_path / "g.csv"
    pd.DataFrame({"item_id": ["nsi-000"], "action_stance": ["SUPPORTS_X"]}).to_csv(path, index=False)
    with pytest.raises(NSITableError, match=r"g.csv: column item_id: 1 ids not in"):
        gold_report(run_dir, path)
    pd.DataFrame({"item_id": ["a", "b"], "action_stance": ["SUPPORTS_X", "MAYBE"]}).to_csv(path, index=False)
    with pytest.raises(NSITableError, match=r"column action_stance: 'MAYBE' is not one of"):
        read_labels(path)
    pd.DataFrame({"item_id": ["a", "a"], "action_stance": ["SUPPORTS_X", "OPPOSES_X"]}).to_csv(path, index=False)
    with pytest.raises(NSITableError, match=r"column item_id: duplicate id 'a'"):
        read_labels(path)
    pd.DataFrame({"item": ["a"]}).to_csv(path, index=False)
    with pytest.raises(NSITableError, match=r"column item_id: missing"):
        read_labels(path)


# ---------------------------------------------------------------------------------------------------
# the paper's coded sample, rebuilt from the counts it reports

def _paper_sample(tmp_path):
    """198 coded replies with the counts of sec. 3.6 and 4.2 (and Figures 1-2).

    Reported: 102 proxy-endorse rows, 39 not gold SUPPORTS_X (F0 0/9, F3 26/57); of the 39, 25 OPPOSES_X,
    8 UNCERTAIN_DEPENDS, 5 REFUSE_INVALID, 1 PERMISSIBLE_NOT_REQUIRED (17 OPPOSES_X under F3); gold totals
    110 OPPOSES_X, 64 SUPPORTS_X, 12 UNCERTAIN_DEPENDS, 11 REFUSE_INVALID, 1 PERMISSIBLE_NOT_REQUIRED; 26
    decision-reasoning conflicts, 17/75 under F3, 21/66 open-source, 4.5% US, 3.0% CN, negated 15.3% vs
    affirmative 6.25%. Consistent completion (ours): framings 24/75/24/75 (negated oversampled, 150 vs 48,
    66 items per origin group); F1 26 and F2 10 proxy-endorse rows with 9 and 4 over-counted; 1 hidden
    support among the 96 non-endorse rows (the reported 1.0% under-count).
    """
    n_f = {"F0": 24, "F1": 75, "F2": 24, "F3": 75}
    endorse_f = {"F0": 9, "F1": 26, "F2": 10, "F3": 57}
    # Gold stance of proxy-endorse rows that are not SUPPORTS_X, per framing.
    over_f = {"F0": {}, "F1": {"OPPOSES_X": 6, "UNCERTAIN_DEPENDS": 2, "REFUSE_INVALID": 1},
              "F2": {"OPPOSES_X": 2, "UNCERTAIN_DEPENDS": 1, "REFUSE_INVALID": 1},
              "F3": {"OPPOSES_X": 17, "UNCERTAIN_DEPENDS": 5, "REFUSE_INVALID": 3, "PERMISSIBLE_NOT_REQUIRED": 1}}
    # Gold stance of the 96 proxy non-endorse rows: 85 OPPOSES_X, 4 UNCERTAIN_DEPENDS, 6 REFUSE_INVALID, 1 SUPPORTS_X.
    non = ["SUPPORTS_X"] + ["UNCERTAIN_DEPENDS"] * 4 + ["REFUSE_INVALID"] * 6 + ["OPPOSES_X"] * 85
    conflicts = {("oss", "F3"): 15, ("oss", "F1"): 5, ("oss", "F2"): 1, ("us", "F3"): 1, ("us", "F1"): 1,
                 ("us", "F0"): 1, ("cn", "F3"): 1, ("cn", "F2"): 1}
    rows, gold = [], []
    sample = 0
    non_iter = iter(non)
    other_integrity = iter(["AMBIGUOUS"] * 12 + ["NONANSWER"] * 11)
    for f, n in n_f.items():
        stances = []
        for cls, k in over_f[f].items():
            stances += [(1, cls)] * k
        stances += [(1, "SUPPORTS_X")] * (endorse_f[f] - len(stances))
        stances += [(0, next(non_iter)) for _ in range(n - endorse_f[f])]
        per_model = n // 3
        for i, (endorse, stance) in enumerate(stances):
            model = ("oss", "us", "cn")[i // per_model]
            j = i % per_model
            integ = "DECISION_REASONING_CONFLICT" if j < conflicts.get((model, f), 0) else None
            decision = "agree" if bool(endorse) != NEGATED[f] else "disagree"
            rows.append({"model": model, "dilemma_id": "financial-1", "domain": "financial", "framing": f,
                         "negated": NEGATED[f], "metadata": None, "temperature": 0.7, "sample": sample, "text": "{}",
                         "generated_tokens": 50, "truncated": False, "parse_ok": True, "parse_stage": 1,
                         "parse_error": None, "decision": decision, "endorse": endorse, "reasoning": "r",
                         **dict.fromkeys(("confidence", "adherence_to_laws", "adherence_to_social_ethics",
                                          "objective_positive_consequences", "objective_negative_consequences"))})
            gold.append({"item_id": item_id(model, "financial-1", f, 0.7, sample), "action_stance": stance,
                         "integrity": integ})
            sample += 1
    gold = pd.DataFrame(gold)
    free = gold["integrity"].isna()
    gold.loc[free, "integrity"] = [next(other_integrity, "CONSISTENT") for _ in range(int(free.sum()))]
    run = tmp_path / "run"
    run.mkdir()
    NSI_REPLIES.frame(rows).to_parquet(run / NSI_REPLIES.file, index=False)
    return run, gold


def test_paper_section_3_6_numbers(tmp_path):
    run, gold = _paper_sample(tmp_path)
    assert len(gold) == 198
    assert gold["action_stance"].value_counts().to_dict() == {
        "OPPOSES_X": 110, "SUPPORTS_X": 64, "UNCERTAIN_DEPENDS": 12, "REFUSE_INVALID": 11, "PERMISSIBLE_NOT_REQUIRED": 1}
    assert gold["integrity"].value_counts().to_dict() == {
        "CONSISTENT": 149, "DECISION_REASONING_CONFLICT": 26, "AMBIGUOUS": 12, "NONANSWER": 11}
    gold.to_csv(tmp_path / "gold.csv", index=False)
    groups = {"oss": "OSS", "us": "US", "cn": "CN"}
    lines = gold_report(run, tmp_path / "gold.csv", out_dir=tmp_path / "out", groups=groups)
    over = pd.read_csv(tmp_path / "out" / "gold_overcount.csv")
    oc = over[over["quantity"] == "over-count"].set_index("stratum")
    # "over-counts genuine endorsement by 38.2% (39 of 102; 95% Wilson CI [29.4%, 47.9%])"
    assert (oc.loc["pooled", "k"], oc.loc["pooled", "n"]) == (39, 102)
    assert (round(oc.loc["pooled", "rate"], 3), round(oc.loc["pooled", "ci_low"], 3), round(oc.loc["pooled", "ci_high"], 3)) == (0.382, 0.294, 0.479)
    # "rising from 0% (0/9) at F0 to 45.6% (26/57) at F3"
    assert (oc.loc["F0", "k"], oc.loc["F0", "n"]) == (0, 9)
    assert round(oc.loc["F3", "rate"], 3) == 0.456
    # "while under-counting by only 1.0%"
    uc = over[over["quantity"] == "under-count"].set_index("stratum")
    assert round(uc.loc["pooled", "rate"], 3) == 0.010
    # Figure 2: 25 OPPOSES_X, 8 UNCERTAIN_DEPENDS, 5 REFUSE_INVALID, 1 PERMISSIBLE among the 39; 17 OPPOSES_X under F3.
    comp = pd.read_csv(tmp_path / "out" / "gold_composition.csv").set_index("framing")
    assert comp.loc["pooled"].to_dict() == {"SUPPORTS_X": 63, "OPPOSES_X": 25, "PERMISSIBLE_NOT_REQUIRED": 1,
                                            "UNCERTAIN_DEPENDS": 8, "REFUSE_INVALID": 5}
    assert comp.loc["F3", "OPPOSES_X"] == 17
    # "the proxy matches the human genuine-endorsement label at Cohen's kappa = 0.60 (accuracy 0.80)"
    pk = pd.read_csv(tmp_path / "out" / "gold_proxy_agreement.csv").set_index("stratum")
    assert round(pk.loc["pooled", "kappa"], 2) == 0.60 and round(pk.loc["pooled", "accuracy"], 2) == 0.80
    # Sec. 4.2: "13.1% (26/198; 95% CI [9.1%, 18.5%])", "F3 (22.7%, 17/75)", "open-source models (31.8%, 21/66,
    # versus 4.5% for US and 3.0% for Chinese-origin)", "15.3% vs. 6.25% ... Fisher exact p = .14".
    conf = pd.read_csv(tmp_path / "out" / "gold_conflicts.csv")
    pooled = conf[conf["by"] == "all"].iloc[0]
    assert (pooled["k"], pooled["n"]) == (26, 198)
    assert (round(pooled["ci_low"], 3), round(pooled["ci_high"], 3)) == (0.091, 0.185)
    byf = conf[conf["by"] == "framing"].set_index("stratum")
    assert round(byf.loc["F3", "rate"], 3) == 0.227
    byg = conf[conf["by"] == "group"].set_index("stratum")
    assert (round(byg.loc["OSS", "rate"], 3), round(byg.loc["US", "rate"], 3), round(byg.loc["CN", "rate"], 3)) == (0.318, 0.045, 0.030)
    pol = conf[conf["by"] == "polarity"].set_index("stratum")
    assert round(pol.loc["negated (F1, F3)", "rate"], 3) == 0.153 and pol.loc["affirmative (F0, F2)", "rate"] == 0.0625
    assert pol.loc["negated (F1, F3)", "rate"] / pol.loc["affirmative (F0, F2)", "rate"] == pytest.approx(2.45, abs=0.005)
    assert round(pol["fisher_p_negated_vs_affirmative"].iloc[0], 2) == 0.14
    assert any("38.2%" in x and "[29.4%, 47.9%]" in x for x in lines)


def test_label_studio_json_export_is_read(tmp_path):
    export = [
        {"id": 1, "data": {"item_id": "nsi-a", "reply": "..."},
         "annotations": [{"was_cancelled": False, "result": [
             {"from_name": "action_stance", "to_name": "reply", "type": "choices", "value": {"choices": ["OPPOSES_X"]}},
             {"from_name": "integrity", "to_name": "reply", "type": "choices",
              "value": {"choices": ["DECISION_REASONING_CONFLICT"]}}]}]},
        {"id": 2, "data": {"item_id": "nsi-b"},
         "annotations": [{"was_cancelled": True, "result": []},
                         {"was_cancelled": False, "result": [
                             {"from_name": "action_stance", "value": {"choices": ["SUPPORTS_X"]}}]}]},
        {"id": 3, "data": {"item_id": "nsi-c"}, "annotations": []},
    ]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    df = read_labels(path)
    assert df.set_index("item_id")["action_stance"].to_dict() == {"nsi-a": "OPPOSES_X", "nsi-b": "SUPPORTS_X"}
    assert df.set_index("item_id").loc["nsi-a", "integrity"] == "DECISION_REASONING_CONFLICT"
