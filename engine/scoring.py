"""Scoring: the probability mass a model puts on each option letter at the next token.

Two paths compute the same numbers. The plain path runs one prompt at a time through the full model
(the reference). The fast path (the default) plans prefix groups (prompts sharing a long token prefix,
such as the option orders of one scenario, run that prefix once and reuse its KV cache), then forms
length-sorted batches bounded by a token budget, and applies the output head only at the read
positions. Tests hold the fast path equal to the plain one within float tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.errors import ProbeInputError, RenderError
from engine.letters import LetterTokens
from engine.render import encode_chat, encode_raw

# Architectures whose logits are exactly `lm_head(final hidden state)`: for these the head is applied to
# the gathered read positions only. Anything else goes through the model's own forward (logits_to_keep).
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "olmo", "olmo2", "olmo3", "mistral", "smollm3"})


@dataclass(frozen=True)
class LetterMass:
    """What the model puts on each letter at the read position."""

    letters: tuple[str, ...]
    """The letters read, in the probe's order."""
    mass: tuple[float, ...]
    """Per letter: full-vocabulary softmax mass (fp32), summed over the letter's single-token variants."""
    letter_mass: float
    """Total mass on all letters (the floor statistic: low values mean the model wanted to say something else)."""
    option_mass: tuple[float, ...]
    """Per letter: mass normalized over the letters (sums to 1)."""
    tempered: tuple[float, ...]
    """Per letter: exact probability that a token sampled at temperature T (after top-p) is that letter."""
    n_tokens: int
    """Prompt length in tokens."""

    def as_dict(self) -> dict:
        return {
            "mass": dict(zip(self.letters, self.mass)),
            "letter_mass": self.letter_mass,
            "option_mass": dict(zip(self.letters, self.option_mass)),
            "tempered": dict(zip(self.letters, self.tempered)),
            "tokens": self.n_tokens,
        }


@dataclass(frozen=True)
class Prompt:
    """One prompt, before tokenization: chat messages or raw text."""

    messages: tuple[dict, ...] | None = None
    """Chat messages (role/content) for the chat frame."""
    text: str | None = None
    """Plain text for the raw frame (no template)."""
    system: str | None = None
    """System prompt replacing the template's default one (chat frame only); None keeps the default."""


@dataclass
class ScoreStats:
    """Work counters filled in by one scoring call (for benchmarks and progress reports)."""

    prompt_tokens: int = 0
    """Sum of prompt lengths."""
    computed_tokens: int = 0
    """Real (non-padding) tokens run through the model; below prompt_tokens when prefixes are shared."""
    padded_tokens: int = 0
    """Tokens run including padding."""
    forward_passes: int = 0
    """Model calls."""
    prefix_groups: int = 0
    """Groups that shared a cached prefix."""
    group_sizes: list = field(default_factory=list)
    """Size of each shared-prefix group."""
    oom_splits: int = 0
    """Batches halved and retried after running out of accelerator memory."""


