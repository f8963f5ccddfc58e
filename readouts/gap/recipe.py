"""The judgment-action recipe: expand scenarios into read positions for each readout spec, generate
where a readout reads after text, and score every read position on the engine. One call handles one
chunk of scenarios; readouts/gap/aggregate.py turns its probe rows into scenario rows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from contract.metadata import METADATA, encode_metadata
from contract.readouts import FIRST_TOKEN, READOUTS, ReadoutSpec
from contract.tables import NO_BOUND, PAIRED_TOKENS, PROMPT_TEXT
from engine.anchor import anchor_read, find_anchor
from engine.errors import ReadoutError
from engine.generation import generate, stop_token_ids
from engine.render import Prompt, encode_prompt
from engine.rowcache import RowCaches
from engine.sampling import derive_seed
from engine.scoring import score_ids
from panels.frames import render
from panels.orders import option_orders
from readouts.gap.aggregate import scenario_rows
from readouts.gap.depth import depth_rows, patch_rows
from readouts.gap.profile import GapProfile, cells_read, is_on, rollouts


@dataclass
class Read:
    """One planned read position before scoring."""

    scenario: object
    cell: str
    spec: ReadoutSpec
    frame: str
    order_index: int
    rendered: object
    rollout: int
    ids: tuple
    text: str | None = None
    generated_tokens: int | None = None
    anchor_rule: str | None = None
    prompt_ids: tuple = ()
    """The prompt's ids where `ids` goes on after it (generated reads); empty: `ids` is the prompt."""
    paired_tokens: int | None = None
    """Dose filler arms: the paired reasoning rollout's tokens (the filler: its length, which the filler's
    matches; the truncated filler: where its read sits, which is where the filler is cut)."""


ANCHOR_ALLOWANCE = 8
"""Tokens a forced anchor ("\nAnswer:") may add after the generated text."""


def prompt_of(rendered) -> Prompt:
    if rendered.text is not None:
        return Prompt(text=rendered.text)
    return Prompt(messages=rendered.messages, system=rendered.system)


def answer_forms(scenario, rendered) -> dict:
    """What may stand after the anchor: the rendered letters and, for F3's lettered tools, each tool's
    name mapped to its letter (pre-registration A2: a tool-name answer is accepted)."""
    names = None
    if getattr(scenario, "tools", None):
        letter_of = dict(zip(rendered.option_ids, rendered.letters))
        names = {t.name: letter_of[t.id] for t in scenario.tools if t.id in letter_of}
    return {"letters": "".join(rendered.letters), "names": names}


def active_specs(groups, profile: GapProfile | None = None) -> tuple[ReadoutSpec, ...]:
    """The readouts of `groups`, without those `profile` switches off (a readout with 0 rollouts)."""
    return tuple(s for s in READOUTS if s.group in groups and (profile is None or is_on(s, profile)))


def stages(groups, profile: GapProfile | None = None) -> list[tuple[str, tuple[ReadoutSpec, ...]]]:
    """Computation stages: each first-token readout alone, then each group of anchor readouts together."""
    specs = active_specs(groups, profile)
    out = [(s.name, (s,)) for s in specs if s.read == FIRST_TOKEN]
    for group in dict.fromkeys(s.group for s in specs if s.read != FIRST_TOKEN):
        out.append((group, tuple(s for s in specs if s.group == group)))
    return out


def orders_for(scenario, spec: ReadoutSpec, profile: GapProfile, seed: int) -> list[tuple[int, ...]]:
    """The seeded option orders a run reads `spec` in: one per order index (first-token readouts), or one
    per frame of the spec's group, shared by the group (J: one per paraphrase; dose: one for every arm)."""
    if spec.read == FIRST_TOKEN:
        return option_orders(len(scenario.options), profile.orders[spec.orders], seed, f"{scenario.id}|{spec.name}")
    own = [s for s in READOUTS if s.group == spec.group and s.generates]
    return option_orders(len(scenario.options), max(len(s.frames) for s in own), seed, f"{scenario.id}|{spec.group}")


