"""The decoder's sampler: the nucleus it finds on the top of the distribution is transformers' top-p nucleus
(and the exact tempered distribution scoring reads); its draws follow that distribution; its uniforms are
counter-based, keyed by the row's seed and the step only.
"""

import numpy as np
import pytest
import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from engine import sampling
from engine.sampling import NUCLEUS_HEAD, nucleus_distribution, row_uniforms, sample_tokens, tempered_distribution

SETTINGS = [(0.7, 0.95), (1.3, 0.9), (0.5, 1.0), (1.0, 0.5), (0.7, 0.999)]


def warped(logits, temperature, top_p):
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


def random_logits(scale, rows=40, vocab=5000, seed=0):
    """Peaked rows (large scale) have small nuclei; flat ones (small scale) need far more than NUCLEUS_HEAD tokens."""
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def exclusive_mass(logits, temperature):
    """Per token, the tempered mass of the tokens ranked above it (in double precision)."""
    probs = (logits.double() / temperature).softmax(-1)
    ranked, order = probs.sort(-1, descending=True)
    return (ranked.cumsum(-1) - ranked).scatter(-1, order, ranked.cumsum(-1) - ranked)


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0])
def test_nucleus_is_the_warpers_distribution(scale, temperature, top_p):
    logits = random_logits(scale)
    mine = nucleus_distribution(logits, temperature, top_p)
    for ref in (warped(logits, temperature, top_p), tempered_distribution(logits, temperature, top_p)):
        assert (mine - ref).abs().max() < 1e-5
        # The same tokens, except where a token's mass above sits within float rounding of top_p (the
        # warper's ascending sum and the head's descending one round differently; it happens in a long
        # tail of tiny tokens, as at top-p 0.999).
        differ = (mine > 0) != (ref > 0)
        assert bool(((exclusive_mass(logits, temperature) - top_p).abs()[differ] < 1e-6).all())
        if top_p <= 0.95:
            assert not bool(differ.any())


def test_wide_nuclei_are_searched_beyond_the_head():
    logits = random_logits(0.3)
    sizes = (nucleus_distribution(logits, 1.0, 0.95) > 0).sum(-1)
    assert sizes.min() > 4 * NUCLEUS_HEAD


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (1.0, 1.0)])
def test_draws_follow_the_distribution(temperature, top_p):
    draws = 20_000
    row = random_logits(2.0, rows=1, vocab=400, seed=5)
    probs = warped(row, temperature, top_p)[0]
    tokens = sample_tokens(row.expand(draws, -1), temperature, top_p, row_uniforms([12345], draws)[0])
    freq = torch.bincount(tokens, minlength=row.shape[-1]).double() / draws
    assert (freq - probs.double()).abs().max() < 0.01
    assert not bool((freq[probs == 0] > 0).any())  # never outside the nucleus


def test_a_draw_depends_on_its_row_only():
    logits = random_logits(2.0, rows=12)
    u = row_uniforms(range(12), 1)[:, 0]
    together = sample_tokens(logits, 0.8, 0.9, u)
    alone = torch.cat([sample_tokens(logits[i : i + 1], 0.8, 0.9, u[i : i + 1]) for i in range(12)])
    assert torch.equal(together, alone)


def test_uniforms_are_keyed_by_seed_and_step():
    a = row_uniforms([7, 8, 9], 50)
    assert torch.equal(row_uniforms([8], 20)[0], a[1, :20])  # the same stream, whatever the length and the other rows
    assert not torch.equal(a[0], a[1])
    assert bool(((a >= 0) & (a < 1)).all())
    # Fixed forever: runs on other machines must draw the same rollouts.
    assert row_uniforms([1], 2)[0].tolist() == pytest.approx([0.3035680343067586, 0.8487087496857769], abs=0)


@pytest.mark.parametrize("rank", [3, 17, 60])
def test_top_p_cut_at_an_exact_tie_is_the_warpers(rank):
    """top_p chosen so that 1 - top_p is exactly the ascending cumulative mass up to the `rank`-th least likely
    token, as the warper computes it: TopPLogitsWarper drops that token (`<=`), so the nucleus keeps
    vocab - rank - 1 tokens, and the exact tempered distribution must keep the same ones."""
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(rank))
    cumulative = logits.sort(-1).values.softmax(-1).cumsum(-1)
    top_p = 1.0 - float(cumulative[0, rank])
    assert torch.tensor(1.0 - top_p, dtype=torch.float32) == cumulative[0, rank]  # the tie is exact in float32
    reference = TopPLogitsWarper(top_p)(None, logits.clone()).softmax(-1)
    assert int((reference > 0).sum()) == 64 - rank - 1
    ours = tempered_distribution(logits, 1.0, top_p)
    assert torch.equal(ours > 0, reference > 0)
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-7)


