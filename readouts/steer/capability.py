"""The capability check of `readout steer`: the mean next-token loss of the shipped held-out text under each steering
condition, with the vector added where the readouts got it.

- `positions="all"`: one forward of the whole text with the vector at every position (engine.steering.token_loss).
- `positions="read"`: every position of the text predicts its next token with the vector added at that position
  alone, as a readout's read position gets it (no earlier position steered). Where the steered tail applies
  (engine/steered_tail.py) the text runs once unsteered and each steering runs only the layers above its depth, every
  position at once, each attending to the text before it and to itself. Otherwise all positions in one forward of
  the text twice over (`read_position_loss`): the first copy unsteered and causal; the second copy's position t
  (position id t) attends to the first copy's positions before t and to itself, and gets the vector after the layer.
  Below the layer the copy equals the unsteered stream at t; above it, it is the read-position steering of the prefix
  ending at t. Both are held to engine.steering.score_steered on each prefix (tests/readouts/steer/test_steer_run.py)
  and to a hooked plain forward of each prefix (tests/engine/test_steered_tail.py).
"""

from __future__ import annotations

import torch

from engine import steered_tail
from engine.render import Prompt, encode_prompt
from engine.residuals import decoder_layers
from engine.steering import Steering, check_steering, token_loss
from readouts.steer.directions import CAPABILITY_TEXT


def capability_ids(tokenizer) -> list[int]:
    return list(encode_prompt(tokenizer, Prompt(text=CAPABILITY_TEXT.read_text(encoding="utf-8"))))


def capability_losses(lm, steerings: list, positions: str, progress: bool = False) -> list[tuple[float, int]]:
    """Per steering (None: unsteered): (mean next-token loss in nats, tokens predicted); `progress`: a bar over the
    conditions."""
    from tqdm.auto import tqdm

    ids = capability_ids(lm.tokenizer)
    bar = tqdm(total=len(steerings), desc="capability", unit="condition", disable=not progress, leave=False)
    if positions != "read":
        return [token_loss(lm.model, ids, s) for s in _ticking(steerings, bar)]
    steered = [s for s in steerings if s is not None]
    for s in steered:
        check_steering(lm.model, s)
    if steered_tail.applies(lm.model, [ids]):
        losses = iter(steered_tail.read_position_text_losses(lm.model, ids, steered, progress=bar.update))
    else:
        losses = iter([read_position_loss(lm.model, ids, s) for s in _ticking(steered, bar)])
    out = [token_loss(lm.model, ids) if s is None else next(losses) for s in steerings]
    bar.update(len(steerings) - len(steered))
    bar.close()
    return out


def _ticking(items, bar):
    for item in items:
        yield item
        bar.update(1)


def read_position_loss(model, ids, steering: Steering) -> tuple[float, int]:
    """(mean next-token loss in nats, tokens predicted) with `steering` added at each predicting position alone
    (module docstring): one forward of 2T tokens with a custom mask."""
    check_steering(model, steering)
    n = len(ids)
    device = model.get_input_embeddings().weight.device
    x = torch.tensor([list(ids) * 2], device=device)
    pos = torch.arange(n, device=device)
    causal = pos[:, None] >= pos[None, :]
    allowed = torch.zeros(2 * n, 2 * n, dtype=torch.bool, device=device)
    allowed[:n, :n] = causal
    allowed[n:, :n] = pos[:, None] > pos[None, :]
    allowed[n:, n:] = torch.eye(n, dtype=torch.bool, device=device)
    added = steering.added()

    def shift(hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.clone()
        hidden[:, n:] += added.to(hidden.device, hidden.dtype)
        return hidden

    layers = decoder_layers(model)
    if steering.depth == 0:
        handle = layers[0].register_forward_pre_hook(
            lambda m, args, kwargs: ((shift(args[0]), *args[1:]), kwargs) if args
            else (args, {**kwargs, "hidden_states": shift(kwargs["hidden_states"])}), with_kwargs=True)
    else:
        handle = layers[steering.depth - 1].register_forward_hook(
            lambda m, a, out: (shift(out[0]), *out[1:]) if isinstance(out, tuple) else shift(out))
    try:
        with torch.inference_mode():
            logits = model(input_ids=x, attention_mask=allowed[None, None], position_ids=torch.cat([pos, pos])[None],
                           use_cache=False).logits[0, n:-1].float()
    finally:
        handle.remove()
    loss = torch.nn.functional.cross_entropy(logits, x[0, 1:n], reduction="mean")
    return float(loss), n - 1
