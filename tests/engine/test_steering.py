"""Steering (engine/steering.py) equals a forward hook written here on a plain one-prompt forward, in fp32 within
1e-5, on every tiny family and on SmolLM2: at every position and at the read position, through the prefix tree and
batching, with per-prompt steerings mixed in one call, in greedy generation, and in a text's loss. Known prefixes
computed without steering are reused under read-position steering and bypassed under all-position steering."""

import pytest
import torch

from engine.errors import ProbeInputError
from engine.residuals import n_depths
from engine.scoring import ScoreStats, letter_masses, score_ids
from engine.steering import Steering, generate_steered, score_steered, token_loss
from tests.helpers import TINY, get_model, probe_set

TOL = 1e-5
CONFIGS = (dict(fast=False), dict(max_batch=3), dict(max_batch=64, min_prefix=4))


def add_hook(model, depth, vector, last_only):
    """A hook adding `vector` to the stream at `depth` (every position, or the last one), written independently of
    the engine: depth 0 on the embeddings' output, depth i on decoder layer i's output."""
    def add(h):
        if last_only:
            h = h.clone()
            h[:, -1] = h[:, -1] + vector.to(h.dtype)
            return h
        return h + vector.to(h.dtype)

    if depth == 0:
        return model.get_input_embeddings().register_forward_hook(lambda m, a, out: add(out))
    return model.base_model.layers[depth - 1].register_forward_hook(
        lambda m, a, out: (add(out[0]), *out[1:]) if isinstance(out, tuple) else add(out))


def hooked_last_logits(model, ids, steering: Steering | None) -> torch.Tensor:
    handle = None if steering is None else add_hook(model, steering.depth, steering.vector * steering.strength,
                                                    steering.positions == "read")
    try:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0, -1].float()
    finally:
        if handle is not None:
            handle.remove()


