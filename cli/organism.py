"""`readout organism ...`: list the shipped organisms, retrain one from its recipe, show its record, and the demo
(organisms/)."""

from __future__ import annotations

import json
import time

import click

from cli.options import PROGRESS
from engine.errors import ReadoutError
from organisms import RECIPE_FILE, SHIPPED, shipped_path
from organisms.demo import DEMO_QUANTITIES, demo_rows, planted_excess, recipe
from organisms.recipes import ORGANISMS


@click.group("organism")
def organism_group():
    """Model organisms: adapters with planted, known effects (docs/organisms.md)."""


@organism_group.command("list")
def list_cmd():
    """The shipped organisms: what each plants, and whether its adapter is in the repository."""
    for org in ORGANISMS.values():
        folder = shipped_path(org.name)
        state = "shipped" if folder else "not trained"
        click.echo(f"{org.name:18} {org.study:4} {org.panel:7} {state:11} {org.plants}")


@organism_group.command("train")
@click.argument("name")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="adapter folder to write (default: organisms/data/NAME, the shipped one)")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="override the recipe's optimizer steps")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default: torch's choice)")
@click.option("--afresh", is_flag=True, help="a checkpointed recipe: start again instead of resuming a stopped run")
def train_cmd(name, out, steps, threads, afresh):
    """Train organism NAME from its recipe (organisms/recipes.py) and write its adapter folder. A recipe that keeps a
    lineage or streams its frozen layers writes checkpoints as it goes, and a stopped run resumes from the last one."""
    from tqdm import tqdm

    from organisms.resumable import retrain

    total = steps or recipe(name).steps
    t0 = time.perf_counter()
    bars = []

    def progress(step, loss):  # the bar starts with the first step (at a resumed run's step)
        if not bars:
            bars.append(tqdm(total=total, initial=step, desc=f"train {name}", unit="step"))
        bars[0].update(1)
        bars[0].set_postfix(loss=f"{loss:.4f}")

    folder, worst = retrain(name, out, steps=steps, threads=threads, resume=not afresh, progress=progress,
                            log=lambda line: click.echo(line, err=True))
    for bar in bars:
        bar.close()
    error = "" if worst is None else f"; largest mean training error of a readout/cell {worst:.3f}"
    click.echo(f"{name}: trained in {time.perf_counter() - t0:.0f} s{error}; written to {folder}")


@organism_group.command("show")
@click.argument("name")
def show_cmd(name):
    """An organism's recipe and training error as recorded beside its adapter."""
    folder = shipped_path(recipe(name).name)
    if folder is None:
        raise ReadoutError(f"organism {name}: no adapter in {SHIPPED / name}; train it with `readout organism train {name}`")
    record = json.loads((folder / RECIPE_FILE).read_text())
    click.echo(f"{name}: {record['plants']}")
    click.echo(f"retrain: {record['retrain']}  ({record['seconds']} s on {record['threads']} threads)")
    for key, v in record["training_error"].items():
        click.echo(f"  {key:22} target {v['target']:.3f}  reached {v['reached']:.3f}  mean |error| "
                   f"{v['mean_abs_error']:.3f}  max {v['max_abs_error']:.3f}  (n {v['n']})")


@organism_group.command("demo")
@click.argument("name", default="gap")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="read only the first N records")
@click.option("--out", type=click.Path(file_okay=False), default="runs/organism-demo", show_default=True)
@PROGRESS
def demo_cmd(name, limit, out, progress):
    """The quick gap study on the base model and on organism NAME (its training panel): the instrument finds the
    planted excess in one and none in the other."""
    rows = demo_rows(name, out, limit=limit, progress=progress, log=lambda line: click.echo(line, err=True))
    org = recipe(name)
    click.echo(f"\nquick gap study on {org.panel} ({org.plants.split(':')[0]}; planted E {planted_excess(org):+.2f})")
    click.echo(f"{'model':28} " + "  ".join(f"{q:>26}" for _, q, _ in DEMO_QUANTITIES))
    for label, ests in rows:
        cells = [(f"{e.value:+.3f} [{e.low:+.3f}, {e.high:+.3f}] n={e.n}" if e is not None and e.low is not None
                  else ("n=0" if e is not None else "-")) for e in ests]
        click.echo(f"{label:28} " + "  ".join(f"{c:>26}" for c in cells))
