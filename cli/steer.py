"""`readout steer`: the steering grid (readouts/steer/study.py) as a run of the gap study's first-token readouts."""

from __future__ import annotations

import click

from cli.options import GAP_SET_HELP, bounded, model_options, numbers, plan_options, run_options
from cli.run import start
from contract.names import STEER_DIRECTIONS
from contract.options import INDEX, SPLIT
from engine.steering import POSITIONS
from readouts.gap.profile import PROFILES


@click.command("steer")
@model_options()
@run_options(0, PROFILES, "run directory (default runs/<model>/<panel>/steer-<profile>-seed<seed>)", GAP_SET_HELP, window=False)
@plan_options()
@click.option("--panel", default="gap-v2", show_default=True, help="gap panel name or JSONL path")
@click.option("--direction", default="pressure", show_default=True,
              help=f"{' or '.join(STEER_DIRECTIONS)} (from the training split), or a .npy vector file ([hidden] or "
                   "[layers + 1, hidden])")
@click.option("--layers", required=True, help="depths steered, comma-separated (i: after decoder layer i; 0: embeddings)")
@click.option("--strengths", default="-2,-1,-0.5,0.5,1", show_default=True, help="multipliers of the direction")
@click.option("--positions", type=click.Choice(POSITIONS), default="read", show_default=True,
              help="add at the read position only, or at every position of the prompt")
@click.option("--random", "n_random", default=3, show_default=True, type=bounded(INDEX), help="random null directions of the same norm")
@click.option("--train-fraction", default=0.5, show_default=True, type=bounded(SPLIT), help="share of each family used for directions")
def steer_cmd(panel, direction, layers, strengths, positions, n_random, train_fraction, model, run, plan):
    """Steer the gap study's first-token readouts (D, J0, control, twins) on a held-out split; see docs/steering.md."""
    from readouts.steer.study import SteerSettings, SteerStudy

    settings = SteerSettings(direction=direction, layers=numbers(layers, "layers", int),
                             strengths=numbers(strengths, "strengths"), positions=positions, random=n_random,
                             train_fraction=train_fraction)
    start(SteerStudy(settings=settings), model, run, panel, plan)