def steerings_for(model, n):
    """Per prompt: none, read-position steerings at several depths and strengths, and two all-position ones."""
    gen = torch.Generator().manual_seed(5)
    hidden, depths = model.config.hidden_size, n_depths(model)
    everywhere = [Steering(1, torch.randn(hidden, generator=gen) * 10, 2.0),
                  Steering(depths - 1, torch.randn(hidden, generator=gen) * 10, -1.5)]
    out = []
    for i in range(n):
        if i % 5 == 4:
            out.append(None)
        elif i % 5 in (1, 3):
            out.append(everywhere[(i // 5) % 2])
        else:
            out.append(Steering(i % depths, torch.randn(hidden, generator=gen) * 3, 1.0 + i % 3, "read"))
    return out


def check_scoring(lm, seqs, letters, configs=CONFIGS):
    model = lm.model
    steer = steerings_for(model, len(seqs))
    refs = [letter_masses(hooked_last_logits(model, s, st)[None], [lt], [len(s)], 0.7, 1.0)[0]
            for s, lt, st in zip(seqs, letters, steer)]
    for kwargs in configs:
        out = score_steered(model, seqs, letters, steer, temperature=0.7, **kwargs)
        for r, ref, st in zip(out, refs, steer):
            got, want = r.mass + r.tempered, ref.mass + ref.tempered
            assert max(abs(a - b) for a, b in zip(got, want)) < TOL, (kwargs, st and (st.depth, st.positions))
    # The steerings move the read by far more than the tolerance: a steering that was not applied would be seen.
    plain = score_ids(model, seqs, letters, temperature=0.7)
    moved = [max(abs(a - b) for a, b in zip(x.option_mass, y.option_mass)) for x, y, st in zip(plain, refs, steer) if st]
    assert min(moved) > 10 * TOL
    # One steering for every prompt, each mode.
    for positions in ("all", "read"):
        st = Steering(n_depths(model) // 2, torch.ones(model.config.hidden_size), 0.5, positions)
        out = score_steered(model, seqs, letters, st, max_batch=8)
        for s, lt, r in zip(seqs, letters, out):
            ref = letter_masses(hooked_last_logits(model, s, st)[None], [lt], [len(s)], 1.0, 1.0)[0]
            assert max(abs(a - b) for a, b in zip(r.mass, ref.mass)) < TOL, positions


@pytest.mark.parametrize("name", TINY)
def test_steered_scoring_equals_a_manual_hook_tiny(name):
    lm, seqs, letters = probe_set(name, n_scenarios=2, orders=4)
    check_scoring(lm, seqs, letters)


def known_prefix(model, ids):
    """{prefix: keys/values} of an unsteered forward over `ids`, as generate(prefix_kv=...) publishes them."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(ids)]), past_key_values=cache, use_cache=True)
    return {tuple(ids): [(layer.keys, layer.values) for layer in cache.layers]}


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama3"])
def test_known_prefixes_under_steering(name):
    """An unsteered cache of the prompts' common prefix: reused under read-position steering (fewer tokens run,
    same numbers), bypassed under all-position steering (its keys were not steered)."""
    lm, seqs, letters = probe_set(name, n_scenarios=1, orders=4)
    seqs, letters = seqs[:4], letters[:4]
    n = next(k for k in range(min(map(len, seqs))) if len({s[k] for s in seqs}) > 1)  # their common prefix
    assert n > 8
    known = known_prefix(lm.model, seqs[0][:n])
    v = torch.randn(lm.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for positions in ("read", "all"):
        st = Steering(1, v, 3.0, positions)
        with_known, without = ScoreStats(), ScoreStats()
        a = score_steered(lm.model, seqs, letters, st, known_prefixes=known, stats=with_known)
        score_steered(lm.model, seqs, letters, st, stats=without)
        for s, lt, r in zip(seqs, letters, a):
            ref = letter_masses(hooked_last_logits(lm.model, s, st)[None], [lt], [len(s)], 1.0, 1.0)[0]
            assert max(abs(x - y) for x, y in zip(r.mass, ref.mass)) < TOL, positions
        if positions == "read":
            assert with_known.computed_tokens < without.computed_tokens
        else:
            assert with_known.computed_tokens == without.computed_tokens


def greedy_reference(model, prompt, steering, steps):
    """Greedy decoding by full plain forwards, the steering added at every position by the hook above."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(hooked_last_logits(model, ids, steering).argmax()))
    return tuple(ids[len(prompt):])


@pytest.mark.parametrize("name", ["tiny-olmo3", "tiny-qwen2", "tiny-llama3"])
def test_steered_generation_equals_a_manual_hook(name):
    lm, seqs, _ = probe_set(name, n_scenarios=1, orders=3)
    prompts = seqs[:3]
    st = Steering(1, torch.randn(lm.model.config.hidden_size, generator=torch.Generator().manual_seed(2)), 4.0)
    out = generate_steered(lm.model, prompts, st, max_new_tokens=6, stop_ids=frozenset())
    plain = generate_steered(lm.model, prompts, None, max_new_tokens=6, stop_ids=frozenset())
    for p, rolls in zip(prompts, out):
        assert rolls[0].tokens == greedy_reference(lm.model, p, st, 6)
    assert [r[0].tokens for r in out] != [r[0].tokens for r in plain]
    with pytest.raises(ProbeInputError, match="positions"):
        generate_steered(lm.model, prompts, Steering(1, st.vector, 1.0, "read"), max_new_tokens=2, stop_ids=frozenset())


def test_token_loss_equals_a_manual_hook():
    lm = get_model("tiny-llama3")
    ids = lm.tokenizer("the agent must decide whether to file the report on time")["input_ids"]
    st = Steering(2, torch.randn(lm.model.config.hidden_size, generator=torch.Generator().manual_seed(4)), 2.0)
    handle = add_hook(lm.model, 2, st.vector * 2.0, last_only=False)
    try:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1].float()
    finally:
        handle.remove()
    want = float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])))
    got, n = token_loss(lm.model, ids, st)
    assert n == len(ids) - 1 and abs(got - want) < TOL
    assert abs(token_loss(lm.model, ids)[0] - got) > 1e-3


def test_bad_steering_is_refused():
    lm = get_model("tiny-qwen2")
    hidden = lm.model.config.hidden_size
    with pytest.raises(ProbeInputError, match="depth"):
        score_steered(lm.model, [[5, 6, 7]], [lm.letters("AB")], Steering(99, torch.zeros(hidden)))
    with pytest.raises(ProbeInputError, match="vector"):
        score_steered(lm.model, [[5, 6, 7]], [lm.letters("AB")], Steering(1, torch.zeros(hidden + 1)))
    with pytest.raises(ProbeInputError, match="positions"):
        Steering(1, torch.zeros(hidden), 1.0, "prefix")


@pytest.mark.smollm
def test_steered_scoring_on_smollm2():
    lm, seqs, letters = probe_set("smollm2-135m", n_scenarios=1, orders=2, seed=1)
    check_scoring(lm, seqs, letters, CONFIGS[1:2])
