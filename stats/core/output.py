"""Writing results: CSV files and Markdown tables, for both papers.

Owns: dataclass rows -> DataFrame, the one CSV writer (`write_csv`), the one Markdown table writer
(`md_table`; `frame_markdown` formats a DataFrame through it), report sections, the `write_table` pair
(CSV + Markdown of one table, as the negation paper's report writes them), and the cell format of the gap
reports: `value [low, high] (n)`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from stats.core.estimate import Estimate

#: The gap tables' float format. The negation tables are written at full precision (float_format=None).
GAP_FLOAT_FORMAT = "%.6g"


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


def write_csv(df: pd.DataFrame, path: Path, float_format: str | None = GAP_FLOAT_FORMAT) -> Path:
    """One table as CSV without the index; `float_format` None writes floats at full precision. An empty table is
    still a table: it must come with its columns (a header line), never as a file without one."""
    if len(df.columns) == 0:
        raise ValueError(f"{path.name}: a table without columns; build the empty frame with its columns")
    df.to_csv(path, index=False, float_format=float_format)
    return path


def cell(e: Estimate | None, digits: int = 3, n: bool = True) -> str:
    """'0.054 [0.021, 0.086] (136)' ; '–' for a quantity that was not computed."""
    if e is None:
        return "–"
    if e.value is None:
        return f"n/a ({e.n})" if n else "n/a"
    body = f"{e.value:.{digits}f}" if e.low is None else f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"
    return f"{body} ({e.n})" if n else body


def ci_text(low, high, spec: str = ".2f") -> str:
    """'[0.66, 0.73]'; '[no CI]' when either end is missing or NaN (as Estimate.fmt writes it)."""
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return "[no CI]"
    return f"[{low:{spec}}, {high:{spec}}]"


def num(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A GitHub Markdown table (no tabulate dependency); '|' and newlines inside cells are escaped."""
    def esc(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def md_value(v, digits: int = 3) -> str:
    """A DataFrame value in a Markdown cell: blank for None/NaN, yes/no for bools, floats to `digits`
    decimals (scientific below 10^-digits)."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if v != 0 and abs(v) < 10 ** (-digits):
            return f"{v:.1e}"
        return f"{v:.{digits}f}"
    return str(v)


def frame_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a Markdown table, every value through `md_value`."""
    return md_table([str(c) for c in df.columns], ([md_value(v, digits) for v in row] for row in df.itertuples(index=False)))


def md_section(title: str, body: str) -> str:
    return f"## {title}\n\n{body}\n"


def write_table(df: pd.DataFrame, out: Path, name: str, title: str, float_format: str | None = None) -> str:
    """Write `name`.csv and `name`.md (a titled Markdown section) into `out`; return the section."""
    write_csv(df, out / f"{name}.csv", float_format=float_format)
    md = md_section(title, frame_markdown(df) if len(df) else "(empty)")
    (out / f"{name}.md").write_text(md)
    return md