def generation_jobs(scenarios, specs, profile: GapProfile, seed: int) -> list[tuple]:
    """(scenario, cell, spec, frame, k, rendered) of every generated rollout's prompt of one group: its
    generating specs' frames on each cell they read, in the group's seeded option orders."""
    own = [s for s in specs if s.generates]
    jobs = []
    for s in scenarios:
        orders = orders_for(s, own[0], profile, seed)
        for cell in cells_read(s, profile):
            for sp in (sp for sp in own if sp.reads_cell(cell)):
                for k, frame in enumerate(sp.frames):
                    jobs.append((s, cell, sp, frame, k, render(s, frame, cell, orders[k], profile.frames)))
    return jobs


def generation_calls(jobs, profile: GapProfile) -> list[tuple]:
    """The `generate` calls of one group's jobs, as the runner makes them: one per rollout count and token budget,
    each (label, n, jobs, ties), `ties[i]` the index of the job whose rollouts job i's follow in length
    (`length_of`, within one budget) or None. A batch preallocates every row's keys/values for its longest budget,
    so the rider (2,048 tokens) and the brief arm (64) decode apart from the 512-token arms; the rollouts are the
    same in any batch (seeded per row). The label names the call's readouts (`--plan` lists each call's batches)."""
    calls = []
    for n, budget in dict.fromkeys((rollouts(job[2], profile), job[2].budget) for job in jobs):
        part = [job for job in jobs if (rollouts(job[2], profile), job[2].budget) == (n, budget)]
        at = {(s.id, cell, sp.name, k): i for i, (s, cell, sp, _, k, _) in enumerate(part)}
        ties = [at.get((s.id, cell, sp.length_of, k)) if sp.length_of else None for s, cell, sp, _, k, _ in part]
        if any(sp.length_of and t is None for (_, _, sp, _, _, _), t in zip(part, ties)):
            raise ReadoutError(f"readout {part[0][2].group}: a length_of readout without its paired readout")
        names = "+".join(dict.fromkeys(job[2].name for job in part))
        calls.append((f"{names} x{n}", n, part, ties))
    return calls


def reads_per_scenario(scenario, profile: GapProfile, groups) -> int:
    """How many read positions a scenario costs (for the progress bar's total)."""
    return sum(profile.orders[s.orders] if s.read == FIRST_TOKEN else len(s.frames) * rollouts(s, profile)
               for cell in cells_read(scenario, profile) for s in active_specs(groups, profile) if s.reads_cell(cell))


def _before_anchor(tok, tokens, anchor: str, forms: dict) -> int:
    """How many of `tokens` stand wholly before the first anchor (in any of its forms) in their text: cut
    there, nothing of the anchor is left (cutting one token short of its end can leave `Answer` or a whole
    `Answer:` before a wrapped letter, which reads as the model's own anchor again)."""
    tokens = list(tokens)
    hit = find_anchor(tok.decode(tokens), anchor, **forms)
    if hit is None:
        return len(tokens)
    m = 0
    while m < len(tokens) and len(tok.decode(tokens[: m + 1])) <= hit[1]:
        m += 1
    return m


