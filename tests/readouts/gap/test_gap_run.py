"""The judgment-action study end to end on tiny models: determinism, kill-and-resume, manifest refusal,
exact vs sampled rollouts, the control's system prompt, and the J readout's anchor rules."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from contract.tables import SCENARIOS
from engine.errors import ReadoutError
from engine.generation import Rollout
from engine.render import encode_prompt
from panels.frames import render
from panels.schema import load_panel
from readouts.driver import Interrupted
from readouts.gap import recipe
from readouts.gap.prompts import prompt_of
from readouts.gap.study import GapStudy
from readouts.profiles import select_units
from readouts.rundir import ManifestMismatch
from tests.helpers import TEST_PROFILE, get_model, one_batch, register_test_profiles
from tests.helpers import gap_run as run


@pytest.fixture(autouse=True)
def test_profiles(monkeypatch):
    register_test_profiles(monkeypatch)


def test_same_command_same_bytes_and_columns(tmp_path):
    a, logs = run(tmp_path, "a")
    b, _ = run(tmp_path, "b")
    assert (a / "scenarios.parquet").read_bytes() == (b / "scenarios.parquet").read_bytes()
    df = pd.read_parquet(a / "scenarios.parquet")
    assert list(df.columns) == list(SCENARIOS.names)
    assert set(df.readout) == {"D", "J", "J0", "raw_D", "raw_J", "control", "dose_reasoning", "dose_filler",
                               "dose_truncated_filler", "dose_brief", "dose_norm"}
    assert set(df.cell) == {"primary", "twin", "harm_twin"}
    j = df[(df.readout == "J") & (df.frame == "judge")]
    assert j.judged_option.notna().any() and j.violating_judged_frames.between(0, 4).all()
    assert df[df.readout == "D"].n_orders.eq(3).all() and df.p_violating.between(0, 1).all()
    assert any("F5" in line for line in logs) and any(line.startswith("tables:") for line in logs)
    probes = pd.read_parquet(a / "probes.parquet")
    assert probes.probe_id.is_unique
    assert set(probes.anchor_rule.dropna()) <= {"own", "forced_after_completion", "forced_at_budget"}


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    full, _ = run(tmp_path, "full")
    with pytest.raises(Interrupted):
        run(tmp_path, "resumed", stop_after_chunks=2)
    resumed, logs = run(tmp_path, "resumed")
    assert logs[0].startswith("resuming") and "2 chunks already finished" in logs[0]
    assert [line for line in logs if "skipped" in line] == [
        "chunk 1/3: already finished, skipped", "chunk 2/3: already finished, skipped"]
    assert sum("computed" in line for line in logs if line.startswith("chunk")) == 1
    for table in ("scenarios.parquet", "probes.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(full / table), pd.read_parquet(resumed / table))


def test_changed_manifest_is_refused_unless_forced(tmp_path):
    run(tmp_path, "r")
    with pytest.raises(ManifestMismatch, match="seed"):
        run(tmp_path, "r", seed=1)
    path, logs = run(tmp_path, "r", seed=1, force=True)
    assert "--force" in logs[0]
    assert pd.read_parquet(path / "scenarios.parquet").shape[0] > 0


LIFTS = {"A": 11.0, "B": 9.0, "C": 10.5, "D": 9.5, "E": 10.0}


def letters_lifted(monkeypatch, lifts=LIFTS):
    """Runs load models whose output head adds a letter's lift to each of its variants: tiny-qwen2's letters
    otherwise carry almost no mass, and a check on letter draws would have nothing to count; unequal lifts
    make the letters unequally likely, so a draw from the wrong letter's probability shows."""
    import engine.loading as loading

    real = loading.load_model

    def load(*args, **kwargs):
        lm = real(*args, **kwargs)
        head = lm.model.get_output_embeddings()
        layer = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        with torch.no_grad():
            layer.weight.copy_(head.weight)
            layer.bias.zero_()
            for letter, ids in zip("ABCDE", lm.letters("ABCDE").token_ids):
                layer.bias[list(ids)] = lifts[letter]
        lm.model.set_output_embeddings(layer)
        lm.model.config.tie_word_embeddings = False
        return lm

    monkeypatch.setattr(loading, "load_model", load)