@dataclass(frozen=True)
class PrefixGroup:
    """Prompts that run their first `prefix_len` tokens once (0 = no shared prefix)."""

    prefix_len: int
    members: tuple[int, ...]


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt in its frame."""
    if (prompt.messages is None) == (prompt.text is None):
        raise RenderError("a prompt has either messages (chat frame) or text (raw frame), exactly one")
    if prompt.text is not None:
        if prompt.system is not None:
            raise RenderError("a system prompt applies to the chat frame only, not to raw text")
        return encode_raw(tokenizer, prompt.text)
    return encode_chat(tokenizer, list(prompt.messages), system=prompt.system)


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


def letter_masses(
    logits: torch.Tensor, letters: Sequence[LetterTokens], lengths: Sequence[int], temperature: float, top_p: float
) -> list[LetterMass]:
    """LetterMass rows from next-token logits [B, V] (any dtype; computed in fp32)."""
    logits = logits.float()
    probs = logits.softmax(-1)
    tempered = tempered_distribution(logits, temperature, top_p)
    out = []
    for row, (lt, n) in enumerate(zip(letters, lengths)):
        mass = [float(probs[row, list(ids)].sum()) for ids in lt.token_ids]
        temp = [float(tempered[row, list(ids)].sum()) for ids in lt.token_ids]
        total = sum(mass)
        option = [m / total for m in mass] if total > 0 else [float("nan")] * len(mass)
        out.append(LetterMass(lt.letters, tuple(mass), total, tuple(option), tuple(temp), int(n)))
    return out


def plan_prefix_groups(seqs: Sequence[Sequence[int]], min_prefix: int = 16) -> list[PrefixGroup]:
    """Partition prompts into groups that share a token prefix, minimizing tokens computed.

    Prompts are sorted lexicographically, so the common prefix of any run of neighbours is the minimum of
    their neighbour LCPs. A run is either one group (its common prefix computed once; each member's
    suffix computed separately) or split where the LCP is smallest, whichever computes fewer tokens.
    A group's prefix always leaves each member at least one token, whose position is read.
    """
    n = len(seqs)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: list(seqs[i]))
    lens = [len(seqs[i]) for i in order]
    lcp = []
    for k in range(n - 1):
        a, b = seqs[order[k]], seqs[order[k + 1]]
        m = 0
        limit = min(len(a), len(b))
        while m < limit and a[m] == b[m]:
            m += 1
        lcp.append(m)

    def singletons(lo, hi):
        return sum(lens[lo:hi]), [PrefixGroup(0, (order[k],)) for k in range(lo, hi)]

    def best(lo, hi, depth):
        if hi - lo == 1:
            return singletons(lo, hi)
        m = min(lcp[lo : hi - 1])
        p = min(m, min(lens[lo:hi]) - 1)
        whole = None
        if p >= min_prefix:
            whole = (p + sum(lens[lo:hi]) - p * (hi - lo), [PrefixGroup(p, tuple(order[lo:hi]))])
        if depth > 200:  # pathological nesting: stop refining
            split = singletons(lo, hi)
        else:
            cost, groups, start = 0, [], lo
            cuts = [k for k in range(lo, hi - 1) if lcp[k] == m] + [hi - 1]
            for k in cuts:
                c, g = best(start, k + 1, depth + 1)
                cost, groups, start = cost + c, groups + g, k + 1
            split = (cost, groups)
        return whole if whole is not None and whole[0] <= split[0] else split

    return best(0, n, 0)[1]


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an accelerator out-of-memory error (CUDA's own type, or a backend's message)."""
    return isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def halving_on_oom(fn, batch: list, join, stats: ScoreStats | None = None):
    """Run `fn(batch)`; when it runs out of memory, free cached memory and run each half instead.

    `join` combines the halves' results. A single item that still does not fit re-raises the error.
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


def _plain_head(model) -> bool:
    cfg = model.config
    scaled = any(getattr(cfg, a, None) not in (None, 1.0) for a in ("final_logit_softcapping", "logit_scale"))
    return cfg.model_type in PLAIN_HEAD_MODEL_TYPES and not scaled and hasattr(model, "base_model")


def _read_logits(model, input_ids, attention_mask, position_ids, cache, read_idx) -> torch.Tensor:
    """Next-token logits [B, V] at per-row positions `read_idx` of this forward's input."""
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    if cache is not None:
        kwargs.update(past_key_values=cache, use_cache=True)
    else:
        kwargs.update(use_cache=False)
    if _plain_head(model):
        hidden = model.base_model(**kwargs).last_hidden_state
        head = model.get_output_embeddings()
        picked = hidden[rows, read_idx]
        return head(picked.to(head.weight.device)).float()
    positions, inverse = torch.unique(read_idx, return_inverse=True)
    logits = model(**kwargs, logits_to_keep=positions).logits  # [B, U, V]
    return logits[rows, inverse].float()


def plain_next_token_logits(model, ids: Sequence[int]) -> torch.Tensor:
    """Reference: one prompt, full model forward, logits [V] at the last position."""
    device = model.get_input_embeddings().weight.device
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    return out.logits[0, -1].float()


def _batches(items, cost, budget, context_budget, max_batch):
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


def _pad(rows, pad_id, device):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def _default_budget(device: torch.device) -> tuple[int, int]:
    return (32768, 256) if device.type == "cuda" else (2048, 64)


