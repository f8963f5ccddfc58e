"""Reading a run directory into per-scenario arrays (contract.tables.SCENARIOS is the table's contract).

Owns: reading scenarios.parquet as the contract declares it (every declared column, typed; a missing one
is a schema error naming the file and the column), the per-scenario metadata (including `violating`, the
violating option's id, which the writer puts on every row), and `Run`, which hands out any (cell,
readout, frame, budget) field as an array aligned to one scenario order. Rows of every contract cell and
readout are kept (the analyses here read primary, twin and harm_twin); rows of unknown ones are noted and
left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from contract import CELLS, JUDGE_AGGREGATE, JUDGE_FRAMES
from contract.tables import SCENARIO_META, SCENARIOS
from stats.core.errors import RunDirError, TableSchemaError, TableValueError
from stats.core.manifest import read_run_manifest
from stats.core.tables import read_table
from stats.gap.names import DEFAULT_FRAME, DOSE, PRIMARY, READOUT_NAMES, J

ID_COLUMNS = ("model", "panel", "scenario_id")
META_COLUMNS = tuple(c.name for c in SCENARIO_META if c.name not in ID_COLUMNS)
"""The contract's per-scenario columns besides the ids (family, domain, generator, prompt_version, violating, metadata):
equal on every row of a scenario."""

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
    nonfinite: tuple[str, ...] = ()
    """Rows whose masses are not finite ("scenario cell readout/frame"): they count as missing values."""
    """What was noticed while reading (unknown readouts, several budgets, ...)."""

    @property
    def ids(self) -> np.ndarray:
        return self.meta.index.to_numpy()

    @property
    def n(self) -> int:
        return len(self.meta)

    def readouts(self, cell: str = PRIMARY) -> set[str]:
        return {r for (c, r, _, _) in self.blocks if c == cell}

    def has(self, readout: str, cell: str = PRIMARY, frame: str | None = None) -> bool:
        return any(c == cell and r == readout and (frame is None or f == frame) for (c, r, f, _) in self.blocks)

    def budgets(self, readout: str, cell: str = PRIMARY) -> list[int | None]:
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
                        f"{SCENARIOS.file}: readout {readout!r} has frames {sorted(frames)} and none is its default")
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

    def _block(self, cell: str, readout: str, column: str, frame: str | None, budget) -> pd.Series | None:
        if column not in SCENARIOS.names:
            raise KeyError(f"column {column!r} is not declared in contract.tables.SCENARIOS")
        key = self._key(cell, readout, frame, budget)
        return None if key is None else self.blocks[key][column]

    def col(self, cell: str, readout: str, column: str, frame: str | None = None, budget=None) -> np.ndarray:
        """A numeric column for one readout as floats aligned to `ids` (NaN where the row is absent).

        J without a frame is the aggregate row (frame `judge`); a table without aggregate rows gets
        the mean over the four frames' rows, which is what the aggregate holds.
        """
        if readout == J and frame is None and not self.has(J, cell, JUDGE_AGGREGATE) \
                and all(self.has(J, cell, f) for f in JUDGE_FRAMES):
            return np.mean([self.col(cell, J, column, frame=f, budget=budget) for f in JUDGE_FRAMES], axis=0)
        s = self._block(cell, readout, column, frame, budget)
        if s is None:
            return np.full(self.n, np.nan)
        return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)

    def text(self, cell: str, readout: str, column: str, frame: str | None = None, budget=None) -> np.ndarray:
        """A string column (e.g. judged_option) as an object array with None where absent or null."""
        s = self._block(cell, readout, column, frame, budget)
        if s is None:
            return np.full(self.n, None, dtype=object)
        s = s.astype(object)
        return s.where(s.notna(), None).to_numpy(dtype=object)

    def flag(self, cell: str, readout: str, column: str, frame: str | None = None) -> np.ndarray:
        """A boolean column (e.g. stability) as bools; absent or null counts as False."""
        s = self._block(cell, readout, column, frame, None)
        if s is None:
            return np.zeros(self.n, dtype=bool)
        return s.astype("boolean").fillna(False).to_numpy(dtype=bool)


def _budget_key(v) -> int | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA else int(v)


def _meta(df: pd.DataFrame) -> pd.DataFrame:
    """One row per scenario of the per-scenario columns, sorted by id; inconsistent rows are an error."""
    meta = df.drop_duplicates(["scenario_id", *META_COLUMNS]).set_index("scenario_id")[list(META_COLUMNS)]
    if meta.index.has_duplicates:
        sid = meta.index[meta.index.duplicated()][0]
        raise TableValueError(f"{SCENARIOS.file}: scenario {sid!r} has inconsistent {'/'.join(META_COLUMNS)}")
    meta = meta.sort_index()
    meta["violating"] = meta["violating"].astype(object)
    return meta


def _blocks(df: pd.DataFrame, index: pd.Index) -> dict[Key, pd.DataFrame]:
    df = df.assign(_budget=[_budget_key(v) for v in df["budget"].astype(object)])
    blocks: dict[Key, pd.DataFrame] = {}
    for (cell, readout, frame, budget), g in df.groupby(["cell", "readout", "frame", "_budget"], dropna=False, sort=True):
        budget = _budget_key(budget)
        if g["scenario_id"].duplicated().any():
            sid = g.loc[g["scenario_id"].duplicated(), "scenario_id"].iloc[0]
            raise TableValueError(
                f"{SCENARIOS.file}: duplicate rows for scenario {sid!r} cell={cell} readout={readout} frame={frame}")
        blocks[(str(cell), str(readout), str(frame), budget)] = g.set_index("scenario_id").reindex(index)
    return blocks


def _budget_notes(blocks: Mapping[Key, pd.DataFrame]) -> list[str]:
    per_frame: dict[tuple, list] = {}
    for c, r, f, b in blocks:
        per_frame.setdefault((c, r, f), []).append(b)
    return [f"{SCENARIOS.file}: readout {r} frame {f} has budgets {sorted(bs, key=str)}; the analyses read the "
            "budget with the most scenarios"
            for (c, r, f), bs in sorted(per_frame.items()) if len(bs) > 1 and c == PRIMARY and r not in DOSE]


def _name(manifest: Mapping, key: str, df: pd.DataFrame, fallback: str) -> str:
    """The model or panel name: the manifest's (a dict with `name`, or a string), else the table's."""
    value = manifest.get(key)
    value = (value or {}).get("name") if isinstance(value, dict) else value
    if not value:
        value = str(df[key].iloc[0]) if len(df) else fallback
    return str(value)


def _read(path: Path) -> tuple[dict, pd.DataFrame, list[str]]:
    """A run directory's manifest, its scenarios table (typed by the contract) and the notes on reading it."""
    if not path.is_dir():
        raise RunDirError(f"{path}: not a run directory")
    manifest, notes = read_run_manifest(path, "judgment-action")
    df = read_table(path / SCENARIOS.file, SCENARIOS, error=TableSchemaError, file_error=RunDirError)
    return manifest, df, list(notes)


