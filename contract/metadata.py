"""A user's own item metadata (source dataset, item id, category ...): the optional `metadata` object of a
panel record or a probe, checked here and carried to every output row as one JSON column.

One declaration for the field, its column and its encoding, so a panel scenario, an NSI dilemma and a
probe all carry it the same way, and a reader decodes it with `decode_metadata`.
"""

from __future__ import annotations

import json
import math
from typing import Callable

METADATA = "metadata"
"""The optional field of panel records and probes, and the output column (JSON text, keys sorted) carrying it."""

Scalar = str | int | float | bool | None


def check_metadata(value, fail: Callable[[str, str], None], field: str = METADATA) -> tuple[tuple[str, Scalar], ...]:
    """The metadata object as sorted (key, value) pairs; `fail(field, problem)` (which raises) otherwise.

    Keys are non-empty strings; values are JSON scalars (string, number, true/false, null), so that every
    value can become a column of a user's own table. Numbers must be finite."""
    if not isinstance(value, dict):
        fail(field, "must be an object of key: value pairs")
    for key, v in value.items():
        if not isinstance(key, str) or not key.strip():
            fail(field, f"key {key!r}: must be a non-empty string")
        if v is not None and not isinstance(v, (str, int, float, bool)):
            fail(f"{field}.{key}", f"must be a string, number, true/false or null, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            fail(f"{field}.{key}", "must be a finite number")
    return tuple(sorted(value.items()))


def encode_metadata(pairs: tuple[tuple[str, Scalar], ...] | None) -> str | None:
    """The output column's value: the pairs as a JSON object (keys sorted), or None when there are none."""
    if not pairs:
        return None
    return json.dumps(dict(pairs), ensure_ascii=False, sort_keys=True, allow_nan=False)


def decode_metadata(text: str | None) -> dict:
    """The metadata object of one output row ({} when the row has none)."""
    if not isinstance(text, str):  # None, NaN or pandas' NA: no metadata
        return {}
    return json.loads(text)
