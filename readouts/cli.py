"""The `readout` command line. Each command builds its arguments and calls one Python function;
bad input of any kind ends in one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import click

from contract.names import NSI_NULLS
from contract.options import COUNT, DEFAULT_MASS_FLOOR, DEFAULT_N_BOOT, INDEX, SHARE, TEMPERATURE, TOP_P
from engine.errors import ReadoutError
from panels.schema import PanelError
from readouts.chunks import WINDOW_DEFAULT
from readouts.gap.profile import PROFILES as GAP_PROFILES
from readouts.gap.profile import run_name as gap_run_name
from readouts.nsi.profile import PROFILES as NSI_PROFILES
from readouts.nsi.profile import run_name as nsi_run_name
from readouts.options import bounded
from readouts.profiles import set_example
from readouts.served_cli import served_options, served_spec
from stats.core.errors import StatsInputError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logit-readout", prog_name="readout", message="%(prog)s (logit-readout) %(version)s")
def cli():
    """logit-readout: read the probability a model puts on answer letters, across frames."""


@cli.command("models")
@click.option("--models", "models_files", multiple=True, type=click.Path(dir_okay=False), help="a user registry file")
def models_cmd(models_files):
    """List registered models (user registry entries with their file), where they come from, whether available."""
    from engine.loading import is_available
    from engine.registry import BUILTIN, registry, use_models_files

    use_models_files(models_files)
    rows = []
    for alias, spec in registry().items():
        ok, why = is_available(spec)
        origin = spec.hf_id or spec.path or "built offline"
        mine = f"[{spec.registry_file}]" if spec.registry_file not in (None, BUILTIN) else ""
        rows.append((alias, spec.source, origin, "yes" if ok else "no", " ".join(x for x in (why, mine) if x)))
    widths = [max(len(r[i]) for r in rows + [("alias", "source", "origin", "available", "")]) for i in range(4)]
    header = ("alias", "source", "origin", "available", "")
    for r in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + ("  " + r[4] if r[4] else ""))
    click.echo("\nAny local checkpoint folder or HF id in the local cache also works as --model.")


def _model_options(f):
    """--device, --dtype, --quantize, --device-map, --token-budget: how the model is loaded and batched."""
    f = click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present, else cpu)")(f)
    f = click.option("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on CUDA)")(f)
    f = click.option("--quantize", type=click.Choice(["4bit", "8bit"]), default=None, help="bitsandbytes quantization")(f)
    f = click.option("--device-map", default=None, help="accelerate device map for several GPUs, e.g. auto")(f)
    f = click.option("--token-budget", default=None, type=bounded(COUNT), help="padded tokens per forward pass")(f)
    f = click.option("--chat-template", default=None, type=click.Path(dir_okay=False),
                     help="a file whose chat template replaces the tokenizer's (its sha256 is recorded)")(f)
    f = click.option("--template-kwarg", "template_kwargs", multiple=True, metavar="KEY=VALUE",
                     help="a variable the chat template is rendered with, e.g. date_string='26 Jul 2024' (JSON values "
                          "parsed, else a string; recorded)")(f)
    f = click.option("--attn-implementation", default=None, help="transformers attention implementation: eager, sdpa, "
                     "flash_attention_2 (default: transformers' choice)")(f)
    f = click.option("--trust-remote-code", is_flag=True, help="let the checkpoint's own modeling code run (only for "
                     "checkpoints you trust)")(f)
    f = click.option("--peft", "adapter", default=None, type=click.Path(file_okay=False),
                     help="a PEFT adapter folder, or a shipped model organism's name (readout organism list), merged "
                          "into the model's weights (recorded with its fingerprint and any organism recipe)")(f)
    f = click.option("--revision", default=None, help="branch, tag or commit of a hub checkpoint (same as --model NAME@REV); "
                     "the resolved commit is recorded")(f)
    f = click.option("--models", "models_files", multiple=True, type=click.Path(dir_okay=False), help="a user registry "
                     "file (models.toml's format) adding aliases and lineages; also LOGIT_READOUT_MODELS")(f)
    return f


def _model(kwargs):
    from engine.registry import use_models_files
    from readouts.driver import ModelOptions

    use_models_files(kwargs.pop("models_files"))
    model, revision = kwargs.pop("model"), kwargs.pop("revision")
    if revision is not None:
        if "@" in model:
            raise ReadoutError(f"--revision: the model '{model}' already names a revision")
        model = f"{model}@{revision}"
    return ModelOptions(model=model, device=kwargs.pop("device"), dtype=kwargs.pop("dtype"),
                        chat_template=kwargs.pop("chat_template"), template_kwargs=_template_kwargs(kwargs.pop("template_kwargs")),
                        adapter=resolve_adapter(kwargs.pop("adapter")), attn_implementation=kwargs.pop("attn_implementation"),
                        trust_remote_code=kwargs.pop("trust_remote_code"),
                        quantize=kwargs.pop("quantize"), device_map=kwargs.pop("device_map"),
                        token_budget=kwargs.pop("token_budget"))


def _template_kwargs(items) -> tuple:
    """`--template-kwarg KEY=VALUE` pairs; a VALUE that parses as JSON is taken as such (true, 3), else as text."""
    import json

    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ReadoutError(f"--template-kwarg: '{item}' must look like KEY=VALUE")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        out.append((key.strip(), parsed))
    return tuple(out)


#: Help texts built from the declarations the runs use: the run directory's name and the profiles' own fields.
GAP_OUT_HELP = (f"run directory (default runs/<model>/<panel>/{gap_run_name('<profile>', '<seed>')}, "
                f"{gap_run_name('<profile>', '<seed>', True)} with --sample)")
GAP_SET_HELP = f"override a profile field, e.g. {set_example(GAP_PROFILES['paper'], ('j_budget', 'orders'))} (recorded)"
NSI_OUT_HELP = f"run directory (default runs/<model>/<panel>/{nsi_run_name('<profile>', '<seed>')})"
NSI_SET_HELP = f"override a profile field, e.g. {set_example(NSI_PROFILES['quick'], ('samples', 'budget'))} (recorded)"


def _run_options(default_seed: int | None, profiles, out_help: str, set_help: str):
    """The options every study run takes (readouts.driver.RunOptions), on top of the model options."""
    def wrap(f):
        f = served_options(_model_options(f))
        f = click.option("--progress/--no-progress", default=True)(f)
        f = click.option("--window", default=None, type=bounded(COUNT), help="chunks decoded together, their decoding "
                         f"batches gathered across chunks (default {WINDOW_DEFAULT['cuda']} on CUDA, else 1; always 1 for `readout "
                         "steer` and served models; a crash loses at most one window; a run may resume under another window)")(f)
        f = click.option("--shard", default=None, help="i/n: compute only this shard's chunks (then `readout merge`)")(f)
        f = click.option("--force", is_flag=True, help="discard an existing run with a different manifest in --out")(f)
        f = click.option("--seed", default=default_seed, show_default=True, type=bounded(INDEX))(f)
        f = click.option("--out", "-o", default=None, help=out_help)(f)
        f = click.option("--limit", default=None, type=bounded(COUNT), help="read only the first N records of the profile's selection")(f)
        f = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=set_help)(f)
        f = click.option("--profile", default="quick", show_default=True, type=click.Choice(list(profiles)))(f)
        return f
    return wrap


def _run(study, kwargs, log_panel: str | None):
    from dataclasses import replace

    from readouts.driver import RunOptions, plan_run, run

    kwargs["model"], served = served_spec(kwargs["model"], kwargs)
    options = RunOptions(model=replace(_model(kwargs), served=served), panel=log_panel, profile=kwargs["profile"],
                         overrides=tuple(kwargs["overrides"]), limit=kwargs["limit"], out=kwargs["out"],
                         seed=kwargs["seed"], force=kwargs["force"], progress=kwargs["progress"],
                         shard=_parse_shard(kwargs["shard"]), window=kwargs["window"])
    if kwargs.get("plan") and served is not None:
        from readouts.served_plan import served_plan_lines

        for line in served_plan_lines(study, options):
            click.echo(line)
        return
    if kwargs.get("plan"):
        from readouts.plan import plan_lines

        rows, size, header = plan_run(study, options, kwargs["gpu"])
        for line in plan_lines(rows, size, kwargs["gpu"], header):
            click.echo(line)
        return
    run(study, options, log=lambda line: click.echo(line, err=True), result=click.echo)


def _plan_options(f):
    """--plan and --gpu: the run's workload and its estimated time, before any weights load."""
    f = click.option("--gpu", default="h200", show_default=True, help="GPU of the --plan estimate (GPUs only; there is no CPU "
                     "estimate): one of readouts/plan.py's GPUS (h200, h100, a100, l40s)")(f)
    return click.option("--plan", is_flag=True, help="print the run's workload per stage and its estimated time on --gpu, "
                        "without loading the model's weights; nothing is run")(f)


