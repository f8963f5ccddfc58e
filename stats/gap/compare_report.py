"""`readout compare RUN_DIR...`: the cross-run analyses of `stats.gap.compare` written as tables, figures
and compare_report.md.

Owns: `compare_runs` (the analysis's entry point), `compare_command` (the CLI's: its options parsed), the files
of the output folder (cross_recipe.csv, compare_estimates.csv, compare_report.md, the figures) and the headline
lines, with a warning per run whose scenarios the mass floor mostly removes (`stats.gap.report.floor_warnings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from stats.core.errors import CompareError
from stats.core.output import cell, md_section, md_table, num, rows_frame, write_csv
from stats.gap import figures
from stats.gap.analysis import analyze
from stats.gap.compare import Comparison, RecipeRow, compare, find_estimate
from stats.gap.control import VALIDATION_BAR
from stats.gap.report import floor_warnings
from stats.gap.screen import DEFAULT_MASS_FLOOR, GATE_FAMILIES
from stats.gap.tables import load_run

#: What a rerun removes first, so that no earlier comparison's file is left beside the new report.
OWN_FILES = ("cross_recipe.csv", "compare_estimates.csv", "compare_report.md", "control_vs_excess.png", "bridge.png",
             "checkpoint_sweep_*.png", "three_cell_*.png")


def compare_runs(run_dirs: Sequence, out_dir, seed: int = 0, n_boot: int = 10_000, *,
                 mass_floor: float = DEFAULT_MASS_FLOOR, gate: Sequence[str] = GATE_FAMILIES,
                 roles: Mapping[str, str] | None = None, order: Sequence[str] = ()) -> list[str]:
    """Analyse several run directories together; write tables, figures and compare_report.md to out_dir.
    `order`: stage names in the order a lineage's sweep plots them (else sft, dpo, steps by step, final)."""
    if not run_dirs:
        raise CompareError("compare: no run directories given")
    gate = tuple(gate)
    analyses = [analyze(load_run(d), seed=seed, n_boot=n_boot, floor=mass_floor, gate=gate) for d in run_dirs]
    c = compare(analyses, seed, n_boot, mass_floor, gate, roles, order)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for pattern in OWN_FILES:
        for old in out.glob(pattern):
            old.unlink()
    lines = [f"compare: {len(c.analyses)} runs: " + ", ".join(
        f"{a.model} ({r.lineage}:{r.stage})" for a, r in zip(c.analyses, c.roles)) + f"; mass floor {mass_floor:g}"]
    lines += [w for a, r in zip(c.analyses, c.roles) for w in floor_warnings(a, f"{a.model} ({r.lineage}:{r.stage})")]
    panels = sorted({a.run.panel for a in c.analyses})
    if len(panels) > 1:
        lines.append(f"note: runs come from different panels ({', '.join(panels)}); pairs use shared scenario ids")
    tables: list[Path] = []
    figs: list[Path] = []
    sections: list[str] = []
    for part in (_recipe_part, _sweep_part, _three_cell_part, _bridge_part):
        t, f, s, ln = part(c, out)
        tables, figs, sections, lines = tables + t, figs + f, sections + s, lines + ln
    if c.estimates:
        tables.append(write_csv(rows_frame(c.estimates), out / "compare_estimates.csv"))
    lines += [f"skipped: {s}" for s in c.skipped]
    (out / "compare_report.md").write_text(_report(c, seed, n_boot, mass_floor, gate, lines, sections, tables + figs))
    lines.append(f"wrote {len(tables)} tables, {len(figs)} figures and compare_report.md to {out}")
    return lines


