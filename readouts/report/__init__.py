"""`readout report`: one self-contained HTML page over run directories and results folders.

`gather` (readouts/report/gather.py) reads what the runs and the stats commands wrote; `page`
(readouts/report/render.py) formats it; `write_report` writes the file.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ReadoutError
from readouts.atomic import atomic_write_bytes
from readouts.report.gather import DEFAULT_ITEMS, gather
from readouts.report.render import page


def default_out(paths) -> Path:
    if len(paths) != 1:
        raise ReadoutError("--out: required when several folders are given")
    return Path(paths[0]) / "report.html"


def write_report(paths, out: str | Path | None = None, max_items: int = DEFAULT_ITEMS) -> list[str]:
    """Write the HTML report of `paths` to `out` (default FOLDER/report.html for one folder); returns the log lines."""
    if not paths:
        raise ReadoutError("report: give at least one run directory or results folder")
    if max_items < 0:
        raise ReadoutError(f"--items: must be >= 0, got {max_items}")
    target = Path(out) if out is not None else default_out(paths)
    report = gather(paths, max_items=max_items)
    atomic_write_bytes(target, page(report).encode("utf-8"))
    lines = [f"warning: {s.path}: {n}" for s in report.sections for n in s.notes]
    lines += [f"warning: {s.path}: {t.name}: not a readable CSV table ({t.error})" for s in report.sections
              for t in s.tables if t.error]
    figures = sum(len(s.figures) for s in report.sections)
    items = sum(len(s.items) for s in report.sections)
    lines.append(f"wrote {target} ({len(report.sections)} sections, {figures} figures, {items} drill-down items)")
    return lines
