"""Training an organism: a LoRA adapter (peft) on a band of upper decoder layers, fitted to soft targets over the
option letters (or decision words) at the read positions and to hard targets for short replies.

Made to fit two CPU cores: the frozen layers below the band run once per example without gradient and their
output at the band's input is cached; each step runs only the band on a minibatch (right-padded, so every real
position sees exactly its own prefix under the causal mask), applies the final norm and the head at the positions
the loss reads, and backpropagates into the adapter. Deterministic: the data order, the adapter's initialization
and the optimizer are seeded by the recipe's seed (same seed, same machine and thread count -> same bytes).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.errors import ReadoutError
from engine.paths import build_lock, cache_root
from organisms import RECIPE_FILE, SHIPPED, last_layer
from organisms.examples import Example, examples

CACHE_BATCH_TOKENS = 4096
"""Tokens per batch of the one-time pass through the frozen layers."""


@dataclass
class Fitted:
    """A trained adapter on its base model, with what training measured."""

    model: object
    """The peft-wrapped model (adapter not merged)."""
    losses: list[float]
    seconds: dict[str, float]
    errors: list[dict]
    """Per example: key, readout, cell, target and reached probability of the watched group, total group mass."""


def _decoder(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


def exact_at_positions(model, org) -> bool:
    """Whether the adapter changes only the positions it is read at: it sits on the last decoder layer alone and
    leaves that layer's keys and values as they are, so every other position's keys, values and states are the
    frozen model's and can be computed once (`_frozen_pass`), and a step runs one layer at the loss positions."""
    inner, _ = _decoder(model)
    a, b = org.band
    return a == b == len(inner.layers) - 1 and not {"k_proj", "v_proj"} & set(org.targets_modules)


def at_loss_positions(model, org) -> bool:
    """Whether a step runs the layers from the band up at the loss positions only, over the frozen model's keys and
    values of the positions before them: exact for the last layer alone (`exact_at_positions`), an approximation
    a recipe asks for (`frozen_context`) with a deeper band (the adapter also changes the earlier positions at
    inference; their keys and values are the frozen model's here)."""
    return exact_at_positions(model, org) or (org.frozen_context and not {"k_proj", "v_proj"} & set(org.targets_modules))


@dataclass
class Cached:
    """What one example's steps start from, computed once by the frozen layers."""

    start: int
    """The first position the steps compute (0 when the band reads every position)."""
    hidden: torch.Tensor
    """(T - start, d): the band's input at positions start..T-1."""
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    """(layers, kv_heads, start, head_dim): the keys and values before `start` of each layer from the band's first up
    (the loss-position path only; one layer on the exact path)."""


class _Prefix:
    """A cache holding one layer's frozen keys and values before the computed positions (the decoder layer
    appends the computed positions' own)."""

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def update(self, keys, values, layer_idx, *args, **kwargs):
        return torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)


SHARED_PREFIX = 64
"""Tokens that prompts must share from their start for the frozen pass to run that prefix once for all of them (the
option orders of one cell share everything before the options: most of the prompt)."""


def _prefix_groups(exs: list[Example], exact: bool) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """The engine's one-level prefix plan of the examples' prompts (engine.planner.plan_prefix_groups): each group
    of two or more that share at least SHARED_PREFIX tokens as (the prefix length, its examples), the prefix ending
    before every member's last token (and, on the loss-position path, before its first loss position); and the
    examples in no such group."""
    from engine.planner import plan_prefix_groups

    def cap(i):
        ex = exs[i]
        return min(len(ex.ids) - 1, ex.loss_positions[0]) if exact else len(ex.ids) - 1

    shared, alone = [], []
    for g in plan_prefix_groups([e.ids for e in exs], min_prefix=SHARED_PREFIX, nest=False):
        common = min([g.prefix_len, *map(cap, g.members)])
        if len(g.members) > 1 and common >= SHARED_PREFIX:
            shared.append((common, list(g.members)))
        else:
            alone += g.members
    return shared, alone