def compare_command(run_dirs: Sequence, out_dir, roles: Sequence[str] = (), order: str | None = None, seed: int = 0,
                    n_boot: int = 10_000, mass_floor: float | None = None) -> list[str]:
    """`readout compare`'s options as typed (`--role RUN_DIR=lineage:stage` repeated, `--order a,b,c`, `--mass-floor`
    None for the default) parsed and handed to `compare_runs`."""
    role_map = {}
    for item in roles:
        k, _, v = item.partition("=")
        if not k or ":" not in v or not all(v.partition(":")[::2]):
            raise CompareError(f"--role: '{item}' must look like RUN_DIR=lineage:stage, e.g. runs/x=olmo-3-7b:sft")
        role_map[k] = v
    floor = {} if mass_floor is None else {"mass_floor": mass_floor}
    return compare_runs(list(run_dirs), out_dir, seed=seed, n_boot=n_boot, roles=role_map or None,
                        order=tuple(s.strip() for s in (order or "").split(",") if s.strip()), **floor)


def _report(c: Comparison, seed, n_boot, floor, gate, lines, sections, files) -> str:
    report = ["# Judgment-action gap across runs\n",
              f"Seed {seed}, {n_boot} bootstrap resamples, mass floor {floor:g}, gate families {', '.join(gate)}. "
              "Values are `estimate [95% CI] (n)`, percentile bootstrap over scenarios, paired on shared scenarios.\n",
              md_section("Headline", "\n".join(f"- {x}" for x in lines)),
              md_section("Runs", md_table(["run", "model", "lineage", "stage", "panel", "scenarios", "readouts"],
                                          [[str(a.run.path), a.model, r.lineage, r.stage, a.run.panel, a.run.n,
                                            ", ".join(sorted(a.run.readouts()))] for a, r in zip(c.analyses, c.roles)]))]
    report += sections
    if c.skipped:
        report.append(md_section("Skipped", "\n".join(f"- {s}" for s in c.skipped)))
    report.append(md_section("Files", "\n".join(f"- `{p.name}`" for p in files)))
    return "\n".join(report)


def _recipe_part(c: Comparison, out: Path):
    """Cross-recipe table (Table 7) and Figure 7: (tables, figures, sections, headline lines)."""
    if not c.recipe:
        return [], [], [], []
    recipe = c.recipe
    table = write_csv(pd.DataFrame([_recipe_record(r) for r in recipe]), out / "cross_recipe.csv")
    section = md_section("Cross-recipe table (Table 7)", md_table(
        ["model (lineage:stage)", "base, raw frame", "excess, own template (unscreened)",
         "own screen: excess (n; bar)", "minus selection null", "known-gap control"],
        [[f"{r.model} ({r.lineage}:{r.stage})", cell(r.base_raw_E), cell(r.E_unscreened),
          f"{cell(r.E_own_screen, n=False)} ({r.E_own_screen.n}; {num(r.E_own_screen.mde)})"
          if r.E_own_screen is not None else "–", cell(r.E_minus_selection_null),
          cell(r.control) + ({True: " passes", False: " FAILS", None: ""}[r.control_passes])] for r in recipe])
        + f"\n\nbar = per-model detection bar (MDE = 2.8 x bootstrap SE). Validation bar for the control: "
          f"95% lower bound >= {VALIDATION_BAR:.2f}.")
    fig = figures.control_vs_excess(
        [{"model": r.model, "control": r.control, "excess": r.E_unscreened, "screened": r.E_own_screen,
          "base": r.base_raw_E} for r in recipe], out / "control_vs_excess.png", VALIDATION_BAR)
    lines = [f"{r.model}: E unscreened {cell(r.E_unscreened)}; own screen {cell(r.E_own_screen)}"
             f" (bar {num(r.E_own_screen.mde if r.E_own_screen else None, 3)}); "
             f"minus selection null {cell(r.E_minus_selection_null)}; control {cell(r.control)}"
             + {True: " passes", False: " FAILS the validation bar", None: ""}[r.control_passes] for r in recipe]
    return [table], [fig], [section], lines


