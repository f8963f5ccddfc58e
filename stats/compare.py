"""`readout compare RUN_DIR...`: the gap paper's analyses across run directories.

Owns: each run's role (lineage and post-training stage: base, sft, dpo, final), the checkpoint sweep
(one lineage's stages paired on shared scenarios, Figure 6), the three-cell contrast (base vs instruct
in the raw frame, Tables 6 and 15-17, Figure 9), the chat-vs-raw bridge for each instruct model, and the
cross-recipe table (Table 7: per model the unscreened excess, the own-screen excess with n and
detection bar, the same minus the selection-matched null, and the known-gap control; Figure 7).

Roles come from model names as the registry spells them: a `-sft`, `-dpo` or `-base` suffix names the
stage of the lineage the rest of the name gives; anything else is the final instruct model. Tulu 3 is
post-trained from Llama-3.1-8B's base weights, so its base is `llama-3.1-8b-base`. A `roles` mapping
(run directory or model name -> "lineage:stage") overrides the names.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from . import figures, raw
from .analysis import RunAnalysis, analyze
from .boot import Estimate, estimates_from, rng_for
from .control import VALIDATION_BAR, passes_bar
from .errors import CompareError
from .output import cell, md_table, num, rows_frame, write_csv
from .screen import DEFAULT_MASS_FLOOR, GATE_FAMILIES, above_floor, gate_mask
from .tables import load_run

STAGES = ("base", "sft", "dpo", "final")
STAGE_SUFFIXES = {"-sft": "sft", "-dpo": "dpo", "-base": "base"}
#: Lineages whose base weights are another lineage's base (Tulu 3 starts from Llama-3.1-8B).
SHARED_BASES = {"tulu-3-8b": "llama-3.1-8b"}


@dataclass(frozen=True)
class Role:
    """Where a run sits: which post-training lineage, which stage."""

    lineage: str
    stage: str
    """base, sft, dpo or final."""


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


def role_of(model: str, path: Path, roles: Mapping[str, str] | None) -> Role:
    for key in (str(path), path.name, model):
        if roles and key in roles:
            lineage, _, stage = str(roles[key]).partition(":")
            if stage not in STAGES:
                raise CompareError(f"roles: stage {stage!r} for {key!r} is not one of {', '.join(STAGES)}")
            return Role(lineage, stage)
    for suffix, stage in STAGE_SUFFIXES.items():
        if model.endswith(suffix):
            return Role(model[: -len(suffix)], stage)
    return Role(model, "final")


def _base_lineage(lineage: str) -> str:
    return SHARED_BASES.get(lineage, lineage)


def compare_runs(run_dirs: Sequence, out_dir, seed: int = 0, n_boot: int = 10_000, *,
                 mass_floor: float = DEFAULT_MASS_FLOOR, gate: Sequence[str] = GATE_FAMILIES,
                 roles: Mapping[str, str] | None = None) -> list[str]:
    """Analyse several run directories together; write tables, figures and compare_report.md to out_dir."""
    if not run_dirs:
        raise CompareError("compare: no run directories given")
    gate = tuple(gate)
    analyses = [analyze(load_run(d), seed=seed, n_boot=n_boot, floor=mass_floor, gate=gate) for d in run_dirs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # A rerun must not leave an earlier comparison's files behind beside the new report.
    for pattern in ("cross_recipe.csv", "compare_estimates.csv", "compare_report.md", "control_vs_excess.png",
                    "bridge.png", "checkpoint_sweep_*.png", "three_cell_*.png"):
        for old in out.glob(pattern):
            old.unlink()
    role = {id(a): role_of(a.model, a.run.path, roles) for a in analyses}
    chat = [a for a in analyses if raw.has_frame(a.run, "chat")]
    with_raw = [a for a in analyses if raw.has_frame(a.run, "raw")]
    lines: list[str] = [f"compare: {len(analyses)} runs: " + ", ".join(
        f"{a.model} ({role[id(a)].lineage}:{role[id(a)].stage})" for a in analyses)]
    skipped: list[str] = []
    panels = sorted({a.run.panel for a in analyses})
    if len(panels) > 1:
        lines.append(f"note: runs come from different panels ({', '.join(panels)}); pairs use shared scenario ids")

    def base_of(lineage: str) -> RunAnalysis | None:
        return next((a for a in with_raw if role[id(a)].stage == "base"
                     and role[id(a)].lineage in (lineage, _base_lineage(lineage))), None)

    # Cross-recipe table (Table 7) and Figure 7.
    recipe: list[RecipeRow] = []
    for a in sorted(chat, key=lambda a: (role[id(a)].lineage, STAGES.index(role[id(a)].stage))):
        r = role[id(a)]
        base = base_of(r.lineage)
        ctl = a.get("control", "control_move")
        recipe.append(RecipeRow(
            model=a.model, lineage=r.lineage, stage=r.stage,
            base_raw_E=base.get("raw", "E") if base is not None else None,
            E_unscreened=a.get("continuous", "E", "all above floor"), E_own_screen=a.get("continuous", "E", "L0"),
            E_minus_selection_null=a.get("selection", "E_minus_selection_null"), control=ctl,
            control_passes=passes_bar(ctl) if ctl is not None else None))
    tables: list[Path] = []
    figs: list[Path] = []
    sections: list[str] = []
    if recipe:
        df = pd.DataFrame([_recipe_record(r) for r in recipe])
        tables.append(write_csv(df, out / "cross_recipe.csv"))
        sections.append(_section("Cross-recipe table (Table 7)", md_table(
            ["model (lineage:stage)", "base, raw frame", "excess, own template (unscreened)",
             "own screen: excess (n; bar)", "minus selection null", "known-gap control"],
            [[f"{r.model} ({r.lineage}:{r.stage})", cell(r.base_raw_E), cell(r.E_unscreened),
              f"{cell(r.E_own_screen, n=False)} ({r.E_own_screen.n}; {num(r.E_own_screen.mde)})"
              if r.E_own_screen is not None else "–", cell(r.E_minus_selection_null),
              cell(r.control) + ({True: " passes", False: " FAILS", None: ""}[r.control_passes])] for r in recipe])
            + f"\n\nbar = per-model detection bar (MDE = 2.8 x bootstrap SE). Validation bar for the control: "
              f"95% lower bound >= {VALIDATION_BAR:.2f}."))
        figs.append(figures.control_vs_excess(
            [{"model": r.model, "control": r.control, "excess": r.E_unscreened, "screened": r.E_own_screen,
              "base": r.base_raw_E} for r in recipe], out / "control_vs_excess.png", VALIDATION_BAR))
        for r in recipe:
            lines.append(f"{r.model}: E unscreened {cell(r.E_unscreened)}; own screen {cell(r.E_own_screen)}"
                         f" (bar {num(r.E_own_screen.mde if r.E_own_screen else None, 3)}); "
                         f"minus selection null {cell(r.E_minus_selection_null)}; control {cell(r.control)}"
                         + {True: " passes", False: " FAILS the validation bar", None: ""}[r.control_passes])
    else:
        skipped.append("cross-recipe table: no run has D and J on primary and twin")

    compare_est: list[Estimate] = []
    # Checkpoint sweep (Figure 6).
    by_lineage: dict[str, dict[str, RunAnalysis]] = defaultdict(dict)
    for a in chat:
        by_lineage[role[id(a)].lineage].setdefault(role[id(a)].stage, a)
    swept = False
    for lineage, stages in sorted(by_lineage.items()):
        present = [s for s in ("sft", "dpo", "final") if s in stages]
        if len(present) < 2:
            continue
        swept = True
        ests, stage_rows = _sweep(lineage, [stages[s] for s in present], present, base_of(lineage), mass_floor, gate,
                                  seed, n_boot)
        compare_est += ests
        final = stages.get("final")
        figs.append(figures.checkpoint_sweep(
            lineage, stage_rows, final.get("control", "control_move") if final else None,
            final.get("continuous", "E", "all above floor") if final else None,
            out / f"checkpoint_sweep_{_slug(lineage)}.png", VALIDATION_BAR))
        sections.append(_section(f"Checkpoint sweep: {lineage} (Figure 6)", md_table(
            ["quantity", "shared, screened by no model", "final model's screened set"],
            [[q, cell(_find(ests, q, "unscreened")), cell(_find(ests, q, "final screen"))]
             for q in dict.fromkeys(e.quantity for e in ests)])
            + "\n\nStep rows are paired differences between stages on the same scenarios; their MDE is the step "
              "detection bar: " + "; ".join(f"{e.quantity}: {num(e.mde)}" for e in ests
                                             if " - " in e.quantity and e.subset == "unscreened")))
        steps = [e for e in ests if " - " in e.quantity and e.subset == "unscreened"]
        lines.append(f"sweep {lineage}: " + "; ".join(f"E {s} {cell(_find(ests, f'E {s}', 'unscreened'))}"
                                                     for s in present)
                     + "; steps " + "; ".join(f"{e.quantity} {cell(e)} (bar {num(e.mde)})" for e in steps))
    if not swept:
        skipped.append("checkpoint sweep: needs two or more of a lineage's sft / dpo / final runs with D and J")

    # Three-cell contrast (Tables 6, 15-17; Figure 9).
    three = False
    for a in with_raw:
        r = role[id(a)]
        if r.stage != "final":
            continue
        base = base_of(r.lineage)
        if base is None:
            continue
        three = True
        ests = raw.three_cell(base.run, a.run, mass_floor, rng_for(seed, f"three-cell/{r.lineage}"), n_boot, gate)
        compare_est += ests
        figs.append(figures.three_cell(f"{base.model} vs {a.model}", ests, out / f"three_cell_{_slug(r.lineage)}.png"))
        per_model = [("base", base.select("raw")), ("instruct", a.select("raw"))]
        t15 = md_table(["quantity", "set", f"base ({base.model})", f"instruct ({a.model})"],
                       [[e.quantity, e.subset, cell(e), cell(next((x for x in per_model[1][1] if x.quantity == e.quantity
                                                                   and x.subset == e.subset), None))]
                        for e in per_model[0][1]])
        t16 = md_table(["quantity", "set", "value", "MDE"], [[e.quantity, e.subset, cell(e), num(e.mde)] for e in ests])
        sections.append(_section(f"Three-cell contrast, raw frame: {base.model} vs {a.model} (Tables 6, 15-17)",
                                 "Each model on its own above-floor scenarios (Table 15):\n\n" + t15
                                 + "\n\nPaired on the shared scenarios, and slices of them (Tables 16-17):\n\n" + t16))
        d = _find(ests, "Delta_E (base - instruct)", "shared with twins")
        lines.append(f"three-cell {base.model} vs {a.model} (raw frame): Delta_E {cell(d)}; MDE {num(d.mde if d else None)}")
    if not three:
        skipped.append("three-cell contrast: needs a base run and its lineage's final instruct run, both with raw_D "
                       "and raw_J")

    # Bridge: each instruct model under its template and in the raw frame.
    bridges = []
    for a in chat:
        if raw.has_frame(a.run, "raw"):
            bridges.append((a.model, a.select("bridge")))
        else:
            partner = next((b for b in with_raw if b.model == a.model and b is not a), None)
            if partner is not None:
                bridges.append((a.model, raw.bridge(a.run, partner.run, mass_floor, rng_for(seed, f"bridge/{a.model}"),
                                                    n_boot, mask=gate_mask(a.run, gate))))
    bridges = [(m, e) for m, e in bridges if e]
    if bridges:
        for m, e in bridges:
            compare_est += [replace(x, subset=f"{m}: {x.subset}") for x in e]
        figs.append(figures.bridge(bridges, out / "bridge.png"))
        sections.append(_section("Chat-vs-raw bridge", md_table(
            ["model", "quantity", "value", "note"], [[m, x.quantity, cell(x), x.note or ""] for m, e in bridges for x in e])))
        for m, e in bridges:
            gt = {x.quantity: x for x in e}
            lines.append(f"bridge {m}: g_twin chat {cell(gt.get('g_twin (chat)'))} vs raw {cell(gt.get('g_twin (raw)'))}")
    else:
        skipped.append("bridge: no instruct model was read both under its template (D, J) and raw (raw_D, raw_J)")

    if compare_est:
        tables.append(write_csv(rows_frame(compare_est), out / "compare_estimates.csv"))
    for s in skipped:
        lines.append(f"skipped: {s}")
    report = [f"# Judgment-action gap across runs\n",
              f"Seed {seed}, {n_boot} bootstrap resamples, mass floor {mass_floor:g}, gate families {', '.join(gate)}. "
              "Values are `estimate [95% CI] (n)`, percentile bootstrap over scenarios, paired on shared scenarios.\n",
              _section("Headline", "\n".join(f"- {x}" for x in lines)),
              _section("Runs", md_table(["run", "model", "lineage", "stage", "panel", "scenarios", "readouts"],
                                        [[str(a.run.path), a.model, role[id(a)].lineage, role[id(a)].stage, a.run.panel,
                                          a.run.n, ", ".join(sorted(a.run.readouts()))] for a in analyses]))]
    report += sections
    if skipped:
        report.append(_section("Skipped", "\n".join(f"- {s}" for s in skipped)))
    report.append(_section("Files", "\n".join(f"- `{p.name}`" for p in tables + figs)))
    (out / "compare_report.md").write_text("\n".join(report))
    lines.append(f"wrote {len(tables)} tables, {len(figs)} figures and compare_report.md to {out}")
    return lines


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
        p_d, p_j = raw.frame_values(a.run, "chat", "primary", ids)
        p_dt, p_jt = raw.frame_values(a.run, "chat", "twin", ids)
        cols[f"E {s}"] = (p_d - p_j) - (p_dt - p_jt)
        fl = above_floor(a.run, "primary", ("D", "J"), floor) & above_floor(a.run, "twin", ("D", "J"), floor)
        ok &= fl[pos] & gate_mask(a.run, gate)[pos] & ~np.isnan(cols[f"E {s}"])
    for i in range(len(stages)):
        for j in range(i + 1, len(stages)):
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
        rows.append({"stage": s, "unscreened": _find(ests, f"E {s}", "unscreened"),
                     "screened": _find(ests, f"E {s}", "final screen")})
    return ests, rows


def _find(ests: Sequence[Estimate], quantity: str, subset: str) -> Estimate | None:
    return next((e for e in ests if e.quantity == quantity and e.subset == subset), None)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in s)


def _section(title: str, body: str) -> str:
    return f"## {title}\n\n{body}\n"


def _recipe_record(r: RecipeRow) -> dict:
    rec = {"model": r.model, "lineage": r.lineage, "stage": r.stage, "control_passes": r.control_passes}
    for name in ("base_raw_E", "E_unscreened", "E_own_screen", "E_minus_selection_null", "control"):
        e = getattr(r, name)
        rec.update({name: e.value if e else None, f"{name}_low": e.low if e else None,
                    f"{name}_high": e.high if e else None, f"{name}_n": e.n if e else None,
                    f"{name}_mde": e.mde if e else None})
    return rec
