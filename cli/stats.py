"""The analysis commands: `readout stats` and `compare` (the gap paper's analysis of runs, and across runs), and
`nsi-stats`, `nsi-export` and `nsi-gold` (the negation audit's statistics, its sample for human coding, and the
gold labels against the binary proxy). They read run tables only; no model loads."""

from __future__ import annotations

import click

from cli.options import MASS_FLOOR, N_BOOT, bounded
from contract.names import NSI_NULLS
from contract.options import COUNT, INDEX
from engine.errors import ReadoutError


@click.command("stats")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None, help="output folder (default RUN_DIR/stats; one run only)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
@N_BOOT
@MASS_FLOOR
@click.option("--pool", default=None, metavar="NAME",
              help="analyse the runs (pods of one model) as one union named NAME, written to --out or PARENT/NAME/stats")
def stats_cmd(run_dirs, out, seed, n_boot, mass_floor, pool):
    """The gap paper's analysis of each run: screen, excess, ladder, control, dose; tables and figures."""
    from stats.gap import run_report

    kwargs = {"mass_floor": mass_floor}
    if pool is not None:
        from stats.gap.tables import pool_runs

        for line in run_report(pool_runs(run_dirs, pool), out_dir=out, seed=seed, n_boot=n_boot, **kwargs):
            click.echo(line)
        return
    if out is not None and len(run_dirs) > 1:
        raise ReadoutError("--out: give it with one run directory (each run writes its own RUN_DIR/stats)")
    from stats.depth.report import is_depth_run, run_depth_report
    from stats.steer import is_steer_run, run_steer_report

    for run_dir in run_dirs:
        if is_steer_run(run_dir):  # a steering run holds no probes table: its own tables and figure only
            for line in run_steer_report(run_dir, out_dir=out, seed=seed, n_boot=n_boot):
                click.echo(line)
            continue
        if is_depth_run(run_dir):  # the depth tables and figures, then the gap analysis where the run allows it
            for line in run_depth_report(run_dir, out_dir=out, seed=seed, n_boot=n_boot):
                click.echo(line)
        for line in run_report(run_dir, out_dir=out, seed=seed, n_boot=n_boot, **kwargs):
            click.echo(line)


@click.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", required=True, help="output folder")
@click.option("--role", "roles", multiple=True, help="RUN_DIR=lineage:stage, e.g. runs/x=olmo-3-7b:sft (stage: base, sft, "
              "dpo, final, a step like rl-200 or step-1000, or any name with --order); overrides the lineage and "
              "stage the run's manifest records")
@click.option("--order", default=None, help="stages in plotting order, comma-separated (default: sft, dpo, by step, final)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
@N_BOOT
@MASS_FLOOR
def compare_cmd(run_dirs, out, roles, order, seed, n_boot, mass_floor):
    """Across runs: checkpoint sweep, base vs instruct (raw frame), chat-vs-raw bridge, cross-recipe table."""
    from stats.depth.compare import depth_compare
    from stats.gap.compare_report import compare_command

    role_map = dict(r.partition("=")[::2] for r in roles)
    for line in depth_compare(run_dirs, out, role_map, seed=seed, n_boot=n_boot):  # depth runs: their curves overlaid
        click.echo(line)
    for line in compare_command(run_dirs, out, roles, order, seed=seed, n_boot=n_boot, mass_floor=mass_floor):
        click.echo(line)


@click.command("nsi-stats")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None, help="output folder (default RUN_DIR/stats for one run; required for several)")
@click.option("--groups", default=None, type=click.Path(dir_okay=False), help="model -> group mapping (JSON, or CSV model,group)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
@click.option("--null", "null_mode", type=click.Choice(list(NSI_NULLS)), default=next(iter(NSI_NULLS)), show_default=True,
              help="the NSI's no-framing-effect null: " + "; ".join(f"{k}: {v}" for k, v in NSI_NULLS.items())
                   + ". Recorded in every table and in the headlines")
@click.option("--params", default=None, type=click.Path(dir_okay=False),
              help="model -> parameter count (JSON object) for the scale correlation (sec. 4.4)")
def nsi_stats_cmd(run_dirs, out, groups, seed, null_mode, params):
    """Negation-sensitivity statistics across one or more `readout nsi` runs."""
    from stats.nsi import load_groups, load_params, run_nsi_stats

    if len(run_dirs) > 1 and out is None:
        raise ReadoutError("--out: required when several run directories are given")
    for line in run_nsi_stats(list(run_dirs), out, groups=load_groups(groups) if groups else None, seed=seed,
                              null_mode=null_mode, params=load_params(params) if params else None):
        click.echo(line)


@click.command("nsi-export")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--n", "n_items", default=200, show_default=True, type=bounded(COUNT), help="items to sample")
@click.option("--stratify", default="framing", show_default=True, help="column(s) to stratify by, comma-separated "
              "(e.g. framing,model across several runs)")
@click.option("--allocation", type=click.Choice(["equal", "paper"]), default="equal", show_default=True,
              help="equal shares per stratum, or the paper's Sample A mix (negated framings oversampled)")
@click.option("--out", "-o", default=None, help="output folder (default RUN_DIR/coding for one run; required for several)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
def nsi_export_cmd(run_dirs, n_items, stratify, allocation, out, seed):
    """A stratified sample of replies of one or several runs for human coding (Label Studio import and CSV)."""
    from pathlib import Path

    from stats.nsi import export_sample

    if len(run_dirs) > 1 and out is None:
        raise ReadoutError("--out: required when several run directories are given")
    for line in export_sample(list(run_dirs), out or str(Path(run_dirs[0]) / "coding"), n=n_items, stratify=stratify,
                              seed=seed, allocation=allocation):
        click.echo(line)


@click.command("nsi-gold")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--gold", "gold", required=True, type=click.Path(dir_okay=False), help="adjudicated gold labels")
@click.option("--rater-a", default=None, type=click.Path(dir_okay=False), help="rater A's independent labels")
@click.option("--rater-b", default=None, type=click.Path(dir_okay=False), help="rater B's independent labels")
@click.option("--second", default=None, type=click.Path(dir_okay=False),
              help="without rater files: a second file compared with the gold file for reliability")
@click.option("--groups", default=None, type=click.Path(dir_okay=False), help="model -> group mapping (JSON, or CSV model,group)")
@click.option("--out", "-o", default=None, help="output folder for the tables (default RUN_DIR/coding for one run)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
def nsi_gold_cmd(run_dirs, gold, rater_a, rater_b, second, groups, out, seed):
    """Gold labels against the binary proxy: over-count, kappa, alpha, AC1, conflicts (and their permutation
    test by group), judge F1."""
    from pathlib import Path

    from stats.nsi import gold_report, load_groups

    if len(run_dirs) > 1 and out is None:
        raise ReadoutError("--out: required when several run directories are given")
    for line in gold_report(list(run_dirs), gold, second, out or str(Path(run_dirs[0]) / "coding"), seed=seed,
                            groups=load_groups(groups) if groups else None, rater_a=rater_a, rater_b=rater_b):
        click.echo(line)