def test_exact_tempered_agrees_with_sampled_rollouts(tmp_path, monkeypatch):
    letters_lifted(monkeypatch)
    exact, _ = run(tmp_path, "exact", profile="sampling", readouts="D")
    sampled, _ = run(tmp_path, "sampled", profile="sampling", readouts="D", sample=True)
    e = pd.read_parquet(exact / "scenarios.parquet").set_index(["scenario_id", "cell"])
    s = pd.read_parquet(sampled / "scenarios.parquet").set_index(["scenario_id", "cell"])
    assert (e.p_violating == s.p_violating).all()  # same probes, same masses
    n = 60
    diff = (s.violating_fraction - e.violating_fraction) * n  # sampled hits minus expected hits per row
    var = e.violating_fraction * (1 - e.violating_fraction) * n  # upper bound on each row's variance
    assert diff.notna().sum() >= 10 and var.sum() > 10, "letters carry too little mass: the check would be vacuous"
    z = diff.sum() / np.sqrt(var.sum())
    assert abs(z) < 4, z
    assert set(s.majority_violating_prob) <= {0.0, 1.0}
    assert not set(e.majority_violating_prob) <= {0.0, 1.0}


def test_control_replaces_default_system_prompt():
    s = load_panel("gap-v1").records[0]
    r = render(s, "control")
    olmo = get_model("tiny-olmo3").tokenizer
    text = olmo.decode(encode_prompt(olmo, prompt_of(r)))
    assert "function-calling" not in text and text.startswith(f"<|im_start|>system\n{r.system}<|im_end|>")
    llama = get_model("tiny-llama3").tokenizer
    ids = encode_prompt(llama, prompt_of(r))
    text = llama.decode(ids)
    assert ids.count(llama.bos_token_id) == 1
    assert "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + r.system in text


def test_judge_readout_exercises_every_anchor_rule(monkeypatch):
    lm = get_model("tiny-qwen2")
    tok = lm.tokenizer
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    crafted = [Rollout(enc("The honest option is best.\nAnswer: B"), True, True),
               Rollout(enc("I would pick the first one."), True, False),
               Rollout(enc("Weighing the stakes for the"), False, False)]

    def fake_generate(model, prompts, **kw):
        return [list(crafted) for _ in prompts]

    monkeypatch.setattr(recipe, "generate", one_batch(fake_generate))
    s = load_panel("gap-v1").records[0]
    runner = recipe.GapRunner(lm, TEST_PROFILE, ("J",), 0, False, "gap-v1", "tiny-qwen2")
    probes, rows = runner.run([s])
    rules = pd.DataFrame(probes).groupby("rollout").anchor_rule.unique()
    assert [list(v) for v in rules] == [["own"], ["forced_after_completion"], ["forced_at_budget"]]
    own = next(p for p in probes if p["anchor_rule"] == "own")
    assert own["generated_text"].endswith("Answer:")
    frame_rows = [r for r in rows if r["frame"] == "judge_1"]
    assert all(r["completed_fraction"] == pytest.approx(2 / 3) for r in frame_rows)


def test_select_scenarios_is_family_stratified():
    records = load_panel("gap-v1").records
    chosen = select_units(records, 10, None, GapStudy().stratum)
    assert pd.Series([s.family for s in chosen]).value_counts().to_dict() == {f: 2 for f in ["F1", "F2", "F3", "F4", "F5"]}


def test_bad_run_input(tmp_path):
    with pytest.raises(ReadoutError, match="--readouts"):
        run(tmp_path, readouts="D,X")
    with pytest.raises(ReadoutError, match="need a chat template"):
        run(tmp_path, model="tiny-base", readouts="D")
    with pytest.raises(ReadoutError, match="nsi panel"):
        run(tmp_path, panel="nsi-14")
    with pytest.raises(ReadoutError, match="--profile"):
        run(tmp_path, profile="huge")


def test_base_model_runs_raw_readouts_only(tmp_path):
    path, _ = run(tmp_path, "base", model="tiny-base")
    df = pd.read_parquet(path / "scenarios.parquet")
    assert set(df.readout) == {"raw_D", "raw_J"}


