"""Scoring: the probability mass a model puts on each option letter at the next token.

Two paths compute the same numbers. The plain path runs one prompt at a time through the full model
(the reference). The fast path (the default) runs identical prompts once, plans a prefix tree (the
template header once, each scenario's context once on top of it, each first option line once on top of
that...: a node runs only its own tokens on its parent's KV cache), then forms length-sorted batches
bounded by a token budget, and applies the output head only at the read positions. Tests hold the fast
path equal to the plain one within float tolerance.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from engine.batching import cache_token_limit, default_bounds, halving_on_oom, pad_rows, spread_over_devices, token_batches
from engine.errors import NonFiniteLogitsError, ProbeInputError
from engine.head import head_fp32, head_scaling
from engine.letters import LetterTokens
from engine.planner import PrefixGroup, by_known_prefix, chain, node_start, plan_prefix_groups, representatives, waves
from engine.render import Prompt, encode_prompt
from engine.residuals import Patch, ReadHooks
from engine.sampling import tempered_distribution

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
    residuals: torch.Tensor | None = field(default=None, compare=False, repr=False)
    """[depths, hidden] fp32 CPU: the read position's residual stream at each depth (engine/residuals.py), or None."""

    def as_dict(self) -> dict:
        return {
            "mass": dict(zip(self.letters, self.mass)),
            "letter_mass": self.letter_mass,
            "option_mass": dict(zip(self.letters, self.option_mass)),
            "tempered": dict(zip(self.letters, self.tempered)),
            "tokens": self.n_tokens,
        }


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


def letter_masses(
    logits: torch.Tensor, letters: Sequence[LetterTokens], lengths: Sequence[int], temperature: float, top_p: float
) -> list[LetterMass]:
    """LetterMass rows from next-token logits [B, V] (any dtype; computed in fp32)."""
    logits = logits.float()
    probs = logits.softmax(-1)
    tempered = tempered_distribution(logits, temperature, top_p)
    # One gather for the whole batch (each row's letters x variants, padded) and one transfer to the host.
    width = max(len(lt.token_ids) for lt in letters)
    variants = max(len(ids) for lt in letters for ids in lt.token_ids)
    index = torch.zeros((len(letters), width, variants), dtype=torch.long)
    keep = torch.zeros((len(letters), width, variants), dtype=torch.bool)
    for row, lt in enumerate(letters):
        for j, ids in enumerate(lt.token_ids):
            index[row, j, : len(ids)] = torch.tensor(ids)
            keep[row, j, : len(ids)] = True
    index, keep = index.to(probs.device).flatten(1), keep.to(probs.device)
    both = torch.stack([probs.gather(1, index), tempered.gather(1, index)]).view(2, *keep.shape)
    sums = both.masked_fill(~keep, 0.0).sum(-1).cpu().tolist()  # [2][row][letter]
    # Logits that are NaN or infinite anywhere in a row (or all -inf) make its whole softmax NaN, so its letters' sums
    # say so: no further pass over the logits.
    bad = [row for row in range(len(letters)) if not all(map(math.isfinite, sums[0][row] + sums[1][row]))]
    if bad:
        raise NonFiniteLogitsError(
            f"reading letters: the logits read were NaN or infinite for {len(bad)} of {len(letters)} rows read together "
            f"(first: row {bad[0]}{f', a prompt of {lengths[bad[0]]} tokens' if lengths[bad[0]] else ''}); the model's "
            f"weights, or a dtype too narrow for its activations, put them out of range")
    out = []
    for row, (lt, n) in enumerate(zip(letters, lengths)):
        mass, temp = sums[0][row][: len(lt.token_ids)], sums[1][row][: len(lt.token_ids)]
        total = sum(mass)
        option = [m / total for m in mass] if total > 0 else [float("nan")] * len(mass)
        out.append(LetterMass(lt.letters, tuple(mass), total, tuple(option), tuple(temp), int(n)))
    return out


def _plain_head(model) -> bool:
    cfg = model.config
    return cfg.model_type in PLAIN_HEAD_MODEL_TYPES and head_scaling(cfg) is None and hasattr(model, "base_model")


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
        # Under a multi-GPU device map the last hidden states end on the last device, not the inputs' one.
        picked = hidden[rows.to(hidden.device), read_idx.to(hidden.device)]
        weight, bias = head_fp32(model)
        return torch.nn.functional.linear(picked.to(weight.device, torch.float32), weight, bias)
    positions, inverse = torch.unique(read_idx, return_inverse=True)
    if spread_over_devices(model):  # the model slices its last hidden states, on the last device, with these
        positions = positions.cpu()  # host indices index a tensor on any device
    logits = model(**kwargs, logits_to_keep=positions).logits  # [B, U, V]
    return logits[rows.to(logits.device), inverse.to(logits.device)].float()