@cli.command("score")
@click.argument("probes", type=click.Path(dir_okay=False))
@click.option("--model", "-m", required=True, help="alias (see `readout models`), local folder or HF id")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="output JSONL")
@click.option("--temperature", default=1.0, show_default=True, type=bounded(TEMPERATURE), help="sampling temperature for `tempered` (0 = greedy)")
@click.option("--top-p", default=1.0, show_default=True, type=bounded(TOP_P), help="nucleus for `tempered`")
@click.option("--max-batch", default=None, type=bounded(COUNT), help="rows per forward pass (default 64 CPU / 256 GPU)")
@click.option("--no-prefix-reuse", is_flag=True, help="do not share KV caches across probes with a common prefix")
@click.option("--plain", is_flag=True, help="reference path: one prompt at a time, full forward")
@click.option("--progress/--no-progress", default=None, help="progress bar (default: when stderr is a terminal)")
@_model_options
def score_cmd(probes, out, temperature, top_p, max_batch, no_prefix_reuse, plain, progress, **kwargs):
    """Score PROBES (JSONL, or .csv / .parquet): per probe, the mass on each letter at the next token.

    Each line: {"id": ..., "messages": [...]} or {"id": ..., "text": ...}, with "letters": ["A", "B", ...],
    optionally "system" (replaces the template's default system prompt) and "metadata" (echoed). A table has
    the same columns (metadata as `metadata.<key>` columns or one JSON `metadata` column).
    """
    from readouts.score import ScoreConfig, run_score

    cfg = ScoreConfig(
        probes=probes, model=_model(kwargs), out=out, temperature=temperature, top_p=top_p,
        max_batch=max_batch, prefix_reuse=not no_prefix_reuse, plain=plain,
        progress=sys.stderr.isatty() if progress is None else progress,
    )
    n = run_score(cfg)
    click.echo(f"scored {n} probes -> {out}", err=True)


