"""Probe files as tables (CSV or parquet) for `readout score`: each row becomes the object a JSONL line would
be, so one validator (readouts.probes_io) checks every format the same way.

Columns: `id`, `text` or `messages`, `letters`, optional `system`, and the user's own fields either as one
`metadata` column (a JSON object, or a struct in parquet) or as `metadata.<key>` columns. In CSV, `messages`
is a JSON list and `letters` a JSON list or comma-separated letters (`A,B,C`); an empty cell is a missing
value. Rows are named `file:row N` in errors (N counts data rows from 1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

from contract.metadata import METADATA
from engine.errors import ProbeInputError
from panels.jsonl import json_problem

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
"""File name endings read as tables; any other probe file is JSONL."""
_PREFIX = f"{METADATA}."


def _missing(v) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v == ""


def _plain(v):
    """A parquet/pandas cell as plain Python (numpy scalars, arrays and dicts of them)."""
    if hasattr(v, "tolist"):
        return _plain(v.tolist())
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _json_cell(v, where: str, field: str):
    """A CSV (or parquet string) cell that holds JSON: parsed; an object/list from parquet: as is."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except json.JSONDecodeError as exc:
        raise ProbeInputError(f"{where}: {field}: not valid JSON ({json_problem(exc, 'character', exc.pos + 1)} of the cell)") from None


def _letters_cell(v, where: str):
    if isinstance(v, str) and not v.lstrip().startswith("["):
        return [x.strip() for x in v.split(",")]
    return _json_cell(v, where, "letters")


def _read_frame(path: Path):
    import pandas as pd
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() == ".csv":
            return pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
        return pq.read_table(path).to_pandas()
    except FileNotFoundError:
        raise ProbeInputError(f"{path}: file: not found") from None
    except Exception as exc:  # pandas and pyarrow raise several types for an unreadable file
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ProbeInputError(f"{path}: file: not a readable {path.suffix.lstrip('.')} table ({first})") from None


def table_objects(path: str | Path) -> Iterator[tuple[str, int, dict]]:
    """(where, row number, object) for each row of a CSV or parquet probe file, where = 'file:row N'."""
    path = Path(path)
    df = _read_frame(path)
    meta_cols = [c for c in df.columns if str(c).startswith(_PREFIX)]
    if meta_cols and METADATA in df.columns:
        raise ProbeInputError(f"{path}: {METADATA}: give either a '{METADATA}' column or '{_PREFIX}<key>' columns, not both")
    for n, rec in enumerate(df.to_dict("records"), start=1):
        where = f"{path}:row {n}"
        obj, meta = {}, {}
        for col, v in rec.items():
            col = str(col)
            if _missing(v):
                continue
            v = _plain(v)
            if col.startswith(_PREFIX):
                meta[col[len(_PREFIX):]] = v
            elif col == "messages":
                obj[col] = _json_cell(v, where, col)
            elif col == "letters":
                obj[col] = _letters_cell(v, where)
            elif col == METADATA:
                obj[col] = _json_cell(v, where, col)
            else:
                obj[col] = v
        if meta:
            obj[METADATA] = meta
        yield where, n, obj
