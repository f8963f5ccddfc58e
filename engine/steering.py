"""Steering: a vector times a strength added to the residual stream after one layer, at every position of every
forward (prompt and generated tokens) or at the read position only, for scoring, generation and a text's loss.

Depths are numbered as in engine/residuals.py: depth 0 is the input of the first decoder layer, depth i the output
of layer i. How steering composes with the prefix tree of `engine.scoring.score_ids`:

- `positions="read"` adds the vector at each prompt's read position only: no prefix position is touched, so known
  prefixes (caches computed without steering) are reused as they are. By default these reads run as a steered tail
  (engine/steered_tail.py: per prompt its prefix once, then per depth all its steerings in one forward through the
  layers above that depth); where the tail does not apply, or with `tail=False`, through the same read hooks as a
  patch (`Patch(add=True)`), sharing one prefix tree with each other and with the unsteered prompts.
- `positions="all"` adds it at every position of every forward the call runs: the prefix tree's nodes are then
  computed under that steering, so a cached prefix is keyed by the steering applied to it. `score_steered` runs
  one tree per distinct all-position steering (and one for the rest), and bypasses known prefixes under it (they
  were computed elsewhere, not known to be under the same steering).

Generation steers every position (`positions="all"`): the prompt's prefill and each generated token. Generic:
nothing here knows what a vector means.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from engine.errors import ProbeInputError
from engine.residuals import Patch, decoder_layers, n_depths

POSITIONS = ("all", "read")
"""Where a steering vector is added: every position of every forward, or each prompt's read position only."""


@dataclass(frozen=True)
class Steering:
    """strength * vector added to the residual stream at one depth."""

    depth: int
    """0..L (engine/residuals.py): the stream entering layer 1 (0) or leaving layer `depth`."""
    vector: torch.Tensor
    """[hidden]: the direction (cast to the model's dtype and device where it is added)."""
    strength: float = 1.0
    """What the vector is multiplied by (0: no change)."""
    positions: str = "all"
    """One of POSITIONS."""

    def __post_init__(self):
        if self.positions not in POSITIONS:
            raise ProbeInputError(f"steering: positions: '{self.positions}' is not one of {', '.join(POSITIONS)}")
        if self.vector.dim() != 1:
            raise ProbeInputError(f"steering: vector: must be one-dimensional [hidden], got shape {tuple(self.vector.shape)}")

    def added(self) -> torch.Tensor:
        """What is added to the stream: strength * vector, fp32."""
        return self.vector.detach().float().cpu() * float(self.strength)

    def key(self) -> tuple:
        """What identifies this steering's effect on a cache: depth, positions, strength and the vector's bytes."""
        raw = self.vector.detach().float().cpu().contiguous().numpy().tobytes()
        return self.depth, self.positions, float(self.strength), hashlib.sha256(raw).hexdigest()


def check_steering(model, steering: Steering) -> None:
    """ProbeInputError unless `steering` fits `model` (depth in 0..L, vector of the hidden size)."""
    if not 0 <= steering.depth < n_depths(model):
        raise ProbeInputError(f"steering: depth: {steering.depth} is not in 0..{n_depths(model) - 1}")
    hidden = model.config.hidden_size
    if steering.vector.shape[0] != hidden:
        raise ProbeInputError(f"steering: vector: {steering.vector.shape[0]} entries, the model's stream has {hidden}")


