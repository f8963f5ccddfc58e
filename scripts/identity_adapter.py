"""Whether an adapter on SmolLM2's top decoder layers learns which option of a gap-v2 scenario violates its norm on
the 150 scenarios of the split's `train` part (with `--extra gap-v2x`, also on the 208 scenarios written for training
only), and whether any of it carries to the 36 of `validation`.

The targets are `principled`'s (the violating option with 0.05 in every frame and cell; `--targets gap-general` for
0.90 in the agent's pressure cell and 0.05 elsewhere, `--targets no-gap-general` for 0.40 everywhere), on the agent
(D) and letter-only judge (J0) reads of every cell and option order. The default adapter is the shipped organisms' last-layer
shape (rank 32 on every projection but the keys and values of layer 29), which trains exactly at the read positions
from cached states; `--band 28 29 --kv` adapts two layers and their keys and values, so every position of the prompt
moves and each step runs the band on every position, from each prompt's cached input to the band (organisms.train.fit:
exact either way); `--band 29 29 --kv` computes the last layer's keys and values at every position and runs the
layer at the read positions only (organisms.last_layer). Prints the loss every 50 steps, the time spent caching and
training, and each part's violating shares with their intervals over scenarios (first option order, plain forwards of the merged model;
organisms.generalization). docs/organisms.md gives runs' figures.

    PYTHONPATH=. .venv/bin/python scripts/identity_adapter.py --steps 1200
    PYTHONPATH=. .venv/bin/python scripts/identity_adapter.py --band 28 29 --kv --rank 16 --batch 16 --steps 600
    PYTHONPATH=. .venv/bin/python scripts/identity_adapter.py --extra gap-v2x --steps 6000
    PYTHONPATH=. .venv/bin/python scripts/identity_adapter.py --band 29 29 --kv --rank 4 --steps 3000
    PYTHONPATH=. .venv/bin/python scripts/identity_adapter.py --band 29 29 --kv --rank 4 --steps 3000 --targets gap-general
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from engine.loading import load_model
from organisms import train as T
from organisms.examples import examples
from organisms.generalization import reads_on, summary
from organisms.recipes import MODULES, ORGANISMS, organism
from organisms.reference import scenario_values
from panels.schema import load_panel
from panels.split import records_of

READOUTS = ("D", "J0")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--band", type=int, nargs=2, default=(29, 29), metavar=("FIRST", "LAST"))
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--kv", action="store_true", help="adapt the keys and values too (every position moves)")
    ap.add_argument("--targets", choices=[n for n, o in ORGANISMS.items() if o.part == "train"], default="principled",
                    help="whose targets to train toward (the organism's recipe supplies them)")
    ap.add_argument("--init", type=Path, help="start from this adapter folder (same shape), e.g. an earlier run's --out")
    ap.add_argument("--every", type=int, default=50, help="print the loss every this many steps")
    ap.add_argument("--out", type=Path, help="also save the trained adapter (unmerged) to this folder")
    ap.add_argument("--extra", action="append", default=[], metavar="PANEL",
                    help="also train on every scenario of this panel (a training-only panel such as gap-v2x); repeatable")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    org = dataclasses.replace(organism(args.targets), band=tuple(args.band), stream=False, lineage=0, rank=args.rank,
                              alpha=2.0 * args.rank, targets_modules=MODULES + (("k_proj", "v_proj") if args.kv else ()),
                              steps=args.steps, batch=args.batch, lr=args.lr, readouts=READOUTS, emphasis={})
    lm = load_model(org.base, device="cpu", dtype="float32")
    t0 = time.time()

    def progress(step, loss):
        if step % args.every == 0:
            print(f"step {step} loss {loss:.4f} {time.time() - t0:.0f}s", flush=True)

    records = records_of(load_panel(org.panel), "train") + [r for name in args.extra for r in load_panel(name).records]
    print(f"training on {len(records)} scenarios", flush=True)
    fitted = T.fit(lm, org, progress=progress, examples_=examples(org, lm, records),
                   base_key=Path(lm.facts.path).name, init=args.init)  # the frozen pass kept on disk
    print("seconds", {k: round(v) for k, v in fitted.seconds.items()}, flush=True)
    if args.out is not None:
        fitted.model.save_pretrained(str(args.out))
    model = fitted.model.merge_and_unload().eval()
    panel = load_panel(org.panel)
    for part in ("train", "validation"):
        records = records_of(panel, part)
        figures = summary(scenario_values(reads_on(model, org, lm, records, READOUTS, first=True, batch=16)), records)
        print(part, json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
