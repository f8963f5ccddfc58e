"""Atomic, durable file writes (one implementation for run directories and `readout score` output): write
a temporary file beside the target, fsync it, rename it over the target, fsync the folder. A kill at any
moment leaves either the old file or the new one, never a torn one; permissions follow the umask.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

TMP_PREFIX = "."
"""Temporary files are `.<target name>.<random>`, hidden and recognizable (see `remove_stale_temps`)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to fill a temporary file, then move it over `path` durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; output files are ordinary files
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def remove_stale_temps(folder: Path, targets) -> list[str]:
    """Delete the temporary files a killed writer left in `folder` for any of the file names `targets`;
    returns their names."""
    removed = []
    if Path(folder).is_dir():
        prefixes = tuple(f"{TMP_PREFIX}{name}." for name in targets)
        for p in Path(folder).iterdir():
            if p.is_file() and p.name.startswith(prefixes):
                p.unlink(missing_ok=True)
                removed.append(p.name)
    return removed
