"""`readout panels ...`: validate, show, list and summarize panels (readouts/panel_tools.py computes)."""

from __future__ import annotations

import sys

import click

from cli.options import MODELS_FILES, bounded
from contract.names import CELLS
from contract.options import INDEX
from engine.errors import ReadoutError
from readouts.gap.profile import PROFILES as GAP_PROFILES


@click.group("panels")
def panels_group():
    """Validate, show and summarize panels (scenario files)."""


@panels_group.command("validate")
@click.argument("paths", nargs=-1, required=True)
def panels_validate(paths):
    """Validate panel files (or shipped panel names); exit 2 if any is invalid."""
    from readouts.panel_tools import validate

    failed = False
    for path, error, summary, warnings in validate(paths):
        if error:
            failed = True
            click.echo(f"error: {error}", err=True)
        else:
            for line in warnings:
                click.echo(f"warning: {line}", err=True)
            click.echo(f"ok {path}: {summary}")
    if failed:
        sys.exit(2)


@panels_group.command("show")
@click.argument("panel")
@click.argument("record_id")
@click.option("--frame", "-f", required=True, help="agent, judge_1..4, judge_letter, raw_agent, raw_judge, control, dose_*; F0..F3 for nsi")
@click.option("--cell", default="primary", show_default=True, type=click.Choice(CELLS))
@click.option("--order", "order_index", type=bounded(INDEX), default=None,
              help="order index as a run reads it (probes.parquet order_index; default: options as listed)")
@click.option("--seed", type=bounded(INDEX), default=0, show_default=True, help="the run's seed")
@click.option("--profile", default="quick", show_default=True, type=click.Choice(list(GAP_PROFILES)),
              help="the run's profile (its order counts)")
@click.option("--model", "-m", default=None, help="show the exact prompt this model reads (its template, BOS)")
@MODELS_FILES
@click.option("--frames", default="v1", show_default=True, help="the frames version the run read (v1, v2)")
def panels_show(panel, record_id, frame, cell, order_index, seed, profile, model, models_files, frames):
    """Print one scenario in one frame, as a run with this seed and profile renders it."""
    from readouts.panel_tools import show

    if models_files and model is None:
        raise ReadoutError("--models: registry files resolve --model; give it with --model")
    click.echo(show(panel, record_id, frame, cell, order_index, seed, model, profile, frames, models_files))


@panels_group.command("list")
def panels_list():
    """The shipped panels: name, kind, records (any JSONL path works as a panel too)."""
    from readouts.panel_tools import list_panels

    for name, kind, n, file in list_panels():
        click.echo(f"{name:<10} {kind:<4} {n:>4} records  panels/data/{file}")


@panels_group.command("stats")
@click.argument("panel")
def panels_stats(panel):
    """Counts by family and domain, and length distributions."""
    from readouts.panel_tools import stats

    click.echo(stats(panel))