def running_sum_draws(weights: torch.Tensor, uniforms: torch.Tensor) -> list[int]:
    """The inverse-CDF draw by its definition, in numpy: one float64 running sum over each row in token-id order,
    the first index whose sum exceeds u x the row's total."""
    out = []
    for w, u in zip(weights.double().numpy(), uniforms.numpy()):
        cdf = np.cumsum(w)
        out.append(int(np.searchsorted(cdf, u * cdf[-1], side="right")))
    return out


@pytest.mark.parametrize("block", [sampling.DRAW_BLOCK, 16])
@pytest.mark.parametrize("vocab", [300, 512, 2048, 5003])
def test_the_blockwise_draw_is_the_running_sums(monkeypatch, block, vocab):
    """Over the whole vocabulary (top-p 1) the draw goes block by block; it picks what one float64 running sum over
    the row picks, on peaked and flat rows, with masked tokens (weight 0), below one block and across a ragged last
    block."""
    monkeypatch.setattr(sampling, "DRAW_BLOCK", block)
    logits = torch.cat([random_logits(s, rows=32, vocab=vocab, seed=vocab) for s in (0.3, 3.0, 12.0)])
    logits[::3, 1::7] = float("-inf")  # a tied row's stop tokens are masked like this
    logits[1, : vocab - 3] = float("-inf")  # all mass in the last block (padded where no divisor is near the block)
    logits[2, 3:] = float("-inf")  # all mass in the first one
    weights = (logits / 0.7).softmax(-1)
    uniforms = row_uniforms(range(len(logits)), 1)[:, 0]
    picks = sampling._inverse_cdf(weights, uniforms)
    assert picks.tolist() == running_sum_draws(weights, uniforms)
    assert bool((weights.gather(-1, picks[:, None]) > 0).all())


def test_the_blockwise_draw_at_planted_edges(monkeypatch):
    """Blocks of 4 over 11 tokens (11 has no divisor near 4: the last block is padded with a token of weight 0) with
    dyadic weights, so every running sum is exact: a target equal to a running sum goes to the next token of positive
    weight (a token of weight 0 is never drawn), and the largest uniform below 1 draws the last token of positive
    weight."""
    monkeypatch.setattr(sampling, "DRAW_BLOCK", 4)
    assert sampling._block_size(11, 4) == 4
    w = torch.tensor([0.125, 0.0, 0.125, 0.0, 0.25, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0])
    cases = {0.0: 0, 0.1: 0, 0.125: 2, 0.2: 2, 0.25: 4, 0.49: 4, 0.5: 8, 0.75: 8, 1.0 - 2.0**-53: 8}
    uniforms = torch.tensor(list(cases), dtype=torch.float64)
    assert sampling._inverse_cdf(w.expand(len(cases), -1), uniforms).tolist() == list(cases.values())


def test_the_blockwise_draw_stays_in_the_block_its_sums_chose(monkeypatch):
    """A block's sum and its own running sum can round apart: 1 then 63 tokens of 2^-54 sum to more than 1 in a
    float64 reduction that adds the small ones together, while a running sum stays at 1. With that block last, a
    target between the two falls in it by the blocks' sums, past its own running sum: the draw is then a token of that
    block (the first one that reaches its running total, as one running sum over the row draws), not an index past
    the vocabulary."""
    monkeypatch.setattr(sampling, "DRAW_BLOCK", 64)
    w = torch.zeros(1, 128)
    w[0, 0], w[0, 64], w[0, 65:] = 1.0, 1.0, 2.0**-54
    last_sum = float(w[0, 64:].sum(dtype=torch.float64))
    assert last_sum > 1.0 == float(w[0, 64:].double().cumsum(-1)[-1])  # the planted rounding, on this torch
    u = torch.tensor([(2.0 + 1.0 + last_sum) / 2 / (1.0 + last_sum)], dtype=torch.float64)
    assert sampling._inverse_cdf(w, u).tolist() == [64] == running_sum_draws(w, u)


def test_wide_draws_follow_the_distribution():
    """At top-p 1 over a vocabulary of many blocks, the draws' frequencies are the tempered distribution's."""
    draws = 20_000
    row = random_logits(3.0, rows=1, vocab=3 * sampling.DRAW_BLOCK + 77, seed=9)
    probs = warped(row, 0.7, 1.0)[0]
    tokens = sample_tokens(row.expand(draws, -1), 0.7, 1.0, row_uniforms([4321], draws)[0])
    freq = torch.bincount(tokens, minlength=row.shape[-1]).double() / draws
    assert (freq - probs.double()).abs().max() < 0.01


def test_a_row_that_is_not_finite_draws_in_range():
    """NaN logits (a numerical failure upstream) draw some token id in range, as the single running sum did, on both
    the one-block and the blockwise path: never an index past the vocabulary."""
    for vocab in (300, 2048, 5003):
        logits = random_logits(1.0, rows=3, vocab=vocab)
        logits[1] = float("nan")
        picks = sample_tokens(logits, 0.7, 1.0, row_uniforms(range(3), 1)[:, 0])
        assert bool(((picks >= 0) & (picks < vocab)).all())
