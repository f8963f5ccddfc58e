"""The served backend's arithmetic without a server: letter masses from a top-k list (the unseen remainder
bounded, a letter outside the top k NaN and named, never zero), the tempered readout over the top k against
the local sampler's rule, the model address forms, and the request cache key."""

import math

import pytest
import torch

from engine.sampling import tempered_distribution
from engine.served import letter_forms, parse_served, topk_mass
from engine.served_client import ServedError, cache_key


def test_topk_letters_seen_summed_unseen_flagged_and_bounded():
    # A planted top-5 at a read position: "A" in two forms, "B" in one, "C" absent; 0.1 of the mass unseen.
    top = [(" A", 0.40), ("B", 0.25), ("A", 0.15), ("The", 0.06), ("\nB", 0.04)]
    m = topk_mass(top, letter_forms("ABC"), ("A", "B", "C"))
    assert m.mass[0] == pytest.approx(0.55) and m.mass[1] == pytest.approx(0.29)
    assert math.isnan(m.mass[2]), "a letter outside the top k must not read as zero"
    assert m.outside == ("C",)
    assert m.unseen == pytest.approx(0.10)
    assert m.token_bound == pytest.approx(0.04)  # min(p_k, unseen): no unseen token can exceed the 5th
    assert m.k == 5


def test_token_bound_is_the_unseen_mass_when_smaller():
    m = topk_mass([("A", 0.7), ("B", 0.29)], letter_forms("AB"), ("A", "B"))
    assert m.outside == () and m.unseen == pytest.approx(0.01) and m.token_bound == pytest.approx(0.01)


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.95), (0.7, 1.0), (1.3, 0.8), (0.0, 1.0)])
def test_tempered_over_a_complete_topk_equals_the_local_sampler(temperature, top_p):
    # When the top k is the whole support, the served tempered read must equal engine.sampling's exact one.
    probs = torch.tensor([0.41, 0.22, 0.15, 0.12, 0.06, 0.04])
    texts = ["A", " B", "C", " A", "x", "\nC"]
    ref = tempered_distribution(probs.log(), temperature, top_p)
    m = topk_mass(list(zip(texts, probs.tolist())), letter_forms("ABC"), ("A", "B", "C"), temperature, top_p)
    want = [float(ref[0] + ref[3]), float(ref[1]), float(ref[2] + ref[5])]
    assert m.tempered == pytest.approx(want, abs=1e-6)


def test_model_address_forms():
    assert parse_served("openai:gpt-x@https://api.example.com/v1", None) == ("gpt-x", "https://api.example.com/v1")
    assert parse_served("org/model", "http://127.0.0.1:8000/v1") == ("org/model", "http://127.0.0.1:8000/v1")
    assert parse_served("smollm2-135m", None) is None
    with pytest.raises(ServedError, match="openai:NAME@"):
        parse_served("openai:nourl", None)
    with pytest.raises(ServedError, match="--endpoint"):
        parse_served("openai:m@http://a/v1", "http://b/v1")


def test_cache_key_separates_samples_and_parameters():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "seed": 3}
    k = cache_key("m", "http://h/v1", body, 1)
    assert k == cache_key("m", "http://h/v1/", dict(body), 1)
    assert k != cache_key("m", "http://h/v1", body, 2)
    assert k != cache_key("m", "http://h/v1", {**body, "temperature": 0.0}, 1)
    assert k != cache_key("other", "http://h/v1", body, 1)
