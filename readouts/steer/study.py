"""`readout steer` as the run driver sees it: the profile's selection is split three ways (readouts.steer.split);
the selection and test parts are the run's records, the directions are computed from the direction part when the
model loads (`prepare`), and each chunk reads D, J0 and control (every cell each reads) unsteered and under the
grid's conditions: each layer x strength x the direction and its label-shuffled null on both parts, and the random
nulls on the test part only (the selection rule reads the direction's own checks; the random band is the verdict's).
The manifest records the direction, layers, strengths, positions, random seeds, the split, the seed and the verdict's
rules with the selection rule (identity: a resume must match them all); the chunk holding the first read scenario
also measures the capability text's loss under every condition (readouts/steer/capability.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from contract.names import (
    FILE_DIRECTION,
    RANDOM_DIRECTION,
    SHUFFLED_DIRECTION,
    STEER_DIRECTIONS,
    STEER_PARTS,
    STEER_READOUTS,
    UNSTEERED,
)
from contract.readouts import readout
from contract.tables import STEER_CAPABILITY, STEERING
from engine.errors import ReadoutError
from engine.residuals import n_depths
from engine.steering import POSITIONS, Steering, score_steered
from readouts.gap.profile import PROFILES
from readouts.gap.recipe import GapRunner, reads_per_scenario
from readouts.gap.study import GapStudy
from readouts.manifest import file_sha256
from readouts.steer.capability import capability_losses
from readouts.steer.directions import (
    CAPABILITY_TEXT,
    contrast_parts,
    load_vector_file,
    random_direction,
    residual_norms,
    shuffled_direction,
    unbalanced_orders,
)
from readouts.steer.split import split_parts
from stats.steer.rules import Rules

SELECTION, TEST = STEER_PARTS[1], STEER_PARTS[2]


@dataclass(frozen=True)
class SteerSettings:
    """What a steering grid is asked to do (recorded in the manifest; all of it is identity)."""

    direction: str = "pressure"
    """One of contract.names.STEER_DIRECTIONS, or a .npy vector file."""
    layers: tuple[int, ...] = ()
    """Depths steered (0..L; depth i: after decoder layer i)."""
    strengths: tuple[float, ...] = (-2.0, -1.0, -0.5, 0.5, 1.0)
    """What the direction is multiplied by, at each layer."""
    positions: str = "all"
    """engine.steering.POSITIONS: every position, or the read position only."""
    random: int = 100
    """Random null directions (seeds 0..random-1) of the direction's norm at each layer and strength (test part)."""
    fractions: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    """Shares of the selection in the direction, selection and test parts."""
    shuffled: bool = True
    """Also read the label-shuffled null (a computed direction only)."""
    rules: Rules = field(default_factory=Rules)
    """The verdict's threshold, margin and levels (recorded before the run)."""

    def check(self) -> None:
        if self.positions not in POSITIONS:
            raise ReadoutError(f"--positions: '{self.positions}' is not one of {', '.join(POSITIONS)}")
        if not self.layers:
            raise ReadoutError("--layers: give at least one layer, e.g. --layers 28,29")
        if not self.strengths or any(not math.isfinite(s) for s in self.strengths):
            raise ReadoutError(f"--strengths: want finite numbers, e.g. -2,-1,1, got {list(self.strengths)}")
        if self.random < 0:
            raise ReadoutError(f"--random: must be >= 0, got {self.random}")
        if len(self.fractions) != 3 or any(not (f > 0 and math.isfinite(f)) for f in self.fractions):
            raise ReadoutError(f"--fractions: want three positive shares (direction, selection, test), got {list(self.fractions)}")
        if not (0 < self.rules.threshold and math.isfinite(self.rules.threshold)):
            raise ReadoutError(f"--threshold: must be a positive ratio, got {self.rules.threshold}")
        if not 0 < self.rules.margin < 1:
            raise ReadoutError(f"--margin: must be in (0, 1), got {self.rules.margin}")


@dataclass(frozen=True)
class Condition:
    """One steering condition of the grid (the unsteered read: direction `none`)."""

    direction: str
    seed: int | None
    layer: int | None
    strength: float
    vector: torch.Tensor | None = field(default=None, compare=False, repr=False)
    parts: tuple[str, ...] = (SELECTION, TEST)
    """The parts whose scenarios are read under it."""

    def steering(self, positions: str) -> Steering | None:
        return None if self.vector is None else Steering(self.layer, self.vector, self.strength, positions)

    def key(self, model: str, positions: str) -> dict:
        return dict(model=model, direction=self.direction, direction_seed=self.seed, layer=self.layer,
                    strength=float(self.strength), positions=positions)


