"""`readout sweep`: the gap study (or the framing-stability audit) over a list of checkpoints or revisions, then one
comparison (readouts/sweep.py)."""

from __future__ import annotations

from pathlib import Path

import click

from cli.options import loading_options, sweep_run_options, sweep_study_options, with_revision
from engine.errors import ReadoutError

SWEEP_OUT_HELP = "the sweep's folder (required): runs/<checkpoint>/, sweep.toml, sweep.json and compare/ go there"


@click.command("sweep")
@click.option("--model", "-m", "models", multiple=True, help="a checkpoint: alias, folder or HF id, each optionally @REV or "
              "@REV1,REV2,... (repeat --model for more)")
@click.option("--list", "list_file", default=None, type=click.Path(dir_okay=False),
              help="a file listing checkpoints, one a line: NAME [lineage:stage]")
@click.option("--stage", "stages", multiple=True, metavar="NAME=LINEAGE:STAGE",
              help="the role of a listed checkpoint (by its label, its name as listed, or a path to its folder), "
                   "e.g. ./ckpt=mine:step-100")
@click.option("--lineage", default=None, help="lineage of the checkpoints that get no other (default: the model's for "
              "NAME@REV, else the sweep folder's name)")
@sweep_study_options
@click.option("--revision", default=None, help="with one --model: its revision (same as --model NAME@REV)")
@sweep_run_options(SWEEP_OUT_HELP)
@loading_options()
def sweep_cmd(models, list_file, stages, lineage, kind, panel, readouts, sample, n_boot, mass_floor, revision, run, loading):
    """Run the gap study (or --study nsi) on each of several checkpoints or revisions (one run directory each,
    resumable; a finished run is skipped), then compare them along their lineage. --out names the sweep's folder."""
    from readouts.sweep import listed, parse_stages, plan, run_sweep

    if not run["out"]:
        raise ReadoutError("--out: required: the sweep's folder (runs/, sweep.toml, sweep.json and compare/ go there)")
    if revision is not None:
        if len(models) != 1 or list_file:
            raise ReadoutError("--revision: give it with exactly one --model and no @REV (or write NAME@REV1,REV2)")
        models = (with_revision(models[0], revision),)
    out = Path(run.pop("out"))
    checkpoints = plan(listed(models, list_file), parse_stages(stages), lineage, out.resolve().name, loading.registry_files)
    study = {**run, "panel": panel, "readouts": readouts, "sample": sample}
    for line in run_sweep(checkpoints, out, study=study, loading=loading, n_boot=n_boot, mass_floor=mass_floor, kind=kind,
                          log=lambda line: click.echo(line, err=True)):
        click.echo(line)
