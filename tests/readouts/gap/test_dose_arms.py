"""The dose arms matched to the reasoning arm: the filler generated to its paired reasoning
rollout's length, the truncated filler cut where the paired reasoning read sits, the rider (P1-A6) as profile
fields, and the norm arm stating the scenario's norm in frames v2 while v1 renders as it always did."""

import dataclasses
import hashlib
import json

import pandas as pd
import pytest

from contract.names import FRAMES
from engine.errors import ReadoutError
from engine.generation import Rollout, generate
from engine.render import encode_prompt
from panels.frames import render
from panels.schema import load_panel
from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.gap import recipe
from readouts.gap.prompts import prompt_of
from readouts.gap.study import GapStudy
from readouts.profiles import apply_overrides
from tests.helpers import get_model, one_batch

DOSE = dataclasses.replace(gap_profile.PROFILES["quick"], name="dose-test", dose_budget=10, dose_brief_budget=4,
                           dose_samples=1, rider_rollouts=0)


def _by(probes, readout):
    df = pd.DataFrame(probes)
    return df[df.readout == readout].set_index(["scenario_id", "cell", "rollout"]).sort_index()


def _stopping(lm, scenarios, profile, n=12):
    """Stop ids that end some reasoning rollouts early: the 4th greedy token of each reasoning prompt."""
    prompts = [encode_prompt(lm.tokenizer, prompt_of(render(s, "dose_reasoning", c)))
               for s in scenarios for c in s.cells]
    free = generate(lm.model, prompts, max_new_tokens=n, stop_ids=frozenset())
    return frozenset(r[0].tokens[3] for r in free)


def test_filler_is_generated_to_its_paired_reasoning_rollouts_length():
    lm = get_model("tiny-olmo3")
    scenarios = load_panel("gap-v2").records[:3]
    runner = recipe.GapRunner(lm, DOSE, ("dose",), 0, False, "gap-v2", "tiny-olmo3")
    runner.stop = runner.stop | _stopping(lm, scenarios, DOSE)
    probes, _ = runner.run(scenarios)
    reasoning, filler = _by(probes, "dose_reasoning"), _by(probes, "dose_filler")
    assert len(filler) == len(reasoning) == 3 * 2 * 2  # scenarios x cells x rollouts
    assert (filler.generated_tokens == reasoning.generated_tokens).all()
    assert (filler.paired_tokens == reasoning.generated_tokens).all()
    lengths = set(reasoning.generated_tokens)
    assert len(lengths) > 1 and min(lengths) < DOSE.dose_budget  # some reasoning ended early, some ran on
    # the filler's own text is its own: it is not the reasoning's text
    assert (filler.generated_text != reasoning.generated_text).any()
    assert reasoning.paired_tokens.isna().all()


def _crafted(tok):
    """Rollouts by arm: the reasoning answers on its own early (rollout 0) or runs into the budget (rollout 1);
    the filler runs on (rollout 0) or writes its own anchor early (rollout 1)."""
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    return {
        "step by step": [Rollout(enc("B keeps the report true.\nAnswer: B"), True, True),
                         Rollout(enc("Weighing the stakes for the operator and for the crew, the report"), False, False)],
        "restate": [Rollout(enc("Sextant schedules maintenance for forty turbines on a coastal ridge near the sea, "
                                "and the drone crew works from a hangar"), False, True),
                    Rollout(enc("Answer: A. The crew was grounded for nine days by high winds on the ridge"), False, False)],
    }


def test_truncated_filler_is_cut_where_the_paired_reasoning_read_sits(monkeypatch):
    lm = get_model("tiny-qwen2")
    tok = lm.tokenizer
    crafted = _crafted(tok)
    seen = {}

    def fake_generate(model, prompts, **kw):
        seen.setdefault("length_of", []).extend(kw.get("length_of") or [])  # every call's (one per budget)
        out = []
        for p in prompts:
            text = tok.decode(list(p))
            out.append(next((list(v) for k, v in crafted.items() if k in text), list(crafted["step by step"])))
        return out

    monkeypatch.setattr(recipe, "generate", one_batch(fake_generate))
    s = load_panel("gap-v2").records[0]
    runner = recipe.GapRunner(lm, DOSE, ("dose",), 0, False, "gap-v2", "tiny-qwen2")
    probes, _ = runner.run([s])
    assert any(x is not None for x in seen["length_of"])  # the filler jobs are tied to the reasoning jobs
    reasoning, cut = _by(probes, "dose_reasoning"), _by(probes, "dose_truncated_filler")
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    kept = {0: len(enc("B keeps the report true.\nAnswer:")), 1: len(crafted["step by step"][1].tokens)}
    assert list(reasoning.xs("primary", level="cell").anchor_rule) == ["own", "forced_at_budget"]
    for (_, _, j), row in cut.iterrows():
        filler = crafted["restate"][j].tokens
        assert row.paired_tokens == kept[j]
        assert row.anchor_rule == "forced_at_budget"
        if j == 0:  # cut exactly where the reasoning's letter was read, the answer forced there
            assert row.generated_tokens == kept[0] != len(filler) // 2
            assert row.generated_text == tok.decode(list(filler[: kept[0]])) + "\nAnswer:"
        else:  # the filler's own anchor stands before the cut: cut before it, so the answer is still forced
            assert row.generated_tokens < kept[1]
            assert "Answer: A" not in row.generated_text


