"""The steered tail (engine/steered_tail.py) equals a plain one-prompt forward with the vector added at the last
position by a hook written in tests/engine/test_steering.py, in fp32 within 1e-5, on every tiny family and SmolLM2:
many steerings of each prompt (every depth, several strengths, a vector of their own each) read together, in forwards
of several rows and of one, beside unsteered prompts, starting from a known prefix, and where the tail does not apply
(the prefix-tree path then reads them, with the same numbers)."""

import pytest
import torch

from engine import steered_tail
from engine.residuals import n_depths
from engine.scoring import ScoreStats, letter_masses
from engine.steering import Steering, score_steered
from tests.engine.test_steering import TOL, hooked_last_logits, known_prefix
from tests.helpers import SMOLLM2, TINY, max_diff, probe_set


def grid_of(model, prompts: int, depths, strengths=(-2.0, 1.5), seed=0):
    """Per prompt, a read-position steering at each depth and strength, each with a vector of its own."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    return [[Steering(d, torch.randn(hidden, generator=gen) * 3, s, "read") for d in depths for s in strengths]
            for _ in range(prompts)]


def references(model, seqs, letters, steer):
    return [letter_masses(hooked_last_logits(model, s, st)[None], [lt], [len(s)], 0.7, 1.0)[0]
            for s, lt, st in zip(seqs, letters, steer)]


def depths_of(model):
    last = n_depths(model) - 1
    return sorted({0, 1, last // 2, last - 1, last})


@pytest.mark.parametrize("name", [*TINY, SMOLLM2])
def test_many_steerings_of_a_prompt_equal_a_hooked_forward(name):
    lm, seqs, letters = probe_set(name, n_scenarios=1, orders=2)
    model = lm.model
    assert steered_tail.applies(model, seqs)
    prompts, marks = seqs[:2], letters[:2]
    grid = grid_of(model, len(prompts), depths_of(model))
    flat = [(s, lt, st) for s, lt, row in zip(prompts, marks, grid) for st in row]
    flat += [(s, lt, None) for s, lt in zip(prompts, marks)]
    seqs_, letters_, steer = map(list, zip(*flat))
    want = references(model, seqs_, letters_, steer)
    for max_batch in (None, 3, 1):  # every steering of a depth in one forward; in forwards of three rows; one by one
        got = score_steered(model, seqs_, letters_, steer, temperature=0.7, max_batch=max_batch)
        assert max_diff(got, want) < TOL, max_batch
    # The steerings move the reads by far more than the tolerance (each row's own vector reached its own row).
    unsteered = {tuple(s): r for s, r, st in zip(seqs_, want, steer) if st is None}
    moved = [max(abs(a - b) for a, b in zip(r.option_mass, unsteered[tuple(s)].option_mass)) for s, r, st in zip(seqs_, want, steer) if st]
    assert sorted(moved)[len(moved) // 2] > 100 * TOL


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmo3"])
def test_the_tail_runs_each_prompt_once_and_one_token_per_steering(name):
    """Work counted: each distinct prompt's tokens once, less the start it shares with the prompt before it in sorted
    order (its prefix, then its last token unsteered), and one token per steered read; against the prefix-tree path
    (`tail=False`) on the same reads, within the tolerance."""
    lm, seqs, letters = probe_set(name, n_scenarios=1, orders=3)
    prompts, marks = seqs[:3], letters[:3]
    grid = grid_of(lm.model, len(prompts), (1, 2), seed=3)
    flat = [(s, lt, st) for s, lt, row in zip(prompts, marks, grid) for st in row]
    seqs_, letters_, steer = map(list, zip(*flat))
    stats = ScoreStats()
    got = score_steered(lm.model, seqs_, letters_, steer, stats=stats)
    ordered = sorted(tuple(p) for p in prompts)
    shared = [0] + [next(i for i, (x, y) in enumerate(zip(a[:-1], b[:-1])) if x != y) for a, b in zip(ordered[1:], ordered)]
    assert min(shared[1:]) > 8  # the chat template's header and the scenario's context
    assert stats.computed_tokens == sum(len(p) - k for p, k in zip(ordered, shared)) + len(steer)
    assert max_diff(got, score_steered(lm.model, seqs_, letters_, steer, tail=False)) < TOL


def test_a_known_prefix_starts_the_prompts_prefix():
    lm, seqs, letters = probe_set("tiny-llama3", n_scenarios=1, orders=3)
    n = next(k for k in range(min(map(len, seqs[:3]))) if len({s[k] for s in seqs[:3]}) > 1)
    known = known_prefix(lm.model, seqs[0][:n])
    grid = grid_of(lm.model, 3, (0, 2), seed=4)
    flat = [(s, lt, st) for s, lt, row in zip(seqs[:3], letters[:3], grid) for st in row]
    seqs_, letters_, steer = map(list, zip(*flat))
    with_known, without = ScoreStats(), ScoreStats()
    got = score_steered(lm.model, seqs_, letters_, steer, known_prefixes=known, stats=with_known, temperature=0.7)
    score_steered(lm.model, seqs_, letters_, steer, stats=without)
    assert max_diff(got, references(lm.model, seqs_, letters_, steer)) < TOL
    assert without.computed_tokens - with_known.computed_tokens == n  # the first prompt; the others share its start


def test_where_the_tail_does_not_apply_the_prefix_tree_reads(monkeypatch):
    """A sliding window shorter than a prompt (the tail's mask would let the read see beyond it) and an attention
    implementation that takes no explicit mask: `applies` is False and the reads are the hooked forward's."""
    lm, seqs, letters = probe_set("tiny-olmo3", n_scenarios=1, orders=2)
    model = lm.model
    prompts, marks = seqs[:2], letters[:2]
    monkeypatch.setattr(model.config, "sliding_window", min(map(len, prompts)) - 4)
    assert not steered_tail.applies(model, prompts)
    grid = grid_of(model, 2, (1,), seed=5)
    flat = [(s, lt, st) for s, lt, row in zip(prompts, marks, grid) for st in row]
    seqs_, letters_, steer = map(list, zip(*flat))
    got = score_steered(model, seqs_, letters_, steer, temperature=0.7)
    assert max_diff(got, references(model, seqs_, letters_, steer)) < TOL
    monkeypatch.undo()
    assert steered_tail.applies(model, prompts)
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    assert not steered_tail.applies(model, prompts)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama3", "tiny-olmo3"])
def test_text_loss_with_each_position_steered_alone(name):
    """Each position of a text predicting its next token with the vector at that position alone: the tail's loss
    (rows of 7 and of all positions) equals the mean -log p of hooked plain forwards of each prefix, and the text read
    twice over in one masked forward (readouts/steer/capability.py)."""
    from readouts.steer.capability import read_position_loss

    lm, seqs, _ = probe_set(name, n_scenarios=1, orders=1)
    model, ids = lm.model, seqs[0][:40]
    steer = [st for row in grid_of(model, 1, depths_of(model), seed=6) for st in row]
    want = []
    for st in steer:
        nll = [-torch.log_softmax(hooked_last_logits(model, ids[: t + 1], st), -1)[ids[t + 1]] for t in range(len(ids) - 1)]
        want.append(float(torch.stack(nll).mean()))
    for max_batch in (None, 7):
        got = steered_tail.read_position_text_losses(model, ids, steer, max_batch=max_batch)
        assert all(n == len(ids) - 1 for _, n in got)
        assert max(abs(g - w) for (g, _), w in zip(got, want)) < TOL, max_batch
    twice = [read_position_loss(model, ids, st)[0] for st in steer]
    assert max(abs(g - w) for g, w in zip(twice, want)) < TOL
    assert max(want) - min(want) > 1e-2
