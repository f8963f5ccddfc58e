"""What an HTML report shows, gathered from disk into plain data (readouts/report/render.py writes the page).

One section per folder given: a gap run (its `stats/` folder from `readout stats`, its manifest and a drill-down
over its scenarios), an NSI run (`readout nsi-stats`'s `stats/`, the manifest, a drill-down over dilemmas), or a
results folder (`readout compare` output, or any stats folder): figures, tables and its markdown report.
Nothing is computed here that the stats commands compute: a run without `stats/` gets a note saying which command
writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from contract.tables import NSI_REPLIES, PROBES, STEERING
from engine.errors import ReadoutError
from readouts.report.card import Card, gap_card, group_warnings, nsi_card
from readouts.show import DilemmaView, ScenarioView, dilemma_views, open_run, plural, scenario_views
from stats.core.manifest import settings_note
from stats.depth.names import CAPTIONS as DEPTH_CAPTIONS
from stats.depth.names import DEPTH_FIGURES, DEPTH_MARKDOWN, DEPTH_TABLES
from stats.steer.names import CAPTIONS as STEER_CAPTIONS
from stats.steer.names import STEER_FIGURES, STEER_MARKDOWN

#: Markdown reports the stats commands write, in the order one is looked for in a folder.
REPORT_FILES = ("report.md", "nsi_report.md", "compare_report.md")
#: Rows of a CSV table shown in the page (the rest stays in the file).
MAX_TABLE_ROWS = 300
#: Items (scenarios, dilemmas) a run's drill-down shows by default: a quick run's ten; at the paper's settings a
#: scenario's prompts and rollouts take about a megabyte of HTML.
DEFAULT_ITEMS = 10
#: What writes a run's stats folder, per run kind.
STATS_COMMAND = {"gap": "readout stats", "nsi": "readout nsi-stats"}


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class TableData:
    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    total_rows: int
    error: str | None = None
    """Why the file could not be read (the page shows this line in the table's place), or None."""


#: What reading one part of a report (a table, a figure, a markdown file, a folder) may raise on bad files.
PART_ERRORS = (ReadoutError, OSError, UnicodeDecodeError, ValueError)


@dataclass
class Section:
    """One folder of the report."""

    kind: str
    """gap, nsi or results."""
    title: str
    path: str
    manifest: dict | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)
    """(label, value) lines about the run: model, panel, profile, seed, created, complete."""
    notes: list[str] = field(default_factory=list)
    markdown: str | None = None
    """The stats report's markdown text (rendered in the page), or None."""
    markdown_name: str | None = None
    figures: list[Figure] = field(default_factory=list)
    tables: list[TableData] = field(default_factory=list)
    items: list[ScenarioView | DilemmaView] = field(default_factory=list)
    items_total: int = 0
    card: Card | None = None
    """The headline card (readouts/report/card.py), or None when the stats were not written."""
    warnings: list[tuple[str, int]] = field(default_factory=list)
    """The stats headline's warnings, one per kind: (first line, how many lines of that kind)."""


@dataclass
class Report:
    sections: list[Section]
    created: str


def _cell(x) -> str:
    if isinstance(x, float):
        return "" if pd.isna(x) else f"{x:.4g}"
    return "" if x is None or (not isinstance(x, (list, tuple)) and pd.isna(x)) else str(x)


def read_csv_table(path: Path, limit: int = MAX_TABLE_ROWS) -> TableData:
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
        raise ReadoutError(f"{path}: not a readable CSV table ({str(exc).splitlines()[0]})") from None
    rows = tuple(tuple(_cell(v) for v in row) for row in df.head(limit).itertuples(index=False))
    return TableData(path.name, tuple(str(c) for c in df.columns), rows, len(df))


def _captions(markdown: str | None) -> dict[str, str]:
    """`- \\`fig.png\\`: caption` lines of a stats report's file list -> {file: caption}."""
    out = {}
    for m in re.finditer(r"^- `([^`]+\.png)`(?::\s*(.*))?$", markdown or "", re.MULTILINE):
        out[m.group(1)] = (m.group(2) or "").strip()
    return out


