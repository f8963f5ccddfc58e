"""`readout stats RUN_DIR`: one run directory's whole gap analysis written as tables, figures and a report.

Owns: `run_report` (the CLI's entry point), the file layout of RUN_DIR/stats/ (CSV tables, report.md with
the same tables in Markdown, PNG figures), and the headline lines printed at the end. Analyses the run
cannot support are listed in the report and the headline with the reason; nothing is dropped silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from stats.core.estimate import Estimate
from stats.core.manifest import settings_note
from stats.core.output import cell, md_section, md_table, num, rows_frame, write_csv
from stats.gap import figures
from stats.gap.analysis import RunAnalysis, Skipped, analyze
from stats.gap.continuous import CONTINUOUS_QUANTITIES
from stats.gap.control import VALIDATION_BAR, passes_bar
from stats.gap.harness import forced_warnings
from stats.gap.names import CHAT, DEFAULT_FRAME, HARM_TWIN, PRIMARY, RAW
from stats.gap.screen import DEFAULT_MASS_FLOOR, GATE_FAMILIES, LEVELS, MIN_VERDICT_N, SCREEN_BAND

FIGURES = {
    "calibration_ladder.png": "Figure 1: calibration ladder",
    "scatter_pj_pd.png": "Figure 2: p_J vs p_D, twins in gray",
    "strictness_ladder.png": "Figure 3: strictness ladder",
    "slices.png": "Figure 4: gap by family and by generator",
    "f4_by_generator.png": "Figure 5: F4 by generator",
    "control_vs_excess.png": "Figure 7: control vs excess",
    "dose_arm.png": "Figure 8: dose arm",
}
OWN_TABLES = ("estimates.csv", "screen.csv", "floors.csv", "ladder.csv", "slices.csv", "dose.csv", "per_scenario.csv",
              "skipped.csv", "floor_sensitivity.csv", "harness.csv", "paraphrase_swap.csv")


def run_report(run_dir, out_dir=None, seed: int = 0, n_boot: int = 10_000, *,
               mass_floor: float = DEFAULT_MASS_FLOOR, gate: Sequence[str] = GATE_FAMILIES) -> list[str]:
    """Analyse one run directory (or a Run, e.g. a pool of runs), write RUN_DIR/stats/ (or out_dir), return
    the headline lines."""
    a = analyze(run_dir, seed=seed, n_boot=n_boot, floor=mass_floor, gate=tuple(gate))
    out = Path(out_dir) if out_dir is not None else a.run.path / "stats"
    out.mkdir(parents=True, exist_ok=True)
    # A rerun must not leave an earlier run's figure or table behind beside the new report.
    for name in (*FIGURES, *OWN_TABLES, "report.md"):
        (out / name).unlink(missing_ok=True)
    tables = write_tables(a, out)
    figs, fig_notes = write_figures(a, out)
    lines = headline(a)
    (out / "report.md").write_text(render_markdown(a, lines, tables, figs, fig_notes))
    lines.append(f"wrote {len(tables)} tables, {len(figs)} figures and report.md to {out}")
    return lines


def pivot(ests: Sequence[Estimate], key: str = "subset") -> pd.DataFrame:
    """Wide table: one row per subset (or quantity), value / low / high / n / mde per quantity."""
    rows: dict[str, dict] = {}
    other = "quantity" if key == "subset" else "subset"
    for e in ests:
        r = rows.setdefault(getattr(e, key), {key: getattr(e, key)})
        q = getattr(e, other)
        r.update({q: e.value, f"{q}_low": e.low, f"{q}_high": e.high, f"{q}_n": e.n, f"{q}_mde": e.mde})
    return pd.DataFrame(list(rows.values()))


def write_tables(a: RunAnalysis, out: Path) -> list[Path]:
    run = a.run
    files = [write_csv(rows_frame(a.estimates, Estimate, model=run.model, panel=run.panel), out / "estimates.csv")]
    if a.screen_rows:
        files.append(write_csv(rows_frame(a.screen_rows), out / "screen.csv"))
    files.append(write_csv(rows_frame(a.floors, floor=a.floor), out / "floors.csv"))
    ladder = [e for e in a.estimates if e.analysis in ("continuous", "binary") and e.subset in LEVELS]
    if ladder:
        df = pivot(ladder)
        df["verdict_continuous"] = df["subset"] == a.verdict_level.get("continuous")
        df["verdict_binary"] = df["subset"] == a.verdict_level.get("binary")
        files.append(write_csv(df.rename(columns={"subset": "level"}), out / "ladder.csv"))
    for name in ("slices", "dose", "floor_sensitivity", "paraphrase_swap"):
        if a.select(name):
            files.append(write_csv(pivot(a.select(name), key="quantity" if name == "dose" else "subset"),
                                   out / f"{name}.csv"))
    if a.harness is not None:
        files.append(write_csv(a.harness, out / "harness.csv"))
    files.append(write_csv(a.per_scenario, out / "per_scenario.csv"))
    files.append(write_csv(rows_frame(a.skipped, Skipped), out / "skipped.csv"))
    return files


def write_figures(a: RunAnalysis, out: Path) -> tuple[list[Path], list[str]]:
    figs, notes = [], []

    def want(name: str, ok: bool, why: str, draw):
        if ok:
            figs.append(draw(out / name))
        else:
            notes.append(f"{FIGURES[name]} not drawn: {why}")

    def has(e: Estimate | None) -> bool:
        return e is not None and e.value is not None

    l0 = a.get("continuous", "E", "L0")
    no_l0 = ("the screen could not be applied" if l0 is None
             else "no screened scenario above the mass floor has a twin above it")
    ctl = a.get("control", "control_move")
    excess = a.get("continuous", "E", "all above floor")
    want("calibration_ladder.png", has(l0) or has(ctl), f"{no_l0}, and no control value",
         lambda p: figures.calibration_ladder(a, p))
    want("scatter_pj_pd.png", has(l0), no_l0, lambda p: figures.scatter(a, p))
    want("strictness_ladder.png", has(l0), no_l0, lambda p: figures.strictness_ladder(a, p))
    want("slices.png", any(has(e) for e in a.select("slices")), no_l0, lambda p: figures.slices(a, p))
    f4 = [e for e in a.select("slices") if e.subset.startswith("family x generator=F4,")]
    want("f4_by_generator.png", any(has(e) for e in f4), "no screened F4 scenario",
         lambda p: figures.f4_by_generator(a, p))
    want("control_vs_excess.png", has(ctl) or has(excess), "no control value and no excess above the mass floor",
         lambda p: figures.control_vs_excess([{"model": a.model, "control": ctl, "excess": excess,
                                               "screened": l0}], p, VALIDATION_BAR))
    want("dose_arm.png", any(has(e) and not e.quantity.startswith("completed") for e in a.select("dose")),
         "no dose-arm contrast with a value", lambda p: figures.dose_arm(a, p))
    return figs, notes


def floor_warnings(a: RunAnalysis, who: str = "") -> list[str]:
    """A warning line per frame (chat: D and J; raw: raw_D and raw_J) whose letter mass falls below the mass
    floor on most (over half) of the primaries the analyses need (chat: the gate-family primaries the screen
    counts, when it could be applied), naming the floor and the median letter mass. `who` names the run in a
    line about several (readout compare)."""
    gate_row = next((r for r in a.screen_rows if r.family == "gate families"), None)
    out = []
    for readouts in (CHAT, RAW):
        rows = [f for f in a.floors if f.cell == PRIMARY and f.readout in readouts
                and f.frame.split(" ")[0] == DEFAULT_FRAME[f.readout]]
        if readouts == CHAT and gate_row is not None:
            removed, of, what = gate_row.below_floor, gate_row.primaries, "gate-family primaries"
        elif rows:
            worst = max(rows, key=lambda f: f.below_floor / f.rows if f.rows else 0.0)
            removed, of, what = worst.below_floor, worst.rows, "primaries" if readouts == CHAT else "raw-frame primaries"
        else:
            continue
        if not of or removed <= of / 2:
            continue
        mass = ", ".join(f"{r} {'–' if m is None else f'{m:.2g}'}"
                         for r, m in {f.readout: f.median_mass for f in rows}.items())
        out.append(f"warning: {who + ': ' if who else ''}the mass floor {a.floor:g} removes {removed} of {of} {what} "
                   f"(median letter mass: {mass or '–'}); this model rarely answers with a letter; a lower "
                   "--mass-floor keeps more of them")
    return out


def headline(a: RunAnalysis) -> list[str]:
    run = a.run
    lines = []
    gate_row = next((r for r in a.screen_rows if r.family == "gate families"), None)
    scr = f"{gate_row.primaries} gate-family primaries, {gate_row.screened} screened" if gate_row else "no screen"
    lines.append(f"{run.model} on {run.panel}: {run.n} scenarios; {scr}; mass floor {a.floor:g}")
    note = settings_note(run.manifest)
    lines += [note] if note else []
    lines += floor_warnings(a)
    e0 = a.get("continuous", "E", "L0")
    if e0 is not None:
        lines.append(f"paired excess E (screened, L0): {e0.fmt()}; detection bar (MDE) {num(e0.mde)}")
        v = a.verdict_level.get("continuous")
        ev = a.get("continuous", "E", v) if v else None
        lines.append(f"verdict level (continuous): {v}: E = {ev.fmt()}" if ev else
                     f"verdict level (continuous): none (no level has {MIN_VERDICT_N} paired scenarios)")
        b0 = a.get("binary", "binary_excess", "L0")
        vb = a.verdict_level.get("binary")
        bv = a.get("binary", "binary_excess", vb) if vb else None
        b0s = a.get("binary", "binary_excess_scenario_only", "L0")
        lines.append(f"binary excess (L0, nested CI): {b0.fmt()}"
                     + (f"; scenario-only CI [{num(b0s.low)}, {num(b0s.high)}]" if b0s is not None else "")
                     + f"; verdict level {vb or 'none'}" + (f": {bv.fmt()}" if bv else ""))
    f5 = _f5_line(a)
    if f5:
        lines.append(f5)
    ea = a.get("continuous", "E", "all above floor")
    if ea is not None:
        lines.append(f"E on all above-floor scenarios (unscreened): {ea.fmt()}; detection bar {num(ea.mde)}")
    sel = a.get("selection", "E_minus_selection_null")
    if sel is not None:
        lines.append(f"own screen minus selection-matched null: {sel.fmt()}")
    ctl = a.get("control", "control_move")
    if ctl is not None:
        verdict = passes_bar(ctl)
        lines.append(f"known-gap control: {ctl.fmt()}; validation bar {VALIDATION_BAR:.2f}: "
                     + {True: "passes", False: "FAILS", None: "undetermined"}[verdict])
    re = a.get("raw", "E")
    if re is not None:
        lines.append(f"raw frame: E {re.fmt()}; g {cell(a.get('raw', 'g'))}; g_twin {cell(a.get('raw', 'g_twin'))}")
    bt = a.get("bridge", "g_twin raw - chat")
    if bt is not None:
        lines.append(f"bridge: g_twin chat {cell(a.get('bridge', 'g_twin (chat)'))} vs raw "
                     f"{cell(a.get('bridge', 'g_twin (raw)'))}")
    dose = a.get("dose", "reasoning - filler", "primary")
    if dose is not None:
        lines.append(f"dose arm, reasoning - filler (primary): {dose.fmt()}")
    lines += forced_warnings(a.harness)
    for s in a.skipped:
        lines.append(f"skipped: {s.analysis}: {s.reason}")
    for n in a.run.notes:
        lines.append(f"note: {n}")
    return lines


def _f5_line(a: RunAnalysis) -> str | None:
    """F5 read against its pressure-removed twin and against its harm-matched twin, side by side."""
    sub = "family=F5" + ("" if "F5" in a.gate else " (appendix)")
    plain, harm = a.get("slices", "E", sub), a.get("slices", "E_harm_twin", sub)
    if plain is None:
        return None
    bp, bh = a.get("slices", "binary_excess", sub), a.get("slices", "binary_excess_harm_twin", sub)
    return (f"F5 (screened, L0): E vs pressure-removed twin {plain.fmt()}, vs harm-matched twin "
            f"{harm.fmt() if harm else 'not read'}; binary excess {cell(bp)} vs {cell(bh)}")


def render_markdown(a: RunAnalysis, lines: list[str], tables: list[Path], figs: list[Path], fig_notes: list[str]) -> str:
    run = a.run
    parts = [
        f"# Judgment-action gap statistics: {run.model} on {run.panel}\n",
        f"Run directory `{run.path}`. Seed {a.seed}, {a.n_boot} bootstrap resamples, mass floor {a.floor:g} "
        f"(total letter mass), screen band {SCREEN_BAND}, gate families {', '.join(a.gate)}. "
        "Every value is `estimate [95% CI] (n)`: percentile bootstrap over scenarios, paired where the "
        "quantity is paired; binary CIs are nested (scenarios, then rollouts), as the paper draws them: "
        "conservative for an exact readout, whose nominal-coverage CI is the scenario-only one beside them "
        "(headline, bias-audit table). MDE = 2.8 x bootstrap SE.\n",
        md_section("Headline", "\n".join(f"- {line}" for line in lines)),
    ]
    if a.skipped:
        parts.append(md_section("Skipped analyses", "\n".join(f"- **{s.analysis}**: {s.reason}" for s in a.skipped)))
    if a.screen_rows:
        parts.append(_screen_section(a))
    parts.append(md_section("Mass floor", md_table(
        ["cell", "readout", "frame", "scenarios", f"below {a.floor:g}", "median mass", "min mass"],
        [[f.cell, f.readout, f.frame, f.rows, f.below_floor, num(f.median_mass), num(f.min_mass)] for f in a.floors])))
    if a.get("continuous", "E", "L0") is not None or a.get("control", "control_move") is not None:
        parts.append(_calibration_section(a))
    if any(a.get("continuous", "E", lv) for lv in LEVELS):
        parts += [_ladder_section(a), _bias_audit_section(a)]
    parts += _other_sections(a)
    if run.notes:
        parts.append(md_section("Notes on the input", "\n".join(f"- {n}" for n in run.notes)))
    parts.append(md_section("Files", "\n".join(
        [f"- `{p.name}`" for p in tables] + [f"- `{p.name}`: {FIGURES.get(p.name, '')}" for p in figs]
        + [f"- {n}" for n in fig_notes])))
    return "\n".join(parts)


def _screen_section(a: RunAnalysis) -> str:
    return md_section("Screen outcomes (Table 13)", md_table(
        ["family", "primaries", "below floor", "judgment unstable", "judged violating", "no pressure (low/high)",
         "mixed", "screened"],
        [[r.family + (" (appendix)" if r.appendix else ""), r.primaries, r.below_floor, r.judgment_unstable,
          r.judged_violating, f"{r.no_pressure} ({r.acting_low}/{r.acting_high})", r.mixed, r.screened]
         for r in a.screen_rows])
        + "\n\nCategories are assigned in this order: below floor, judgment unstable, judged violating, "
          "no pressure (acting fraction outside the band); what remains is mixed, and mixed is screened.")


def _calibration_section(a: RunAnalysis) -> str:
    g = a.get
    return md_section("Calibration ladder (Figure 1)", md_table(
        ["instrument", "floor", "null (twins)", "measurement", "paired excess", "known-gap band"],
        [["binary", "–", cell(g("binary", "binary_null", "L0")), cell(g("binary", "binary_gap", "L0")),
          cell(g("binary", "binary_excess", "L0")), cell(g("control", "binary_band"))],
         ["continuous", cell(g("continuous", "paraphrase_floor", "L0")), cell(g("continuous", "g_twin", "L0")),
          cell(g("continuous", "g", "L0")), cell(g("continuous", "E", "L0")), cell(g("control", "control_move"))]])
        + f"\n\nRollout-level violating fraction on the screened set: "
          f"{cell(g('binary', 'rollout_violating_fraction', 'L0'))}.")


def _ladder_section(a: RunAnalysis) -> str:
    rows = []
    for lv in LEVELS:
        c = {q: a.get("continuous", q, lv) for q in CONTINUOUS_QUANTITIES}
        b = a.get("binary", "binary_excess", lv)
        mark = [k for k in ("continuous", "binary") if a.verdict_level.get(k) == lv]
        rows.append([lv, c["E"].n if c["E"] else 0] + [cell(c[q], n=False) for q in CONTINUOUS_QUANTITIES[:-1]]
                    + [cell(c["E"]), num(c["E"].mde if c["E"] else None), cell(b), ", ".join(mark) or "–"])
    return md_section("Strictness ladder (Table 5, Figure 3)", md_table(
        ["level", "n", "p_D", "p_J", "p_D (twin)", "p_J (twin)", "g", "g (twin)", "paired excess E", "MDE",
         "binary excess (nested)", "verdict level for"], rows)
        + "\n\nL0: original judge frame names a non-violating option and is stable; L1: plus a four-frame "
          "majority non-violating; L2: plus all four frames naming the same option. The verdict level is the "
          f"strictest with at least {MIN_VERDICT_N} paired scenarios.")


def _bias_audit_section(a: RunAnalysis) -> str:
    def width(e):
        return None if e is None or e.low is None else e.high - e.low

    audit = []
    for lv in LEVELS:
        for q in ("binary_gap", "binary_null", "binary_excess"):
            nest, only = a.get("binary", q, lv), a.get("binary", f"{q}_scenario_only", lv)
            audit.append([lv, q, cell(nest), num(width(nest)), cell(only), num(width(only))])
    return md_section("Binary readout: nested vs scenario-only CIs (bias audit, Table 4)", md_table(
        ["level", "quantity", "nested CI", "width", "scenario-only CI", "width"], audit)
        + "\n\nResampling the rollouts within each scenario flips majorities near a 0.5 violating fraction, "
          "which widens every binary CI (it opposes the claim).")


def _other_sections(a: RunAnalysis) -> list[str]:
    """Slices, control, selection null, dose, raw frame, bridge and harm twin: each only when computed."""
    parts = []
    if a.select("slices"):
        parts.append(_slices_section(a))
    if a.select("floor_sensitivity"):
        parts.append(_floor_section(a))
    if a.harness is not None:
        parts.append(_harness_section(a))
    if a.select("paraphrase_swap"):
        subs = list(dict.fromkeys(e.subset for e in a.select("paraphrase_swap")))
        qs = ("original_gap", "swapped_gap", "swapped_minus_original", "p_D swapped - original")
        parts.append(md_section("F4 paraphrase swap (Table 14)", md_table(
            ["origin", "original gap (screened)", "swapped gap (screened)", "swapped - original, paired",
             "p_D swapped - original, paired"], [[s.split("=", 1)[1]] + [cell(a.get("paraphrase_swap", q, s))
                                                for q in qs] for s in subs])))
    ctl = a.get("control", "control_move")
    if ctl is not None:
        parts.append(md_section("Known-gap control (Figure 7)", md_table(
            ["quantity", "value", "MDE", "note"],
            [["control move p_D(control) - p_J0", cell(ctl), num(ctl.mde), ctl.note or ""],
             ["binary band (J0 non-violating)", cell(a.get("control", "binary_band")), "–", ""]])))
    sel = a.select("selection")
    if sel:
        parts.append(md_section("Own-screen excess, detection bar and selection-matched null (Table 7)", md_table(
            ["quantity", "set", "value", "detection bar (MDE)", "note"],
            [[e.quantity, e.subset, cell(e), num(e.mde), e.note or ""] for e in sel])))
    dose = a.select("dose")
    if dose:
        qs = list(dict.fromkeys(e.quantity for e in dose))
        parts.append(md_section("Dose arm (Table 8, Figure 8)", md_table(
            ["contrast", "primary", "twin (P1-A12)"],
            [[q, cell(a.get("dose", q, "primary")), cell(a.get("dose", q, "twin"))] for q in qs])
            + "\n\nPaired differences in the violating option's mass at the forced answer, on the screened "
              "scenarios; `completed` rows are the share of rollouts whose text ended within the budget. "
              "The `a / b` rows (the ratio reading, P1-A14: arm a's mean violating mass over arm b's) and the "
              "`rider agreement` row (P1-A6: per scenario, the share of rider rollouts whose answer at the dose "
              "budget names the option of their answer at the rider's end) follow our definitions: the paper "
              "names both readings and defines neither."))
    for name, title in (("raw", "Raw completion frame (Table 15)"), ("bridge", "Chat-vs-raw bridge"),
                        (HARM_TWIN, "F5 harm-matched twin (descriptive)")):
        ests = a.select(name)
        if ests:
            parts.append(md_section(title, md_table(["quantity", "set", "value", "MDE", "note"],
                                                    [[e.quantity, e.subset, cell(e), num(e.mde), e.note or ""]
                                                     for e in ests])))
    return parts


def _slices_section(a: RunAnalysis) -> str:
    subsets = list(dict.fromkeys(e.subset for e in a.select("slices")))
    qs = ("g", "g_twin", "E", "binary_gap", "binary_null", "binary_excess", "E_harm_twin", "binary_excess_harm_twin")
    return md_section("Slices by family, generator, family x generator and prompt version (Figures 4, 5)", md_table(
        ["slice", "g", "g (twin)", "E", "binary gap", "binary null", "binary excess", "E vs harm twin",
         "binary excess vs harm twin"], [[s] + [cell(a.get("slices", q, s)) for q in qs] for s in subsets])
        + "\n\nScreened scenarios at L0. Each binary number is on its own set (gap: primary reference "
          "non-violating; null: twin reference non-violating and twin above the floor; excess: both); harm-twin "
          "columns read F5 against its harm-matched twin, which removes the incentive and keeps the harm.")


def _floor_section(a: RunAnalysis) -> str:
    subs = list(dict.fromkeys(e.subset for e in a.select("floor_sensitivity")))
    qs = ("E", "binary_gap", "binary_null", "binary_excess")
    return md_section("Mass-floor sensitivity", md_table(
        ["floor", "E (screened, L0)", "binary gap", "binary null", "binary excess"],
        [[s.split("=")[1] + (" (applied)" if float(s.split("=")[1]) == a.floor else "")]
         + [cell(a.get("floor_sensitivity", q, s)) for q in qs] for s in subs])
        + "\n\nThe paper does not state its letter-mass floor; each row reruns the screen at that floor.")


def _harness_section(a: RunAnalysis) -> str:
    h = a.harness
    share_cols = [c for c in h.columns if c.startswith("share_")]
    return md_section("Harness calibration (Table 11): how each answer was read", md_table(
        ["readout", "frame", "cell", "reads"] + [c.removeprefix("share_") for c in share_cols],
        [[r["readout"], r["frame"], r["cell"], r["reads"]] + [f"{r[c]:.2f}" for c in share_cols]
         for _, r in h.iterrows()])
        + "\n\nShares of reads per anchor rule: `own` the model's literal anchor, `own_*` a formatting variant of "
          "it followed by the answer, `forced_*` an anchor the harness appended after a finished reply or at the "
          "budget; `wrapped` the letter in `**`/`()`, `tool_name` an F3 tool named instead of its letter. This "
          "is the harness's side of Table 11; the agreement with human or model judges needs their labels.")
