"""`readout watch DIR`: each checkpoint a trainer writes under DIR read as a run of a sweep once complete, in step
order, then compared (readouts/watch.py)."""

from __future__ import annotations

from pathlib import Path

import click

from cli.options import loading_options, sweep_run_options, sweep_study_options

WATCH_OUT_HELP = "the sweep's folder (default DIR/watch): runs/checkpoint-<step>/, sweep.toml, sweep.json and compare/"


@click.command("watch")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--model", "-m", "base", default=None, help="the base model of adapter checkpoints (alias, folder or HF id; "
              "default: each adapter_config.json's base_model_name_or_path)")
@click.option("--lineage", default=None, help="the checkpoints' lineage in the comparison (default: DIR's name); each "
              "checkpoint-<step> is stage step-<step>")
@sweep_study_options
@click.option("--poll", default=10.0, show_default=True, type=click.FloatRange(min=0.05), help="seconds between looks at DIR")
@click.option("--quiet", default=600.0, show_default=True, type=click.FloatRange(min=0), help="stop after this many seconds "
              "without a new complete checkpoint")
@click.option("--settle", default=5.0, show_default=True, type=click.FloatRange(min=0), help="a checkpoint is read once "
              "no file in it has changed for this many seconds (and its weights are whole)")
@sweep_run_options(WATCH_OUT_HELP)
@loading_options()
def watch_cmd(folder, base, lineage, kind, panel, readouts, sample, n_boot, mass_floor, poll, quiet, settle, run, loading):
    """Read each checkpoint-<step> folder (full weights or a PEFT adapter) that appears under FOLDER once it is
    complete, in step order, as a run of a sweep, then compare them; stops after --quiet seconds without a new one or
    on SIGINT/SIGTERM. Watching again resumes; a half-written or corrupt checkpoint is named and tried again."""
    from readouts.watch import watch

    out = Path(run.pop("out") or Path(folder) / "watch")
    study = {**run, "panel": panel, "readouts": readouts, "sample": sample}
    for line in watch(folder, out, study=study, loading=loading, base=base, lineage=lineage, kind=kind, n_boot=n_boot,
                      mass_floor=mass_floor, poll=poll, quiet=quiet, settle=settle,
                      log=lambda line: click.echo(line, err=True)):
        click.echo(line)