def _sweep_part(c: Comparison, out: Path):
    """Checkpoint sweeps (Figure 6), one per lineage."""
    figs, sections, lines = [], [], []
    for sw in c.sweeps:
        ests, final = sw.estimates, sw.final
        figs.append(figures.checkpoint_sweep(
            sw.lineage, sw.rows, final.get("control", "control_move") if final else None,
            final.get("continuous", "E", "all above floor") if final else None,
            out / f"checkpoint_sweep_{_slug(sw.lineage)}.png", VALIDATION_BAR))
        steps = [e for e in ests if " - " in e.quantity and e.subset == "unscreened"]
        sections.append(md_section(f"Checkpoint sweep: {sw.lineage} (Figure 6)", md_table(
            ["quantity", "shared, screened by no model", "final model's screened set"],
            [[q, cell(find_estimate(ests, q, "unscreened")), cell(find_estimate(ests, q, "final screen"))]
             for q in dict.fromkeys(e.quantity for e in ests)])
            + "\n\nStep rows are paired differences between stages on the same scenarios; their MDE is the step "
              "detection bar: " + "; ".join(f"{e.quantity}: {num(e.mde)}" for e in steps)))
        lines.append(f"sweep {sw.lineage}: " + "; ".join(f"E {s} {cell(find_estimate(ests, f'E {s}', 'unscreened'))}"
                                                        for s in sw.stages)
                     + "; steps " + "; ".join(f"{e.quantity} {cell(e)} (bar {num(e.mde)})" for e in steps))
    return [], figs, sections, lines


def _three_cell_part(c: Comparison, out: Path):
    """Three-cell contrasts (Tables 6, 15-17; Figure 9), one per base / final instruct pair."""
    figs, sections, lines = [], [], []
    for t in c.three_cells:
        base, a, ests = t.base, t.instruct, t.estimates
        figs.append(figures.three_cell(f"{base.model} vs {a.model}", ests, out / f"three_cell_{_slug(t.lineage)}.png"))
        instruct_raw = a.select("raw")
        t15 = md_table(["quantity", "set", f"base ({base.model})", f"instruct ({a.model})"],
                       [[e.quantity, e.subset, cell(e), cell(next((x for x in instruct_raw if x.quantity == e.quantity
                                                                   and x.subset == e.subset), None))]
                        for e in base.select("raw")])
        t16 = md_table(["quantity", "set", "value", "MDE"], [[e.quantity, e.subset, cell(e), num(e.mde)] for e in ests])
        sections.append(md_section(f"Three-cell contrast, raw frame: {base.model} vs {a.model} (Tables 6, 15-17)",
                                   "Each model on its own above-floor scenarios (Table 15):\n\n" + t15
                                   + "\n\nPaired on the shared scenarios, and slices of them (Tables 16-17):\n\n" + t16))
        d = find_estimate(ests, "Delta_E (base - instruct)", "shared with twins")
        lines.append(f"three-cell {base.model} vs {a.model} (raw frame): Delta_E {cell(d)}; MDE {num(d.mde if d else None)}")
    return [], figs, sections, lines


def _bridge_part(c: Comparison, out: Path):
    """The chat-vs-raw bridge of every instruct model read both ways."""
    if not c.bridges:
        return [], [], [], []
    bridges = c.bridges
    fig = figures.bridge(bridges, out / "bridge.png")
    section = md_section("Chat-vs-raw bridge", md_table(
        ["model", "quantity", "value", "note"], [[m, x.quantity, cell(x), x.note or ""] for m, e in bridges for x in e]))
    lines = []
    for m, e in bridges:
        gt = {x.quantity: x for x in e}
        lines.append(f"bridge {m}: g_twin chat {cell(gt.get('g_twin (chat)'))} vs raw {cell(gt.get('g_twin (raw)'))}")
    return [], [fig], [section], lines


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in s)


def _recipe_record(r: RecipeRow) -> dict:
    rec = {"model": r.model, "lineage": r.lineage, "stage": r.stage, "control_passes": r.control_passes}
    for name in ("base_raw_E", "E_unscreened", "E_own_screen", "E_minus_selection_null", "control"):
        e = getattr(r, name)
        rec.update({name: e.value if e else None, f"{name}_low": e.low if e else None,
                    f"{name}_high": e.high if e else None, f"{name}_n": e.n if e else None,
                    f"{name}_mde": e.mde if e else None})
    return rec
