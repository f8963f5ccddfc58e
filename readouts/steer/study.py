"""`readout steer` as the run driver sees it: the held-out half of the profile's selection is the run's records
(readouts.steer.split), the directions are computed from the other half when the model loads (`prepare`), and each
chunk reads D, J0 and control (every cell each reads) unsteered and under every steering condition of the grid:
each layer x strength x (the direction and its random nulls). The manifest records the direction, layers,
strengths, positions, random seeds, the split and the seed (identity: a resume must match them all); the chunk
holding the first held-out scenario also measures the capability text's loss under every condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from contract.names import FILE_DIRECTION, RANDOM_DIRECTION, STEER_DIRECTIONS, STEER_READOUTS, UNSTEERED
from contract.readouts import readout
from contract.tables import STEER_CAPABILITY, STEERING
from engine.errors import ReadoutError
from engine.render import Prompt, encode_prompt
from engine.residuals import n_depths
from engine.steering import POSITIONS, Steering, score_steered, token_loss
from readouts.gap.profile import PROFILES
from readouts.gap.recipe import GapRunner, reads_per_scenario
from readouts.gap.study import GapStudy
from readouts.manifest import file_sha256
from readouts.steer.directions import CAPABILITY_TEXT, contrast_direction, load_vector_file, random_direction, unbalanced_orders
from readouts.steer.split import split_records


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
    random: int = 3
    """Random null directions (seeds 0..random-1) of the direction's norm at each layer and strength."""
    train_fraction: float = 0.5
    """Share of each family's scenarios the directions are computed on (the rest are read)."""

    def check(self) -> None:
        if self.positions not in POSITIONS:
            raise ReadoutError(f"--positions: '{self.positions}' is not one of {', '.join(POSITIONS)}")
        if not self.layers:
            raise ReadoutError("--layers: give at least one layer, e.g. --layers 28,29")
        if not self.strengths or any(not math.isfinite(s) for s in self.strengths):
            raise ReadoutError(f"--strengths: want finite numbers, e.g. -2,-1,1, got {list(self.strengths)}")
        if self.random < 0:
            raise ReadoutError(f"--random: must be >= 0, got {self.random}")
        if not 0 < self.train_fraction < 1:
            raise ReadoutError(f"--train-fraction: must be in (0, 1), got {self.train_fraction}")


@dataclass(frozen=True)
class Condition:
    """One steering condition of the grid (the unsteered read: direction `none`)."""

    direction: str
    seed: int | None
    layer: int | None
    strength: float
    vector: torch.Tensor | None = field(default=None, compare=False, repr=False)

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
        """The held-out records (read by the run); the training records are kept for `prepare`."""
        self._seed = seed
        self.train, self.held = split_records(records, seed, self.stratum, self.settings.train_fraction)
        if not self.train or not self.held:
            raise ReadoutError(f"--limit/--profile: {len(records)} records cannot be split into a training and a "
                               "held-out part (need at least two in some family)")
        return self.held

    def prepare(self, lm, panel, records, profile) -> dict:
        extra = super().prepare(lm, panel, records, profile)
        st, depths = self.settings, n_depths(lm.model)
        bad = [d for d in st.layers if not 0 <= d < depths]
        if bad:
            raise ReadoutError(f"--layers: {bad[0]} is not a depth of this model (0..{depths - 1}; i: after layer i)")
        if st.direction in STEER_DIRECTIONS:
            name, source = st.direction, {"computed_from": "training split"}
            vectors = contrast_direction(lm, self.train, st.direction, profile, self._seed)
        else:
            vectors = load_vector_file(st.direction, lm.model)
            name, source = FILE_DIRECTION, {"file": st.direction, "sha256": file_sha256(st.direction)}
        self.conditions = conditions(name, vectors, st, lm.model.config.hidden_size, self._seed)
        steering = {"direction": name, **source, "layers": list(st.layers), "strengths": list(st.strengths),
                    "positions": st.positions, "random_seeds": list(range(st.random)),
                    "train_fraction": st.train_fraction, "split_seed": self._seed,
                    "train": [r.id for r in self.train], "held_out": [r.id for r in self.held],
                    "capability_text": CAPABILITY_TEXT.name}
        norms = {str(d): round(float(vectors[d].norm()), 6) for d in st.layers}
        out = {**extra, "steering": steering, "steering_norms": norms}
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

    def work(self, record, profile) -> int:
        return reads_per_scenario(record, profile, self.groups) * max(1, len(self.conditions))

    def workload(self, tokenizer, chunks, profile, seed: int, bounds):
        """The grid's workload per stage without a model (`--plan`; readouts/steer/plan.py)."""
        from readouts.steer.plan import steer_workload

        base = super().workload(tokenizer, chunks, profile, seed, bounds)
        return steer_workload(tokenizer, self, base, profile, seed)

    def runner(self, lm, profile, seed, options, bar):
        return self.runner_type(lm, profile, seed, self, options.model.model, bar, options.model.token_budget)

    def summary(self, tables) -> list[str]:
        from readouts.steer.summary import summary_lines

        return summary_lines(tables[0], tables[1])


