"""`readout steer`: the command line of the steering grid (readouts/steer/study.py)."""

from __future__ import annotations

import click

from contract.names import STEER_DIRECTIONS
from contract.options import INDEX, SPLIT
from engine.errors import ReadoutError
from engine.steering import POSITIONS
from readouts.options import bounded


def _numbers(text: str, name: str, kind=float) -> tuple:
    try:
        return tuple(kind(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ReadoutError(f"--{name}: '{text}' must be comma-separated {'integers' if kind is int else 'numbers'}") from None


def steer_command() -> click.Command:
    from readouts.cli import GAP_SET_HELP, _plan_options, _run, _run_options
    from readouts.gap.profile import PROFILES

    @click.command("steer")
    @click.option("--model", "-m", required=True, help="alias (see `readout models`), local folder or HF id")
    @_run_options(0, PROFILES, "run directory (default runs/<model>/<panel>/steer-<profile>-seed<seed>)", GAP_SET_HELP)
    @_plan_options
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
    def steer_cmd(panel, direction, layers, strengths, positions, n_random, train_fraction, **kwargs):
        """Steer the gap study's first-token readouts (D, J0, control, twins) on a held-out split; see docs/steering.md."""
        from readouts.steer.study import SteerSettings, SteerStudy

        settings = SteerSettings(direction=direction, layers=_numbers(layers, "layers", int),
                                 strengths=_numbers(strengths, "strengths"), positions=positions, random=n_random,
                                 train_fraction=train_fraction)
        _run(SteerStudy(settings=settings), kwargs, panel)

    return steer_cmd