HEAD_FP32_TOLERANCE = 0.02
"""Documented bf16 tolerance: with the body in bf16 and the head applied in fp32 at the read positions, a
letter's normalized option mass stays within this of the fp32 model's (tests/engine/test_bf16_head.py; measured
on the embedded model with 40 prompts: mean 0.007, max 0.025, against mean 0.017, max 0.051 with the head in
bf16)."""


def plain_next_token_logits(model, ids: Sequence[int]) -> torch.Tensor:
    """Reference: one prompt, full model forward, logits [V] at the last position."""
    device = model.get_input_embeddings().weight.device
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    return out.logits[0, -1].float()


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
    residuals: bool = False,
    patches: Sequence[Patch | None] | None = None,
) -> list[LetterMass]:
    """Letter masses for tokenized prompts, each read at the token after its last one.

    `fast=False` is the plain one-prompt-at-a-time reference. `token_budget` bounds padded tokens per
    forward pass; `max_batch` bounds rows. `stats`, if given, receives the work counters.
    `known_prefixes` ({token tuple: [(keys, values) per layer]}, e.g. from `generate(prefix_kv=...)`) are
    prefixes whose cache is already computed: prompts starting with one reuse it instead of running it.
    `residuals=True` also captures each prompt's residual stream at its read position at every depth, in the
    same forwards (`LetterMass.residuals`). `patches` (one per prompt, or None) replace a prompt's stream at
    its read position at one depth before the read (engine/residuals.py: `patched_logits` patches any position).
    """
    seqs = _checked(model, seqs, letters)
    patches = list(patches) if patches is not None else [None] * len(seqs)
    if len(patches) != len(seqs) or any(p is not None and p.position is not None for p in patches):
        raise ProbeInputError("patches: one per prompt, each at the read position (position None)")
    hooks = ReadHooks(model, capture=residuals) if residuals or any(p is not None for p in patches) else None
    with hooks if hooks is not None else nullcontext():
        results = _score(model, seqs, letters, hooks, patches, temperature, top_p, fast, prefix_reuse, token_budget,
                         max_batch, min_prefix, pad_id, progress, stats, known_prefixes)
    if residuals:
        results = [replace(r, residuals=hooks.captured[i]) for i, r in enumerate(results)]
    return results