def conditions(name: str, vectors: torch.Tensor, st: SteerSettings, hidden: int, seed: int) -> list[Condition]:
    """The unsteered condition, then per layer and strength the direction and its random nulls."""
    out = [Condition(UNSTEERED, None, None, 0.0)]
    for d in st.layers:
        norm = float(vectors[d].norm())
        for s in st.strengths:
            out.append(Condition(name, None, d, s, vectors[d]))
            out += [Condition(RANDOM_DIRECTION, k, d, s, random_direction(norm, hidden, seed, k, d)) for k in range(st.random)]
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
        # One call for the whole grid: read-position steerings share one prefix tree with the unsteered reads (each
        # steered read runs its last token only); all-position steerings get a tree each (engine/steering.py).
        t0 = time.perf_counter()
        conds = self.study.conditions
        steer = [c.steering(positions) for c in conds for _ in reads]
        # The grid is one call: its own bar (engine/scoring.py) moves while it runs; the run's bar after it.
        shown = self.bar is not None and not self.bar.disable
        out = score_steered(self.lm.model, [rd.ids for _ in conds for rd in reads], letters * len(conds), steer,
                            temperature=self.profile.temperature, pad_id=self.lm.pad_id, token_budget=self.token_budget,
                            progress=shown)
        rows = []
        for k, c in enumerate(conds):
            key = c.key(self.model_name, positions)
            rows += [read_row(key, rd, res) for rd, res in zip(reads, out[k * len(reads) : (k + 1) * len(reads)])]
        self.timings["grid"] = self.timings.get("grid", 0.0) + time.perf_counter() - t0
        self.counts["grid"] = self.counts.get("grid", 0) + len(steer)
        if self.bar is not None:
            self.bar.update(len(steer))
        capability = []
        if scenarios and scenarios[0].id == self.study.held[0].id:
            ids = encode_prompt(self.lm.tokenizer, Prompt(text=CAPABILITY_TEXT.read_text(encoding="utf-8")))
            for c in self.study.conditions:
                loss, n = token_loss(self.lm.model, ids, c.steering(positions))
                capability.append(dict(**c.key(self.model_name, positions), loss=loss, tokens=n))
        return rows, capability


SteerStudy.runner_type = SteerRunner  # the steering grid reads one chunk at a time (no run_window)


def read_row(key: dict, rd, res) -> dict:
    r = rd.rendered
    total = sum(res.mass)
    v = res.mass[r.letters.index(r.violating_letter)]
    return dict(**key, scenario_id=rd.scenario.id, family=rd.scenario.family, cell=rd.cell, readout=rd.spec.name,
                order_index=rd.order_index, letters="".join(r.letters), violating_letter=r.violating_letter,
                mass=list(res.mass), letter_mass=res.letter_mass, p_violating=v / total if total > 0 else math.nan)
