"""The commands that read a model: `readout models`, `score`, `run` (the judgment-action study), `nsi` (the
framing-stability audit) and `merge` (a sharded run's chunks into its tables)."""

from __future__ import annotations

import sys

import click

from cli.options import (
    GAP_OUT_HELP,
    GAP_SET_HELP,
    MODELS_FILES,
    NSI_OUT_HELP,
    NSI_SET_HELP,
    bounded,
    generator_options,
    model_options,
    plan_options,
    run_options,
)
from cli.served import SERVED
from contract.options import COUNT, INDEX, TEMPERATURE, TOP_P
from engine.errors import ReadoutError
from readouts.gap.profile import PROFILES as GAP_PROFILES
from readouts.nsi.profile import PROFILES as NSI_PROFILES
from readouts.options import ModelOptions, RunOptions


def start(study, model: ModelOptions, run: dict, panel: str | None, plan: str | None) -> None:
    """Run `study` (or, with `plan`, print its plan on that GPU, or a served model's requests): the study commands'
    common end."""
    from readouts.driver import plan_run
    from readouts.driver import run as run_study

    options = RunOptions(model=model, panel=panel, **run)
    if model.served is not None and options.generation.engine != "own":
        raise ReadoutError("--generator: a served model draws its own replies; the generator is for a local checkpoint")
    if plan is not None and model.served is not None:
        from readouts.served_plan import served_plan_lines

        for line in served_plan_lines(study, options):
            click.echo(line)
        return
    if plan is not None:
        from readouts.plan import plan_lines

        rows, size, header, generator = plan_run(study, options, plan)
        for line in plan_lines(rows, size, plan, header, generator):
            click.echo(line)
        return
    run_study(study, options, log=lambda line: click.echo(line, err=True), result=click.echo)


@click.command("models")
@MODELS_FILES
def models_cmd(models_files):
    """List registered models (user registry entries with their file), where they come from, whether available."""
    from engine.loading import is_available
    from engine.registry import BUILTIN, registry

    rows = []
    for alias, spec in registry(models_files).items():
        ok, why = is_available(spec)
        origin = spec.hf_id or spec.path or "built offline"
        mine = f"[{spec.registry_file}]" if spec.registry_file not in (None, BUILTIN) else ""
        rows.append((alias, spec.source, origin, "yes" if ok else "no", " ".join(x for x in (why, mine) if x)))
    header = ("alias", "source", "origin", "available", "")
    widths = [max(len(r[i]) for r in [*rows, header]) for i in range(4)]
    for r in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + ("  " + r[4] if r[4] else ""))
    click.echo("\nAny local checkpoint folder or HF id in the local cache also works as --model.")


@click.command("score")
@click.argument("probes", type=click.Path(dir_okay=False))
@model_options()
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="output JSONL")
@click.option("--temperature", default=1.0, show_default=True, type=bounded(TEMPERATURE), help="sampling temperature for `tempered` (0 = greedy)")
@click.option("--top-p", default=1.0, show_default=True, type=bounded(TOP_P), help="nucleus for `tempered`")
@click.option("--max-batch", default=None, type=bounded(COUNT), help="rows per forward pass (default 64 CPU / 256 GPU)")
@click.option("--no-prefix-reuse", is_flag=True, help="do not share KV caches across probes with a common prefix")
@click.option("--plain", is_flag=True, help="reference path: one prompt at a time, full forward")
@click.option("--progress/--no-progress", default=None, help="progress bar (default: when stderr is a terminal)")
def score_cmd(probes, out, temperature, top_p, max_batch, no_prefix_reuse, plain, progress, model):
    """Score PROBES (JSONL, or .csv / .parquet): per probe, the mass on each letter at the next token.

    Each line: {"id": ..., "messages": [...]} or {"id": ..., "text": ...}, with "letters": ["A", "B", ...],
    optionally "system" (replaces the template's default system prompt) and "metadata" (echoed). A table has
    the same columns (metadata as `metadata.<key>` columns or one JSON `metadata` column).
    """
    from readouts.score import ScoreConfig, run_score

    cfg = ScoreConfig(
        probes=probes, model=model, out=out, temperature=temperature, top_p=top_p,
        max_batch=max_batch, prefix_reuse=not no_prefix_reuse, plain=plain,
        progress=sys.stderr.isatty() if progress is None else progress,
    )
    n = run_score(cfg)
    click.echo(f"scored {n} probes -> {out}", err=True)


@click.command("run")
@model_options(served=SERVED)
@click.option("--panel", "-p", default="gap-v2", show_default=True, help="shipped panel name or JSONL path")
@click.option("--readouts", default=None, help="subset of D,J,J0,raw,control,dose (twins always ride along); "
              "add depth for the depth tables (docs/depth.md)")
@click.option("--sample", is_flag=True, help="draw seeded rollouts for first-token readouts instead of exact probabilities")
@click.option("--lens", default=None, type=click.Path(dir_okay=False), help="a tuned-lens file (`readout lens train`) the "
              "depth tables are also read through (needs depth in --readouts; its sha256 is recorded)")
@generator_options()
@plan_options()
@run_options(default_seed=0, profiles=tuple(GAP_PROFILES), out_help=GAP_OUT_HELP, set_help=GAP_SET_HELP)
def run_cmd(panel, readouts, sample, lens, plan, run, generation, model):
    """Run the judgment-action study; a killed run resumes when the same command is given again."""
    from readouts.gap.study import GapStudy

    start(GapStudy(readouts=readouts, sample=sample, lens=lens), model, {**run, "generation": generation}, panel, plan)


@click.command("nsi")
@model_options("alias, local folder or HF id (needs a chat template)", served=SERVED)
@click.option("--panel", "-p", default="nsi-14", show_default=True)
@click.option("--samples", default=None, type=bounded(INDEX), help="sampled replies per dilemma x framing (default: the profile's; paper 30)")
@generator_options()
@plan_options()
@run_options(default_seed=42, profiles=tuple(NSI_PROFILES), out_help=NSI_OUT_HELP, set_help=NSI_SET_HELP)
def nsi_cmd(panel, samples, plan, run, generation, model):
    """Framing-stability audit: F0-F3 replies parsed, and P(agree) read exactly at the decision field."""
    from readouts.nsi.study import NsiStudy

    if samples is not None:
        run = {**run, "overrides": (f"samples={samples}", *run["overrides"])}
    start(NsiStudy(), model, {**run, "generation": generation}, panel, plan)


@click.command("merge")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--shards", type=bounded(COUNT), default=None, help="the shard count the run was split into: unfinished chunks are "
              "then reported by shard index (the ones to resubmit)")
def merge_cmd(run_dir, shards):
    """Merge the chunks of a sharded run into its tables (after every shard has finished)."""
    from readouts.driver import merge_run
    from readouts.gap.study import GapStudy, summary_lines

    if shards is not None and shards < 1:
        raise ReadoutError(f"--shards: {shards} must be >= 1")
    merge_run(run_dir, summaries={GapStudy.kind: lambda tables: summary_lines(tables[1])}, log=click.echo, shards=shards)
