"""The judgment-action recipe on a served model (engine/served.py): the same probe and scenario rows as
GapRunner's, from requests instead of forward passes.

First-token readouts (D, J0, control): one read per option order, the letters' masses from the top-k logprobs
at the first generated token. Generated readouts (J, the dose arms): each rollout is a request (rollout 0 at
temperature 0, the others at the profile's temperature and top-p, seeded as locally), its text cut at the
anchor by the same rules (engine/anchor.find_anchor: the model's own anchor, else "\\nAnswer:" forced after
the text), and the letter read after it by a request that continues the assistant's text (prefill). A cut
by tokens (the truncated filler, the rider's cut) uses the generated tokens' text, which the generation
requests ask for. Where the local engine ties a filler's length to its reasoning rollout, a served filler is
asked for at most that many tokens (it may end its turn sooner: `generated_tokens` < `paired_tokens`).
Every read row carries the top-k bound (contract.tables.SERVED_BOUND).
"""

from __future__ import annotations

import json
import math
import time
import warnings

import numpy as np

from contract.metadata import METADATA, encode_metadata
from contract.readouts import FIRST_TOKEN, READOUTS, ReadoutSpec
from contract.tables import PAIRED_TOKENS, PROMPT_TEXT
from engine.anchor import find_anchor
from engine.sampling import derive_seed
from engine.served import letter_forms, topk_mass
from engine.served_client import ServedError
from panels.frames import render
from readouts.gap.aggregate import scenario_rows
from readouts.gap.profile import cells_read, rollouts
from readouts.gap.prompts import answer_forms, messages_of
from readouts.gap.recipe import Read, generation_jobs, orders_for, stages

SERVED_GROUPS = tuple(dict.fromkeys(s.group for s in READOUTS if not s.frames[0].startswith("raw_")))
"""The readout groups a served chat model is read in: all but the raw frames' (they need a completion endpoint
without a chat template)."""


