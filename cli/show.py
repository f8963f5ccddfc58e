"""`readout show`: one scenario (dilemma) of a run as the model read it: a summary by default, the whole detail or a
part of it on request (readouts/show.py reads and formats, readouts/show_summary.py summarizes)."""

from __future__ import annotations

import click


@click.command("show")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("item_id")
@click.option("--all", "show_all", is_flag=True, help="every prompt, rollout text and letter mass (a quick run's scenario: "
              "about a thousand lines)")
@click.option("--cell", default=None, help="the detail of this cell only (primary, twin, ...); implies the detail")
@click.option("--readout", default=None, help="the detail of this readout only (D, J, J0, ...); implies the detail")
@click.option("--frame", default=None, help="the detail of this frame (agent, judge_1, ...) or NSI framing (F0-F3) only; "
              "implies the detail")
def show_cmd(run_dir, item_id, show_all, cell, readout, frame):
    """One scenario of a run as the model read it (an NSI run: one dilemma). By default a summary: per cell, readout
    and frame the violating mass, the violating fraction, the letter mass and the judged option (NSI: per framing the
    continuous reading and the replies' tally). --all prints every prompt, each rollout's text and read rule and the
    letter masses; --cell / --readout / --frame print that detail for the prompts they select."""
    from readouts.show import format_view, item_view
    from readouts.show_summary import format_summary, narrow

    view = item_view(run_dir, item_id)
    if show_all or cell or readout or frame:
        click.echo(format_view(narrow(view, cell=cell, readout=readout, frame=frame)))
    else:
        click.echo(format_summary(view))
