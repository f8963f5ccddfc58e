"""Scoring: the probability mass a model puts on each option letter at the next token.

Two paths compute the same numbers. The plain path runs one prompt at a time through the full model
(the reference). The fast path (the default) runs identical prompts once, plans a prefix tree (the
template header once, each scenario's context once on top of it, each first option line once on top of
that...: a node runs only its own tokens on its parent's KV cache), then forms length-sorted batches
bounded by a token budget, and applies the output head only at the read positions. Tests hold the fast
path equal to the plain one within float tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.errors import ProbeInputError, RenderError
from engine.letters import LetterTokens
from engine.sampling import tempered_distribution
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
    """Prefix-tree nodes whose keys/values were cached and shared."""
    group_sizes: list = field(default_factory=list)
    """Prompts read on each cached node."""
    duplicates: int = 0
    """Prompts identical to an earlier one in the same call: run once, read once per letter set."""
    peak_cached_tokens: int = 0
    """Most prefix-tree tokens whose keys/values were held at once (memory bound of the cache)."""
    oom_splits: int = 0
    """Batches halved and retried after running out of accelerator memory."""


@dataclass(frozen=True)
class PrefixGroup:
    """A node of the prefix tree: prompts that share their first `prefix_len` tokens, run once and cached.

    `parent` (the index of an earlier node in the same plan, or None) is the node whose cache this one
    extends: the node itself computes only the tokens from the parent's `prefix_len` to its own. `members`
    are the prompts read on top of this node's cache; each still runs at least one token of its own, whose
    position is read. A node with `prefix_len` 0 caches nothing (its members run whole).
    """

    prefix_len: int
    members: tuple[int, ...]
    parent: int | None = None


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt in its frame."""
    if (prompt.messages is None) == (prompt.text is None):
        raise RenderError("a prompt has either messages (chat frame) or text (raw frame), exactly one")
    if prompt.text is not None:
        if prompt.system is not None:
            raise RenderError("a system prompt applies to the chat frame only, not to raw text")
        return encode_raw(tokenizer, prompt.text)
    return encode_chat(tokenizer, list(prompt.messages), system=prompt.system)


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


NODE_OVERHEAD = 4
"""Token-equivalents a prefix-tree node costs beyond its own tokens (an extra row in a forward pass, and
assembling its cache from its ancestors'): a node is made only where it saves more than that."""


def plan_prefix_groups(
    seqs: Sequence[Sequence[int]], min_prefix: int = 16, node_overhead: int = NODE_OVERHEAD, cached: int = 0,
    nest: bool = True,
) -> list[PrefixGroup]:
    """A prefix tree over the prompts that minimizes the tokens computed.

    Prompts are sorted lexicographically, so the common prefix of any run of neighbours is the minimum of
    their neighbour LCPs, and cutting a run where that minimum is reached gives the runs that share more.
    A run given a cached prefix of length p is computed the cheapest of three ways: every member runs its
    tokens after p (flat); the sub-runs are planned separately on p (split); or a node caches the run's
    common prefix q once (q - p tokens plus `node_overhead`) and the sub-runs are planned on q (nest).
    A top-level node needs at least `min_prefix` tokens. Nodes come parents first; a prompt sharing nothing
    worth caching is a node of its own with prefix 0. Identical prompts share a node that leaves each one
    token (callers that can, such as `score_ids`, drop duplicates first).

    `cached` > 0 says all prompts start with a prefix of that many tokens whose cache the caller already
    has: the plan's first node is that prefix (with the prompts that share nothing more as members) and
    every other top-level node hangs below it. `nest=False` plans one level of groups (no node extends
    another; for comparison).
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
    memo: dict = {}

    def best(lo, hi, p, depth):
        """(tokens, items) for the run [lo, hi) on a cached prefix of p tokens; item: ("leaf", k) | ("node", q, items)."""
        key = (lo, hi, p)
        if key in memo:
            return memo[key]
        options = [(sum(lens[lo:hi]) - p * (hi - lo), [("leaf", k) for k in range(lo, hi)])]
        if hi - lo > 1 and depth <= 200:  # pathological nesting: stop refining
            m = min(lcp[lo : hi - 1])
            q = min(m, min(lens[lo:hi]) - 1)
            cuts = [k + 1 for k in range(lo, hi - 1) if lcp[k] == m]
            parts = list(zip([lo] + cuts, cuts + [hi]))
            if len(parts) < hi - lo:
                planned = [best(a, b, p, depth + 1) for a, b in parts]
                options.append((sum(c for c, _ in planned), [it for _, items in planned for it in items]))
            if q > p and (q >= min_prefix if p == cached else nest):
                planned = [best(a, b, q, depth + 1) for a, b in parts]
                cost = q - p + node_overhead + sum(c for c, _ in planned)
                options.append((cost, [("node", q, [it for _, items in planned for it in items])]))
        memo[key] = min(options, key=lambda o: o[0])
        return memo[key]

    plan: list[PrefixGroup] = []

    def emit(q, items, parent):
        index = len(plan)
        plan.append(PrefixGroup(q, tuple(order[it[1]] for it in items if it[0] == "leaf"), parent))
        for it in items:
            if it[0] == "node":
                emit(it[1], it[2], index)

    top = best(0, n, cached, 0)[1]
    if cached:
        emit(cached, top, None)
        return plan
    for it in top:
        if it[0] == "leaf":
            plan.append(PrefixGroup(0, (order[it[1]],)))
        else:
            emit(it[1], it[2], None)
    return plan


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


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token occupies in the model's cache (all layers)."""
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", 1)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    itemsize = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * itemsize


