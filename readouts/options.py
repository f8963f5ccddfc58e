"""click types of the numeric options declared in contract/options.py: bounds checked when the command line is
parsed, before any model loads or table is read (click's message names the option; `readouts.cli.main` prints it
on one line, exit 2)."""

from __future__ import annotations

import click

from contract.options import Numeric


def bounded(spec: Numeric) -> click.ParamType:
    if spec.kind is int:
        return click.IntRange(min=spec.low, max=spec.high, min_open=spec.low_open)
    return click.FloatRange(min=spec.low, max=spec.high, min_open=spec.low_open)
