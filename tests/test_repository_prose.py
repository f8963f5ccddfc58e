"""The repository's prose says what the software does and why, never how it came to be.

Scanned: README.md, docs/*.md, and the comments and bare string statements (docstrings, attribute docstrings) of
every .py file of the packages (contract, engine, panels, stats, readouts, organisms, cli, bench, scripts) and of
tests/, except this file, whose docstring quotes what it flags. Code and its string values (messages, labels) are
not prose and are not scanned.

Flagged, case-insensitively, because they name the project's own history rather than the software:

- a numbered ticket: "issue 30", "Issue 28's", "issue #5", "pre-issue-16";
- "the issue" / "the steering issue's" / "issue's": in this repository the noun always meant one of the project's
  tickets (a problem is called a problem, a fault or a bug);
- a work period: "this wave", "before this wave", "wave 3", "session 12", "the last session", "an earlier
  session";
- the tooling around the work: "before-stop hook", "stop hook";
- change history: "an earlier version", "the first version", "for the record", "added after", "before this
  change".

Allowed, and why:

- a wave of the prefix-tree planner (engine/planner.py: "a wave's nodes", "earlier waves", "each wave"): a
  software term, so only "this/last/next/previous/prior/that wave" and a numbered wave are flagged;
- "this session" and a served client's or a process's session (`requests.Session`, "the requests this session
  sent"): one run of the software, not a period of work on it; only numbered sessions and "last / next / previous /
  earlier / later session" are flagged;
- "issues" as a verb ("the aten operations the decode loop issues"): the patterns need the singular noun;
- another project's ticket cited as a source: write it as a URL or `owner/repo#123` (no word "issue" before the
  number), which nothing here flags;
- a model checkpoint's revision, rounding, a served client's round trip: no pattern names them.

A failure lists every hit as file:line: the matched words, and the line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("contract", "engine", "panels", "stats", "readouts", "organisms", "cli", "bench", "scripts", "tests")

PATTERNS = {
    "numbered ticket": r"\bissues?[\s#-]*#?\d+",
    "the project's ticket": r"\bthe\s+(?:[\w-]+\s+)?issue\b(?!s)|\bissue's\b",
    "work period (wave)": r"\b(?:this|last|next|previous|prior|that)\s+wave\b|\bwaves?\s+\d+",
    "work period (session)": r"\bsessions?\s+\d+|\b(?:last|next|previous|prior|earlier|later)\s+sessions?\b",
    "tooling around the work": r"\bbefore-stop\b|\bstop\s+hook\b",
    "change history": r"\b(?:an?|the)\s+(?:earlier|older|first|previous|prior)\s+version\b|\bfor the record\b"
                      r"|\badded after\b|\bbefore this (?:change|wave|revision|commit)\b",
}
FLAGGED = re.compile("|".join(f"(?:{p})" for p in PATTERNS.values()), re.IGNORECASE)


def prose_of_python(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comment and each bare string statement (docstrings and attribute docstrings): one
    entry per physical line, so a hit is reported at its own line."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            out += [(node.lineno + k, line) for k, line in enumerate(node.value.value.split("\n"))]
    return out


def prose_files() -> list[tuple[Path, list[tuple[int, str]]]]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = [(p, list(enumerate(p.read_text(encoding="utf-8").splitlines(), 1))) for p in files]
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else ():
            source = path.read_text(encoding="utf-8")
            # Only a file whose source holds a flagged phrase somewhere is parsed: the comments and docstrings are
            # part of the source, character for character, so a file without one has no hit to find.
            if path != Path(__file__).resolve() and FLAGGED.search(source):
                out.append((path, prose_of_python(source)))
    return out


def hits(lines: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, matched words, the line) for each flagged phrase."""
    return [(n, m.group(0), text.strip()) for n, text in lines for m in FLAGGED.finditer(text)]


def test_the_prose_says_what_the_software_does_not_how_it_came_to_be():
    found = [f"{path.relative_to(ROOT)}:{n}: {words!r}: {text[:160]}"
             for path, lines in prose_files() for n, words, text in hits(lines)]
    assert not found, f"{len(found)} lines name the project's history:\n" + "\n".join(found)


@pytest.mark.parametrize("text", [
    "# -- the decoding loop before issue 16, kept for the benchmark",
    "270 s on an idle machine (measured before this wave)",
    "gap-v2's hash changed in issue 30's revision",
    "the steering issue's figure",
    "tested, and checked by the before-stop hook",
    "as decided in session 12",
    "The first version of the test, for the record:",
    "columns added after the first runs",
])
def test_the_scan_flags_history(text):
    assert hits([(1, text)]), text


@pytest.mark.parametrize("text", [
    "the aten operations the decode loop issues per step",
    "`tree.kv` already holds the ancestors from earlier waves; a wave's nodes",
    "Nodes in depth-first order, cut into consecutive waves of about `limit` own tokens.",
    "A served model's request counts this session (sent over the network, answered from the cache).",
    "session = requests.Session()",
    "the commit a revision resolves to; rounding of differently shaped batches",
    "cited as huggingface/transformers#12345",
])
def test_the_scan_passes_the_software_terms(text):
    assert not hits([(1, text)]), hits([(1, text)])


def test_comments_and_docstrings_are_read_at_their_own_lines():
    source = 'def f():\n    """One.\n\n    Two issue 7."""\n    return 1  # three\n'
    assert (4, "    Two issue 7.") in prose_of_python(source)
    assert (5, "# three") in prose_of_python(source)