@cli.command("run")
@click.option("--model", "-m", required=True, help="alias (see `readout models`), local folder or HF id")
@click.option("--panel", "-p", default="gap-v2", show_default=True, help="shipped panel name or JSONL path")
@click.option("--readouts", default=None, help="subset of D,J,J0,raw,control,dose (twins always ride along); "
              "add depth for the depth tables (docs/depth.md)")
@click.option("--sample", is_flag=True, help="draw seeded rollouts for first-token readouts instead of exact probabilities")
@click.option("--lens", default=None, type=click.Path(dir_okay=False), help="a tuned-lens file (`readout lens train`) the "
              "depth tables are also read through (needs depth in --readouts; its sha256 is recorded)")
@_plan_options
@_run_options(default_seed=0, profiles=tuple(GAP_PROFILES), out_help=GAP_OUT_HELP, set_help=GAP_SET_HELP)
def run_cmd(panel, readouts, sample, lens, **kwargs):
    """Run the judgment-action study; a killed run resumes when the same command is given again."""
    from readouts.gap.study import GapStudy

    _run(GapStudy(readouts=readouts, sample=sample, lens=lens), kwargs, panel)


def _parse_shard(text):
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ReadoutError(f"--shard: '{text}' must look like 0/4") from None
    return i, n


@cli.command("merge")
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