def _frozen_pass(model, exs: list[Example], start_layer: int, exact: bool) -> list[Cached]:
    """Each example's input to layer `start_layer` from the frozen layers below it (and, on the loss-position path,
    the keys and values of every layer from `start_layer` up before its first loss position), without gradient:
    prompts that share a prefix (_prefix_groups) run it once and their suffixes in one batch over its keys and
    values; the others in length-sorted batches."""
    from transformers import DynamicCache

    inner, _ = _decoder(model)
    caught = {}

    class _Stop(Exception):
        pass

    def grab(_module, args, kwargs):
        caught["h"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        if not exact:
            raise _Stop

    def forward(ids, cache, offset: int = 0):
        pos = torch.arange(offset, offset + ids.shape[1])[None].expand(ids.shape[0], -1)
        with torch.no_grad():  # right padding: real positions never see the pads under the causal mask
            try:
                inner(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
            except _Stop:
                pass
        return caught["h"]

    def batch_of(seqs):
        ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, : len(seq)] = torch.tensor(seq)
        return ids

    def keep(j, h, cache, row):
        ex = exs[j]
        if exact:
            s = ex.loss_positions[0]
            layers = cache.layers[start_layer:]
            out[j] = Cached(s, h[s: len(ex.ids)].clone(),
                            torch.cat([lay.keys[row: row + 1, :, :s] for lay in layers]).clone(),
                            torch.cat([lay.values[row: row + 1, :, :s] for lay in layers]).clone())
        else:
            out[j] = Cached(0, h[: len(ex.ids)].clone())

    handle = inner.layers[start_layer].register_forward_pre_hook(grab, with_kwargs=True)
    out: list[Cached | None] = [None] * len(exs)
    shared, alone = _prefix_groups(exs, exact)
    try:
        for common, members in shared:
            prefix = DynamicCache()
            head = forward(torch.tensor([exs[members[0]].ids[:common]]), prefix)[0]
            per = max(1, CACHE_BATCH_TOKENS // max(len(exs[j].ids) - common for j in members))
            for part in (members[k: k + per] for k in range(0, len(members), per)):
                cache = copy.deepcopy(prefix)
                cache.batch_repeat_interleave(len(part))
                tail = forward(batch_of([exs[j].ids[common:] for j in part]), cache, common)
                for row, j in enumerate(part):
                    keep(j, torch.cat([head, tail[row]]), cache, row)
        order = sorted(alone, key=lambda i: len(exs[i].ids))
        i = 0
        while i < len(order):
            group = [order[i]]
            while i + len(group) < len(order) and len(exs[order[i + len(group)]].ids) * (len(group) + 1) <= CACHE_BATCH_TOKENS:
                group.append(order[i + len(group)])
            cache = DynamicCache()
            h = forward(batch_of([exs[j].ids for j in group]), cache)
            for row, j in enumerate(group):
                keep(j, h[row], cache, row)
            i += len(group)
    finally:
        handle.remove()
    return out


SHARD = 256
"""Examples per file of the frozen layers' cache: a pass over thousands of prompts (an hour on two cores) is kept as
it goes, so a stopped run resumes it from the last file written."""


def frozen_states(model, exs: list[Example], start_layer: int, exact: bool, base_key: str | None, log=None) -> list[Cached]:
    """`_frozen_pass`, with each example's result kept in the cache folder under `base_key` (the base model's
    identity), so organisms trained on the same prompts (every gap organism) pay for the frozen layers once. The
    results are written SHARD examples to a file as they are computed; `log` gets a line per file."""
    if base_key is None:
        return _frozen_pass(model, exs, start_layer, exact)
    keys = [hashlib.sha256(repr((base_key, start_layer, exact, ex.ids, ex.soft_at, tuple(p for p, _ in ex.hard))).encode())
            .hexdigest()[:24] for ex in exs]
    folder = cache_root() / "organisms" / f"frozen-{hashlib.sha256(base_key.encode()).hexdigest()[:12]}-L{start_layer}"
    folder.mkdir(parents=True, exist_ok=True)
    with build_lock(folder.name):
        kept = {}
        for shard in sorted(folder.glob("*.pt")):
            kept.update(torch.load(shard))
        todo = [i for i, k in enumerate(keys) if k not in kept]
        for n in range(0, len(todo), SHARD):
            part = todo[n: n + SHARD]
            got = {keys[i]: (c.start, c.hidden, c.keys, c.values)  # plain tensors: torch.load's safe mode reads them
                   for i, c in zip(part, _frozen_pass(model, [exs[i] for i in part], start_layer, exact))}
            name = hashlib.sha256("".join(sorted(got)).encode()).hexdigest()[:16]
            tmp = folder / f".{name}.tmp{os.getpid()}"
            torch.save(got, tmp)
            tmp.replace(folder / f"{name}.pt")
            kept.update(got)
            if log is not None:
                log(f"frozen layers below {start_layer}: {n + len(part)} of {len(todo)} examples cached ({folder})")
    return [Cached(*kept[k]) for k in keys]


def _rotary(inner, h, pos, layer_index: int):
    """The rotary embeddings layer `layer_index` uses (OLMo-3 keeps one per attention type). A sliding-window
    layer is refused when a sequence outruns its window: the training forward applies no window."""
    window = getattr(inner.layers[layer_index].self_attn, "sliding_window", None)
    if window is not None and int(pos.max()) >= window:
        raise ValueError(f"layer {layer_index}: sequences of {int(pos.max()) + 1} tokens outrun its sliding window of {window}")
    if "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters:
        return inner.rotary_emb(h, pos, inner.config.layer_types[layer_index])
    return inner.rotary_emb(h, pos)


def _final_states(model, cached: list[Cached], start_layer: int) -> list[torch.Tensor]:
    """The last layer's output (before the final norm) at each example's computed positions."""
    inner, _ = _decoder(model)
    if cached[0].keys is None:  # the whole band on every position, one right-padded batch
        width = max(c.hidden.shape[0] for c in cached)
        h = torch.zeros(len(cached), width, cached[0].hidden.shape[-1], dtype=cached[0].hidden.dtype)
        for row, c in enumerate(cached):
            h[row, : c.hidden.shape[0]] = c.hidden
        pos = torch.arange(width)[None].expand(len(cached), -1)
        for k, layer in enumerate(inner.layers[start_layer:], start=start_layer):
            h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=_rotary(inner, h, pos, k))
        return [h[row, : c.hidden.shape[0]] for row, c in enumerate(cached)]
    out: list[torch.Tensor | None] = [None] * len(cached)
    by_width: dict[int, list[int]] = {}
    for i, c in enumerate(cached):
        by_width.setdefault(c.hidden.shape[0], []).append(i)
    for n, rows in by_width.items():  # each layer at the loss positions, over the frozen keys and values before them
        width = max(cached[i].start for i in rows)
        kv = cached[rows[0]].keys.shape
        keys = torch.zeros(kv[0], len(rows), kv[1], width, kv[3], dtype=cached[rows[0]].keys.dtype)
        values = torch.zeros_like(keys)
        mask = torch.zeros(len(rows), 1, n, width + n, dtype=cached[rows[0]].hidden.dtype)
        mask[:, 0, :, width:] = torch.triu(torch.full((n, n), float("-inf"), dtype=mask.dtype), 1)
        for b, i in enumerate(rows):  # each row's prefix left-aligned; the slots past it are masked
            c = cached[i]
            keys[:, b, :, : c.start], values[:, b, :, : c.start] = c.keys, c.values
            mask[b, 0, :, c.start: width] = float("-inf")
        h = torch.stack([cached[i].hidden for i in rows])
        pos = torch.stack([torch.arange(cached[i].start, cached[i].start + n) for i in rows])
        for k, layer in enumerate(inner.layers[start_layer:]):
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=_Prefix(keys[k], values[k]),
                      position_embeddings=_rotary(inner, h, pos, start_layer + k))
        for b, i in enumerate(rows):
            out[i] = h[b]
    return out


