"""The judgment-action recipe: expand scenarios into read positions for each readout spec, generate
where a readout reads after text, and score every read position on the engine. One call handles one
chunk of scenarios, or a window of chunks decoded together (`run_window`); readouts/gap/aggregate.py turns its
probe rows into scenario rows.
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
from engine.render import encode_prompt
from engine.rowcache import RowCaches
from engine.sampling import derive_seed
from engine.scoring import score_ids
from panels.frames import render
from panels.orders import option_orders
from readouts.gap.aggregate import scenario_rows
from readouts.gap.depth import depth_rows, patch_rows
from readouts.gap.profile import GapProfile, cells_read, is_on, rollouts
from readouts.gap.prompts import answer_forms, prompt_of
from readouts.gap.span_patch import grid_rows


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
                 progress=None, token_budget=None, depth: bool = False, lens=None, generate=None):
        self.lm, self.profile, self.groups, self.seed, self.sample = lm, profile, groups, seed, sample
        self.panel_name, self.model_name, self.progress = panel_name, model_name, progress
        self.token_budget = token_budget
        self.depth = depth
        """Also read depth.parquet and patching.parquet (readouts/gap/depth.py), and patch_grid.parquet
        (readouts/gap/span_patch.py)."""
        self.lens = lens
        """A tuned lens (engine.tuned_lens.TunedLens) the depth rows are also read through, or None."""
        self.drawer = generate
        """What draws the rollouts, with engine.generation.generate's signature (a vLLM generator:
        engine/vllm_generation.py); None: the own decoder."""
        self.tok = lm.tokenizer
        self.stop = stop_token_ids(self.tok, lm.model)
        self.timings: dict[str, float] = {}
        self._known: dict = {}
        self.counts: dict[str, int] = {}
        self.batches: dict[str, list] = {}
        """Per stage, each decoding batch of this session: [call label, rows, distinct prompt tokens, longest budget]."""
        self._texts: dict[tuple, str] = {}

    def tick(self, n):
        """Move the progress bar by `n` of its units (reads, and a depth run's patching forwards)."""
        if self.progress is not None:
            self.progress.update(n)

    def run(self, scenarios) -> tuple[list[dict], ...]:
        """Probe rows and scenario rows for `scenarios` (and with `depth`, depth and patching rows); per-stage
        seconds and probe counts accumulate in `self.timings` / `self.counts`."""
        return self.run_window([scenarios])[0]

    def run_window(self, chunks) -> list[tuple[list[dict], ...]]:
        """`run`'s tables of each of `chunks`, their generated stages computed together: each `generate` call and
        its reads gather the prompts of every chunk (decoding batches limited by the device, not by a chunk's
        size). First-token stages read chunk by chunk (their batches gain little across chunks, and a depth run's
        residuals are then held for one chunk at a time). What a chunk reads of its own other scenarios (the
        foreign patch partner) and its scenario rows stay within the chunk, so each chunk's rows are those `run`
        gives it alone, up to the batches' float tolerance."""
        scenarios = [s for chunk in chunks for s in chunk]
        where = {s.id: i for i, chunk in enumerate(chunks) for s in chunk}
        if len(where) != len(scenarios):
            raise ReadoutError("run_window: a scenario id stands in two chunks of one window")
        out = [dict(reads=[], rows=[], deep=[], patched=[], grid=[]) for _ in chunks]
        self._texts = {}  # decoded prompts of this window only
        for name, specs in stages(self.groups, self.profile):
            t0 = time.perf_counter()
            # Prompt caches and the rows' own caches from this stage's generation, reused to read after the anchor.
            self._known = RowCaches()
            count = 0
            if specs[0].read == FIRST_TOKEN:
                for chunk, got in zip(chunks, out):
                    reads = self._first_token_reads(chunk, specs[0])
                    rows, results = self._score(reads, residuals=self.depth)
                    self._keep(got, chunk, specs[0], reads, rows, results)
                    count += len(reads)
            else:
                reads, rows, results = self._generated_reads(scenarios, specs)
                count = len(reads)
                for i, (chunk, got) in enumerate(zip(chunks, out)):
                    mine = [k for k, rd in enumerate(reads) if where[rd.scenario.id] == i]
                    self._keep(got, chunk, specs[0], *([x[k] for k in mine] for x in (reads, rows, results)))
            self._known = {}
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            self.counts[name] = self.counts.get(name, 0) + count
        tables = []
        for chunk, got in zip(chunks, out):
            keys = [(rd.scenario.id, rd.cell, rd.spec.name, rd.frame) for rd in got["reads"]]
            rows = scenario_rows(chunk, keys, got["rows"], self.profile, self.sample, self.model_name, self.panel_name)
            tables.append((got["rows"], rows, got["deep"], got["patched"], got["grid"]) if self.depth else (got["rows"], rows))
        return tables

    def _keep(self, got: dict, chunk, spec: ReadoutSpec, reads, rows, results) -> None:
        """One chunk's reads of one stage into its tables `got` (with `depth`, a first-token stage's depth rows,
        and D's patched rows, which read the chunk's own scenarios)."""
        got["reads"] += reads
        got["rows"] += rows
        if self.depth and spec.read == FIRST_TOKEN:
            got["deep"] += depth_rows(self.lm, self.model_name, reads, results, self.lens)
            if spec.name == "D":
                got["patched"] += patch_rows(self, chunk, reads, results)
                got["grid"] += grid_rows(self, chunk, reads)

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

    def _generated_reads(self, scenarios, specs) -> tuple[list[Read], list[dict], list]:
        """Every generating spec of one group in one decoding loop per rollout count (each job with its own
        budget, a `length_of` job tied to its paired job's rollouts); the group's frames share seeded option
        orders (J: one order per paraphrase; dose: one for every arm, the rider included). Returns the reads, in
        job order then the derived readouts', with their probe rows and the engine's results.

        Each decoding batch's rows are read as soon as the batch is done, on top of their own caches, which are
        then let go: the row caches hold one batch at a time, however many chunks a window gathers. A derived
        read whose paired text lies in a later batch (never, while a tied pair decodes in one batch) waits for
        the end of the stage and re-encodes its text there (its batch's caches are gone by then)."""
        jobs = generation_jobs(scenarios, specs, self.profile, self.seed)
        derived = [sp for sp in specs if sp.derived_from is not None]
        texts, done, waiting = {}, {}, []  # every text of the stage; the reads made, by order key; derived reads left
        for c, (label, n, part, ties) in enumerate(generation_calls(jobs, self.profile)):
            prompts = [tuple(encode_prompt(self.tok, prompt_of(job[5]))) for job in part]
            rolled = {}

            def read_batch(flat, generated, c=c, part=part, prompts=prompts, ties=ties, rolled=rolled):
                rolled.update(zip(flat, generated))
                mine, new = [], []
                for i in flat:
                    s, cell, sp, frame, k, r = part[i]
                    for j, rollout in enumerate(rolled[i]):
                        a = anchor_read(self.tok, prompts[i], rollout, r.anchor, **answer_forms(s, r))
                        paired = None if ties[i] is None else len(rolled[ties[i]][j].tokens)
                        mine.append(((0, c, i, j), Read(s, cell, sp, frame, k, r, j, a.ids, a.text, len(rollout.tokens),
                                                        a.rule, prompts[i], paired_tokens=paired)))
                        key = (sp.name, s.id, cell, j)
                        texts[key] = (s, r, prompts[i], rollout, a)
                        new.append((key, (c, i, j)))
                for d, spec in enumerate(derived):
                    for key, at in new:
                        if key[0] == spec.derived_from:
                            if spec.cut_like is not None and (spec.cut_like, *key[1:]) not in texts:
                                waiting.append((d, spec, key, at))
                            else:
                                mine.append(((1, d, *at), self._derived_read(spec, key, texts)))
                self._read_now(mine, done)
                self._known.release(prompts[i] for i in flat)

            shapes = []
            (self.drawer or generate)(
                self.lm.model, prompts, max_new_tokens=[getattr(self.profile, job[2].budget) for job in part],
                stop_ids=self.stop, n=n, greedy_first=True, temperature=self.profile.temperature,
                top_p=self.profile.top_p, pad_id=self.lm.pad_id, token_budget=self.token_budget,
                seeds=[derive_seed(self.seed, s.id, cell, sp.seeded_as or sp.name, frame) for s, cell, sp, frame, _, _ in part],
                on_batch=lambda k, n=n: self.tick(k * n), row_kv=self._known, length_of=ties, batches=shapes,
                on_rollouts=read_batch,
            )
            if len(rolled) != len(part):
                raise RuntimeError(f"{label}: generate returned without handing {len(part) - len(rolled)} of its prompts' "
                                   "rollouts to on_rollouts (their reads would be missing)")
            self.batches.setdefault(part[0][2].group, []).extend([label, *shape] for shape in shapes)
        self._read_now([((1, d, *at), self._derived_read(spec, key, texts)) for d, spec, key, at in waiting], done)
        ordered = [done[key] for key in sorted(done)]
        return [x[0] for x in ordered], [x[1] for x in ordered], [x[2] for x in ordered]

    def _read_now(self, keyed_reads, done: dict) -> None:
        """Score `keyed_reads` ((order key, Read) pairs) into `done` {order key: (read, probe row, result)}."""
        if not keyed_reads:
            return
        reads = [rd for _, rd in keyed_reads]
        rows, results = self._score(reads)
        for (key, rd), row, res in zip(keyed_reads, rows, results):
            done[key] = (rd, row, res)

    def _derived_read(self, spec: ReadoutSpec, key: tuple, texts) -> Read:
        """The source readout's text `key` (its readout, scenario, cell, rollout) cut, and read after the anchor
        there: where the paired `cut_like` read of the same scenario, cell and rollout kept its own text, with the
        answer forced (the truncated filler: the restatement in the cut-off, forced form the reasoning has; if the
        filler wrote its own anchor before that point, it is cut just before it), else at the profile's `budget`
        (the rider at the dose budget: the read the reasoning arm makes of the same rollout)."""
        _, sid, cell, j = key
        s, r, ids, rollout, _ = texts[key]
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
        self.tick(1)
        return Read(s, cell, spec, spec.frames[0], 0, r, j, a.ids, a.text, a.kept_tokens, a.rule, ids, paired_tokens=paired)

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
                    self.tick(1)
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

