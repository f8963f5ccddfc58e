"""`readout show RUN_DIR ID`: one scenario (gap run) or one dilemma (NSI run) as the model saw and answered it.

Gathering and formatting are apart: `open_run` reads a run directory's tables, `item_view` gathers one item
into plain dataclasses (also the HTML report's drill-down, readouts/report), and `format_view` writes them as text.
A gap view is organised cell > readout > frame > order: each prompt once (probes.parquet `prompt_text`, the
prompt's ids decoded), then every rollout read after it with its generated text, read rule and letter masses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from contract.metadata import METADATA
from contract.names import CELLS, FRAMINGS
from contract.readouts import readout_names
from contract.tables import NSI_CONTINUOUS, NSI_REPLIES, NSI_TEMPERED, PROBES, PROMPT_TEXT, SCENARIOS, Table
from engine.errors import ReadoutError


@dataclass(frozen=True)
class ProbeView:
    """One read position: a rollout's text (generated reads), how its answer was read, the letter masses."""

    rollout: int
    masses: tuple[tuple[str, float], ...]
    """(letter, full-softmax mass) in letter order."""
    violating_letter: str
    top_letter: str
    p_violating: float
    letter_mass: float
    anchor_rule: str | None
    generated_text: str | None
    generated_tokens: int | None
    drawn: str | None = None
    """`--sample` runs, first-token reads: the seeded draw's letter, or "no letter" (None: not a drawn read)."""


@dataclass(frozen=True)
class PromptView:
    """One prompt (cell x readout x frame x order) and the reads taken after it."""

    cell: str
    readout: str
    frame: str
    order_index: int
    options: tuple[tuple[str, str], ...]
    """(letter, option id) in the order read."""
    prompt_text: str | None
    """None: the run predates stored prompts."""
    probes: tuple[ProbeView, ...]


@dataclass(frozen=True)
class ScenarioView:
    """One scenario of a judgment-action run."""

    run_dir: str
    scenario_id: str
    facts: dict
    """family, domain, violating option (from scenarios.parquet), when present."""
    summary: tuple[dict, ...]
    """Its scenarios.parquet rows (cell, readout, frame, p_violating, violating_fraction, judged_option)."""
    prompts: tuple[PromptView, ...]


@dataclass(frozen=True)
class FramingView:
    """One framing of an NSI dilemma: the continuous reading and every reply."""

    framing: str
    negated: bool
    message: str | None
    """The user message before the chat template (rendered from the run's panel), or None."""
    continuous: dict
    replies: tuple[dict, ...]


@dataclass(frozen=True)
class DilemmaView:
    """One dilemma of an NSI run."""

    run_dir: str
    dilemma_id: str
    facts: dict
    framings: tuple[FramingView, ...]
    notes: tuple[str, ...] = ()


@dataclass
class RunTables:
    """A run directory's kind, manifest and item ids (tables are read per item, filtered on the id)."""

    path: Path
    kind: str
    """gap or nsi."""
    manifest: dict
    ids: list[str] = field(default_factory=list)
    """Item ids in the order the run read them."""


