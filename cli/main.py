"""The `readout` entry point: the commands assembled, and every failure turned into one line on stderr with exit
code 2 (bad input of any kind) or 130 (interrupted; finished chunks are kept)."""

from __future__ import annotations

import sys

import click

from cli.lens import lens_group
from cli.organism import organism_group
from cli.panels import panels_group
from cli.report import report_cmd
from cli.run import merge_cmd, models_cmd, nsi_cmd, run_cmd, score_cmd
from cli.show import show_cmd
from cli.stats import compare_cmd, nsi_export_cmd, nsi_gold_cmd, nsi_stats_cmd, stats_cmd
from cli.steer import steer_cmd
from cli.sweep import sweep_cmd
from cli.watch import watch_cmd
from engine.errors import ReadoutError
from panels.records import PanelError
from stats.core.errors import StatsInputError

COMMANDS = (models_cmd, score_cmd, run_cmd, merge_cmd, nsi_cmd, stats_cmd, compare_cmd, nsi_stats_cmd, nsi_export_cmd,
            nsi_gold_cmd, sweep_cmd, watch_cmd, show_cmd, report_cmd, organism_group, panels_group, lens_group, steer_cmd)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logit-readout", prog_name="readout", message="%(prog)s (logit-readout) %(version)s")
def cli():
    """logit-readout: read the probability a model puts on answer letters, across frames."""


for command in COMMANDS:
    cli.add_command(command)


def main(argv=None):
    """Entry point: click does the parsing; ReadoutError becomes one line and exit code 2."""
    try:
        rv = cli.main(args=argv, prog_name="readout", standalone_mode=False)
    except (ReadoutError, PanelError, StatsInputError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # a bad option or value: one line, naming the command's --help
        ctx = exc.ctx
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        click.echo(f"error: {exc.format_message()}{where}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted: finished chunks are kept; give the same command again to resume", err=True)
        sys.exit(130)
    except UnicodeDecodeError as exc:
        click.echo(f"error: a file is not UTF-8 text (byte {exc.start}: {exc.reason})", err=True)
        sys.exit(2)
    except OSError as exc:  # read-only folder, disk full, a path that is a file: the path and the reason
        where = exc.filename if exc.filename is not None else "file system"
        click.echo(f"error: {where}: {exc.strerror or exc}", err=True)
        sys.exit(2)
    sys.exit(rv if isinstance(rv, int) else 0)
