"""`readout report`: one self-contained HTML page over run directories and results folders (readouts/report)."""

from __future__ import annotations

import click

from cli.options import bounded
from contract.options import INDEX
from readouts.report import write_report
from readouts.report.gather import DEFAULT_ITEMS


@click.command("report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None, type=click.Path(dir_okay=False),
              help="HTML file to write (default FOLDER/report.html; required for several folders)")
@click.option("--items", "max_items", default=DEFAULT_ITEMS, show_default=True, type=bounded(INDEX),
              help="scenarios (dilemmas) per run in the drill-down")
def report_cmd(paths, out, max_items):
    """One self-contained HTML page over gap runs, NSI runs and comparison folders: figures, tables, the
    manifest and a per-scenario drill-down (prompts, rollouts, letter masses). Reads each run's stats/ folder
    as `readout stats` / `readout nsi-stats` wrote it (run those first for the figures)."""
    for line in write_report(list(paths), out, max_items):
        click.echo(line)
