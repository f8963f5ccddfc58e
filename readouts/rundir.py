"""Run directories: the manifest, a lock, chunk files that prove what they are, resume with a manifest
check, and the final merge into the study's tables.

A chunk file carries in its parquet metadata the run's identity hash, its index, the ids of the records it
covers, its row count and its table name; a chunk is finished only when every table's file is there and
says so. Anything else (unreadable, truncated, another run's, another index's, rows dropped) is moved to
`chunks/rejected/` and recomputed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import ReadoutError
from readouts.atomic import atomic_write, atomic_write_bytes, remove_stale_temps

# Manifest fields that must match for a run to resume (everything that changes the numbers).
IDENTITY = ("kind", "model", "device", "engine", "template", "letters", "panel", "frames_version", "profile", "readouts",
            "seed", "sample", "versions")
LATER_IDENTITY = ("steering",)
"""Identity fields of some studies only (`readout steer`): part of the hash when the manifest has them, so that
the other studies' hashes (and their runs' resume) are unchanged."""
META_KEY = b"logit_readout_chunk"


class ManifestMismatch(ReadoutError):
    """The run directory holds a run made with different settings."""


class RunLocked(ReadoutError):
    """Another process holds the run directory (or the chunk) this process needs."""


def identity_hash(manifest: dict) -> str:
    """sha256 of the manifest's identity fields: what a chunk must have been computed under."""
    ident = {k: manifest.get(k) for k in IDENTITY}
    ident.update({k: manifest[k] for k in LATER_IDENTITY if k in manifest})
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def _flock(path: Path, exclusive: bool, what: str):
    """A held advisory lock on `path` (released by the OS when the process dies: no stale locks)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise RunLocked(f"{path.parent}: lock: {what} is in use by another process ({holder}); "
                            f"wait for it to finish, or use another --out") from None
        raise
    if exclusive:
        fh.seek(0)
        fh.truncate()
    fh.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
    fh.flush()
    return fh


class RunDir:
    """One run directory."""

    def __init__(self, path: str | Path, tables: tuple[str, ...]):
        self.path = Path(path)
        self.chunks = self.path / "chunks"
        self.tables = tuple(tables)
        """Names of the tables a chunk holds, in writing order; the last one written marks it finished."""
        self.identity: str | None = None
        """The identity hash chunks must carry (set by `open`, or by `expect`)."""

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    # -- locks -------------------------------------------------------------------------------------
    @contextmanager
    def lock(self, exclusive: bool = True):
        """Hold the run directory: exclusively (a whole run, --force, merge) or shared (shards and ranks of
        one run, each of which also locks the chunk it computes)."""
        fh = _flock(self.path / ".lock", exclusive, "this run directory")
        try:
            yield
        finally:
            fh.close()

    @contextmanager
    def chunk_lock(self, index: int):
        fh = _flock(self.chunks / f".chunk-{index:05d}.lock", True, f"chunk {index + 1}")
        try:
            yield
        finally:
            fh.close()

    # -- manifest ----------------------------------------------------------------------------------
    def read_manifest(self) -> dict | None:
        if not self.manifest_path.exists():
            return None
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ReadoutError(f"{self.manifest_path}: manifest: not valid JSON ({exc}); --force discards the run") from None
        if not isinstance(manifest, dict):
            raise ReadoutError(f"{self.manifest_path}: manifest: not a JSON object; --force discards the run")
        return manifest

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_bytes(self.manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())

    def open(self, manifest: dict, force: bool = False) -> list[str]:
        """Start or resume: returns the log lines. Refuses a different manifest unless `force`."""
        log = []
        try:
            old = self.read_manifest()
        except ReadoutError:
            if not force:
                raise
            old, log = {}, ["--force: discarded a run whose manifest was unreadable"]
        if old is not None:
            diffs = [k for k in (*IDENTITY, *LATER_IDENTITY) if old.get(k) != manifest.get(k)] if old else ["manifest"]
            if diffs and not force:
                raise ManifestMismatch(
                    f"{self.manifest_path}: {diffs[0]}: this run directory holds a run with a different {', '.join(diffs)}; "
                    f"use another --out, or --force to discard it"
                )
            if diffs:
                self.discard(old)
                if old:
                    log.append(f"--force: discarded the previous run (different {', '.join(diffs)})")
            else:
                log.append(f"resuming {self.path}: {len(self.finished())} chunks already finished")
        self.path.mkdir(parents=True, exist_ok=True)
        self.chunks.mkdir(exist_ok=True)
        stale = remove_stale_temps(self.path, ["manifest.json", *(f"{t}.parquet" for t in self.tables)])
        stale += remove_stale_temps(self.chunks, [p.name for i in range(manifest.get("n_chunks") or 0) for p in self.chunk_paths(i)])
        if stale:
            log.append(f"removed {len(stale)} temporary files a killed writer left")
        self.identity = identity_hash(manifest)
        self.write_manifest({**manifest, "identity": self.identity, "chunks": self.finished(), "complete": False})
        return log

    def discard(self, old: dict) -> None:
        """Remove a previous run's chunks and every table it (or this run) names."""
        shutil.rmtree(self.chunks, ignore_errors=True)
        names = set(self.tables) | set(old.get("tables") or ())
        for name in names:
            (self.path / f"{name}.parquet").unlink(missing_ok=True)
        if not old:  # an unreadable manifest names nothing: remove every table file
            for p in self.path.glob("*.parquet"):
                p.unlink()

    # -- chunks ------------------------------------------------------------------------------------
    def chunk_paths(self, index: int) -> tuple[Path, ...]:
        return tuple(self.chunks / f"{name}-{index:05d}.parquet" for name in self.tables)

    def problem(self, index: int, records: list[str] | None = None) -> str | None:
        """Why chunk `index` is not a finished chunk of this run (None: it is). `records`: the ids it must cover."""
        for name, path in zip(self.tables, self.chunk_paths(index)):
            if not path.exists():
                return "missing"
            try:
                meta = pq.read_metadata(path)
                info = json.loads((meta.metadata or {}).get(META_KEY, b"null"))
            except (OSError, ValueError, pa.ArrowException) as exc:
                return f"{path.name} unreadable ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
            if not isinstance(info, dict):
                return f"{path.name} carries no chunk identity"
            if info.get("table") != name or info.get("index") != index:
                return f"{path.name} holds chunk {info.get('index')} of table {info.get('table')}"
            if self.identity is not None and info.get("identity") != self.identity:
                return f"{path.name} was computed by another run (identity differs)"
            if records is not None and info.get("records") != list(records):
                return f"{path.name} covers other records"
            if info.get("rows") != meta.num_rows:
                return f"{path.name} holds {meta.num_rows} rows, written with {info.get('rows')}"
        return None

    def is_finished(self, index: int, records: list[str] | None = None) -> bool:
        return self.problem(index, records) is None

    def reject(self, index: int) -> None:
        """Move chunk `index`'s files aside (kept for inspection, never read again)."""
        rejected = self.chunks / "rejected"
        rejected.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for path in self.chunk_paths(index):
            if path.exists():
                path.replace(rejected / f"{path.name}.{stamp}")

    def finished(self) -> list[str]:
        return sorted(p.name for p in self.chunks.glob(f"{self.tables[-1]}-*.parquet")) if self.chunks.exists() else []

    def write_chunk(self, index: int, frames: tuple[pd.DataFrame, ...], records: list[str]) -> None:
        """The tables in order, each stamped with the chunk's identity: finished once the last one exists."""
        for name, path, frame in zip(self.tables, self.chunk_paths(index), frames, strict=True):
            info = {"identity": self.identity, "index": index, "records": list(records), "rows": len(frame), "table": name}
            table = pa.Table.from_pandas(frame, preserve_index=False)
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(info).encode()})
            atomic_write(path, lambda tmp, table=table: pq.write_table(table, tmp))

    def merge(self, chunk_records: list[list[str]]) -> tuple[pd.DataFrame, ...]:
        """Check every chunk, concatenate each table and write `<table>.parquet`; returns the tables."""
        parts: list[list[pd.DataFrame]] = [[] for _ in self.tables]
        for i, records in enumerate(chunk_records):
            why = self.problem(i, records)
            if why is not None:
                raise ReadoutError(f"{self.chunk_paths(i)[-1]}: chunk {i + 1}: {why}; run the same command again to recompute it")
            for part, path in zip(parts, self.chunk_paths(i)):
                part.append(pd.read_parquet(path))
        merged = tuple(pd.concat(part, ignore_index=True) for part in parts)
        for name, frame in zip(self.tables, merged):
            atomic_write(self.path / f"{name}.parquet", lambda tmp, frame=frame: frame.to_parquet(tmp, index=False))
        return merged
