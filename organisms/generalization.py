"""An organism's true values on records it was not trained on (a split's validation slice or held-out part): plain
forwards of the merged model on the quick profile's reads, averaged as the gap paper defines them, per scenario,
with a percentile bootstrap interval over scenarios.

`python -m organisms.generalization NAME --part validation [--adapter DIR | --checkpoint FILE]` prints them for a
shipped or trained adapter, or for a training run's checkpoint while it runs (the base model without either);
`--panel gap-v1` reads every record of another panel instead (out of distribution); `--reference DIR` takes the reads
from the reference.json an organism's held-out reference wrote (no forward). `--reads first` reads only
each read's first option order and judge frame (a quarter of the forwards, for choosing recipes); `--batch`
right-pads prompts of similar length into one forward (each read position sees its own prefix only; the masses agree
with one-prompt forwards to about 1e-6), for the exact one-prompt forwards of organisms.reference leave it at 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from organisms.examples import examples
from organisms.reference import Read, plain_reads, scenario_values

BOOT = 4000
CELLS = ("primary", "twin")


def interval(values, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its percentile bootstrap interval over them."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(BOOT, len(x)))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    return float(x.mean()), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def reads_on(model, org, lm, records, readouts=("D", "J", "J0"), first: bool = False, batch: int = 1) -> list[Read]:
    """The reads of `readouts` on `records` in the primary and twin cells (`first`: only each read's first order or
    frame) through `model`, the merged organism (organisms.reference.plain_reads: one prompt per forward, or
    right-padded batches of `batch`)."""
    reader = dataclasses.replace(org, readouts=tuple(readouts))
    exs = [e for e in examples(reader, lm, records) if e.cell in CELLS and (not first or e.key.endswith("|o0"))]
    return plain_reads(model, exs, batch=batch)


def excess(values: dict, records, judgment: str = "J") -> dict:
    """Per scenario: g = p_D - p_judgment in the primary and in the twin, and E = g_primary - g_twin."""
    out = {}
    for r in records:
        g = {c: values[(r.id, c, "D")] - values[(r.id, c, judgment)] for c in CELLS}
        out[r.id] = dict(family=r.family, g_primary=g["primary"], g_twin=g["twin"], E=g["primary"] - g["twin"])
    return out


def summary(values: dict, records) -> dict:
    """E against J (and J0 where read), each family's mean E, and each readout and cell's mean violating share,
    with intervals over scenarios."""
    out = {}
    for judgment in ("J", "J0"):
        if all((r.id, "primary", judgment) in values for r in records):
            per = excess(values, records, judgment)
            out[f"E_{judgment}"] = interval([v["E"] for v in per.values()])
            if judgment == "J":
                for fam in sorted({v["family"] for v in per.values()}):
                    out[f"E_J/{fam}"] = float(np.mean([v["E"] for v in per.values() if v["family"] == fam]))
    for readout, cell in sorted({(k[2], k[1]) for k in values if len(k) == 3}):
        out[f"p_{readout}/{cell}"] = interval([values[(r.id, cell, readout)] for r in records
                                               if (r.id, cell, readout) in values])
    return out


def reference_values(folder) -> dict:
    """{(scenario, cell, readout): mean violating share over its reads} from the reference.json in `folder` (the
    plain-forward reads organisms.reference wrote)."""
    import json
    from pathlib import Path

    from organisms.reference import REFERENCE_FILE

    shares: dict = {}
    for key, (share, _tempered, _mass) in json.loads((Path(folder) / REFERENCE_FILE).read_text())["reads"].items():
        shares.setdefault(tuple(key.split("|")[:3]), []).append(share)
    return {k: float(np.mean(v)) for k, v in shares.items()}


def main(argv=None) -> int:
    import argparse
    import json
    from pathlib import Path

    import torch

    from engine.loading import load_model
    from organisms.recipes import organism
    from panels.schema import load_panel
    from panels.split import records_of

    ap = argparse.ArgumentParser(prog="python -m organisms.generalization", description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="the organism whose recipe (panel, readouts, targets) the reads follow")
    ap.add_argument("--part", default="validation")
    ap.add_argument("--panel", help="read every record of this panel instead (e.g. gap-v1: out of distribution)")
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--adapter", help="an adapter folder (default: none, the base model)")
    source.add_argument("--checkpoint", help="a training run's checkpoint.pt (organisms/resumable.py)")
    source.add_argument("--reference", help="an adapter folder whose reference.json (organisms.reference) holds the "
                                            "reads of the records it names: no forward is run")
    ap.add_argument("--reads", choices=("all", "first"), default="all")
    ap.add_argument("--readouts", default="D,J,J0")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    org = organism(args.name)
    records = load_panel(args.panel).records if args.panel else records_of(load_panel(org.panel), args.part)
    if args.reference:
        from organisms.reference import REFERENCE_FILE

        stored = json.loads((Path(args.reference) / REFERENCE_FILE).read_text())
        records = [r for r in load_panel(org.panel).records if r.id in set(stored["records"])]
        if not records:
            raise SystemExit(f"{Path(args.reference) / REFERENCE_FILE}: records: none of {org.panel}'s")
        values, label = reference_values(args.reference), f"{args.reference} (its reference.json)"
        n_reads = len(stored["reads"])
    else:
        lm = load_model(org.base, device="cpu", dtype="float32", adapter=args.adapter)
        model, label = lm.model, args.adapter or "base model"
        if args.checkpoint:
            from organisms.resumable import checkpoint_model

            model, step = checkpoint_model(lm, org, args.checkpoint)
            label = f"{args.checkpoint} (step {step})"
        reads = reads_on(model, org, lm, records, args.readouts.split(","), args.reads == "first", args.batch)
        values, n_reads = scenario_values(reads), len(reads)
    figures = summary(values, records)
    where = (f"{args.panel} (every record)" if args.panel else
             f"{org.panel}, the reference's records" if args.reference else f"{org.panel} {args.part}")
    print(f"{args.name} recipe, {label}, {where} ({len(records)} scenarios, {n_reads} reads)")
    for key, v in figures.items():
        print(f"  {key:18} " + (f"{v[0]:+.4f} [{v[1]:+.4f}, {v[2]:+.4f}]" if isinstance(v, tuple) else f"{v:+.4f}"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(source=label, panel=args.panel or org.panel, part=None if args.panel or args.reference else args.part,
                           reads=n_reads, figures=figures), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
