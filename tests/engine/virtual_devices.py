"""A mocked multi-GPU placement on CPU: tensors "on cuda:k" are CPU tensors tagged k, and an operation that
mixes two tags fails the way CUDA does ("Expected all tensors to be on the same device"). Untagged tensors
(ordinary CPU ones: host-side indices, untouched buffers) mix with any tag, as CPU indices and scalars do on
CUDA. `place(model, split)` puts the embeddings and the first `split` decoder layers on cuda:0 and the rest
(the last layers, the final norm, the head) on cuda:1, with pre-forward hooks that move each module's inputs
to its device (what accelerate's hooks do under `device_map="auto"`), and records `hf_device_map`."""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

TAG = "_virtual_cuda"


def tag_of(t):
    return getattr(t, TAG, None) if isinstance(t, torch.Tensor) else None


def _tagged(t: torch.Tensor, index: int | None) -> torch.Tensor:
    if index is None:
        return t
    if tag_of(t) is not None and tag_of(t) != index:
        t = t.view_as(t)  # a new tensor object: the old one stays where it was
    setattr(t, TAG, index)
    return t


def _on_host(t: torch.Tensor) -> torch.Tensor:
    if tag_of(t) is None:
        return t
    out = t.view_as(t)  # a new tensor object, untagged
    with contextlib.suppress(AttributeError):
        delattr(out, TAG)
    return out


def _cuda_index(device) -> int | None:
    if device is None:
        return None
    d = torch.device(device) if isinstance(device, (str, int)) and not isinstance(device, bool) else device
    if isinstance(d, torch.device) and d.type == "cuda":
        return d.index or 0
    return None


class VirtualCuda(TorchFunctionMode):
    """Within this mode, cuda devices are virtual (see the module's docstring)."""

    def __init__(self):
        super().__init__()
        self.mixed: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == torch.Tensor.device.__get__:
            tag = tag_of(args[0])
            return torch.device("cuda", tag) if tag is not None else func(*args)
        if func == torch.Tensor.is_cuda.__get__:
            return tag_of(args[0]) is not None
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            return self._to(func, args, kwargs)
        if func is torch.Tensor.cpu:
            return _on_host(args[0])
        target = _cuda_index(kwargs.get("device"))
        if target is not None:  # a factory (arange, zeros, tensor, ...) asked for a cuda device
            kwargs["device"] = "cpu"
        tags = {tag_of(t) for t in tree_flatten((args, kwargs))[0]} - {None}
        if func is torch.Tensor.copy_:  # copies cross devices on CUDA too; the destination keeps its place
            tags = {tag_of(args[0])} - {None}
        if len(tags) > 1:
            message = ("Expected all tensors to be on the same device, but found at least two devices, "
                       + " and ".join(f"cuda:{t}" for t in sorted(tags)) + f" ({getattr(func, '__name__', func)})")
            self.mixed.append(message)
            raise RuntimeError(message)
        out = func(*args, **kwargs)
        where = target if target is not None else (next(iter(tags)) if tags else None)
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__", "__iadd__", "__isub__",
                                                                          "__imul__", "__itruediv__", "__ior__", "__iand__"):
            return out  # in place: the tensor keeps its own tag
        return tree_map(lambda t: _tagged(t, where) if isinstance(t, torch.Tensor) else t, out)

    def _to(self, func, args, kwargs):
        t, rest = args[0], list(args[1:])
        if func is torch.Tensor.cuda:
            where = rest[0] if rest else kwargs.pop("device", 0)
            return _tagged(t.view_as(t), _cuda_index(torch.device("cuda", where) if isinstance(where, int) else where))
        where = tag_of(t)
        moved = False
        for i, a in enumerate(rest):
            if isinstance(a, torch.Tensor):
                rest[i], where, moved = a.dtype, tag_of(a), True
            elif isinstance(a, (str, torch.device)):
                index = _cuda_index(a)
                rest[i], where, moved = "cpu", index, True
        if "device" in kwargs:
            where, moved = _cuda_index(kwargs["device"]), True
            kwargs["device"] = "cpu"
        out = func(t, *rest, **kwargs)
        if moved and where is None:
            return _on_host(out)
        return _tagged(out, where)


def _move_inputs(index: int):
    def hook(module, args, kwargs):
        move = lambda t: _tagged(t.view_as(t), index) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return tree_map(move, args), tree_map(move, kwargs)

    return hook


def place(model, split: int) -> list:
    """Mock `device_map`: layers [0, split) and the embeddings on cuda:0, the rest on cuda:1. Returns the hooks."""
    base = model.base_model
    layers = base.layers
    head = model.get_output_embeddings()
    tied = head.weight is base.embed_tokens.weight  # accelerate keeps tied weights together, with the embeddings
    where = {"embed_tokens": 0, "norm": 1, "rotary_emb": 0}
    modules = [(base.embed_tokens, 0), (base.norm, 1), (head, 0 if tied else 1)]
    modules += [(layer, 0 if i < split else 1) for i, layer in enumerate(layers)]
    hooks = []
    for module, index in modules:
        for p in module.parameters(recurse=True):
            setattr(p, TAG, index)
        hooks.append(module.register_forward_pre_hook(_move_inputs(index), with_kwargs=True))
    prefix = next(n for n, m in model.named_modules() if m is base)
    model.hf_device_map = {f"{prefix}.{k}": v for k, v in where.items()}
    model.hf_device_map.update({f"{prefix}.layers.{i}": 0 if i < split else 1 for i in range(len(layers))})
    model.hf_device_map["lm_head"] = 0 if tied else 1
    return hooks


@contextlib.contextmanager
def placed(model, split: int):
    """The model under the mocked placement, and the mode that enforces it, for the duration."""
    hooks = place(model, split)
    mode = VirtualCuda()
    try:
        with mode:
            yield mode
    finally:
        for h in hooks:
            h.remove()
        del model.hf_device_map
        for p in model.parameters():
            with contextlib.suppress(AttributeError):
                delattr(p, TAG)
