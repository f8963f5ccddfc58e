"""Where the engine keeps what it builds or converts: one cache folder, overridable by environment."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


def cache_root() -> Path:
    """Folder for built tiny models and the converted embedded model.

    `LOGIT_READOUT_CACHE` overrides the default `~/.cache/logit-readout` (tests point it at a
    session folder; a cluster points it at shared scratch).
    """
    env = os.environ.get("LOGIT_READOUT_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "logit-readout"
    return root.expanduser()


@contextlib.contextmanager
def build_lock(name: str):
    """Exclusive lock around building `name` in the cache, so parallel test workers or ranks build once."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def staging_dir(final: Path) -> Path:
    """A fresh folder beside `final` to build into before renaming it there, with the permissions the umask
    gives new folders (mkdtemp makes 0700, which would make a shared cache private to one user)."""
    import tempfile

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    mask = os.umask(0)
    os.umask(mask)
    tmp.chmod(0o777 & ~mask)
    return tmp
