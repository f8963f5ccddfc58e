"""Run directories: the manifest, chunk files written atomically, resume with a manifest check, and the
final merge into probes.parquet and scenarios.parquet.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from engine.errors import ReadoutError

# Manifest fields that must match for a run to resume (everything that changes the numbers).
IDENTITY = ("kind", "model", "template", "letters", "panel", "frames_version", "profile", "readouts", "seed", "sample", "versions")


class ManifestMismatch(ReadoutError):
    """The run directory holds a run made with different settings."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_parquet(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class RunDir:
    """One run directory."""

    def __init__(self, path: str | Path, tables: tuple[str, ...]):
        self.path = Path(path)
        self.chunks = self.path / "chunks"
        self.tables = tuple(tables)
        """Names of the tables a chunk holds, in writing order; the last one written marks it finished."""

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    def read_manifest(self) -> dict | None:
        if not self.manifest_path.exists():
            return None
        try:
            return json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as exc:
            raise ReadoutError(f"{self.manifest_path}: manifest: invalid JSON ({exc.msg})") from None

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_bytes(self.manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())

    def open(self, manifest: dict, force: bool = False) -> list[str]:
        """Start or resume: returns the log lines. Refuses a different manifest unless `force`."""
        old = self.read_manifest()
        log = []
        if old is not None:
            diffs = [k for k in IDENTITY if old.get(k) != manifest.get(k)]
            if diffs and not force:
                raise ManifestMismatch(
                    f"{self.manifest_path}: {diffs[0]}: this run directory holds a run with a different {', '.join(diffs)}; "
                    f"use another --out, or --force to discard it"
                )
            if diffs:
                shutil.rmtree(self.chunks, ignore_errors=True)
                for name in self.tables:
                    (self.path / f"{name}.parquet").unlink(missing_ok=True)
                log.append(f"--force: discarded the previous run (different {', '.join(diffs)})")
            else:
                log.append(f"resuming {self.path}: {len(self.finished())} chunks already finished")
        self.path.mkdir(parents=True, exist_ok=True)
        self.chunks.mkdir(exist_ok=True)
        self.write_manifest({**manifest, "chunks": self.finished(), "complete": False})
        return log

    def chunk_paths(self, index: int) -> tuple[Path, ...]:
        return tuple(self.chunks / f"{name}-{index:05d}.parquet" for name in self.tables)

    def is_finished(self, index: int) -> bool:
        return all(p.exists() for p in self.chunk_paths(index))

    def finished(self) -> list[str]:
        return sorted(p.name for p in self.chunks.glob(f"{self.tables[-1]}-*.parquet")) if self.chunks.exists() else []

    def write_chunk(self, index: int, frames: tuple[pd.DataFrame, ...]) -> None:
        """The tables in order: a chunk counts as finished only once the last one exists."""
        for path, frame in zip(self.chunk_paths(index), frames, strict=True):
            atomic_write_parquet(path, frame)

    def merge(self, n_chunks: int) -> tuple[pd.DataFrame, ...]:
        """Concatenate every chunk of each table and write `<table>.parquet`; returns the tables."""
        parts: list[list[pd.DataFrame]] = [[] for _ in self.tables]
        for i in range(n_chunks):
            paths = self.chunk_paths(i)
            if not all(p.exists() for p in paths):
                raise ReadoutError(f"{paths[-1]}: chunk: missing; the run is not complete (run the same command again)")
            for part, path in zip(parts, paths):
                part.append(pd.read_parquet(path))
        merged = tuple(pd.concat(part, ignore_index=True) for part in parts)
        for name, frame in zip(self.tables, merged):
            atomic_write_parquet(self.path / f"{name}.parquet", frame)
        return merged
