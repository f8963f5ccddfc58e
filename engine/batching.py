"""Batching, declared once for scoring and generation: greedy token-budget batches, padding, default
bounds per device, key/value memory limits, and halving a batch that runs out of accelerator memory.
"""

from __future__ import annotations

import torch


def spread_over_devices(model) -> bool:
    """Whether a `device_map` put the model's modules on more than one device (its activations then move
    from device to device, and its last hidden states end on another device than its inputs)."""
    placement = getattr(model, "hf_device_map", None) or {}
    return len({str(d) for d in placement.values()}) > 1


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an accelerator out-of-memory error (CUDA's own type, or a backend's message)."""
    return isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def halving_on_oom(fn, batch: list, join, stats=None):
    """Run `fn(batch)`; when it runs out of memory, free cached memory and run each half instead.

    `join` combines the halves' results. A single item that still does not fit re-raises the error.
    `stats`, if given, counts the splits in its `oom_splits`.
    """
    try:
        return fn(batch)
    except RuntimeError as exc:
        if not is_out_of_memory(exc) or len(batch) < 2:
            raise
    if stats is not None:
        stats.oom_splits += 1
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    mid = len(batch) // 2
    return join(halving_on_oom(fn, batch[:mid], join, stats), halving_on_oom(fn, batch[mid:], join, stats))


def token_batches(items, cost, budget, context_budget, max_batch):
    """Greedy batches over sorted items: padded tokens <= budget, attended context <= context_budget."""
    batch, longest, widest = [], 0, 0
    for item in items:
        q, ctx = cost(item)
        new_longest, new_widest = max(longest, q), max(widest, ctx)
        size = len(batch) + 1
        if batch and (size * new_longest > budget or size * new_widest > context_budget or size > max_batch):
            yield batch
            batch, new_longest, new_widest = [], q, ctx
        batch.append(item)
        longest, widest = new_longest, new_widest
    if batch:
        yield batch


def pad_rows(rows, pad_id: int, device, left: bool = False):
    """Token rows as one padded batch: (ids, attention mask), right-padded (scoring reads each row's
    last real token) or left-padded (generation appends to every row at the same position)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids.to(device), mask.to(device)


# Default bounds per device: (padded tokens per forward pass, rows per forward pass). Scoring runs prompts
# once each; generation keeps a batch's rows for the whole decode, so its CPU token budget is larger
# (prefill is a small share of its work) and its row bound applies to rows x rollouts. On CPU a decoding
# step's matrix products run faster per row with more rows: the generation of `make readout`'s J stage on
# its first 5 scenarios (40 prompts x 3 rollouts) took 40.8-43.3 s in one batch of up to 128 rows and
# 45.6-47.1 s in batches of up to 64 (smollm2, back-to-back runs).
DEFAULT_BOUNDS = {
    "score": {"cuda": (32768, 256), "cpu": (2048, 64)},
    "generate": {"cuda": (32768, 512), "cpu": (4096, 128)},
}


def default_bounds(path: str, device: torch.device) -> tuple[int, int]:
    """(token budget, max rows) for `path` ("score" or "generate") on `device`."""
    return DEFAULT_BOUNDS[path]["cuda" if device.type == "cuda" else "cpu"]


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token occupies in the model's cache (all layers)."""
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", 1)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    itemsize = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * itemsize


CUDA_CONTEXT_RESERVE = 1 << 30
"""Bytes of a CUDA device that PyTorch's allocator never holds (the CUDA context, the cuBLAS and attention kernels'
workspaces): left out of `usable_memory`, so that the memory bounds are shares of what caches can actually take."""


def usable_bytes(total: int, weights: int, head_copy: int) -> int:
    """Bytes of a CUDA device of `total` bytes left for caches and activations beside `weights` bytes of weights, the
    fp32 copy of the head the letter reads keep (`head_copy` bytes, engine.head.head_copy_bytes) and the
    CUDA_CONTEXT_RESERVE."""
    return max(0, total - weights - head_copy - CUDA_CONTEXT_RESERVE)


def usable_memory(model, device: torch.device) -> int:
    """Bytes of a CUDA device left for caches and activations (`usable_bytes`): its total memory less the model's
    weights on it, the fp32 copy of its head and the CUDA context's reserve.

    Fixed for a given GPU model and checkpoint, unlike the moment's free memory (which PyTorch's cached blocks,
    earlier stages and other processes move): batch limits derived from it are the same for a single-process
    run, its shards and a resumed run, so their batches, and bf16 results, are too. A batch that does not fit
    after all (another process on the GPU) is halved and retried."""
    return usable_bytes(*device_memory(model, device))


def device_memory(model, device: torch.device) -> tuple[int, int, int]:
    """(total bytes of CUDA `device`, bytes of `model`'s weights on it, bytes of its fp32 head copy there)."""
    from engine.head import head_copy_bytes

    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type == "cuda" and p.device.index == index)
    return total, weights, head_copy_bytes(model, torch.device("cuda", index))


def cache_token_limit(model, device: torch.device, budget: int, longest: int = 1) -> int:
    """Tokens of keys/values held at once (cached prefix-tree nodes of a wave, or one batch's assembled
    prefixes): 4x the token budget, and on CUDA at most what a quarter of the usable memory holds, even below the
    budget. A forward pass holds at least one sequence's keys/values whole (`longest` tokens, the longest the caller
    runs): a quarter that holds fewer raises DeviceMemoryError instead of running past the device's memory."""
    limit = 4 * budget
    if device.type == "cuda":
        usable = usable_memory(model, device)
        cap = int(0.25 * usable) // kv_bytes_per_token(model)
        if cap < longest:
            from engine.errors import DeviceMemoryError

            raise DeviceMemoryError(
                f"{device}: a sequence of {longest:,} tokens needs its keys/values held at once, a quarter of the "
                f"{usable / 2**30:.1f} GiB left for caches (beside the weights, the fp32 head and the CUDA context) holds "
                f"{cap:,} (shorter prompts, or a device with more memory)")
        limit = min(limit, cap)
    return limit


GENERATION_CACHE_SHARE = 0.5
"""Share of a CUDA device's usable memory one generation batch's keys/values may take (`--plan` uses it too)."""


def generation_cache_limit(model, device: torch.device) -> int | None:
    """Tokens of keys/values one generation batch may allocate (engine.generation's batches count them as its
    decode state allocates them: each distinct prompt padded to the longest, and every row, padded to its
    power-of-two bucket on the static path, with an own buffer of the longest budget): on CUDA half the usable
    memory; None (unbounded) elsewhere."""
    if device.type != "cuda":
        return None
    return int(GENERATION_CACHE_SHARE * usable_memory(model, device)) // kv_bytes_per_token(model)