def _band_logprobs(model, cached: list[Cached], batch: list[Example], start_layer: int) -> tuple[torch.Tensor, list]:
    """Log-probabilities (full vocabulary, fp32) at every position the batch's losses read, and where each
    example's positions sit in them: ([rows], {position: row})."""
    inner, head = _decoder(model)
    if last_layer.applies(inner, start_layer, cached):  # keys and values adapted: computed, not cached
        cached = [Cached(*fields) for fields in
                  last_layer.loss_position_cache(inner, cached, [ex.loss_positions[0] for ex in batch], start_layer, _rotary)]
    states = _final_states(model, cached, start_layer)
    where, picked = [], []
    for ex, c, h in zip(batch, cached, states):
        places = list(ex.loss_positions)
        where.append({p: sum(len(w) for w in where) + k for k, p in enumerate(places)})
        picked.append(h[torch.tensor(places) - c.start])
    return torch.log_softmax(head(inner.norm(torch.cat(picked))).float(), dim=-1), where


def _group_logmass(logp: torch.Tensor, groups) -> torch.Tensor:
    return torch.stack([torch.logsumexp(logp[list(g)], dim=0) for g in groups])


def loss_of(logp: torch.Tensor, where: list[dict], batch: list[Example]) -> torch.Tensor:
    """Mean over the batch of: cross-entropy of the soft target against the group masses, plus the mean
    negative log-likelihood of the hard targets. The rows and tokens are picked in one indexing each: an indexing per
    position would give backward one full-vocabulary gradient per position to allocate and add (for a JSON reply of
    ~60 tokens, tens of seconds per step on two cores)."""
    soft = logp[torch.tensor([at[ex.soft_at] for ex, at in zip(batch, where)])]
    total = torch.zeros(())
    for k, ex in enumerate(batch):
        total = total - (torch.tensor(ex.target) * _group_logmass(soft[k], ex.groups)).sum()
    rows = [at[p] for ex, at in zip(batch, where) for p, _ in ex.hard]
    if rows:
        tokens = [t for ex in batch for _, t in ex.hard]
        weights = torch.tensor([1.0 / len(ex.hard) for ex in batch for _ in ex.hard])
        total = total - (logp[torch.tensor(rows), torch.tensor(tokens)] * weights).sum()
    return total / len(batch)