class ServedGapRunner:
    """Probe rows and scenario rows of a chunk of scenarios, on a served model."""

    def __init__(self, sm, profile, groups, seed: int, panel_name: str, model_name: str, progress=None):
        self.sm, self.profile, self.groups, self.seed = sm, profile, groups, seed
        self.panel_name, self.model_name, self.progress = panel_name, model_name, progress
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def _tick(self, n):
        if self.progress is not None:
            self.progress.update(n)

    def run(self, scenarios) -> tuple[list[dict], list[dict]]:
        reads, rows = [], []
        for name, specs in stages(self.groups, self.profile):
            t0 = time.perf_counter()
            if specs[0].read == FIRST_TOKEN:
                stage_reads = self._first_token_reads(scenarios, specs[0])
            else:
                stage_reads = self._generated_reads(scenarios, specs)
            rows += self._score(stage_reads)
            reads += stage_reads
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            self.counts[name] = self.counts.get(name, 0) + len(stage_reads)
        keys = [(rd.scenario.id, rd.cell, rd.spec.name, rd.frame) for rd in reads]
        with warnings.catch_warnings():  # a scenario whose every read had a letter outside the top k: NaN, by design
            warnings.simplefilter("ignore", RuntimeWarning)
            return rows, scenario_rows(scenarios, keys, rows, self.profile, False, self.model_name, self.panel_name)

    def _first_token_reads(self, scenarios, spec: ReadoutSpec) -> list[Read]:
        (frame,) = spec.frames
        out = []
        for s in scenarios:
            for cell in (c for c in cells_read(s, self.profile) if spec.reads_cell(c)):
                for k, order in enumerate(orders_for(s, spec, self.profile, self.seed)):
                    out.append(Read(s, cell, spec, frame, k, render(s, frame, cell, order, self.profile.frames), 0, ()))
        return out

    def _generated_reads(self, scenarios, specs) -> list[Read]:
        jobs = generation_jobs(scenarios, specs, self.profile, self.seed)
        texts: dict[tuple, tuple] = {}
        reads: list[Read] = []
        # A filler tied to its reasoning rollout's length is asked for after the reasoning replies are in.
        for tied in (False, True):
            part = [job for job in jobs if bool(job[2].length_of) == tied]
            items = []
            for s, cell, sp, frame, _, r in part:
                for j in range(rollouts(sp, self.profile)):
                    budget = getattr(self.profile, sp.budget)
                    if tied:
                        budget = min(budget, max(1, texts[(sp.length_of, s.id, cell, j)][2]))
                    greedy = j == 0
                    body = self.sm.body(messages_of(r), max_tokens=budget, temperature=0.0 if greedy else self.profile.temperature,
                                        top_p=1.0 if greedy else self.profile.top_p, logprobs=True,
                                        seed=derive_seed(self.seed, s.id, cell, sp.seeded_as or sp.name, frame, j))
                    body["top_logprobs"] = 1  # the generated tokens' text is what is needed here, not alternatives
                    items.append((body, j))
            replies = iter(self.sm.complete(items, self._tick))
            for s, cell, sp, frame, k, r in part:
                for j in range(rollouts(sp, self.profile)):
                    reply = next(replies)
                    tokens = [t.text for t in reply.tokens]
                    prefill, rule, kept = _anchor(reply.text, tokens, None, reply.finish_reason == "length", r.anchor,
                                                  answer_forms(s, r))
                    paired = texts[(sp.length_of, s.id, cell, j)][2] if tied else None
                    n_gen = reply.completion_tokens if reply.completion_tokens is not None else len(tokens)
                    reads.append(Read(s, cell, sp, frame, k, r, j, (), prefill, n_gen, rule, paired_tokens=paired))
                    texts[(sp.name, s.id, cell, j)] = (s, r, n_gen, tokens, kept, reply)
        for derived in (sp for sp in specs if sp.derived_from is not None):
            for (name, sid, cell, j), (s, r, _, tokens, _, reply) in list(texts.items()):
                if name != derived.derived_from:
                    continue
                cut = texts[(derived.cut_like, sid, cell, j)][4] if derived.cut_like else getattr(self.profile, derived.budget)
                prefill, rule, kept = _anchor(reply.text, tokens, cut, reply.finish_reason == "length", r.anchor,
                                              answer_forms(s, r), force=derived.cut_like is not None)
                reads.append(Read(s, cell, derived, derived.frames[0], 0, r, j, (), prefill, kept, rule,
                                  paired_tokens=cut if derived.cut_like else None))
                self._tick(1)
        return reads

    def _score(self, reads: list[Read]) -> list[dict]:
        replies = self.sm.read([(messages_of(rd.rendered), rd.text) for rd in reads],
                               on_done=None if not reads or reads[0].anchor_rule is not None else self._tick)
        rows = []
        for rd, reply in zip(reads, replies):
            temperature = 0.0 if rd.spec.greedy else self.profile.temperature
            top_p = self.profile.top_p if temperature > 0 else 1.0
            m = topk_mass(reply.tokens[0].top, letter_forms(rd.rendered.letters), rd.rendered.letters, temperature, top_p)
            rows.append(self._probe_row(rd, m, reply))
        return rows

    def _probe_row(self, rd: Read, m, reply) -> dict:
        r = rd.rendered
        v = r.letters.index(r.violating_letter)
        seen = [x for x in m.mass if not math.isnan(x)]
        total = sum(seen)
        complete = len(seen) == len(m.mass)
        top = r.letters[int(np.nanargmax(m.mass))] if seen else r.letters[0]
        row = dict(
            probe_id=f"{rd.scenario.id}|{rd.cell}|{rd.spec.name}|{rd.frame}|o{rd.order_index}|r{rd.rollout}",
            scenario_id=rd.scenario.id, cell=rd.cell, readout=rd.spec.name, frame=rd.frame,
            order_index=rd.order_index, order=",".join(r.option_ids), rollout=rd.rollout,
            letters="".join(r.letters), violating_letter=r.violating_letter, mass=list(m.mass),
            letter_mass=total, tempered=list(m.tempered),
            p_violating=m.mass[v] / total if complete and total > 0 else math.nan, top_letter=top,
            prompt_tokens=reply.prompt_tokens or 0, generated_text=rd.text, generated_tokens=rd.generated_tokens,
            anchor_rule=rd.anchor_rule, sampled_letter=None, **{PAIRED_TOKENS: rd.paired_tokens},
            top_k=m.k, unseen_mass=m.unseen, token_bound=m.token_bound, outside_top_k="".join(m.outside),
        )
        row[PROMPT_TEXT] = json.dumps(messages_of(r), ensure_ascii=False)
        row[METADATA] = encode_metadata(rd.scenario.metadata)
        return row


def _anchor(text: str, tokens: list[str], cut: int | None, at_budget: bool, anchor: str, forms: dict,
            force: bool = False) -> tuple[str, str, int]:
    """(assistant text to continue, anchor rule, tokens kept) for one reply, as engine/anchor.anchor_read
    decides on local tokens: the text cut at `cut` tokens (by the generated tokens' text), then the model's
    own anchor if it wrote one, else the anchor forced after the text. `force`: an own anchor before the cut
    is cut away instead (the truncated filler's rule in GapRunner._derived_read), so the answer is forced."""
    if cut is not None and not tokens:
        raise ServedError("a readout cut by tokens needs the generated tokens, and this server returned no logprobs "
                          "for them (drop it with --readouts)")
    kept = tokens[:cut] if cut is not None else tokens
    body = "".join(kept) if cut is not None else text
    truncated = cut is not None and cut < len(tokens)
    hit = find_anchor(body, anchor, **forms)
    if hit is not None:
        rule, start, end, _ = hit
        n = _tokens_within(kept, start if force else end)
        if not force:
            return body[:end], rule, n
        body, truncated = "".join(kept[:n]), True
        kept = kept[:n]
    rule = "forced_at_budget" if (truncated or at_budget) else "forced_after_completion"
    return body + "\n" + anchor, rule, len(kept)


def _tokens_within(tokens: list[str], chars: int) -> int:
    """How many of `tokens` stand wholly within the first `chars` characters of their joined text."""
    n, acc = 0, 0
    while n < len(tokens) and acc + len(tokens[n]) <= chars:
        acc += len(tokens[n])
        n += 1
    return n
