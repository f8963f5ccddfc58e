"""The steering split (readouts/steer/split.py): disjoint training and held-out parts whose union is the selection,
stratified by family, the same for the same seed and another for another; the run reads the held-out part only and
computes its directions from the training part (readout steer's manifest records both)."""

from panels.schema import load_panel
from readouts.gap.profile import PROFILES
from readouts.profiles import select_units
from readouts.steer.split import split_records


def selection(n=None):
    panel = load_panel("gap-v1")
    return select_units(panel.records, n or PROFILES["quick"].max_units, None, lambda r: r.family)


def test_split_is_disjoint_covering_and_stratified():
    records = selection(30)
    train, held = split_records(records, 0, lambda r: r.family)
    ids_t, ids_h = {r.id for r in train}, {r.id for r in held}
    assert not ids_t & ids_h
    assert ids_t | ids_h == {r.id for r in records}
    assert len(train) == len(records) // 2
    for fam in {r.family for r in records}:
        n = sum(r.family == fam for r in records)
        assert sum(r.family == fam for r in train) == n // 2
        assert sum(r.family == fam for r in held) == n - n // 2


def test_split_is_seeded():
    records = selection(30)
    a = split_records(records, 0, lambda r: r.family)
    b = split_records(list(reversed(records)), 0, lambda r: r.family)
    c = split_records(records, 1, lambda r: r.family)
    assert {r.id for r in a[0]} == {r.id for r in b[0]}
    assert {r.id for r in a[0]} != {r.id for r in c[0]}


def test_the_quick_selection_splits_one_per_family():
    train, held = split_records(selection(), 0, lambda r: r.family)
    assert sorted(r.family for r in train) == sorted(r.family for r in held) == sorted({r.family for r in selection()})
