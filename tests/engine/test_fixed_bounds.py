"""Batch limits on a GPU come from the device's total memory less the model's weights (and a fixed reserve), not
from the moment's free memory: the same for a run, its shards and its resumption (checked here with CUDA's memory
queries mocked, on CPU)."""

from types import SimpleNamespace

import torch

import engine.batching as batching
from tests.helpers import get_model


def test_limits_do_not_move_with_free_memory(monkeypatch):
    lm = get_model("tiny-llama3")
    free = {"bytes": 40 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2**30)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=2 * 2**30))
    cuda = torch.device("cuda")
    first = (batching.cache_token_limit(lm.model, cuda, 200_000), batching.generation_cache_limit(lm.model, cuda))
    free["bytes"] = 3 * 2**30  # earlier stages, cached blocks or another process
    assert (batching.cache_token_limit(lm.model, cuda, 200_000), batching.generation_cache_limit(lm.model, cuda)) == first
    per_token = batching.kv_bytes_per_token(lm.model)
    # 2 GiB less the CUDA context's reserve (1 GiB); the weights and the head are on the CPU here
    assert first == (int(0.25 * 2**30) // per_token, int(0.5 * 2**30) // per_token)
