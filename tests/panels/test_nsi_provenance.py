"""Per-field provenance in the nsi panel: which fields are the paper's words (and where) and which were written
for this project, recorded in the panel, consistent with docs/negation-audit.md, and validated with one-line errors."""

import json

import pytest

from cli.main import main
from panels.records import PanelError
from panels.schema import NSI_FIELDS, load_panel, resolve_panel
from tests.helpers import ROOT

NSI = load_panel("nsi-14")
PAPER_ACTIONS = {"financial-1": "paper: Appendix C.1", "medical-2": "paper: Appendix A", "military-1": "paper: Appendix A",
                 "education-2": "paper: Appendix A"}


def test_every_dilemma_says_where_each_field_comes_from():
    """As docs/negation-audit.md says: id, domain and description from Appendix A; four action clauses and
    one goal the paper's words; every scenario, the other actions and goals, and the titles but one written here."""
    for d in NSI.records:
        prov = dict(d.provenance)
        assert tuple(prov) == NSI_FIELDS, d.id
        assert prov["id"] == prov["domain"] == prov["description"] == "paper: Appendix A"
        assert prov["scenario"].startswith("written here")
        assert prov["action"] == PAPER_ACTIONS.get(d.id, prov["action"])
        if d.id not in PAPER_ACTIONS:
            assert prov["action"].startswith("written here (Appendix A's action: "), d.id
        assert prov["goal"] == ("paper: Appendix C.1" if d.id == "financial-1" else "written here")
        assert prov["title"] == ("paper: sec. 4.5" if d.id == "financial-1" else "written here")
    counts = {f: sum(dict(d.provenance)[f].startswith("paper:") for d in NSI.records) for f in NSI_FIELDS}
    assert counts == {"id": 14, "domain": 14, "title": 1, "description": 14, "scenario": 0, "action": 4, "goal": 1}
    readme = (ROOT / "docs" / "negation-audit.md").read_text(encoding="utf-8")
    assert "other 10 action clauses" in readme and "other 13 goals" in readme


def test_verbatim_fields_are_the_papers_words():
    """A field marked as the paper's holds text found in the paper (where the paper is at hand)."""
    paper = ROOT.parent / "shared" / "papers" / "negation-sensitivity-audit.txt"
    if not paper.is_file():
        pytest.skip("the paper's text is not beside this checkout")
    text = " ".join(paper.read_text(encoding="utf-8").split())
    for d in NSI.records:
        for field, where in d.provenance:
            if where.startswith("paper:") and field in ("description", "action", "goal", "title"):
                assert getattr(d, field) in text, (d.id, field)


def _panel(tmp_path, provenance, line=2):
    """A two-dilemma panel whose `line`-th record carries ``provenance`` (None: drop the field)."""
    rows = [json.loads(x) for x in resolve_panel("nsi-14").read_text(encoding="utf-8").splitlines()[:2]]
    if provenance is None:
        rows[line - 1].pop("provenance")
    else:
        rows[line - 1]["provenance"] = provenance
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("provenance, message", [
    ({"id": "paper: Appendix A", "setting": "written here"}, "p.jsonl:2: provenance.setting: unknown field"),
    ({"title": ""}, "p.jsonl:2: provenance.title: is empty"),
    ({"title": "   "}, "p.jsonl:2: provenance.title: is empty"),
    ({"goal": "paper: "}, "p.jsonl:2: provenance.goal: 'paper:' must read 'paper: <where in the paper>'"),
    ({"goal": "from the paper"}, "p.jsonl:2: provenance.goal: 'from the paper' must read"),
    ({"goal": 3}, "p.jsonl:2: provenance.goal: must be a string"),
    ({}, "p.jsonl:2: provenance: must be a non-empty object"),
    ("written here", "p.jsonl:2: provenance: must be a non-empty object"),
])
def test_bad_provenance_is_a_one_line_error(tmp_path, capsys, provenance, message):
    path = _panel(tmp_path, provenance)
    with pytest.raises(PanelError) as err:
        load_panel(str(path))
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SystemExit) as exc:
        main(["panels", "validate", str(path)])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_provenance_is_optional_and_kept_in_file_order(tmp_path):
    assert load_panel(str(_panel(tmp_path, None))).records[1].provenance is None
    got = load_panel(str(_panel(tmp_path, {"scenario": "written here", "action": " paper: Appendix A "})))
    assert got.records[1].provenance == (("scenario", "written here"), ("action", "paper: Appendix A"))


def test_nsi_14_validates_and_gap_panels_are_unaffected(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["panels", "validate", "nsi-14"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("ok nsi-14: 14 nsi records")
    gap = json.loads(resolve_panel("gap-v1").read_text(encoding="utf-8").splitlines()[0])
    load_panel("gap-v1")
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({**gap, "provenance": {"context": "written here"}}) + "\n", encoding="utf-8")
    with pytest.raises(PanelError, match=r"g\.jsonl:1: provenance: unknown field"):
        load_panel(str(path), review=False)
