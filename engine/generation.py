"""Generation: batched decoding with n rollouts per prompt, greedy or seeded sampling (temperature, top-p),
token budgets and stop-at-end-of-turn. The anchor rule that turns a generated text into a read position
lives in engine/anchor.py.

A batch's rows (prompt x rollout) step together through engine/decode.py's state: each distinct prompt's
keys/values once (prompts sharing a prefix prefill it once), each row's own tokens in a preallocated buffer,
finished rows compacted out. The next token is chosen on the device for all rows at once: argmax for greedy
rows, and for sampled ones a draw from the tempered top-p nucleus (engine/sampling.py) at a counter-based
uniform keyed by (prompt seed, rollout index, step), so a rollout's tokens do not depend on which other
prompts share its batch, on the batch size, or on compaction. The host looks at the batch only every few
steps (engine/steps.py: which rows ended, compaction), reading nothing back in between; on CUDA the steps run
with static shapes, one captured graph per row-count bucket. On CPU the steps' linear layers run on packed
oneDNN weights (engine/packed.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from engine.batching import default_bounds, generation_cache_limit, halving_on_oom, kv_bytes_per_token, pad_rows
from engine.decode import Cascade, bucket, supports_cascade
from engine.dense_decode import Dense
from engine.packed import packed_linears
from engine.rowcache import default_limit
from engine.sampling import derive_seed, tempered_distribution
from engine.steps import decode_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollout:
    """One generated continuation."""

    tokens: tuple[int, ...]
    """Generated token ids, without the stop token."""
    stopped: bool
    """True when the model ended its turn (a stop token) within the budget."""
    greedy: bool
    """True for the greedy rollout, False for a sampled one."""


def stop_token_ids(tokenizer, model=None) -> frozenset[int]:
    """End-of-turn tokens: the tokenizer's EOS, the generation config's EOS ids, and known turn-end tokens."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    vocab = tokenizer.get_vocab()
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
        if tok in vocab:
            ids.add(vocab[tok])
    return frozenset(ids)


STATIC_ON = {"cuda": True}
"""Devices whose batches decode with static shapes by default (CUDA graphs); elsewhere dynamic shapes (on CPU
they are faster: no padded rows, no masked slots)."""
CHECK_EVERY = {"cuda": 8, "cpu": 1}
"""Steps between the host's looks at a batch, per device: on an accelerator the steps in between queue without
waiting for it (a finished row steps up to this many times more for nothing); on CPU a look costs nothing."""