@contextmanager
def steered(model, steering: Steering | None):
    """Every forward of `model` inside the block gets `steering` added at every position (positions must be
    "all"; None: no change)."""
    if steering is None:
        yield
        return
    check_steering(model, steering)
    if steering.positions != "all":
        raise ProbeInputError("steering: positions: a steered block adds at every position ('all'); "
                              "'read' is applied by score_steered at the read positions")
    added = steering.added()
    cast: dict = {}

    def shift(hidden: torch.Tensor) -> torch.Tensor:
        key = (hidden.device, hidden.dtype)
        if key not in cast:
            cast[key] = added.to(hidden.device, hidden.dtype)
        return hidden + cast[key]

    layers = decoder_layers(model)
    if steering.depth == 0:
        def pre(module, args, kwargs):
            if args:
                return (shift(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": shift(kwargs["hidden_states"])}
        handle = layers[0].register_forward_pre_hook(pre, with_kwargs=True)
    else:
        def post(module, args, out):
            return (shift(out[0]), *out[1:]) if isinstance(out, tuple) else shift(out)
        handle = layers[steering.depth - 1].register_forward_hook(post)
    try:
        yield
    finally:
        handle.remove()


TAIL_OPTIONS = ("temperature", "top_p", "max_batch", "token_budget", "progress", "stats", "known_prefixes")
"""The score_ids options the steered tail (engine/steered_tail.py) takes; the others shape the prefix tree only."""


def score_steered(model, seqs: Sequence[Sequence[int]], letters, steering, *, tail: bool = True, **kwargs) -> list:
    """`engine.scoring.score_ids` with steering: `steering` is one Steering (or None) for every prompt, or one per
    prompt. Prompts under read-position steering are read as a steered tail (engine/steered_tail.py) where it
    applies and `tail` (and score_ids' `fast`) is on, otherwise with the unsteered ones in one call (one prefix tree,
    the steering an additive patch); prompts under each distinct all-position steering in a call of their own, with
    known prefixes bypassed (module docstring). `kwargs` go to score_ids (`patches` cannot be combined with
    steering)."""
    from engine import steered_tail
    from engine.scoring import score_ids

    per = list(steering) if isinstance(steering, (list, tuple)) else [steering] * len(seqs)
    if len(per) != len(seqs):
        raise ProbeInputError(f"steering: {len(per)} steerings for {len(seqs)} prompts")
    if all(s is None for s in per):
        return score_ids(model, seqs, letters, **kwargs)
    if kwargs.get("patches") is not None:
        raise ProbeInputError("steering: cannot be combined with patches in one call")
    for s in {s.key(): s for s in per if s is not None}.values():
        check_steering(model, s)
    groups: dict = {}
    for i, s in enumerate(per):
        groups.setdefault(s.key() if s is not None and s.positions == "all" else None, []).append(i)
    out: list = [None] * len(seqs)
    read = groups.get(None, [])
    at_read = [i for i in read if per[i] is not None]
    if at_read and tail and kwargs.get("fast", True) and steered_tail.applies(model, [seqs[i] for i in at_read]):
        results = steered_tail.score_read_steered(model, [seqs[i] for i in at_read], [letters[i] for i in at_read],
                                                  [per[i] for i in at_read], **{k: v for k, v in kwargs.items() if k in TAIL_OPTIONS})
        for i, r in zip(at_read, results):
            out[i] = r
        groups[None] = [i for i in read if per[i] is None]
        if not groups[None]:
            del groups[None]
    for key, idx in groups.items():
        sub_seqs, sub_letters = [seqs[i] for i in idx], [letters[i] for i in idx]
        if key is None:
            patches = [None if per[i] is None else Patch(per[i].depth, per[i].added(), add=True) for i in idx]
            results = score_ids(model, sub_seqs, sub_letters, patches=patches, **kwargs)
        else:
            with steered(model, per[idx[0]]):
                results = score_ids(model, sub_seqs, sub_letters, **{**kwargs, "known_prefixes": None})
        for i, r in zip(idx, results):
            out[i] = r
    return out


def generate_steered(model, prompts, steering: Steering | None, **kwargs):
    """`engine.generation.generate` with `steering` added at every position of the prompt and of each generated
    token (positions must be "all"). Decoding runs with dynamic shapes: a CUDA graph captured by an earlier,
    unsteered call would replay without the hook."""
    from engine.generation import generate

    if steering is None:
        return generate(model, prompts, **kwargs)
    with steered(model, steering):
        return generate(model, prompts, **{**kwargs, "static_shapes": False})


def token_loss(model, ids: Sequence[int], steering: Steering | None = None) -> tuple[float, int]:
    """(mean next-token cross-entropy in nats, tokens predicted) of one token sequence under `steering` added at
    every position whatever its `positions` (each token is a read position here; None: unsteered); a plain full
    forward, fp32 log-softmax."""
    if len(ids) < 2:
        raise ProbeInputError("token_loss: the text must encode to at least two tokens")
    device = model.get_input_embeddings().weight.device
    x = torch.tensor([list(ids)], device=device)
    everywhere = None if steering is None else replace(steering, positions="all")
    with steered(model, everywhere), torch.inference_mode():
        logits = model(input_ids=x, use_cache=False).logits[0, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="mean")
    return float(loss), len(ids) - 1
