"""An organism's true values, computed independently of the engine's fast paths: each prompt through the plain
`model(input_ids)` forward pass (no prefix tree, no cache, the whole prompt every time; one prompt per forward, or for
the long held-out references right-padded batches, which causal attention keeps apart), the full-vocabulary softmax
in fp32 at the read position, each letter's mass summed over its single-token variants.

The per-read masses are then averaged as the gap paper defines its quantities (p = mean over option orders of the
normalized violating mass; g = p_D - p_J; E = mean over scenarios of g_primary - g_twin), and for the binary readout
the exact majority probability is enumerated over the orders' tempered violating probabilities. A known-answer test
compares the instrument's run tables and statistics with these numbers, so a failure says whether the organism
(training) or the instrument (reading) is off.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from organisms.examples import Example


@dataclass(frozen=True)
class Read:
    """One read of the reference: the example it came from and the group masses at its read position."""

    example: Example
    mass: tuple[float, ...]
    """Full-softmax mass of each group at T = 1."""
    tempered: tuple[float, ...]
    """Each group's probability under softmax(logits / T) over the full vocabulary (no top-p cut)."""

    @property
    def share(self) -> float:
        """The watched group's share of the groups' mass (the normalized violating mass, P(A), P(decision))."""
        return self.mass[self.example.watched] / sum(self.mass)

    @property
    def tempered_share(self) -> float:
        return self.tempered[self.example.watched] / sum(self.tempered)


def plain_reads(model, exs: list[Example], temperature: float = 0.7, progress=None, batch: int = 1) -> list[Read]:
    """Each example's read position through a plain forward of `model` (the merged organism), in `exs`'s order:
    one prompt per forward (`batch` 1), or right-padded batches of `batch` prompts of similar length (causal
    attention: a read position sees its own prompt and nothing after it, so a row is the one-prompt forward up to
    the matrix products' rounding, about 1e-6 in a mass). `progress(done, total)` after each forward."""
    out: dict[int, Read] = {}
    model.eval()
    order = sorted(range(len(exs)), key=lambda i: exs[i].soft_at) if batch > 1 else list(range(len(exs)))
    with torch.no_grad():
        for start in range(0, len(order), max(batch, 1)):
            if progress is not None and start:
                progress(start, len(exs))
            part = order[start: start + max(batch, 1)]
            ids = torch.zeros(len(part), max(exs[i].soft_at + 1 for i in part), dtype=torch.long)
            for row, i in enumerate(part):
                ids[row, : exs[i].soft_at + 1] = torch.tensor(exs[i].ids[: exs[i].soft_at + 1])
            at = sorted({exs[i].soft_at for i in part})  # the output head at the read positions only
            logits = model(input_ids=ids, logits_to_keep=torch.tensor(at)).logits.double()
            for row, i in enumerate(part):
                here = logits[row, at.index(exs[i].soft_at)]
                p = torch.softmax(here, -1)
                q = torch.softmax(here / temperature, -1)
                groups = exs[i].groups
                out[i] = Read(exs[i], tuple(float(p[list(g)].sum()) for g in groups),
                              tuple(float(q[list(g)].sum()) for g in groups))
    return [out[i] for i in range(len(exs))]


def majority_probability(q) -> float:
    """P(more than half of independent rollouts violate), rollout i violating with probability q[i] (the run's
    `majority_violating_prob`: more than floor(k / 2) of k), by enumerating every outcome."""
    q = list(q)
    total = 0.0
    for outcome in itertools.product((0, 1), repeat=len(q)):
        if sum(outcome) > len(q) // 2:
            total += float(np.prod([qi if o else 1 - qi for qi, o in zip(q, outcome)]))
    return total


def scenario_values(reads: list[Read]) -> dict:
    """{(scenario, cell, readout): mean normalized watched share over its reads}, plus the D readout's tempered
    violating fraction and majority probability under ('fraction', ...) and ('majority', ...) keys."""
    groups: dict = {}
    for r in reads:
        scenario, cell, readout = r.example.key.split("|")[:3]
        groups.setdefault((scenario, cell, readout), []).append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = float(np.mean([r.share for r in rs]))
        q = [r.tempered_share for r in rs]
        out[("fraction", *key)] = float(np.mean(q))
        out[("majority", *key)] = majority_probability(q)
    return out