def score_ids(
    model,
    seqs: Sequence[Sequence[int]],
    letters: Sequence[LetterTokens],
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    fast: bool = True,
    prefix_reuse: bool = True,
    token_budget: int | None = None,
    max_batch: int | None = None,
    min_prefix: int = 16,
    pad_id: int = 0,
    progress: bool = False,
    stats: ScoreStats | None = None,
    known_prefixes: dict | None = None,
) -> list[LetterMass]:
    """Letter masses for tokenized prompts, each read at the token after its last one.

    `fast=False` is the plain one-prompt-at-a-time reference. `token_budget` bounds padded tokens per
    forward pass; `max_batch` bounds rows. `stats`, if given, receives the work counters.
    `known_prefixes` ({token tuple: [(keys, values) per layer]}, e.g. from `generate(prefix_kv=...)`) are
    prefixes whose cache is already computed: prompts starting with one reuse it instead of running it.
    """
    from tqdm.auto import tqdm

    if len(seqs) != len(letters):
        raise ProbeInputError(f"{len(seqs)} prompts but {len(letters)} letter sets")
    seqs = [list(s) for s in seqs]
    if any(len(s) == 0 for s in seqs):
        raise ProbeInputError("a prompt encodes to zero tokens")
    vocab = model.get_output_embeddings().weight.shape[0]
    for lt in letters:
        if any(t >= vocab for ids in lt.token_ids for t in ids):
            raise ProbeInputError(f"letters {list(lt.letters)}: a token id is beyond the model's {vocab} output rows")
    stats = stats if stats is not None else ScoreStats()
    stats.prompt_tokens += sum(len(s) for s in seqs)
    results: list[LetterMass | None] = [None] * len(seqs)
    bar = tqdm(total=len(seqs), desc="scoring", unit="probe", disable=not progress, leave=False)

    if not fast:
        for i, s in enumerate(seqs):
            logits = plain_next_token_logits(model, s)
            results[i] = letter_masses(logits[None], [letters[i]], [len(s)], temperature, top_p)[0]
            stats.computed_tokens += len(s)
            stats.padded_tokens += len(s)
            stats.forward_passes += 1
            bar.update(1)
        bar.close()
        return results

    device = model.get_input_embeddings().weight.device
    default_budget, default_batch = _default_budget(device)
    budget = token_budget or default_budget
    max_batch = max_batch or default_batch
    longest = max(len(s) for s in seqs)
    window = getattr(model.config, "sliding_window", None)
    if window and 2 * longest >= window:
        # Shared prefixes are padded to a common cache length, which shifts cache positions; keep the
        # sliding-window mask exact by not reusing prefixes when sequences approach the window.
        prefix_reuse = False
    if prefix_reuse:
        groups = plan_prefix_groups(seqs, min_prefix=min_prefix)
    else:
        groups = [PrefixGroup(0, (i,)) for i in range(len(seqs))]
    known: dict[int, object] = {}
    if known_prefixes and prefix_reuse:
        groups, known = _use_known_prefixes(groups, seqs, known_prefixes)
    order = sorted(range(len(groups)), key=lambda k: (groups[k].prefix_len, len(groups[k].members)))
    position = {k: i for i, k in enumerate(order)}
    known = {position[k]: v for k, v in known.items()}
    groups = [groups[k] for k in order]
    stats.prefix_groups += sum(1 for g in groups if g.prefix_len)
    stats.group_sizes += [len(g.members) for g in groups if g.prefix_len]

    # Waves bound how many cached prefixes are held at once.
    wave, wave_tokens = [], 0
    waves = []
    for gi, g in enumerate(groups):
        if wave and wave_tokens + g.prefix_len > 4 * budget:
            waves.append(wave)
            wave, wave_tokens = [], 0
        wave.append(gi)
        wave_tokens += g.prefix_len
    if wave:
        waves.append(wave)

    with torch.inference_mode():
        for wave_ids in waves:
            wave = [groups[gi] for gi in wave_ids]
            given = {w: known[gi] for w, gi in enumerate(wave_ids) if gi in known}
            kv = _prefix_kv(model, seqs, wave, budget, max_batch, pad_id, device, stats, given)
            items = [(i, gi, g.prefix_len) for gi, g in enumerate(wave) for i in g.members]
            items.sort(key=lambda it: (it[2], len(seqs[it[0]]) - it[2]))
            suffix_len = lambda it: len(seqs[it[0]]) - it[2]  # noqa: E731
            for batch in _batches(items, lambda it: (suffix_len(it), len(seqs[it[0]])), budget, 4 * budget, max_batch):
                logits = halving_on_oom(lambda b: _suffix_forward(model, seqs, b, kv, pad_id, device, stats), batch,
                                        lambda a, b: torch.cat([a, b]), stats)
                rows = letter_masses(logits, [letters[i] for i, _, _ in batch], [len(seqs[i]) for i, _, _ in batch], temperature, top_p)
                for (i, _, _), row in zip(batch, rows):
                    results[i] = row
                bar.update(len(batch))
            del kv
    bar.close()
    return results