def _cache_token_limit(model, device: torch.device, budget: int) -> int:
    """Tokens of keys/values held at once (cached prefix-tree nodes of a wave, or one batch's assembled
    prefixes): 4x the token budget, and on CUDA at most a quarter of the free memory."""
    limit = 4 * budget
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        limit = min(limit, max(budget, int(0.25 * free) // kv_bytes_per_token(model)))
    return limit


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
    # Identical prompts run once (their logits are the same); each is still read with its own letters.
    readers: dict = {}
    for i, s in enumerate(seqs):
        readers.setdefault(tuple(s) if prefix_reuse else i, []).append(i)
    copies = list(readers.values())
    stats.duplicates += len(seqs) - len(copies)
    uniq = [seqs[c[0]] for c in copies]
    window = getattr(model.config, "sliding_window", None)
    if window and 2 * max(len(s) for s in uniq) >= window:
        # Shared prefixes are padded to a common cache length, which shifts cache positions; keep the
        # sliding-window mask exact by not reusing prefixes when sequences approach the window.
        prefix_reuse = False
    plan: list[PrefixGroup] = []
    given: dict[int, list] = {}  # node index -> keys/values of a known prefix
    if not prefix_reuse:
        plan = [PrefixGroup(0, (i,)) for i in range(len(uniq))]
    else:  # one tree per known prefix the prompts start with (rooted on its cache), one for the rest
        for key, indices in _by_known_prefix(uniq, known_prefixes).items():
            offset = len(plan)
            for g in plan_prefix_groups([uniq[i] for i in indices], min_prefix=min_prefix, cached=len(key)):
                parent = None if g.parent is None else g.parent + offset
                plan.append(PrefixGroup(g.prefix_len, tuple(indices[m] for m in g.members), parent))
            if key:
                given[offset] = known_prefixes[key]
    stats.prefix_groups += sum(1 for g in plan if g.prefix_len)
    stats.group_sizes += [len(g.members) for g in plan if g.prefix_len and g.members]

    with torch.inference_mode():
        held = _cache_token_limit(model, device, budget)
        waves, done_after = _waves(plan, held)
        rep = _representatives(plan)
        kv: dict[int, list] = {}
        for w, wave in enumerate(waves):
            _node_kv(model, uniq, plan, rep, wave, kv, given, budget, held, max_batch, pad_id, device, stats)
            cached = sum(layers[0][0].shape[2] for layers in kv.values())
            stats.peak_cached_tokens = max(stats.peak_cached_tokens, cached)
            items = [(u, node, plan[node].prefix_len) for node in wave for u in plan[node].members]
            items.sort(key=lambda it: (len(uniq[it[0]]) - it[2], it[2]))
            cost = lambda it: (len(uniq[it[0]]) - it[2], len(uniq[it[0]]))  # noqa: E731
            for batch in _batches(items, cost, budget, held, max_batch):
                rows = [(uniq[u][plen:], node) for u, node, plen in batch]
                logits = halving_on_oom(lambda b: _forward_on_nodes(model, b, plan, kv, pad_id, device, stats, read=True),
                                        rows, lambda a, b: torch.cat([a, b]), stats)
                picks = [(row, i) for row, (u, _, _) in enumerate(batch) for i in copies[u]]
                masses = letter_masses(logits[[row for row, _ in picks]], [letters[i] for _, i in picks],
                                       [len(seqs[i]) for _, i in picks], temperature, top_p)
                for (_, i), mass in zip(picks, masses):
                    results[i] = mass
                bar.update(len(picks))
            for k in [k for k in kv if done_after[k] == w]:
                del kv[k]
    bar.close()
    return results


def _by_known_prefix(seqs, known_prefixes) -> dict[tuple, list[int]]:
    """Prompts grouped by the longest known prefix they start with (and leave a token after); () = none."""
    lengths = sorted({len(k) for k in known_prefixes or ()}, reverse=True)
    out: dict[tuple, list[int]] = {}
    for i, s in enumerate(seqs):
        hit = next((L for L in lengths if L < len(s) and tuple(s[:L]) in known_prefixes), 0)
        out.setdefault(tuple(s[:hit]), []).append(i)
    return out


def _representatives(plan: list[PrefixGroup]) -> list[int | None]:
    """Per node, one prompt of its subtree (its tokens up to the node's prefix are the node's tokens)."""
    rep: list[int | None] = [None] * len(plan)
    for k in range(len(plan) - 1, -1, -1):  # children come after their parents
        g = plan[k]
        if rep[k] is None and g.members:
            rep[k] = g.members[0]
        if g.parent is not None and rep[g.parent] is None:
            rep[g.parent] = rep[k]
    return rep


def _start(plan: list[PrefixGroup], node: int) -> int:
    """Where a node's own tokens begin: its parent's prefix length."""
    parent = plan[node].parent
    return plan[parent].prefix_len if parent is not None else 0


def _waves(plan: list[PrefixGroup], limit: int) -> tuple[list[list[int]], dict[int, int]]:
    """Nodes in depth-first order (parents first), cut into consecutive waves of about `limit` own tokens.

    Also returns, per node, the index of the wave that finishes its subtree: its cache is needed until
    then (by its own members and its descendants) and dropped after. Subtrees are contiguous in this
    order, so at any time the caches held are one wave's nodes plus the ancestors of the next ones.
    """
    children: dict[int, list[int]] = {}
    for k, g in enumerate(plan):
        if g.parent is not None:
            children.setdefault(g.parent, []).append(k)
    order: list[int] = []
    last: dict[int, int] = {}  # node -> position in `order` of the last node of its subtree

    def visit(k):
        order.append(k)
        for c in children.get(k, ()):
            visit(c)
        last[k] = len(order) - 1

    for k in sorted((k for k, g in enumerate(plan) if g.parent is None), key=lambda k: plan[k].prefix_len):
        visit(k)
    waves: list[list[int]] = [[]]
    wave_of: list[int] = []
    tokens = 0
    for k in order:
        own = plan[k].prefix_len - _start(plan, k)
        if waves[-1] and tokens + own > limit:
            waves.append([])
            tokens = 0
        waves[-1].append(k)
        wave_of.append(len(waves) - 1)
        tokens += own
    return waves, {k: wave_of[last[k]] for k in order}


def _chain(plan: list[PrefixGroup], node: int | None) -> list[tuple[int, int]]:
    """(node, start) of each cached node whose own keys/values make up `node`'s cache, root first."""
    out = []
    while node is not None and plan[node].prefix_len:
        out.append((node, _start(plan, node)))
        node = plan[node].parent
    return out[::-1]


def _node_kv(model, seqs, plan, rep, wave, kv, given, budget, held, max_batch, pad_id, device, stats):
    """Compute a wave's cached nodes into `kv`, level by level, each on top of its parent's cache.

    `kv` ({node: [(keys, values) per layer]}) holds each node's own tokens only (from its parent's prefix
    length on), and already holds the ancestors from earlier waves; known prefixes (`given`) are taken as
    they are. `rep[k]` is a prompt whose first tokens are node k's.
    """
    kv.update({k: given[k] for k in wave if k in given})
    depth: dict[int, int] = {}

    def depth_of(k):
        if k not in depth:
            depth[k] = 0 if plan[k].parent is None else depth_of(plan[k].parent) + 1
        return depth[k]

    def cost(k):  # (own tokens run, context attended)
        return plan[k].prefix_len - _start(plan, k), plan[k].prefix_len

    todo = [k for k in wave if plan[k].prefix_len and k not in kv]
    for level in sorted({depth_of(k) for k in todo}):
        nodes = sorted((k for k in todo if depth[k] == level), key=cost)
        for batch in _batches(nodes, cost, budget, held, max_batch):
            rows = [(seqs[rep[k]][_start(plan, k) : plan[k].prefix_len], plan[k].parent) for k in batch]
            out = halving_on_oom(lambda b: _forward_on_nodes(model, b, plan, kv, pad_id, device, stats, read=False),
                                 rows, lambda a, b: a + b, stats)
            kv.update(zip(batch, out))


def _forward_on_nodes(model, rows, plan, kv, pad_id, device, stats, read):
    """One forward pass of token rows, each on top of its node's cache (node None or prefix 0: no cache).

    Rows are right-padded: real positions never attend to the padding (causal), so their keys/values are
    exact. `read=True` returns the next-token logits [B, V] at each row's last token; `read=False` returns
    each row's new keys/values ([(keys, values) per layer], its real tokens only).
    """
    from transformers import DynamicCache

    ids, new_mask = _pad([tokens for tokens, _ in rows], pad_id, device)
    lengths = [len(tokens) for tokens, _ in rows]
    stats.forward_passes += 1
    stats.computed_tokens += sum(lengths)
    stats.padded_tokens += ids.numel()
    read_idx = torch.tensor([n - 1 for n in lengths], device=device)
    starts = [plan[node].prefix_len if node is not None else 0 for _, node in rows]
    width = max(starts)
    cache = DynamicCache(config=model.config)
    mask, position_ids = new_mask, None
    if width:
        on_node: dict = {}
        for r, (_, node) in enumerate(rows):
            on_node.setdefault(node, []).append(r)
        chains = {node: [kv[k] for k, _ in _chain(plan, node)] for node in on_node}
        some = next(c for c in chains.values() if c)[0]
        for layer in range(len(some)):
            parts = []
            for which in (0, 1):
                prefixes = {node: torch.cat([piece[layer][which] for piece in chain], dim=2) if len(chain) > 1 else chain[0][layer][which]
                            for node, chain in chains.items() if chain}
                if len(on_node) == 1:
                    parts.append(next(iter(prefixes.values())).expand(len(rows), -1, -1, -1))
                    continue
                ref = some[layer][which]
                full = ref.new_zeros((len(rows), ref.shape[1], width, ref.shape[3]))
                for node, prefix in prefixes.items():
                    full[on_node[node], :, : prefix.shape[2]] = prefix
                parts.append(full)
            cache.update(parts[0], parts[1], layer)
        prefix_mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for r, start in enumerate(starts):
            prefix_mask[r, :start] = 1
        mask = torch.cat([prefix_mask, new_mask], dim=1)
        position_ids = torch.tensor(starts, device=device)[:, None] + torch.arange(ids.shape[1], device=device)[None, :]
    if read:
        return _read_logits(model, ids, mask, position_ids, cache if width else None, read_idx)
    model(input_ids=ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    own = lambda t, b, n: t[b : b + 1, :, width : width + n]  # noqa: E731
    if width:  # copies: views would keep the whole batch's assembled cache alive
        return [[(own(layer.keys, b, n).clone(), own(layer.values, b, n).clone()) for layer in cache.layers] for b, n in enumerate(lengths)]
    return [[(own(layer.keys, b, n), own(layer.values, b, n)) for layer in cache.layers] for b, n in enumerate(lengths)]


def score_prompts(lm, prompts: Sequence[Prompt], letters: Sequence[Sequence[str]], **kwargs) -> list[LetterMass]:
    """Render, tokenize and score prompts on a LoadedModel; `kwargs` go to `score_ids`."""
    seqs = [encode_prompt(lm.tokenizer, p) for p in prompts]
    letter_tokens = [lm.letters(ls) for ls in letters]
    return score_ids(lm.model, seqs, letter_tokens, pad_id=lm.pad_id, **kwargs)
