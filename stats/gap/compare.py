"""The gap paper's analyses across run directories, as data (`stats.gap.compare_report` writes them).

Owns: each run's role (lineage and stage: base, sft, dpo, final, or any checkpoint along a lineage, ordered
by the step its name carries, rl-200, step-1000, step_1000, or by a given order), the checkpoint sweep (one
lineage's stages paired on shared scenarios, Figure 6, any number of them), the three-cell contrast (base vs instruct
in the raw frame, Tables 6 and 15-17, Figure 9), the chat-vs-raw bridge for each instruct model, and the
cross-recipe table (Table 7: per model the unscreened excess, the own-screen excess with n and
detection bar, the same minus the selection-matched null, and the known-gap control; Figure 7).

Roles come from each run's manifest (`model.lineage`, `model.stage`, `model.base_lineage`), which the
run copies from the model registry (engine/data/models.toml): the registry, not this module, says that
Tulu 3 is post-trained from Llama-3.1-8B's base weights. A `roles` mapping (run directory or model name ->
"lineage:stage") overrides the manifest; a run with neither is its own lineage's final model. An `order`
(stage names) orders the stages it lists; every non-base stage of a lineage is listed in it, or none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from contract.names import STAGES, stage_step
from stats.core.bootstrap import estimates_from
from stats.core.errors import CompareError
from stats.core.estimate import Estimate
from stats.core.seeding import rng_for
from stats.gap import raw
from stats.gap.analysis import RunAnalysis
from stats.gap.control import passes_bar
from stats.gap.names import CHAT, PRIMARY, TWIN
from stats.gap.screen import above_floor, gate_mask

ALL_PAIRS_UP_TO = 4
"""A sweep of up to this many stages reports the step between every pair of them; a longer one the steps
between neighbours and the last minus the first (n(n-1)/2 pairs would swamp the table)."""
_RANK = {"sft": 1, "dpo": 2, "final": 4}


def stage_key(stage: str, order: Sequence[str] = ()) -> tuple:
    """Where a stage sorts in its lineage: base first; the stages listed in `order` in that order; otherwise
    sft, dpo, the stages that carry a step (rl-10, step-1000, step_1000 ...) by step, then final."""
    if stage == "base":
        return (0, 0, "")
    if stage in order:
        return (1, list(order).index(stage), "")
    if stage in _RANK:
        return (_RANK[stage], 0, "")
    step = stage_step(stage)
    if step is None:
        raise CompareError(f"roles: stage {stage!r} is not one of {', '.join(STAGES)}, carries no step (rl-200, "
                           f"step-1000) and is not in the given order (--order)")
    return (3, step, stage)


@dataclass(frozen=True)
class Role:
    """Where a run sits: which post-training lineage, which stage."""

    lineage: str
    stage: str
    """base, sft, dpo, rl-<step> or final."""
    base_lineage: str | None = None
    """The lineage whose base model is this one's base, when another one."""


@dataclass(frozen=True)
class RecipeRow:
    """One row of the cross-recipe table (Table 7)."""

    model: str
    lineage: str
    stage: str
    base_raw_E: Estimate | None
    """The lineage's base model, raw frame, all above-floor scenarios (descriptive)."""
    E_unscreened: Estimate | None
    """Excess under the model's own template on all above-floor scenarios (no screen)."""
    E_own_screen: Estimate | None
    """Excess on the model's own screened scenarios (L0); its mde is the per-model detection bar."""
    E_minus_selection_null: Estimate | None
    control: Estimate | None
    control_passes: bool | None
    """The control's 95% lower bound clears the validation bar (None: no control run)."""


def role_of(manifest: Mapping, model: str, path: Path, roles: Mapping[str, str] | None,
            order: Sequence[str] = ()) -> Role:
    """A run's role: from `roles` (by run directory, its name, or the model), else from its manifest."""
    for key in (str(path), path.name, model):
        if roles and key in roles:
            lineage, _, stage = str(roles[key]).partition(":")
            stage_key(stage, order)
            return Role(lineage, stage)
    facts = manifest.get("model") if isinstance(manifest.get("model"), Mapping) else {}
    if facts.get("lineage") and facts.get("stage"):
        stage_key(facts["stage"], order)
        return Role(facts["lineage"], facts["stage"], facts.get("base_lineage"))
    return Role(model, "final")


@dataclass(frozen=True)
class Sweep:
    """One lineage's checkpoint sweep (Figure 6)."""

    lineage: str
    stages: tuple[str, ...]
    """The lineage's stages present besides the base (sft, dpo, final, rl-200, step-1000 ...), in order."""
    estimates: tuple[Estimate, ...]
    rows: tuple[dict, ...]
    """Per stage (and the base in the raw frame): the estimates the figure draws."""
    final: RunAnalysis | None
    """The final run, else the last stage's (panel b of the figure: control and excess)."""


@dataclass(frozen=True)
class ThreeCell:
    """Base vs instruct in the raw frame on their shared scenarios (Tables 6, 15-17; Figure 9)."""

    lineage: str
    base: RunAnalysis
    instruct: RunAnalysis
    estimates: tuple[Estimate, ...]