def generate(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | Sequence[int],
    stop_ids: frozenset[int],
    n: int = 1,
    greedy_first: bool = False,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seeds: Sequence[int] | None = None,
    pad_id: int = 0,
    token_budget: int | None = None,
    max_rows: int | None = None,
    on_batch=None,
    prefix_kv: dict | None = None,
    static_shapes: bool | None = None,
    compact: bool = True,
    length_of: Sequence[int | None] | None = None,
    row_kv=None,
    check_every: int | None = None,
    batches: list | None = None,
    on_rollouts=None,
) -> list[list[Rollout]]:
    """Generate `n` rollouts for each prompt (token ids); returns, per prompt, its rollouts in order.

    With `greedy_first`, rollout 0 is greedy and the others sample at `temperature`/`top_p`; otherwise all
    rollouts sample (or all are greedy when temperature is 0). `seeds[i]` seeds prompt i's rollouts: rollout j
    draws its step-t token from the t-th uniform of a counter-based stream keyed by derive_seed(seeds[i], j),
    so it is the same whatever else shares its batch (up to a draw that lands within the rounding of differently
    shaped batches of a token's edge: docs/tables.md, "Seeds of generated rollouts").
    `token_budget` bounds padded prompt tokens per prefill forward pass; `max_rows` bounds rows decoded together.
    `on_batch(k)` is called with the number of prompts finished after each batch (for progress bars).
    `prefix_kv`, if given a dict, receives each prompt's keys/values ({prompt tuple: [(k, v) per layer]}), so
    that reading letters after the generated text need not run the prompt again (`score_ids(..., known_prefixes=...)`).
    `static_shapes` decodes every step with the same tensor shapes and buffers, the rows padded to a bucket (a
    power of two) that compaction moves down (on CUDA each bucket's step is captured once and replayed as a CUDA
    graph); None: on CUDA for the cascade backend (STATIC_ON), dynamic shapes elsewhere. `compact=False` keeps
    finished rows in the batch (for checks).
    `length_of[i] = k` ties prompt i's rollouts to prompt k's: rollout j of prompt i is generated to exactly
    the length of rollout j of prompt k (its stop tokens are masked out while it runs, and it ends at the
    step k's rollout ends, with as many tokens), or to its own budget if that is shorter. Such a rollout is
    never `stopped`. Prompt k must not itself be tied; a tied pair always decodes in one batch.
    `row_kv`, an engine.rowcache.RowCaches, receives each finished row's own keys/values (and, as with
    `prefix_kv`, its prompt's), up to its memory limit, so that reading after the anchor runs only what follows
    them (`score_ids(..., known_prefixes=row_kv)`). The cascade backend only: the dense fallback holds none.
    `check_every`: the host looks at the batch (rows ended, compaction) every this many steps, none in between
    (engine/steps.py); None: CHECK_EVERY for the device. The rollouts are the same for any value.
    `batches`, if given a list, receives each decoded batch's `batch_shape` (rows, distinct prompt tokens, longest
    budget) in the order decoded (a batch halved on out-of-memory as its halves), as `plan_batches` forms them.
    `on_rollouts(indices, rollouts)`, if given, is called after each batch with its prompts' indices and their
    rollouts, before the next batch decodes: the caller can read the batch's rows there, on `row_kv` while it holds
    them, and `row_kv.release` them, so that the rows' caches hold one batch at a time.
    """
    budgets, leaders = checked_request(prompts, max_new_tokens, n, length_of)
    device = model.get_input_embeddings().weight.device
    bounds = batch_bounds(model, device, token_budget, max_rows)
    token_budget, max_rows, cascade = bounds.token_budget, bounds.max_rows, bounds.cascade
    static_shapes = _static(static_shapes, cascade, device)
    bounds = replace(bounds, static=static_shapes)
    if row_kv is not None:
        prefix_kv = row_kv if prefix_kv is None else prefix_kv
        if row_kv.limit_bytes is None:
            row_kv.limit_bytes = default_limit(model, device)
    settings = _Decode(stop_ids, n, greedy_first, temperature, top_p, pad_id, device, prefix_kv, token_budget, max_rows,
                       cascade, static_shapes, compact, row_kv if cascade else None,
                       check_every or CHECK_EVERY["cuda" if device.type == "cuda" else "cpu"])
    seeds = list(seeds) if seeds is not None else [0] * len(prompts)
    out: list[list[Rollout] | None] = [None] * len(prompts)
    with packed_linears(model):  # CPU decoding steps on packed weights (engine/packed.py)
        for batch in plan_batches([len(p) for p in prompts], budgets, n, bounds, leaders):
            def decode(b):
                flat = [i for u in b for i in u]
                pos = {i: k for k, i in enumerate(flat)}
                done = _generate_batch(model, [prompts[i] for i in flat], [seeds[i] for i in flat],
                                       [budgets[i] for i in flat], settings,
                                       [None if leaders[i] is None else pos[leaders[i]] for i in flat])
                if batches is not None:
                    batches.append(batch_shape(prompts, budgets, n, flat))
                return done
            flat = [i for u in batch for i in u]
            for i, rollouts in zip(flat, halving_on_oom(decode, batch, lambda a, b: a + b)):
                out[i] = rollouts
            if on_rollouts is not None:
                on_rollouts(flat, [out[i] for i in flat])
            if on_batch is not None:
                on_batch(len(flat))
    return out