@dataclass
class SteerStudy(GapStudy):
    """The steering grid on the judgment-action panel's first-token readouts."""

    settings: SteerSettings = field(default_factory=SteerSettings)
    kind: str = "steering"
    tables: tuple[str, ...] = (STEERING.name, STEER_CAPABILITY.name)
    stats_command: str = "readout stats"
    train: list = field(default_factory=list)
    held: list = field(default_factory=list)
    part_of: dict = field(default_factory=dict)
    norms: dict = field(default_factory=dict)
    conditions: list = field(default_factory=list)
    _seed: int = 0

    def __post_init__(self):
        self.readouts = ",".join(STEER_READOUTS)
        self.settings.check()

    @property
    def profiles(self):
        return PROFILES

    def run_name(self, profile, seed: int) -> str:
        return f"steer-{profile.name}-seed{seed}"

    def split(self, records, seed: int) -> list:
        """The selection and test parts' records (read by the run); the direction part is kept for `prepare`."""
        self._seed = seed
        self.train, selection, test = split_parts(records, seed, self.stratum, self.settings.fractions)
        if not self.train or not selection or not test:
            raise ReadoutError(f"--limit/--profile: {len(records)} records cannot be split into a direction, a selection "
                               "and a test part (need at least three)")
        self.part_of = {**{r.id: SELECTION for r in selection}, **{r.id: TEST for r in test}}
        self.held = [r for r in records if r.id in self.part_of]
        return self.held

    def prepare(self, lm, panel, records, profile) -> dict:
        extra = super().prepare(lm, panel, records, profile)
        st, depths = self.settings, n_depths(lm.model)
        bad = [d for d in st.layers if not 0 <= d < depths]
        if bad:
            raise ReadoutError(f"--layers: {bad[0]} is not a depth of this model (0..{depths - 1}; i: after layer i)")
        shuffled = None
        if st.direction in STEER_DIRECTIONS:
            name, source = st.direction, {"computed_from": "direction part"}
            diffs, pair_ids, res_norms = contrast_parts(lm, self.train, st.direction, profile, self._seed)
            vectors = diffs.mean(0)
            if st.shuffled:
                shuffled = shuffled_direction(diffs, pair_ids, self._seed, vectors.norm(dim=-1))
        else:
            vectors = load_vector_file(st.direction, lm.model)
            name, source = FILE_DIRECTION, {"file": st.direction, "sha256": file_sha256(st.direction)}
            res_norms = residual_norms(lm, self.train, profile, self._seed)
        self.conditions = conditions(name, vectors, st, lm.model.config.hidden_size, self._seed, shuffled)
        parts = {p: [r.id for r in self.held if self.part_of[r.id] == p] for p in (SELECTION, TEST)}
        steering = {"direction": name, **source, "layers": list(st.layers), "strengths": list(st.strengths),
                    "positions": st.positions, "random_seeds": list(range(st.random)), "random_parts": [TEST],
                    "shuffled": shuffled is not None, "fractions": list(st.fractions), "split_seed": self._seed,
                    "train": [r.id for r in self.train], "selection": parts[SELECTION], "test": parts[TEST],
                    "held_out": [r.id for r in self.held], "rules": st.rules.as_dict(),
                    "capability_text": CAPABILITY_TEXT.name}
        norms = {str(d): round(float(vectors[d].norm()), 6) for d in st.layers}
        residual = {str(d): round(float(res_norms[d]), 6) for d in st.layers}
        self.norms = {"direction": norms, "residual": residual}
        out = {**extra, "steering": steering, "steering_norms": norms, "steering_residual_norms": residual}
        if st.direction in STEER_DIRECTIONS:
            unbalanced = unbalanced_orders(self.train, profile, self._seed)
            out["steering_unbalanced_orders"] = unbalanced
            if unbalanced:
                out["warnings"] = [
                    f"--direction {name}: D's {profile.orders['D']} option orders put some options at some letters "
                    f"more often than others in {len(unbalanced)} of {len(self.train)} training scenarios "
                    f"({', '.join(unbalanced[:5])}{', ...' if len(unbalanced) > 5 else ''}), so the direction also "
                    "carries letter position; orders.D a multiple of every scenario's option count balances them "
                    "(e.g. --set orders.D=6)"]
        return out

    def work(self, chunk, profile, seed: int, layers: int | None) -> int:
        return sum(reads_per_scenario(r, profile, self.groups)
                   * max(1, sum(self.part_of.get(r.id, TEST) in c.parts for c in self.conditions)) for r in chunk)

    def workload(self, tokenizer, chunks, profile, seed: int, bounds, layers: int | None = None):
        """The grid's workload per stage without a model (`--plan`; readouts/steer/plan.py)."""
        from readouts.steer.plan import steer_workload

        base = super().workload(tokenizer, chunks, profile, seed, bounds, layers)
        parts = {}
        for p in (SELECTION, TEST):
            mine = [kept for w in chunks if (kept := [r for r in w if self.part_of.get(r.id) == p])]
            parts[p] = super().workload(tokenizer, mine, profile, seed, bounds, layers) if mine else []
        return steer_workload(tokenizer, self, base, parts, profile, seed)

    def runner(self, lm, profile, seed, options, bar, generate=None):
        if generate is not None:
            raise ReadoutError("--generator: a steered run generates under its interventions, with the own decoder")
        return self.runner_type(lm, profile, seed, self, options.model.model, bar, options.model.token_budget)

    def summary(self, tables) -> list[str]:
        from readouts.steer.summary import summary_lines

        return summary_lines(tables[0], tables[1], self.settings.rules, self.norms)


