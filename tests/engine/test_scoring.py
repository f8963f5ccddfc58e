"""The fast path (batching, padding, prefix reuse, head on read positions) equals the plain one-prompt
forward pass on every tiny family and on the embedded SmolLM2 model.
"""

import itertools
import random

import pytest
import torch

from engine.batching import kv_bytes_per_token
from engine.planner import PrefixGroup, plan_prefix_groups
from engine.render import Prompt, encode_prompt
from engine.sampling import tempered_distribution
from engine.scoring import ScoreStats, plain_next_token_logits, score_ids
from tests.helpers import TINY, get_model, max_diff, probe_set


def tree_depth(plan):
    depth = {}
    for k, g in enumerate(plan):
        depth[k] = 0 if g.parent is None else depth[g.parent] + 1
    return max(depth.values())


def tree_cost(plan, seqs):
    """Tokens the plan computes: each node its own tokens after its parent's, each member its suffix."""
    cost = 0
    for g in plan:
        start = plan[g.parent].prefix_len if g.parent is not None else 0
        cost += g.prefix_len - start + sum(len(seqs[i]) - g.prefix_len for i in g.members)
    return cost


@pytest.mark.parametrize("name", TINY)
def test_fast_equals_plain_on_tiny_families(name):
    lm, seqs, letters = probe_set(name)
    ref = score_ids(lm.model, seqs, letters, fast=False, temperature=0.7, top_p=0.9)
    suffix_lengths = set()
    for max_batch in (1, 7, 32):
        for reuse in (True, False):
            stats = ScoreStats()
            out = score_ids(lm.model, seqs, letters, max_batch=max_batch, prefix_reuse=reuse, temperature=0.7, top_p=0.9, stats=stats)
            assert max_diff(ref, out) < 1e-5, (max_batch, reuse)
            if reuse:
                assert stats.computed_tokens < 0.75 * stats.prompt_tokens
                assert stats.prefix_groups >= 3
            else:
                assert stats.computed_tokens == stats.prompt_tokens
            assert stats.duplicates == (1 if reuse else 0)
    plan = plan_prefix_groups(seqs)
    for g in plan:
        if g.prefix_len:
            suffix_lengths |= {len(seqs[i]) - g.prefix_len for i in g.members}
    assert len(suffix_lengths) > 3  # prefix reuse was exercised with suffixes of different lengths
    assert tree_depth(plan) >= 1  # and with nodes extending other nodes' caches


def test_fast_equals_plain_with_small_token_budget():
    lm, seqs, letters = probe_set("tiny-llama3", n_scenarios=2, orders=5, seed=3)
    ref = score_ids(lm.model, seqs, letters, fast=False)
    out = score_ids(lm.model, seqs, letters, token_budget=64, max_batch=32)
    assert max_diff(ref, out) < 1e-5


def test_sliding_window_guard_keeps_results_exact():
    """A window shorter than the prompts disables prefix reuse rather than shifting the sliding mask."""
    lm, seqs, letters = probe_set("tiny-olmo3", n_scenarios=2, orders=4, seed=5)
    cfg = lm.model.config
    old = cfg.sliding_window
    cfg.sliding_window = max(len(s) for s in seqs) + 8
    try:
        ref = score_ids(lm.model, seqs, letters, fast=False)
        stats = ScoreStats()
        out = score_ids(lm.model, seqs, letters, stats=stats)
    finally:
        cfg.sliding_window = old
    assert max_diff(ref, out) < 1e-5
    assert stats.prefix_groups == 0


@pytest.mark.smollm
def test_fast_equals_plain_on_smollm2():
    lm, seqs, letters = probe_set("smollm2-135m", n_scenarios=2, orders=5, seed=1)
    ref = score_ids(lm.model, seqs, letters, fast=False, temperature=0.7)
    for max_batch in (1, 7, 32):
        for reuse in (True, False):
            out = score_ids(lm.model, seqs, letters, max_batch=max_batch, prefix_reuse=reuse, temperature=0.7)
            assert max_diff(ref, out) < 1e-5, (max_batch, reuse)


def test_masses_are_consistent():
    lm, seqs, letters = probe_set("tiny-qwen2", n_scenarios=1, orders=3)
    for s, lt, row in zip(seqs, letters, score_ids(lm.model, seqs, letters)):
        probs = plain_next_token_logits(lm.model, s).softmax(-1)
        for ids, m in zip(lt.token_ids, row.mass):
            assert m == pytest.approx(float(probs[list(ids)].sum()), abs=1e-6)
        assert row.letter_mass == pytest.approx(sum(row.mass))
        assert sum(row.option_mass) == pytest.approx(1.0)
        assert row.tempered == pytest.approx(row.mass, abs=1e-6)  # T = 1, top-p = 1
        assert row.n_tokens == len(s)