def _static(asked: bool | None, cascade: bool, device) -> bool:
    """Whether a batch decodes with static shapes; a fallback to dynamic shapes is logged."""
    wanted = STATIC_ON.get(device.type, False) if asked is None else asked
    if wanted and not cascade:
        log.warning("decoding with dynamic shapes: this model runs on the dense fallback, which has no static path")
        return False
    return wanted


def checked_request(prompts, max_new_tokens, n: int, length_of) -> tuple[list[int], list[int | None]]:
    """A generation request's budgets (one per prompt) and ties (`_check_ties`); ValueError for a budget or `n`
    below 1 or an empty prompt. Shared by every generator (engine/vllm_generation.py too)."""
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts) or min(budgets, default=1) < 1 or n < 1:
        raise ValueError("max_new_tokens (one per prompt, or one for all) and n must be >= 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt has no tokens")
    return budgets, _check_ties(length_of, len(prompts))


def _check_ties(length_of, count: int) -> list[int | None]:
    """`length_of` as a list (None: untied); ValueError unless each names another, untied prompt."""
    if length_of is None:
        return [None] * count
    leaders = list(length_of)
    if len(leaders) != count:
        raise ValueError("length_of needs one entry per prompt")
    for i, k in enumerate(leaders):
        if k is not None and not (0 <= k < count and k != i and leaders[k] is None):
            raise ValueError(f"length_of[{i}] = {k}: must name another prompt that is not tied itself")
    return leaders


@dataclass(frozen=True)
class BatchBounds:
    """What bounds one generation batch (`plan_batches`): padded prompt tokens per prefill pass (the dense
    fallback's), rows decoded together, key/value tokens held (None: unbounded), and the backend."""

    token_budget: int
    max_rows: int
    kv_limit: int | None
    cascade: bool = True
    row_cache_bytes: int | None = None
    """What the rows' own caches may hold for the reads after the anchor (`row_kv`'s default limit; 0: none,
    the dense fallback; None: unbounded)."""
    kv_bytes_per_token: int = 0
    """Keys/values of one token, all layers (for `row_cache_bytes`)."""
    static: bool = False
    """Whether the batches decode with static shapes (the cascade backend's rows padded to their bucket)."""


def batch_bounds(model, device, token_budget: int | None = None, max_rows: int | None = None) -> BatchBounds:
    """The bounds `generate` decodes `model` with on `device` (defaults: engine.batching's for the device)."""
    default_budget, default_rows = default_bounds("generate", device)
    cascade = supports_cascade(model)
    return BatchBounds(token_budget or default_budget, max_rows or default_rows, generation_cache_limit(model, device),
                       cascade, default_limit(model, device) if cascade else 0, kv_bytes_per_token(model),
                       cascade and STATIC_ON.get(device.type, False))


def plan_batches(lengths: Sequence[int], budgets: Sequence[int], n: int, bounds: BatchBounds, leaders=None) -> list:
    """The decoding batches `generate` forms for prompts of `lengths` tokens with `budgets` new tokens and `n`
    rollouts each: lists of units (a prompt with the prompts tied to it, `leaders` as `_check_ties` returns them,
    kept together through batching and out-of-memory halving), the units in order of their longest prompt. Used
    by `generate` itself and by `--plan` (readouts/gap/plan.py), so the plan's batches are the run's."""
    leaders = leaders if leaders is not None else [None] * len(lengths)
    units = {i: [i] for i in range(len(lengths)) if leaders[i] is None}
    for f in (f for f, k in enumerate(leaders) if k is not None):
        units[leaders[f]].append(f)
    ordered = sorted(units.values(), key=lambda u: max(lengths[i] for i in u))
    return list(_batches(ordered, lengths, budgets, n, bounds))


def batch_shape(prompts, budgets, n: int, members) -> tuple[int, int, int]:
    """(rows, distinct prompt tokens, longest budget) of a batch of prompts `members` (indices into `prompts`)."""
    distinct = dict.fromkeys(tuple(prompts[i]) for i in members)
    return len(members) * n, sum(map(len, distinct)), max(budgets[i] for i in members)


