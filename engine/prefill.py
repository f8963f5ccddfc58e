"""The decode state's prefill: the keys/values of a batch's distinct prompts (all but their last token),
through the scoring prefix tree, so that prompts sharing a prefix run it once."""

from __future__ import annotations

from engine.batching import cache_token_limit, halving_on_oom, pad_rows, token_batches
from engine.planner import PrefixGroup, chain, plan_prefix_groups, representatives
from engine.scoring import _Bounds, _forward_on_nodes, _node_kv, _Tree


def prefill_prompts(model, heads, pad_id, device, token_budget, max_rows, share, stats):
    """Keys/values of the prompts' heads ([P, Hkv, longest, D] per layer, keys and values; zero past a head's
    end), through the scoring prefix tree: a prefix shared by several heads is computed once, each head's
    remaining tokens on top of it."""
    live = [i for i, h in enumerate(heads) if h]
    if not live:
        return [], []
    seqs = [heads[i] for i in live]
    window = getattr(model.config, "sliding_window", None)
    if window and 2 * max(len(s) for s in seqs) >= window:
        share = False  # as in scoring: padded shared prefixes would shift cache positions under a sliding window
    stats.prompt_tokens += sum(len(s) for s in seqs)
    held = cache_token_limit(model, device, token_budget, longest=max(len(s) for s in seqs))
    if share:
        plan = plan_prefix_groups(seqs)
        tree = _Tree(model, plan, {}, pad_id, device, stats)
        _node_kv(tree, seqs, representatives(plan), list(range(len(plan))), {}, _Bounds(token_budget, held, max_rows))
        node_kv = tree.kv
        forward = lambda rows: _forward_on_nodes(tree, rows, read=False)  # noqa: E731
    else:
        plan, node_kv = [PrefixGroup(0, (i,)) for i in range(len(seqs))], {}
        forward = lambda rows: _plain_kv(model, [tokens for tokens, _ in rows], pad_id, device, stats)  # noqa: E731
    node_of = {u: k for k, g in enumerate(plan) for u in g.members}
    items = sorted(node_of.items(), key=lambda it: (len(seqs[it[0]]) - plan[it[1]].prefix_len, len(seqs[it[0]])))
    cost = lambda it: (len(seqs[it[0]]) - plan[it[1]].prefix_len, len(seqs[it[0]]))  # noqa: E731
    tails = {}
    for batch in token_batches(items, cost, token_budget, held, max_rows):
        rows = [(seqs[u][plan[k].prefix_len:], k) for u, k in batch]
        kv = halving_on_oom(forward, rows, lambda a, b: a + b, stats)
        tails.update({u: layers for (u, _), layers in zip(batch, kv)})
    some = tails[0]
    longest = max(len(h) for h in heads)
    kp = [some_k.new_zeros((len(heads), some_k.shape[1], longest, some_k.shape[3])) for some_k, _ in some]
    vp = [some_v.new_zeros((len(heads), some_v.shape[1], longest, some_v.shape[3])) for _, some_v in some]
    for u, i in enumerate(live):
        k = node_of[u]
        pieces = [(start, node_kv[node]) for node, start in chain(plan, k)] + [(plan[k].prefix_len, tails[u])]
        for start, layers in pieces:
            n = layers[0][0].shape[2]
            for layer, (keys, values) in enumerate(layers):
                kp[layer][i, :, start : start + n] = keys[0]
                vp[layer][i, :, start : start + n] = values[0]
    return kp, vp


def _plain_kv(model, rows, pad_id, device, stats):
    """Keys/values of token rows run from scratch (right-padded, each row's real tokens first), in a cache
    that keeps every layer whole: transformers' sliding-window cache layers would drop early keys, and with
    padding the wrong ones."""
    from transformers import DynamicCache

    ids, mask = pad_rows(rows, pad_id, device)
    stats.forward_passes += 1
    stats.computed_tokens += sum(len(r) for r in rows)
    stats.padded_tokens += ids.numel()
    cache = DynamicCache()
    model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return [[(layer.keys[b : b + 1, :, : len(r)], layer.values[b : b + 1, :, : len(r)]) for layer in cache.layers]
            for b, r in enumerate(rows)]
