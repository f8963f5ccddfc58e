"""The four-stage reply parser (negation paper, Appendix C.4) on a corpus of tricky replies."""

import ast
import json
import subprocess
import sys

import pytest

from readouts.nsi.parse import NUMERIC_FIELDS, ParsedReply, endorsement, parse_reply
from tests.conftest import FIXTURES, ROOT

CORPUS = [json.loads(line) for line in (FIXTURES / "nsi_replies.jsonl").open(encoding="utf-8")]


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 40
    assert len({c["id"] for c in CORPUS}) == len(CORPUS)
    stages = {c["stage"] for c in CORPUS if c["ok"]}
    assert stages == {1, 2, 3, 4}
    assert sum(not c["ok"] for c in CORPUS) >= 15


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus_case(case):
    got = parse_reply(case["text"])
    assert got.ok is case["ok"], (got.error, case["note"])
    assert got.stage == case["stage"]
    if case["ok"]:
        assert got.error is None
        assert got.decision == case["decision"]
        assert got.reasoning and got.reasoning == got.reasoning.strip()
        for field in NUMERIC_FIELDS:
            assert 0.0 <= getattr(got, field) <= 100.0
    else:
        assert case["error"] in got.error
        assert got.decision is None and got.reasoning is None


def test_fields_are_read_from_the_winning_object():
    text = '{"decision": "agree", "confidence": 50, "adherence_to_laws": 1, "adherence_to_social_ethics": 2, ' \
        '"objective_positive_consequences": 3, "objective_negative_consequences": 4, "reasoning": "first"}\n' \
        '{"decision": "disagree", "confidence": 90, "adherence_to_laws": 5, "adherence_to_social_ethics": 6, ' \
        '"objective_positive_consequences": 7, "objective_negative_consequences": 8, "reasoning": " second "}'
    got = parse_reply(text)
    assert (got.stage, got.decision, got.confidence, got.adherence_to_laws, got.reasoning) == (2, "disagree", 90.0, 5.0, "second")
    assert got.objective_negative_consequences == 8.0


def test_result_is_frozen_and_maps_to_table_columns():
    got = parse_reply('{"decision": "agree"}')
    assert isinstance(got, ParsedReply)
    with pytest.raises(AttributeError):
        got.ok = True  # type: ignore[misc]
    row = got.as_row()
    assert row["parse_ok"] is False and row["parse_stage"] is None
    assert row["parse_error"].startswith("schema: missing fields")
    assert set(row) >= {"decision", "confidence", "reasoning", "parse_error"}


def test_endorsement_is_decision_xor_negation():
    assert endorsement("agree", False) == 1
    assert endorsement("disagree", False) == 0
    assert endorsement("agree", True) == 0
    assert endorsement("disagree", True) == 1
    assert endorsement(None, True) is None
    with pytest.raises(ValueError):
        endorsement("maybe", False)


def test_parser_is_pure_python():
    """The module imports only the standard library (no torch, no engine)."""
    src = ROOT / "readouts" / "nsi" / "parse.py"
    tree = ast.parse(src.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= {"json", "math", "re", "dataclasses", "__future__"}
    code = "import sys, readouts.nsi.parse; print('torch' in sys.modules, 'engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


def test_degenerate_replies():
    """Thousands of braces (a tiny model's output) parse to the right outcome; an answer after them is found."""
    answer = ('{"decision": "disagree", "confidence": 10, "adherence_to_laws": 1, "adherence_to_social_ethics": 1, '
              '"objective_positive_consequences": 1, "objective_negative_consequences": 1, "reasoning": "no"}')
    assert parse_reply("{" * 20000).error.startswith("unbalanced braces")
    assert not parse_reply("with { with } " * 2000).ok
    got = parse_reply("{" * 20000 + answer)
    assert (got.ok, got.stage, got.decision) == (True, 2, "disagree")
    got = parse_reply(answer + " }" * 5000)
    assert (got.ok, got.stage) == (True, 3)
