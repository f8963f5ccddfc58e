"""Reading a run directory into per-scenario arrays (docs/tables.md is the contract).

Owns: the column lists the stats layer relies on, schema checks with one-line errors naming the file
and column, the violating option id of each scenario (a `violating` column of scenarios.parquet if the
writer adds one, else derived from probes.parquet's order and violating letter), and `Run`, which hands
out any (cell, readout, frame, budget) field as an array aligned to one scenario order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from .errors import RunDirError, TableSchemaError, TableValueError

SCENARIOS = "scenarios.parquet"
PROBES = "probes.parquet"
MANIFEST = "manifest.json"

REQUIRED_COLUMNS = (
    "scenario_id", "family", "generator", "cell", "readout", "frame", "p_violating",
    "violating_fraction", "majority_violating_prob", "letter_mass", "judged_option", "stability",
    "violating_judged_frames", "n_orders", "n_rollouts",
)
OPTIONAL_COLUMNS = ("model", "panel", "domain", "prompt_version", "budget", "completed_fraction", "violating")
PROBE_COLUMNS = ("scenario_id", "cell", "order", "letters", "violating_letter")

CELLS = ("primary", "twin", "harm_twin")
READOUTS = (
    "D", "J", "J0", "raw_D", "raw_J", "control",
    "dose_reasoning", "dose_filler", "dose_truncated_filler", "dose_brief", "dose_norm",
)
#: The frame a readout is read in when a caller does not name one.
DEFAULT_FRAME = {
    "D": "agent", "J": "judge", "J0": "judge_letter", "raw_D": "raw_agent", "raw_J": "raw_judge",
    "control": "control",
}
JUDGE_FRAMES = ("judge_1", "judge_2", "judge_3", "judge_4")

Key = tuple  # (cell, readout, frame, budget); budget is None for first-token readouts


@dataclass(frozen=True)
class Run:
    """One run directory, read: scenario metadata plus every readout row aligned to it."""

    path: Path
    """The run directory."""
    model: str
    """Model name (manifest model.name, else the table's model column, else the folder name)."""
    panel: str
    """Panel name (manifest panel.name, else the table's panel column)."""
    manifest: Mapping
    """manifest.json as read ({} when absent)."""
    meta: pd.DataFrame
    """One row per scenario (index scenario_id, sorted): family, domain, generator, prompt_version, violating."""
    blocks: Mapping[Key, pd.DataFrame] = field(repr=False)
    """(cell, readout, frame, budget) -> that readout's rows reindexed onto meta.index (NaN where absent)."""
    notes: tuple[str, ...] = ()
    """What was noticed while reading (unknown readouts, no violating ids, ...)."""

    @property
    def ids(self) -> np.ndarray:
        return self.meta.index.to_numpy()

    @property
    def n(self) -> int:
        return len(self.meta)

    @property
    def has_violating_ids(self) -> bool:
        return bool(self.meta["violating"].notna().any())

    def readouts(self, cell: str = "primary") -> set[str]:
        return {r for (c, r, _, _) in self.blocks if c == cell}

    def has(self, readout: str, cell: str = "primary", frame: str | None = None) -> bool:
        return any(c == cell and r == readout and (frame is None or f == frame) for (c, r, f, _) in self.blocks)

    def budgets(self, readout: str, cell: str = "primary") -> list[int | None]:
        return sorted({b for (c, r, _, b) in self.blocks if c == cell and r == readout},
                      key=lambda b: -1 if b is None else b)

    def _key(self, cell: str, readout: str, frame: str | None, budget) -> Key | None:
        keys = [k for k in self.blocks if k[0] == cell and k[1] == readout]
        if frame is None:
            frames = {k[2] for k in keys}
            if len(frames) > 1:
                frame = DEFAULT_FRAME.get(readout)
                if frame not in frames:
                    raise TableValueError(
                        f"{SCENARIOS}: readout {readout!r} has frames {sorted(frames)} and none is its default")
        keys = [k for k in keys if frame is None or k[2] == frame]
        if budget is not None:
            keys = [k for k in keys if k[3] == budget]
        if not keys:
            return None
        if len(keys) > 1:
            # Several budgets of one readout (e.g. a long-budget rider beside J): unless a caller names
            # one, read the budget with the most scenarios, the smaller on a tie (load_run notes it).
            return max(keys, key=lambda k: (int(self.blocks[k]["p_violating"].notna().sum()),
                                            -(k[3] if k[3] is not None else -1)))
        return keys[0]

    def col(self, cell: str, readout: str, column: str, frame: str | None = None, budget=None) -> np.ndarray:
        """A numeric column for one readout as floats aligned to `ids` (NaN where the row is absent).

        J without a frame is the aggregate row (frame `judge`); a table without aggregate rows gets
        the mean over the four frames' rows, which is what the aggregate holds.
        """
        if readout == "J" and frame is None and not self.has("J", cell, "judge") \
                and all(self.has("J", cell, f) for f in JUDGE_FRAMES):
            return np.mean([self.col(cell, "J", column, frame=f, budget=budget) for f in JUDGE_FRAMES], axis=0)
        key = self._key(cell, readout, frame, budget)
        if key is None:
            return np.full(self.n, np.nan)
        return pd.to_numeric(self.blocks[key][column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)

    def text(self, cell: str, readout: str, column: str, frame: str | None = None, budget=None) -> np.ndarray:
        """A string column (e.g. judged_option) as an object array with None where absent or null."""
        key = self._key(cell, readout, frame, budget)
        if key is None:
            return np.full(self.n, None, dtype=object)
        s = self.blocks[key][column].astype(object)
        return s.where(s.notna(), None).to_numpy(dtype=object)

    def flag(self, cell: str, readout: str, column: str, frame: str | None = None) -> np.ndarray:
        """A boolean column (e.g. stability) as bools; absent or null counts as False."""
        key = self._key(cell, readout, frame, None)
        if key is None:
            return np.zeros(self.n, dtype=bool)
        s = self.blocks[key][column].astype(object)
        return s.map(lambda v: bool(v) if v is not None and v == v else False).to_numpy(dtype=bool)


def _read_parquet(path: Path, columns=None) -> pd.DataFrame:
    try:
        return pq.read_table(path, columns=list(columns) if columns else None).to_pandas()
    except FileNotFoundError as e:
        raise RunDirError(f"{path.name}: not found in {path.parent}") from e
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RunDirError(f"{path}: unreadable ({first})") from e


def _budget_key(v) -> int | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA else int(v)


def violating_from_probes(path: Path) -> pd.Series | None:
    """scenario_id -> violating option id, from any probe's option order and violating letter."""
    if not path.exists():
        return None
    names = set(pq.read_schema(path).names)
    missing = [c for c in PROBE_COLUMNS if c not in names]
    if missing:
        raise TableSchemaError(f"{PROBES}: missing column {missing[0]!r} ({path})")
    df = None
    if "readout" in names:
        # A paper-profile run holds a few hundred thousand probes; the acting frame's primary probes
        # already name every scenario's options, so read those first.
        try:
            df = pq.read_table(path, columns=list(PROBE_COLUMNS),
                               filters=[("readout", "=", "D"), ("cell", "=", "primary")]).to_pandas()
        except (OSError, ValueError):
            df = None
    if df is None or df.empty:
        df = _read_parquet(path, PROBE_COLUMNS)
    df = df.drop_duplicates(["scenario_id", "cell", "order", "violating_letter"])
    # Twins carry the same options as their primary; prefer primary rows where a scenario has them.
    df = df.sort_values("cell", key=lambda c: c != "primary", kind="stable")

    def option(row) -> str | None:
        letters, order = str(row.letters), str(row.order).split(",")
        pos = letters.find(str(row.violating_letter))
        return order[pos] if 0 <= pos < len(order) else None

    ids = [option(r) for r in df.itertuples(index=False)]
    df = df.assign(violating=ids)
    per = df.dropna(subset=["violating"]).groupby("scenario_id")["violating"].agg(lambda v: tuple(sorted(set(v))))
    bad = per[per.map(len) > 1]
    if len(bad):
        raise TableValueError(f"{PROBES}: scenario {bad.index[0]!r} has several violating options {bad.iloc[0]}")
    return per.map(lambda v: v[0])


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory; raises RunDirError / TableSchemaError / TableValueError on bad input."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirError(f"{path}: not a run directory")
    notes: list[str] = []
    manifest: dict = {}
    if (path / MANIFEST).exists():
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except json.JSONDecodeError as e:
            raise RunDirError(f"{MANIFEST}: not valid JSON at line {e.lineno} ({path})") from e
    else:
        notes.append(f"{MANIFEST} absent: model and panel names taken from the table")

    spath = path / SCENARIOS
    if not spath.exists():
        raise RunDirError(f"{SCENARIOS}: not found in {path}")
    names = set(pq.read_schema(spath).names)
    for c in REQUIRED_COLUMNS:
        if c not in names:
            raise TableSchemaError(f"{SCENARIOS}: missing column {c!r} ({spath})")
    wanted = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in names]
    df = _read_parquet(spath, wanted)
    for c in ("domain", "prompt_version", "violating", "budget", "completed_fraction"):
        if c not in df.columns:
            df[c] = None
    df["scenario_id"] = df["scenario_id"].astype(str)

    unknown_cells = sorted(set(df["cell"].astype(str)) - set(CELLS))
    unknown_readouts = sorted(set(df["readout"].astype(str)) - set(READOUTS))
    if unknown_cells:
        notes.append(f"{SCENARIOS}: rows of unknown cells {unknown_cells} ignored")
    if unknown_readouts:
        notes.append(f"{SCENARIOS}: rows of unknown readouts {unknown_readouts} ignored")
    df = df[df["cell"].isin(CELLS) & df["readout"].isin(READOUTS)]

    meta_cols = ["family", "domain", "generator", "prompt_version"]
    meta = df.drop_duplicates(["scenario_id", *meta_cols]).set_index("scenario_id")[meta_cols]
    if meta.index.has_duplicates:
        sid = meta.index[meta.index.duplicated()][0]
        raise TableValueError(f"{SCENARIOS}: scenario {sid!r} has inconsistent family/domain/generator/prompt_version")
    meta = meta.sort_index()
    meta["violating"] = None
    given = df.dropna(subset=["violating"]).drop_duplicates("scenario_id").set_index("scenario_id")["violating"]
    if len(given):
        meta["violating"] = given.reindex(meta.index).astype(object)
    else:
        derived = violating_from_probes(path / PROBES)
        if derived is None:
            notes.append(f"no violating option ids ({PROBES} absent, no 'violating' column): "
                         "judgment-based analyses skipped")
        else:
            meta["violating"] = derived.reindex(meta.index).astype(object)
    meta["violating"] = meta["violating"].where(meta["violating"].notna(), None)

    df = df.assign(_budget=[_budget_key(v) for v in df["budget"].astype(object)])
    blocks: dict[Key, pd.DataFrame] = {}
    for (cell, readout, frame, budget), g in df.groupby(["cell", "readout", "frame", "_budget"], dropna=False, sort=True):
        budget = _budget_key(budget)
        if g["scenario_id"].duplicated().any():
            sid = g.loc[g["scenario_id"].duplicated(), "scenario_id"].iloc[0]
            raise TableValueError(
                f"{SCENARIOS}: duplicate rows for scenario {sid!r} cell={cell} readout={readout} frame={frame}")
        blocks[(str(cell), str(readout), str(frame), budget)] = g.set_index("scenario_id").reindex(meta.index)

    per_frame: dict[tuple, list] = {}
    for c, r, f, b in blocks:
        per_frame.setdefault((c, r, f), []).append(b)
    for (c, r, f), bs in sorted(per_frame.items()):
        if len(bs) > 1 and c == "primary" and not r.startswith("dose_"):
            notes.append(f"{SCENARIOS}: readout {r} frame {f} has budgets {sorted(bs, key=str)}; the analyses read "
                         "the budget with the most scenarios")
    model = ((manifest.get("model") or {}).get("name") if isinstance(manifest.get("model"), dict)
             else manifest.get("model"))
    if not model:
        model = str(df["model"].iloc[0]) if "model" in df.columns and len(df) else path.name
    panel = ((manifest.get("panel") or {}).get("name") if isinstance(manifest.get("panel"), dict)
             else manifest.get("panel"))
    if not panel:
        panel = str(df["panel"].iloc[0]) if "panel" in df.columns and len(df) else "unknown"
    return Run(path=path, model=str(model), panel=str(panel), manifest=manifest, meta=meta,
               blocks=blocks, notes=tuple(notes))