def test_profile_overrides_and_limit_are_applied_and_recorded(tmp_path):
    path, _ = run(tmp_path, "o", readouts="D,J", overrides=("orders.D=2", "j_budget=4", "j_samples=1"), limit=3)
    df = pd.read_parquet(path / "scenarios.parquet")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["overrides"] == {"orders.D": "2", "j_budget": "4", "j_samples": "1"} and manifest["limit"] == 3
    assert manifest["profile"]["orders"]["D"] == 2 and manifest["profile"]["j_budget"] == 4
    assert df.scenario_id.nunique() == 3 and manifest["panel"]["records_read"] == sorted(set(df.scenario_id), key=list(df.scenario_id).index)
    assert df[df.readout == "D"].n_orders.eq(2).all()
    judge = df[(df.readout == "J") & (df.frame == "judge_1")]
    assert judge.budget.eq(4).all() and judge.n_rollouts.eq(2).all()


def test_panel_part_reads_only_that_part_of_the_recorded_split(tmp_path):
    """--panel-part held-out: the profile selects from gap-v2's recorded held-out part (the scenarios no organism
    trains on), and the manifest records the part; a part the split lacks, or a panel with no split, is one line."""
    from panels.split import load_split

    held = load_split("gap-v2").ids("held-out")
    path, _ = run(tmp_path, "part", readouts="D", overrides=("orders.D=1",), limit=3, part="held-out")
    manifest = json.loads((path / "manifest.json").read_text())
    read = manifest["panel"]["records_read"]
    assert manifest["panel"]["part"] == "held-out" and len(read) == 3 and set(read) <= set(held)
    assert set(pd.read_parquet(path / "scenarios.parquet").scenario_id) == set(read)
    with pytest.raises(ReadoutError, match="--panel-part: .*'sideways' is not one of"):
        run(tmp_path, "bad", readouts="D", part="sideways")
    with pytest.raises(ReadoutError, match="--panel-part: .*gap-v1.split.json: file: no recorded split"):
        run(tmp_path, "v1", readouts="D", panel="gap-v1", part="held-out")


@pytest.mark.parametrize("bad, message", [
    (("orders.X=2",), "not a key of orders"), (("nope=1",), "not a field"), (("j_budget=big",), "not a valid int"),
    (("j_budget",), "key=value"), (("chunk_size=0",), "chunk_size"),
])
def test_bad_overrides_fail_before_the_model_loads(tmp_path, bad, message):
    with pytest.raises(ReadoutError, match=message):
        run(tmp_path, "bad", model="no-such-model", overrides=bad)


def test_paraphrase_cells_are_read_from_the_second_writers_text(tmp_path):
    path, _ = run(tmp_path, "para", panel="gap-v2", readouts="D", overrides=("paraphrase=true",))
    df = pd.read_parquet(path / "scenarios.parquet")
    probes = pd.read_parquet(path / "probes.parquet")
    f4 = set(df.scenario_id[df.family == "F4"])
    assert f4 and set(df.scenario_id[df.cell.isin(["paraphrase", "paraphrase_twin"])]) == f4
    scenario = load_panel("gap-v2").get(sorted(f4)[0])
    paraphrase = scenario.paraphrased()
    row = probes[(probes.scenario_id == scenario.id) & (probes.cell == "paraphrase")].iloc[0]
    rendered = render(scenario, "agent", "paraphrase", [[o.id for o in paraphrase.options].index(i) for i in row.order.split(",")])
    assert paraphrase.context.split("{pressure}")[0][:60] in rendered.messages[0]["content"]
    assert rendered.violating_letter == row.violating_letter
    quick, _ = run(tmp_path, "no-para", panel="gap-v2", readouts="D")
    assert not pd.read_parquet(quick / "scenarios.parquet").cell.str.startswith("paraphrase").any()