@cli.command("nsi")
@click.option("--model", "-m", required=True, help="alias, local folder or HF id (needs a chat template)")
@click.option("--panel", "-p", default="nsi-14", show_default=True)
@click.option("--samples", default=None, type=bounded(INDEX), help="sampled replies per dilemma x framing (default: the profile's; paper 30)")
@_plan_options
@_run_options(default_seed=42, profiles=tuple(NSI_PROFILES), out_help=NSI_OUT_HELP, set_help=NSI_SET_HELP)
def nsi_cmd(panel, samples, **kwargs):
    """Framing-stability audit: F0-F3 replies parsed, and P(agree) read exactly at the decision field."""
    from readouts.nsi.study import NsiStudy

    if samples is not None:
        kwargs["overrides"] = (f"samples={samples}", *kwargs["overrides"])
    _run(NsiStudy(), kwargs, panel)


@cli.command("stats")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None, help="output folder (default RUN_DIR/stats; one run only)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
@click.option("--n-boot", default=DEFAULT_N_BOOT, show_default=True, type=bounded(COUNT), help="bootstrap resamples")
@click.option("--mass-floor", default=DEFAULT_MASS_FLOOR, show_default=True, type=bounded(SHARE),
              help="minimum total letter mass (agent frame) for a scenario to enter the screen")
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


@cli.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "-o", required=True, help="output folder")
@click.option("--role", "roles", multiple=True, help="RUN_DIR=lineage:stage, e.g. runs/x=olmo-3-7b:sft (stage: base, sft, "
              "dpo, final, a step like rl-200 or step-1000, or any name with --order); overrides the lineage and "
              "stage the run's manifest records")
@click.option("--order", default=None, help="stages in plotting order, comma-separated (default: sft, dpo, by step, final)")
@click.option("--seed", default=0, show_default=True, type=bounded(INDEX))
@click.option("--n-boot", default=DEFAULT_N_BOOT, show_default=True, type=bounded(COUNT), help="bootstrap resamples")
@click.option("--mass-floor", default=DEFAULT_MASS_FLOOR, show_default=True, type=bounded(SHARE),
              help="minimum total letter mass (agent frame) for a scenario to enter the screen")
def compare_cmd(run_dirs, out, roles, order, seed, n_boot, mass_floor):
    """Across runs: checkpoint sweep, base vs instruct (raw frame), chat-vs-raw bridge, cross-recipe table."""
    from stats.depth.compare import depth_compare
    from stats.gap.compare_report import compare_command

    role_map = dict(r.partition("=")[::2] for r in roles)
    for line in depth_compare(run_dirs, out, role_map, seed=seed, n_boot=n_boot):  # depth runs: their curves overlaid
        click.echo(line)
    for line in compare_command(run_dirs, out, roles, order, seed=seed, n_boot=n_boot, mass_floor=mass_floor):
        click.echo(line)


@cli.command("nsi-stats")
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


@cli.command("nsi-export")
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


@cli.command("nsi-gold")
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


from readouts.sweep import sweep_command  # noqa: E402

cli.add_command(sweep_command())

from organisms.cli import organism_group, resolve_adapter  # noqa: E402
from readouts.report import report_cmd  # noqa: E402
from readouts.show import show_cmd  # noqa: E402

cli.add_command(show_cmd)
cli.add_command(report_cmd)
cli.add_command(organism_group)

from readouts.lens import lens_group  # noqa: E402
from readouts.panels_cli import panels_group  # noqa: E402
from readouts.steer.cli import steer_command  # noqa: E402

cli.add_command(panels_group)
cli.add_command(lens_group())
cli.add_command(steer_command())
