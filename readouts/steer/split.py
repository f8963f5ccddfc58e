"""The training / held-out split of `readout steer`: within each stratum (family) the records in a seeded order,
the first half (rounded down, at least one when a stratum has two or more) for training, the rest held out. The
two parts are disjoint and together the whole selection; the same seed gives the same split."""

from __future__ import annotations

import random
from typing import Callable, Sequence


def split_records(records: Sequence, seed: int, stratum: Callable, train_fraction: float = 0.5) -> tuple[list, list]:
    """(training records, held-out records), each in the selection's order."""
    by: dict = {}
    for r in records:
        by.setdefault(stratum(r), []).append(r)
    train_ids = set()
    for key in sorted(by):
        members = sorted(r.id for r in by[key])
        random.Random(f"steer-split|{seed}|{key}").shuffle(members)
        k = int(len(members) * train_fraction)
        if len(members) >= 2:
            k = max(1, min(k, len(members) - 1))
        train_ids.update(members[:k])
    train = [r for r in records if r.id in train_ids]
    held = [r for r in records if r.id not in train_ids]
    return train, held
