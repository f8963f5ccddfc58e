"""The residual stream at read positions: captured after every layer in the ordinary read, replaced at one
layer (activation patching), and read through the logit lens.

Depths are numbered 0..L for a model of L decoder layers: depth 0 is the input of the first layer (the
embeddings' output), depth i the output of layer i (the residual stream after i layers). Depth L is the
stream the final norm and the head turn into the ordinary logits, so the logit lens at depth L is the
ordinary read. Hooks sit on the decoder layers, so they see every forward the scoring fast path runs
(prefix-tree nodes, batches, OOM halves); they act only while armed for one read forward, on the rows and
positions it is armed with. Generic: nothing here knows what a prompt means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch


@dataclass(frozen=True)
class Patch:
    """Replace the residual stream at one depth and position by a given vector (or add the vector to it)."""

    depth: int
    """0..L (module docstring): the stream entering layer 1 (0) or leaving layer `depth`."""
    vector: torch.Tensor
    """[hidden], or [positions, hidden] for several positions: what the stream holds there instead (cast to the
    model's dtype and device)."""
    position: int | tuple[int, ...] | None = None
    """Token position in the prompt, or several (a plain forward's: engine.residuals.patched_reads); None: the read
    position (the prompt's last token)."""
    add: bool = False
    """Add the vector to the stream there instead of replacing it (steering at the read position, engine/steering.py)."""


def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's decoder layers, in order (the ModuleList holding `num_hidden_layers` blocks)."""
    n = model.config.num_hidden_layers
    layers = getattr(model.base_model, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == n:
        return layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise ValueError(f"{type(model).__name__}: no list of {n} decoder layers found")


def n_depths(model) -> int:
    """How many depths a capture holds: the layers plus the embeddings' output."""
    return model.config.num_hidden_layers + 1


def final_norm(model) -> torch.nn.Module:
    """The norm the model applies to the last layer's output before its head."""
    norm = getattr(model.base_model, "norm", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__}: no final norm (`base_model.norm`) for the logit lens")
    return norm


def lens_logits(model, residuals: torch.Tensor) -> torch.Tensor:
    """The logit lens: residual streams [..., hidden] through the model's final norm (in the model's dtype, as
    its own forward applies it) and then its head in fp32; fp32 logits [..., vocab]. A model that changes its
    head's logits (soft-capping, a logit scale) is refused: the lens would not read the model's own head."""
    from engine.errors import ReadoutError
    from engine.head import head_fp32, head_scaling

    scaling = head_scaling(model.config)
    if scaling is not None:
        raise ReadoutError(f"depth: {model.config.model_type} sets {scaling}={getattr(model.config, scaling)!r}: a lens's "
                           "norm and head would not be the model's own head (not supported)")

    weight, bias = head_fp32(model)
    norm = final_norm(model)
    param = next(norm.parameters(), None)
    dtype = param.dtype if param is not None else residuals.dtype
    with torch.inference_mode():
        normed = norm(residuals.to(weight.device, dtype))
        return torch.nn.functional.linear(normed.float(), weight, bias)


class ReadHooks:
    """Hooks on every decoder layer, for one scoring call: capture the stream at each read position after every
    layer, and apply patches at the read positions.

    Before a read forward the caller `arm`s the hooks with each row's read index in that forward's input, a key
    per row and the row's patch (or None); after it succeeds it calls `commit`, which files each row's capture
    [depths, hidden] (fp32, CPU) under its key in `captured`. A forward that fails (out of memory) leaves
    nothing filed: its half-batches are armed and committed again.
    """

    def __init__(self, model, capture: bool):
        self.model, self.capture = model, capture
        self.captured: dict[Hashable, torch.Tensor] = {}
        self._armed = None
        self._buf: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> "ReadHooks":
        layers = decoder_layers(self.model)
        self._handles.append(layers[0].register_forward_pre_hook(self._pre, with_kwargs=True))
        for i, layer in enumerate(layers, start=1):
            self._handles.append(layer.register_forward_hook(lambda m, a, out, i=i: self._post(i, out)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._armed = None

    def arm(self, read_idx: Sequence[int], keys: Sequence[Hashable], patches: Sequence[Patch | None]) -> None:
        self._armed = (list(read_idx), list(keys), list(patches))
        self._buf = {}

    def commit(self) -> None:
        if self._armed is None:
            return
        _, keys, _ = self._armed
        if self.capture:
            stack = torch.stack([self._buf[d].to("cpu") for d in range(len(self._buf))], dim=1)  # [B, depths, H]
            for row, key in enumerate(keys):
                self.captured[key] = stack[row]
        self._armed, self._buf = None, {}

    def _apply(self, depth: int, hidden: torch.Tensor) -> torch.Tensor | None:
        """The stream at `depth` with this forward's patches written in (None: unchanged), captured if asked."""
        if self._armed is None:
            return None
        read_idx, _, patches = self._armed
        changed = None
        for row, patch in enumerate(patches):
            if patch is not None and patch.depth == depth:
                if changed is None:
                    changed = hidden.clone()
                pos = read_idx[row] if patch.position is None else patch.position
                pos = list(pos) if isinstance(pos, tuple) else pos
                vector = patch.vector.to(changed.device, changed.dtype)
                changed[row, pos] = changed[row, pos] + vector if patch.add else vector
        h = hidden if changed is None else changed
        if self.capture:
            rows = torch.arange(h.shape[0], device=h.device)
            self._buf[depth] = h[rows, torch.tensor(read_idx, device=h.device)].detach().float()
        return changed

    def _pre(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        new = self._apply(0, hidden)
        if new is None:
            return None
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new}

    def _post(self, depth: int, out):
        hidden = out[0] if isinstance(out, tuple) else out
        new = self._apply(depth, hidden)
        if new is None:
            return None
        return (new, *out[1:]) if isinstance(out, tuple) else new


def patched_logits(model, ids: Sequence[int], patch: Patch) -> torch.Tensor:
    """Reference primitive: one prompt, full forward (no cache), with the stream at `patch.depth` and
    `patch.position` (None: the last token) replaced; fp32 logits [tokens, vocab]."""
    device = model.get_input_embeddings().weight.device
    with ReadHooks(model, capture=False) as hooks, torch.inference_mode():
        hooks.arm([len(ids) - 1], [0], [patch])
        out = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
        hooks.commit()
    return out.logits[0].float()


def streams(model, ids: Sequence[int]) -> torch.Tensor:
    """The residual stream of one prompt at every depth and position, from a plain forward (no cache): fp32 CPU
    [depths, tokens, hidden], depth numbered as in the module docstring (the last depth before the final norm)."""
    layers = decoder_layers(model)
    out: dict[int, torch.Tensor] = {}

    def keep(depth, hidden):
        out[depth] = hidden[0].detach().float().cpu()

    handles = [layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: keep(0, args[0] if args else kwargs["hidden_states"]), with_kwargs=True)]
    for i, layer in enumerate(layers, start=1):
        handles.append(layer.register_forward_hook(lambda m, a, o, i=i: keep(i, o[0] if isinstance(o, tuple) else o)))
    device = model.get_input_embeddings().weight.device
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([out[d] for d in range(len(out))])


def patched_reads(model, ids: Sequence[int], patches: Sequence[Patch], rows: int = 16) -> torch.Tensor:
    """Next-token logits at the last position of one prompt under each of `patches` (any depth, any positions):
    plain forwards of the prompt repeated `rows` at a time, each row its own patch; fp32 [len(patches), vocab]."""
    device = model.get_input_embeddings().weight.device
    last = len(ids) - 1
    out = []
    with ReadHooks(model, capture=False) as hooks, torch.inference_mode():
        for start in range(0, len(patches), rows):
            part = list(patches[start : start + rows])
            hooks.arm([last] * len(part), list(range(len(part))), part)
            batch = torch.tensor([list(ids)] * len(part), device=device)
            logits = model(input_ids=batch, use_cache=False, logits_to_keep=1).logits[:, -1]
            hooks.commit()
            out.append(logits.float().cpu())
    return torch.cat(out) if out else torch.empty(0)