def test_panels_show_reproduces_the_order_a_run_read(tmp_path):
    """`readout panels show --order i --seed s --profile p` renders a probe exactly as the run did."""
    from readouts.panel_tools import show

    path, _ = run(tmp_path, "show", readouts="D,J", seed=3)
    probes = pd.read_parquet(path / "probes.parquet")
    for readout, frame in (("D", "agent"), ("J", "judge_2")):
        rows = probes[(probes.readout == readout) & (probes.frame == frame) & (probes.cell == "primary") & (probes.rollout == 0)]
        for row in rows.head(4).itertuples():
            text = show("gap-v2", row.scenario_id, frame, "primary", row.order_index if readout == "D" else 0, 3, None, "test")
            mapping = ", ".join(f"{letter}={oid}" for letter, oid in zip(row.letters, row.order.split(",")))
            assert f"letters {mapping};" in text, (row.probe_id, text.splitlines()[0])


ANCHOR_CASES = [  # generated text, the rule it must be read by, the text the read position follows
    ("I weigh both.\nAnswer: B", "own", "I weigh both.\nAnswer:"),
    ("I weigh both.\n**Answer:** B", "own_bold", "I weigh both.\n**Answer:**"),
    ("I weigh both.\n**Answer**: B", "own_bold", "I weigh both.\n**Answer**:"),
    ("I weigh both.\nAnswer - B", "own_dash", "I weigh both.\nAnswer -"),
    ("I weigh both.\nFinal answer: B", "own_final", "I weigh both.\nFinal answer:"),
    ("I weigh both.\nANSWER: B", "own_case", "I weigh both.\nANSWER:"),
    ("I weigh both.\nAnswer: **B**", "own+wrapped", "I weigh both.\nAnswer: **"),
    ("I weigh both, so the final answer is (B).", "own_final+wrapped", "I weigh both, so the final answer is ("),
]


@pytest.mark.parametrize("text,rule,prefix", ANCHOR_CASES)
def test_anchor_variants_read_at_the_letter(text, rule, prefix):
    tok = get_model("tiny-qwen2").tokenizer
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    a = recipe.anchor_read(tok, [1, 2, 3], Rollout(enc(text), True, True), "Answer:", letters="AB")
    assert a.rule == rule and a.text == prefix
    assert a.ids[:3] == (1, 2, 3) and tok.decode(a.ids[3:]) == prefix
    # The letter is what follows the read position in the model's own text.
    assert text[len(prefix):].lstrip().startswith("B")


def test_anchor_variant_needs_the_answer_after_it():
    tok = get_model("tiny-qwen2").tokenizer
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    a = recipe.anchor_read(tok, [1], Rollout(enc("The answer - it depends on the client."), True, False), "Answer:")
    assert a.rule == "forced_after_completion" and a.text.endswith("\nAnswer:")


def test_contract_names_the_engines_anchor_rules():
    from contract.readouts import ANCHOR_RULES
    from engine.anchor import ANCHOR_RULES as ENGINE_RULES
    assert ANCHOR_RULES == ENGINE_RULES


def test_f3_tool_name_answer_counts_as_its_letter(monkeypatch):
    """Pre-registration A2: a judgment naming the tool instead of its letter is read as that tool's option."""
    lm = get_model("tiny-qwen2")
    tok = lm.tokenizer
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    s = next(x for x in load_panel("gap-v1").records if x.tools)
    target = next(t for t in s.tools if t.id == s.violating)
    crafted = [Rollout(enc(f"Weighing it, I pick {target.name}.\n**Answer:** `{target.name}`"), True, True)] * 3

    monkeypatch.setattr(recipe, "generate", one_batch(lambda model, prompts, **kw: [list(crafted) for _ in prompts]))
    runner = recipe.GapRunner(lm, TEST_PROFILE, ("J",), 0, False, "gap-v1", "tiny-qwen2")
    probes, rows = runner.run([s])
    j1 = [p for p in probes if p["frame"] == "judge_1" and p["cell"] == "primary"]
    letter = dict(zip(j1[0]["order"].split(","), j1[0]["letters"]))[s.violating]
    assert {p["anchor_rule"] for p in j1} == {f"own_bold+tool:{letter}"}
    row = next(r for r in rows if r["frame"] == "judge_1" and r["cell"] == "primary")
    assert row["judged_option"] == s.violating and row["violating_fraction"] == 1.0
