"""The negation paper's response-to-label parser (Appendix C.4): raw reply text -> schema-valid decision.

Four ordered stages, the first that yields a *schema-valid* object wins:

1. brace search: the span from the first ``{`` (forward search) to the last ``}`` (backward search);
2. tail extraction: the balanced object that ends at the last ``}`` (for reasoning-model preambles);
3. head extraction: the balanced object that starts at the first ``{`` (for postambles);
4. scan: every balanced ``{...}`` object in the text (found by a regex scan for ``{`` and a string-aware
   brace matcher), tried from the largest to the smallest.

Every candidate span is decoded by the same lenient loader: plain ``json.loads`` first, then the same text
with quotes normalized (curly double quotes -> ``"``, curly single quotes -> ``'``), then with
single-quoted strings rewritten as double-quoted ones and trailing commas removed. Quote normalization
is tried only after the raw text fails, because a reply may legitimately use curly quotes *inside* a
straight-quoted reasoning string.

Schema validity (Appendix C.4): ``decision`` in {agree, disagree} (case and surrounding blanks ignored),
each of the five numeric fields present, finite and in [0, 100] (JSON numbers, or strings holding only a
number), ``reasoning`` a non-empty string. Extra keys are ignored. A reply with no schema-valid object is a
parse failure whose ``error`` says why (the schema complaint about the first decodable object, or what
prevented decoding); failures are kept as rows by the caller, never dropped.

When a reply holds two schema-valid objects, stage 1 fails (two objects are not one JSON value) and
stage 2 returns the *last* one: the parser reads a reply's final answer.

Pure Python (json, re): importable without torch or the engine, so the stats layer and tests can use it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass

from panels.jsonl import json_problem

DECISIONS = ("agree", "disagree")
NUMERIC_FIELDS = (  # contract: the reply schema of the paper (C.2)
    "confidence",
    "adherence_to_laws",
    "adherence_to_social_ethics",
    "objective_positive_consequences",
    "objective_negative_consequences",
)
SCHEMA_FIELDS = ("decision",) + NUMERIC_FIELDS + ("reasoning",)

STAGE_NAMES = {1: "brace search", 2: "tail extraction", 3: "head extraction", 4: "largest balanced object"}

_QUOTE_MAP = str.maketrans(
    {
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    }
)
_NUMBER_STRING = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")
_OPEN_BRACE = re.compile(r"\{")


@dataclass(frozen=True)
class ParsedReply:
    """One reply mapped to the response schema (or a failure saying why)."""

    ok: bool
    """A schema-valid object was found."""
    stage: int | None
    """1 brace search, 2 tail extraction, 3 head extraction, 4 largest balanced object; None on failure."""
    error: str | None
    """Why parsing failed; None when ok."""
    decision: str | None = None
    """``agree`` or ``disagree`` (lower-cased)."""
    confidence: float | None = None
    """Self-reported confidence, 0-100."""
    adherence_to_laws: float | None = None
    """Schema field, 0-100."""
    adherence_to_social_ethics: float | None = None
    """Schema field, 0-100."""
    objective_positive_consequences: float | None = None
    """Schema field, 0-100."""
    objective_negative_consequences: float | None = None
    """Schema field, 0-100."""
    reasoning: str | None = None
    """The schema's free-text reasoning (stripped)."""

    def as_row(self) -> dict:
        """Columns of nsi_replies.parquet that the parser owns (``parse_ok``, ``parse_stage``, ...)."""
        d = asdict(self)
        return {
            "parse_ok": d.pop("ok"),
            "parse_stage": d.pop("stage"),
            "parse_error": d.pop("error"),
            **d,
        }


def endorsement(decision: str | None, negated: bool) -> int | None:
    """Logical-polarity-normalized endorsement a = d XOR neg(f), with d = 1 for agree (paper eq. 1)."""
    if decision is None:
        return None
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
    return int((decision == "agree") != bool(negated))


# ---------------------------------------------------------------------------------------------------
# decoding

