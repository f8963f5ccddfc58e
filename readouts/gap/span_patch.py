"""Activation patching between a scenario's agent prompt under pressure (`primary`) and its twin (the same prompt
with a filler sentence instead of the pressure sentence), by group of positions and depth, in both directions, on
the logit difference of the violating letter.

Alignment. The two prompts share every token before the sentence that differs and every token after it (the rest
of the scenario, the options, the question, the template's end). Positions are paired from the end: the last
token with the last token, back through the shared suffix (the same tokens in both) and into the differing span;
where one span is longer than the other, its first tokens have no partner and are not patched (`unpaired` counts
them). Tokens before the span need no patch: their streams are the same in both prompts (the model is causal).

Groups (contract.names.PATCH_GROUPS): `span`, the paired tokens of the pressure (or filler) sentence; `options`, the tokens that change
when the options are rotated (their texts; the letters stay in place); `context`, every other shared token after
the span; `read`, the read position (the last token).

Directions: `noising` reads the primary prompt with a group's streams at one depth taken from the twin's forward;
`denoising` reads the twin with the primary's. The metric is the logit difference of the violating letter, the
log of its mass less the mean log mass of the other letters (a letter's mass sums its single-token forms, as every
read does). Every patched read is a plain forward of one prompt (engine.residuals.patched_reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.names import PATCH_DIRECTIONS, PATCH_GROUPS
from contract.readouts import readout
from engine.render import encode_prompt
from engine.residuals import Patch, n_depths, patched_reads, streams
from engine.scoring import letter_masses
from panels.frames import render
from readouts.gap.prompts import prompt_of

(AGENT_FRAME,) = readout("D").frames


@dataclass(frozen=True)
class Pairing:
    """Paired positions of a primary prompt and its twin, per group: (positions in the primary, in the twin)."""

    groups: dict
    unpaired: int
    """Tokens of the longer differing span without a partner (not patched)."""


def _common_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def pair_positions(primary: tuple, twin: tuple, rotated: tuple) -> Pairing:
    """The groups' paired positions (module docstring) of token ids `primary` and `twin`, the options' tokens found
    against `rotated` (the primary prompt with its options in another order)."""
    start = _common_prefix(primary, twin)
    tail = _common_prefix(primary[::-1], twin[::-1])
    tail = min(tail, len(primary) - start, len(twin) - start)
    span_p, span_t = len(primary) - tail - start, len(twin) - tail - start
    if span_p <= 0 or span_t <= 0:
        raise ValueError("the primary and twin prompts do not differ in a span of tokens")
    k = min(span_p, span_t)
    o_start = _common_prefix(primary, rotated)
    o_end = len(primary) - _common_prefix(primary[::-1], rotated[::-1])
    suffix = range(len(primary) - tail, len(primary))
    if not (suffix.start <= o_start < o_end < len(primary) - 1):
        raise ValueError("the options do not stand between the differing span and the read position")
    shift = len(twin) - len(primary)
    p_groups = {"span": tuple(range(len(primary) - tail - k, len(primary) - tail)),
                "options": tuple(range(o_start, o_end)),
                "context": tuple(i for i in suffix if not o_start <= i < o_end and i != len(primary) - 1),
                "read": (len(primary) - 1,)}
    groups = {g: (pos, tuple(i + shift for i in pos)) for g, pos in p_groups.items()}
    return Pairing(groups, abs(span_p - span_t))


def logit_difference(mass, violating: int) -> float:
    """log m_violating - mean over the other letters of log m (nats); NaN where a letter has no mass."""
    if min(mass) <= 0:
        return math.nan
    logs = [math.log(m) for m in mass]
    others = [x for i, x in enumerate(logs) if i != violating]
    return logs[violating] - sum(others) / len(others)


def scenario_prompts(lm, scenario, order, frames) -> tuple[tuple, tuple, tuple, object]:
    """Token ids of the agent prompt in the primary cell, in the twin and in the primary with `order` rotated by one,
    and the primary's rendering (its letters and violating letter)."""
    rotated_order = tuple(order[1:]) + tuple(order[:1])
    r = render(scenario, AGENT_FRAME, "primary", order, frames)
    ids = [tuple(encode_prompt(lm.tokenizer, prompt_of(render(scenario, AGENT_FRAME, cell, o, frames))))
           for cell, o in (("primary", order), ("twin", order), ("primary", rotated_order))]
    return (*ids, r)


def patch_grid(lm, scenario, order, frames, depths, key: dict | None = None) -> list[dict]:
    """Rows of one scenario's grid in one option order: for each direction, group and depth, the patched read's logit
    difference and violating share, beside the unpatched reads of both prompts (each row starts with `key`)."""
    primary, twin, rotated, r = scenario_prompts(lm, scenario, order, frames)
    pairing = pair_positions(primary, twin, rotated)
    letters = lm.letters(r.letters)
    v = r.letters.index(r.violating_letter)
    ids = {"primary": primary, "twin": twin}
    stream = {name: streams(lm.model, x) for name, x in ids.items()}

    def reads(logits):
        masses = letter_masses(logits, [letters] * len(logits), [0] * len(logits), 1.0, 1.0)
        return [(logit_difference(m.mass, v), m.mass[v] / sum(m.mass) if sum(m.mass) > 0 else math.nan) for m in masses]

    last = n_depths(lm.model) - 1
    plain = {name: reads(patched_reads(lm.model, x, [None]))[0] for name, x in ids.items()}
    rows = []
    for direction, (clean, source) in zip(PATCH_DIRECTIONS, (("primary", "twin"), ("twin", "primary"))):
        at = 0 if clean == "primary" else 1
        jobs = [(g, d) for g in PATCH_GROUPS for d in depths]
        patches = [Patch(d, stream[source][d, list(pairing.groups[g][1 - at])], position=pairing.groups[g][at])
                   for g, d in jobs]
        for (g, d), (ld, share) in zip(jobs, reads(patched_reads(lm.model, ids[clean], patches))):
            rows.append(dict(**(key or {}), scenario_id=scenario.id, family=scenario.family, order=",".join(map(str, order)),
                             direction=direction, group=g, layer=d, n_layers=last, positions=len(pairing.groups[g][0]),
                             unpaired=pairing.unpaired, ld=ld, p_violating=share, ld_clean=plain[clean][0],
                             ld_source=plain[source][0]))
    return rows



def grid_rows(runner, scenarios, agent_reads) -> list[dict]:
    """patch_grid.parquet rows of a chunk: each scenario read in both cells, in D's first `patch_orders` option
    orders, at every `grid_stride`-th depth and the last (readouts.gap.depth.patch_depths)."""
    from readouts.gap.depth import _order_of, patch_depths

    lm, profile = runner.lm, runner.profile
    if profile.grid_stride < 1:
        return []
    depths = patch_depths(n_depths(lm.model) - 1, profile.grid_stride)
    cells = {(rd.scenario.id, rd.cell) for rd in agent_reads}
    rows = []
    for s in scenarios:
        if (s.id, "primary") not in cells or (s.id, "twin") not in cells:
            continue
        seen = {}
        for rd in agent_reads:
            if rd.scenario.id == s.id and rd.cell == "primary" and rd.order_index < profile.patch_orders:
                seen.setdefault(rd.order_index, _order_of(s, rd))
        for k, order in sorted(seen.items()):
            rows += patch_grid(lm, s, order, profile.frames, depths, dict(model=runner.model_name, order_index=k))
    return rows