def test_plan_prefix_groups_partitions_and_separates_scenarios():
    lm, seqs, letters = probe_set("tiny-qwen2", n_scenarios=4, orders=8)
    plan = plan_prefix_groups(seqs)
    members = sorted(i for g in plan for i in g.members)
    assert members == list(range(len(seqs)))
    rep = {}
    for k in range(len(plan) - 1, -1, -1):
        g = plan[k]
        rep.setdefault(k, g.members[0] if g.members else None)
        if g.parent is not None:
            assert g.parent < k and plan[g.parent].prefix_len < g.prefix_len
            rep[g.parent] = rep.get(g.parent) or rep[k]
        assert all(g.prefix_len <= len(seqs[i]) - 1 for i in g.members)
        assert all(seqs[i][: g.prefix_len] == seqs[rep[k]][: g.prefix_len] for i in g.members)
    for k, g in enumerate(plan):  # a node's prefix starts with its parent's
        if g.parent is not None:
            assert seqs[rep[k]][: plan[g.parent].prefix_len] == seqs[rep[g.parent]][: plan[g.parent].prefix_len]
    shared = [g for g in plan if g.prefix_len and g.members]
    assert len(shared) >= 4  # prompts are read on scenario-level nodes, not only on the template header
    flat = plan_prefix_groups(seqs, nest=False)  # one level of groups
    assert tree_depth(flat) == 0
    assert tree_cost(plan, seqs) < tree_cost(flat, seqs) < sum(len(s) for s in seqs)


def test_plan_nests_orders_that_share_their_first_option_line():
    """The 24 orders of 4 options: one node for the scenario, one per first option line below it."""
    context = list(range(100, 160))
    lines = {c: [200 + k] * 6 for k, c in enumerate("ABCD")}
    seqs = [context + [t for c in perm for t in lines[c]] + [9] for perm in itertools.permutations("ABCD")]
    plan = plan_prefix_groups(seqs)
    assert plan[0] == PrefixGroup(60, (), None)
    children = [g for g in plan if g.parent == 0]
    assert len(children) == 4 and all(g.prefix_len == 66 for g in children)
    assert tree_cost(plan, seqs) < tree_cost(plan_prefix_groups(seqs, nest=False), seqs)
    cached = plan_prefix_groups([s for s in seqs if s[60] == 200], cached=60)
    assert cached[0].prefix_len == 60 and cached[0].parent is None
    assert all(g.parent is not None for g in cached[1:])


def test_duplicates_run_once_and_keep_their_own_letters():
    lm, seqs, letters = probe_set("tiny-llama3", n_scenarios=1, orders=3, seed=4)
    seqs = seqs + [list(seqs[0]), list(seqs[0])]
    letters = letters + [lm.letters("AB"), letters[0]]
    ref = score_ids(lm.model, seqs, letters, fast=False)
    stats = ScoreStats()
    out = score_ids(lm.model, seqs, letters, stats=stats)
    assert max_diff(ref, out) < 1e-5
    assert stats.duplicates == 3  # the probe set's own duplicate and the two added here
    assert out[-2].letters == ("A", "B") and out[-1].mass == out[0].mass


def test_plan_handles_edge_cases():
    assert plan_prefix_groups([]) == []
    assert plan_prefix_groups([[1, 2, 3]]) == [PrefixGroup(0, (0,))]
    same = [[7] * 40, [7] * 40]
    assert plan_prefix_groups(same) == [PrefixGroup(39, (0, 1))]
    short = [[1, 2], [1, 3]]  # common prefix below min_prefix: not worth a cache
    assert all(g.prefix_len == 0 for g in plan_prefix_groups(short))
    nested = [[5] * 30, [5] * 30 + [6] * 10, [5] * 30 + [6] * 10 + [7]]  # each prompt a prefix of the next
    plan = plan_prefix_groups(nested)
    assert sorted(i for g in plan for i in g.members) == [0, 1, 2]
    assert all(g.prefix_len <= len(nested[i]) - 1 for g in plan for i in g.members)


def test_tempered_distribution_rules():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    greedy = tempered_distribution(logits, 0.0)
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    full = tempered_distribution(logits, 0.5)
    assert torch.allclose(full, (logits / 0.5).softmax(-1))
    nucleus = tempered_distribution(logits, 1.0, top_p=0.5)
    assert nucleus[0, 0] == 1.0  # the top token alone already covers half the mass
    with pytest.raises(ValueError):
        tempered_distribution(logits, 1.0, top_p=0.0)


def test_out_of_memory_halves_the_batch_and_retries(monkeypatch):
    """An injected CUDA out-of-memory error on batches above 2 rows: results unchanged, batches halved."""
    lm, seqs, letters = probe_set("tiny-qwen2", n_scenarios=2, orders=4, seed=2)
    ref = score_ids(lm.model, seqs, letters)
    forward = type(lm.model).forward

    def flaky(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(lm.model), "forward", flaky)
    base_forward = type(lm.model.base_model).forward

    def flaky_base(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return base_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(lm.model.base_model), "forward", flaky_base)
    stats = ScoreStats()
    out = score_ids(lm.model, seqs, letters, max_batch=32, stats=stats)
    assert stats.oom_splits > 0
    assert max_diff(ref, out) < 1e-5
    other = RuntimeError("something else broke")

    def broken(self, *args, **kwargs):
        raise other

    monkeypatch.setattr(type(lm.model.base_model), "forward", broken)
    with pytest.raises(RuntimeError, match="something else"):
        score_ids(lm.model, seqs, letters)


