"""Strict JSONL reading, one implementation for panels, review records and probe files: UTF-8, one JSON
object per line, blank lines skipped, and each problem one line naming the file and line (`file:line: json:
...`). Lines are split on "\\n" only: U+2028, U+2029 and U+0085 are valid inside JSON strings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


def read_bytes(path: str | Path, error: type[Exception]) -> bytes:
    """The file's bytes, or `error('file: file: cannot read (...)')`."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{path}: file: cannot read ({exc.strerror or exc})") from None


def json_problem(exc: json.JSONDecodeError, unit: str, position: int) -> str:
    """json's message with where it happened: 'Expecting value at column 5'. json's own message can end with
    'at' ('Unterminated string starting at'), which is not written twice."""
    msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
    return f"{msg} at {unit} {position}"


def jsonl_objects(path: str | Path, error: type[Exception], data: bytes | None = None) -> Iterator[tuple[str, dict]]:
    """(where, object) for each non-blank line of `path` (or of `data`, its bytes), where = 'file:line'."""
    data = read_bytes(path, error) if data is None else data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: file: not UTF-8 (byte {exc.start})") from None
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: json: invalid JSON ({json_problem(exc, 'column', exc.colno)})") from None
        if not isinstance(obj, dict):
            raise error(f"{where}: json: each line must be a JSON object")
        yield where, obj
