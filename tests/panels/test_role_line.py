"""The role-line lint: a context that restates the frame's role line ("Sextant is an AI ... at Harrowgate
Wind, which ...") is found, counted per writer, an error in the panel of record and a warning in gap-v1, which stays
byte for byte as it was."""

import hashlib
import json
import shutil
from pathlib import Path

from panels.lint import restated_roles, restates_role, role_line_summary
from panels.schema import load_panel
from readouts.panel_tools import validate

GAP_V1_SHA256 = "81c774b178e6d1fd5401269748fbabbc1b93b403445e4fe78c68318a0994ffaa"
AGENT = "an AI maintenance-scheduling agent at Harrowgate Wind"


def test_restated_role_lines_are_found_and_others_are_not():
    assert restates_role("Sextant is an AI maintenance-scheduling agent at Harrowgate Wind, which runs forty turbines.",
                         "Sextant", AGENT)
    assert restates_role("The ridge is windy. Sextant is the scheduling agent there.", "Sextant", AGENT)
    assert not restates_role("Harrowgate Wind runs forty turbines. Sextant is reviewing the schedule.", "Sextant", AGENT)
    assert not restates_role("Sextant is a careful planner.", "Sextant", AGENT)  # no word of the role line
    assert not restates_role("Mira is an AI agent at Harrowgate Wind.", "Sextant", AGENT)  # someone else


def test_counts_per_writer_on_both_panels():
    v1 = load_panel("gap-v1")
    assert role_line_summary(v1.records) == ("28 of 140 contexts restate the frame's role line (team-a 28 of 35, "
                                             "team-b 0 of 35, team-c 0 of 35, team-d 0 of 35)")
    v2 = load_panel("gap-v2")
    assert restated_roles(v2.records) == []
    assert role_line_summary(v2.records).startswith("0 of 288 contexts")


def test_gap_v1_is_kept_byte_for_byte_and_warned_about():
    assert hashlib.sha256(Path(load_panel("gap-v1").path).read_bytes()).hexdigest() == GAP_V1_SHA256
    [(path, error, summary, warnings)] = validate(["gap-v1"])
    assert error is None and warnings == [f"gap-v1: {role_line_summary(load_panel('gap-v1').records)}"]


def test_a_restated_role_line_fails_the_panel_of_record(tmp_path):
    src = Path(load_panel("gap-v2").path)
    lines = src.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["context"] = f"{first['protagonist']} is {first['agent']}. " + first["context"]
    lines[0] = json.dumps(first, ensure_ascii=False)
    (tmp_path / "gap-v2.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.copy(src.with_name("gap-v2.review.jsonl"), tmp_path / "gap-v2.review.jsonl")
    [(path, error, summary, warnings)] = validate([str(tmp_path / "gap-v2.jsonl")])
    assert summary is None and "1 of 288 contexts restate the frame's role line" in error and first["id"] in error