def test_generation_survives_out_of_memory(monkeypatch):
    from engine.generation import generate, stop_token_ids

    lm = get_model("tiny-olmo3")
    prompts = [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": f"Question {i}: " + "why " * i},))) for i in range(5)]
    stop = stop_token_ids(lm.tokenizer, lm.model)
    ref = generate(lm.model, prompts, max_new_tokens=5, stop_ids=stop)
    forward = type(lm.model).forward

    def flaky(self, *args, **kwargs):
        if kwargs["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(lm.model), "forward", flaky)
    assert generate(lm.model, prompts, max_new_tokens=5, stop_ids=stop) == ref


def test_known_prefixes_from_generation_equal_plain():
    """Reads after generated text reuse the generation's prompt cache (left-padded batch) exactly."""
    from engine.anchor import anchor_read
    from engine.generation import generate, stop_token_ids

    lm = get_model("tiny-llama3")
    prompts = [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": f"Case {i}: which option, A or B? " + "Think. " * (3 * i)},)))
               for i in range(4)]
    kv = {}
    rollouts = generate(lm.model, prompts, max_new_tokens=6, stop_ids=stop_token_ids(lm.tokenizer, lm.model), n=3,
                        greedy_first=True, temperature=0.8, prefix_kv=kv)
    assert set(kv) == {tuple(p) for p in prompts}
    reads = [anchor_read(lm.tokenizer, p, r).ids for p, rs in zip(prompts, rollouts) for r in rs]
    letters = [lm.letters("AB")] * len(reads)
    ref = score_ids(lm.model, reads, letters, fast=False)
    stats = ScoreStats()
    out = score_ids(lm.model, reads, letters, known_prefixes=kv, stats=stats)
    assert max_diff(ref, out) < 1e-5
    assert stats.computed_tokens <= sum(len(r) for r in reads) - sum(3 * len(p) for p in prompts)


@pytest.mark.parametrize("name", ["tiny-olmo3", "tiny-llama3"])
def test_kv_bytes_per_token_matches_a_real_cache(name):
    """The memory cap on cached tokens (CUDA) rests on this size: check it against a cache the model fills."""
    from transformers import DynamicCache

    lm = get_model(name)
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([list(range(5, 25))]), past_key_values=cache, use_cache=True)
    size = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert kv_bytes_per_token(lm.model) * 20 == size


def test_random_prefix_trees_equal_plain():
    """Random prompt sets with deep shared prefixes, prompts that are prefixes of others and duplicates; small
    budgets force several waves and mixed-node batches. The fast path still equals the plain one."""
    lm = get_model("tiny-qwen2")
    vocab = 200
    for seed in range(3):
        rng = random.Random(seed)
        seqs = [[rng.randrange(3, vocab) for _ in range(rng.randrange(20, 40))]]
        while len(seqs) < 24:
            base = rng.choice(seqs)
            cut = rng.randrange(1, len(base) + 1)
            seqs.append(base[:cut] + [rng.randrange(3, vocab) for _ in range(rng.randrange(0, 12))])
        seqs = [s for s in seqs if s]
        letters = [lm.letters("AB")] * len(seqs)
        ref = score_ids(lm.model, seqs, letters, fast=False)
        for budget, rows in ((48, 3), (4096, 64)):
            stats = ScoreStats()
            out = score_ids(lm.model, seqs, letters, token_budget=budget, max_batch=rows, min_prefix=4, stats=stats)
            assert max_diff(ref, out) < 1e-5, (seed, budget)
        plan = plan_prefix_groups(list({tuple(s): s for s in seqs}.values()), min_prefix=4)
        assert tree_depth(plan) >= 2


def test_small_token_budget_bounds_the_cache_held():
    """One template header is the root of every prompt's tree; waves still bound the keys/values held at once
    (a wave's nodes plus the ancestors of the next ones), and results stay equal to the plain path."""
    lm, seqs, letters = probe_set("tiny-llama3", n_scenarios=4, orders=6, seed=7)
    ref = score_ids(lm.model, seqs, letters, fast=False)
    whole = ScoreStats()
    score_ids(lm.model, seqs, letters, stats=whole)
    small = ScoreStats()
    out = score_ids(lm.model, seqs, letters, token_budget=40, stats=small)
    assert max_diff(ref, out) < 1e-5
    assert small.peak_cached_tokens <= 4 * 40 + 2 * max(len(s) for s in seqs)
    assert small.peak_cached_tokens < whole.peak_cached_tokens / 2
    assert small.computed_tokens == whole.computed_tokens  # the same tree, computed in more waves
