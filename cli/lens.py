"""`readout lens`: train the tuned lens of depth runs for one model (readouts/lens.py), and show one."""

from __future__ import annotations

import click

from cli.options import PROGRESS, bounded, model_options
from contract.options import COUNT, INDEX, LEARNING_RATE
from readouts.lens import LensSettings


@click.group("lens")
def lens_group():
    """The tuned lens of depth runs (docs/depth.md): train one for a model, show one."""


@lens_group.command("train")
@model_options()
@click.option("--panel", default="gap-v2", show_default=True, help="gap panel whose context sentences are the text")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="the lens file to write (.safetensors)")
@click.option("--steps", default=LensSettings.steps, show_default=True, type=bounded(COUNT))
@click.option("--batch", default=LensSettings.batch, show_default=True, type=bounded(COUNT), help="positions per step")
@click.option("--lr", default=LensSettings.lr, show_default=True, type=bounded(LEARNING_RATE), help="Adam's step size")
@click.option("--seed", default=LensSettings.seed, show_default=True, type=bounded(INDEX))
@click.option("--scenarios", "max_train", default=LensSettings.max_train_scenarios, show_default=True,
              type=bounded(COUNT), help="training scenarios at most")
@click.option("--held-out", "max_held", default=LensSettings.max_held_out_scenarios, show_default=True,
              type=bounded(COUNT), help="held-out scenarios the KL comparison is measured on, at most")
@PROGRESS
def train_cmd(panel, out, steps, batch, lr, seed, max_train, max_held, progress, model):
    """Train a tuned lens on the panel's context sentences and write it to --out."""
    from tqdm.auto import tqdm

    from readouts.lens import kl_lines, train_lens_file
    from readouts.manifest import file_sha256

    settings = LensSettings(steps=steps, batch=batch, lr=lr, seed=seed, max_train_scenarios=max_train,
                            max_held_out_scenarios=max_held)
    bar = tqdm(total=steps, desc="tuned lens", disable=not progress, dynamic_ncols=True)
    path, meta = train_lens_file(model, panel, settings, out,
                                 progress=lambda i, loss: (bar.update(1), bar.set_postfix(loss=f"{loss:.3f}")))
    bar.close()
    for line in kl_lines(meta):
        click.echo(line)
    click.echo(f"wrote {path} (sha256 {file_sha256(path)[:12]})", err=True)


@lens_group.command("show")
@click.argument("path", type=click.Path(dir_okay=False))
def show_cmd(path):
    """Print what a lens file was trained for and its held-out KL beside the logit lens's."""
    from engine.tuned_lens import TunedLens
    from readouts.lens import kl_lines

    meta = TunedLens.load(path).meta
    click.echo(f"model {meta['model']}; panel {meta['panel']['name']}; settings {meta['settings']}; seconds {meta['seconds']}")
    for line in kl_lines(meta):
        click.echo(line)
