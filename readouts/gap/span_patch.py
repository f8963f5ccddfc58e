"""Activation patching between two agent prompts of a scenario that differ in one sentence, by group of positions
and depth, in both directions, on the logit difference of the violating letter. Two pairs (contract.names.
PATCH_PAIRS): `pressure`, the prompt under pressure (`primary`) and its twin (the same prompt with a filler sentence
instead of the pressure sentence); `filler_swap`, the scenario-specific control, the twin and the twin with another
scenario's filler sentence instead of its own. Neither of the control's prompts carries pressure: a group whose patch
moves the pressure pair's letters but not the control's is reading the pressure, not any change of the sentence.

Alignment. A pair's two prompts share every token before the sentence that differs and every token after it (the
rest of the scenario, the options, the question, the template's end). Positions are paired from the end: the last
token with the last token, back through the shared suffix (the same tokens in both) and into the differing span;
where one span is longer than the other, its first tokens have no partner and are not patched (`unpaired` counts
them). Tokens before the span need no patch: their streams are the same in both prompts (the model is causal).

Groups (contract.names.PATCH_GROUPS): `span`, the paired tokens of the differing sentence; `options`, the tokens that
change when the options are rotated (their texts; the letters stay in place); `context`, every other shared token
after the span; `read`, the read position (the last token).

Directions: `noising` reads the pair's first prompt with a group's streams at one depth taken from the second's
forward; `denoising` reads the second with the first's. The metric is the logit difference of the violating letter,
the log of its mass less the mean log mass of the other letters (a letter's mass sums its single-token forms, as
every read does). Every patched read is a plain forward of one prompt (engine.residuals.patched_reads).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from contract.names import DEPTH_CELLS, PATCH_DIRECTIONS, PATCH_GROUPS, PATCH_PAIRS
from contract.readouts import readout
from engine.render import encode_prompt
from engine.residuals import Patch, n_depths, patched_reads, streams
from engine.scoring import letter_masses
from panels.frames import render
from readouts.gap.prompts import prompt_of

(AGENT_FRAME,) = readout("D").frames
PAIR_CELLS = dict(zip(PATCH_PAIRS, (DEPTH_CELLS[:2], (DEPTH_CELLS[1], DEPTH_CELLS[1]))))
"""Each pair's two prompts' cells (the filler swap's second twin carries another scenario's filler)."""


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


def pair_prompts(tok, scenario, order, frames, pair: str = "pressure", filler=None) -> tuple[tuple, tuple, tuple, object]:
    """Token ids of a pair's two agent prompts (contract.names.PATCH_PAIRS) and of its first with `order` rotated by
    one, and the first's rendering (its letters and violating letter). `pressure`: the primary cell and the twin;
    `filler_swap`: the twin and the twin with `filler` (another scenario's filler sentence) in its sentence's place."""
    if pair not in PAIR_CELLS:
        raise ValueError(f"no patching pair '{pair}' (one of {', '.join(PATCH_PAIRS)})")
    (cell, other), rotated_order = PAIR_CELLS[pair], tuple(order[1:]) + tuple(order[:1])
    first, second = scenario, scenario if pair == "pressure" else dataclasses.replace(scenario, filler=filler)
    r = render(first, AGENT_FRAME, cell, order, frames)
    ids = [tuple(encode_prompt(tok, prompt_of(render(x, AGENT_FRAME, c, o, frames))))
           for x, c, o in ((first, cell, order), (second, other, order), (first, cell, rotated_order))]
    return (*ids, r)


def patch_grid(lm, scenario, order, frames, depths, key: dict | None = None, pair: str = "pressure",
               partner=None) -> list[dict]:
    """Rows of one scenario's grid for one pair in one option order: for each direction, group and depth, the patched
    read's logit difference and violating share, beside the unpatched reads of both prompts (each row starts with
    `key`). `partner`: the scenario whose filler the `filler_swap` pair's second prompt carries."""
    filler = None if partner is None else partner.filler
    first, second, rotated, r = pair_prompts(lm.tokenizer, scenario, order, frames, pair, filler)
    pairing = pair_positions(first, second, rotated)
    letters = lm.letters(r.letters)
    v = r.letters.index(r.violating_letter)
    ids = (first, second)
    stream = [streams(lm.model, x) for x in ids]

    def reads(logits):
        masses = letter_masses(logits, [letters] * len(logits), [0] * len(logits), 1.0, 1.0)
        return [(logit_difference(m.mass, v), m.mass[v] / sum(m.mass) if sum(m.mass) > 0 else math.nan) for m in masses]

    last = n_depths(lm.model) - 1
    plain = [reads(patched_reads(lm.model, x, [None]))[0] for x in ids]
    rows = []
    for direction, (clean, source) in zip(PATCH_DIRECTIONS, ((0, 1), (1, 0))):
        jobs = [(g, d) for g in PATCH_GROUPS for d in depths]
        patches = [Patch(d, stream[source][d, list(pairing.groups[g][source])], position=pairing.groups[g][clean])
                   for g, d in jobs]
        for (g, d), (ld, share) in zip(jobs, reads(patched_reads(lm.model, ids[clean], patches))):
            rows.append(dict(**(key or {}), scenario_id=scenario.id, family=scenario.family, order=",".join(map(str, order)),
                             pair=pair, filler_of=None if partner is None else partner.id, direction=direction, group=g,
                             layer=d, n_layers=last, positions=len(pairing.groups[g][0]), unpaired=pairing.unpaired,
                             ld=ld, p_violating=share, ld_clean=plain[clean][0], ld_source=plain[source][0]))
    return rows


def grid_rows(runner, scenarios, agent_reads) -> list[dict]:
    """patch_grid.parquet rows of a chunk: each scenario read in both cells, its pressure pair and its filler-swap
    control (with the filler of `filler_partner`; none when no other scenario in the chunk has another filler), in
    D's first `patch_orders` option orders, at every `grid_stride`-th depth and the last
    (readouts.gap.depth.patch_depths)."""
    from readouts.gap.depth import _order_of, patch_depths

    lm, profile = runner.lm, runner.profile
    if profile.grid_stride < 1:
        return []
    depths = patch_depths(n_depths(lm.model) - 1, profile.grid_stride)
    per_pair = 2 * (2 + len(PATCH_GROUPS) * len(depths))  # each prompt's stream, plain read and patched reads
    cells = {(rd.scenario.id, rd.cell) for rd in agent_reads}
    rows = []
    for s in scenarios:
        if (s.id, "primary") not in cells or (s.id, "twin") not in cells:
            continue
        seen = {}
        for rd in agent_reads:
            if rd.scenario.id == s.id and rd.cell == "primary" and rd.order_index < profile.patch_orders:
                seen.setdefault(rd.order_index, _order_of(s, rd))
        partner = filler_partner(scenarios, s)
        for k, order in sorted(seen.items()):
            key = dict(model=runner.model_name, order_index=k)
            rows += patch_grid(lm, s, order, profile.frames, depths, key)
            runner.tick(per_pair)
            if partner is not None:
                rows += patch_grid(lm, s, order, profile.frames, depths, key, PATCH_PAIRS[1], partner)
                runner.tick(per_pair)
    return rows


def filler_partner(scenarios, s):
    """The scenario whose filler sentence stands in `s`'s twin for the `filler_swap` control: the next one after `s`
    in the chunk (cyclically) whose filler differs from `s`'s, or None."""
    i = next(k for k, x in enumerate(scenarios) if x.id == s.id)
    return next((x for x in scenarios[i + 1:] + scenarios[:i] if x.filler != s.filler), None)
