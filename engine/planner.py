"""The prefix-tree planner: which token prefixes to run once and cache, so that prompts sharing a
prefix (the template header, a scenario's context, an option line) compute it once. Pure Python over
token-id lists; it knows nothing of models or tensors (engine/scoring.py executes a plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


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


def by_known_prefix(seqs, known_prefixes) -> dict[tuple, list[int]]:
    """Prompts grouped by the longest known prefix they start with (and leave a token after); () = none.
    A store that serves prefixes of its entries too (engine.rowcache.RowCaches) says which with `longest_prefix`."""
    longest = getattr(known_prefixes, "longest_prefix", None)
    lengths = sorted({len(k) for k in known_prefixes or ()}, reverse=True)
    out: dict[tuple, list[int]] = {}
    for i, s in enumerate(seqs):
        if longest is not None:
            hit = longest(s)
        else:
            hit = next((L for L in lengths if L < len(s) and tuple(s[:L]) in known_prefixes), 0)
        out.setdefault(tuple(s[:hit]), []).append(i)
    return out


def representatives(plan: list[PrefixGroup]) -> list[int | None]:
    """Per node, one prompt of its subtree (its tokens up to the node's prefix are the node's tokens)."""
    rep: list[int | None] = [None] * len(plan)
    for k in range(len(plan) - 1, -1, -1):  # children come after their parents
        g = plan[k]
        if rep[k] is None and g.members:
            rep[k] = g.members[0]
        if g.parent is not None and rep[g.parent] is None:
            rep[g.parent] = rep[k]
    return rep


def node_start(plan: list[PrefixGroup], node: int) -> int:
    """Where a node's own tokens begin: its parent's prefix length."""
    parent = plan[node].parent
    return plan[parent].prefix_len if parent is not None else 0


def waves(plan: list[PrefixGroup], limit: int) -> tuple[list[list[int]], dict[int, int]]:
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
        own = plan[k].prefix_len - node_start(plan, k)
        if waves[-1] and tokens + own > limit:
            waves.append([])
            tokens = 0
        waves[-1].append(k)
        wave_of.append(len(waves) - 1)
        tokens += own
    return waves, {k: wave_of[last[k]] for k in order}


def chain(plan: list[PrefixGroup], node: int | None) -> list[tuple[int, int]]:
    """(node, start) of each cached node whose own keys/values make up `node`'s cache, root first."""
    out = []
    while node is not None and plan[node].prefix_len:
        out.append((node, node_start(plan, node)))
        node = plan[node].parent
    return out[::-1]


def planned_tokens(seqs: Sequence[Sequence[int]], plan: list[PrefixGroup]) -> int:
    """Tokens a plan runs: each node's own tokens once, and each member's tokens after its node's prefix."""
    nodes = sum(g.prefix_len - node_start(plan, k) for k, g in enumerate(plan))
    return nodes + sum(len(seqs[m]) - g.prefix_len for g in plan for m in g.members)
