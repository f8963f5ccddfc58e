"""`readout show`'s default: one scenario (dilemma) as a summary table, and the narrowing of its full detail.

A quick run's scenario reads about a hundred prompts and their rollouts: printed whole (`--all`) that is a
thousand lines. The summary is one row per cell x readout x frame with the values scenarios.parquet holds (an NSI
dilemma: one row per framing), and ends with the commands that print the detail, whole or narrowed by
`--cell` / `--readout` / `--frame`.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from contract.tables import NSI_CONTINUOUS, NSI_REPLIES, SCENARIOS
from engine.errors import ReadoutError
from readouts.show import DilemmaView, ScenarioView, dilemma_head, fmt, fmt_mass, format_view, plural, scenario_head

SCENARIO_COLUMNS = (SCENARIOS.col("cell"), SCENARIOS.col("readout"), SCENARIOS.col("frame"), "orders", "reads",
                    SCENARIOS.col("p_violating"), "violating fraction", "letter mass", "judged")
"""The summary's headers: the scenario table's own column names where a column is shown as it is."""
DILEMMA_COLUMNS = (NSI_CONTINUOUS.col("framing"), NSI_CONTINUOUS.col("negated"), NSI_CONTINUOUS.col("p_agree"),
                   NSI_CONTINUOUS.col("p_endorse"), "replies", "parsed", NSI_REPLIES.col("endorse"))


def narrow(v: ScenarioView | DilemmaView, cell: str | None = None, readout: str | None = None,
           frame: str | None = None) -> ScenarioView | DilemmaView:
    """The view with only the prompts (NSI: framings) the filters select; a filter that selects nothing is a
    ReadoutError naming the values the item has."""
    if isinstance(v, DilemmaView):
        if cell or readout:
            raise ReadoutError(f"{v.run_dir}: --cell and --readout select parts of a gap scenario; an NSI dilemma has "
                               "framings: --frame F0..F3")
        kept = tuple(f for f in v.framings if frame is None or f.framing == frame)
        if not kept:
            raise ReadoutError(f"{v.run_dir}: dilemma {v.dilemma_id}: --frame {frame}: no such framing "
                               f"(it has {', '.join(f.framing for f in v.framings)})")
        return dataclasses.replace(v, framings=kept)
    picks = (("cell", cell), ("readout", readout), ("frame", frame))
    kept = tuple(p for p in v.prompts if all(want is None or getattr(p, key) == want for key, want in picks))
    if not kept:
        asked = ", ".join(f"--{key} {want}" for key, want in picks if want is not None)
        has = "; ".join(f"{key}s {', '.join(dict.fromkeys(getattr(p, key) for p in v.prompts))}"
                        for key, want in picks if want is not None)
        raise ReadoutError(f"{v.run_dir}: scenario {v.scenario_id}: no prompt read with {asked} (it has {has})")
    cells = {(p.cell, p.readout) for p in kept}
    summary = tuple(s for s in v.summary if (s["cell"], s["readout"]) in cells and frame in (None, s["frame"]))
    return dataclasses.replace(v, prompts=kept, summary=summary)


def scenario_table(v: ScenarioView) -> pd.DataFrame:
    """One row per cell x readout x frame of the scenario table: the orders and reads behind it, and its values
    (an aggregate row, such as J's mean over the judge frames, has no prompts of its own: '-')."""
    counts: dict[tuple, list[int]] = {}
    for p in v.prompts:
        c = counts.setdefault((p.cell, p.readout, p.frame), [0, 0])
        c[0] += 1
        c[1] += len(p.probes)
    rows = [(s["cell"], s["readout"], s["frame"], *counts.get((s["cell"], s["readout"], s["frame"]), ("-", "-")),
             fmt(s["p_violating"]), fmt(s["violating_fraction"]), fmt_mass(s["letter_mass"]), s["judged_option"] or "-")
            for s in v.summary]
    return pd.DataFrame(rows, columns=list(SCENARIO_COLUMNS))


def dilemma_table(v: DilemmaView) -> pd.DataFrame:
    """One row per framing: the continuous reading at the decision field and the tally of the sampled replies."""
    rows = []
    for f in v.framings:
        parsed = [r for r in f.replies if r["parse_ok"]]
        rows.append((f.framing, "yes" if f.negated else "no", fmt(f.continuous.get("p_agree", math.nan), 4),
                     fmt(f.continuous.get("p_endorse", math.nan), 4), len(f.replies), len(parsed),
                     sum(1 for r in parsed if r["endorse"] == 1)))
    return pd.DataFrame(rows, columns=list(DILEMMA_COLUMNS))


def format_summary(v: ScenarioView | DilemmaView) -> str:
    """The summary table with a line saying what it shows, then the commands that print the detail."""
    detail = len(format_view(v).splitlines())
    if isinstance(v, ScenarioView):
        command, example = f"readout show {v.run_dir} {v.scenario_id}", "--cell twin --readout J, or --frame agent"
        table = scenario_table(v)
        what = (f"{plural(len(v.prompts), 'prompt')} (cell x readout x frame x option order), "
                f"{plural(sum(len(p.probes) for p in v.prompts), 'read')}; per frame: p_violating, the violating option's "
                "mass (mean over orders and rollouts); violating fraction, the share of reads whose top letter violates; "
                "the letter mass; the judged option")
        lines = scenario_head(v)
    else:
        command, example = f"readout show {v.run_dir} {v.dilemma_id}", "--frame F1"
        table = dilemma_table(v)
        what = ("per framing: the continuous reading at the decision field (p_agree, p_endorse) and the sampled replies "
                "(parsed: a decision was read; endorse: the reply endorses the action)")
        lines = dilemma_head(v)
    lines += ["", f"summary: {what}", "", table.to_string(index=False) if len(table) else "(nothing read)", "",
              f"the detail, {detail} lines (every prompt, each rollout's text and read rule, the letter masses): "
              f"{command} --all", f"  or part of it, e.g. {command} {example}"]
    return "\n".join(lines)
