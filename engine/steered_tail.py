"""Read-position steering as a steered tail: many steerings of one prompt, each added at the read position only, read
in one forward per steered depth that runs only the layers above that depth.

Under read-position steering (engine/steering.py) no position before the read position changes, and at the read
position nothing below the steered depth changes. So for each distinct prompt this module runs its prefix once (every
layer's keys and values), its last token once unsteered (the read position's stream at each steered depth), and then,
per steered depth d, forwards whose rows are the steerings at d: each row is the prompt's last token again, at the read
position's own position id, attending to the prefix's cached keys and values and to itself only (an explicit additive
mask), its stream at depth d the unsteered stream plus its steering. The layers below d do not run in that forward
(their output at the read position is the unsteered stream, already known); the layers above d run on all rows at once,
and the head is applied to them in fp32.

The rows share the prefix's keys and values without copying them per row, so a grid of hundreds of steerings of one
prompt costs its tail layers and the head per steering. It applies to models whose logits are the head of the final
norm's output (engine.scoring.PLAIN_HEAD_MODEL_TYPES), on one device, with eager or SDPA attention (an explicit mask)
and prompts within any sliding window; `applies` says so, and engine.steering.score_steered takes the prefix-tree
path otherwise. Held to a plain one-prompt forward with the vector added by a hook at the last position within 1e-5 on
every tiny family and SmolLM2 (tests/engine/test_steered_tail.py). Generic: nothing here knows what a vector means.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, Sequence

import torch

from engine.batching import halving_on_oom, spread_over_devices
from engine.head import head_fp32
from engine.residuals import decoder_layers
from engine.scoring import ScoreStats, _plain_head, letter_masses

TAIL_ROWS = {"cuda": 1024, "cpu": 256}
"""Steered rows per tail forward by default (each one token attending to the prompt's prefix)."""

MASKED_ATTENTION = ("eager", "sdpa")
"""Attention implementations that take the tail's explicit [rows, prefix + rows] mask as given."""


def applies(model, seqs: Sequence[Sequence[int]]) -> bool:
    """Whether `score_read_steered` reads these prompts on this model (module docstring)."""
    cfg = model.config
    if not _plain_head(model) or spread_over_devices(model):
        return False
    if getattr(cfg, "_attn_implementation", None) not in MASKED_ATTENTION:
        return False
    window = getattr(cfg, "sliding_window", None)
    return not (window and max(map(len, seqs), default=0) > window)


def score_read_steered(model, seqs, letters, steerings, *, temperature: float = 1.0, top_p: float = 1.0,
                       max_batch: int | None = None, token_budget: int | None = None, progress: bool = False,
                       stats: ScoreStats | None = None, known_prefixes: dict | None = None) -> list:
    """Letter masses of each prompt with its read-position steering (engine.steering.Steering, positions "read", one
    per prompt, none None), as `engine.scoring.score_ids` reads them. Rows per tail forward: at most `max_batch` and
    `token_budget` (default TAIL_ROWS); `known_prefixes` as in score_ids (a prompt's prefix starts from the longest one
    it begins with); `stats` counts the prefix tokens, the unsteered last tokens and one token per steered read."""
    from tqdm.auto import tqdm

    stats = stats if stats is not None else ScoreStats()
    device = model.get_input_embeddings().weight.device
    cap = _rows_cap(device, max_batch, token_budget)
    stats.prompt_tokens += sum(len(s) for s in seqs)
    by_prompt: dict = {}
    for i, s in enumerate(seqs):
        by_prompt.setdefault(tuple(s), []).append(i)
    out: list = [None] * len(seqs)
    bar = tqdm(total=len(seqs), desc="scoring", unit="probe", disable=not progress, leave=False)
    with torch.inference_mode():
        last: tuple = ((), None)  # the previous prompt's prefix tokens and their keys and values
        for ids in sorted(by_prompt):  # sorted: a prompt shares the longest prefix it can with the one before it
            members, n = by_prompt[ids], len(ids)
            prefix, start = _shared_prefix(ids[:-1], last, known_prefixes)
            if start < n - 1:
                prefix = _run(model, ids[start:-1], prefix, start, stats, device)[0]
            last = (ids[:-1], prefix)
            _, streams, as_tuple = _run(model, ids[-1:], prefix, n - 1, stats, device, capture=True)
            for depth, rows in _by_depth(steerings, members).items():
                run = partial(_prompt_tail, model, ids, prefix, streams, as_tuple, depth, steerings, stats)
                for c in range(0, len(rows), cap):
                    chunk = rows[c : c + cap]
                    logits = halving_on_oom(run, chunk, lambda a, b: torch.cat([a, b]), stats)
                    masses = letter_masses(logits, [letters[i] for i in chunk], [n] * len(chunk), temperature, top_p)
                    for i, mass in zip(chunk, masses):
                        out[i] = mass
                    bar.update(len(chunk))
    bar.close()
    return out


def read_position_text_losses(model, ids: Sequence[int], steerings, max_batch: int | None = None,
                              progress: Callable[[int], object] | None = None) -> list:
    """Per read-position steering: (mean next-token loss in nats, tokens predicted) of the text `ids` when each of its
    positions predicts its next token with the vector added at that position alone (no earlier position steered),
    as a readout's read position gets it. The text runs once unsteered (its keys and values, its stream at every
    position and depth); each steering then runs the layers above its depth for every predicting position at once,
    each position attending to the text before it and to itself. `progress`, if given, is called with 1 after each
    steering."""
    ids = tuple(ids)
    n = len(ids)
    device = model.get_input_embeddings().weight.device
    cap = _rows_cap(device, max_batch, None)
    stats = ScoreStats()
    out = []
    with torch.inference_mode():
        cache, streams, as_tuple = _run(model, ids, None, 0, stats, device, capture=True)
        target = torch.tensor(ids[1:], device=device)
        for st in steerings:
            added = st.added().to(device, streams.dtype)
            losses = []
            for c in range(0, n - 1, cap):
                at = list(range(c, min(c + cap, n - 1)))
                start = streams[st.depth, at] + added
                logits = _tail(model, cache, st.depth, [ids[t] for t in at], at, at, start, as_tuple, stats)
                losses.append(torch.nn.functional.cross_entropy(logits, target[at].to(logits.device), reduction="sum"))
            out.append((float(sum(losses)) / (n - 1), n - 1))
            if progress is not None:
                progress(1)
    return out


def _prompt_tail(model, ids: tuple, prefix, streams, as_tuple: bool, depth: int, steerings, stats, rows) -> torch.Tensor:
    """Logits of the prompt `ids` read under each of `rows`' steerings at `depth` (all at the read position)."""
    n, b = len(ids), len(rows)
    start = streams[depth, -1][None] + torch.stack([steerings[i].added() for i in rows]).to(streams.device, streams.dtype)
    return _tail(model, prefix, depth, [ids[-1]] * b, [n - 1] * b, [n - 1] * b, start, as_tuple, stats)


def _rows_cap(device, max_batch: int | None, token_budget: int | None) -> int:
    return int(min(max_batch or TAIL_ROWS["cuda" if device.type == "cuda" else "cpu"], token_budget or math.inf))


def _by_depth(steerings, members) -> dict:
    out: dict = {}
    for i in members:
        out.setdefault(steerings[i].depth, []).append(i)
    return out


def _cache(model, prefix):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, (keys, values) in enumerate(prefix or ()):
        cache.update(keys, values, layer)
    return cache


def _shared_prefix(ids: tuple, last: tuple, known: dict | None) -> tuple[list | None, int]:
    """([(keys, values) per layer] of the longest start of `ids` already computed, its length): the tokens `ids` share
    with the previous prompt's prefix (`last`: its tokens and keys and values, sliced: causal keys and values of a
    position depend on the tokens up to it only), or the longest known prefix they begin with."""
    tokens, kv = last
    shared = next((i for i, (a, b) in enumerate(zip(ids, tokens)) if a != b), min(len(ids), len(tokens)))
    known_len = max((len(k) for k in known or {} if len(k) <= len(ids) and ids[: len(k)] == tuple(k)), default=0)
    if known_len > shared:
        return known[ids[:known_len]], known_len
    if not shared:
        return None, 0
    return [(k[:, :, :shared], v[:, :, :shared]) for k, v in kv], shared


def _run(model, todo: tuple, prefix, offset: int, stats: ScoreStats, device, capture: bool = False):
    """Run tokens `todo` at positions offset.. on `prefix` ([(keys, values) per layer] of the positions before
    `offset`, or None). Returns ([(keys, values) per layer] of the prefix and `todo`; with `capture`, the stream at
    every depth and position of `todo` [depths, len(todo), hidden] in the model's dtype, and whether the decoder layers
    return tuples)."""
    cache = _cache(model, prefix)
    layers = decoder_layers(model)
    captured: dict = {}
    kinds: list = []

    def enter(module, args, kwargs):
        captured[0] = (args[0] if args else kwargs["hidden_states"])[0]

    def leave(depth, out):
        kinds.append(isinstance(out, tuple))
        captured[depth] = (out[0] if isinstance(out, tuple) else out)[0]

    handles = []
    if capture:
        handles.append(layers[0].register_forward_pre_hook(enter, with_kwargs=True))
        handles += [layer.register_forward_hook(lambda m, a, out, d=d: leave(d, out)) for d, layer in enumerate(layers, 1)]
    try:
        model.base_model(input_ids=torch.tensor([list(todo)], device=device), past_key_values=cache, use_cache=True,
                         position_ids=torch.arange(offset, offset + len(todo), device=device)[None])
    finally:
        for h in handles:
            h.remove()
    stats.computed_tokens += len(todo)
    stats.padded_tokens += len(todo)
    stats.forward_passes += 1
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    if not capture:
        return kv, None, None
    return kv, torch.stack([captured[d] for d in range(len(layers) + 1)]), kinds[0]


def _tail(model, prefix, depth: int, tokens, positions, visible, start: torch.Tensor, as_tuple: bool, stats: ScoreStats):
    """Next-token logits [rows, vocab] (fp32) of rows run through the layers above `depth` only: row r is token
    `tokens[r]` at position id `positions[r]`, its stream at `depth` given (`start` [rows, hidden]), attending to the
    first `visible[r]` cached positions of `prefix` ([(keys, values) per layer], or None) and to itself."""
    b = len(tokens)
    device, dtype = start.device, start.dtype
    width = 0 if prefix is None else prefix[0][0].shape[2]
    seen = torch.tensor(visible, device=device)
    mask = torch.full((b, width + b), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, :width].masked_fill_(torch.arange(width, device=device)[None] < seen[:, None], 0)
    mask[torch.arange(b), width + torch.arange(b)] = 0
    layers = decoder_layers(model)
    saved = [(layer, layer.__dict__.get("forward")) for layer in layers[:depth]]
    given = start[None]

    def hand_over(*a, **k):
        return (given,) if as_tuple else given

    def stand_aside(hidden, *a, **k):
        return (hidden,) if as_tuple else hidden

    handle = None
    try:
        # Layers below `depth` stand aside: the last of them hands over the given stream at `depth`.
        for k, layer in enumerate(layers[:depth]):
            layer.forward = hand_over if k == depth - 1 else stand_aside
        if depth == 0:
            def enter(module, args, kwargs):
                if args:
                    return (given, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": given}
            handle = layers[0].register_forward_pre_hook(enter, with_kwargs=True)
        hidden = model.base_model(input_ids=torch.tensor([list(tokens)], device=device), attention_mask=mask[None, None],
                                  position_ids=torch.tensor([list(positions)], device=device),
                                  past_key_values=_cache(model, prefix), use_cache=True).last_hidden_state[0]
    finally:
        if handle is not None:
            handle.remove()
        for layer, own in saved:
            if own is None:
                del layer.forward
            else:
                layer.forward = own
    stats.computed_tokens += b
    stats.padded_tokens += b
    stats.forward_passes += 1
    weight, bias = head_fp32(model)
    return torch.nn.functional.linear(hidden.to(weight.device, torch.float32), weight, bias)
