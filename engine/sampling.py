"""Sampling, declared once: the tempered/top-p next-token distribution (scoring reads it exactly,
generation draws from it) and the derivation of seeds from named parts.
"""

from __future__ import annotations

import hashlib

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
