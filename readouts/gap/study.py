"""`readout run`: the judgment-action study as the run driver sees it (panel kind, tables, profiles,
the records' cost, the recipe, and the summary printed at the end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from contract.names import DEPTH_GROUP
from contract.readouts import FIRST_TOKEN, READOUTS, readout_groups
from contract.tables import DEPTH, PATCH_GRID, PATCHING, PROBES, SCENARIOS
from engine.errors import ReadoutError
from engine.render import encode_prompt
from panels.frames import render
from readouts.gap.profile import PAPER_FIELDS, PROFILES, cells_read, run_name
from readouts.gap.prompts import prompt_of
from readouts.gap.recipe import ANCHOR_ALLOWANCE, GapRunner, active_specs, reads_per_scenario, stages
from readouts.profiles import not_paper_note


def wants_depth(spec: str | None) -> bool:
    """Whether `--readouts` names `depth` (the depth tables on the first-token reads)."""
    return spec is not None and DEPTH_GROUP in (p.strip() for p in spec.split(","))


def parse_readouts(spec: str | None, chat: bool) -> tuple[str, ...]:
    """`--readouts D,J,...` to a tuple of groups; the default is every group the model supports. `depth` among
    them adds the depth tables; alone, it reads the first-token groups at depth."""
    groups = readout_groups()
    if spec is None:
        return groups if chat else ("raw",)
    chosen = tuple(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip() and p.strip() != DEPTH_GROUP))
    if not chosen and wants_depth(spec):
        first = tuple(dict.fromkeys(s.group for s in READOUTS if s.read == FIRST_TOKEN))
        return first if chat else ("raw",)
    bad = [g for g in chosen if g not in groups]
    if bad or not chosen:
        raise ReadoutError(f"--readouts: '{','.join(bad) or spec}' not among {','.join(groups + (DEPTH_GROUP,))}")
    if not chat:
        needs_chat = [g for g in chosen if g != "raw"]
        if needs_chat:
            raise ReadoutError(f"--readouts: {','.join(needs_chat)} need a chat template, and this model has none (use --readouts raw)")
    return chosen


@dataclass
class GapStudy:
    """The judgment-action study; `readouts` and `sample` are its own options."""

    readouts: str | None = None
    """`--readouts`: a subset of the groups (twins always ride along)."""
    sample: bool = False
    """Draw seeded rollouts for first-token readouts instead of exact probabilities."""
    lens: str | None = None
    """`--lens`: a tuned-lens file (`readout lens train`) the depth tables are also read through."""
    kind: str = "judgment-action"
    runner_type = GapRunner  # not a field: the local runner's class
    tables: tuple[str, ...] = (PROBES.name, SCENARIOS.name)
    panel_kind: str = "gap"
    default_panel: str = "gap-v2"
    default_seed: int = 0
    groups: tuple[str, ...] = ()
    """The groups read (set by `prepare` from `readouts` and the model)."""
    panel_name: str = ""
    profile: object = None
    """The resolved profile of the run (set by `prepare`), for the summary's settings note."""
    stats_command: str = "readout stats"
    """What reads the run next (the summary's last line names it)."""

    def __post_init__(self):
        if wants_depth(self.readouts):
            self.tables = (*self.tables, DEPTH.name, PATCHING.name, PATCH_GRID.name)
        elif self.lens is not None:
            raise ReadoutError("--lens: reads the depth tables; add depth to --readouts (e.g. --readouts D,J0,depth)")
        self._tuned = None

    @property
    def profiles(self):
        return PROFILES

    def run_name(self, profile, seed: int) -> str:
        return run_name(profile.name, seed, self.sample)

    def stratum(self, record) -> str:
        return record.family

    def prepare(self, lm, panel, records, profile) -> dict:
        self.panel_name = panel.name
        self.profile = profile
        if getattr(lm, "served", False):
            return self._prepare_served(lm, records, profile)
        self.groups = parse_readouts(self.readouts, lm.facts.chat_template_sha256 is not None)
        letters = lm.letters("ABCDE"[: max(len(s.options) for s in records)])
        extra = {}
        if self.lens is not None:
            from readouts.lens import load_for_run

            self._tuned, extra["tuned_lens"] = load_for_run(self.lens, lm)
        return {"letters": letters, "readouts": list(self.groups), "sample": self.sample, **extra}

    def _prepare_served(self, lm, records, profile) -> dict:
        """A served chat model: the chat groups only, exact first-token probabilities (no --sample)."""
        from engine.served import READ_FORMS
        from readouts.gap.served import SERVED_GROUPS

        if self.lens is not None:
            raise ReadoutError("--lens: a served model exposes no residual stream to read through a lens")
        if self.sample:
            raise ReadoutError("--sample: not available on a served model (its first-token readouts are read from top-k logprobs)")
        chosen = parse_readouts(self.readouts, True) if self.readouts else SERVED_GROUPS
        bad = [g for g in chosen if g not in SERVED_GROUPS]
        if bad:
            raise ReadoutError(f"--readouts: {','.join(bad)} not available on a served model (raw frames need no chat "
                               f"template); choose among {','.join(SERVED_GROUPS)}")
        self.groups = tuple(chosen)
        letters = "ABCDE"[: max(len(s.options) for s in records)]
        generation = {"rollout 0": {"temperature": 0.0, "top_p": 1.0},
                      "rollouts 1..n": {"temperature": profile.temperature, "top_p": profile.top_p},
                      "max_tokens": "the readout's budget (profile)", "seed": "derive_seed(run seed, scenario, cell, readout, frame, rollout)"}
        return {"letters": {L: [f.format(L=L) for f in READ_FORMS] for L in letters}, "readouts": list(self.groups),
                "sample": False, "served_requests": {"generation": generation,
                                                     "reads": {**lm.read_params(), "assistant_prefill": "the text up to the anchor"}}}

    def check_lengths(self, lm, records, profile) -> None:
        """Every frame of every cell read, with the tokens it may generate, fits the model's context (a served
        model's server checks its own)."""
        if getattr(lm, "served", False) or lm.max_positions is None:
            return
        for s in records:
            for cell in cells_read(s, profile):
                for spec in (sp for sp in active_specs(self.groups, profile) if sp.reads_cell(cell)):
                    extra = 0 if spec.budget is None else getattr(profile, spec.budget) + ANCHOR_ALLOWANCE
                    for frame in spec.frames:
                        prompt = prompt_of(render(s, frame, cell, version=profile.frames))
                        n = len(encode_prompt(lm.tokenizer, prompt)) + extra
                        lm.check_fits(n, f"{s.source}: context ({frame}, {cell})")

    def workload(self, tokenizer, chunks, profile, seed: int, bounds, layers: int | None = None):
        """The run's workload per stage without a model (`--plan`; readouts/gap/plan.py); decoding batches as
        `generate` forms them under `bounds` (engine.generation.BatchBounds); a depth run's patching forwards for a
        model of `layers` decoder layers (none counted without it)."""
        from readouts.gap.plan import gap_workload

        groups = parse_readouts(self.readouts, getattr(tokenizer, "chat_template", None) is not None)
        return gap_workload(tokenizer, chunks, profile, groups, seed, bounds, layers if wants_depth(self.readouts) else None)

    def work(self, chunk, profile, seed: int, layers: int | None) -> int:
        reads = sum(reads_per_scenario(r, profile, self.groups) for r in chunk)
        agent = next((specs[0] for name, specs in stages(self.groups, profile) if name == "D"), None)
        if layers is None or agent is None or not wants_depth(self.readouts):
            return reads
        from readouts.gap.plan import depth_forwards

        return reads + depth_forwards(chunk, agent, profile, seed, layers)

    def runner(self, lm, profile, seed, options, bar, generate=None):
        if getattr(lm, "served", False):
            from readouts.gap.served import ServedGapRunner

            return ServedGapRunner(lm, profile, self.groups, seed, self.panel_name, options.model.model, progress=bar)
        return self.runner_type(lm, profile, self.groups, seed, self.sample, self.panel_name,
                         options.model.model, progress=bar, token_budget=options.model.token_budget,
                         depth=wants_depth(self.readouts), lens=self._tuned, generate=generate)

    def summary(self, tables) -> list[str]:
        note = not_paper_note(self.profile, PROFILES["paper"], PAPER_FIELDS) if self.profile is not None else None
        return ([note] if note else []) + summary_lines(tables[1])


