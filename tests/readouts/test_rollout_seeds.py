"""The rollouts a run writes are the ones its documented seed rule gives (docs/tables.md, "Seeds of generated
rollouts"): the seed is re-derived here from the rule itself (SHA-256 of the parts, not the code's helper) and
one frame's (J) and one framing's (NSI) rollouts are generated again, alone, from it. A run whose frames or
framings shared a seed would write rollouts this regeneration does not give."""

import dataclasses
import hashlib
import json

import pandas as pd
import pytest

from engine.anchor import anchor_read
from engine.generation import generate, stop_token_ids
from engine.render import Prompt, encode_prompt
from panels.frames import render, render_polarity
from panels.schema import load_panel
from readouts.driver import ModelOptions, RunOptions, run
from readouts.gap import profile as gap_profile
from readouts.gap.prompts import answer_forms, prompt_of
from readouts.gap.study import GapStudy
from readouts.nsi import study as nsi_module
from readouts.nsi.profile import NsiProfile
from readouts.nsi.study import NsiStudy
from tests.helpers import get_model

MODEL = "tiny-qwen2"


def documented_seed(*parts) -> int:
    """docs/tables.md: the first 8 bytes, little-endian, of SHA-256 of the parts joined by '|', 63 bits."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def regenerate(lm, ids, budget, n, temperature, top_p, seed):
    return generate(lm.model, [ids], max_new_tokens=budget, stop_ids=stop_token_ids(lm.tokenizer, lm.model), n=n,
                    greedy_first=True, temperature=temperature, top_p=top_p, pad_id=lm.pad_id, seeds=[seed])[0]


def test_judge_rollouts_follow_the_documented_seed_per_frame(tmp_path, monkeypatch):
    profile = dataclasses.replace(gap_profile.PROFILES["quick"], name="seeds", max_units=2, j_samples=3, j_budget=6,
                                  chunk_size=2)
    monkeypatch.setitem(gap_profile.PROFILES, "seeds", profile)
    path = run(GapStudy(readouts="J"), RunOptions(model=ModelOptions(MODEL), profile="seeds", out=str(tmp_path / "j"),
                                                  progress=False, limit=1), log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    probes = pd.read_parquet(path / "probes.parquet")
    lm = get_model(MODEL)
    frame = "judge_3"
    rows = probes[(probes["frame"] == frame) & (probes["cell"] == "primary")].sort_values("rollout")
    scenario = next(s for s in load_panel(manifest["panel"]["path"]).records if s.id == rows["scenario_id"].iloc[0])
    ids_of = [o.id for o in scenario.options]
    order = tuple(ids_of.index(i) for i in rows["order"].iloc[0].split(","))
    rendered = render(scenario, frame, "primary", order, profile.frames)
    prompt = tuple(encode_prompt(lm.tokenizer, prompt_of(rendered)))
    seed = documented_seed(manifest["seed"], scenario.id, "primary", "J", frame)
    rolls = regenerate(lm, prompt, profile.j_budget, 1 + profile.j_samples, profile.temperature, profile.top_p, seed)
    texts = [anchor_read(lm.tokenizer, prompt, r, rendered.anchor, **answer_forms(scenario, rendered)).text for r in rolls]
    assert len(rows) == len(texts) == 4
    assert rows["generated_text"].tolist() == texts
    assert len(set(texts[1:])) > 1  # the sampled rollouts differ among themselves: the comparison has teeth


def test_nsi_replies_follow_the_documented_seed_per_framing(tmp_path, monkeypatch):
    profile = NsiProfile(name="quick", chunk_size=2, samples=3, budget=8)
    monkeypatch.setitem(nsi_module.PROFILES, "quick", profile)
    path = run(NsiStudy(), RunOptions(model=ModelOptions(MODEL), out=str(tmp_path / "n"), progress=False, limit=1),
               log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    replies = pd.read_parquet(path / "nsi_replies.parquet")
    lm = get_model(MODEL)
    framing = "F2"
    rows = replies[replies["framing"] == framing].sort_values("sample")
    dilemma = next(d for d in load_panel(manifest["panel"]["path"]).records if d.id == rows["dilemma_id"].iloc[0])
    prompt = tuple(encode_prompt(lm.tokenizer, Prompt(messages=render_polarity(dilemma, framing).messages)))
    seed = documented_seed(manifest["seed"], dilemma.id, framing)
    rolls = regenerate(lm, prompt, profile.budget, 1 + profile.samples, profile.temperature, profile.top_p, seed)
    texts = [lm.tokenizer.decode(r.tokens, skip_special_tokens=True) for r in rolls]
    assert len(rows) == len(texts) == 4
    assert rows["text"].tolist() == texts
    assert len(set(texts[1:])) > 1


@pytest.mark.parametrize("parts", [(0, "s", "primary", "J", "judge_1"), (42, "medical-1", "F1")])
def test_the_documented_rule_is_the_codes(parts):
    from engine.sampling import derive_seed

    assert derive_seed(*parts) == documented_seed(*parts)