def test_rider_continues_the_reasoning_rollouts_and_is_off_in_quick():
    assert gap_profile.PROFILES["quick"].rider_rollouts == 0
    assert gap_profile.PROFILES["paper"].rider_rollouts == 8 and gap_profile.PROFILES["paper"].rider_budget == 2048
    lm = get_model("tiny-olmo3")
    scenarios = load_panel("gap-v2").records[:2]
    profile = dataclasses.replace(DOSE, rider_rollouts=3, rider_budget=16, dose_budget=6)
    runner = recipe.GapRunner(lm, profile, ("dose",), 0, False, "gap-v2", "tiny-olmo3")
    probes, rows = runner.run(scenarios)
    reasoning, rider, cut = _by(probes, "dose_reasoning"), _by(probes, "dose_rider"), _by(probes, "dose_rider_cut")
    # P1-A6: "8 rollouts per scenario": the primary cell only (the dose arms also read the twin)
    assert set(reasoning.index.get_level_values("cell")) == {"primary", "twin"}
    assert set(rider.index.get_level_values("cell")) == set(cut.index.get_level_values("cell")) == {"primary"}
    assert len(rider) == len(cut) == 2 * 3 and rider.generated_tokens.max() <= 16
    assert rider.generated_tokens.max() > profile.dose_budget and cut.generated_tokens.max() <= profile.dose_budget
    primary = reasoning.xs("primary", level="cell", drop_level=False)
    both = primary.index  # rollouts 0 and 1: the rider's first dose_budget tokens are the reasoning's
    assert list(cut.loc[both].generated_text) == list(primary.generated_text)
    assert list(cut.loc[both].anchor_rule) == list(primary.anchor_rule)
    assert cut.loc[both].p_violating.to_numpy() == pytest.approx(primary.p_violating.to_numpy(), abs=1e-4)
    per_scenario = sum(recipe.reads_per_scenario(s, profile, ("dose",)) for s in scenarios)
    assert per_scenario == len(probes)
    budgets = {(r["readout"], r["budget"]) for r in rows if r["readout"].startswith("dose_rider")}
    assert budgets == {("dose_rider", 16), ("dose_rider_cut", 6)}
    off = recipe.GapRunner(lm, DOSE, ("dose",), 0, False, "gap-v2", "tiny-olmo3").run(scenarios[:1])[0]
    assert not any(p["readout"].startswith("dose_rider") for p in off)


@pytest.mark.parametrize("bad, message", [
    ("rider_rollouts=-1", "rider_rollouts"), ("rider_budget=4", "rider_budget"), ("frames=v9", "frames"),
])
def test_rider_and_frames_overrides_are_checked(bad, message):
    with pytest.raises(ReadoutError, match=message):
        apply_overrides(dataclasses.replace(DOSE, rider_rollouts=2, rider_budget=32), (bad,))[0].check()


# -- frames -----------------------------------------------------------------------------------------------------

V1_GOLDEN = "3a1d1169d7cb3432b02e4e5c77da0cf253c1f6c6dd48bd1a779e205ae862652a"
"""sha256 of every frame of every gap-v1 scenario and cell rendered by frames v1, as the code before frames v2
rendered them (the norm arm's text included)."""


def _digest(records, **kw) -> str:
    h = hashlib.sha256()
    for s in records:
        for cell in s.cells:
            for frame in FRAMES:
                r = render(s, frame, cell, **kw)
                h.update(json.dumps([r.messages, r.text, r.system, r.anchor, r.version, r.letters, r.option_ids],
                                    sort_keys=True).encode())
    return h.hexdigest()


def test_frames_v1_render_byte_for_byte_as_before():
    records = load_panel("gap-v1").records
    assert _digest(records) == _digest(records, version="v1") == V1_GOLDEN


def test_frames_v2_norm_arm_states_the_scenarios_norm_and_nothing_else_changes():
    for s in load_panel("gap-v2").records[:40]:
        for cell in s.cells:
            for frame in FRAMES:
                v1, v2 = render(s, frame, cell), render(s, frame, cell, version="v2")
                assert (v1.version, v2.version) == ("frames-v1", "frames-v2")
                if frame != "dose_norm":
                    assert (v1.messages, v1.text, v1.system, v1.anchor) == (v2.messages, v2.text, v2.system, v2.anchor)
                    continue
                assert s.norm not in v1.messages[-1]["content"]
                assert f'"{s.norm}"' in v2.messages[-1]["content"]
                assert v2.messages[-1]["content"].endswith('Then give your final answer on its own line as "Answer: <letter>".')


def test_run_with_frames_v2_records_it_and_v1_stays_the_default(tmp_path):
    def go(name, overrides):
        options = RunOptions(model=ModelOptions("tiny-qwen2"), profile="quick", out=str(tmp_path / name), progress=False,
                             limit=1, overrides=overrides)
        return run_study(GapStudy(readouts="dose"), options, log=lambda *_: None)

    m1, m2 = (json.loads((go(name, o) / "manifest.json").read_text()) for name, o in (("v1", ()), ("v2", ("frames=v2",))))
    assert (m1["frames_version"], m1["profile"]["frames"]) == ("frames-v1", "v1")
    assert (m2["frames_version"], m2["profile"]["frames"]) == ("frames-v2", "v2")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_runner_renders_the_profiles_frames_version(monkeypatch, version):
    lm = get_model("tiny-qwen2")
    seen = []

    def fake_generate(model, prompts, **kw):
        seen.extend(lm.tokenizer.decode(list(p)) for p in prompts)
        return [[Rollout((1, 2), True, True)] * kw["n"] for _ in prompts]

    monkeypatch.setattr(recipe, "generate", one_batch(fake_generate))
    s = load_panel("gap-v2").records[0]
    recipe.GapRunner(lm, dataclasses.replace(DOSE, frames=version), ("dose",), 0, False, "gap-v2", "tiny-qwen2").run([s])
    norm = [t for t in seen if "norm" in t and "Before you decide" in t]
    assert norm and all((s.norm in t) == (version == "v2") for t in norm)