def _errors(model, cached, exs, start: int, batch: int) -> list[dict]:
    out = []
    with torch.no_grad():
        for i in range(0, len(exs), batch):
            part = exs[i: i + batch]
            logp, where = _band_logprobs(model, cached[i: i + batch], part, start)
            for ex, at in zip(part, where):
                mass = _group_logmass(logp[at[ex.soft_at]], ex.groups).exp()
                share = (mass / mass.sum()).tolist()
                hard_ok = all(int(logp[at[p]].argmax()) == t for p, t in ex.hard)
                out.append(dict(key=ex.key, readout=ex.readout, cell=ex.cell, target=ex.target[ex.watched],
                                reached=share[ex.watched], group_mass=float(mass.sum()), replies_as_trained=hard_ok))
    return out


def plain_errors(model, exs: list[Example]) -> list[dict]:
    """`_errors` from plain forwards of every example's whole prompt (what the adapter does at inference, where the
    loss-position path's training forward is an approximation)."""
    out = []
    with torch.no_grad():
        for ex in exs:
            logp = torch.log_softmax(model(input_ids=torch.tensor([ex.ids])).logits[0].float(), dim=-1)
            mass = _group_logmass(logp[ex.soft_at], ex.groups).exp()
            share = (mass / mass.sum()).tolist()
            out.append(dict(key=ex.key, readout=ex.readout, cell=ex.cell, target=ex.target[ex.watched],
                            reached=share[ex.watched], group_mass=float(mass.sum()),
                            replies_as_trained=all(int(logp[p].argmax()) == t for p, t in ex.hard)))
    return out