@dataclass(frozen=True)
class Comparison:
    """Everything computed across the runs."""

    analyses: tuple[RunAnalysis, ...]
    roles: tuple[Role, ...]
    """Each analysis's role, in the same order."""
    recipe: tuple[RecipeRow, ...]
    sweeps: tuple[Sweep, ...]
    three_cells: tuple[ThreeCell, ...]
    bridges: tuple[tuple[str, tuple[Estimate, ...]], ...]
    """(model, its bridge estimates) per instruct model read both under its template and raw."""
    skipped: tuple[str, ...]
    """The cross-run analyses the runs do not allow, each with why."""

    @property
    def estimates(self) -> list[Estimate]:
        """The sweeps', three-cell contrasts' and bridges' estimates (bridge subsets prefixed by the model)."""
        out = [e for sw in self.sweeps for e in sw.estimates] + [e for t in self.three_cells for e in t.estimates]
        return out + [replace(x, subset=f"{m}: {x.subset}") for m, e in self.bridges for x in e]


def compare(analyses: Sequence[RunAnalysis], seed: int, n_boot: int, floor: float, gate: tuple[str, ...],
            roles: Mapping[str, str] | None = None, order: Sequence[str] = ()) -> Comparison:
    """The cross-recipe table, checkpoint sweeps, three-cell contrasts and bridges the runs allow; `order`
    orders the stages it lists (else by name: sft, dpo, steps, final)."""
    order = tuple(order)
    role = {id(a): role_of(a.run.manifest, a.model, a.run.path, roles, order) for a in analyses}
    _check_order(role.values(), order)
    base_lineages = {r.lineage: r.base_lineage for r in role.values() if r.base_lineage}
    chat = [a for a in analyses if raw.has_frame(a.run, "chat")]
    with_raw = [a for a in analyses if raw.has_frame(a.run, "raw")]

    def base_of(lineage: str) -> RunAnalysis | None:
        return next((a for a in with_raw if role[id(a)].stage == "base"
                     and role[id(a)].lineage in (lineage, base_lineages.get(lineage, lineage))), None)

    recipe = _recipe(chat, role, base_of, order)
    sweeps = _sweeps(chat, role, base_of, floor, gate, seed, n_boot, order)
    three = _three_cells(with_raw, role, base_of, floor, gate, seed, n_boot)
    bridges = _bridges(chat, with_raw, floor, gate, seed, n_boot)
    skipped = [why for done, why in (
        (recipe, "cross-recipe table: no run has D and J on primary and twin"),
        (sweeps, "checkpoint sweep: needs two or more of a lineage's stages besides the base (sft, dpo, final, "
                 "rl-200, step-1000 ...) with D and J"),
        (three, "three-cell contrast: needs a base run and its lineage's final instruct run, both with raw_D "
                "and raw_J"),
        (bridges, "bridge: no instruct model was read both under its template (D, J) and raw (raw_D, raw_J)"))
        if not done]
    return Comparison(tuple(analyses), tuple(role[id(a)] for a in analyses), tuple(recipe), tuple(sweeps),
                      tuple(three), tuple(bridges), tuple(skipped))


def _check_order(roles, order: tuple[str, ...]) -> None:
    """An order lists every non-base stage of a lineage or none of them (a partial one would leave the rest
    without a place)."""
    by_lineage: dict[str, set[str]] = defaultdict(set)
    for r in roles:
        if r.stage != "base":
            by_lineage[r.lineage].add(r.stage)
    for lineage, stages in sorted(by_lineage.items()):
        listed = stages & set(order)
        if listed and listed != stages:
            raise CompareError(f"--order: lineage {lineage}: {', '.join(sorted(stages - listed))} not listed while "
                               f"{', '.join(sorted(listed))} are; list every stage of a lineage, or none")


def _recipe(chat, role, base_of, order) -> list[RecipeRow]:
    """The cross-recipe table (Table 7): each chat model, by lineage and stage."""
    rows = []
    for a in sorted(chat, key=lambda a: (role[id(a)].lineage, stage_key(role[id(a)].stage, order))):
        r = role[id(a)]
        base = base_of(r.lineage)
        ctl = a.get("control", "control_move")
        rows.append(RecipeRow(
            model=a.model, lineage=r.lineage, stage=r.stage,
            base_raw_E=base.get("raw", "E") if base is not None else None,
            E_unscreened=a.get("continuous", "E", "all above floor"), E_own_screen=a.get("continuous", "E", "L0"),
            E_minus_selection_null=a.get("selection", "E_minus_selection_null"), control=ctl,
            control_passes=passes_bar(ctl) if ctl is not None else None))
    return rows


