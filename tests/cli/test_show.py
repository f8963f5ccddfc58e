"""probes.parquet stores the prompt the model read, and `readout show RUN_DIR ID` prints one scenario (gap run) or
one dilemma (NSI run): by default a summary table (the scenario table's values per cell x readout x frame; NSI: per
framing) and the commands for the detail; with --all the prompts, rollouts, read rules and letter masses, narrowed by
--cell / --readout / --frame; one-line errors for an unknown id, a filter that selects nothing, or a folder without
run tables; an older run without the prompt column still shows."""

import shutil

import pandas as pd
import pytest

from contract.readouts import readout as readout_spec
from contract.tables import PROMPT_TEXT
from engine.render import encode_prompt
from panels.frames import render
from panels.schema import load_panel
from readouts.gap.prompts import prompt_of
from readouts.gap.recipe import orders_for
from tests.helpers import TINY_PROFILE, cli, get_model, make_gap_run, make_nsi_run


@pytest.fixture(scope="module")
def gap_run(tmp_path_factory):
    return make_gap_run(tmp_path_factory.mktemp("show") / "gap")


def test_probes_store_the_prompt_the_model_read(gap_run):
    probes = pd.read_parquet(gap_run / "probes.parquet")
    assert probes[PROMPT_TEXT].notna().all()
    tok = get_model("tiny-qwen2").tokenizer
    scenario = load_panel("gap-v2").get(probes.scenario_id.iloc[0])
    for readout, frame in (("D", "agent"), ("J", "judge_2")):
        row = probes[(probes.scenario_id == scenario.id) & (probes.readout == readout) & (probes.frame == frame)
                     & (probes.cell == "primary")].iloc[0]
        spec = readout_spec(readout)
        orders = orders_for(scenario, spec, TINY_PROFILE, 0)
        k = row.order_index if readout == "D" else spec.frames.index(frame)
        ids = encode_prompt(tok, prompt_of(render(scenario, frame, "primary", orders[k])))
        # The prompt alone, as tokenized (chat template applied): for J without the generated text or the anchor.
        assert row[PROMPT_TEXT] == tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert row[PROMPT_TEXT].startswith("<|im_start|>system") and row[PROMPT_TEXT].endswith("<|im_start|>assistant\n")


def test_show_prints_prompts_rollouts_rules_and_masses(gap_run, capsys):
    probes = pd.read_parquet(gap_run / "probes.parquet")
    sid = probes.scenario_id.iloc[-1]
    code, out, err = cli(["show", str(gap_run), sid, "--all"], capsys)
    assert code == 0 and err == ""
    assert out.startswith(f"scenario {sid}, family ")
    mine = probes[probes.scenario_id == sid]
    # every prompt once per cell x readout x frame x order, every read's masses, every rollout's text and rule
    assert out.count("   prompt:") == len(mine.groupby(["cell", "readout", "frame", "order_index"]))
    assert out.count("masses: ") == len(mine)
    j = mine[mine.readout == "J"]
    assert out.count("read rule ") == len(j) and all(f"read rule {r}" in out for r in j.anchor_rule)
    assert all(f"   > {text.splitlines()[0]}\n" in out for text in j.generated_text if text.strip())
    assert "== cell primary / readout D ==" in out and "== cell twin / readout J ==" in out
    assert out.index("== cell primary / readout D ==") < out.index("== cell primary / readout J ==") < out.index("== cell twin")
    first = mine[mine.readout == "D"].iloc[0]
    assert first[PROMPT_TEXT].splitlines()[3] in out  # the prompt's lines are printed
    order = " ".join(f"{letter}={opt}" for letter, opt in zip(first.letters, first.order.split(",")))
    assert f"-- frame agent, order {first.order_index} ({order})" in out
    assert "aggregate primary/J/judge:" in out


def test_sampled_run_shows_each_draw(tmp_path, capsys):
    run = make_gap_run(tmp_path / "sampled", readouts="D", sample=True)
    probes = pd.read_parquet(run / "probes.parquet")
    sid = probes.scenario_id.iloc[0]
    code, out, _ = cli(["show", str(run), sid, "--all"], capsys)
    mine = probes[probes.scenario_id == sid]
    drawn = [line.rsplit("drawn ", 1)[1].rstrip(")") for line in out.splitlines() if "masses: " in line]
    assert code == 0 and len(drawn) == len(mine) > 0
    assert drawn == [x if isinstance(x, str) else "no letter" for x in mine.sampled_letter]