def _manifest(path: Path) -> dict:
    try:
        data = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def open_run(run_dir: str | Path) -> RunTables:
    """The run directory's kind and item ids; ReadoutError (one line) when it holds no run tables."""
    path = Path(run_dir)
    if (path / PROBES.file).is_file():
        kind, key, file = "gap", "scenario_id", path / PROBES.file
    elif (path / NSI_REPLIES.file).is_file():
        kind, key, file = "nsi", "dilemma_id", path / NSI_REPLIES.file
    else:
        raise ReadoutError(f"{path}: no {PROBES.file} or {NSI_REPLIES.file} (not a run directory, or its chunks are "
                           "not merged yet: `readout merge RUN_DIR`)")
    manifest = _manifest(path)
    try:
        present = pq.read_table(file, columns=[key]).column(key).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ReadoutError(f"{file}: not a readable parquet table ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    read = (manifest.get("panel") or {}).get("records_read") or []
    seen = set(present)
    ids = [i for i in read if i in seen] + sorted(seen - set(read))
    return RunTables(path, kind, manifest, ids)


def _rows(file: Path, table: Table, key: str, ids: list[str], optional: tuple[str, ...] = ()) -> pd.DataFrame:
    """The rows of `ids` from a run table, checked against its contract (columns older runs lack, contract.tables
    LATER_COLUMNS and `optional`, read as nulls)."""
    from stats.core.tables import conform

    if not file.is_file():
        return pd.DataFrame(columns=list(table.names))
    try:
        present = set(pq.read_schema(file).names)
        df = pq.read_table(file, columns=[c for c in table.names if c in present], filters=[(key, "in", ids)]).to_pandas()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ReadoutError(f"{file}: not a readable parquet table ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    return conform(df, table, file, optional=optional)


def _check_id(run: RunTables, item_id: str) -> None:
    if item_id not in run.ids:
        what = "scenario" if run.kind == "gap" else "dilemma"
        some = ", ".join(run.ids[:5]) + (", ..." if len(run.ids) > 5 else "")
        raise ReadoutError(f"{run.path}: {what} {item_id!r}: not in this run ({len(run.ids)} {what}s, e.g. {some})")


def _num(x) -> float:
    return math.nan if x is None or pd.isna(x) else float(x)


def _opt(x):
    return None if x is None or (not isinstance(x, str) and pd.isna(x)) else x


def scenario_views(run: RunTables, ids: list[str]) -> list[ScenarioView]:
    """Views of the gap scenarios `ids` (each must be in the run), in the order given."""
    if not ids:
        return []
    for i in ids:
        _check_id(run, i)
    probes = _rows(run.path / PROBES.file, PROBES, "scenario_id", ids)
    scen = _rows(run.path / SCENARIOS.file, SCENARIOS, "scenario_id", ids)
    cell_rank = {c: k for k, c in enumerate(CELLS)}
    readout_rank = {r: k for k, r in enumerate(readout_names())}

    def rank(r: dict) -> tuple:  # cell > readout > frame > order > rollout, in the tables' own orders
        return (cell_rank.get(r["cell"], 99), readout_rank.get(r["readout"], 99), len(r["frame"]), r["frame"],
                r.get("order_index", 0), r.get("rollout", 0))

    probe_rows = sorted(probes.astype(object).where(probes.notna(), None).to_dict("records"), key=rank)
    scen_rows = sorted(scen.astype(object).where(scen.notna(), None).to_dict("records"), key=rank)
    sampled = bool(run.manifest.get("sample"))
    out = []
    for sid in ids:
        s = [r for r in scen_rows if r["scenario_id"] == sid]
        facts = {k: s[0][k] for k in ("family", "domain", "violating", "panel", "model", METADATA)
                 if s and s[0].get(k) is not None}
        summary = tuple({"cell": r["cell"], "readout": r["readout"], "frame": r["frame"], "p_violating": _num(r["p_violating"]),
                         "violating_fraction": _num(r["violating_fraction"]), "letter_mass": _num(r["letter_mass"]),
                         "judged_option": r["judged_option"]} for r in s)
        groups: dict[tuple, list[dict]] = {}
        for r in (r for r in probe_rows if r["scenario_id"] == sid):
            groups.setdefault((r["cell"], r["readout"], r["frame"], r["order_index"]), []).append(r)
        prompts = []
        for (cell, readout, frame, k), g in groups.items():
            reads = tuple(ProbeView(
                rollout=int(r["rollout"]), masses=tuple(zip(r["letters"], (float(m) for m in r["mass"]))),
                violating_letter=r["violating_letter"], top_letter=r["top_letter"], p_violating=_num(r["p_violating"]),
                letter_mass=_num(r["letter_mass"]), anchor_rule=r["anchor_rule"], generated_text=r["generated_text"],
                generated_tokens=None if r["generated_tokens"] is None else int(r["generated_tokens"]),
                drawn=(r["sampled_letter"] or "no letter") if sampled and r["anchor_rule"] is None else None) for r in g)
            prompts.append(PromptView(cell, readout, frame, int(k), tuple(zip(g[0]["letters"], g[0]["order"].split(","))),
                                      g[0][PROMPT_TEXT], reads))
        out.append(ScenarioView(str(run.path), sid, facts, summary, tuple(prompts)))
    return out


def _messages(run: RunTables, ids: list[str]) -> tuple[dict, str | None]:
    """{(dilemma, framing): user message} rendered from the run's panel when it is still the one read, else a note."""
    from panels.frames import frame_texts, render_polarity
    from panels.records import PanelError
    from panels.schema import load_panel

    info = run.manifest.get("panel") or {}
    if not info.get("path"):
        return {}, "prompts not shown: the run's manifest names no panel file"
    try:
        panel = load_panel(info["path"])
    except (PanelError, OSError) as exc:
        return {}, f"prompts not shown: the run's panel does not load ({str(exc).splitlines()[0]})"
    if panel.sha256 != info.get("sha256") or run.manifest.get("frames_version") != frame_texts()["version"]:
        return {}, "prompts not shown: the run's panel or frame texts changed since the run"
    out = {}
    for d in (r for r in panel.records if r.id in ids):
        for f in FRAMINGS:
            out[(d.id, f)] = render_polarity(d, f).messages[-1]["content"]
    return out, None


def dilemma_views(run: RunTables, ids: list[str]) -> list[DilemmaView]:
    """Views of the NSI dilemmas `ids`: per framing, the continuous reading and every reply."""
    if not ids:
        return []
    for i in ids:
        _check_id(run, i)
    replies = _rows(run.path / NSI_REPLIES.file, NSI_REPLIES, "dilemma_id", ids)
    cont = _rows(run.path / NSI_CONTINUOUS.file, NSI_CONTINUOUS, "dilemma_id", ids, optional=NSI_TEMPERED)
    messages, note = _messages(run, ids)
    out = []
    for did in ids:
        r = replies[replies["dilemma_id"] == did].sort_values(["framing", "sample"])
        c = cont[cont["dilemma_id"] == did]
        facts = {"domain": r.iloc[0]["domain"], "model": r.iloc[0]["model"]} if not r.empty else {}
        framings = []
        for f in FRAMINGS:
            rf, cf = r[r["framing"] == f], c[c["framing"] == f]
            if rf.empty and cf.empty:
                continue
            negated = bool((rf if not rf.empty else cf).iloc[0]["negated"])
            reading = {} if cf.empty else {k: _num(cf.iloc[0][k]) for k in
                                           ("mass_agree", "mass_disagree", "p_agree", "p_endorse")}
            rows = tuple({"sample": int(x.sample), "temperature": float(x.temperature), "parse_ok": bool(x.parse_ok),
                          "decision": _opt(x.decision), "endorse": None if pd.isna(x.endorse) else int(x.endorse),
                          "parse_error": _opt(x.parse_error), "generated_tokens": int(x.generated_tokens),
                          "truncated": bool(x.truncated), "text": x.text} for x in rf.itertuples())
            framings.append(FramingView(f, negated, messages.get((did, f)), reading, rows))
        out.append(DilemmaView(str(run.path), did, facts, tuple(framings), (note,) if note else ()))
    return out


def item_view(run_dir: str | Path, item_id: str) -> ScenarioView | DilemmaView:
    """One scenario (gap run) or dilemma (NSI run) of a run directory."""
    run = open_run(run_dir)
    return (scenario_views if run.kind == "gap" else dilemma_views)(run, [item_id])[0]


# -- text ------------------------------------------------------------------------------------------
def plural(n: int, word: str) -> str:
    """'1 chunk', '2 chunks'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def fmt(x: float, digits: int = 3) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fmt_mass(m: float) -> str:
    """A letter's mass: four decimals, or two significant digits below 0.001 (tiny masses stay readable)."""
    return fmt(m, 4) if m == 0 or m >= 1e-3 or math.isnan(m) else f"{m:.1e}"


def masses_line(p: ProbeView) -> str:
    """`A 0.012  B* 0.340 ...` (`*` the violating letter), then the read's total letter mass and top letter."""
    parts = [f"{letter}{'*' if letter == p.violating_letter else ''} {fmt_mass(m)}" for letter, m in p.masses]
    return (f"{'  '.join(parts)}   (letter mass {fmt_mass(p.letter_mass)}, top {p.top_letter}, "
            f"p_violating {fmt(p.p_violating)}{', drawn ' + p.drawn if p.drawn else ''})")


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + line for line in text.splitlines()) if text else pad + "(empty)"


def scenario_head(v: ScenarioView) -> list[str]:
    """The scenario's id and facts, and the run it is from."""
    return [f"scenario {v.scenario_id}" + "".join(f", {k} {v.facts[k]}" for k in ("family", "domain", "violating", METADATA)
                                                  if k in v.facts), f"run {v.run_dir}"]


def dilemma_head(v: DilemmaView) -> list[str]:
    """The dilemma's id and domain, the run it is from, and any note on its prompts."""
    return [f"dilemma {v.dilemma_id}" + (f", domain {v.facts['domain']}" if "domain" in v.facts else ""),
            f"run {v.run_dir}", *v.notes]


def format_scenario(v: ScenarioView) -> str:
    lines = [*scenario_head(v), "", "(letter* = the violating option's letter)"]
    summary = {(s["cell"], s["readout"], s["frame"]): s for s in v.summary}
    last = None
    for pr in v.prompts:
        if (pr.cell, pr.readout) != last:
            last = (pr.cell, pr.readout)
            lines += ["", f"== cell {pr.cell} / readout {pr.readout} =="]
        s = summary.get((pr.cell, pr.readout, pr.frame))
        order = " ".join(f"{letter}={opt}" for letter, opt in pr.options)
        lines.append(f"-- frame {pr.frame}, order {pr.order_index} ({order})"
                     + (f"; frame p_violating {fmt(s['p_violating'])}, violating fraction {fmt(s['violating_fraction'])}"
                        + (f", judged {s['judged_option']}" if s["judged_option"] else "") if s and pr.order_index == 0 else ""))
        lines.append("   prompt:")
        lines.append(_indent(pr.prompt_text, "   | ") if pr.prompt_text is not None else
                     "   | (not stored: this run predates probes.parquet's prompt_text; `readout panels show` renders it)")
        for p in pr.probes:
            if p.anchor_rule is not None:
                lines.append(f"   rollout {p.rollout} ({p.generated_tokens} tokens, read rule {p.anchor_rule}):")
                lines.append(_indent(p.generated_text or "", "   > "))
                lines.append(f"     masses: {masses_line(p)}")
            else:
                lines.append(f"   masses: {masses_line(p)}")
    aggregates = [s for s in v.summary if not any((s["cell"], s["readout"], s["frame"]) == (p.cell, p.readout, p.frame)
                                                  for p in v.prompts)]
    for s in aggregates:
        lines.append(f"aggregate {s['cell']}/{s['readout']}/{s['frame']}: p_violating {fmt(s['p_violating'])}, violating "
                     f"fraction {fmt(s['violating_fraction'])}" + (f", judged {s['judged_option']}" if s["judged_option"] else ""))
    return "\n".join(lines)


def format_dilemma(v: DilemmaView) -> str:
    lines = dilemma_head(v)
    for f in v.framings:
        lines += ["", f"== framing {f.framing} ({'negated' if f.negated else 'plain'}) =="]
        if f.message is not None:
            lines += ["   message (before the chat template):", _indent(f.message, "   | ")]
        if f.continuous:
            lines.append("   continuous: " + ", ".join(f"{k} {fmt(x, 4)}" for k, x in f.continuous.items()))
        for r in f.replies:
            outcome = (f"decision {r['decision']}, endorse {r['endorse']}" if r["parse_ok"]
                       else f"unparsed ({r['parse_error']})")
            lines.append(f"   reply {r['sample']} (T {r['temperature']:g}, {r['generated_tokens']} tokens"
                         f"{', truncated' if r['truncated'] else ''}): {outcome}")
            lines.append(_indent(r["text"], "   > "))
    return "\n".join(lines)


def format_view(v: ScenarioView | DilemmaView) -> str:
    return format_scenario(v) if isinstance(v, ScenarioView) else format_dilemma(v)
