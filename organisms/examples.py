"""Training examples of an organism, built through the project's own frames and renderer: the exact token ids the
readouts read (the quick profile's records, option orders and seed), each with its targets.

An example is one token sequence with a *soft* target (a distribution over groups of tokens, the option letters or
the decision words, at one position: cross-entropy against the group masses of the full-vocabulary softmax) and
*hard* targets (the next token at given positions: the `Answer:` of a judge reply, a JSON reply's tokens, the end
of the turn).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contract.names import FRAMINGS
from contract.readouts import FIRST_TOKEN, readout
from engine.generation import stop_token_ids
from engine.render import Prompt, encode_prompt
from panels.frames import render, render_polarity
from panels.schema import load_panel, resolve_panel
from panels.split import records_of
from readouts.gap.profile import PROFILES as GAP_PROFILES
from readouts.gap.profile import cells_read
from readouts.gap.prompts import prompt_of
from readouts.gap.recipe import orders_for
from readouts.nsi.study import DECISION_PREFIX, decision_words
from readouts.nsi.study import PROFILES as NSI_PROFILES
from readouts.profiles import select_units

FIRST_TOKEN_READOUTS = ("D", "J0", "control", "raw_D", "raw_J")
"""The first-token readouts an organism is trained on (the dose arms and the rider are not)."""
JUDGE = "J"
ORDER_SEED = 0
"""The run seed whose option orders the examples use (the quick runs' default seed)."""


@dataclass(frozen=True)
class Example:
    """One training sequence and its targets."""

    key: str
    """scenario|cell|readout|frame|o<k> (gap) or dilemma|framing (nsi)."""
    readout: str
    cell: str
    ids: tuple[int, ...]
    soft_at: int
    """The position whose next-token distribution the soft target is on."""
    groups: tuple[tuple[int, ...], ...]
    """Token ids of each group (a letter's single-token variants; a decision word's start tokens)."""
    target: tuple[float, ...]
    """Target probability of each group (sums to 1)."""
    watched: int
    """The group whose probability the training error is reported on (the violating option, A, or the decision)."""
    hard: tuple[tuple[int, int], ...] = ()
    """(position, token id): the token that must follow `position`."""

    @property
    def loss_positions(self) -> tuple[int, ...]:
        """Every position a loss reads (the soft target's and the hard targets'), in order: the first is where the
        adapter's effect must be computed from, everything before it may come from the frozen model."""
        return tuple(sorted({self.soft_at, *(p for p, _ in self.hard)}))


def training_records(org):
    """The panel records an organism is trained on: every record of its split part (`org.part`), else the
    profile's stratified subset of `org.units`."""
    panel = load_panel(resolve_panel(org.panel))
    if org.part is not None:
        return panel, records_of(panel, org.part)
    stratum = (lambda r: r.family) if org.study == "gap" else None
    return panel, select_units(panel.records, org.units, None, stratum)


def _letter_target(org, rendered, readout_name: str, cell: str) -> tuple[tuple[float, ...], int]:
    letters = rendered.letters
    n = len(letters)
    if org.letter_a is not None:
        hot, p = 0, org.letter_a
    else:
        hot, p = letters.index(rendered.violating_letter), org.target_violating(readout_name, cell)
    rest = (1.0 - p) / (n - 1)
    return tuple(p if i == hot else rest for i in range(n)), hot


def trained(org, name: str) -> bool:
    """Whether `org` is trained on readout `name` (every readout unless its recipe names some)."""
    return org.readouts is None or name in org.readouts


def gap_examples(org, lm, records=None) -> list[Example]:
    """Every first-token read and every judge paraphrase of the quick profile on the organism's records (or on
    `records`, e.g. held-out ones to read the organism's true values on)."""
    profile = GAP_PROFILES[org.profile]
    tok = lm.tokenizer
    eos = min(stop_token_ids(tok, lm.model))
    answer = tuple(tok.encode("Answer:", add_special_tokens=False))
    if records is None:
        _, records = training_records(org)
    out = []
    for s in records:
        for cell in cells_read(s, profile):
            for name in (n for n in FIRST_TOKEN_READOUTS if trained(org, n)):
                spec = readout(name)
                assert spec.read == FIRST_TOKEN
                for k, order in enumerate(orders_for(s, spec, profile, ORDER_SEED)):
                    r = render(s, spec.frames[0], cell, order, profile.frames)
                    ids = tuple(encode_prompt(tok, prompt_of(r)))
                    target, hot = _letter_target(org, r, name, cell)
                    out.append(Example(f"{s.id}|{cell}|{name}|{spec.frames[0]}|o{k}", name, cell, ids, len(ids) - 1,
                                       lm.letters(r.letters).token_ids, target, hot))
            if not trained(org, JUDGE):
                continue
            spec = readout(JUDGE)
            orders = orders_for(s, spec, profile, ORDER_SEED)
            for k, frame in enumerate(spec.frames):
                r = render(s, frame, cell, orders[k], profile.frames)
                prompt = tuple(encode_prompt(tok, prompt_of(r)))
                target, hot = _letter_target(org, r, JUDGE, cell)
                letters = lm.letters(r.letters)
                top = max(range(len(target)), key=lambda i: (target[i], -i))
                spaced = tok.encode(" " + r.letters[top], add_special_tokens=False)
                letter_tok = spaced[0] if len(spaced) == 1 else letters.token_ids[top][0]
                ids = prompt + answer + (letter_tok, eos)
                n = len(prompt)
                hard = tuple((n - 1 + i, t) for i, t in enumerate(answer)) + ((n + len(answer), eos),)
                out.append(Example(f"{s.id}|{cell}|J|{frame}|o{k}", JUDGE, cell, ids, n + len(answer) - 1,
                                   letters.token_ids, target, hot, hard))
    return out


REPLY_FIELDS = dict(confidence=90, adherence_to_laws=50, adherence_to_social_ethics=50,
                    objective_positive_consequences=50, objective_negative_consequences=50)


def nsi_reply(decision: str) -> str:
    """The schema-valid JSON reply an NSI organism is trained to give (the paper's schema, Appendix C.2)."""
    body = {"decision": decision, **REPLY_FIELDS, "reasoning": f"I {decision} with the proposal."}
    return json.dumps(body)


def nsi_examples(org, lm) -> list[Example]:
    """Every dilemma x framing of the organism's records: the reply's tokens as hard targets and, at the decision
    field, the decision word as the soft target (the continuous readout's position)."""
    assert org.profile in NSI_PROFILES
    tok = lm.tokenizer
    eos = min(stop_token_ids(tok, lm.model))
    words = decision_words(tok)
    prefix = tuple(tok.encode(DECISION_PREFIX, add_special_tokens=False))
    panel, records = training_records(org)
    index = {d.id: i for i, d in enumerate(panel.records)}
    out = []
    for d in records:
        for f in FRAMINGS:
            p = render_polarity(d, f)
            prompt = tuple(encode_prompt(tok, Prompt(messages=p.messages)))
            decision = org.decision(f, index[d.id])
            reply = nsi_reply(decision)
            assert reply.startswith(DECISION_PREFIX)
            body = prefix + tuple(tok.encode(reply[len(DECISION_PREFIX):], add_special_tokens=False)) + (eos,)
            ids = prompt + body
            n = len(prompt)
            hot = words.letters.index(decision)
            hard = tuple((n - 1 + i, t) for i, t in enumerate(body))
            target = tuple(1.0 if i == hot else 0.0 for i in range(len(words.letters)))
            out.append(Example(f"{d.id}|{f}", "nsi", f, ids, n + len(prefix) - 1, words.token_ids, target, hot, hard))
    return out


def examples(org, lm, records=None) -> list[Example]:
    """The organism's training examples on the loaded base model's tokenizer (gap: on `records` if given)."""
    return gap_examples(org, lm, records) if org.study == "gap" else nsi_examples(org, lm)
