"""Linear layers of CPU decoding through oneDNN, on weights packed once per `generate` call.

A decoding step multiplies a few dozen rows (one token per rollout) by every weight matrix. At that size
oneDNN's linear on a weight reordered in advance runs well ahead of `F.linear` (MKL) on this project's
2-core CPU: smollm2-135m at 72 rows, the output head at 136 against 74 GFLOP/s, a whole cascade decoding
step in a median 277 against 374 ms over 6 alternating runs. From a few hundred rows on (prefill, scoring)
the two run alike, so inputs with more than `PACKED_MAX_ROWS` rows keep `F.linear`. The products equal
`F.linear`'s within float rounding (tests/engine/test_packed.py, every tiny family).

Only plain `nn.Linear` modules of an fp32 model on the CPU are packed, not those with a forward of their own
(hooks) and not a model whose linear weights exceed `PACK_LIMIT_BYTES` (the packed copies would double
them for the duration). Where this torch has no oneDNN, nothing is packed.
"""

from __future__ import annotations

import contextlib

import torch

PACKED_CPU_LINEARS = True
"""CPU decoding runs its linear layers on packed oneDNN weights (False: `F.linear` everywhere; for checks)."""
PACKED_MAX_ROWS = 256
"""Inputs with more rows than this (prefill passes) keep `F.linear`, which is as fast there."""
PACK_LIMIT_BYTES = 2 * 2**30
"""A model whose linear weights take more than this is not packed."""
_PACK_BATCH_HINT = 64
"""The row count oneDNN packs the weights for (any row count can use them)."""


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def _forward(module: torch.nn.Linear, packed: torch.Tensor):
    weight, bias = module.weight, module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.numel() > PACKED_MAX_ROWS * x.shape[-1]:
            return torch.nn.functional.linear(x, weight, bias)
        return _linear(x, packed, bias)

    return forward


def _packable(model) -> list[torch.nn.Linear]:
    if not PACKED_CPU_LINEARS or not torch.backends.mkldnn.is_available():
        return []
    mods = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in m.__dict__]
    if not mods or any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in mods):
        return []
    if sum(m.weight.numel() * m.weight.element_size() for m in mods) > PACK_LIMIT_BYTES:
        return []
    return mods


@contextlib.contextmanager
def packed_linears(model):
    """For the duration, the model's linear layers run on packed oneDNN weights where that applies (see the
    module's docstring); their own forward comes back after, also on errors."""
    mods = _packable(model)
    try:
        with torch.no_grad():
            packed = [torch.ops.mkldnn._reorder_linear_weight(m.weight, _PACK_BATCH_HINT) for m in mods]
    except (RuntimeError, AttributeError):  # this build cannot pack: the layers stay as they are
        mods, packed = [], []
    for m, p in zip(mods, packed):
        m.forward = _forward(m, p)
    try:
        yield len(mods)
    finally:
        for m in mods:
            m.__dict__.pop("forward", None)