class GapRunner:
    """Computes the probe rows and scenario rows of a chunk of scenarios on one loaded model."""

    def __init__(self, lm, profile: GapProfile, groups, seed: int, sample: bool, panel_name: str, model_name: str,
                 progress=None, token_budget=None, depth: bool = False, lens=None):
        self.lm, self.profile, self.groups, self.seed, self.sample = lm, profile, groups, seed, sample
        self.panel_name, self.model_name, self.progress = panel_name, model_name, progress
        self.token_budget = token_budget
        self.depth = depth
        """Also read depth.parquet and patching.parquet (readouts/gap/depth.py)."""
        self.lens = lens
        """A tuned lens (engine.tuned_lens.TunedLens) the depth rows are also read through, or None."""
        self.tok = lm.tokenizer
        self.stop = stop_token_ids(self.tok, lm.model)
        self.timings: dict[str, float] = {}
        self._known: dict = {}
        self.counts: dict[str, int] = {}
        self.batches: dict[str, list] = {}
        """Per stage, each decoding batch of this session: [call label, rows, distinct prompt tokens, longest budget]."""
        self._texts: dict[tuple, str] = {}

    def _tick(self, n):
        if self.progress is not None:
            self.progress.update(n)

    def run(self, scenarios) -> tuple[list[dict], ...]:
        """Probe rows and scenario rows for `scenarios` (and with `depth`, depth and patching rows); per-stage
        seconds and probe counts accumulate in `self.timings` / `self.counts`."""
        reads, rows, deep, patched = [], [], [], []
        self._texts = {}  # decoded prompts of this chunk only
        for name, specs in stages(self.groups, self.profile):
            t0 = time.perf_counter()
            # Prompt caches and the rows' own caches from this stage's generation, reused to read after the anchor.
            self._known = RowCaches()
            if specs[0].read == FIRST_TOKEN:
                stage_reads = self._first_token_reads(scenarios, specs[0])
            else:
                stage_reads = self._generated_reads(scenarios, specs)
            stage_rows, results = self._score(stage_reads, residuals=self.depth and specs[0].read == FIRST_TOKEN)
            rows += stage_rows
            if self.depth and specs[0].read == FIRST_TOKEN:
                deep += depth_rows(self.lm, self.model_name, stage_reads, results, self.lens)
                if specs[0].name == "D":
                    patched += patch_rows(self, scenarios, stage_reads, results)
            self._known = {}
            reads += stage_reads
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            self.counts[name] = self.counts.get(name, 0) + len(stage_reads)
        keys = [(rd.scenario.id, rd.cell, rd.spec.name, rd.frame) for rd in reads]
        tables = rows, scenario_rows(scenarios, keys, rows, self.profile, self.sample, self.model_name, self.panel_name)
        return (*tables, deep, patched) if self.depth else tables

    # -- planning ----------------------------------------------------------------------------------
    def _first_token_reads(self, scenarios, spec: ReadoutSpec) -> list[Read]:
        reads = []
        (frame,) = spec.frames
        for s in scenarios:
            orders = orders_for(s, spec, self.profile, self.seed)
            for cell in (c for c in cells_read(s, self.profile) if spec.reads_cell(c)):
                for k, order in enumerate(orders):
                    r = render(s, frame, cell, order, self.profile.frames)
                    reads.append(Read(s, cell, spec, frame, k, r, 0, tuple(encode_prompt(self.tok, prompt_of(r)))))
        return reads

    def _generated_reads(self, scenarios, specs) -> list[Read]:
        """Every generating spec of one group in one decoding loop per rollout count (each job with its own
        budget, a `length_of` job tied to its paired job's rollouts); the group's frames share seeded option
        orders (J: one order per paraphrase; dose: one for every arm, the rider included)."""
        jobs = generation_jobs(scenarios, specs, self.profile, self.seed)
        reads, texts = [], {}
        for label, n, part, ties in generation_calls(jobs, self.profile):
            prompts = [tuple(encode_prompt(self.tok, prompt_of(job[5]))) for job in part]
            shapes = []
            generated = generate(
                self.lm.model, prompts, max_new_tokens=[getattr(self.profile, job[2].budget) for job in part],
                stop_ids=self.stop, n=n, greedy_first=True, temperature=self.profile.temperature,
                top_p=self.profile.top_p, pad_id=self.lm.pad_id, token_budget=self.token_budget,
                seeds=[derive_seed(self.seed, s.id, cell, sp.seeded_as or sp.name, frame) for s, cell, sp, frame, _, _ in part],
                on_batch=lambda k, n=n: self._tick(k * n), row_kv=self._known, length_of=ties, batches=shapes,
            )
            self.batches.setdefault(part[0][2].group, []).extend([label, *shape] for shape in shapes)
            for (s, cell, sp, frame, k, r), ids, rolls, tie in zip(part, prompts, generated, ties):
                for j, rollout in enumerate(rolls):
                    a = anchor_read(self.tok, ids, rollout, r.anchor, **answer_forms(s, r))
                    paired = None if tie is None else len(generated[tie][j].tokens)
                    reads.append(Read(s, cell, sp, frame, k, r, j, a.ids, a.text, len(rollout.tokens), a.rule, ids,
                                      paired_tokens=paired))
                    texts[(sp.name, s.id, cell, j)] = (s, r, ids, rollout, a)
        for derived in (sp for sp in specs if sp.derived_from is not None):
            reads += self._derived_reads(derived, texts)
        return reads

    def _derived_reads(self, spec: ReadoutSpec, texts) -> list[Read]:
        """The source readout's texts cut, each read after the anchor there: where the paired `cut_like` read
        of the same scenario, cell and rollout kept its own text, with the answer forced (the truncated filler:
        the restatement in the cut-off, forced form the reasoning has; if the filler wrote its own anchor
        before that point, it is cut just before it), else at the profile's `budget` (the rider at the dose
        budget: the read the reasoning arm makes of the same rollout)."""
        out = []
        for (name, sid, cell, j), (s, r, ids, rollout, _) in texts.items():
            if name != spec.derived_from:
                continue
            forms = answer_forms(s, r)
            paired = None
            if spec.cut_like is not None:
                paired = texts[(spec.cut_like, sid, cell, j)][4].kept_tokens
                a = anchor_read(self.tok, ids, rollout, r.anchor, cut=paired, **forms)
                if a.rule.startswith("own"):  # its own anchor stands before the cut: cut before it, so it is forced
                    a = anchor_read(self.tok, ids, rollout, r.anchor, cut=_before_anchor(self.tok, rollout.tokens[:paired],
                                                                                         r.anchor, forms), **forms)
            else:
                a = anchor_read(self.tok, ids, rollout, r.anchor, cut=getattr(self.profile, spec.budget), **forms)
            out.append(Read(s, cell, spec, spec.frames[0], 0, r, j, a.ids, a.text, a.kept_tokens, a.rule, ids,
                            paired_tokens=paired))
            self._tick(1)
        return out

    # -- scoring -----------------------------------------------------------------------------------
    def _score(self, reads: list[Read], residuals: bool = False) -> tuple[list[dict], list]:
        """Probe rows of `reads`, and the engine's results (with each read's residuals if asked)."""
        rows: list[dict | None] = [None] * len(reads)
        kept: list = [None] * len(reads)
        by_temperature = {}
        for i, rd in enumerate(reads):
            by_temperature.setdefault(0.0 if rd.spec.greedy else self.profile.temperature, []).append(i)
        for temperature, idx in sorted(by_temperature.items()):
            letters = [self.lm.letters(reads[i].rendered.letters) for i in idx]
            results = score_ids(
                self.lm.model, [reads[i].ids for i in idx], letters, temperature=temperature,
                top_p=self.profile.top_p if temperature > 0 else 1.0, pad_id=self.lm.pad_id,
                token_budget=self.token_budget, known_prefixes=self._known, residuals=residuals,
            )
            for i, res in zip(idx, results):
                rows[i], kept[i] = self._probe_row(reads[i], res), res
                if reads[i].anchor_rule is None:
                    self._tick(1)
        return rows, kept

    def _prompt_text(self, ids: tuple) -> str:
        """The prompt as the model read it: its ids decoded, special tokens kept (decoded once per prompt)."""
        if ids not in self._texts:
            self._texts[ids] = self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return self._texts[ids]

    def _probe_row(self, rd: Read, res) -> dict:
        r = rd.rendered
        v = r.letters.index(r.violating_letter)
        total = sum(res.mass)
        row = dict(
            probe_id=f"{rd.scenario.id}|{rd.cell}|{rd.spec.name}|{rd.frame}|o{rd.order_index}|r{rd.rollout}",
            scenario_id=rd.scenario.id, cell=rd.cell, readout=rd.spec.name, frame=rd.frame,
            order_index=rd.order_index, order=",".join(r.option_ids), rollout=rd.rollout,
            letters="".join(r.letters), violating_letter=r.violating_letter, mass=list(res.mass),
            letter_mass=res.letter_mass, tempered=list(res.tempered),
            p_violating=res.mass[v] / total if total > 0 else math.nan, top_letter=r.letters[int(np.argmax(res.mass))],
            prompt_tokens=res.n_tokens, generated_text=rd.text, generated_tokens=rd.generated_tokens,
            anchor_rule=rd.anchor_rule, sampled_letter=None, **{PAIRED_TOKENS: rd.paired_tokens}, **NO_BOUND,
        )
        row[PROMPT_TEXT] = self._prompt_text(rd.prompt_ids or rd.ids)
        row[METADATA] = encode_metadata(rd.scenario.metadata)
        if self.sample and rd.anchor_rule is None:
            rng = np.random.default_rng(derive_seed(self.seed, row["probe_id"], "sample"))
            probs = np.array(list(res.tempered) + [max(0.0, 1.0 - sum(res.tempered))])
            pick = rng.choice(len(probs), p=probs / probs.sum())
            row["sampled_letter"] = r.letters[pick] if pick < len(r.letters) else None
        return row

