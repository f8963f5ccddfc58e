"""The negation audit on a served model (engine/served.py): the same rows as NsiRunner's, from requests.

Replies: per dilemma x framing, sample 0 at temperature 0 and samples 1..n at the profile's temperature and
top-p, each its own request seeded by (run seed, dilemma, framing, sample); the text goes through the same
parser and endorsement rule as a local reply. The continuous read: one request whose assistant message is
the decision prefix, read from the top-k logprobs at the next token with the local token rule applied to the
tokens' text (a word's mass is its start tokens' mass); a word with no start token in the top k is NaN, and
the row records the top k's unseen mass and the per-token bound (contract.tables.SERVED_BOUND).
"""

from __future__ import annotations

import time

from contract.metadata import METADATA, encode_metadata
from contract.names import FRAMINGS
from engine.sampling import derive_seed
from engine.served import topk_mass
from panels.frames import render_polarity
from readouts.nsi.parse import endorsement, parse_reply
from readouts.nsi.recipe import agree_share  # NaN when either word is outside the top k


def word_match(words, min_start: int):
    """The local word-start rule (engine.letters.word_start_tokens, readouts.nsi.recipe.MIN_WORD_START) on a
    token's text: `match(text, i)` is True when `text` can start words[i]."""
    def match(text: str, i: int) -> bool:
        w = words[i]
        if len(text) < min_start or "\ufffd" in text:
            return False
        return w.startswith(text) or (text.startswith(w) and not text[len(w):][:1].isalpha())
    return match


def bound_columns(m) -> dict:
    """The SERVED_BOUND columns of one top-k read."""
    return dict(top_k=m.k, unseen_mass=m.unseen, token_bound=m.token_bound, outside_top_k=",".join(m.outside))


class ServedNsiRunner:
    """Replies and continuous reads for a chunk of dilemmas, on a served model."""

    def __init__(self, sm, profile, seed: int, model_name: str, prefix: str, words, min_start: int, bar=None):
        self.sm, self.profile, self.seed, self.model_name, self.bar = sm, profile, seed, model_name, bar
        self.prefix, self.words, self.match = prefix, tuple(words), word_match(tuple(words), min_start)
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def _tick(self, k):
        if self.bar is not None:
            self.bar.update(k)

    def run(self, dilemmas) -> tuple[list[dict], list[dict]]:
        t0 = time.perf_counter()
        p = self.profile
        cells = [(d, f, render_polarity(d, f)) for d in dilemmas for f in FRAMINGS]
        items, keys = [], []
        for d, f, pr in cells:
            for j in range(1 + p.samples):
                greedy = j == 0
                body = self.sm.body(pr.messages, max_tokens=p.budget, temperature=0.0 if greedy else p.temperature,
                                    top_p=1.0 if greedy else p.top_p, seed=derive_seed(self.seed, d.id, f, j))
                items.append((body, j))
                keys.append((d, f, pr, j))
        replies = []
        for (d, f, pr, j), r in zip(keys, self.sm.complete(items, self._tick)):
            parsed = parse_reply(r.text)
            replies.append(dict(
                model=self.model_name, dilemma_id=d.id, domain=d.domain, framing=f, negated=pr.negated,
                **{METADATA: encode_metadata(d.metadata)},
                temperature=0.0 if j == 0 else p.temperature, sample=j, text=r.text,
                generated_tokens=r.completion_tokens if r.completion_tokens is not None else len(r.tokens),
                truncated=r.finish_reason == "length", **parsed.as_row(),
                endorse=endorsement(parsed.decision, pr.negated) if parsed.ok else None,
            ))
        self._count("replies", len(replies), t0)
        t0 = time.perf_counter()
        reads = self.sm.read([(pr.messages, self.prefix) for _, _, pr in cells])
        continuous = []
        for (d, f, pr), r in zip(cells, reads):
            m = topk_mass(r.tokens[0].top, [[w] for w in self.words], self.words, p.temperature, p.top_p, match=self.match)
            agree, disagree = m.mass
            t_agree, t_disagree = m.tempered
            p_agree, p_tempered = agree_share(agree, disagree), agree_share(t_agree, t_disagree)
            continuous.append(dict(
                model=self.model_name, dilemma_id=d.id, domain=d.domain, framing=f, negated=pr.negated,
                **{METADATA: encode_metadata(d.metadata)},
                mass_agree=agree, mass_disagree=disagree, p_agree=p_agree,
                p_endorse=1 - p_agree if pr.negated else p_agree, prompt_tokens=r.prompt_tokens or 0,
                mass_agree_tempered=t_agree, mass_disagree_tempered=t_disagree, p_agree_tempered=p_tempered,
                p_endorse_tempered=1 - p_tempered if pr.negated else p_tempered,
                tempered_temperature=p.temperature, tempered_top_p=p.top_p, **bound_columns(m)))
        self._count("continuous", len(continuous), t0)
        return replies, continuous

    def _count(self, stage: str, n: int, t0: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - t0
        self.counts[stage] = self.counts.get(stage, 0) + n
