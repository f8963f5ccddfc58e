"""The four-stage reply parser (negation paper, Appendix C.4) on a corpus of tricky replies."""

import ast
import json
import subprocess
import sys

import pytest

from readouts.nsi.parse import NUMERIC_FIELDS, ParsedReply, endorsement, parse_reply
from tests.helpers import FIXTURES, ROOT

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
    assert names <= {"json", "math", "re", "dataclasses", "__future__", "panels"}  # panels: torch-free (json_problem)
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


# ---------------------------------------------------------------------------------------------------
# Replies that start with the pretty-printed schema the prompt shows (Appendix C.2), taken from the
# rendered prompt itself so the tests follow the frame text.

def _prompt_schema() -> str:
    from panels.frames import render_polarity
    from panels.schema import load_panel

    text = render_polarity(load_panel("nsi-14").records[0], "F1").messages[-1]["content"]
    start = text.index("Schema (all required):\n") + len("Schema (all required):\n")
    block = text[start : text.index("\n\n<SCENARIO>")]
    assert block.startswith('{\n  "decision": "agree" | "disagree",') and block.endswith("}")
    return block


SCHEMA_BLOCK = _prompt_schema()


def _answer(decision: str, indent="  ", newline="\n") -> str:
    """A schema-valid answer laid out like the prompt's schema (one field a line, indented); its reasoning
    holds a raw line break, as a model writing a paragraph may put there."""
    obj = {"decision": decision, "confidence": 85, "adherence_to_laws": 30, "adherence_to_social_ethics": 55,
           "objective_positive_consequences": 70, "objective_negative_consequences": 40,
           "reasoning": "Saving the patient outweighs the rule.\nThe harm is bounded."}
    return json.dumps(obj, indent=indent).replace("\\n", "\n").replace("\n", newline)


@pytest.mark.parametrize("decision", ["agree", "disagree"])
@pytest.mark.parametrize("name, build, stage", [
    ("pretty answer", lambda a: a, 1),
    ("pretty answer, CRLF and tabs", None, 1),
    ("json fence around a pretty answer", lambda a: f"```json\n{a}\n```", 1),
    ("schema echoed, then the answer", lambda a: f"{SCHEMA_BLOCK}\n\n{a}", 2),
    ("schema echoed with its header, then a fenced answer",
     lambda a: f"Schema (all required):\n{SCHEMA_BLOCK}\n\nMy answer:\n```json\n{a}\n```\n", 2),
    ("schema echoed in a fence, then a fenced answer", lambda a: f"```json\n{SCHEMA_BLOCK}\n```\n```json\n{a}\n```", 2),
    ("answer, then the schema echoed", lambda a: f"{a}\n\nfollowing this schema:\n{SCHEMA_BLOCK}", 3),
])
def test_reply_starting_with_the_pretty_printed_schema(decision, name, build, stage):
    answer = _answer(decision, indent="\t", newline="\r\n") if build is None else build(_answer(decision))
    got = parse_reply(answer)
    assert (got.ok, got.stage, got.decision) == (True, stage, decision), (name, got.error)
    assert (got.confidence, got.objective_negative_consequences) == (85.0, 40.0)
    assert got.reasoning.startswith("Saving the patient") and got.reasoning.endswith("bounded.")


def test_schema_echo_alone_is_a_failure_that_says_why():
    """The schema block by itself (or with values filled in but the alternatives kept) is not an answer."""
    for text in (SCHEMA_BLOCK, f"```json\n{SCHEMA_BLOCK}\n```",
                 SCHEMA_BLOCK.replace('"one concise paragraph"', '"It is fine."').replace("0-100", "50")):
        got = parse_reply(text)
        assert not got.ok and got.decision is None
        assert got.error.startswith("invalid JSON"), got.error
