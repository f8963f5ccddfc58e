"""The tuned lens: one affine translator per depth, trained so that the final norm and head applied to the
translated stream give the model's own next-token distribution (Belrose et al., 2023, "Eliciting Latent
Predictions from Transformers with the Tuned Lens").

At depth d < L (engine/residuals.py numbers depths 0..L) the translator maps the stream h to
h + A_d h + b_d; depth L is the stream the model itself turns into logits and is left as it is. With A and b at
zero the tuned lens is the logit lens, which is where training starts. The loss is the KL divergence of the
lens's distribution from the final layer's, KL(p_L || q_d) over the full vocabulary, summed over depths and
averaged over training positions; the head runs in fp32 as in the logit lens.

Generic: it takes token sequences, not texts, panels or frames; readouts/lens.py chooses what it is trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from engine.errors import ReadoutError
from engine.residuals import decoder_layers, final_norm, lens_logits, n_depths

LENS_FORMAT = 1
"""The version of the lens file's layout (a safetensors file: `delta` [L, H, H], `bias` [L, H]; metadata `meta`)."""


@dataclass
class TunedLens:
    """Translators for depths 0..L-1 (`delta[d]`: A_d, `bias[d]`: b_d) and what they were trained on (`meta`)."""

    delta: torch.Tensor
    bias: torch.Tensor
    meta: dict = field(default_factory=dict)

    @classmethod
    def identity(cls, hidden: int, layers: int) -> "TunedLens":
        """The logit lens written as a tuned lens (every translator zero)."""
        return cls(torch.zeros(layers, hidden, hidden), torch.zeros(layers, hidden))

    @property
    def layers(self) -> int:
        return self.delta.shape[0]

    def translate(self, residuals: torch.Tensor) -> torch.Tensor:
        """Streams [..., depths, hidden] (all L + 1 depths, fp32) -> the translated streams (depth L unchanged)."""
        if residuals.shape[-2] != self.layers + 1:
            raise ValueError(f"tuned lens of {self.layers} layers: streams of {residuals.shape[-2]} depths given")
        h = residuals[..., :-1, :].float()
        moved = h + torch.einsum("...dh,dkh->...dk", h, self.delta) + self.bias
        return torch.cat([moved, residuals[..., -1:, :].float()], dim=-2)

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"delta": self.delta.contiguous(), "bias": self.bias.contiguous()}, str(path),
                  metadata={"meta": json.dumps({**self.meta, "format": LENS_FORMAT}, sort_keys=True)})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TunedLens":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise ReadoutError(f"--lens: {path}: no such file (make one with `readout lens train`)")
        try:
            with safe_open(str(path), "pt") as f:
                meta = json.loads((f.metadata() or {}).get("meta", "{}"))
                delta, bias = f.get_tensor("delta"), f.get_tensor("bias")
        except Exception as exc:  # a file that is not a lens: one line naming it
            raise ReadoutError(f"--lens: {path}: not a tuned-lens file ({type(exc).__name__}: {exc})") from None
        if meta.get("format") != LENS_FORMAT or delta.ndim != 3 or bias.shape != delta.shape[:2]:
            raise ReadoutError(f"--lens: {path}: format {meta.get('format')!r}, delta {tuple(delta.shape)}, "
                               f"bias {tuple(bias.shape)}: not a format-{LENS_FORMAT} tuned lens")
        return cls(delta.float(), bias.float(), meta)

    def check_fits(self, model, model_meta: dict, path) -> None:
        """Refuse (one line naming the file and field) a lens trained for another model or shape."""
        cfg = model.config
        if (self.layers, self.delta.shape[-1]) != (cfg.num_hidden_layers, cfg.hidden_size):
            raise ReadoutError(f"--lens: {path}: {self.layers} layers x {self.delta.shape[-1]} hidden, the model has "
                               f"{cfg.num_hidden_layers} x {cfg.hidden_size}")
        trained = self.meta.get("model", {})
        for key, value in model_meta.items():
            if trained.get(key) != value:
                raise ReadoutError(f"--lens: {path}: model.{key} is {trained.get(key)!r}, this run's is {value!r} "
                                   f"(a lens is trained for one model: `readout lens train`)")