def _score(model, seqs, letters, hooks, patches, temperature, top_p, fast, prefix_reuse, token_budget, max_batch,
           min_prefix, pad_id, progress, stats, known_prefixes):
    """score_ids on checked prompts; `hooks` (or None) is armed for every read forward, keyed by prompt index."""
    from tqdm.auto import tqdm

    stats = stats if stats is not None else ScoreStats()
    stats.prompt_tokens += sum(len(s) for s in seqs)
    results: list[LetterMass | None] = [None] * len(seqs)
    bar = tqdm(total=len(seqs), desc="scoring", unit="probe", disable=not progress, leave=False)

    if not fast:
        for i, s in enumerate(seqs):
            if hooks is not None:
                hooks.arm([len(s) - 1], [i], [patches[i]])
            logits = plain_next_token_logits(model, s)
            if hooks is not None:
                hooks.commit()
            results[i] = letter_masses(logits[None], [letters[i]], [len(s)], temperature, top_p)[0]
            stats.computed_tokens, stats.padded_tokens, stats.forward_passes = (
                stats.computed_tokens + len(s), stats.padded_tokens + len(s), stats.forward_passes + 1)
            bar.update(1)
        bar.close()
        return results

    device = model.get_input_embeddings().weight.device
    default_budget, default_batch = default_bounds("score", device)
    budget = token_budget or default_budget
    max_batch = max_batch or default_batch
    # Identical prompts run once (their logits are the same); each is still read with its own letters.
    readers: dict = {}
    for i, s in enumerate(seqs):
        # A patched prompt is its own reader; an identical unpatched one shares its read and its capture.
        readers.setdefault((tuple(s), i if patches[i] is not None else None) if prefix_reuse else i, []).append(i)
    copies = list(readers.values())
    stats.duplicates += len(seqs) - len(copies)
    uniq = [seqs[c[0]] for c in copies]
    window = getattr(model.config, "sliding_window", None)
    if window and 2 * max(len(s) for s in uniq) >= window:
        # Shared prefixes are padded to a common cache length, which shifts cache positions; keep the
        # sliding-window mask exact by not reusing prefixes when sequences approach the window.
        prefix_reuse = False
    plan, given = _plan(uniq, prefix_reuse, known_prefixes, min_prefix)
    stats.prefix_groups += sum(1 for g in plan if g.prefix_len)
    stats.group_sizes += [len(g.members) for g in plan if g.prefix_len and g.members]

    with torch.inference_mode():
        held = cache_token_limit(model, device, budget, longest=max(map(len, uniq), default=1))
        node_waves, done_after = waves(plan, held)
        tree = _Tree(model, plan, {}, pad_id, device, stats, hooks, [[patches[c[0]], c[0]] for c in copies])
        kv = tree.kv
        rep = representatives(plan)
        bounds = _Bounds(budget, held, max_batch)
        for w, wave in enumerate(node_waves):
            _node_kv(tree, uniq, rep, wave, given, bounds)
            cached = sum(layers[0][0].shape[2] for layers in kv.values())
            stats.peak_cached_tokens = max(stats.peak_cached_tokens, cached)
            items = [(u, node, plan[node].prefix_len) for node in wave for u in plan[node].members]
            for batch, logits in _read_wave(tree, uniq, items, bounds):
                picks = [(row, i) for row, (u, _, _) in enumerate(batch) for i in copies[u]]
                masses = letter_masses(logits[[row for row, _ in picks]], [letters[i] for _, i in picks],
                                       [len(seqs[i]) for _, i in picks], temperature, top_p)
                for (row, i), mass in zip(picks, masses):
                    results[i] = mass
                    if hooks is not None and hooks.capture:  # filed under the first copy's index
                        hooks.captured[i] = hooks.captured[copies[batch[row][0]][0]]
                bar.update(len(picks))
            for k in [k for k in kv if done_after[k] == w]:
                del kv[k]
    bar.close()
    return results


def _checked(model, seqs, letters) -> list[list[int]]:
    """The prompts as lists, after the checks that keep a bad input from reaching the model."""
    if len(seqs) != len(letters):
        raise ProbeInputError(f"{len(seqs)} prompts but {len(letters)} letter sets")
    seqs = [list(s) for s in seqs]
    if any(len(s) == 0 for s in seqs):
        raise ProbeInputError("a prompt encodes to zero tokens")
    vocab = model.get_output_embeddings().weight.shape[0]
    for lt in letters:
        if any(t >= vocab for ids in lt.token_ids for t in ids):
            raise ProbeInputError(f"letters {list(lt.letters)}: a token id is beyond the model's {vocab} output rows")
    return seqs


def _plan(uniq, prefix_reuse: bool, known_prefixes, min_prefix: int) -> tuple[list[PrefixGroup], dict[int, list]]:
    """The prefix tree over the distinct prompts, and {node index: keys/values} of the known prefixes it roots on:
    one tree per known prefix the prompts start with (rooted on its cache), one for the rest."""
    if not prefix_reuse:
        return [PrefixGroup(0, (i,)) for i in range(len(uniq))], {}
    plan: list[PrefixGroup] = []
    given: dict[int, list] = {}
    for key, indices in by_known_prefix(uniq, known_prefixes).items():
        offset = len(plan)
        for g in plan_prefix_groups([uniq[i] for i in indices], min_prefix=min_prefix, cached=len(key)):
            parent = None if g.parent is None else g.parent + offset
            plan.append(PrefixGroup(g.prefix_len, tuple(indices[m] for m in g.members), parent))
        if key:
            given[offset] = known_prefixes[key]
    return plan, given


def _read_wave(tree: "_Tree", uniq, items, bounds: "_Bounds"):
    """(batch, next-token logits) for the prompts read on a wave's nodes: items (prompt, node, prefix length),
    batched shortest remainder first."""
    items = sorted(items, key=lambda it: (len(uniq[it[0]]) - it[2], it[2]))
    cost = lambda it: (len(uniq[it[0]]) - it[2], len(uniq[it[0]]))  # noqa: E731
    for batch in token_batches(items, cost, bounds.budget, bounds.held, bounds.max_batch):
        rows = [(uniq[u][plen:], node, u) for u, node, plen in batch]
        yield batch, halving_on_oom(lambda b: _forward_on_nodes(tree, b, read=True), rows,
                                    lambda a, b: torch.cat([a, b]), tree.stats)


