"""Reading and checking the framing-stability tables (nsi_replies.parquet, nsi_continuous.parquet) and the
model -> group file.

The columns and their dtypes are contract.tables.NSI_REPLIES / NSI_CONTINUOUS (read through
`stats.core.tables`: a missing column, a null in a non-null column or a value of the wrong kind is an
`NSITableError` naming the file and the column); this module checks what the dtypes cannot say: known
framings, polarity consistent with the framing, decision and endorsement consistent with each other.
Several run directories (one model each) are read into one frame.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from contract import FRAMINGS, NEGATED
from contract.tables import NSI_CONTINUOUS, NSI_REPLIES, NSI_TEMPERED
from stats.core.errors import NSITableError
from stats.core.manifest import read_run_manifest
from stats.core.tables import read_table

REPLY_KEY = ("model", "dilemma_id", "framing", "temperature", "sample")  # contract: which declared columns identify a reply
"""The columns that identify one reply (a selection of contract.tables.NSI_REPLIES, not a declaration)."""


def _fail(path: Path, column: str | None, why: str) -> None:
    where = f"{path}: column {column}" if column else str(path)
    raise NSITableError(f"{where}: {why}")


def _read(path: Path, table) -> pd.DataFrame:
    return read_table(path, table, error=NSITableError, file_error=NSITableError)


def _check_common(df: pd.DataFrame, path: Path) -> None:
    bad = sorted(set(df["framing"]) - set(FRAMINGS))
    if bad:
        _fail(path, "framing", f"unknown framings {bad} (expected {', '.join(FRAMINGS)})")
    wrong = df["negated"] != df["framing"].map(NEGATED)
    if wrong.any():
        row = df[wrong].iloc[0]
        _fail(path, "negated", f"{int(wrong.sum())} rows disagree with the framing (e.g. {row['framing']} negated={row['negated']})")
    per_dilemma = df.groupby("dilemma_id")["domain"].nunique()
    if (per_dilemma > 1).any():
        _fail(path, "domain", f"dilemma {per_dilemma[per_dilemma > 1].index[0]} has several domains")


def read_replies(run_dir: str | Path) -> pd.DataFrame:
    """Read and check one run directory's nsi_replies.parquet; adds ``agree`` (float, NaN where not parsed),
    makes ``endorse`` float (NaN where not parsed) and adds ``run_dir``."""
    path = Path(run_dir) / NSI_REPLIES.file
    df = _read(path, NSI_REPLIES)
    _check_common(df, path)
    if df["temperature"].isna().any():
        _fail(path, "temperature", "null values")
    if (df["temperature"] < 0).any():
        _fail(path, "temperature", "negative values")
    ok = df["parse_ok"]
    dec = df["decision"]
    bad_dec = ok & ~dec.isin(["agree", "disagree"]).fillna(False)
    if bad_dec.any():
        _fail(path, "decision", f"{int(bad_dec.sum())} parsed rows without agree/disagree (e.g. {dec[bad_dec].iloc[0]!r})")
    if (~ok & dec.notna()).any():
        _fail(path, "decision", "set on rows with parse_ok false")
    if df.loc[ok, "endorse"].isna().any():
        _fail(path, "endorse", "null on parsed rows")
    is_agree = dec.eq("agree").fillna(False).astype(bool)
    expected = (is_agree != df["negated"]).astype(int)
    endorse = df["endorse"].astype("float64")
    wrong = ok & (endorse != expected)
    if wrong.any():
        _fail(path, "endorse", f"{int(wrong.sum())} rows are not decision XOR negated")
    df["endorse"] = endorse.where(ok)
    df["agree"] = is_agree.astype(float).where(ok)
    dup = df.duplicated(list(REPLY_KEY))
    if dup.any():
        row = df[dup].iloc[0]
        _fail(path, "sample", f"duplicate reply key {tuple(row[k] for k in REPLY_KEY)}")
    df["run_dir"] = str(run_dir)
    return df


def read_continuous(run_dir: str | Path, models=None) -> pd.DataFrame | None:
    """Read and check nsi_continuous.parquet, or None when the run has none. ``models``: the models of the run's
    replies (nsi_replies.parquet); a continuous row naming another model is refused."""
    path = Path(run_dir) / NSI_CONTINUOUS.file
    if not path.is_file():
        return None
    df = read_table(path, NSI_CONTINUOUS, error=NSITableError, file_error=NSITableError, optional=NSI_TEMPERED)
    absent = [c for c in NSI_TEMPERED if c in df.attrs.get("absent", ())]
    if absent and len(absent) != len(NSI_TEMPERED):
        _fail(path, absent[0], "missing while other columns of the tempered reading are present")
    _check_common(df, path)
    other = sorted(set(df["model"]) - set(models)) if models is not None else []
    if other:
        _fail(path, "model", f"{other[0]!r} is not the model of the run's replies "
              f"({', '.join(map(repr, sorted(models)))} in {NSI_REPLIES.file})")
    # No mass on either word (agree + disagree = 0) leaves p_agree undefined: such rows are set aside and
    # counted (df.attrs["undefined"]), not refused; any other non-finite value is an error.
    undefined = ~np.isfinite(df["p_agree"]) & (df["mass_agree"] + df["mass_disagree"] == 0)
    df.attrs["undefined"] = [f"{r.model} {r.dilemma_id} {r.framing}" for r in df[undefined].itertuples()]
    df = df[~undefined].copy()
    _check_reading(df, path, "")
    if absent:
        # A run written before the tempered reading: its columns stay NaN, and the caller says so.
        df.attrs["no_tempered"] = [str(path)]
    else:
        df.attrs["undefined_tempered"] = _check_reading(df, path, "_tempered")
        for col in ("tempered_temperature", "tempered_top_p"):
            if not np.isfinite(df[col]).all() or (df[col] <= 0).any():
                _fail(path, col, "null, non-finite or non-positive values")
    if df.duplicated(["model", "dilemma_id", "framing"]).any():
        _fail(path, "framing", "more than one row per model x dilemma x framing")
    df["run_dir"] = str(run_dir)
    return df


def _check_reading(df: pd.DataFrame, path: Path, suffix: str) -> list[str]:
    """Check one reading's masses and probabilities (suffix "" at T = 1, "_tempered" at the sampling settings).

    At the sampling settings neither word may be in the top-p nucleus (both masses 0): p_agree_tempered is
    then NaN and such reads are returned (named), not refused; at T = 1 the caller has set them aside."""
    masses, p, pe = [f"mass_agree{suffix}", f"mass_disagree{suffix}"], f"p_agree{suffix}", f"p_endorse{suffix}"
    none = (df[masses[0]] + df[masses[1]] == 0) & ~np.isfinite(df[p]) & ~np.isfinite(df[pe])
    for col in (*masses, p, pe):
        v = df.loc[~none, col]
        if v.isna().any() or not np.isfinite(v).all():
            _fail(path, col, "null or non-finite values")
        if ((v < 0) | (v > 1)).any():
            _fail(path, col, "values outside [0, 1]")
    kept = df[~none]
    expected = np.where(kept["negated"], 1.0 - kept[p], kept[p])
    if not np.allclose(kept[pe], expected, atol=1e-6):
        _fail(path, pe, f"is not {p} (or 1 - {p} on negated framings)")
    return [f"{r.model} {r.dilemma_id} {r.framing}" for r in df[none].itertuples()]


def load_runs(run_dirs) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Read several run directories into (replies, continuous or None); one model may not appear twice."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    if not run_dirs:
        raise NSITableError("no run directories given")
    replies, cont = [], []
    seen: dict[str, str] = {}
    for rd in run_dirs:
        read_run_manifest(rd, "nsi")
        r = read_replies(rd)
        for model in r["model"].unique():
            if model in seen:
                raise NSITableError(f"{Path(rd) / NSI_REPLIES.file}: column model: {model!r} already read from {seen[model]}")
            seen[model] = str(rd)
        replies.append(r)
        c = read_continuous(rd, models=r["model"].unique())
        if c is not None:
            cont.append(c)
    rep = pd.concat(replies, ignore_index=True)
    if not cont:
        return rep, None
    merged = pd.concat(cont, ignore_index=True)
    for key in ("undefined", "undefined_tempered", "no_tempered"):
        merged.attrs[key] = [u for c in cont for u in c.attrs.get(key, [])]
    return rep, merged


def read_replies_many(run_dirs) -> pd.DataFrame:
    """The replies of one or several run directories in one frame; a model may come from one run only."""
    run_dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if not run_dirs:
        raise NSITableError("no run directories given")
    parts, seen = [], {}
    for rd in run_dirs:
        r = read_replies(rd)
        for model in r["model"].unique():
            if model in seen:
                raise NSITableError(f"{Path(rd) / NSI_REPLIES.file}: column model: {model!r} already read from {seen[model]}")
            seen[model] = str(rd)
        parts.append(r)
    return pd.concat(parts, ignore_index=True)


def load_params(path) -> dict:
    """Read a model -> parameter count mapping (a JSON object of positive numbers, e.g. billions)."""
    path = Path(path)
    if not path.is_file():
        raise NSITableError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise NSITableError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise NSITableError(f"{path}: expected a JSON object mapping model name to parameter count")
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise NSITableError(f"{path}: model {k!r}: parameter count {v!r} is not a positive number")
    return {str(k): float(v) for k, v in data.items()}


def load_groups(path) -> dict:
    """Read a model -> group mapping from a JSON object file or a CSV with columns ``model`` and ``group``."""
    path = Path(path)
    if not path.is_file():
        raise NSITableError(f"{path}: file not found")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise NSITableError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise NSITableError(f"{path}: expected a JSON object mapping model name to group label")
        return {str(k): v for k, v in data.items()}
    df = pd.read_csv(path, dtype=str)
    for col in ("model", "group"):
        if col not in df.columns:
            raise NSITableError(f"{path}: column {col}: missing")
    if df["model"].duplicated().any():
        raise NSITableError(f"{path}: column model: duplicate {df.loc[df['model'].duplicated(), 'model'].iloc[0]!r}")
    return dict(zip(df["model"], df["group"]))
