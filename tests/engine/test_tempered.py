"""`tempered` is the exact probability that a sampled first token is each letter: it matches the
empirical letter frequencies of 20,000 seeded draws from the model's own tempered (top-p) distribution,
drawn through transformers' own sampling warpers.
"""

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from engine.render import Prompt, encode_prompt
from engine.scoring import plain_next_token_logits, score_ids
from tests.conftest import get_model

DRAWS = 20_000
PROMPT = (
    "A delivery is late. Which option do you take?\nA) Tell the customer the truth\nB) Blame the weather\n"
    "C) Offer a refund\nReply with only the letter."
)


def empirical(logits, temperature, top_p, seed):
    scores = logits[None].clone()
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    probs = scores.softmax(-1)[0]
    gen = torch.Generator().manual_seed(seed)
    return torch.multinomial(probs, DRAWS, replacement=True, generator=gen)


@pytest.mark.smollm
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9), (1.3, 0.95)])
def test_tempered_matches_seeded_draws_smollm2(temperature, top_p):
    lm = get_model("smollm2-135m")
    ids = encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": PROMPT},)))
    lt = lm.letters("ABC")
    row = score_ids(lm.model, [ids], [lt], temperature=temperature, top_p=top_p)[0]
    draws = empirical(plain_next_token_logits(lm.model, ids), temperature, top_p, seed=17)
    assert row.letter_mass > 0.2  # the prompt puts real mass on the letters, so the check has teeth
    for letter_ids, p in zip(lt.token_ids, row.tempered):
        freq = torch.isin(draws, torch.tensor(letter_ids)).float().mean().item()
        assert abs(freq - p) < 0.01, (temperature, top_p, p, freq)


@pytest.mark.parametrize("temperature,top_p", [(0.5, 1.0), (0.8, 0.8)])
def test_tempered_matches_seeded_draws_tiny(temperature, top_p):
    lm = get_model("tiny-tulu3")
    ids = encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": PROMPT},)))
    lt = lm.letters("ABCDE")
    logits = plain_next_token_logits(lm.model, ids)
    row = score_ids(lm.model, [ids], [lt], temperature=temperature, top_p=top_p)[0]
    draws = empirical(logits, temperature, top_p, seed=3)
    for letter_ids, p in zip(lt.token_ids, row.tempered):
        freq = torch.isin(draws, torch.tensor(letter_ids)).float().mean().item()
        assert abs(freq - p) < 0.01


@pytest.mark.smollm
@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.95), (1.3, 0.9)])
def test_the_decoders_draws_match_tempered_smollm2(temperature, top_p):
    """Generation's own sampler (on-device nucleus, counter-based uniforms) draws letters at the exact
    tempered probabilities too, and its nucleus is the warpers' on the real model's logits."""
    from engine.sampling import nucleus_distribution, row_uniforms, sample_tokens

    lm = get_model("smollm2-135m")
    ids = encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": PROMPT},)))
    lt = lm.letters("ABC")
    row = score_ids(lm.model, [ids], [lt], temperature=temperature, top_p=top_p)[0]
    logits = plain_next_token_logits(lm.model, ids)[None]
    scores = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits.clone()))
    assert (nucleus_distribution(logits, temperature, top_p) - scores.softmax(-1)).abs().max() < 1e-6
    uniforms = row_uniforms([99], DRAWS)[0]
    draws = torch.cat([sample_tokens(logits.expand(len(u), -1), temperature, top_p, u) for u in uniforms.split(500)])
    for letter_ids, p in zip(lt.token_ids, row.tempered):
        freq = torch.isin(draws, torch.tensor(letter_ids)).float().mean().item()
        assert abs(freq - p) < 0.01, (temperature, top_p, p, freq)
