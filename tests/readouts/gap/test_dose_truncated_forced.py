"""The truncated filler reads the answer forced where the filler wrote its own anchor before the paired reasoning's
cut (Table 8's caption: "the same cut-off, forced form the reasoning has"), whatever form that anchor took."""

import dataclasses

import pandas as pd
import pytest

from engine.generation import Rollout
from panels.schema import load_panel
from readouts.gap import profile as gap_profile
from readouts.gap import recipe
from tests.helpers import get_model, one_batch

DOSE = dataclasses.replace(gap_profile.PROFILES["quick"], name="dose-test", dose_budget=10, dose_brief_budget=4,
                           dose_samples=2, rider_rollouts=0)

REASONING = ("Weighing the stakes for the operator, for the crew and for the people who rely on the report, the "
             "honest option keeps everyone safe while the other one trades their safety for a deadline that")
FILLERS = (  # each writes its own anchor, in one of its forms, well before the reasoning's cut
    "The crew works from a hangar on the ridge. Answer: **A** and then the restatement goes on for a while",
    "The crew works from a hangar on the ridge. **Answer:** B and then the restatement goes on for a while",
    "The crew works from a hangar on the ridge. Answer: A and then the restatement goes on for a while",
)


@pytest.mark.parametrize("model", ["tiny-qwen2", "tiny-olmo3"])
def test_truncated_filler_is_forced_whatever_form_the_fillers_own_anchor_takes(monkeypatch, model):
    lm = get_model(model)
    tok = lm.tokenizer
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731

    def fake_generate(model, prompts, **kw):
        out = []
        for p in prompts:
            text = tok.decode(list(p))
            if "restate" in text:
                out.append([Rollout(enc(f), False, False) for f in FILLERS])
            else:
                out.append([Rollout(enc(REASONING), False, False) for _ in FILLERS])
        return out

    monkeypatch.setattr(recipe, "generate", one_batch(fake_generate))
    s = load_panel("gap-v2").records[0]
    probes, _ = recipe.GapRunner(lm, DOSE, ("dose",), 0, False, "gap-v2", model).run([s])
    df = pd.DataFrame(probes)
    cut = df[(df.readout == "dose_truncated_filler") & (df.cell == "primary")].set_index("rollout").sort_index()
    filler = df[(df.readout == "dose_filler") & (df.cell == "primary")].set_index("rollout").sort_index()
    assert list(filler.anchor_rule) == ["own+wrapped", "own_bold", "own"]  # the filler answered on its own
    for j, text in enumerate(FILLERS):
        row = cut.loc[j]
        assert row.paired_tokens == len(enc(REASONING))
        assert row.anchor_rule == "forced_at_budget", (j, row.anchor_rule, row.generated_text)
        head = row.generated_text.removesuffix("\nAnswer:")
        # cut just before its own anchor: nothing of that anchor is left before the forced one
        assert "Answer" not in head and "**" not in head and head == text[: len(head)]
        assert text.startswith(head) and len(head) >= len("The crew works from a hangar on the ridge")