def _single_to_double(text: str) -> str:
    """Rewrite single-quoted JSON-ish text as JSON: 'x' -> "x", drop trailing commas.

    Inside a single-quoted string an apostrophe closes the string only when the next non-blank character
    is one of , : } ] (or the end): "'It's fine'" keeps its apostrophe. Double quotes inside a
    single-quoted string are escaped. Double-quoted strings are copied as they are.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif c == "'":
            buf: list[str] = []
            j = i + 1
            while j < n:
                d = text[j]
                if d == "\\" and j + 1 < n:
                    buf.append(text[j : j + 2] if text[j + 1] != "'" else "'")
                    j += 2
                    continue
                if d == "'":
                    k = j + 1
                    while k < n and text[k] in " \t\r\n":
                        k += 1
                    if k >= n or text[k] in ",:}]":
                        break
                buf.append('\\"' if d == '"' else d)
                j += 1
            out.append('"' + "".join(buf) + '"')
            i = j + 1
        elif c == ",":
            k = i + 1
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] in "}]":
                i += 1  # trailing comma
                continue
            out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _loads(candidate: str):
    """Decode one candidate span leniently; returns (object, None) or (None, reason)."""
    attempts = [candidate]
    normalized = candidate.translate(_QUOTE_MAP)
    if normalized != candidate:
        attempts.append(normalized)
    repaired = _single_to_double(normalized)
    if repaired not in attempts:
        attempts.append(repaired)
    first_error = None
    for text in attempts:
        try:
            return json.loads(text, strict=False), None
        except json.JSONDecodeError as exc:  # noqa: PERF203 - a handful of attempts
            first_error = first_error or f"invalid JSON ({json_problem(exc, 'char', exc.pos)})"
    return None, first_error


def _validate(obj) -> tuple[dict | None, str | None]:
    """Schema check (Appendix C.4); returns (clean fields, None) or (None, complaint)."""
    if not isinstance(obj, dict):
        return None, f"schema: top-level value is {type(obj).__name__}, not an object"
    missing = [f for f in SCHEMA_FIELDS if f not in obj]
    if missing:
        return None, "schema: missing field" + ("s " if len(missing) > 1 else " ") + ", ".join(missing)
    decision = obj["decision"]
    if not isinstance(decision, str) or decision.strip().lower() not in DECISIONS:
        return None, f"schema: decision {decision!r} not in {{agree, disagree}}"
    clean: dict = {"decision": decision.strip().lower()}
    for field in NUMERIC_FIELDS:
        value = obj[field]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return None, f"schema: {field}={value!r} is not a number"
        if isinstance(value, str):
            if not _NUMBER_STRING.match(value):
                return None, f"schema: {field}={value!r} is not a number"
            value = float(value)
        value = float(value)
        if not math.isfinite(value) or not 0.0 <= value <= 100.0:
            return None, f"schema: {field}={value:g} out of [0, 100]"
        clean[field] = value
    reasoning = obj["reasoning"]
    if not isinstance(reasoning, str) or not reasoning.strip():
        return None, "schema: reasoning is empty" if isinstance(reasoning, str) else "schema: reasoning is not a string"
    clean["reasoning"] = reasoning.strip()
    return clean, None


# ---------------------------------------------------------------------------------------------------
# candidate spans

def _match_forward(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``start``, skipping double-quoted strings; None if unclosed."""
    depth = 0
    i, n = start, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


MAX_STARTS = 48
"""Opening braces tried as object starts at each end of a reply (bounds the scan on degenerate output)."""


def _balanced_spans(text: str) -> list[tuple[int, int]]:
    """Balanced {...} spans (start, end inclusive), one per opening brace that closes.

    Only the first and the last ``MAX_STARTS`` opening braces are tried as starts: each try scans forward,
    so a reply of thousands of braces (a degenerate sample) would otherwise cost quadratic time, and an
    answer object sits near one end of a reply.
    """
    starts = [m.start() for m in _OPEN_BRACE.finditer(text)]
    if len(starts) > 2 * MAX_STARTS:
        starts = starts[:MAX_STARTS] + starts[-MAX_STARTS:]
    spans = []
    for start in starts:
        end = _match_forward(text, start)
        if end is not None:
            spans.append((start, end))
    return spans


def _stage_candidates(text: str, spans: list[tuple[int, int]]):
    """Yield (stage, span text) in the paper's order.

    ``spans``: balanced objects found on the text as written and on its quote-normalized twin (same
    length, so spans line up): brace matching skips double-quoted strings, and either text may be the one
    whose quote characters delimit the strings. Spans are always cut from the text as written.
    """
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        yield 1, text[first : last + 1]
    if last != -1:
        # Stage 2: outermost balanced object ending at the last closing brace.
        ending = [s for s in spans if s[1] == last]
        for s in sorted(ending):
            yield 2, text[s[0] : s[1] + 1]
    if first != -1:
        # Stage 3: the balanced object opened by the first opening brace.
        for s in [s for s in spans if s[0] == first]:
            yield 3, text[s[0] : s[1] + 1]
    for s in sorted(spans, key=lambda s: (-(s[1] - s[0]), s[0])):
        yield 4, text[s[0] : s[1] + 1]


def parse_reply(text: str | None) -> ParsedReply:
    """Map one raw reply to the response schema with the four-stage parser (see module docstring)."""
    if text is None or not text.strip():
        return ParsedReply(ok=False, stage=None, error="empty reply")
    if "{" not in text:
        return ParsedReply(ok=False, stage=None, error="no JSON object: no opening brace")
    first_complaint = None
    decode_error = None
    tried: set[str] = set()
    normalized = text.translate(_QUOTE_MAP)
    raw_spans = _balanced_spans(text)
    spans = sorted(set(raw_spans) | set(_balanced_spans(normalized) if normalized != text else raw_spans))
    for stage, candidate in _stage_candidates(text, spans):
        if candidate in tried:
            # The same span already failed at an earlier stage: it cannot pass now.
            continue
        tried.add(candidate)
        obj, err = _loads(candidate)
        if err is not None:
            decode_error = decode_error or err
            continue
        clean, complaint = _validate(obj)
        if clean is not None:
            return ParsedReply(ok=True, stage=stage, error=None, **clean)
        first_complaint = first_complaint or complaint
    if first_complaint is not None:
        return ParsedReply(ok=False, stage=None, error=first_complaint)
    if not spans:
        return ParsedReply(ok=False, stage=None, error="unbalanced braces: no closed JSON object (truncated reply?)")
    return ParsedReply(ok=False, stage=None, error=decode_error or "no decodable JSON object")
