"""Reading probe files for `readout score` and writing its results: strict JSONL, errors that name the
file, line and field, and an atomic output write.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from contract.metadata import METADATA, check_metadata
from engine.errors import ProbeInputError
from engine.render import Prompt
from panels.jsonl import jsonl_objects
from readouts.atomic import atomic_write
from readouts.probes_table import TABLE_SUFFIXES, table_objects

PROBE_FIELDS = {"id", "messages", "text", "letters", "system", METADATA}


@dataclass(frozen=True)
class ProbeRecord:
    """One line of a probe file."""

    id: str | int
    """The caller's identifier, echoed in the output."""
    prompt: Prompt
    """What to render."""
    letters: tuple[str, ...]
    """Letters to read at the next token."""
    line: int
    """1-based line number in the file (a table's row number)."""
    where: str = ""
    """'file:line' or 'file:row N', for error messages."""
    metadata: tuple = ()
    """The caller's own (key, value) pairs (contract.metadata), echoed in the output."""


def _objects(path: Path):
    """(where, line, object) per probe: JSONL lines, or the rows of a CSV or parquet table."""
    if path.suffix.lower() in TABLE_SUFFIXES:
        yield from table_objects(path)
        return
    for where, obj in jsonl_objects(path, ProbeInputError):
        yield where, int(where.rsplit(":", 1)[1]), obj


def read_probes(path: str | Path) -> list[ProbeRecord]:
    """Parse and validate a probe file (JSONL; CSV or parquet by its suffix, readouts.probes_table);
    ProbeInputError('file:line: field: problem') otherwise."""
    path = Path(path)
    records, seen = [], set()
    for where, line, obj in _objects(path):
        unknown = sorted(set(obj) - PROBE_FIELDS)
        if unknown:
            raise ProbeInputError(f"{where}: {unknown[0]}: unknown field (allowed: {', '.join(sorted(PROBE_FIELDS))}; "
                                  f"your own fields go in '{METADATA}', or in '{METADATA}.<key>' columns of a table)")
        if "id" not in obj:
            raise ProbeInputError(f"{where}: id: missing")
        pid = obj["id"]
        if not isinstance(pid, (str, int)) or isinstance(pid, bool):
            raise ProbeInputError(f"{where}: id: must be a string or an integer")
        if pid in seen:
            raise ProbeInputError(f"{where}: id: {pid!r} repeats an earlier probe")
        seen.add(pid)
        has_messages, has_text = "messages" in obj, "text" in obj
        if has_messages == has_text:
            raise ProbeInputError(f"{where}: messages/text: give exactly one of them")
        if has_text and (not isinstance(obj["text"], str) or not obj["text"]):
            raise ProbeInputError(f"{where}: text: must be a non-empty string")
        if has_messages:
            msgs = obj["messages"]
            if not isinstance(msgs, list) or not msgs:
                raise ProbeInputError(f"{where}: messages: must be a non-empty list")
            for i, m in enumerate(msgs):
                if not isinstance(m, dict) or set(m) != {"role", "content"}:
                    raise ProbeInputError(f"{where}: messages[{i}]: must be an object with exactly 'role' and 'content'")
                if not all(isinstance(m[k], str) for k in ("role", "content")):
                    raise ProbeInputError(f"{where}: messages[{i}]: role and content must be strings")
        if "system" in obj:
            if not isinstance(obj["system"], str):
                raise ProbeInputError(f"{where}: system: must be a string")
            if has_text:
                raise ProbeInputError(f"{where}: system: applies to chat messages only, not to raw text")
        if "letters" not in obj:
            raise ProbeInputError(f"{where}: letters: missing")
        letters = obj["letters"]
        if not isinstance(letters, list) or len(letters) < 2 or not all(isinstance(x, str) and x for x in letters):
            raise ProbeInputError(f"{where}: letters: must be a list of at least 2 non-empty strings")
        prompt = Prompt(
            messages=tuple(obj["messages"]) if has_messages else None,
            text=obj.get("text"),
            system=obj.get("system"),
        )
        metadata = check_metadata(obj[METADATA], functools.partial(_fail, where)) if METADATA in obj else ()
        records.append(ProbeRecord(pid, prompt, tuple(letters), line, where, metadata))
    if not records:
        raise ProbeInputError(f"{path}: no probes (the file is empty)")
    return records


def _fail(where: str, field: str, problem: str):
    raise ProbeInputError(f"{where}: {field}: {problem}")


def write_jsonl_atomic(path: str | Path, rows) -> None:
    """Write rows as JSONL to a temporary file beside `path`, then rename: never a half-written file."""
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")

    atomic_write(Path(path), write)
