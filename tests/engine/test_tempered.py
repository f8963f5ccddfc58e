"""`tempered` is the exact probability that a sampled first token is each letter: it matches the
empirical letter frequencies of 20,000 seeded draws from the model's own tempered (top-p) distribution,
drawn through transformers' own sampling warpers, through the decoder's sampler, and through generate():
on the embedded model, and on a tiny model whose output head is biased so that the letters carry the mass.
"""

import copy

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from engine.render import Prompt, encode_prompt
from engine.scoring import plain_next_token_logits, score_ids
from tests.helpers import get_model

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


# -- on a tiny model whose output head is biased toward the letters ------------------------------------------
# A random tiny model puts almost no mass on the letters, so agreement there would hold for any tempering.
# The copy below gets an output-layer bias that lifts every variant of A, B and C to just under the prompt's
# most likely token: the letters then carry most of the mass, unequally, and the rest of the vocabulary
# keeps enough for top-p to cut into it.
LETTER_OFFSETS = {"A": 0.0, "B": -1.0, "C": -2.0}
"""Each letter variant's logit after the bias, relative to the prompt's top unbiased logit."""
SETTINGS = [(0.7, 1.0), (1.0, 0.9), (1.5, 0.95)]


@pytest.fixture(scope="module")
def biased():
    """(model copy with the letter-biased head, prompt ids, letter tokens) on tiny-qwen2."""
    lm = get_model("tiny-qwen2")
    ids = encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": PROMPT},)))
    lt = lm.letters("ABC")
    model = copy.deepcopy(lm.model)
    head = model.get_output_embeddings()
    logits = plain_next_token_logits(model, ids)
    top = float(logits.max())
    layer = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        layer.weight.copy_(head.weight)
        layer.bias.zero_()
        for letter, variants in zip(lt.letters, lt.token_ids):
            for t in variants:
                layer.bias[t] = top + LETTER_OFFSETS[letter] - float(logits[t])
    model.set_output_embeddings(layer)
    return model, ids, lt


def warped(logits, temperature, top_p):
    """The tempered top-p distribution by transformers' own warpers (the reference)."""
    scores = TemperatureLogitsWarper(temperature)(None, logits[None].clone())
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)[0]


def letter_freqs(draws, lt):
    return [torch.isin(draws, torch.tensor(v)).float().mean().item() for v in lt.token_ids]


def assert_agree(freqs, probs, n, where):
    for f, p in zip(freqs, probs):
        sd = (p * (1 - p) / n) ** 0.5
        assert abs(f - p) < 4.5 * sd + 1e-3, (where, probs, freqs)


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_tempered_letters_match_the_warpers_and_seeded_draws_tiny(biased, temperature, top_p):
    """Exact tempered letter probabilities (score_ids) = transformers' warpers on the same logits, and = the
    frequencies of 20,000 draws of the decoder's sampler (sample_tokens at counter-based uniforms)."""
    from engine.sampling import row_uniforms, sample_tokens

    model, ids, lt = biased
    row = score_ids(model, [ids], [lt], temperature=temperature, top_p=top_p)[0]
    logits = plain_next_token_logits(model, ids)
    plain = logits.softmax(-1)
    # The letters carry real, unequal mass, so a wrong temperature or letter would show.
    assert row.letter_mass > 0.5 and min(row.mass) > 0.03 and max(row.mass) - min(row.mass) > 0.1
    assert sum(row.tempered) > 0.5
    ref = warped(logits, temperature, top_p)
    for v, p, m in zip(lt.token_ids, row.tempered, row.mass):
        assert p == pytest.approx(float(ref[list(v)].sum()), abs=1e-5)
        assert m == pytest.approx(float(plain[list(v)].sum()), abs=1e-5)
    uniforms = row_uniforms([99], DRAWS)[0]
    draws = torch.cat([sample_tokens(logits[None].expand(len(u), -1), temperature, top_p, u) for u in uniforms.split(2000)])
    assert_agree(letter_freqs(draws, lt), row.tempered, DRAWS, (temperature, top_p))


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_generated_first_tokens_match_tempered_tiny(biased, temperature, top_p):
    """generate()'s sampled first tokens, over seeded rollouts of the biased model, fall on the letters at
    the exact tempered probabilities."""
    from engine.generation import generate

    model, ids, lt = biased
    row = score_ids(model, [ids], [lt], temperature=temperature, top_p=top_p)[0]
    n = 2000
    out = generate(model, [ids, ids], max_new_tokens=1, stop_ids=frozenset(), n=n, temperature=temperature,
                   top_p=top_p, seeds=[5, 6])
    first = torch.tensor([r.tokens[0] for rolls in out for r in rolls])
    assert len(first) == 2 * n and not any(r.greedy for rolls in out for r in rolls)
    assert_agree(letter_freqs(first, lt), row.tempered, 2 * n, (temperature, top_p))


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