def capture_streams(model, seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """The stream at every depth and position of each sequence, plain forwards one at a time (no cache):
    [positions, depths, hidden] fp32 on CPU, sequences concatenated."""
    layers = decoder_layers(model)
    device = model.get_input_embeddings().weight.device
    seen: dict[int, torch.Tensor] = {}

    def keep(depth):
        def hook(module, args, kwargs=None, out=None):
            h = out if out is not None else (args[0] if args else kwargs["hidden_states"])
            seen[depth] = (h[0] if isinstance(h, tuple) else h)[0].detach().float().cpu()
        return hook

    handles = [layers[0].register_forward_pre_hook(lambda m, a, k: keep(0)(m, a, k), with_kwargs=True)]
    handles += [layer.register_forward_hook(lambda m, a, o, d=d: keep(d)(m, a, None, o)) for d, layer in enumerate(layers, 1)]
    out = []
    try:
        with torch.inference_mode():
            for ids in seqs:
                seen.clear()
                model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False, logits_to_keep=1)
                out.append(torch.stack([seen[d] for d in range(len(layers) + 1)], dim=1))
    finally:
        for h in handles:
            h.remove()
    return torch.cat(out)


def kl_to_final(model, streams: torch.Tensor, lens: TunedLens | None = None, chunk: int = 8) -> torch.Tensor:
    """KL(p_L || q_d) in nats at every depth d of each position ([positions, depths] fp64): p_L the model's own
    distribution (the logit lens at depth L), q_d the logit lens (lens None) or the tuned lens at depth d."""
    out = []
    for start in range(0, streams.shape[0], chunk):
        part = streams[start : start + chunk]
        if lens is not None:
            part = lens.translate(part)
        logp = lens_logits(model, part).double().log_softmax(-1)  # [n, depths, vocab]
        final = logp[:, -1:, :]
        out.append((final.exp() * (final - logp)).sum(-1).cpu())
    return torch.cat(out)


def _normed(norm, x: torch.Tensor) -> torch.Tensor:
    """The final norm in its own dtype, as the model applies it (gradients flow to the translators only)."""
    param = next(norm.parameters(), None)
    return norm(x.to(param.dtype if param is not None else x.dtype)).float()


def train_lens(model, streams: torch.Tensor, *, steps: int, lr: float = 1e-3, batch: int = 32, seed: int = 0,
               progress: Callable[[int, float], None] | None = None) -> tuple[TunedLens, list[float]]:
    """Translators trained on `streams` ([positions, depths, hidden], capture_streams) with Adam, `batch` positions
    per step drawn by a seeded generator; returns the lens and the loss (mean over positions of the KL summed over
    depths 0..L-1) at every step. The model is not changed."""
    if streams.ndim != 3 or streams.shape[1] != n_depths(model):
        raise ValueError(f"streams of shape {tuple(streams.shape)}: need [positions, {n_depths(model)}, hidden]")
    from engine.head import head_fp32

    positions, depths, hidden = streams.shape
    weight, bias = head_fp32(model)
    weight, bias = weight.detach(), None if bias is None else bias.detach()
    device = weight.device  # the translators train beside the head; the streams stay on the host
    norm = final_norm(model)
    frozen = [(p, p.requires_grad) for p in norm.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    delta = torch.zeros(depths - 1, hidden, hidden, device=device, requires_grad=True)
    shift = torch.zeros(depths - 1, hidden, device=device, requires_grad=True)
    opt = torch.optim.Adam([delta, shift], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    try:
        for step in range(steps):
            idx = torch.randint(0, positions, (min(batch, positions),), generator=gen)
            h = streams[idx, :-1].to(device)  # [b, L, H]
            moved = h + torch.einsum("bdh,dkh->bdk", h, delta) + shift
            logq = torch.nn.functional.linear(_normed(norm, moved), weight, bias).log_softmax(-1)
            with torch.no_grad():
                last = _normed(norm, streams[idx, -1].to(device))
                target = torch.nn.functional.linear(last, weight, bias).log_softmax(-1)[:, None, :]
            loss = (target.exp() * (target - logq)).sum(-1).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if progress is not None:
                progress(step, losses[-1])
    finally:
        for p, grad in frozen:
            p.requires_grad_(grad)
    return TunedLens(delta.detach().cpu().clone(), shift.detach().cpu().clone()), losses