def _use_known_prefixes(groups, seqs, known_prefixes):
    """Shorten groups (and lone prompts) that start with an already-computed prefix to exactly that prefix.

    Returns the new groups and {group index: the prefix's keys/values}. Suffixes grow by the few tokens the
    group shared beyond the known prefix, in exchange for not running the prefix at all.
    """
    lengths = sorted({len(k) for k in known_prefixes}, reverse=True)
    out, known = [], {}
    for g in groups:
        head = seqs[g.members[0]]
        limit = g.prefix_len if g.prefix_len else len(head) - 1
        hit = next((L for L in lengths if L <= limit and tuple(head[:L]) in known_prefixes), None)
        if hit is None:
            out.append(g)
            continue
        known[len(out)] = known_prefixes[tuple(head[:hit])]
        out.append(PrefixGroup(hit, g.members))
    return out, known


def _prefix_kv(model, seqs, wave, budget, max_batch, pad_id, device, stats, given=None):
    """Run each group's shared prefix once (unless `given`); returns {group index: [(keys, values) per layer]}."""
    kv = dict(given or {})
    todo = sorted((g.prefix_len, gi) for gi, g in enumerate(wave) if g.prefix_len > 0 and gi not in kv)
    for batch in _batches(todo, lambda t: (t[0], t[0]), budget, budget, max_batch):
        kv.update(halving_on_oom(lambda b: _prefix_batch(model, seqs, wave, b, pad_id, device, stats), batch,
                                 lambda a, b: {**a, **b}, stats))
    return kv


def _prefix_batch(model, seqs, wave, batch, pad_id, device, stats):
    """One forward over a batch of shared prefixes; returns their per-layer keys and values."""
    from transformers import DynamicCache

    rows = [seqs[wave[gi].members[0]][:plen] for plen, gi in batch]
    ids, mask = _pad(rows, pad_id, device)
    cache = DynamicCache(config=model.config)
    # Right padding: real positions never see the padding (causal), so their keys/values are exact.
    model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
    stats.forward_passes += 1
    stats.computed_tokens += sum(len(r) for r in rows)
    stats.padded_tokens += ids.numel()
    return {gi: [(layer.keys[b : b + 1, :, :plen], layer.values[b : b + 1, :, :plen]) for layer in cache.layers]
            for b, (plen, gi) in enumerate(batch)}


def _suffix_forward(model, seqs, batch, kv, pad_id, device, stats):
    """Forward the suffixes of a batch on top of their groups' cached prefixes; logits at each last token."""
    from transformers import DynamicCache

    suffixes = [seqs[i][plen:] for i, _, plen in batch]
    ids, suffix_mask = _pad(suffixes, pad_id, device)
    read_idx = torch.tensor([len(s) - 1 for s in suffixes], device=device)
    stats.forward_passes += 1
    stats.computed_tokens += sum(len(s) for s in suffixes)
    stats.padded_tokens += ids.numel()
    prefix_max = max(plen for _, _, plen in batch)
    if prefix_max == 0:
        return _read_logits(model, ids, suffix_mask, None, None, read_idx)
    bsz = len(batch)
    cache = DynamicCache(config=model.config)
    same = all(gi == batch[0][1] for _, gi, _ in batch)
    for layer_idx in range(len(kv[next(gi for _, gi, p in batch if p)])):
        parts = []
        for which in (0, 1):
            if same:
                parts.append(kv[batch[0][1]][layer_idx][which].expand(bsz, -1, -1, -1))
                continue
            ref = kv[next(gi for _, gi, p in batch if p)][layer_idx][which]
            full = ref.new_zeros((bsz, ref.shape[1], prefix_max, ref.shape[3]))
            for row, (_, gi, plen) in enumerate(batch):
                if plen:
                    full[row, :, :plen] = kv[gi][layer_idx][which][0]
            parts.append(full)
        cache.update(parts[0], parts[1], layer_idx)
    prefix_mask = torch.zeros((bsz, prefix_max), dtype=torch.long, device=device)
    for row, (_, _, plen) in enumerate(batch):
        prefix_mask[row, :plen] = 1
    mask = torch.cat([prefix_mask, suffix_mask], dim=1)
    starts = torch.tensor([plen for _, _, plen in batch], device=device)
    position_ids = starts[:, None] + torch.arange(ids.shape[1], device=device)[None, :]
    return _read_logits(model, ids, mask, position_ids, cache, read_idx)


def score_prompts(lm, prompts: Sequence[Prompt], letters: Sequence[Sequence[str]], **kwargs) -> list[LetterMass]:
    """Render, tokenize and score prompts on a LoadedModel; `kwargs` go to `score_ids`."""
    seqs = [encode_prompt(lm.tokenizer, p) for p in prompts]
    letter_tokens = [lm.letters(ls) for ls in letters]
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    return score_ids(lm.model, seqs, letter_tokens, pad_id=pad, **kwargs)
