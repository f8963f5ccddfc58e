"""The negation-sensitivity audit's recipe on local weights. For each dilemma and framing F0-F3:
sampled replies to the JSON-schema prompt (plus one greedy reply), each parsed by the paper's four-stage
parser and kept as a row whether or not it parsed; and a sample-free continuous readout, the exact
probability of "agree" against "disagree" at the decision field, read at T = 1 (full softmax) and at the
profile's sampling settings (temperature and top-p, 0.7 / 0.95 for `paper`: the `*_tempered` columns).
readouts/nsi/served.py reads the same rows from a served model; readouts/nsi/study.py is what the run driver sees.
"""

from __future__ import annotations

import time

from contract.metadata import METADATA, encode_metadata
from contract.names import FRAMINGS
from contract.tables import NO_BOUND
from engine.errors import ReadoutError
from engine.generation import generate, stop_token_ids
from engine.letters import LetterTokens, word_start_tokens
from engine.render import Prompt, encode_prompt
from engine.sampling import derive_seed
from engine.scoring import score_ids
from panels.frames import render_polarity
from readouts.nsi.parse import endorsement, parse_reply
from readouts.nsi.plan import reply_label
from readouts.nsi.profile import NsiProfile

DECISION_PREFIX = '{"decision": "'
DECISION_WORDS = ("agree", "disagree")
MIN_WORD_START = 2
"""The continuous readout's token rule (this project's, not the paper's): the mass of a word at the decision
field is the mass of the tokens that can start it (engine.letters.word_start_tokens: a prefix of the word, or
the word followed by a non-letter) whose text has at least two characters. A lone "a" or "d" also starts
"abstain", "depends", "decline", ..., so it is not read as either word."""


def decision_words(tokenizer) -> LetterTokens:
    """The tokens read for "agree" and "disagree" under the rule above (recorded in the manifest)."""
    words = word_start_tokens(tokenizer, DECISION_WORDS)
    kept = [[(i, t) for i, t in zip(ids, texts) if len(t) >= MIN_WORD_START]
            for ids, texts in zip(words.token_ids, words.decoded)]
    for w, k in zip(DECISION_WORDS, kept):
        if not k:
            raise ReadoutError(f"--model: no token of two or more characters starts {w!r} in this vocabulary")
    return LetterTokens(letters=words.letters, token_ids=tuple(tuple(i for i, _ in k) for k in kept),
                        decoded=tuple(tuple(t for _, t in k) for k in kept))


def agree_share(agree: float, disagree: float) -> float:
    """P(agree) against disagree, NaN when neither word has mass."""
    return agree / (agree + disagree) if agree + disagree > 0 else float("nan")


class NsiRunner:
    """Replies and continuous reads for a chunk of dilemmas."""

    def __init__(self, lm, profile: NsiProfile, seed: int, model_name: str, words, bar=None, generate=None):
        self.drawer = generate
        """What draws the replies, with engine.generation.generate's signature (a vLLM generator:
        engine/vllm_generation.py); None: the own decoder."""
        self.lm, self.profile, self.seed, self.model_name, self.bar = lm, profile, seed, model_name, bar
        self.tok = lm.tokenizer
        self.stop = stop_token_ids(self.tok, lm.model)
        self.words = words
        self.prefix_ids = tuple(self.tok.encode(DECISION_PREFIX, add_special_tokens=False))
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.batches: dict[str, list] = {}
        """Per stage, each decoding batch of this session: [call label, rows, distinct prompt tokens, longest budget]."""

    def run_window(self, chunks) -> list[tuple[list[dict], list[dict]]]:
        """`run`'s tables of each of `chunks`, computed together (one `generate` call and one scoring call for the
        window: every row belongs to one dilemma, so each chunk's rows are those it gets alone, up to the batches'
        float tolerance)."""
        replies, continuous = self.run([d for chunk in chunks for d in chunk])
        where = {d.id: i for i, chunk in enumerate(chunks) for d in chunk}
        out = [([], []) for _ in chunks]
        for k, rows in enumerate((replies, continuous)):
            for row in rows:
                out[where[row["dilemma_id"]]][k].append(row)
        return out

    def run(self, dilemmas) -> tuple[list[dict], list[dict]]:
        t0 = time.perf_counter()
        cells = [(d, f, render_polarity(d, f)) for d in dilemmas for f in FRAMINGS]
        prompts = [tuple(encode_prompt(self.tok, Prompt(messages=p.messages))) for _, _, p in cells]
        n = 1 + self.profile.samples
        shapes = []
        rollouts = (self.drawer or generate)(
            self.lm.model, prompts, max_new_tokens=self.profile.budget, stop_ids=self.stop, n=n, greedy_first=True,
            temperature=self.profile.temperature, top_p=self.profile.top_p, pad_id=self.lm.pad_id,
            seeds=[derive_seed(self.seed, d.id, f) for d, f, _ in cells],
            on_batch=(lambda k: self.bar.update(k * n)) if self.bar is not None else None, batches=shapes,
        )
        self.batches.setdefault("replies", []).extend([reply_label(n), *shape] for shape in shapes)
        replies = []
        for (d, f, p), rs in zip(cells, rollouts):
            for j, r in enumerate(rs):
                text = self.tok.decode(r.tokens, skip_special_tokens=True)
                parsed = parse_reply(text)
                replies.append(dict(
                    model=self.model_name, dilemma_id=d.id, domain=d.domain, framing=f, negated=p.negated,
                    **{METADATA: encode_metadata(d.metadata)},
                    temperature=0.0 if r.greedy else self.profile.temperature, sample=j, text=text,
                    generated_tokens=len(r.tokens), truncated=not r.stopped, **parsed.as_row(),
                    endorse=endorsement(parsed.decision, p.negated) if parsed.ok else None,
                ))
        self._count("replies", len(replies), t0)
        t0 = time.perf_counter()
        reads = [ids + self.prefix_ids for ids in prompts]
        # One read gives both settings: `mass` is the full softmax at T = 1, `tempered` the probability of
        # sampling the token at the profile's temperature after its top-p cut (the replies' settings).
        temperature, top_p = self.profile.temperature, self.profile.top_p
        masses = score_ids(self.lm.model, reads, [self.words] * len(reads), pad_id=self.lm.pad_id,
                           temperature=temperature, top_p=top_p)
        continuous = []
        for (d, f, p), res in zip(cells, masses):
            agree, disagree = res.mass
            t_agree, t_disagree = res.tempered
            p_agree, p_tempered = agree_share(agree, disagree), agree_share(t_agree, t_disagree)
            continuous.append(dict(model=self.model_name, dilemma_id=d.id, domain=d.domain, framing=f, negated=p.negated,
                                   **{METADATA: encode_metadata(d.metadata)},
                                   mass_agree=agree, mass_disagree=disagree, p_agree=p_agree,
                                   p_endorse=1 - p_agree if p.negated else p_agree, prompt_tokens=res.n_tokens,
                                   mass_agree_tempered=t_agree, mass_disagree_tempered=t_disagree,
                                   p_agree_tempered=p_tempered, p_endorse_tempered=1 - p_tempered if p.negated else p_tempered,
                                   tempered_temperature=temperature, tempered_top_p=top_p, **NO_BOUND))
        self._count("continuous", len(continuous), t0)
        return replies, continuous

    def _count(self, stage: str, n: int, t0: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - t0
        self.counts[stage] = self.counts.get(stage, 0) + n