@dataclass
class _Tree:
    """A prefix-tree plan being executed on one model: the plan, the node caches computed so far, and
    what every forward pass needs."""

    model: object
    plan: list[PrefixGroup]
    kv: dict
    """{node: [(keys, values) per layer]}: each node's own tokens only (from its parent's prefix on)."""
    pad_id: int
    device: torch.device
    stats: ScoreStats
    hooks: ReadHooks | None = None
    """Armed for each read forward (residual capture, patches), or None."""
    reads: list | None = None
    """Per distinct prompt: [its patch or None, the prompt index its capture is filed under]."""


@dataclass(frozen=True)
class _Bounds:
    """Batch bounds of one scoring call."""

    budget: int
    """Padded tokens per forward pass."""
    held: int
    """Tokens of keys/values attended at once (context budget)."""
    max_batch: int
    """Rows per forward pass."""


def _node_kv(tree: _Tree, seqs, rep, wave, given, bounds: _Bounds):
    """Compute a wave's cached nodes into `tree.kv`, level by level, each on top of its parent's cache.

    `tree.kv` already holds the ancestors from earlier waves; known prefixes (`given`) are taken as they
    are. `rep[k]` is a prompt whose first tokens are node k's.
    """
    plan, kv = tree.plan, tree.kv
    kv.update({k: given[k] for k in wave if k in given})
    depth: dict[int, int] = {}

    def depth_of(k):
        if k not in depth:
            depth[k] = 0 if plan[k].parent is None else depth_of(plan[k].parent) + 1
        return depth[k]

    def cost(k):  # (own tokens run, context attended)
        return plan[k].prefix_len - node_start(plan, k), plan[k].prefix_len

    todo = [k for k in wave if plan[k].prefix_len and k not in kv]
    for level in sorted({depth_of(k) for k in todo}):
        nodes = sorted((k for k in todo if depth[k] == level), key=cost)
        for batch in token_batches(nodes, cost, bounds.budget, bounds.held, bounds.max_batch):
            rows = [(seqs[rep[k]][node_start(plan, k) : plan[k].prefix_len], plan[k].parent) for k in batch]
            out = halving_on_oom(lambda b: _forward_on_nodes(tree, b, read=False), rows, lambda a, b: a + b, tree.stats)
            kv.update(zip(batch, out))


def _forward_on_nodes(tree: _Tree, rows, read: bool):
    """One forward pass of token rows, each on top of its node's cache (node None or prefix 0: no cache).

    Rows are right-padded: real positions never attend to the padding (causal), so their keys/values are
    exact. `read=True` returns the next-token logits [B, V] at each row's last token; `read=False` returns
    each row's new keys/values ([(keys, values) per layer], its real tokens only).
    """
    from transformers import DynamicCache

    model, plan, kv, device, stats = tree.model, tree.plan, tree.kv, tree.device, tree.stats
    ids, new_mask = pad_rows([row[0] for row in rows], tree.pad_id, device)
    lengths = [len(row[0]) for row in rows]
    stats.forward_passes += 1
    stats.computed_tokens += sum(lengths)
    stats.padded_tokens += ids.numel()
    read_idx = torch.tensor([n - 1 for n in lengths], device=device)
    starts = [plan[row[1]].prefix_len if row[1] is not None else 0 for row in rows]
    width = max(starts)
    cache = DynamicCache(config=model.config)
    mask, position_ids = new_mask, None
    if width:
        on_node: dict = {}
        for r, row in enumerate(rows):
            on_node.setdefault(row[1], []).append(r)
        chains = {node: [kv[k] for k, _ in chain(plan, node)] for node in on_node}
        some = next(c for c in chains.values() if c)[0]
        for layer in range(len(some)):
            parts = []
            for which in (0, 1):
                prefixes = {node: torch.cat([piece[layer][which] for piece in links], dim=2) if len(links) > 1 else links[0][layer][which]
                            for node, links in chains.items() if links}
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
        if tree.hooks is not None:
            tree.hooks.arm(read_idx.tolist(), [tree.reads[row[2]][1] for row in rows], [tree.reads[row[2]][0] for row in rows])
        logits = _read_logits(model, ids, mask, position_ids, cache if width else None, read_idx)
        if tree.hooks is not None:
            tree.hooks.commit()
        return logits
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
