"""Sampling, declared once: the tempered/top-p next-token distribution (scoring reads it exactly,
generation draws from it), the vectorized on-device draw from it with counter-based per-row uniforms, and
the derivation of seeds from named parts.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch


def tempered_distribution(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution a sampler draws the next token from: softmax(logits / T) restricted to the top-p
    nucleus and renormalized. T = 0 is greedy (all mass on the first argmax).

    The nucleus follows transformers' TopPLogitsWarper: sort ascending, drop tokens whose cumulative
    probability is <= 1 - top_p, always keep the most likely token.
    """
    logits = logits.float()
    if temperature < 0 or not (0.0 < top_p <= 1.0):
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got T={temperature}, top_p={top_p}")
    if temperature == 0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    scaled = logits / temperature
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scaled, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative <= (1.0 - top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, sorted_idx, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled.softmax(-1)


def derive_seed(*parts) -> int:
    """A 63-bit seed from any parts (stable across runs and machines)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# Decoding draws from the same nucleus without sorting the vocabulary: the `NUCLEUS_HEAD` most likely tokens
# first, and a row whose nucleus is wider than that looks at NUCLEUS_WIDEN times more (up to the whole
# vocabulary). At T 0.7 / top-p 0.95 a real model's nucleus is almost always inside the first 64.
NUCLEUS_HEAD = 64
NUCLEUS_WIDEN = 16


def _nucleus_parts(logits: torch.Tensor, temperature: float, top_p: float):
    """The top-p nucleus of softmax(logits / T), row by row, found on the top of the distribution only.

    Yields (rows, token ids [len(rows), k] or None for the whole vocabulary in id order, weights): the
    weights are the tempered probabilities of the nucleus tokens and 0 for the other ids. A token is in the
    nucleus when the mass of the tokens ranked above it is below top_p, which is TopPLogitsWarper's rule
    (drop a token when the ascending cumulative probability up to it is <= 1 - top_p) read from the top;
    a head of the k most likely tokens holds the whole nucleus once its own mass reaches top_p, since every
    token below it then has that much mass ranked above it.
    """
    if temperature <= 0 or not (0.0 < top_p <= 1.0):
        raise ValueError(f"sampling needs temperature > 0 and top_p in (0, 1], got T={temperature}, top_p={top_p}")
    rows = torch.arange(logits.shape[0], device=logits.device)
    if top_p >= 1.0:
        yield rows, None, _whole(logits, temperature)
        return
    scaled = logits.float() / temperature
    logp = scaled.log_softmax(-1)  # one fused pass for the normalizer
    vocab = logp.shape[-1]
    k = min(NUCLEUS_HEAD, vocab)
    first = True
    while True:
        ids, weights, covered = _head(scaled if first else scaled[rows], logp if first else logp[rows], k, top_p)
        first = False
        if k == vocab or bool(covered.all()):
            yield rows, ids, weights
            return
        yield rows[covered], ids[covered], weights[covered]
        rows = rows[~covered]
        k = min(k * NUCLEUS_WIDEN, vocab)


def _whole(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The nucleus at top-p 1: softmax(logits / T) over the whole vocabulary, in fp32."""
    return (logits.float() / temperature).softmax(-1)


def _head(scaled, logp, k: int, top_p: float):
    """The k most likely tokens of each row (ids [R, k]), their nucleus weights, and whether the head holds the
    whole nucleus (covered [R])."""
    # Ranked on the tempered logits themselves, as the warper sorts them (log-probabilities can round
    # two nearly equal logits into a tie).
    ids = scaled.topk(k, dim=-1).indices
    probs = logp.gather(-1, ids).exp()
    cumulative = probs.double().cumsum(-1)  # float32 running sums drift by ~1e-5 over a thousand tokens
    weights = probs * ((cumulative - probs) < top_p)
    weights[:, 0] = probs[:, 0]  # the most likely token is always kept
    return ids, weights, (cumulative[:, -1] >= top_p) | (k == logp.shape[-1])


def _draw(ids, weights, uniforms):
    """Invert the weights' cumulative distribution, in token-id order, at `uniforms` [R]."""
    if ids is not None:
        ids, order = ids.sort(-1)
        weights = weights.gather(-1, order)
    pick = _inverse_cdf(weights, uniforms)
    return pick if ids is None else ids.gather(-1, pick[:, None])[:, 0]


DRAW_BLOCK = 512
"""Tokens per block of the draw over a wide distribution (the whole vocabulary at top-p 1, the gap profiles'
setting): the draw sums each block in float64, finds the block that holds the target, and accumulates that block
only, so no step forms a float64 running sum over rows x vocabulary (at 256 rows and a 128k vocabulary: 33M
doubles written and scanned per step). A vocabulary with a divisor near DRAW_BLOCK is cut in blocks of that size
(`_block_size`), others are padded with tokens of weight 0."""


@functools.lru_cache(maxsize=None)
def _block_size(width: int, block: int) -> int:
    """The block size for rows of `width` tokens: the divisor of `width` nearest `block` (DRAW_BLOCK) within a factor
    of 2 (501 for Llama-3's 128,256 tokens, 619 for OLMo-3's 100,278, 512 for SmolLM2's 49,152), else `block`."""
    near = [d for d in range(block // 2, 2 * block + 1) if width % d == 0]
    return min(near, key=lambda d: (abs(d - block), d)) if near else block


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row of `weights` [R, W] (non-negative, token-id order), the first index whose cumulative weight, summed in
    float64, exceeds u x the row's total, at the row's uniform u in [0, 1): the index of the token drawn. A token
    of weight 0 is never drawn. Rows wider than one block go block by block: the block whose running total first
    exceeds the target, then the index within that block where the block's own running sum exceeds what is left of
    the target; the sums are those of one running sum over the row up to how float64 rounds them (a draw lands
    elsewhere only where the target lies within that rounding of a token's edge: about 1e-14 of the row's total at
    128k tokens). A row that is not finite (NaN weights) draws some index in range, as the running sum did."""
    rows, width = weights.shape
    size = _block_size(width, DRAW_BLOCK)
    if width <= size:
        cumulative = weights.double().cumsum(-1)
        return torch.searchsorted(cumulative, _target(cumulative, uniforms), right=True).clamp_(max=width - 1)[:, 0]
    if width % size:
        weights = torch.nn.functional.pad(weights, (0, size - width % size))
    blocks = weights.reshape(rows, -1, size)
    sums = blocks.sum(-1, dtype=torch.float64)
    cumulative = sums.cumsum(-1)
    target = _target(cumulative, uniforms)
    # [R, 1]; a real block, as the target is below the total (the clamp holds rows that are not finite in range)
    block = torch.searchsorted(cumulative, target, right=True).clamp_(max=cumulative.shape[-1] - 1)
    inside = blocks.gather(1, block[:, :, None].expand(rows, 1, size))[:, 0].double().cumsum(-1)
    # What is left of the target past the blocks before (their running total, 0 for the first block, is at most the
    # target, so this is never negative), kept below the block's own running total (x (1 - 2^-53) is the next double
    # below it): the blockwise sums may put the target in this block where its own running sum rounds to slightly
    # less, and the draw is then the token at which that running sum reaches the block's total.
    before = torch.nn.functional.pad(cumulative, (1, 0)).gather(-1, block)
    left = torch.minimum(target - before, inside[:, -1:] * (1.0 - 2.0**-53))
    at = torch.searchsorted(inside, left, right=True).clamp_(max=size - 1)
    return torch.add(at, block, alpha=size).clamp_(max=width - 1)[:, 0]


def _target(cumulative: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """u x the row's total [R, 1]: below the total, since u is at most 1 - 2^-53 (row_uniforms) and a float64
    product u x total never rounds up to total, so some running sum exceeds it; searched with right=True, the index
    found is never one of weight 0 (whose running sum equals the one before it)."""
    return uniforms.to(cumulative.dtype)[:, None] * cumulative[:, -1:]


def sample_tokens_unchecked(logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor):
    """`sample_tokens` without a host synchronization: (tokens [R], covered [R]), `covered` whether the row's
    nucleus lay within its NUCLEUS_HEAD most likely tokens. A covered row's token is `sample_tokens`'s; for the
    others the caller draws again with `sample_tokens` (engine/steps.py rewinds to its last check)."""
    if temperature <= 0 or not (0.0 < top_p <= 1.0):
        raise ValueError(f"sampling needs temperature > 0 and top_p in (0, 1], got T={temperature}, top_p={top_p}")
    if top_p >= 1.0:
        return sample_tokens(logits, temperature, top_p, uniforms), torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
    scaled = logits.float() / temperature
    ids, weights, covered = _head(scaled, scaled.log_softmax(-1), min(NUCLEUS_HEAD, logits.shape[-1]), top_p)
    return _draw(ids, weights, uniforms), covered


def nucleus_distribution(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution `sample_tokens` draws from, as dense rows [R, V] (for checks against
    `tempered_distribution` and transformers' warpers)."""
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    for rows, ids, weights in _nucleus_parts(logits, temperature, top_p):
        weights = weights / weights.sum(-1, keepdim=True)
        out[rows] = weights if ids is None else out[rows].scatter(-1, ids, weights)
    return out


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row from the tempered top-p distribution of `logits` [R, V], on their device.

    The draw inverts the nucleus's cumulative distribution at `uniforms` [R] (in [0, 1)), accumulating the
    nucleus in token-id order, so a row's token depends on its logits and its uniform only: not on the other
    rows, and not on how ties among equally likely tokens happen to be ordered.
    """
    if top_p == 1.0 and temperature > 0:  # the whole vocabulary: one part, every row
        return _draw(None, _whole(logits, temperature), uniforms)
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for rows, ids, weights in _nucleus_parts(logits, temperature, top_p):
        out[rows] = _draw(ids, weights, uniforms[rows])
    return out


def row_uniforms(row_seeds, steps: int) -> torch.Tensor:
    """Counter-based uniforms in [0, 1), [rows, steps] float64: draw t of a row is the t-th 64-bit output of
    Philox4x64-10 keyed by the row's seed (top 53 bits), so a rollout's draws are fixed by its seed and the
    step alone, whatever else shares its batch. Philox's raw stream is defined by the algorithm, not by a
    library version."""
    out = np.empty((len(row_seeds), steps), dtype=np.float64)
    for r, seed in enumerate(row_seeds):
        out[r] = (np.random.Philox(key=int(seed)).random_raw(steps) >> np.uint64(11)) * 2.0**-53
    return torch.from_numpy(out)
