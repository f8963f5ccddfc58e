"""Generation: batched, left-padded decoding with n rollouts per prompt sharing one prefill, greedy or
seeded sampling (temperature, top-p), token budgets and stop-at-end-of-turn; and the anchor rule that
turns a generated text into a read position ("Answer:" then the letter).

Sampling is seeded per (prompt seed, rollout index), each row with its own generator, so a rollout's
tokens do not depend on which other prompts share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.batching import default_bounds, generation_cache_limit, halving_on_oom, pad_rows
from engine.sampling import derive_seed, tempered_distribution

ANCHOR_RULES = ("own", "forced_after_completion", "forced_at_budget")


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
) -> list[list[Rollout]]:
    """Generate `n` rollouts for each prompt (token ids); returns, per prompt, its rollouts in order.

    With `greedy_first`, rollout 0 is greedy and the others sample at `temperature`/`top_p`; otherwise all
    rollouts sample (or all are greedy when temperature is 0). `seeds[i]` seeds prompt i's rollouts.
    `token_budget` bounds padded prompt tokens per prefill; `max_rows` bounds rows decoded together.
    `on_batch(k)` is called with the number of prompts finished after each batch (for progress bars).
    `prefix_kv`, if given a dict, receives each prompt's prefill keys/values ({prompt tuple: [(k, v) per
    layer]}), so that reading letters after the generated text need not run the prompt again
    (`score_ids(..., known_prefixes=...)`).
    """
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts) or min(budgets, default=1) < 1 or n < 1:
        raise ValueError("max_new_tokens (one per prompt, or one for all) and n must be >= 1")
    device = model.get_input_embeddings().weight.device
    default_budget, default_rows = default_bounds("generate", device)
    token_budget = token_budget or default_budget
    max_rows = max_rows or default_rows
    kv_limit = generation_cache_limit(model, device)
    settings = _Decode(stop_ids, n, greedy_first, temperature, top_p, pad_id, device, prefix_kv)
    seeds = list(seeds) if seeds is not None else [0] * len(prompts)
    out: list[list[Rollout] | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batch: list[int] = []
    for idx in order + [None]:
        if idx is not None:
            width = max([len(prompts[i]) for i in batch] + [len(prompts[idx])])
            rows = (len(batch) + 1) * n
            cached = rows * (width + max(budgets[i] for i in batch + [idx]))
            if not batch or ((len(batch) + 1) * width <= token_budget and rows <= max_rows
                             and (kv_limit is None or cached <= kv_limit)):
                batch.append(idx)
                continue
        decode = lambda b: _generate_batch(  # noqa: E731
            model, [prompts[i] for i in b], [seeds[i] for i in b], [budgets[i] for i in b], settings)
        for i, rollouts in zip(batch, halving_on_oom(decode, batch, lambda a, b: a + b)):
            out[i] = rollouts
        if on_batch is not None:
            on_batch(len(batch))
        batch = [idx] if idx is not None else []
    return out


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


def _generate_batch(model, prompts, seeds, budgets, settings: _Decode):
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


@dataclass(frozen=True)
class AnchorRead:
    """Where a generated text is read: the token ids to score (the letter comes next) and how they were made."""

    ids: tuple[int, ...]
    rule: str
    """own | forced_after_completion | forced_at_budget."""
    kept_tokens: int
    """Generated tokens kept before the anchor."""
    text: str
    """The generated text that precedes the read position (anchor included)."""


def anchor_read(tokenizer, prompt_ids: Sequence[int], rollout: Rollout, anchor: str = "Answer:", cut: int | None = None) -> AnchorRead:
    """The read position after the anchor for one rollout.

    If the model wrote the anchor itself, the text is cut right after its first occurrence (rule `own`),
    keeping the model's own tokens when they end exactly there. Otherwise a newline and the anchor are
    appended after the full text (`forced_after_completion`, the model ended its turn) or after the text
    cut at the budget (`forced_at_budget`, also when `cut` truncates the rollout on purpose).
    """
    toks = list(rollout.tokens if cut is None else rollout.tokens[:cut])
    truncated = cut is not None and cut < len(rollout.tokens)
    text = tokenizer.decode(toks)
    pos = text.find(anchor)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    if pos >= 0:
        end = pos + len(anchor)
        m = 0
        while m < len(toks) and len(tokenizer.decode(toks[: m + 1])) <= pos:
            m += 1
        head = tokenizer.decode(toks[:m])
        target = text[:end]
        k = next((k for k in range(m + 1, len(toks) + 1) if tokenizer.decode(toks[:k]) == target), None)
        kept = toks[:k] if k is not None else toks[:m] + encode(target[len(head):])
        return AnchorRead(tuple(prompt_ids) + tuple(kept), "own", k if k is not None else m, target)
    rule = "forced_at_budget" if (truncated or not rollout.stopped) else "forced_after_completion"
    suffix = "\n" + anchor
    return AnchorRead(tuple(prompt_ids) + tuple(toks) + tuple(encode(suffix)), rule, len(toks), text + suffix)
