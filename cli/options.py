"""The options several commands share, each declared once, and the groups a command takes them in.

A `Group` is options read together into one typed value: a command that takes the group gets that value as one
argument (`model: ModelOptions`, `run: dict` of RunOptions' fields, `plan: str | None`) and never sees the raw
options. A command takes only the groups whose values it reads, so an option it would ignore is not accepted
(click refuses it in one line); tests/cli/test_options_read.py holds every command to that.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable, Mapping

import click

from contract.options import COUNT, DEFAULT_MASS_FLOOR, DEFAULT_N_BOOT, INDEX, SHARE, Numeric
from engine.errors import ReadoutError
from readouts.chunks import WINDOW_DEFAULT
from readouts.gap.profile import PROFILES as GAP_PROFILES
from readouts.gap.profile import run_name as gap_run_name
from readouts.nsi.profile import PROFILES as NSI_PROFILES
from readouts.nsi.profile import run_name as nsi_run_name
from readouts.options import Loading, ModelOptions
from readouts.profiles import set_example
from readouts.studies import STUDIES


def bounded(spec: Numeric) -> click.ParamType:
    """The click type of a numeric option declared in contract/options.py: its bounds are checked when the command
    line is parsed, before any model loads or table is read (click's message names the option)."""
    if spec.kind is int:
        return click.IntRange(min=spec.low, max=spec.high, min_open=spec.low_open)
    return click.FloatRange(min=spec.low, max=spec.high, min_open=spec.low_open)


def param_names(options) -> tuple[str, ...]:
    """The parameter names that click.option decorators declare."""
    def probe():
        pass
    for option in options:
        option(probe)
    return tuple(p.name for p in probe.__click_params__)


@dataclass(frozen=True)
class Group:
    """Options a command takes together, read by `build` (from {parameter name: parsed value}) into the one value
    the command receives as `name`. `build` reads every value it is given."""

    name: str
    options: tuple[Callable, ...]
    """click.option decorators, in the order --help lists them."""
    build: Callable[[dict], object]

    @functools.cached_property
    def params(self) -> tuple[str, ...]:
        """The parameter names of the group's options."""
        return param_names(self.options)

    def __call__(self, f):
        names = self.params

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            values = {n: kwargs.pop(n) for n in names}
            return f(*args, **kwargs, **{self.name: self.build(values)})

        wrapper.__dict__["__click_params__"] = list(getattr(f, "__click_params__", []))
        wrapper.groups = (*getattr(f, "groups", ()), self)
        for option in reversed(self.options):
            wrapper = option(wrapper)
        return wrapper


def given(names) -> list[str]:
    """Those of the parameters `names` that the command line (or the environment) set, not their defaults."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    return [n for n in names if ctx.get_parameter_source(n) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]


def refuse_given(names, why: str) -> None:
    """One line naming the first of the parameters `names` the command line set, with `why` it is not read."""
    for n in given(names):
        raise ReadoutError(f"--{n.replace('_', '-')}: {why}")


# ---- the model: which one, loaded how ----------------------------------------------------------------------

MODELS_FILES = click.option("--models", "models_files", multiple=True, type=click.Path(dir_okay=False),
                            help="a user registry file (models.toml's format) adding aliases and lineages; also "
                                 "LOGIT_READOUT_MODELS")
MODEL_HELP = "alias (see `readout models`), local folder or HF id"

LOADING_OPTIONS = (
    click.option("--revision", default=None, help="branch, tag or commit of a hub checkpoint (same as --model NAME@REV); "
                 "the resolved commit is recorded"),
    MODELS_FILES,
    click.option("--peft", "adapter", default=None, type=click.Path(file_okay=False),
                 help="a PEFT adapter folder, or a shipped model organism's name (readout organism list), merged into "
                      "the model's weights (recorded with its fingerprint and any organism recipe)"),
    click.option("--trust-remote-code", is_flag=True, help="let the checkpoint's own modeling code run (only for "
                 "checkpoints you trust)"),
    click.option("--attn-implementation", default=None, help="transformers attention implementation: eager, sdpa, "
                 "flash_attention_2 (default: transformers' choice)"),
    click.option("--template-kwarg", "template_kwargs", multiple=True, metavar="KEY=VALUE",
                 help="a variable the chat template is rendered with, e.g. date_string='26 Jul 2024' (JSON values "
                      "parsed, else a string; recorded)"),
    click.option("--chat-template", default=None, type=click.Path(dir_okay=False),
                 help="a file whose chat template replaces the tokenizer's (its sha256 is recorded)"),
    click.option("--token-budget", default=None, type=bounded(COUNT), help="padded tokens per forward pass"),
    click.option("--device-map", default=None, help="accelerate device map for several GPUs, e.g. auto"),
    click.option("--quantize", type=click.Choice(["4bit", "8bit"]), default=None, help="bitsandbytes quantization"),
    click.option("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on CUDA)"),
    click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present, else cpu)"),
)
"""How a model loads: the options of every command that loads one (--revision is read by the command's model)."""


def template_kwargs(items) -> tuple:
    """`--template-kwarg KEY=VALUE` pairs; a VALUE that parses as JSON is taken as such (true, 3), else as text."""
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


def loading(v: Mapping) -> Loading:
    """The loading options (all but --revision) as a Loading; a `--peft` organism name becomes its folder."""
    from organisms import resolve_adapter

    return Loading(device=v["device"], dtype=v["dtype"], quantize=v["quantize"], device_map=v["device_map"],
                   token_budget=v["token_budget"], chat_template=v["chat_template"],
                   template_kwargs=template_kwargs(v["template_kwargs"]), adapter=resolve_adapter(v["adapter"]),
                   attn_implementation=v["attn_implementation"], trust_remote_code=v["trust_remote_code"],
                   registry_files=tuple(v["models_files"]))


def with_revision(model: str, revision: str | None) -> str:
    """`--model NAME --revision REV` as NAME@REV; refused when NAME already names one."""
    from engine.registry import split_revision

    if revision is None:
        return model
    if split_revision(model)[1] is not None:
        raise ReadoutError(f"--revision: the model '{model}' already names a revision")
    return f"{model}@{revision}"


def model_options(model_help: str = MODEL_HELP, served=None) -> Group:
    """--model and the loading options -> `model: ModelOptions`. `served`: (options, spec) where a served model is
    accepted too (cli/served.py's SERVED): its options are taken, and `spec(name, values)` pops them and gives
    (model name, ServedSpec or None)."""
    served_options, spec_of = served or ((), None)

    def build(v: dict) -> ModelOptions:
        name = with_revision(v.pop("model"), v.pop("revision"))
        spec = None
        if spec_of is not None:
            name, spec = spec_of(name, v)
            if spec is not None:
                refuse_given([p for p in v if p != "models_files"], f"the served model '{name}' loads nothing here; "
                             "this option is read for local models only")
        return ModelOptions(model=name, loading=loading(v), served=spec)

    model = click.option("--model", "-m", required=True, help=model_help)
    return Group("model", (model, *LOADING_OPTIONS, *served_options), build)


def loading_options() -> Group:
    """The loading options without --model and --revision -> `loading: Loading` (a sweep's checkpoints share it)."""
    return Group("loading", LOADING_OPTIONS[1:], loading)


# ---- a study run --------------------------------------------------------------------------------------------

GAP_OUT_HELP = (f"run directory (default runs/<model>/<panel>/{gap_run_name('<profile>', '<seed>')}, "
                f"{gap_run_name('<profile>', '<seed>', True)} with --sample)")
GAP_SET_HELP = f"override a profile field, e.g. {set_example(GAP_PROFILES['paper'], ('j_budget', 'orders'))} (recorded)"
NSI_OUT_HELP = f"run directory (default runs/<model>/<panel>/{nsi_run_name('<profile>', '<seed>')})"
NSI_SET_HELP = f"override a profile field, e.g. {set_example(NSI_PROFILES['quick'], ('samples', 'budget'))} (recorded)"
"""Help texts built from the declarations the runs use: the run directory's name and the profiles' own fields."""

PROGRESS = click.option("--progress/--no-progress", default=True)
N_BOOT = click.option("--n-boot", default=DEFAULT_N_BOOT, show_default=True, type=bounded(COUNT), help="bootstrap resamples")
MASS_FLOOR = click.option("--mass-floor", default=DEFAULT_MASS_FLOOR, show_default=True, type=bounded(SHARE),
                          help="minimum total letter mass (agent frame) for a scenario to enter the screen")
"""The analysis' options, shared by `readout stats`, `compare` and `sweep` (its comparison)."""

SWEEP_STUDY = (
    click.option("--study", "kind", type=click.Choice(list(STUDIES)), default="gap", show_default=True,
                 help="; ".join(f"{k}: {v}" for k, v in STUDIES.items())),
    click.option("--panel", "-p", default=None, help="shipped panel name or JSONL path (default: gap-v2 / nsi-14)"),
    click.option("--readouts", default=None, help="subset of D,J,J0,raw,control,dose (compare's sweep needs D,J)"),
    click.option("--sample", is_flag=True, help="seeded rollouts for first-token readouts instead of exact probabilities"),
    N_BOOT,
    MASS_FLOOR,
)
"""The study and comparison options of the commands that read many checkpoints (`readout sweep`, `readout watch`)."""


def sweep_study_options(f):
    """SWEEP_STUDY applied to a command, in the order --help lists them."""
    for option in reversed(SWEEP_STUDY):
        f = option(f)
    return f


def sweep_run_options(out_help: str) -> Group:
    """The run options of `readout sweep` and `readout watch`: every checkpoint's run takes them (no --shard, no
    --window; the seed defaults to the study's: gap 0, nsi 42)."""
    return run_options(None, tuple(GAP_PROFILES), out_help,
                       f"{GAP_SET_HELP.removesuffix(' (recorded)')}; with --study nsi: {NSI_SET_HELP.partition('e.g. ')[2]}",
                       shard=False, window=False)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ReadoutError(f"--shard: '{text}' must look like 0/4") from None
    return i, n


def run_options(default_seed: int | None, profiles, out_help: str, set_help: str, *, shard: bool = True,
                window: bool = True) -> Group:
    """The options of a study run -> `run`: a dict of readouts.options.RunOptions' fields (all but model and
    panel). `shard` and `window`: whether the command takes --shard and --window (a sweep takes neither, the
    steering grid no --window: it reads one chunk at a time)."""
    options = [
        click.option("--profile", default="quick", show_default=True, type=click.Choice(list(profiles))),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=set_help),
        click.option("--limit", default=None, type=bounded(COUNT), help="read only the first N records of the profile's selection"),
        click.option("--panel-part", default=None, help="read only this part of the panel's recorded split (held-out: the "
                     "scenarios no organism trains on; with --set max_units=1000 to take all of it)"),
        click.option("--out", "-o", default=None, help=out_help),
        click.option("--seed", default=default_seed, show_default=True, type=bounded(INDEX)),
        click.option("--force", is_flag=True, help="discard an existing run with a different manifest in --out"),
    ]
    if shard:
        options.append(click.option("--shard", default=None, help="i/n: compute only this shard's chunks (then `readout merge`)"))
    if window:
        options.append(click.option("--window", default=None, type=bounded(COUNT), help="chunks decoded together, their "
                       f"decoding batches gathered across chunks (default {WINDOW_DEFAULT['cuda']} on CUDA, else 1; always 1 "
                       "for served models; a crash loses at most one window; a run may resume under another window)"))
    options.append(PROGRESS)

    def build(v: dict) -> dict:
        run = {"profile": v.pop("profile"), "overrides": tuple(v.pop("overrides")), "limit": v.pop("limit"),
               "part": v.pop("panel_part"),
               "out": v.pop("out"), "seed": v.pop("seed"), "force": v.pop("force"), "progress": v.pop("progress")}
        if shard:
            run["shard"] = parse_shard(v.pop("shard"))
        if window:
            run["window"] = v.pop("window")
        return run

    return Group("run", tuple(options), build)


PLAN_GPU = "h200"
"""The GPU a --plan estimate is for unless --gpu names another."""


def plan_options() -> Group:
    """--plan and --gpu -> `plan`: the GPU of the --plan estimate, or None (run for real)."""
    options = (
        click.option("--plan", is_flag=True, help="print the run's workload per stage and its estimated time on --gpu, "
                     "without loading the model's weights; nothing is run"),
        click.option("--gpu", default=None, help="GPU of the --plan estimate (GPUs only; there is no CPU estimate): "
                     f"one of readouts/plan.py's GPUS (h200, h100, a100, l40s; default {PLAN_GPU})"),
    )

    def build(v: dict) -> str | None:
        plan, gpu = v["plan"], v["gpu"]
        if gpu is not None and not plan:
            raise ReadoutError("--gpu: names the GPU of a --plan estimate; give it with --plan")
        return (gpu or PLAN_GPU) if plan else None

    return Group("plan", options, build)


def generator_options() -> Group:
    """--generator, --generator-url, --generator-model -> `generation` (readouts.options.Generation)."""
    from readouts.options import GENERATORS, Generation

    options = (
        click.option("--generator", default="own", show_default=True, type=click.Choice(GENERATORS),
                     help="what draws the rollouts of J, dose and the NSI replies: the project's own decoder, or vLLM "
                          "(started for the same checkpoint from .venv-served, or the server at --generator-url); the "
                          "letters are read by the project's own exact forward either way (docs/gpu-and-clusters.md)"),
        click.option("--generator-url", default=None, help="a running vLLM server's /v1 address to draw the rollouts from "
                     "(with --generator vllm; it must serve the same checkpoint)"),
        click.option("--generator-model", default=None, help="the model name that server answers to"),
    )

    def build(v: dict) -> Generation:
        engine, url, model = v["generator"], v["generator_url"], v["generator_model"]
        if engine != "vllm":
            refuse_given(["generator_url", "generator_model"], "reads a vLLM server; give it with --generator vllm")
        if (url is None) != (model is None):
            raise ReadoutError("--generator-url and --generator-model go together: the server's address and the name "
                               "its model answers to")
        return Generation(engine, url, model)

    return Group("generation", options, build)


def numbers(text: str, name: str, kind=float) -> tuple:
    """A comma-separated option's numbers (`--layers 20,21`, `--strengths=-2,-1`)."""
    try:
        return tuple(kind(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ReadoutError(f"--{name}: '{text}' must be comma-separated {'integers' if kind is int else 'numbers'}") from None
