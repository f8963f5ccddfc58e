"""`readout organism ...`: list the shipped organisms, retrain one from its recipe, and print its true values (the
plain-forward reference) beside what it plants."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from engine.errors import ReadoutError
from organisms import RECIPE_FILE, SHIPPED, shipped_path
from organisms.recipes import ORGANISMS, organism


def resolve_adapter(value: str | None) -> str | None:
    """`--peft` value: a folder as given, or the folder of the shipped organism of that name."""
    if value is None or Path(value).expanduser().is_dir():
        return value
    found = shipped_path(value)
    if found is not None:
        return str(found)
    raise ReadoutError(f"--peft: {value}: no such adapter folder, and no shipped organism of that name "
                       f"({', '.join(ORGANISMS)})")


def _recipe(name: str):
    try:
        return organism(name)
    except KeyError as exc:
        raise ReadoutError(f"organism: {exc.args[0]}") from None


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
def train_cmd(name, out, steps, threads):
    """Train organism NAME from its recipe (organisms/recipes.py) and write its adapter folder."""
    import dataclasses

    import torch
    from tqdm import tqdm

    from engine.loading import load_model
    from organisms import train

    org = _recipe(name)
    if steps is not None:
        org = dataclasses.replace(org, steps=steps)
    if threads is not None:
        torch.set_num_threads(threads)
    lm = load_model(org.base, device="cpu", dtype="float32")
    t0 = time.perf_counter()
    bar = tqdm(total=org.steps, desc=f"train {name}", unit="step")

    def progress(step, loss):
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")

    fitted = train.fit(lm, org, progress=progress, base_key=f"{org.base}:{lm.facts.path}")
    bar.close()
    folder = train.save(fitted, org, Path(out) if out else SHIPPED / name)
    worst = max(v["mean_abs_error"] for v in train.error_summary(fitted.errors).values())
    click.echo(f"{name}: trained in {time.perf_counter() - t0:.0f} s; largest mean training error of a readout/cell "
               f"{worst:.3f}; written to {folder}")


@organism_group.command("show")
@click.argument("name")
def show_cmd(name):
    """An organism's recipe and training error as recorded beside its adapter."""
    folder = shipped_path(_recipe(name).name)
    if folder is None:
        raise ReadoutError(f"organism {name}: no adapter in {SHIPPED / name}; train it with `readout organism train {name}`")
    record = json.loads((folder / RECIPE_FILE).read_text())
    click.echo(f"{name}: {record['plants']}")
    click.echo(f"retrain: {record['retrain']}  ({record['seconds']} s on {record['threads']} threads)")
    for key, v in record["training_error"].items():
        click.echo(f"  {key:22} target {v['target']:.3f}  reached {v['reached']:.3f}  mean |error| "
                   f"{v['mean_abs_error']:.3f}  max {v['max_abs_error']:.3f}  (n {v['n']})")
