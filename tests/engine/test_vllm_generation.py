"""Rollouts drawn by vLLM (engine/vllm_generation.py) on the embedded SmolLM2 in float32, against the project's own
decoder on the same prompts: the greedy texts are the same tokens (or part only after a near-tie, which a plain
forward shows), seeded sampled texts do not depend on how the requests were batched or on a restart, a tied
rollout has exactly its leader's length, and a dead server is named as such."""

import json

import pytest
import torch

from engine.generation import generate, stop_token_ids
from engine.render import encode_prompt
from engine.served_client import ClientSettings, ServedError
from engine.vllm_generation import GeneratorSpec, VllmGenerator
from panels.frames import render
from panels.schema import load_panel
from readouts.gap.prompts import prompt_of
from tests.helpers import get_model
from tests.served_helpers import SERVED_NAME, CannedServer

pytestmark = [pytest.mark.smollm, pytest.mark.served]
NEAR_TIE = 0.01
"""Largest gap between the top two logits at which the two engines may pick different greedy tokens (both compute
in float32 with other summation orders)."""


def judge_prompts(lm, k=12):
    """The J frames' prompts of the first `k` gap-v2 scenarios (primary cell, the four paraphrases in turn)."""
    out = []
    for i, s in enumerate(load_panel("gap-v2").records[:k]):
        out.append(tuple(encode_prompt(lm.tokenizer, prompt_of(render(s, f"judge_{1 + i % 4}", "primary")))))
    return out


def generator(server, cache, concurrency=16):
    spec = GeneratorSpec(url=server.url, model=SERVED_NAME, identity={"test": "smollm2-fp32"}, cache=str(cache),
                         concurrency=concurrency)
    return VllmGenerator(spec)


def first_difference(a, b):
    return next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_greedy_texts_equal_the_own_decoders_up_to_a_near_tie(served_server, tmp_path):
    lm = get_model("smollm2-135m")
    prompts = judge_prompts(lm)
    stops = stop_token_ids(lm.tokenizer, lm.model)
    own = generate(lm.model, prompts, max_new_tokens=48, stop_ids=stops, pad_id=lm.pad_id)
    drawn = generator(served_server, tmp_path)(lm.model, prompts, max_new_tokens=48, stop_ids=stops)
    ties = 0
    for p, (a,), (b,) in zip(prompts, own, drawn):
        t = first_difference(a.tokens, b.tokens)
        if t is None:
            assert a.tokens == b.tokens and a.stopped == b.stopped
            continue
        with torch.no_grad():  # a plain forward of the prompt and the shared prefix: the two picks are a near-tie
            logits = lm.model(input_ids=torch.tensor([list(p) + list(a.tokens[:t])])).logits[0, -1].float()
        top = logits.topk(2).values
        assert float(top[0] - top[1]) < NEAR_TIE, f"the engines part at step {t} without a near-tie"
        ties += 1
    assert ties <= 2, f"{ties} of {len(prompts)} greedy texts part"


def test_seeded_texts_do_not_depend_on_batching_or_a_restart(served_server, tmp_path):
    lm = get_model("smollm2-135m")
    prompts = judge_prompts(lm, 8)
    stops = stop_token_ids(lm.tokenizer, lm.model)
    ask = dict(max_new_tokens=24, stop_ids=stops, n=3, greedy_first=True, temperature=1.0, top_p=0.95,
               seeds=list(range(100, 108)))
    together = generator(served_server, tmp_path / "a", concurrency=24)(lm.model, prompts, **ask)
    one_by_one = generator(served_server, tmp_path / "b", concurrency=1)(lm.model, prompts, **ask)
    reordered = generator(served_server, tmp_path / "c", concurrency=5)(lm.model, prompts[::-1], **{
        **ask, "seeds": ask["seeds"][::-1]})[::-1]
    assert together == one_by_one == reordered
    assert len({r.tokens for rs in together for r in rs[1:]}) > 1  # sampled texts differ between rollouts
    again = generator(served_server, tmp_path / "a")
    assert again(lm.model, prompts, **ask) == together and again.client.sent == 0  # a restart reads the cache


