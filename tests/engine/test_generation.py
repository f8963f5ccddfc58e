"""Generation: batched equals one-at-a-time for greedy decoding; seeded sampling is reproducible and
independent of batch composition; stop tokens end a turn; every anchor rule is exercised.
"""

import pytest

from engine.anchor import anchor_read
from engine.generation import Rollout, _generate_v1, derive_seed, generate, stop_token_ids
from engine.render import Prompt, encode_prompt
from tests.helpers import CHAT_TINY, get_model

QUESTIONS = [
    "Which is right, A or B? Explain, then end with Answer: <letter>.",
    "Say hello.",
    "Count to five, then explain why the sky is blue in some detail, please.",
    "Pick one: A) stay B) go C) wait",
]


def prompts_for(lm):
    return [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in QUESTIONS]


@pytest.mark.parametrize("name", CHAT_TINY)
def test_batched_greedy_equals_one_at_a_time(name):
    lm = get_model(name)
    ps = prompts_for(lm)
    stop = stop_token_ids(lm.tokenizer, lm.model)
    batched = generate(lm.model, ps, max_new_tokens=12, stop_ids=stop, temperature=0.0)
    single = [generate(lm.model, [p], max_new_tokens=12, stop_ids=stop, temperature=0.0)[0] for p in ps]
    assert batched == single
    assert all(len(r[0].tokens) == 12 or r[0].stopped for r in batched)


def test_the_old_loop_kept_for_the_benchmark_runs_and_agrees():
    """bench/gen_bench.py times `_generate_v1` (the loop before the cascade decoder) against `generate`: it must
    still run, in batches over several prompts, with greedy tokens equal to `generate`'s."""
    lm = get_model("tiny-qwen2")
    ps = prompts_for(lm)
    stop = stop_token_ids(lm.tokenizer, lm.model)
    kw = dict(max_new_tokens=10, stop_ids=stop, n=2, temperature=0.0, pad_id=lm.pad_id, max_rows=4)
    assert _generate_v1(lm.model, ps, **kw) == generate(lm.model, ps, **kw)


@pytest.mark.smollm
def test_batched_greedy_equals_one_at_a_time_smollm2():
    lm = get_model("smollm2-135m")
    ps = prompts_for(lm)[:3]
    stop = stop_token_ids(lm.tokenizer, lm.model)
    batched = generate(lm.model, ps, max_new_tokens=10, stop_ids=stop)
    single = [generate(lm.model, [p], max_new_tokens=10, stop_ids=stop)[0] for p in ps]
    assert batched == single


def test_seeded_sampling_is_reproducible_and_batch_independent():
    lm = get_model("tiny-llama3")
    ps = prompts_for(lm)
    stop = stop_token_ids(lm.tokenizer, lm.model)
    kw = dict(max_new_tokens=10, stop_ids=stop, n=3, greedy_first=True, temperature=0.9, top_p=0.95)
    a = generate(lm.model, ps, seeds=[1, 2, 3, 4], **kw)
    b = generate(lm.model, ps, seeds=[1, 2, 3, 4], **kw)
    assert a == b
    alone = generate(lm.model, [ps[2]], seeds=[3], **kw)[0]
    assert alone == a[2]
    other = generate(lm.model, ps, seeds=[5, 6, 7, 8], **kw)
    assert [r[1:] for r in other] != [r[1:] for r in a]
    assert all(r[0].greedy and not r[1].greedy for r in a)
    greedy = generate(lm.model, ps, max_new_tokens=10, stop_ids=stop)
    assert [r[0] for r in a] == [r[0] for r in greedy]  # the greedy rollout shares the prefill, same tokens


def test_stop_token_ends_the_turn():
    lm = get_model("tiny-qwen2")
    ps = prompts_for(lm)[:1]
    free = generate(lm.model, ps, max_new_tokens=8, stop_ids=frozenset())[0][0]
    stop_at = free.tokens[3]
    first = free.tokens.index(stop_at)
    stopped = generate(lm.model, ps, max_new_tokens=8, stop_ids=frozenset({stop_at}))[0][0]
    assert stopped.stopped and stopped.tokens == free.tokens[:first]


def test_stop_ids_include_template_turn_ends():
    tok = get_model("tiny-qwen2").tokenizer
    ids = stop_token_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids


@pytest.mark.smollm
def test_anchor_rules():
    tok = get_model("smollm2-135m").tokenizer
    prompt = [1, 2, 3]
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    own = anchor_read(tok, prompt, Rollout(enc("Option B protects the client.\nAnswer: B"), True, True))
    assert own.rule == "own" and own.text.endswith("Answer:")
    assert tok.decode(own.ids[3:]) == "Option B protects the client.\nAnswer:"
    assert own.ids[:3] == (1, 2, 3) and own.ids[3:] == enc("Option B protects the client.\nAnswer:")
    done = anchor_read(tok, prompt, Rollout(enc("I would report it."), True, False))
    assert done.rule == "forced_after_completion" and tok.decode(done.ids[3:]) == "I would report it.\nAnswer:"
    cut = anchor_read(tok, prompt, Rollout(enc("Weighing the stakes, the first option"), False, False))
    assert cut.rule == "forced_at_budget"
    trunc = anchor_read(tok, prompt, Rollout(enc("The people are Dana and the client."), True, False), cut=3)
    assert trunc.rule == "forced_at_budget" and trunc.kept_tokens == 3


def test_derive_seed_is_stable():
    assert derive_seed(0, "x", 1) == derive_seed(0, "x", 1) != derive_seed(0, "x", 2)
    assert derive_seed(1) == 7060576587572479595  # fixed forever: runs on other machines must draw the same rollouts


def test_per_prompt_budgets():
    lm = get_model("tiny-olmo3")
    ps = prompts_for(lm)
    out = generate(lm.model, ps, max_new_tokens=[3, 7, 5, 1], stop_ids=frozenset(), n=2, greedy_first=True, temperature=0.9)
    assert [[len(r.tokens) for r in rs] for rs in out] == [[3, 3], [7, 7], [5, 5], [1, 1]]
    assert all(not r.stopped for rs in out for r in rs)
    alone = generate(lm.model, [ps[1]], max_new_tokens=7, stop_ids=frozenset(), n=2, greedy_first=True, temperature=0.9)
    assert alone[0] == out[1]
