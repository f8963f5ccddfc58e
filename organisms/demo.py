"""`readout organism demo`: the quick gap study on the base model and on an organism, the paired excess, the binary
excess and the control's move of each, so that the instrument is seen to find the planted effect in one and none in
the other."""

from __future__ import annotations

from pathlib import Path

from engine.errors import ReadoutError
from organisms import resolve_adapter
from organisms.recipes import organism

DEMO_QUANTITIES = (("continuous", "E", "all above floor"), ("binary", "binary_excess", "L0"),
                   ("control", "control_move", "all above floor"))
"""What the demo reports per model: (analysis, quantity, subset) of stats.gap's estimates."""
DEMO_READOUTS = "D,J,J0,control"
"""The readouts those need (the dose arms and the raw frame are left out of the demo: minutes on CPU)."""


def recipe(name: str):
    """The organism called `name`, or one line naming the known ones."""
    try:
        return organism(name)
    except KeyError as exc:
        raise ReadoutError(f"organism: {exc.args[0]}") from None


def planted_excess(org) -> float:
    """The paired excess E the recipe plants (0 for a recipe that plants no gap)."""
    if org.letter_a is not None:
        return 0.0
    g = lambda cell: org.target_violating("D", cell) - org.target_violating("J", cell)  # noqa: E731
    return g("primary") - g("twin")


def demo_rows(name: str, out: str | Path, limit: int | None = None, progress: bool = True, log=print) -> list[tuple]:
    """Run the quick gap study on the base model and on organism `name` (its training panel) into `out`/base and
    `out`/NAME; returns (label, [the DEMO_QUANTITIES estimates, None where absent]) for each."""
    from readouts.driver import ModelOptions, RunOptions, run
    from readouts.gap.study import GapStudy
    from readouts.options import Loading
    from stats.gap.analysis import analyze

    org = recipe(name)
    if org.study != "gap":
        raise ReadoutError(f"organism demo: {name} is an NSI organism; run `readout nsi --peft {name}` and `readout nsi-stats`")
    rows = []
    for label, adapter in ((org.base, None), (f"{org.base} + {name}", resolve_adapter(name))):
        folder = Path(out) / (name if adapter else "base")
        options = RunOptions(model=ModelOptions(org.base, loading=Loading(adapter=adapter)), panel=org.panel,
                             profile="quick", limit=limit, out=str(folder), progress=progress)
        run(GapStudy(readouts=DEMO_READOUTS), options, log=log, result=lambda line: None)
        est = {(e.analysis, e.quantity, e.subset): e for e in analyze(str(folder), n_boot=2000).estimates}
        rows.append((label, [est.get(k) for k in DEMO_QUANTITIES]))
    return rows