def test_a_tied_rollout_has_exactly_its_leaders_length(served_server, tmp_path):
    lm = get_model("smollm2-135m")
    prompts = judge_prompts(lm, 4)
    stops = stop_token_ids(lm.tokenizer, lm.model)
    out = generator(served_server, tmp_path)(lm.model, prompts, max_new_tokens=[40, 40, 8, 40], stop_ids=stops, n=2,
                                             greedy_first=True, temperature=1.0, seeds=[1, 2, 3, 4],
                                             length_of=[None, 0, 0, None])
    for j in range(2):
        assert len(out[1][j].tokens) == len(out[0][j].tokens) and not out[1][j].stopped
        assert len(out[2][j].tokens) == min(8, len(out[0][j].tokens))


def test_a_dead_engine_is_named_in_one_line_without_retries(tmp_path):
    dead = json.dumps({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root "
                                             "cause.", "type": "InternalServerError", "code": 500}}).encode()
    calls = []

    def answer(body, headers):
        calls.append(body)
        return dead, 500

    server = CannedServer(answer)
    try:
        spec = GeneratorSpec(url=f"http://127.0.0.1:{server.port}/v1", model="m", identity={}, cache=str(tmp_path))
        gen = VllmGenerator(spec)
        gen.client.settings = ClientSettings(retries=3, backoff=5.0)
        with pytest.raises(ServedError) as err:
            gen(None, [(1, 2, 3)], max_new_tokens=4, stop_ids=frozenset(), temperature=1.0, seeds=[7])
    finally:
        server.close()
    message = str(err.value)
    assert "\n" not in message and "engine has died" in message and "--no-enable-chunked-prefill" in message
    assert len(calls) == 1


def test_seeded_requests_past_one_prefill_chunk_are_answered(served_server, tmp_path):
    """Twelve seeded sampled requests of 400 prompt tokens at once (4,800 tokens, past vLLM's 2,048-token prefill
    chunk): the server the project starts (chunked prefill off on CPU) answers every one."""
    prompts = [tuple(100 + (k * 37 + t) % 40000 for t in range(400)) for k in range(12)]
    gen = generator(served_server, tmp_path, concurrency=12)
    out = gen(None, prompts, max_new_tokens=8, stop_ids=frozenset(), temperature=1.0, seeds=list(range(12)))
    assert all(len(rs[0].tokens) == 8 for rs in out) and gen.client.sent == 12


def test_an_adapter_is_served_as_the_model_the_run_reads(tmp_path):
    """With a --peft adapter (the shipped `gap` organism on SmolLM2) the server the generator starts answers with the
    adapter applied: its greedy texts are the merged model's (up to a near-tie), not the base model's."""
    from engine.loading import load_model
    from engine.vllm_generation import close_generator, start_generator
    from organisms import shipped_path

    lm = load_model("smollm2-135m", device="cpu", dtype="float32", adapter=str(shipped_path("gap")))
    base = get_model("smollm2-135m")
    prompts = judge_prompts(lm, 8)
    stops = stop_token_ids(lm.tokenizer, lm.model)
    own = generate(lm.model, prompts, max_new_tokens=24, stop_ids=stops, pad_id=lm.pad_id)
    plain = generate(base.model, prompts, max_new_tokens=24, stop_ids=stops, pad_id=base.pad_id)
    gen = start_generator(lm, log=str(tmp_path / "server.log"))
    gen.client.cache.root = tmp_path / "rollouts"
    try:
        drawn = gen(lm.model, prompts, max_new_tokens=24, stop_ids=stops)
    finally:
        close_generator(gen)
    assert [r[0].tokens for r in own] != [r[0].tokens for r in plain]  # the adapter changes the texts
    parted = 0
    for p, (a,), (b,) in zip(prompts, own, drawn):
        t = first_difference(a.tokens, b.tokens)
        if t is not None:
            with torch.no_grad():
                logits = lm.model(input_ids=torch.tensor([list(p) + list(a.tokens[:t])])).logits[0, -1].float()
            top = logits.topk(2).values
            assert float(top[0] - top[1]) < NEAR_TIE
            parted += 1
    assert parted <= 1 and gen.spec.identity["adapter"]["organism"] == "gap"