def test_unknown_id_and_folder_without_tables_are_one_line(gap_run, tmp_path, capsys):
    code, out, err = cli(["show", str(gap_run), "no-such-scenario"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    ids = pd.read_parquet(gap_run / "probes.parquet").scenario_id.unique()
    assert str(gap_run) in err and "'no-such-scenario'" in err and ids[0] in err
    code, out, err = cli(["show", str(tmp_path), "x"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(tmp_path) in err and "probes.parquet" in err


def test_older_run_without_prompt_column_still_shows(gap_run, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(gap_run, old)
    path = old / "probes.parquet"
    pd.read_parquet(path).drop(columns=[PROMPT_TEXT]).to_parquet(path, index=False)
    sid = pd.read_parquet(path).scenario_id.iloc[0]
    code, out, _ = cli(["show", str(old), sid, "--all"], capsys)
    assert code == 0 and "(not stored: this run predates probes.parquet's prompt_text" in out
    assert out.count("masses: ") == int((pd.read_parquet(path).scenario_id == sid).sum())


def test_show_an_nsi_dilemma(tmp_path, capsys):
    run = make_nsi_run(tmp_path / "nsi")
    replies = pd.read_parquet(run / "nsi_replies.parquet")
    did = replies.dilemma_id.iloc[0]
    code, summary, _ = cli(["show", str(run), did], capsys)
    rows = [line.split() for line in summary.splitlines() if line.split()[:1] in (["F0"], ["F1"], ["F2"], ["F3"])]
    assert code == 0 and [r[0] for r in rows] == ["F0", "F1", "F2", "F3"] and f"readout show {run} {did} --all" in summary
    cont = pd.read_parquet(run / "nsi_continuous.parquet").set_index(["dilemma_id", "framing"])
    assert [float(r[2]) for r in rows] == [round(cont.loc[(did, f), "p_agree"], 4) for f in ("F0", "F1", "F2", "F3")]
    assert [int(r[4]) for r in rows] == [int(((replies.dilemma_id == did) & (replies.framing == f)).sum()) for f in ("F0", "F1", "F2", "F3")]
    code, out, _ = cli(["show", str(run), did, "--all"], capsys)
    assert code == 0 and out.startswith(f"dilemma {did}")
    assert [line.split()[2] for line in out.splitlines() if line.startswith("== framing")] == ["F0", "F1", "F2", "F3"]
    assert out.count("   reply ") == int((replies.dilemma_id == did).sum())
    assert out.count("continuous: mass_agree") == 4 and "message (before the chat template):" in out
    assert load_panel("nsi-14").get(did).scenario.splitlines()[0] in out


def test_show_prints_a_summary_by_default(gap_run, capsys):
    """The default is one table row per row of scenarios.parquet (its values, read here from the table), a line
    saying what it shows, and the commands for the detail, which is several times longer."""
    scen = pd.read_parquet(gap_run / "scenarios.parquet")
    sid = scen.scenario_id.iloc[0]
    code, out, err = cli(["show", str(gap_run), sid], capsys)
    _, full, _ = cli(["show", str(gap_run), sid, "--all"], capsys)
    assert code == 0 and err == "" and out.startswith(f"scenario {sid}, family ")
    lines = out.splitlines()
    assert len(lines) < 40 and len(full.splitlines()) > 4 * len(lines)
    assert "summary: " in out and f"readout show {gap_run} {sid} --all" in out and f"the detail, {len(full.splitlines())} lines" in out
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["cell", "readout", "frame"])
    mine = scen[scen.scenario_id == sid]
    table = [line.split() for line in lines[header + 1: header + 1 + len(mine)]]
    assert {(r[0], r[1], r[2]): float(r[5]) for r in table} == {
        (r.cell, r.readout, r.frame): round(r.p_violating, 3) for r in mine.itertuples()}
    assert "   prompt:" not in out and "masses: " not in out


def test_show_narrows_the_detail(gap_run, capsys):
    probes = pd.read_parquet(gap_run / "probes.parquet")
    sid = probes.scenario_id.iloc[0]
    code, out, _ = cli(["show", str(gap_run), sid, "--cell", "twin", "--readout", "J"], capsys)
    mine = probes[(probes.scenario_id == sid) & (probes.cell == "twin") & (probes.readout == "J")]
    assert code == 0 and "== cell twin / readout J ==" in out and "== cell primary" not in out
    assert out.count("   prompt:") == len(mine.groupby(["frame", "order_index"])) and out.count("masses: ") == len(mine)
    code, out, err = cli(["show", str(gap_run), sid, "--readout", "J9"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--readout J9" in err and "readouts D, J" in err