def summary_lines(df: pd.DataFrame) -> list[str]:
    """p_D, p_J, their twins, g and the raw (unscreened) paired excess, per family."""
    d = df[(df.readout == "D") & (df.frame == "agent")]
    j = df[(df.readout == "J") & (df.frame == "judge")]
    if d.empty or j.empty:
        return ["summary: needs the D and J readouts (run with --readouts including D,J)"]
    key = ["scenario_id", "family", "cell"]
    m = d[key + ["p_violating"]].merge(j[key + ["p_violating"]], on=key, suffixes=("_D", "_J"))
    m["g"] = m.p_violating_D - m.p_violating_J
    wide = m.pivot_table(index=["scenario_id", "family"], columns="cell", values=["p_violating_D", "p_violating_J", "g"],
                         dropna=False)  # a served run can hold all-NaN columns (letters outside the top k)
    columns = {"p_D": ("p_violating_D", "primary"), "p_J": ("p_violating_J", "primary"),
               "p_D(twin)": ("p_violating_D", "twin"), "p_J(twin)": ("p_violating_J", "twin"),
               "g": ("g", "primary"), "g(twin)": ("g", "twin")}
    rows = []
    for fam, w in list(wide.groupby(level="family")) + [("all", wide)]:
        row = {"family": fam, "n": len(w)}
        row.update({name: w[col].mean() if col in w.columns else math.nan for name, col in columns.items()})
        paired = ("g", "primary") in w.columns and ("g", "twin") in w.columns
        row["E(raw, unscreened)"] = (w[("g", "primary")] - w[("g", "twin")]).mean() if paired else math.nan
        rows.append(row)
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}", na_rep="nan")
    return table.splitlines()
