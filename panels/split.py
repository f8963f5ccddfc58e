"""A panel's fixed split into a training part and a held-out part, stratified by family and writer, with a validation
slice carved out of the training part: recorded beside the panel (`panels/data/<panel>.split.json`) and
regenerated from its seed by this module, so the recorded file can be checked against the rule that made it.

Within each stratum (family x writer) the scenarios are ordered by a seeded hash of their id, and the first
round(n * HELD_OUT) go to the held-out part, the next round(n * VALIDATION) to the validation slice, the rest to
`train`. The ordering depends on the ids and the seed alone (no library's random generator), so it is the same on
every machine and version; a scenario added to a stratum moves no other scenario of it between parts.

Parts: `held-out` (no organism ever trains on it; the known answers are read there), `validation` (part of the
training part, read to choose recipes, not trained on by the organisms that are chosen on it) and `train`.
`training` names `train` and `validation` together.

`python -m panels.split PANEL` checks the recorded split against the regenerated one; `--write` records it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from panels.schema import PanelError, load_panel, resolve_panel

SEED = 20261206
"""The seed of the shipped splits."""
HELD_OUT = 0.25
"""Share of each stratum held out."""
VALIDATION = 0.15
"""Share of each stratum (of the whole stratum, not of its training part) in the validation slice."""
PARTS = ("train", "validation", "held-out")
TRAINING = ("train", "validation")
"""The parts that `training` names."""
SUFFIX = ".split.json"


def stratum(record) -> str:
    """A scenario's stratum: its family and its writer."""
    return f"{record.family}/{record.generator}"


def _count(n: int, share: float) -> int:
    return int(n * share + 0.5)


def _key(seed: int, record_id: str) -> str:
    return hashlib.sha256(f"{seed}|{record_id}".encode()).hexdigest()


def make_split(records, seed: int = SEED, held_out: float = HELD_OUT, validation: float = VALIDATION) -> dict:
    """{part: [ids in panel order]} for `records` (judgment-action scenarios)."""
    by: dict[str, list] = {}
    for r in records:
        by.setdefault(stratum(r), []).append(r.id)
    part_of = {}
    for ids in by.values():
        ranked = sorted(ids, key=lambda i: _key(seed, i))
        h, v = _count(len(ids), held_out), _count(len(ids), validation)
        for k, i in enumerate(ranked):
            part_of[i] = "held-out" if k < h else "validation" if k < h + v else "train"
    return {p: [r.id for r in records if part_of[r.id] == p] for p in PARTS}


def split_path(panel: str) -> Path:
    """Where the split of `panel` (a shipped name or a panel file) is recorded: beside the panel file."""
    path = resolve_panel(panel)
    return path.with_name(path.name.removesuffix(".jsonl") + SUFFIX)


def record(panel: str, seed: int = SEED) -> dict:
    """The split file's content for `panel`, regenerated from the panel and the seed."""
    p = load_panel(panel, review=False)
    parts = make_split(p.records, seed)
    sizes = {}
    for r in p.records:
        part = next(k for k, ids in parts.items() if r.id in ids)
        sizes.setdefault(stratum(r), dict.fromkeys(PARTS, 0))[part] += 1
    return dict(panel=p.name, seed=seed, stratified_by=["family", "generator"],
                shares={"held-out": HELD_OUT, "validation": VALIDATION}, sizes=dict(sorted(sizes.items())),
                parts=parts)


def write(panel: str, seed: int = SEED) -> Path:
    path = split_path(panel)
    path.write_text(json.dumps(record(panel, seed), indent=1) + "\n")
    return path


@dataclass(frozen=True)
class Split:
    """A recorded split: the ids of each part."""

    panel: str
    seed: int
    parts: dict

    def ids(self, part: str) -> tuple[str, ...]:
        """The ids of `part` (one of PARTS, or `training`: train and validation), in panel order."""
        if part == "training":
            return tuple(i for p in TRAINING for i in self.parts[p])
        if part not in self.parts:
            raise PanelError(f"split of {self.panel}: part: '{part}' is not one of {', '.join((*PARTS, 'training'))}")
        return tuple(self.parts[part])


def load_split(panel: str) -> Split:
    """The recorded split of `panel`; PanelError if there is none or it does not cover the panel's ids exactly once."""
    path = split_path(panel)
    if not path.is_file():
        raise PanelError(f"{path}: file: no recorded split of {panel} (python -m panels.split {panel} --write)")
    data = json.loads(path.read_text())
    ids = [r.id for r in load_panel(panel, review=False).records]
    listed = [i for p in PARTS for i in data["parts"][p]]
    if sorted(listed) != sorted(ids):
        raise PanelError(f"{path}: parts: do not list each of the panel's {len(ids)} ids exactly once")
    return Split(data["panel"], data["seed"], {p: tuple(data["parts"][p]) for p in PARTS})


def records_of(panel, part: str) -> list:
    """The records of a loaded `panel` in the recorded split's `part`, in panel order."""
    chosen = set(load_split(panel.path).ids(part))
    return [r for r in panel.records if r.id in chosen]


def check(panel: str) -> list[str]:
    """Differences between the recorded split of `panel` and the one its seed regenerates (empty: they agree)."""
    path = split_path(panel)
    if not path.is_file():
        return [f"{path}: missing"]
    recorded = json.loads(path.read_text())
    fresh = record(panel, recorded.get("seed", SEED))
    return [f"{path}: {k}: recorded differs from regenerated" for k in fresh if recorded.get(k) != fresh[k]]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m panels.split", description=__doc__.split("\n\n")[0])
    ap.add_argument("panel")
    ap.add_argument("--write", action="store_true", help="record the regenerated split beside the panel")
    args = ap.parse_args(argv)
    if args.write:
        print(write(args.panel))
        return 0
    problems = check(args.panel)
    for line in problems:
        print(line)
    if not problems:
        data = json.loads(split_path(args.panel).read_text())
        print(f"{split_path(args.panel)}: agrees with seed {data['seed']}: "
              + ", ".join(f"{p} {len(data['parts'][p])}" for p in PARTS))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