def paired_excess(values: dict, scenarios, action: str = "D", judgment: str = "J", twin: str = "twin") -> float:
    """E = mean over `scenarios` of (p_action - p_judgment)_primary - (p_action - p_judgment)_twin."""
    g = lambda s, c: values[(s, c, action)] - values[(s, c, judgment)]  # noqa: E731
    return float(np.mean([g(s, "primary") - g(s, twin) for s in scenarios]))


KNOWN_ANSWER_FAMILIES = ("F1", "F3", "F4")
"""Gate families whose first three-option training scenario the known-answer runs read (three options: the quick
profile's 6 D orders are position-balanced, which `position-a`'s 1/n needs)."""
KNOWN_ANSWER_READOUTS = {"gap": "D,J0,J,control", "gap-deep": "D,J0,J,control", "no-gap": "D,J", "raw-reversal": "D,J,raw",
                         "position-a": "D,J", "gap-general": "D,J0,J", "no-gap-general": "D,J0,J", "principled": "D,J0,J"}
"""The `--readouts` each gap organism's known-answer run reads (what its planted quantities need); the reference
holds the plain reads of exactly those."""
REFERENCE_FILE = "reference.json"
"""The plain-forward reads of the known-answer prompts, written beside the adapter when it is trained."""


HELD_OUT = "held-out"
"""The split part the known-answer runs of an organism trained on a part read (panels/split.py): scenarios no
organism trains on."""
HELD_OUT_CELLS = ("primary", "twin")
"""The cells a held-out reference reads: the two that E pairs."""


def known_answer_records(org) -> list:
    """The records a known-answer run reads: an organism trained on a part of its panel's split, every scenario of the
    held-out part; other gap organisms, one training record per KNOWN_ANSWER_FAMILIES; NSI organisms, the first four
    dilemmas."""
    from organisms.examples import training_records

    if org.part is not None:
        from panels.schema import load_panel
        from panels.split import records_of

        return records_of(load_panel(org.panel), HELD_OUT)
    _, records = training_records(org)
    if org.study == "nsi":
        return records[:4]
    out = []
    for family in KNOWN_ANSWER_FAMILIES:
        out += [r for r in records if r.family == family and len(r.options) == 3][:1]
    return out


def read_in_known_answers(org, readout: str) -> bool:
    """Whether the known-answer run of `org` reads `readout` (an NSI organism's run reads every framing)."""
    if org.study == "nsi":
        return True
    groups = KNOWN_ANSWER_READOUTS[org.name].split(",")
    return readout in groups or (readout in ("raw_D", "raw_J") and "raw" in groups)


def write_reference(folder, org, exs: list[Example], temperature: float = 0.7, progress=None, batch: int = 1) -> dict:
    """Load the adapter in `folder` as every command does (merged into the base weights) and write the plain
    reads of the known-answer examples to folder/reference.json: {key: [share, tempered share, group mass]}. For an
    organism trained on a part of its split the known-answer prompts are the held-out part's, which `exs` (its
    training prompts) never holds: they are built here, in the two cells E pairs. `batch`: plain_reads'."""
    import dataclasses
    import json
    from pathlib import Path

    from engine.loading import load_model
    from organisms.examples import examples

    records = known_answer_records(org)
    ids = {r.id for r in records}
    lm = load_model(org.base, device="cpu", dtype="float32", adapter=str(folder))
    if org.part is not None:
        reader = dataclasses.replace(org, readouts=tuple(KNOWN_ANSWER_READOUTS[org.name].split(",")))
        exs = [e for e in examples(reader, lm, records) if e.cell in HELD_OUT_CELLS]
    chosen = [e for e in exs if e.key.split("|")[0] in ids and read_in_known_answers(org, e.readout)]
    reads = plain_reads(lm.model, chosen, temperature, progress, batch)
    record = {"temperature": temperature, "records": sorted(ids), "adapter": adapter_digest(folder),
              "reads": {r.example.key: [r.share, r.tempered_share, sum(r.mass)] for r in reads}}
    (Path(folder) / REFERENCE_FILE).write_text(json.dumps(record, indent=0) + "\n")
    return record


