"""The steering split (readouts/steer/split.py): disjoint direction, selection and test parts whose union is the
selection, stratified by family (each family's count in a part within one of its share for equal fractions), each
part's total within one of its fraction for unequal ones, the same for the same seed and another for another; the
run reads the selection and test parts only and computes its directions from the direction part (readout steer's
manifest records all three)."""

from collections import Counter

from panels.schema import load_panel
from readouts.gap.profile import PROFILES
from readouts.profiles import select_units
from readouts.steer.split import split_parts


def selection(n=None):
    panel = load_panel("gap-v1")
    return select_units(panel.records, n or PROFILES["quick"].max_units, None, lambda r: r.family)


def test_split_is_disjoint_covering_and_stratified():
    records = selection(30)
    parts = split_parts(records, 0, lambda r: r.family)
    ids = [{r.id for r in p} for p in parts]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]
    assert ids[0] | ids[1] | ids[2] == {r.id for r in records}
    assert sorted(map(len, parts)) == [10, 10, 10]
    for fam, n in Counter(r.family for r in records).items():
        for p in parts:
            assert abs(sum(r.family == fam for r in p) - n / 3) < 1, (fam, n)


def test_unequal_fractions_give_each_part_its_share():
    records = selection(30)
    parts = split_parts(records, 0, lambda r: r.family, (0.5, 0.25, 0.25))
    for p, f in zip(parts, (0.5, 0.25, 0.25)):
        assert abs(len(p) - 30 * f) < 1, [len(x) for x in parts]
    for fam, n in Counter(r.family for r in records).items():
        for p, f in zip(parts, (0.5, 0.25, 0.25)):
            assert abs(sum(r.family == fam for r in p) - n * f) < 2


def test_split_is_seeded():
    records = selection(30)
    a = split_parts(records, 0, lambda r: r.family)
    b = split_parts(list(reversed(records)), 0, lambda r: r.family)
    c = split_parts(records, 1, lambda r: r.family)
    assert [{r.id for r in p} for p in a] == [{r.id for r in p} for p in b]
    assert {r.id for r in a[2]} != {r.id for r in c[2]}


def test_the_quick_selection_gives_every_part_a_scenario():
    parts = split_parts(selection(), 0, lambda r: r.family)
    assert all(parts) and sum(map(len, parts)) == len(selection())


def test_panel_part_keeps_only_that_part_of_the_recorded_split():
    """--panel-part held-out: the three parts are drawn from gap-v2's recorded held-out part only (the scenarios no
    organism trains on), all of it when the profile's cap is lifted."""
    from panels.split import load_split
    from readouts.driver import ModelOptions, RunOptions, _resolve
    from readouts.steer.study import SteerSettings, SteerStudy

    held = set(load_split("gap-v2").ids("held-out"))
    study = SteerStudy(settings=SteerSettings(layers=(1,)))
    job = _resolve(study, RunOptions(model=ModelOptions("smollm2-135m"), panel="gap-v2", part="held-out",
                                     overrides=("max_units=1000",)))
    assert {r.id for r in study.train} | {r.id for r in job.records} == held and len(held) >= 60
    assert min(sum(p == part for p in study.part_of.values()) for part in ("selection", "test")) >= 20
