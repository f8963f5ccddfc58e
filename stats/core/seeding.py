"""One seeding scheme: a Generator per named analysis, derived from the run's seed and the analysis's name.

Keyed by name (not by call order) so that adding or skipping an analysis never changes the numbers of
another one. A name is hashed to a 32-bit key (CRC-32 of its UTF-8 bytes); an integer is its own key.

The keys enter numpy's SeedSequence in one of two places, and both are kept so that every published
number stays what it was:
- `SPAWN` (the default; the gap paper): the keys extend the seed's spawn key, as `SeedSequence.spawn`
  does, so a `SeedSequence` seed (itself spawned) works too;
- `ENTROPY` (the negation paper): the keys join the seed in the entropy, `default_rng([seed, *keys])`.
"""

from __future__ import annotations

import zlib

import numpy as np

SPAWN = "spawn_key"
ENTROPY = "entropy"


def name_key(name) -> int:
    """The 32-bit key of one name (an int is used as it is)."""
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        return int(name)
    return zlib.crc32(str(name).encode("utf-8"))


def rng_for(seed: int | np.random.SeedSequence, *names, mix: str = SPAWN) -> np.random.Generator:
    """A Generator for the analysis `names` (one or more parts) under `seed`; `mix` says where the keys go."""
    keys = [name_key(n) for n in names]
    if mix == SPAWN:
        base = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
        return np.random.default_rng(np.random.SeedSequence(base.entropy, spawn_key=(*base.spawn_key, *keys)))
    if mix == ENTROPY:
        return np.random.default_rng([int(seed), *keys])
    raise ValueError(f"mix must be {SPAWN!r} or {ENTROPY!r}, not {mix!r}")
