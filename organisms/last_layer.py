"""The last decoder layer trained from its input at every position, computing only what the loss needs.

When the band is the last layer alone and its keys and values are adapted, every position's keys and values move, so
the loss-position path's frozen keys (organisms.train.exact_at_positions) no longer hold. What the read positions
need from the positions before them is still only that layer's keys and values: nothing above the last layer reads
their outputs. So a step computes the layer's keys and values at the earlier positions (its input norm and
projections, stopped before attention) and runs the whole layer at the loss positions over them. Exact: the same
logits as running the layer on every position (tests/organisms/test_training.py compares both with a plain forward
of the whole prompt, on every chat template family), at about a sixth of a SmolLM2 layer's work per earlier position.
"""

from __future__ import annotations

import torch


class _Stop(Exception):
    pass


class _Capture:
    """A cache that keeps the keys and values the layer's attention hands it, then stops the layer."""

    def update(self, keys, values, layer_idx, *args, **kwargs):
        self.keys, self.values = keys, values
        raise _Stop


def applies(inner, start_layer: int, cached) -> bool:
    """Whether a step reads the last layer alone from its input at every position (what organisms.train caches
    for a band whose keys and values move)."""
    return start_layer == len(inner.layers) - 1 and cached[0].keys is None and cached[0].start == 0


def loss_position_cache(inner, cached, firsts: list[int], start_layer: int, rotary) -> list[tuple]:
    """Each example's fields of organisms.train.Cached for the loss-position path (start, hidden, keys, values): its
    input from `firsts[i]` (its first loss position) on, and the last layer's keys and values before it, computed
    (with gradients into the adapter) from its input at every earlier position. `rotary(inner, h, pos, layer_index)`
    gives the layer's position embeddings."""
    layer = inner.layers[start_layer]
    width = max(firsts)
    h = torch.zeros(len(cached), width, cached[0].hidden.shape[-1], dtype=cached[0].hidden.dtype)
    for row, (c, s) in enumerate(zip(cached, firsts)):  # right padding: a real position never sees a pad
        h[row, :s] = c.hidden[:s]
    pos = torch.arange(width)[None].expand(len(cached), -1)
    capture = _Capture()
    try:
        layer(h, attention_mask=None, position_ids=pos, past_key_values=capture,
              position_embeddings=rotary(inner, h, pos, start_layer))
    except _Stop:
        pass
    return [(s, c.hidden[s:], capture.keys[row: row + 1, :, :s], capture.values[row: row + 1, :, :s])
            for row, (c, s) in enumerate(zip(cached, firsts))]
