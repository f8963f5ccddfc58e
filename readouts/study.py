"""The judgment–action recipes: expand scenarios into probes for each readout, call the engine, and
aggregate rollouts into per-scenario rows (docs/tables.md). One call handles one chunk of scenarios.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.stats import poisson_binom

from engine.generation import anchor_read, derive_seed, generate, stop_token_ids
from engine.scoring import Prompt, encode_prompt, score_ids
from panels.frames import JUDGE_FRAMES, render
from panels.orders import option_orders
from readouts.profiles import Profile

# First-token readouts: readout -> (group, frame, profile field with the number of orders, greedy?)
FIRST_TOKEN = {
    "D": ("D", "agent", "d_orders", False),
    "J0": ("J0", "judge_letter", "j0_orders", False),
    "control": ("control", "control", "control_orders", False),
    "raw_D": ("raw", "raw_agent", "raw_orders", True),
    "raw_J": ("raw", "raw_judge", "raw_orders", True),
}
DOSE_ARMS = ("reasoning", "filler", "brief", "norm")
READOUT_ORDER = ["D", "J", "J0", "raw_D", "raw_J", "control", "dose_reasoning", "dose_filler",
                 "dose_truncated_filler", "dose_brief", "dose_norm"]


@dataclass
class Read:
    """One planned read position before scoring."""

    scenario: object
    cell: str
    readout: str
    frame: str
    order_index: int
    rendered: object
    rollout: int
    ids: tuple
    text: str | None = None
    generated_tokens: int | None = None
    anchor_rule: str | None = None


def _prompt(rendered) -> Prompt:
    if rendered.text is not None:
        return Prompt(text=rendered.text)
    return Prompt(messages=rendered.messages, system=rendered.system)


def reads_per_scenario(scenario, profile: Profile, groups) -> int:
    """How many read positions a scenario costs (for the progress bar's total)."""
    per_cell = 0
    for readout, (group, _, field, _) in FIRST_TOKEN.items():
        if group in groups:
            per_cell += getattr(profile, field)
    if "J" in groups:
        per_cell += len(JUDGE_FRAMES) * (1 + profile.j_samples)
    if "dose" in groups:
        per_cell += (len(DOSE_ARMS) + 1) * profile.dose_rollouts
    return per_cell * len(scenario.cells)


class ChunkRunner:
    """Computes the probe rows and scenario rows of a chunk of scenarios on one loaded model."""

    def __init__(self, lm, profile: Profile, groups, seed: int, sample: bool, panel_name: str, model_name: str,
                 progress=None, token_budget=None):
        self.lm, self.profile, self.groups, self.seed, self.sample = lm, profile, groups, seed, sample
        self.panel_name, self.model_name, self.progress = panel_name, model_name, progress
        self.token_budget = token_budget
        self.tok = lm.tokenizer
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.stop = stop_token_ids(self.tok, lm.model)
        self.timings: dict[str, float] = {}
        self._known: dict = {}
        self.counts: dict[str, int] = {}

    def _tick(self, n):
        if self.progress is not None:
            self.progress.update(n)

    def run(self, scenarios) -> tuple[list[dict], list[dict]]:
        """Probe rows and scenario rows for `scenarios`; per-readout seconds and probe counts accumulate
        in `self.timings` / `self.counts`."""
        reads, rows = [], []
        stages = [(ro, lambda ro=ro: self._first_token_reads(scenarios, ro)) for ro, spec in FIRST_TOKEN.items()
                  if spec[0] in self.groups]
        if "J" in self.groups:
            stages.append(("J", lambda: self._judge_reads(scenarios)))
        if "dose" in self.groups:
            stages.append(("dose", lambda: self._dose_reads(scenarios)))
        for name, plan in stages:
            t0 = time.perf_counter()
            self._known = {}  # prompt caches from this stage's generation, reused to read after the anchor
            stage_reads = plan()
            rows += self._score(stage_reads)
            self._known = {}
            reads += stage_reads
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            self.counts[name] = self.counts.get(name, 0) + len(stage_reads)
        return rows, self._aggregate(scenarios, reads, rows)

    # -- planning ----------------------------------------------------------------------------------
    def _first_token_reads(self, scenarios, readout) -> list[Read]:
        reads = []
        _, frame, field, _ = FIRST_TOKEN[readout]
        for s in scenarios:
            orders = option_orders(len(s.options), getattr(self.profile, field), self.seed, f"{s.id}|{readout}")
            for cell in s.cells:
                for k, order in enumerate(orders):
                    r = render(s, frame, cell, order)
                    ids = tuple(encode_prompt(self.tok, _prompt(r)))
                    reads.append(Read(s, cell, readout, frame, k, r, 0, ids))
        return reads

    def _generated_reads(self, jobs, n, budget_of) -> list[tuple]:
        """jobs: (scenario, cell, readout, frame, order_index, rendered); returns (job, prompt ids, rollouts).
        One decoding loop for all jobs, each with its own token budget."""
        prompts = [tuple(encode_prompt(self.tok, _prompt(job[5]))) for job in jobs]
        rollouts = generate(
            self.lm.model, prompts, max_new_tokens=[budget_of(job) for job in jobs], stop_ids=self.stop, n=n,
            greedy_first=True, temperature=self.profile.temperature, top_p=self.profile.top_p,
            seeds=[derive_seed(self.seed, job[0].id, job[1], job[2], job[3]) for job in jobs],
            pad_id=self.pad, token_budget=self.token_budget, on_batch=lambda k: self._tick(k * n),
            prefix_kv=self._known,
        )
        return list(zip(jobs, prompts, rollouts))

    def _judge_reads(self, scenarios) -> list[Read]:
        jobs = []
        for s in scenarios:
            orders = option_orders(len(s.options), len(JUDGE_FRAMES), self.seed, f"{s.id}|J")
            for cell in s.cells:
                for k, frame in enumerate(JUDGE_FRAMES):
                    jobs.append((s, cell, "J", frame, k, render(s, frame, cell, orders[k])))
        reads = []
        for (s, cell, readout, frame, k, r), ids, rollouts in self._generated_reads(
            jobs, 1 + self.profile.j_samples, lambda job: self.profile.j_budget
        ):
            for j, rollout in enumerate(rollouts):
                a = anchor_read(self.tok, ids, rollout, r.anchor)
                reads.append(Read(s, cell, readout, frame, k, r, j, a.ids, a.text, len(rollout.tokens), a.rule))
        return reads

    def _dose_reads(self, scenarios) -> list[Read]:
        jobs = []
        for s in scenarios:
            order = option_orders(len(s.options), 1, self.seed, f"{s.id}|dose")[0]
            for cell in s.cells:
                for arm in DOSE_ARMS:
                    jobs.append((s, cell, f"dose_{arm}", f"dose_{arm}", 0, render(s, f"dose_{arm}", cell, order)))
        budget = lambda job: self.profile.dose_brief_budget if job[2] == "dose_brief" else self.profile.dose_budget  # noqa: E731
        reads, filler = [], {}
        for (s, cell, readout, frame, k, r), ids, rollouts in self._generated_reads(jobs, self.profile.dose_rollouts, budget):
            for j, rollout in enumerate(rollouts):
                a = anchor_read(self.tok, ids, rollout, r.anchor)
                reads.append(Read(s, cell, readout, frame, k, r, j, a.ids, a.text, len(rollout.tokens), a.rule))
                if readout == "dose_filler":
                    filler[(s.id, cell, j)] = (s, r, ids, rollout)
        # Truncated filler: the filler text cut mid-way (half its tokens) with the anchor forced there,
        # so the restatement has the cut-off, forced form that truncated reasoning has.
        for (_, cell, j), (s, r, ids, rollout) in filler.items():
            cut = len(rollout.tokens) // 2
            a = anchor_read(self.tok, ids, rollout, r.anchor, cut=cut)
            if a.rule == "own":  # the anchor sits in the kept half: cut before it so the answer is forced
                a = anchor_read(self.tok, ids, rollout, r.anchor, cut=max(0, a.kept_tokens - 1))
            reads.append(Read(s, cell, "dose_truncated_filler", "dose_filler", 0, r, j, a.ids, a.text, cut, a.rule))
            self._tick(1)
        return reads

    # -- scoring -----------------------------------------------------------------------------------
    def _score(self, reads: list[Read]) -> list[dict]:
        rows: list[dict | None] = [None] * len(reads)
        groups = {}
        for i, rd in enumerate(reads):
            greedy = rd.readout in ("raw_D", "raw_J")
            groups.setdefault(0.0 if greedy else self.profile.temperature, []).append(i)
        for temperature, idx in sorted(groups.items()):
            letters = [self.lm.letters(reads[i].rendered.letters) for i in idx]
            first_token = [reads[i].anchor_rule is None for i in idx]
            results = score_ids(
                self.lm.model, [reads[i].ids for i in idx], letters, temperature=temperature,
                top_p=self.profile.top_p if temperature > 0 else 1.0, pad_id=self.pad, token_budget=self.token_budget,
                known_prefixes=self._known,
            )
            for i, res, ft in zip(idx, results, first_token):
                rows[i] = self._probe_row(reads[i], res)
                if ft:
                    self._tick(1)
        return rows

    def _probe_row(self, rd: Read, res) -> dict:
        r = rd.rendered
        v = r.letters.index(r.violating_letter)
        total = sum(res.mass)
        top = r.letters[int(np.argmax(res.mass))]
        row = dict(
            probe_id=f"{rd.scenario.id}|{rd.cell}|{rd.readout}|{rd.frame}|o{rd.order_index}|r{rd.rollout}",
            scenario_id=rd.scenario.id, cell=rd.cell, readout=rd.readout, frame=rd.frame,
            order_index=rd.order_index, order=",".join(r.option_ids), rollout=rd.rollout,
            letters="".join(r.letters), violating_letter=r.violating_letter, mass=list(res.mass),
            letter_mass=res.letter_mass, tempered=list(res.tempered),
            p_violating=res.mass[v] / total if total > 0 else math.nan, top_letter=top,
            prompt_tokens=res.n_tokens, generated_text=rd.text, generated_tokens=rd.generated_tokens,
            anchor_rule=rd.anchor_rule, sampled_letter=None,
        )
        if self.sample and rd.anchor_rule is None:
            rng = np.random.default_rng(derive_seed(self.seed, row["probe_id"], "sample"))
            probs = np.array(list(res.tempered) + [max(0.0, 1.0 - sum(res.tempered))])
            pick = rng.choice(len(probs), p=probs / probs.sum())
            row["sampled_letter"] = r.letters[pick] if pick < len(r.letters) else None
        return row

    # -- aggregation -------------------------------------------------------------------------------
    def _aggregate(self, scenarios, reads, rows) -> list[dict]:
        by_key = {}
        for rd, row in zip(reads, rows):
            by_key.setdefault((rd.scenario.id, rd.cell, rd.readout, rd.frame), []).append((rd, row))
        out = []
        for s in scenarios:
            base = dict(model=self.model_name, panel=self.panel_name, scenario_id=s.id, family=s.family,
                        domain=s.domain, generator=s.generator, prompt_version=s.prompt_version)
            for cell in s.cells:
                for readout in READOUT_ORDER:
                    frames = sorted({f for (sid, c, ro, f) in by_key if sid == s.id and c == cell and ro == readout},
                                    key=lambda f: (len(f), f))
                    frame_rows = []
                    for frame in frames:
                        items = by_key[(s.id, cell, readout, frame)]
                        row = self._first_token_row(items) if readout in FIRST_TOKEN else self._generated_row(s, items)
                        row.update(base, cell=cell, readout=readout, frame=frame)
                        frame_rows.append(row)
                    out.extend(frame_rows)
                    if readout == "J" and frame_rows:
                        out.append(self._judge_aggregate(s, frame_rows, base, cell))
        return out

    def _first_token_row(self, items) -> dict:
        p = np.array([row["p_violating"] for _, row in items], dtype=float)
        greedy = items[0][0].readout in ("raw_D", "raw_J")
        if self.sample:
            picks = [row["sampled_letter"] for _, row in items]
            letters = [x for x in picks if x is not None]
            hits = sum(x == row["violating_letter"] for x, (_, row) in zip(picks, items) if x is not None)
            frac = hits / len(letters) if letters else math.nan
            majority = float(hits > len(items) / 2)
        else:
            if greedy:
                q = np.array([float(row["top_letter"] == row["violating_letter"]) for _, row in items])
            else:
                q = []
                for _, row in items:
                    tot = sum(row["tempered"])
                    v = row["letters"].index(row["violating_letter"])
                    q.append(row["tempered"][v] / tot if tot > 0 else math.nan)
                q = np.array(q)
            q = q[~np.isnan(q)]
            frac = float(q.mean()) if len(q) else math.nan
            majority = float(poisson_binom(q).sf(len(q) // 2)) if len(q) else math.nan
        return dict(budget=None, p_violating=float(np.nanmean(p)) if len(p) else math.nan, violating_fraction=frac,
                    majority_violating_prob=majority, letter_mass=float(np.mean([row["letter_mass"] for _, row in items])),
                    judged_option=None, stability=None, violating_judged_frames=None,
                    n_orders=len(items), n_rollouts=len(items), completed_fraction=None)

    def _generated_row(self, s, items) -> dict:
        rows = [row for _, row in items]
        viol = [row["top_letter"] == row["violating_letter"] for row in rows]
        completed = [row["anchor_rule"] in ("own", "forced_after_completion") for row in rows]
        readout = items[0][0].readout
        budget = self.profile.j_budget if readout == "J" else (
            self.profile.dose_brief_budget if readout == "dose_brief" else self.profile.dose_budget)
        row = dict(budget=budget, p_violating=float(np.nanmean([r["p_violating"] for r in rows])),
                   violating_fraction=float(np.mean(viol)), majority_violating_prob=float(sum(viol) > len(viol) / 2),
                   letter_mass=float(np.mean([r["letter_mass"] for r in rows])), judged_option=None, stability=None,
                   violating_judged_frames=None, n_orders=len({r["order_index"] for r in rows}), n_rollouts=len(rows),
                   completed_fraction=float(np.mean(completed)))
        if readout == "J":
            rendered = items[0][0].rendered
            option_at = dict(zip(rendered.letters, rendered.option_ids))
            greedy = next(r for r in rows if r["rollout"] == 0)
            row["judged_option"] = option_at[greedy["top_letter"]]
            sampled = [option_at[r["top_letter"]] for r in rows if r["rollout"] > 0]
            if sampled:
                top = Counter(sampled).most_common()
                majority = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else None
                row["stability"] = majority == row["judged_option"]
        return row

    def _judge_aggregate(self, s, frame_rows, base, cell) -> dict:
        judged = [r["judged_option"] for r in frame_rows]
        top = Counter(judged).most_common()
        named = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else None
        stab = [r["stability"] for r in frame_rows]
        n_roll = sum(r["n_rollouts"] for r in frame_rows)
        viol = sum(r["violating_fraction"] * r["n_rollouts"] for r in frame_rows)
        row = dict(base, cell=cell, readout="J", frame="judge", budget=frame_rows[0]["budget"],
                   p_violating=float(np.mean([r["p_violating"] for r in frame_rows])),
                   violating_fraction=viol / n_roll, majority_violating_prob=float(viol > n_roll / 2),
                   letter_mass=float(np.mean([r["letter_mass"] for r in frame_rows])), judged_option=named,
                   stability=None if any(x is None for x in stab) else all(stab),
                   violating_judged_frames=sum(j == s.violating for j in judged),
                   n_orders=len(frame_rows), n_rollouts=n_roll,
                   completed_fraction=float(np.mean([r["completed_fraction"] for r in frame_rows])))
        return row


SCENARIO_COLUMNS = ["model", "panel", "scenario_id", "family", "domain", "generator", "prompt_version", "cell",
                    "readout", "frame", "budget", "p_violating", "violating_fraction", "majority_violating_prob",
                    "letter_mass", "judged_option", "stability", "violating_judged_frames", "n_orders", "n_rollouts",
                    "completed_fraction"]


def scenario_frame(rows: list[dict]):
    """Scenario rows as a DataFrame with stable dtypes (nullable ints and booleans where a value can be unset)."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=SCENARIO_COLUMNS)
    return df.astype({"budget": "Int64", "violating_judged_frames": "Int64", "stability": "boolean",
                      "n_orders": "int64", "n_rollouts": "int64"})


def probe_frame(rows: list[dict]):
    """Probe rows as a DataFrame with stable dtypes."""
    import pandas as pd

    df = pd.DataFrame(rows)
    return df.astype({"generated_tokens": "Int64"})