def _problem(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def read_table_part(path: Path) -> TableData:
    """A CSV table, or a TableData whose `error` says in one line why it cannot be read (the rest still renders)."""
    try:
        return read_csv_table(path)
    except PART_ERRORS as exc:
        reason, prefix = _problem(exc), f"{path}: not a readable CSV table ("
        return TableData(path.name, (), (), 0, error=reason[len(prefix):-1] if reason.startswith(prefix) else reason)


def read_results(folder: Path, section: Section) -> None:
    """A stats or comparison folder's markdown report, figures (PNG) and tables (CSV) into `section`. A part that
    cannot be read becomes a one-line note; every other part is still read."""
    md = next((folder / n for n in REPORT_FILES if (folder / n).is_file()), None)
    if md is not None:
        try:
            section.markdown, section.markdown_name = md.read_text(encoding="utf-8"), md.name
        except PART_ERRORS as exc:
            section.notes.append(f"{md}: not readable ({_problem(exc)}); the rest of this section is shown")
    captions = _captions(section.markdown)
    listed = list(captions)  # the report's own order (by figure number), then any other figure by name
    pngs = sorted(folder.glob("*.png"), key=lambda p: (listed.index(p.name) if p.name in listed else len(listed), p.name))
    for p in pngs:
        try:
            section.figures.append(Figure(p.name, captions.get(p.name, ""), p.read_bytes()))
        except PART_ERRORS as exc:
            section.notes.append(f"{p}: not readable ({_problem(exc)})")
    section.tables = [read_table_part(p) for p in sorted(folder.glob("*.csv"))]


def _facts(manifest: dict) -> list[tuple[str, str]]:
    model = manifest.get("model") or {}
    panel = manifest.get("panel") or {}
    profile = manifest.get("profile") or {}
    facts = [("model", model.get("name") if isinstance(model, dict) else str(model)),
             ("panel", f"{panel.get('name')} ({plural(len(panel.get('records_read') or []), 'record')} read)" if panel else None),
             ("kind", manifest.get("kind")), ("profile", profile.get("name") if isinstance(profile, dict) else profile),
             ("seed", manifest.get("seed")), ("device", manifest.get("device")), ("created", manifest.get("created")),
             ("complete", manifest.get("complete")), ("git commit", manifest.get("git_commit"))]
    return [(k, str(v)) for k, v in facts if v is not None]


WARNING_PREFIXES = ("warning:", "skipped:", "note:")


def headline_lines(stats: Path, section: Section) -> list[str]:
    """The stats command's headline lines: gap report.md's Headline bullets, NSI headlines.txt."""
    if section.kind == "nsi":
        path = stats / "headlines.txt"
        return path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    m = re.search(r"^## Headline\n(.*?)(?=^## )", section.markdown or "", re.MULTILINE | re.DOTALL)
    return [BULLET_LINE.sub("", line) for line in (m.group(1) if m else "").splitlines() if BULLET_LINE.match(line)]


BULLET_LINE = re.compile(r"^\s*-\s+")


def headline_part(stats: Path, section: Section, label: str) -> None:
    """The card and the grouped warnings of a run whose stats were written; a part that cannot be read is a note."""
    try:
        note = settings_note(section.manifest or {})
        make = gap_card if section.kind == "gap" else nsi_card
        section.card = make(stats, section.title.removeprefix(label + ": "), note)
        lines = headline_lines(stats, section)
        warn = [line for line in lines if line.startswith(WARNING_PREFIXES)
                or (section.kind == "nsi" and ("undefined" in line or "left out" in line) and "continuous NSI" not in line)]
        section.warnings = group_warnings([line for line in warn if line != note])
    except PART_ERRORS as exc:
        section.notes.append(f"{stats}: the headline card cannot be made ({_problem(exc)}); the rest is shown")


def run_section(path: Path, max_items: int) -> Section:
    """A gap or NSI run directory: manifest, its stats folder (if written) and the drill-down."""
    run = open_run(path)
    model = ((run.manifest.get("model") or {}).get("name")) or "?"
    panel = ((run.manifest.get("panel") or {}).get("name")) or "?"
    label = "Judgment-action run" if run.kind == "gap" else "Framing-stability (NSI) run"
    section = Section(run.kind, f"{label}: {model} on {panel}", str(path), manifest=run.manifest, facts=_facts(run.manifest))
    if not run.manifest:
        section.notes.append(f"{path}/manifest.json is missing or unreadable")
    stats = path / "stats"
    if stats.is_dir() and any(stats.iterdir()):
        read_results(stats, section)
        headline_part(stats, section, label)
    else:
        section.notes.append(f"no stats folder: run `{STATS_COMMAND[run.kind]} {path}` first for the figures and tables "
                             "(this section shows the manifest and the drill-down only)")
    ids = run.ids[:max_items]
    try:
        section.items = scenario_views(run, ids) if run.kind == "gap" else dilemma_views(run, ids)
    except PART_ERRORS as exc:
        section.notes.append(f"{path}: the drill-down cannot be read ({_problem(exc)}); the rest of this section is shown")
    section.items_total = len(run.ids)
    return section


def depth_section(path: Path, run: Section) -> Section | None:
    """A depth run's depth figures, departure and tables (from `readout stats`), moved out of the run's section."""
    stats = path / "stats"
    if not (stats / DEPTH_MARKDOWN).is_file():
        return None
    title = run.title.split(": ", 1)[-1]
    section = Section("depth", f"Through depth: {title}", str(stats))
    section.markdown, section.markdown_name = (stats / DEPTH_MARKDOWN).read_text(encoding="utf-8"), DEPTH_MARKDOWN
    section.figures = sorted((f for f in run.figures if f.name in DEPTH_FIGURES), key=lambda f: DEPTH_FIGURES.index(f.name))
    section.figures = [Figure(f.name, DEPTH_CAPTIONS.get(f.name, f.caption), f.png) for f in section.figures]
    section.tables = [t for t in run.tables if t.name in DEPTH_TABLES]
    run.figures = [f for f in run.figures if f.name not in DEPTH_FIGURES]
    run.tables = [t for t in run.tables if t.name not in DEPTH_TABLES]
    section.notes = [] if section.figures else [f"{stats}: no depth figures (rerun `readout stats {path}`)"]
    return section


def steer_section(path: Path) -> Section:
    """A steering run (`readout steer`): its manifest, and the steering figure, summary and tables `readout stats`
    wrote into its stats folder."""
    import json

    manifest_path = path / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    except (OSError, ValueError):
        manifest = {}
    model = ((manifest.get("model") or {}).get("name")) or "?"
    st = manifest.get("steering") or {}
    section = Section("steering", f"Steering: {model}, direction {st.get('direction', '?')}, layers {st.get('layers', '?')}",
                      str(path), manifest=manifest, facts=_facts(manifest))
    stats = path / "stats"
    if not (stats / STEER_MARKDOWN).is_file():
        section.notes.append(f"no steering summary: run `readout stats {path}` first for the figure and tables")
        return section
    section.markdown, section.markdown_name = (stats / STEER_MARKDOWN).read_text(encoding="utf-8"), STEER_MARKDOWN
    section.figures = [Figure(name, STEER_CAPTIONS.get(name, ""), (stats / name).read_bytes())
                       for name in STEER_FIGURES if (stats / name).is_file()]
    section.tables = [read_table_part(f) for f in sorted(stats.glob("steer_*.csv"))]
    return section


def results_section(path: Path) -> Section:
    """A folder of results without run tables (`readout compare` output, a stats folder)."""
    section = Section("results", f"Results: {path.name}", str(path))
    read_results(path, section)
    if section.markdown is None and not section.figures and not section.tables:
        raise ReadoutError(f"{path}: not a run directory or a results folder (no {PROBES.file}, {NSI_REPLIES.file}, "
                           f"{' / '.join(REPORT_FILES)}, figures or tables)")
    if section.markdown_name == "compare_report.md":
        section.title = f"Comparison: {path.name}"
    return section


def folder_section(p: Path, max_items: int) -> Section:
    if not p.is_dir():
        raise ReadoutError(f"{p}: not a folder (give run directories or results folders)")
    if (p / STEERING.file).is_file():
        return steer_section(p)
    is_run = (p / PROBES.file).is_file() or (p / NSI_REPLIES.file).is_file()
    return run_section(p, max_items) if is_run else results_section(p)


def gather(paths, max_items: int = DEFAULT_ITEMS) -> Report:
    """The report's data: one section per folder, in the order given. A folder that cannot be read at all becomes
    a section holding one note (the others still render); ReadoutError when no folder can be read."""
    sections, errors = [], []
    paths = list(paths)
    for p in map(Path, paths):
        try:
            sections.append(folder_section(p, max_items))
        except PART_ERRORS as exc:
            errors.append(exc)
            sections.append(Section("unreadable", f"Not readable: {p}", str(p), notes=[_problem(exc)]))
            continue
        is_run = (p / PROBES.file).is_file() or (p / NSI_REPLIES.file).is_file()
        depth = depth_section(p, sections[-1]) if is_run else None
        if depth is not None:
            sections.append(depth)
    if len(errors) == len(paths):
        raise errors[0] if isinstance(errors[0], ReadoutError) else ReadoutError(f"{paths[0]}: {_problem(errors[0])}")
    return Report(sections, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
