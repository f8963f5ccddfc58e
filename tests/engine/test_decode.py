"""The decode loop against a plain greedy decoder (a full forward pass over the whole sequence for every
token, no cache) on every tiny family and the embedded model, through every path (cascade attention with
the CPU flash kernel or written out, static shapes, the dense fallback); sampled rollouts identical whatever
else shares the batch and with compaction on or off; the static path fit for torch.compile; prompts sharing
a prefix prefilled once; the published prompt caches equal to a plain forward pass's.
"""

import pytest
import torch

import engine.decode as decode
import engine.generation as generation
from engine.generation import Rollout, generate, stop_token_ids
from tests.helpers import PATHS, TINY, get_model, prompts_for, use_path


def plain_greedy(model, ids, max_new, stop) -> Rollout:
    """Reference decoder: one prompt, the whole sequence through the model for every token, argmax."""
    seq, out = list(ids), []
    with torch.inference_mode():
        for _ in range(max_new):
            token = int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
            if token in stop:
                return Rollout(tuple(out), True, True)
            out.append(token)
            seq.append(token)
    return Rollout(tuple(out), False, True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", TINY)
def test_greedy_equals_the_plain_decoder(name, path, monkeypatch):
    lm = get_model(name)
    ps = prompts_for(lm, 5)
    stop = stop_token_ids(lm.tokenizer, lm.model)
    ref = [plain_greedy(lm.model, p, 12, stop) for p in ps]
    kw = use_path(monkeypatch, path)
    out = generate(lm.model, ps, max_new_tokens=12, stop_ids=stop, n=2, pad_id=lm.pad_id, **kw)
    assert [rs[0] for rs in out] == ref
    assert all(rs[1] == rs[0] for rs in out)
    # A one-token prompt (no prompt keys at all) in the batch, and per-prompt budgets.
    short = [ps[1][:1], ps[0]]
    out = generate(lm.model, short, max_new_tokens=[9, 4], stop_ids=stop, pad_id=lm.pad_id, **kw)
    assert [rs[0] for rs in out] == [plain_greedy(lm.model, short[0], 9, stop), plain_greedy(lm.model, short[1], 4, stop)]


@pytest.mark.smollm
def test_greedy_equals_the_plain_decoder_smollm2():
    lm = get_model("smollm2-135m")
    ps = prompts_for(lm, 2)
    stop = stop_token_ids(lm.tokenizer, lm.model)
    ref = [plain_greedy(lm.model, p, 8, stop) for p in ps]
    kw = dict(max_new_tokens=8, stop_ids=stop, n=2, greedy_first=True, temperature=0.7, top_p=0.95, pad_id=lm.pad_id)
    out = generate(lm.model, ps, **kw)
    assert [rs[0] for rs in out] == ref
    assert generate(lm.model, ps, static_shapes=True, **kw) == out


def _stops_and_budgets(lm, ps):
    """Stop tokens the model does produce early in some rollouts (so rows end at different steps) and uneven budgets."""
    free = generate(lm.model, ps, max_new_tokens=6, stop_ids=frozenset(), n=3, temperature=1.0, seeds=list(range(len(ps))))
    stop = frozenset({free[0][1].tokens[2], free[3][2].tokens[4], free[5][0].tokens[3]})
    return stop, [6 + (3 * i) % 9 for i in range(len(ps))]


@pytest.mark.parametrize("name", ["tiny-llama3", "tiny-olmo3"])
def test_sampled_rollouts_do_not_depend_on_the_batch(name, monkeypatch):
    lm = get_model(name)
    ps = prompts_for(lm)
    stop, budgets = _stops_and_budgets(lm, ps)
    seeds = [101 + i for i in range(len(ps))]
    kw = dict(stop_ids=stop, n=3, greedy_first=True, temperature=0.9, top_p=0.9, pad_id=lm.pad_id)
    kept = []
    keep = decode.Cascade.keep
    monkeypatch.setattr(decode.Cascade, "keep", lambda self, rows: (kept.append(len(rows)), keep(self, rows))[1])
    full = generate(lm.model, ps, max_new_tokens=budgets, seeds=seeds, **kw)
    assert kept, "no row was compacted out: the check would not cover compaction"
    ends = {len(r.tokens) for rs in full for r in rs}
    assert len(ends) > 3 and any(r.stopped for rs in full for r in rs)
    one = [generate(lm.model, [p], max_new_tokens=b, seeds=[s], **kw)[0] for p, b, s in zip(ps, budgets, seeds)]
    assert one == full
    threes = [rs for k in range(0, len(ps), 3)
              for rs in generate(lm.model, ps[k : k + 3], max_new_tokens=budgets[k : k + 3], seeds=seeds[k : k + 3], **kw)]
    assert threes == full
    kept.clear()
    assert generate(lm.model, ps, max_new_tokens=budgets, seeds=seeds, compact=False, **kw) == full
    assert not kept
    assert generate(lm.model, ps, max_new_tokens=budgets, seeds=seeds, static_shapes=True, **kw) == full
    assert generate(lm.model, ps[::-1], max_new_tokens=budgets[::-1], seeds=seeds[::-1], **kw) == full[::-1]
    # The rollout index and the prompt's seed key the draws: a different seed changes the sampled rollouts.
    other = generate(lm.model, ps, max_new_tokens=budgets, seeds=[s + 1000 for s in seeds], **kw)
    assert [rs[1:] for rs in other] != [rs[1:] for rs in full]
    assert [rs[0] for rs in other] == [rs[0] for rs in full]


def test_the_batches_generate_forms_are_plan_batches_under_a_key_value_limit(monkeypatch):
    """A key/value limit (a GPU's; none on CPU) cuts a call into the batches `plan_batches` plans, each within
    the limit (`--plan` counts them with the same function), and the rollouts stay those of one batch."""
    lm = get_model("tiny-llama3")
    ps = prompts_for(lm)
    stop, budgets = _stops_and_budgets(lm, ps)
    kw = dict(max_new_tokens=budgets, stop_ids=stop, n=3, greedy_first=True, temperature=0.9, top_p=0.9,
              pad_id=lm.pad_id, seeds=list(range(len(ps))))
    whole = generate(lm.model, ps, **kw)
    limit = 3 * max(len(p) + 3 * b for p, b in zip(ps, budgets))
    monkeypatch.setattr(generation, "generation_cache_limit", lambda model, device: limit)
    formed = []
    assert generate(lm.model, ps, batches=formed, **kw) == whole
    bounds = generation.batch_bounds(lm.model, lm.model.device)
    assert bounds.kv_limit == limit
    planned = generation.plan_batches([len(p) for p in ps], budgets, 3, bounds)
    assert formed == [generation.batch_shape(ps, budgets, 3, [i for u in b for i in u]) for b in planned]
    assert len(formed) > 1
    for batch in planned:
        members = [i for u in batch for i in u]
        held = sum(len(ps[i]) for i in members) + 3 * len(members) * max(budgets[i] for i in members)
        assert held <= limit or len(batch) == 1


def test_dense_fallback_samples_the_same_rollouts(monkeypatch):
    lm = get_model("tiny-qwen2")
    ps = prompts_for(lm)
    stop, budgets = _stops_and_budgets(lm, ps)
    kw = dict(max_new_tokens=budgets, stop_ids=stop, n=3, greedy_first=True, temperature=0.9, top_p=0.9,
              seeds=list(range(len(ps))), pad_id=lm.pad_id)
    cascade = generate(lm.model, ps, **kw)
    monkeypatch.setattr(generation, "supports_cascade", lambda model: False)
    assert generate(lm.model, ps, **kw) == cascade


def test_identical_prompts_share_their_keys_and_keep_their_own_draws():
    lm = get_model("tiny-tulu3")
    p = prompts_for(lm, 1)[0]
    kw = dict(max_new_tokens=8, stop_ids=frozenset(), n=2, temperature=0.9, pad_id=lm.pad_id)
    twice = generate(lm.model, [p, p], seeds=[1, 2], **kw)
    assert twice == [generate(lm.model, [p], seeds=[s], **kw)[0] for s in (1, 2)]


def test_prompts_sharing_a_prefix_prefill_it_once():
    lm = get_model("tiny-llama3")
    head = list(range(40, 100))
    ps = [head + [7, 8, 9 + i, 20, 21] for i in range(4)] + [[3, 4, 5, 6]]
    state = decode.Cascade(lm.model, ps, [0, 1, 2, 3, 4], 4, pad_id=0, token_budget=512, max_rows=16)
    assert state.prefill_stats.prompt_tokens == sum(len(p) - 1 for p in ps)
    # The 62 shared tokens once, then each head's own two, and the unrelated prompt's three.
    assert state.prefill_stats.computed_tokens == 62 + 4 * 2 + 3
    out = generate(lm.model, ps, max_new_tokens=6, stop_ids=frozenset())
    assert [rs[0] for rs in out] == [plain_greedy(lm.model, p, 6, frozenset()) for p in ps]


@pytest.mark.parametrize("path", ["flash", "dense"])
def test_published_prompt_caches_equal_a_plain_forward(path, monkeypatch):
    from transformers import DynamicCache

    lm = get_model("tiny-olmo3")
    ps = prompts_for(lm, 4) + [prompts_for(lm, 1)[0][:1]]
    use_path(monkeypatch, path)
    kv = {}
    generate(lm.model, ps, max_new_tokens=3, stop_ids=frozenset(), n=2, temperature=0.8, prefix_kv=kv)
    assert set(kv) == {tuple(p) for p in ps}
    for p in ps:
        cache = DynamicCache(config=lm.model.config)
        with torch.inference_mode():
            lm.model(input_ids=torch.tensor([p]), past_key_values=cache, use_cache=True)
        for (k, v), layer in zip(kv[tuple(p)], cache.layers):
            assert k.shape == layer.keys.shape == (1, layer.keys.shape[1], len(p), layer.keys.shape[3])
            assert torch.allclose(k, layer.keys, atol=1e-5) and torch.allclose(v, layer.values, atol=1e-5)


def test_static_steps_keep_shapes_and_buffers():
    lm = get_model("tiny-olmo3")
    ps = prompts_for(lm, 3)
    seen = []

    def record(module, args, kwargs):
        state = kwargs.get("readout_decode")
        if state is not None:  # a decoding step, not the prefill
            seen.append((tuple(kwargs["input_ids"].shape), tuple(state.ks[0].shape), state.ks[0].data_ptr(),
                         state.step_t.data_ptr(), state.own_bias.data_ptr(), state.kp[0].data_ptr()))

    handle = lm.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        generate(lm.model, ps, max_new_tokens=[7, 3, 5], stop_ids=frozenset(), n=3, temperature=0.9, static_shapes=True)
    finally:
        handle.remove()
    # Static shapes come in power-of-two row buckets (engine/steps.py): 9 rows decode as 16, and compaction moves
    # the batch down a bucket as rows finish (budgets 7, 3, 5); within a bucket every step keeps its shape and buffers.
    buckets = [s[0][0] for s in seen]
    assert len(seen) == 7 and seen[0][:2] == ((16, 1), (16, 2, 7, 16))
    assert all(b & (b - 1) == 0 for b in buckets) and buckets == sorted(buckets, reverse=True)
    assert len(set(seen)) == len(set(buckets))


def test_static_step_compiles_to_one_graph():
    """The static step has no data-dependent shapes or host syncs: dynamo captures it whole (fullgraph), once
    for every step, which is what CUDA graphs and torch.compile need."""
    from torch._dynamo.testing import CompileCounter

    lm = get_model("tiny-llama3")
    ps = prompts_for(lm, 2)
    counter = CompileCounter()
    with torch.inference_mode():
        eager = decode.Cascade(lm.model, ps, [0, 0, 1, 1], 4, pad_id=0, token_budget=512, max_rows=8, static=True)
        traced = decode.Cascade(lm.model, ps, [0, 0, 1, 1], 4, pad_id=0, token_budget=512, max_rows=8, static=True)
        traced._forward = torch.compile(traced._forward, fullgraph=True, backend=counter)
        token = None
        for _ in range(4):
            a, b = eager.step(token), traced.step(token)
            assert torch.allclose(a, b, atol=1e-5)
            token = a.argmax(-1)
    assert counter.frame_count == 1


@pytest.mark.parametrize("path", ["flash", "static", "dense"])
def test_sliding_window_layers_equal_the_plain_decoder(path, monkeypatch):
    """OLMo-3's sliding-window layers with a window shorter than the prompts: keys that fall out of the
    window are dropped, in the prompt part and the own part alike."""
    lm = get_model("tiny-olmo3")
    monkeypatch.setattr(lm.model.config, "sliding_window", 9)
    for layer in lm.model.model.layers:
        if layer.self_attn.sliding_window is not None:
            monkeypatch.setattr(layer.self_attn, "sliding_window", 9)
    ps = [p[-14:] for p in prompts_for(lm, 3)] + [prompts_for(lm, 1)[0][-5:]]
    ref = [plain_greedy(lm.model, p, 12, frozenset()) for p in ps]
    kw = use_path(monkeypatch, path)
    out = generate(lm.model, ps, max_new_tokens=12, stop_ids=frozenset(), n=2, **kw)
    assert [rs[0] for rs in out] == ref and all(rs[1] == rs[0] for rs in out)