def _sweeps(chat, role, base_of, floor, gate, seed, n_boot, order) -> list[Sweep]:
    by_lineage: dict[str, dict[str, RunAnalysis]] = defaultdict(dict)
    for a in chat:
        by_lineage[role[id(a)].lineage].setdefault(role[id(a)].stage, a)
    out = []
    for lineage, stages in sorted(by_lineage.items()):
        present = sorted((s for s in stages if s != "base"), key=lambda s: stage_key(s, order))
        if len(present) < 2:
            continue
        ests, rows = _sweep(lineage, [stages[s] for s in present], present, base_of(lineage), floor, gate, seed, n_boot)
        # the last checkpoint stands for the final one when the lineage has none (its screen is the sweep's too)
        out.append(Sweep(lineage, tuple(present), tuple(ests), tuple(rows), stages.get("final", stages[present[-1]])))
    return out


def _three_cells(with_raw, role, base_of, floor, gate, seed, n_boot) -> list[ThreeCell]:
    """Each final instruct model with a raw frame against its lineage's base."""
    out = []
    for a in with_raw:
        r = role[id(a)]
        base = base_of(r.lineage) if r.stage == "final" else None
        if base is not None:
            ests = raw.three_cell(base.run, a.run, floor, rng_for(seed, f"three-cell/{r.lineage}"), n_boot, gate)
            out.append(ThreeCell(r.lineage, base, a, tuple(ests)))
    return out


def _bridges(chat, with_raw, floor, gate, seed, n_boot) -> list[tuple[str, tuple[Estimate, ...]]]:
    """Each instruct model under its template and in the raw frame: from its own run, or a raw run of it."""
    bridges = []
    for a in chat:
        if raw.has_frame(a.run, "raw"):
            bridges.append((a.model, tuple(a.select("bridge"))))
        else:
            partner = next((b for b in with_raw if b.model == a.model and b is not a), None)
            if partner is not None:
                bridges.append((a.model, tuple(raw.bridge(a.run, partner.run, floor, rng_for(seed, f"bridge/{a.model}"),
                                                          n_boot, mask=gate_mask(a.run, gate)))))
    return [(m, e) for m, e in bridges if e]


def _sweep(lineage: str, runs: list[RunAnalysis], stages: list[str], base: RunAnalysis | None, floor: float,
           gate: tuple[str, ...], seed: int, n_boot: int) -> tuple[list[Estimate], list[dict]]:
    """E per stage and the paired steps between stages on shared scenarios: all above floor in every
    stage ('unscreened', the paper's scenarios screened by no model), and the final model's screened set."""
    ids = runs[0].run.ids
    for a in runs[1:]:
        ids = np.intersect1d(ids, a.run.ids)
    cols, ok = {}, np.ones(len(ids), dtype=bool)
    for s, a in zip(stages, runs):
        pos = a.run.meta.index.get_indexer(ids)
        p_d, p_j = raw.frame_values(a.run, "chat", PRIMARY, ids)
        p_dt, p_jt = raw.frame_values(a.run, "chat", TWIN, ids)
        cols[f"E {s}"] = (p_d - p_j) - (p_dt - p_jt)
        fl = above_floor(a.run, PRIMARY, CHAT, floor) & above_floor(a.run, TWIN, CHAT, floor)
        ok &= fl[pos] & gate_mask(a.run, gate)[pos] & ~np.isnan(cols[f"E {s}"])
    for i, j in _pairs(len(stages)):
        cols[f"{stages[j]} - {stages[i]}"] = cols[f"E {stages[j]}"] - cols[f"E {stages[i]}"]
    x = np.column_stack(list(cols.values()))
    ests = estimates_from("sweep", "unscreened", list(cols), x[ok], rng_for(seed, f"sweep/{lineage}"), n_boot)
    final = runs[stages.index("final")] if "final" in stages else runs[-1]
    l0 = final.per_scenario.set_index("scenario_id")["L0"] if "L0" in final.per_scenario else None
    if l0 is not None:
        screened = ok & l0.reindex(ids, fill_value=False).to_numpy(dtype=bool)
        ests += estimates_from("sweep", "final screen", list(cols), x[screened],
                               rng_for(seed, f"sweep-screened/{lineage}"), n_boot)
    ests = [replace(e, analysis=f"sweep {lineage}") for e in ests]
    rows = []
    if base is not None and base.get("raw", "E") is not None:
        rows.append({"stage": f"base ({base.model})", "base": base.get("raw", "E")})
    for s in stages:
        rows.append({"stage": s, "unscreened": find_estimate(ests, f"E {s}", "unscreened"),
                     "screened": find_estimate(ests, f"E {s}", "final screen")})
    return ests, rows


def _pairs(n: int) -> list[tuple[int, int]]:
    """The (earlier, later) stage pairs whose step a sweep reports (see ALL_PAIRS_UP_TO)."""
    if n <= ALL_PAIRS_UP_TO:
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    return [(i, i + 1) for i in range(n - 1)] + [(0, n - 1)]


def find_estimate(ests: Sequence[Estimate], quantity: str, subset: str) -> Estimate | None:
    """The estimate of `quantity` on `subset` among `ests` (None if there is none)."""
    return next((e for e in ests if e.quantity == quantity and e.subset == subset), None)
