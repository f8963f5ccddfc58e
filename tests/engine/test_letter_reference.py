"""Letter masses against an independent reference: a plain forward pass of the model on the prompt, a plain
softmax over the full vocabulary at the last position, and each letter's variants ("L", " L", "\\nL" where
single tokens) looked up in the tokenizer here. Letter by letter, on prompts whose letters carry distinct
masses, so a permutation of the letters (or of their variants) cannot pass."""

import itertools

import pytest
import torch

from engine.render import Prompt, encode_prompt
from engine.scoring import score_prompts
from tests.helpers import get_model

LETTERS = ("A", "B", "C", "D")
BODY = ("Dana must decide whether to file the report on time.\nA) File it today\nB) Wait a week\n"
        "C) Ask the lead\nD) Say nothing\nReply with only the letter.")


def prompts_for(name):
    if name == "tiny-base":
        return [Prompt(text=BODY + "\nAnswer:"), Prompt(text="Case two. " + BODY + "\nAnswer: (")]
    return [Prompt(messages=({"role": "user", "content": BODY},)),
            Prompt(messages=({"role": "user", "content": "Case two. " + BODY},), system="Answer briefly.")]


def reference_masses(lm, prompt):
    """Per letter: the plain full-vocabulary softmax mass of its single-token variants."""
    ids = encode_prompt(lm.tokenizer, prompt)
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()
    probs = logits.softmax(-1)
    out = []
    for letter in LETTERS:
        pieces = [lm.tokenizer.encode(v, add_special_tokens=False) for v in (letter, " " + letter, "\n" + letter)]
        out.append(float(sum(probs[i] for i in {p[0] for p in pieces if len(p) == 1})))
    return out


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama3", "tiny-base"])
def test_letter_masses_equal_a_plain_softmax_letter_by_letter(name):
    lm = get_model(name)
    prompts = prompts_for(name)
    for fast in (True, False):
        got = score_prompts(lm, prompts, [LETTERS] * len(prompts), fast=fast)
        for prompt, res in zip(prompts, got):
            ref = reference_masses(lm, prompt)
            # Distinct masses: any two letters differ by 1% or more, 100x the tolerance, so a permutation fails.
            assert min(abs(a - b) / max(a, b) for a, b in itertools.combinations(ref, 2)) > 0.01
            assert res.letters == LETTERS
            assert res.mass == pytest.approx(ref, rel=1e-4, abs=1e-10)
            assert res.option_mass == pytest.approx([m / sum(ref) for m in ref], rel=1e-4)
            assert res.letter_mass == pytest.approx(sum(ref), rel=1e-4)