def _build(path: Path, manifest: Mapping, df: pd.DataFrame, notes: list[str]) -> Run:
    bad = df[~np.isfinite(df["p_violating"].astype(float)) | ~np.isfinite(df["letter_mass"].astype(float))]
    nonfinite = tuple(f"{r.scenario_id} {r.cell} {r.readout}/{r.frame}" for r in bad.itertuples())
    if nonfinite:
        notes.append(f"{SCENARIOS.file}: {len(bad)} rows with a non-finite p_violating or letter_mass count as missing in "
                     f"every estimate (e.g. {', '.join(nonfinite[:5])})")

    unknown_cells = sorted(set(df["cell"].astype(str)) - set(CELLS))
    unknown_readouts = sorted(set(df["readout"].astype(str)) - set(READOUT_NAMES))
    if unknown_cells:
        notes.append(f"{SCENARIOS.file}: rows of unknown cells {unknown_cells} ignored")
    if unknown_readouts:
        notes.append(f"{SCENARIOS.file}: rows of unknown readouts {unknown_readouts} ignored")
    df = df[df["cell"].isin(CELLS) & df["readout"].isin(READOUT_NAMES)]

    meta = _meta(df)
    blocks = _blocks(df, meta.index)
    notes += _budget_notes(blocks)
    return Run(path=path, model=_name(manifest, "model", df, path.name), panel=_name(manifest, "panel", df, "unknown"),
               manifest=manifest, meta=meta, blocks=blocks, notes=tuple(notes), nonfinite=nonfinite)


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory; raises RunDirError / TableSchemaError / TableValueError on bad input."""
    path = Path(run_dir)
    manifest, df, notes = _read(path)
    return _build(path, manifest, df, notes)


def pool_runs(run_dirs, name: str, path: str | Path | None = None) -> Run:
    """The union of several run directories of one model (pods of one study, the paper's Table 12 union):
    their scenarios pooled as one run named `name`. A scenario read in several runs counts once, from the
    first run given that holds it (the paper re-ran its pilot scenarios in the full-panel pod); runs of
    different models, or exact and sampled runs, do not pool (TableValueError)."""
    paths = [Path(d) for d in run_dirs]
    read = [_read(p) for p in paths]
    models = {_name(m, "model", df, p.name) for p, (m, df, _) in zip(paths, read)}
    if len(models) > 1:
        raise TableValueError(f"--pool {name}: the runs are of different models ({', '.join(sorted(models))})")
    if len({bool(m.get("sample", False)) for m, _, _ in read}) > 1:
        raise TableValueError(f"--pool {name}: exact and sampled (--sample) runs do not pool")
    seen: set = set()
    frames, notes = [], []
    for p, (_, df, run_notes) in zip(paths, read):
        ids = set(df["scenario_id"])
        dup = ids & seen
        if dup:
            notes.append(f"pool {name}: {len(dup)} scenarios of {p} were already read in an earlier run and count once")
        frames.append(df[~df["scenario_id"].isin(dup)])
        seen |= ids
        notes += [f"{p}: {n}" for n in run_notes]
    manifest = dict(read[0][0])
    manifest["panel"] = {"name": name}
    manifest["pooled_from"] = [str(p) for p in paths]
    out = Path(path) if path is not None else paths[0].parent / name
    return _build(out, manifest, pd.concat(frames, ignore_index=True), notes)