def _batches(units, lengths, budgets, n, bounds: BatchBounds):
    """Units of prompts (in order) cut into decoding batches, never splitting a unit. Rows are bounded by `max_rows`
    and keys/values by `kv_limit`, counted as the decode state allocates them: the cascade backend holds each prompt
    once (padded to the longest) and each row's own buffer of the longest budget, the rows padded to their bucket with
    static shapes (engine/decode.py); the dense fallback holds a left-padded copy of the prompt per row and prefills the
    whole batch in one pass."""
    batch: list[list[int]] = []
    for unit in units:
        members = [i for u in batch for i in u] + unit
        width = max(lengths[i] for i in members)
        rows = len(members) * n
        longest = max(budgets[i] for i in members)
        if bounds.cascade:
            held = len(members) * width + (bucket(rows) if bounds.static else rows) * longest
            fits = rows <= bounds.max_rows
        else:
            held = rows * (width + longest)
            fits = rows <= bounds.max_rows and len(members) * width <= bounds.token_budget
        if batch and not (fits and (bounds.kv_limit is None or held <= bounds.kv_limit)):
            yield batch
            batch = []
        batch = batch + [unit]
    if batch:
        yield batch


@dataclass(frozen=True)
class _Decode:
    """What every batch of one `generate` call decodes with (see `generate` for each field)."""

    stop_ids: frozenset[int]
    n: int
    greedy_first: bool
    temperature: float
    top_p: float
    pad_id: int
    device: torch.device
    prefix_kv: dict | None
    token_budget: int = 4096
    max_rows: int = 64
    cascade: bool = True
    """The cascade decode state (engine/decode.py); False: the dense fallback."""
    static: bool = False
    compact: bool = True
    row_kv: object = None
    """An engine.rowcache.RowCaches that receives finished rows' own keys/values, or None."""
    check_every: int = 1
    """Steps between the host's looks at the batch (engine/steps.py)."""


