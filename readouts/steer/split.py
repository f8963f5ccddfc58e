"""The three-way split of `readout steer`: the direction part (the steering direction is computed from it), the
selection part (the layer and strength are chosen on it by the rule the manifest records) and the test part (the
verdict is read on it only). Within each stratum (family) the records are put in a seeded order; strata follow each
other in sorted order, and each record in turn goes to the part whose share is furthest behind its fraction (largest
remainder): every part's total is within one of its share, and so is every family's count in a part where the
fractions are equal (the parts then take turns; within two otherwise). The parts are disjoint and together the whole
selection; the same seed gives the same split."""

from __future__ import annotations

import random
from typing import Callable, Sequence

from contract.names import STEER_PARTS

PARTS = STEER_PARTS
"""The parts, in the order their fractions are given."""


def split_parts(records: Sequence, seed: int, stratum: Callable,
                fractions: Sequence[float] = (1 / 3, 1 / 3, 1 / 3)) -> tuple[list, list, list]:
    """(direction, selection, test) records, each in the selection's order."""
    total = float(sum(fractions))
    share = [f / total for f in fractions]
    by: dict = {}
    for r in records:
        by.setdefault(stratum(r), []).append(r)
    order = []
    for key in sorted(by):
        members = sorted(r.id for r in by[key])
        random.Random(f"steer-split|{seed}|{key}").shuffle(members)
        order += members
    counts, part_of = [0] * len(share), {}
    for j, rid in enumerate(order):
        k = max(range(len(share)), key=lambda p: (share[p] * (j + 1) - counts[p], -p))
        counts[k] += 1
        part_of[rid] = k
    return tuple([r for r in records if part_of[r.id] == k] for k in range(len(share)))  # type: ignore[return-value]
