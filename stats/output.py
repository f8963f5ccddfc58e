"""Writing results: CSV files of result rows and Markdown tables, with every number beside its n and CI.

Owns: dataclass rows -> DataFrame/CSV, the Markdown table writer (no tabulate dependency), and the cell
format used everywhere in reports: `value [low, high] (n)`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from .boot import Estimate


def rows_frame(rows: Iterable, cls=None, **extra) -> pd.DataFrame:
    """Frozen dataclass rows -> DataFrame (None stays empty in CSV); extra columns go first.

    cls (the row dataclass) gives the columns when there are no rows, so an empty table keeps its header.
    """
    records = [dataclasses.asdict(r) for r in rows]
    columns = [f.name for f in dataclasses.fields(cls)] if cls is not None and not records else None
    df = pd.DataFrame.from_records(records, columns=columns)
    for i, (k, v) in enumerate(extra.items()):
        df.insert(i, k, v)
    return df


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False, float_format="%.6g")
    return path


def cell(e: Estimate | None, digits: int = 3, n: bool = True) -> str:
    """'0.054 [0.021, 0.086] (136)' ; '–' for a quantity that was not computed."""
    if e is None:
        return "–"
    if e.value is None:
        return f"n/a ({e.n})" if n else "n/a"
    body = f"{e.value:.{digits}f}" if e.low is None else f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"
    return f"{body} ({e.n})" if n else body


def num(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    def esc(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