def _generate_batch(model, prompts, seeds, budgets, settings: _Decode, leaders=None):
    """Decode one batch (engine/steps.py): every row (prompt x rollout) steps together; a finished row stops
    counting at once and leaves the batch at the next compaction. `leaders[p]`: the batch index of the prompt
    whose rollouts prompt p's follow in length (`generate`'s `length_of`), or None."""
    n = settings.n
    distinct: dict[tuple, int] = {}
    for p in prompts:
        distinct.setdefault(tuple(p), len(distinct))
    row_prompt = [distinct[tuple(prompts[r // n])] for r in range(len(prompts) * n)]
    backend = Cascade if settings.cascade else Dense
    with torch.inference_mode():
        state = backend(model, list(distinct), row_prompt, max(budgets), pad_id=settings.pad_id,
                        token_budget=settings.token_budget, max_rows=settings.max_rows, static=settings.static)
        tokens, lengths, stopped, greedy, rows_kv, published = decode_batch(
            state, prompts, seeds, budgets, settings, leaders or [None] * len(prompts), settings.check_every)
        # Published once the batch has succeeded: a batch that runs out of memory leaves nothing behind
        # for its halves' retry to hold on to.
    if published is not None:
        settings.prefix_kv.update(published)
    for r, own in rows_kv.items():
        settings.row_kv.add_row(tuple(prompts[r // n]), tuple(tokens[r, : own[0][0].shape[2]].tolist()), own)
    return [
        [Rollout(tuple(tokens[r, : lengths[r]].tolist()), stopped[r], greedy[r]) for r in range(p * n, (p + 1) * n)]
        for p in range(len(prompts))
    ]


# -- a reference decoding loop without the cascade decoder, kept only so that bench/gen_bench.py can time it --

def _generate_v1(model, prompts, *, max_new_tokens, stop_ids, n=1, greedy_first=False, temperature=0.0, top_p=1.0,
                 seeds=None, pad_id=0, token_budget=None, max_rows=None, on_batch=None, prefix_kv=None):
    """`generate` without the cascade decoder: each batch decoded by the model's own forward and cache (same
    arguments; sampled rollouts from per-row CPU generators; greedy tokens equal `generate`'s)."""
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    device = model.get_input_embeddings().weight.device
    default_budget, default_rows = default_bounds("generate", device)
    token_budget = token_budget or default_budget
    max_rows = max_rows or default_rows
    bounds = BatchBounds(token_budget, max_rows, generation_cache_limit(model, device), cascade=False)
    settings = _Decode(stop_ids, n, greedy_first, temperature, top_p, pad_id, device, prefix_kv)
    seeds = list(seeds) if seeds is not None else [0] * len(prompts)
    out: list = [None] * len(prompts)
    units = [[i] for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i]))]
    for batch in _batches(units, [len(p) for p in prompts], budgets, n, bounds):
        batch = [i for u in batch for i in u]
        for i, rollouts in zip(batch, _generate_batch_v1(model, [prompts[i] for i in batch], [seeds[i] for i in batch],
                                                          [budgets[i] for i in batch], settings)):
            out[i] = rollouts
        if on_batch is not None:
            on_batch(len(batch))
    return out


def _generate_batch_v1(model, prompts, seeds, budgets, settings: _Decode):
    from transformers import DynamicCache

    stop_ids, n, greedy_first, temperature, top_p, pad_id, device, prefix_kv = (
        settings.stop_ids, settings.n, settings.greedy_first, settings.temperature, settings.top_p, settings.pad_id,
        settings.device, settings.prefix_kv)
    ids, mask = pad_rows(prompts, pad_id, device, left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1].float()
        if prefix_kv is not None:
            width = ids.shape[1]
            for b, p in enumerate(prompts):
                # Left padding: the prompt's keys/values are the last len(p) positions, at positions 0..len-1.
                prefix_kv[tuple(p)] = [(layer.keys[b : b + 1, :, width - len(p):], layer.values[b : b + 1, :, width - len(p):])
                                       for layer in cache.layers]
        if n > 1:  # one prefill, n rollouts
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
        rows = len(prompts) * n
        greedy = torch.tensor([(temperature == 0) or (greedy_first and r % n == 0) for r in range(rows)], device=device)
        gens = [torch.Generator(device="cpu").manual_seed(derive_seed(seeds[r // n], r % n)) for r in range(rows)]
        last_pos = positions[:, -1].repeat_interleave(n) if n > 1 else positions[:, -1]
        generated = [[] for _ in range(rows)]
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        stopped = [False] * rows
        row_budget = torch.tensor([budgets[r // n] for r in range(rows)], device=device)
        max_new = max(budgets)
        stop = torch.tensor(sorted(stop_ids), device=device) if stop_ids else None
        for step in range(max_new):
            next_tok = logits.argmax(-1)
            sample_rows = (~greedy & ~done).nonzero().flatten().tolist()
            if sample_rows:
                probs = tempered_distribution(logits[sample_rows], temperature, top_p).cpu()
                for j, r in enumerate(sample_rows):
                    next_tok[r] = torch.multinomial(probs[j], 1, generator=gens[r]).item()
            next_tok = torch.where(done, torch.full_like(next_tok, pad_id), next_tok)
            is_stop = torch.isin(next_tok, stop) & ~done if stop is not None else torch.zeros_like(done)
            for r in (~done & ~is_stop).nonzero().flatten().tolist():
                generated[r].append(int(next_tok[r]))
            for r in is_stop.nonzero().flatten().tolist():
                stopped[r] = True
            done = done | is_stop | (row_budget <= step + 1)
            if bool(done.all()) or step == max_new - 1:
                break
            last_pos = last_pos + 1
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=device)], dim=1)
            logits = model(input_ids=next_tok[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                           past_key_values=cache, use_cache=True).logits[:, -1].float()
    return [
        [Rollout(tuple(generated[p * n + j]), stopped[p * n + j], bool(greedy[p * n + j])) for j in range(n)]
        for p in range(len(prompts))
    ]
