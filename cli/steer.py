"""`readout steer`: the steering experiment (readouts/steer/study.py) as runs of the gap study's first-token
readouts, one per split seed, then the pass rate over the seeds (readouts/steer/seeds.py)."""

from __future__ import annotations

import click

from cli.options import GAP_SET_HELP, bounded, model_options, numbers, plan_options, run_options
from cli.run import start
from contract.names import STEER_DIRECTIONS
from contract.options import COUNT, INDEX, MARGIN, RATIO
from engine.errors import ReadoutError
from engine.steering import POSITIONS
from readouts.gap.profile import PROFILES


@click.command("steer")
@model_options()
@run_options(0, PROFILES, "run directory (default runs/<model>/<panel>/steer-<profile>-seed<seed>; with several "
             "--split-seeds, one folder seed-S in it per seed)", GAP_SET_HELP, window=False)
@plan_options()
@click.option("--panel", default="gap-v2", show_default=True, help="gap panel name or JSONL path")
@click.option("--direction", default="pressure", show_default=True,
              help=f"{' or '.join(STEER_DIRECTIONS)} (from the direction part), or a .npy vector file ([hidden] or "
                   "[layers + 1, hidden])")
@click.option("--layers", required=True, help="depths steered, comma-separated (i: after decoder layer i; 0: embeddings)")
@click.option("--strengths", default="-2,-1,-0.5,0.5,1", show_default=True, help="multipliers of the direction")
@click.option("--positions", type=click.Choice(POSITIONS), default="read", show_default=True,
              help="add at the read position only, or at every position of the prompt")
@click.option("--random", "n_random", default=100, show_default=True, type=bounded(INDEX),
              help="random null directions of the same norm (read on the test part)")
@click.option("--fractions", default="1,1,1", show_default=True,
              help="shares of the direction, selection and test parts (normalized)")
@click.option("--shuffled/--no-shuffled", default=True, show_default=True,
              help="also read the label-shuffled null direction (a computed direction only)")
@click.option("--threshold", default=0.5, show_default=True, type=bounded(RATIO),
              help="the verdict needs E_steered / E0's 95% interval below this (0.5: halved)")
@click.option("--margin", default=0.05, show_default=True, type=bounded(MARGIN),
              help="equivalence margin of the did-not-move checks (90% intervals inside +-margin)")
@click.option("--split-seeds", default=3, show_default=True, type=bounded(COUNT),
              help="runs over split seeds --seed, --seed + 1, ... and the pass rate over them")
def steer_cmd(panel, direction, layers, strengths, positions, n_random, fractions, shuffled, threshold, margin,
              split_seeds, model, run, plan):
    """Steer the gap study's first-token readouts (D, J0, control, twins): direction, selection and test parts,
    the verdict on the test part; see docs/steering.md."""
    from readouts.steer.seeds import pass_rate_lines, seed_out
    from readouts.steer.study import SteerSettings, SteerStudy
    from stats.steer.rules import Rules

    parts = numbers(fractions, "fractions")
    if len(parts) != 3:
        raise ReadoutError(f"--fractions: want three shares (direction, selection, test), got '{fractions}'")
    settings = SteerSettings(direction=direction, layers=numbers(layers, "layers", int),
                             strengths=numbers(strengths, "strengths"), positions=positions, random=n_random,
                             fractions=parts, shuffled=shuffled, rules=Rules(threshold=threshold, margin=margin))
    first = run["seed"] or 0
    if plan is not None:
        start(SteerStudy(settings=settings), model, run, panel, plan)
        click.echo(f"plan: one split seed of {split_seeds}")
        return
    paths = []
    for seed in range(first, first + split_seeds):
        seeded = {**run, "seed": seed, "out": seed_out(run["out"], seed, split_seeds)}
        paths.append(_run(SteerStudy(settings=settings), model, seeded, panel))
    if split_seeds > 1:
        for line in pass_rate_lines(paths, run["out"]):
            click.echo(line)


def _run(study, model, run: dict, panel):
    """One seed's run; its directory."""
    from readouts.driver import RunOptions
    from readouts.driver import run as run_study

    return run_study(study, RunOptions(model=model, panel=panel, **run), log=lambda line: click.echo(line, err=True),
                     result=click.echo)