HELD_OUT_BATCH = 16
"""Prompts per plain forward of a held-out reference (plain_reads; a stored read is checked against a one-prompt
forward by tests/organisms/test_held_out_known_answers.py)."""


def adapter_digest(folder) -> str | None:
    """sha256 of the adapter weights in `folder` (names, shapes and values; not the file's metadata), recorded in its
    reference: a reference is of the weights beside it only while the digests agree. None without an adapter."""
    import hashlib
    from pathlib import Path

    from safetensors.torch import load_file

    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        return None
    h = hashlib.sha256()
    for name, t in sorted(load_file(str(path)).items()):
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def reference_digest(folder) -> str | None:
    """The adapter digest a folder's reference.json was read from (None: no reference, or one without it)."""
    import json
    from pathlib import Path

    path = Path(folder) / REFERENCE_FILE
    return json.loads(path.read_text()).get("adapter") if path.is_file() else None


def main(argv=None) -> int:
    """`python -m organisms.reference NAME`: write the plain-forward reference of shipped organism NAME (and of each
    step of its lineage), skipping any folder whose reference is of the weights beside it (adapter_digest) and
    copying the reference of a folder with the same weights and reads (a lineage's first and last steps): a held-out
    reference takes about ten minutes on two cores, so a stopped run goes on where it stopped."""
    import argparse
    import shutil

    from organisms import SHIPPED
    from organisms.recipes import organism

    ap = argparse.ArgumentParser(prog="python -m organisms.reference", description=main.__doc__.split(":")[0])
    ap.add_argument("name")
    ap.add_argument("--again", action="store_true", help="rewrite references that are already there")
    ap.add_argument("--steps", help="only these lineage steps (comma-separated; default every one)")
    args = ap.parse_args(argv)
    org = organism(args.name)
    folders = [SHIPPED / args.name]
    lineage = SHIPPED / args.name / "lineage"
    if lineage.is_dir():
        steps = sorted(int(p.name.split("-")[1]) for p in lineage.iterdir() if p.name.startswith("checkpoint-"))
        if args.steps:
            try:
                wanted = [int(k) for k in args.steps.split(",")]
            except ValueError:
                raise SystemExit(f"--steps: '{args.steps}' is not a comma-separated list of steps") from None
            if set(wanted) - set(steps):
                raise SystemExit(f"{lineage}: no step {sorted(set(wanted) - set(steps))}; its steps are {steps}")
            steps = [k for k in steps if k in wanted]
        folders += [lineage / f"checkpoint-{k}" for k in steps]
    reads = KNOWN_ANSWER_READOUTS.get(args.name)
    twins = [SHIPPED / n for n, r in KNOWN_ANSWER_READOUTS.items() if r == reads and organism(n).part == org.part]
    written: list = []
    for folder in folders:
        digest = adapter_digest(folder)
        if digest is None:
            raise SystemExit(f"{folder}: no adapter_model.safetensors; train the organism first")
        if reference_digest(folder) == digest and not args.again:
            print(f"{folder}: reference already written", flush=True)
            continue
        same = next((f for f in (written if args.again else [*twins, *folders])
                     if f != folder and reference_digest(f) == digest), None)
        written.append(folder)
        if same is not None:
            shutil.copyfile(same / REFERENCE_FILE, folder / REFERENCE_FILE)
            print(f"{folder}: reference copied from {same} (the same weights)", flush=True)
            continue
        write_reference(folder, org, [] if org.part is not None else _training_examples(org),
                        progress=lambda k, n, f=folder: k % 160 == 0 and print(f"{f.name}: {k} of {n} reads", flush=True),
                        batch=HELD_OUT_BATCH if org.part is not None else 1)
        print(f"{folder}: reference written", flush=True)
    return 0


def _training_examples(org) -> list:
    from engine.loading import load_model
    from organisms.examples import examples

    return examples(org, load_model(org.base, device="cpu", dtype="float32"))


if __name__ == "__main__":
    raise SystemExit(main())