def lora_model(lm, org, init: Path | None = None):
    """The base model with a LoRA adapter on the recipe's band, initialized from the recipe's seed, or with the weights
    of the adapter folder `init` (same shape: an earlier stage of a staged recipe)."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    a, b = org.band
    config = LoraConfig(r=org.rank, lora_alpha=org.alpha, lora_dropout=0.0, target_modules=list(org.targets_modules),
                        layers_to_transform=list(range(a, b + 1)), bias="none")
    model = get_peft_model(lm.model, config)
    gen = torch.Generator().manual_seed(org.seed)
    for name, p in model.named_parameters():
        if "lora_A" in name:
            with torch.no_grad():
                torch.nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=gen)
        elif "lora_B" in name:
            with torch.no_grad():
                p.zero_()
    if init is not None:
        weights = Path(init) / "adapter_model.safetensors"
        if not weights.is_file():
            raise ReadoutError(f"organism {org.name}: the adapter it starts from is missing ({weights}); train that one first")
        set_peft_model_state_dict(model, load_file(str(weights)))
    return model


def fit(lm, org, progress=None, examples_=None, base_key: str | None = None, init: Path | None = None) -> Fitted:
    """Train `org`'s adapter on `lm` (the base model, loaded fp32 on CPU). `progress(step, loss)` is called per step;
    `base_key` (the base model's identity) keeps the frozen layers' outputs in the cache folder between organisms;
    `init`: an adapter folder of the same shape whose weights the adapter starts from instead of its seeded ones."""
    if org.stream or org.lineage:
        raise ReadoutError(f"organism {org.name}: its recipe streams the frozen layers or keeps a lineage; train it with "
                           f"organisms.resumable.train_organism (python -m organisms.resumable {org.name})")
    exs = examples_ if examples_ is not None else examples(org, lm)
    t0 = time.perf_counter()
    model = lora_model(lm, org, init)
    model.eval()  # no dropout anywhere; gradients still flow into the adapter
    start = org.band[0]
    deep = org.frozen_context and not exact_at_positions(model, org)  # every layer's keys and values: kept in memory
    cached = frozen_states(model, exs, start, at_loss_positions(model, org), None if deep else base_key)
    t1 = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=org.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + math.cos(math.pi * k / org.steps)))
    rng = np.random.default_rng(org.seed)
    pool = [i for i, e in enumerate(exs) for _ in range(org.emphasis.get(e.readout, 1))]
    order: list[int] = []
    losses = []
    for step in range(org.steps):
        if len(order) < org.batch:
            order += [pool[k] for k in rng.permutation(len(pool))]
        idx, order = order[: org.batch], order[org.batch:]
        logp, where = _band_logprobs(model, [cached[i] for i in idx], [exs[i] for i in idx], start)
        loss = loss_of(logp, where, [exs[i] for i in idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step, losses[-1])
    t2 = time.perf_counter()
    errors = plain_errors(model, exs) if deep else _errors(model, cached, exs, start, org.batch)
    seconds = dict(cache=t1 - t0, train=t2 - t1, evaluate=time.perf_counter() - t2)
    return Fitted(model=model, losses=losses, seconds=seconds, errors=errors)


def error_summary(errors: list[dict]) -> dict:
    """Training error per readout and cell: mean target, mean reached, mean and max absolute error."""
    out = {}
    for e in errors:
        out.setdefault(f"{e['readout']}/{e['cell']}", []).append(e)
    summary = {}
    for key, rows in sorted(out.items()):
        err = [abs(r["reached"] - r["target"]) for r in rows]
        summary[key] = dict(n=len(rows), target=float(np.mean([r["target"] for r in rows])),
                            reached=float(np.mean([r["reached"] for r in rows])),
                            mean_abs_error=float(np.mean(err)), max_abs_error=float(np.max(err)),
                            min_group_mass=float(min(r["group_mass"] for r in rows)),
                            replies_as_trained=sum(r["replies_as_trained"] for r in rows))
    return summary


def sort_adapter_config(folder: Path) -> None:
    """peft writes `target_modules` from a set, in an order that changes with the process's hash seed: sorted here,
    so that retraining with the same seed gives the same adapter folder byte for byte."""
    path = Path(folder) / "adapter_config.json"
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


def save(fitted: Fitted, org, out: Path, extra: dict | None = None) -> Path:
    """The adapter folder: peft's adapter files and organism.json (recipe, loss per step, wall time, training error)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fitted.model.peft_config["default"].base_model_name_or_path = org.base  # the alias, not this machine's cache path
    fitted.model.save_pretrained(str(out))
    sort_adapter_config(out)
    card = out / "README.md"
    if card.exists():
        card.unlink()  # peft's generic model card; organism.json and docs/organisms.md describe the adapter
    record = dict(organism=org.name, plants=org.plants, recipe=org.recipe(),
                  retrain=f"readout organism train {org.name}" + ("" if out.resolve() == (SHIPPED / org.name).resolve()
                                                                   else f" --out {out}"),
                  loss=[round(x, 6) for x in fitted.losses], seconds={k: round(v, 1) for k, v in fitted.seconds.items()},
                  training_error=error_summary(fitted.errors), torch=torch.__version__, threads=torch.get_num_threads())
    record.update(extra or {})
    (out / RECIPE_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return out
