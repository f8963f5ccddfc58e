"""Profiles: keyword-built settings of a study, overridable field by field from the command line.

Every study's profile is a frozen dataclass deriving from `Profile`; `apply_overrides` turns `--set
key=value` (and `--set orders.D=8` for a mapping field) into a new profile of the same type, and
`select_units` applies the profile's subset and `--limit`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.errors import ReadoutError


@dataclass(frozen=True)
class Profile:
    """Settings every study's profile has (all recorded in the manifest)."""

    name: str
    """`paper` (the paper's settings) or `quick` (sized for two CPU cores)."""
    chunk_size: int
    """Records (scenarios, dilemmas) per chunk: the unit of atomic writes, resuming and sharding."""
    max_units: int | None = None
    """A family-stratified subset of this many records (None: every record)."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check(self) -> None:
        """Raise ReadoutError naming the first field whose value cannot run."""
        if self.chunk_size < 1:
            raise ReadoutError(f"--set: chunk_size: must be >= 1, got {self.chunk_size}")


def not_paper_note(profile: Profile, paper: Profile, fields) -> str | None:
    """One line saying that `profile`'s `fields` are not the paper's settings, or None when they all are."""
    diff = [f"{f} {getattr(profile, f)} (paper {getattr(paper, f)})" for f in fields
            if getattr(profile, f) != getattr(paper, f)]
    if not diff:
        return None
    shown = diff if len(diff) <= 4 else [*diff[:4], f"{len(diff) - 4} more"]
    return (f"note: profile '{profile.name}' is not the paper's settings: " + ", ".join(shown)
            + "; its numbers are not comparable with the paper's (use --profile paper)")


def set_example(profile: Profile, fields) -> str:
    """`--set` examples for a help text, built from the profile's own fields and values (so they are valid)."""
    parts = []
    for f in fields:
        value = getattr(profile, f)
        if isinstance(value, dict):
            key = next(iter(value))
            parts.append(f"--set {f}.{key}={value[key]}")
        else:
            parts.append(f"--set {f}={value}")
    return " ".join(parts)


def _coerce(text: str, current, where: str):
    """`text` as the type of `current` (an int field stays an int); None-valued fields take an int."""
    kind = type(current) if current is not None else int
    if text.lower() in ("none", "null") and current is None:
        return None
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        return kind(text)
    except ValueError:
        raise ReadoutError(f"--set: {where}: '{text}' is not a valid {kind.__name__}") from None


def apply_overrides(profile: Profile, overrides: tuple[str, ...]) -> tuple[Profile, dict]:
    """`profile` with `key=value` overrides applied; returns it and the overrides as a dict (for the manifest)."""
    fields = {f.name for f in dataclasses.fields(profile)} - {"name"}
    changes, record = {}, {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ReadoutError(f"--set: '{item}' must look like key=value")
        top, _, sub = key.partition(".")
        if top not in fields:
            raise ReadoutError(f"--set: {key}: not a field of the {profile.name} profile ({', '.join(sorted(fields))})")
        current = changes.get(top, getattr(profile, top))
        if isinstance(current, dict):
            if sub not in current:
                raise ReadoutError(f"--set: {key}: '{sub}' is not a key of {top} ({', '.join(current)})")
            changes[top] = {**current, sub: _coerce(value, current[sub], key)}
        elif sub:
            raise ReadoutError(f"--set: {key}: {top} has no sub-keys")
        else:
            changes[top] = _coerce(value, current, key)
        record[key] = value
    new = dataclasses.replace(profile, **changes)
    new.check()
    return new, record


def select_units(records, max_units: int | None, limit: int | None = None, stratum=None) -> list:
    """The profile's subset (records of each `stratum` taken in turn, in panel order), then the first `limit`."""
    records = list(records)
    if max_units is not None and max_units < len(records):
        by_stratum: dict = {}
        for r in records:
            by_stratum.setdefault(stratum(r) if stratum else "", []).append(r)
        chosen, i = [], 0
        while len(chosen) < max_units:
            for key in sorted(by_stratum):
                if i < len(by_stratum[key]) and len(chosen) < max_units:
                    chosen.append(by_stratum[key][i])
            i += 1
        keep = {id(r) for r in chosen}
        records = [r for r in records if id(r) in keep]
    if limit is not None:
        if limit < 1:
            raise ReadoutError(f"--limit: must be >= 1, got {limit}")
        records = records[:limit]
    return records
