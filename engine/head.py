"""The model's output head as the readouts apply it: its weight in fp32, and whether the model changes the head's
logits (soft-capping, a logit scale), which the plain-head read and the lenses refuse to reproduce."""

from __future__ import annotations

import torch


def head_scaling(cfg) -> str | None:
    """The config field by which a model changes its head's logits (soft-capping, a logit scale), or None: with
    None the logits are the final norm's output times the head's weight (plus bias)."""
    return next((a for a in ("final_logit_softcapping", "logit_scale") if getattr(cfg, a, None) not in (None, 1.0)), None)


def head_fp32(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output head's weight (and bias) in fp32, for reading letters at full precision from a bf16/fp16
    model: logits of 16-32 have a bf16 step of 0.125, enough to move a letter's probability by several percent.
    An fp32 model's own weight is returned as is; otherwise one fp32 copy is kept per model, rebuilt if the
    head's weight changes (another tensor, or written in place)."""
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if weight.dtype == torch.float32:
        return weight, bias
    key = (weight.data_ptr(), weight._version, str(weight.device))
    cached = getattr(model, "_readout_head_fp32", None)
    if cached is None or cached[0] != key:
        # Made outside inference mode even when the first read runs inside it: the lens trainer
        # (engine/tuned_lens.py) uses the same copy with autograd, which cannot save an inference tensor.
        with torch.inference_mode(False), torch.no_grad():
            cached = (key, weight.float(), None if bias is None else bias.float())
        model._readout_head_fp32 = cached
    return cached[1], cached[2]


def head_copy_bytes(model, device: torch.device) -> int:
    """Bytes of the fp32 copy of the head that `head_fp32` keeps on `device` (0 for an fp32 head, read as is, and
    for a head on another device)."""
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if weight.dtype == torch.float32 or weight.device != device:
        return 0
    return 4 * (weight.numel() + (0 if bias is None else bias.numel()))