def conditions(name: str, vectors: torch.Tensor, st: SteerSettings, hidden: int, seed: int,
               shuffled: torch.Tensor | None = None) -> list[Condition]:
    """The unsteered condition, then per layer and strength the direction, its label-shuffled null (both parts) and
    its random nulls (the test part)."""
    out = [Condition(UNSTEERED, None, None, 0.0)]
    for d in st.layers:
        norm = float(vectors[d].norm())
        for s in st.strengths:
            out.append(Condition(name, None, d, s, vectors[d]))
            if shuffled is not None:
                out.append(Condition(SHUFFLED_DIRECTION, None, d, s, shuffled[d]))
            out += [Condition(RANDOM_DIRECTION, k, d, s, random_direction(norm, hidden, seed, k, d), (TEST,))
                    for k in range(st.random)]
    return out


class SteerRunner:
    """One chunk of held-out scenarios: every first-token read under every condition, and (in the chunk holding the
    first held-out scenario) the capability text's loss under every condition."""

    def __init__(self, lm, profile, seed, study: SteerStudy, model_name: str, bar=None, token_budget=None):
        self.lm, self.profile, self.study, self.model_name, self.bar = lm, profile, study, model_name, bar
        self.token_budget = token_budget
        self.plan = GapRunner(lm, profile, study.groups, seed, False, study.panel_name, model_name)
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def run(self, scenarios) -> tuple[list[dict], list[dict]]:
        import time

        positions = self.study.settings.positions
        reads = [rd for name in STEER_READOUTS for rd in self.plan._first_token_reads(scenarios, readout(name))]
        letters = [self.lm.letters(rd.rendered.letters) for rd in reads]
        part = [self.study.part_of.get(rd.scenario.id, TEST) for rd in reads]
        # One call for the whole grid: read-position steerings share one prefix tree with the unsteered reads (each
        # steered read runs its last token only); all-position steerings get a tree each (engine/steering.py).
        t0 = time.perf_counter()
        pairs = [(c, i) for c in self.study.conditions for i in range(len(reads)) if part[i] in c.parts]
        steer = [c.steering(positions) for c, _ in pairs]
        # The grid is one call: its own bar (engine/scoring.py) moves while it runs; the run's bar after it.
        shown = self.bar is not None and not self.bar.disable
        out = score_steered(self.lm.model, [reads[i].ids for _, i in pairs], [letters[i] for _, i in pairs], steer,
                            temperature=self.profile.temperature, pad_id=self.lm.pad_id, token_budget=self.token_budget,
                            progress=shown)
        rows = [read_row(c.key(self.model_name, positions), reads[i], res, part[i]) for (c, i), res in zip(pairs, out)]
        self.timings["grid"] = self.timings.get("grid", 0.0) + time.perf_counter() - t0
        self.counts["grid"] = self.counts.get("grid", 0) + len(steer)
        if self.bar is not None:
            self.bar.update(len(steer))
        capability = []
        if scenarios and scenarios[0].id == self.study.held[0].id:
            t0 = time.perf_counter()
            conds = self.study.conditions
            losses = capability_losses(self.lm, [c.steering(positions) for c in conds], positions, progress=shown)
            for c, (loss, n) in zip(conds, losses):
                capability.append(dict(**c.key(self.model_name, positions), loss=loss, tokens=n))
            self.timings["capability"] = self.timings.get("capability", 0.0) + time.perf_counter() - t0
            self.counts["capability"] = self.counts.get("capability", 0) + len(conds)
        return rows, capability


SteerStudy.runner_type = SteerRunner  # the steering grid reads one chunk at a time (no run_window)


def read_row(key: dict, rd, res, part: str) -> dict:
    r = rd.rendered
    total = sum(res.mass)
    v = res.mass[r.letters.index(r.violating_letter)]
    return dict(**key, scenario_id=rd.scenario.id, family=rd.scenario.family, cell=rd.cell, readout=rd.spec.name,
                order_index=rd.order_index, letters="".join(r.letters), violating_letter=r.violating_letter,
                mass=list(res.mass), letter_mass=res.letter_mass, p_violating=v / total if total > 0 else math.nan,
                part=part)
