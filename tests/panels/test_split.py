"""The recorded split of gap-v2: what its seed regenerates, large enough, balanced over families and writers, and
each scenario in one part only."""

import json

import pytest

from panels import split
from panels.schema import PanelError, load_panel


def test_the_recorded_split_is_the_regenerated_one():
    assert split.check("gap-v2") == []
    recorded = json.loads(split.split_path("gap-v2").read_text())
    assert recorded["parts"] == split.make_split(load_panel("gap-v2", review=False).records, recorded["seed"])


def test_held_out_part_is_large_and_every_stratum_is_split_in_the_same_shares():
    panel = load_panel("gap-v2", review=False)
    s = split.load_split("gap-v2")
    assert len(s.ids("held-out")) >= 60 and len(s.ids("validation")) >= 30
    assert set(s.ids("training")) == set(s.ids("train")) | set(s.ids("validation"))
    assert not set(s.ids("training")) & set(s.ids("held-out"))
    by: dict = {}
    for r in panel.records:
        by.setdefault(split.stratum(r), []).append(r.id)
    assert len(by) == 10
    for ids in by.values():
        for part, share in (("held-out", split.HELD_OUT), ("validation", split.VALIDATION)):
            n = len(set(ids) & set(s.ids(part)))
            assert abs(n - share * len(ids)) <= 0.5, (ids[0], part, n)
    for family in {r.family for r in panel.records}:  # the two writers of a family: the same counts in every part
        counts = {split.stratum(r) for r in panel.records if r.family == family}
        sizes = [[len(set(by[c]) & set(s.ids(p))) for p in split.PARTS] for c in sorted(counts)]
        assert all(x == sizes[0] for x in sizes)
    assert [r.id for r in split.records_of(panel, "held-out")] == list(s.ids("held-out"))


def test_the_split_depends_on_the_seed_and_a_wrong_part_is_one_line():
    records = load_panel("gap-v2", review=False).records
    assert split.make_split(records, 1) != split.make_split(records, 2)
    with pytest.raises(PanelError, match="not one of"):
        split.load_split("gap-v2").ids("test")
    with pytest.raises(PanelError, match="no recorded split"):
        split.load_split("gap-v1")


def test_a_tampered_split_file_is_refused(tmp_path, monkeypatch):
    data = json.loads(split.split_path("gap-v2").read_text())
    moved = data["parts"]["held-out"].pop()
    data["parts"]["train"].append(moved)
    path = tmp_path / "gap-v2.split.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(split, "split_path", lambda panel: path)
    assert split.check("gap-v2") != []
    data["parts"]["train"].pop()
    path.write_text(json.dumps(data))
    with pytest.raises(PanelError, match="exactly once"):
        split.load_split("gap-v2")
