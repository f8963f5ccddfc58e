"""Reading and checking the framing-stability tables (nsi_replies.parquet, nsi_continuous.parquet).

Owns the table schemas of docs/tables.md ("Framing-stability runs") as the stats layer sees them: which
columns must be present, which values they may hold, and one-line errors naming the file and column when
a table is bad. Several run directories (one model each) are read into one frame.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

FRAMINGS = ("F0", "F1", "F2", "F3")
NEGATED = {"F0": False, "F1": True, "F2": False, "F3": True}
POLARITY_PAIR = ("F0", "F1")
REPLIES = "nsi_replies.parquet"
CONTINUOUS = "nsi_continuous.parquet"

REPLY_COLUMNS = (
    "model", "dilemma_id", "domain", "framing", "negated", "temperature", "sample", "text",
    "parse_ok", "parse_stage", "parse_error", "decision", "endorse",
)
CONTINUOUS_COLUMNS = (
    "model", "dilemma_id", "domain", "framing", "negated", "mass_agree", "mass_disagree", "p_agree", "p_endorse",
)


class NSITableError(ValueError):
    """A framing-stability table is missing, malformed, or inconsistent (message: one line, file and column)."""


def _fail(path: Path, column: str | None, why: str) -> None:
    where = f"{path}: column {column}" if column else str(path)
    raise NSITableError(f"{where}: {why}")


def _read(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        _fail(path, None, "file not found")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        _fail(path, None, f"not a readable parquet table ({type(exc).__name__}: {exc})".replace("\n", " "))
    for col in required:
        if col not in df.columns:
            _fail(path, col, "missing")
    return df


def _check_common(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    for col in ("model", "dilemma_id", "domain", "framing"):
        if df[col].isna().any():
            _fail(path, col, f"{int(df[col].isna().sum())} null values")
        df[col] = df[col].astype(str)
    bad = sorted(set(df["framing"]) - set(FRAMINGS))
    if bad:
        _fail(path, "framing", f"unknown framings {bad} (expected F0..F3)")
    if df["negated"].isna().any():
        _fail(path, "negated", "null values")
    negated = df["negated"].astype(bool)
    wrong = negated != df["framing"].map(NEGATED)
    if wrong.any():
        row = df[wrong].iloc[0]
        _fail(path, "negated", f"{int(wrong.sum())} rows disagree with the framing (e.g. {row['framing']} negated={row['negated']})")
    df["negated"] = negated
    per_dilemma = df.groupby("dilemma_id")["domain"].nunique()
    if (per_dilemma > 1).any():
        _fail(path, "domain", f"dilemma {per_dilemma[per_dilemma > 1].index[0]} has several domains")
    return df


def read_replies(run_dir: str | Path) -> pd.DataFrame:
    """Read and check one run directory's nsi_replies.parquet; adds ``run_dir``."""
    path = Path(run_dir) / REPLIES
    df = _read(path, REPLY_COLUMNS)
    df = _check_common(df, path)
    if df["parse_ok"].isna().any():
        _fail(path, "parse_ok", "null values")
    df["parse_ok"] = df["parse_ok"].astype(bool)
    for col in ("temperature", "sample"):
        if df[col].isna().any():
            _fail(path, col, "null values")
    df["temperature"] = df["temperature"].astype(float)
    if (df["temperature"] < 0).any():
        _fail(path, "temperature", "negative values")
    df["sample"] = df["sample"].astype(int)
    ok = df["parse_ok"].astype(bool)
    # Readouts write nullable columns (pandas "string", "Int64"); compare on plain objects/floats so a
    # missing decision is simply "not agree" rather than a missing comparison.
    dec = df["decision"].astype(object).where(df["decision"].notna(), None)
    bad_dec = ok & ~dec.isin(["agree", "disagree"])
    if bad_dec.any():
        _fail(path, "decision", f"{int(bad_dec.sum())} parsed rows without agree/disagree (e.g. {dec[bad_dec].iloc[0]!r})")
    if (~ok & dec.notna()).any():
        _fail(path, "decision", "set on rows with parse_ok false")
    if df.loc[ok, "endorse"].isna().any():
        _fail(path, "endorse", "null on parsed rows")
    is_agree = dec.eq("agree").astype(bool)
    expected = (is_agree != df["negated"].astype(bool)).astype(int)
    endorse = pd.to_numeric(df["endorse"].astype(object).where(df["endorse"].notna(), None), errors="coerce").astype(float)
    wrong = ok & (endorse != expected)
    if wrong.any():
        _fail(path, "endorse", f"{int(wrong.sum())} rows are not decision XOR negated")
    df["endorse"] = endorse.where(ok)
    df["agree"] = is_agree.astype(float).where(ok)
    key = ["model", "dilemma_id", "framing", "temperature", "sample"]
    dup = df.duplicated(key)
    if dup.any():
        row = df[dup].iloc[0]
        _fail(path, "sample", f"duplicate reply key {tuple(row[k] for k in key)}")
    df["run_dir"] = str(run_dir)
    return df


def read_continuous(run_dir: str | Path) -> pd.DataFrame | None:
    """Read and check nsi_continuous.parquet, or None when the run has none."""
    path = Path(run_dir) / CONTINUOUS
    if not path.is_file():
        return None
    df = _read(path, CONTINUOUS_COLUMNS)
    df = _check_common(df, path)
    for col in ("mass_agree", "mass_disagree", "p_agree", "p_endorse"):
        v = pd.to_numeric(df[col], errors="coerce").astype(float)
        if v.isna().any() or not np.isfinite(v).all():
            _fail(path, col, "null or non-finite values")
        if ((v < 0) | (v > 1)).any():
            _fail(path, col, "values outside [0, 1]")
        df[col] = v
    expected = np.where(df["negated"], 1.0 - df["p_agree"], df["p_agree"])
    if not np.allclose(df["p_endorse"], expected, atol=1e-6):
        _fail(path, "p_endorse", "is not p_agree (or 1 - p_agree on negated framings)")
    if df.duplicated(["model", "dilemma_id", "framing"]).any():
        _fail(path, "framing", "more than one row per model x dilemma x framing")
    df["run_dir"] = str(run_dir)
    return df


def load_runs(run_dirs) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Read several run directories into (replies, continuous or None); one model may not appear twice."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    if not run_dirs:
        raise NSITableError("no run directories given")
    replies, cont = [], []
    seen: dict[str, str] = {}
    for rd in run_dirs:
        r = read_replies(rd)
        for model in r["model"].unique():
            if model in seen:
                raise NSITableError(f"{Path(rd) / REPLIES}: column model: {model!r} already read from {seen[model]}")
            seen[model] = str(rd)
        replies.append(r)
        c = read_continuous(rd)
        if c is not None:
            cont.append(c)
    rep = pd.concat(replies, ignore_index=True)
    return rep, (pd.concat(cont, ignore_index=True) if cont else None)
