"""Reading one run table as its contract declares it (contract.tables), with one-line errors.

`read_table` checks that every declared column is there (a missing one is an error naming the file and
the column), that no column declared non-null holds nulls, and casts each column to its declared dtype:
the readers of both papers get the writer's types from the same declaration instead of casting inline.
Columns the contract does not declare are left out.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from contract.tables import DTYPES, LATER_COLUMNS, Table
from stats.core.errors import RunDirError, StatsInputError, TableSchemaError


def _first_line(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def nullable(dtype: str) -> bool:
    """Whether a contract dtype may hold nulls ("float" columns hold NaN where a value is not defined)."""
    return dtype.endswith("?") or dtype == "float"


def conform(df: pd.DataFrame, table: Table, where, error: type[StatsInputError] = TableSchemaError,
            optional: tuple[str, ...] = ()) -> pd.DataFrame:
    """`df` restricted to `table`'s columns, checked for missing columns and nulls, cast to the declared dtypes.

    `optional`: declared nullable columns a table may lack (written without them); missing ones are added as nulls
    (the caller says so) instead of refused. `df.attrs["absent"]` lists them."""
    absent = [name for name in table.names if name not in df.columns]
    for name in absent:
        if name not in optional and name not in LATER_COLUMNS:
            raise error(f"{where}: column {name}: missing (declared in contract.tables)")
    df = df.reindex(columns=list(table.names))
    df.attrs["absent"] = absent
    for col in table.columns:
        if not nullable(col.dtype) and df[col.name].isna().any():
            raise error(f"{where}: column {col.name}: {int(df[col.name].isna().sum())} null values")
        try:
            df[col.name] = df[col.name].astype(DTYPES[col.dtype])
        except (TypeError, ValueError) as exc:
            raise error(f"{where}: column {col.name}: not readable as {col.dtype} ({_first_line(exc)})") from None
    return df


def read_table(path: str | Path, table: Table, *, error: type[StatsInputError] = TableSchemaError,
               file_error: type[StatsInputError] = RunDirError, optional: tuple[str, ...] = ()) -> pd.DataFrame:
    """Read `path` (a parquet file holding contract table `table`) and `conform` it.

    A missing or unreadable file raises `file_error`; a missing column (not in `optional`), a null in a non-null column or a
    value of the wrong kind raises `error`. Every message is one line naming the file (and the column).
    """
    path = Path(path)
    if not path.is_file():
        raise file_error(f"{path}: file not found")
    try:
        present = set(pq.read_schema(path).names)
        df = pq.read_table(path, columns=[c for c in table.names if c in present]).to_pandas()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise file_error(f"{path}: not a readable parquet table ({_first_line(exc)})") from None
    return conform(df, table, path, error, optional)
