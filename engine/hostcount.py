"""Counting the host's work: the aten operations a stretch of code issues (each one a kernel launch on an
accelerator) and the points where the host would wait for the device (scalar reads, device-to-host copies,
operations whose output shape depends on the data). Counted on any device, CPU included, so the decode
loop's host overhead is measured where no GPU is at hand (bench/host_bench.py) and a test can check that a
loop issues no synchronization between its checks.

Views (reshapes, slices, transposes) launch nothing and are counted apart. What counts as a sync:
- `scalar_read`: `.item()`, `bool(t)`, `int(t)`, `float(t)` (aten._local_scalar_dense; under inference_mode
  that op reaches no dispatch mode, so these are caught at the Python level too, each counted once);
- `data_shape`: nonzero, masked_select, boolean-mask indexing, unique and the like (the host must learn the
  output's size);
- `to_host`: `.tolist()`, `.cpu()`, `.numpy()`, `.to("cpu")` with the device named as a string (on CUDA a device-to-host copy; on CPU these
  dispatch no aten op, so they are caught at the Python level).
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_DATA_SHAPE = frozenset({"nonzero", "nonzero_static", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
                         "unique_consecutive", "argwhere", "masked_scatter"})
_IGNORED = frozenset({"lift_fresh", "detach", "alias"})


class HostCounter(TorchDispatchMode):
    """Counts aten operations (`ops`: non-view, `views`) and host synchronizations (`syncs`, by kind) issued
    inside its `with` block. `ops_by_name` names the operations (for reading a profile)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.views = 0
        self.syncs: collections.Counter = collections.Counter()
        self.ops_by_name: collections.Counter = collections.Counter()

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if func.is_view or name in _IGNORED:
            self.views += 1
        else:
            self.ops += 1
            self.ops_by_name[name] += 1
        if name == "_local_scalar_dense":
            if not self._in_python:  # already counted where Python asked for it
                self.syncs["scalar_read"] += 1
        elif name in _DATA_SHAPE:
            self.syncs["data_shape"] += 1
        elif name in ("index", "index_put", "index_put_") and _has_bool_index(args):
            self.syncs["data_shape"] += 1
        elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) == 1:
            self.syncs["data_shape"] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        self._patches = contextlib.ExitStack()
        self._patches.__enter__()
        self._in_python = 0
        for method in ("tolist", "cpu", "numpy"):
            self._patches.enter_context(_patched(method, self._count("to_host")))
        self._patches.enter_context(_patched("to", self._count("to_host"), only_if=_targets_host))
        # Under inference_mode a scalar read reaches no dispatch mode: it is caught where Python asks for it.
        for method in ("item", "__bool__", "__int__", "__float__", "__index__"):
            self._patches.enter_context(_patched(method, self._count("scalar_read")))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._patches.__exit__(None, None, None)

    def _count(self, kind: str):
        counter = self

        @contextlib.contextmanager
        def counted():
            if not counter._in_python:
                counter.syncs[kind] += 1
            counter._in_python += 1
            try:
                yield
            finally:
                counter._in_python -= 1
        return counted


def _has_bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()) if i is not None)


def _targets_host(tensor, *args, **kwargs) -> bool:
    # Only an explicit "cpu": model code moves tensors with `.to(x.device)`, which on CPU names the host too but
    # is no copy on an accelerator.
    target = kwargs.get("device", args[0] if args else None)
    return isinstance(target, str) and target.split(":")[0] == "cpu"


@contextlib.contextmanager
def _patched(method: str, count, only_if=None):
    original = getattr(torch.Tensor, method)

    def wrapper(self, *args, **kwargs):
        if only_if is not None and not only_if(self, *args, **kwargs):
            return original(self, *args, **kwargs)
        with count():
            return original(self, *args, **kwargs)

    setattr(torch.Tensor, method, wrapper)
    try:
        yield
    finally:
        setattr(torch.Tensor, method, original)
