"""The run driver shared by every study: options, panel, model, manifest, run directory, chunk loop,
shards and ranks, merge.

A study (readouts/gap, readouts/nsi) supplies a recipe (records -> rows of its tables), its profiles
and its summary; everything else a run does is written once here, so every study gets chunking, resume,
`--shard i/n`, torchrun/accelerate ranks and `readout merge`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import pandas as pd

from contract.tables import table
from engine.errors import ReadoutError
from panels.frames import DEFAULT_VERSION, frame_texts
from panels.records import PanelError
from panels.schema import load_panel
from readouts.chunks import Interrupted, chunk_loop, window_for, windows  # noqa: F401 (Interrupted: the runs' API)
from readouts.manifest import default_out, model_manifest, served_model_manifest
from readouts.options import Loading, ModelOptions, RunOptions  # noqa: F401 (Loading: the runs' API)
from readouts.profiles import Profile, apply_overrides, select_units
from readouts.rundir import RunDir
from readouts.show import plural


class ChunkRunner(Protocol):
    """A study's recipe on one loaded model: one chunk of records -> rows of each of the study's tables."""

    timings: dict[str, float]
    """Seconds per stage, accumulated over chunks (for the manifest and the rate line)."""
    counts: dict[str, int]
    """Items per stage, accumulated over chunks."""

    def run(self, records: Sequence) -> tuple[list[dict], ...]: ...
    # A runner may also offer `run_window(chunks) -> [tables of each chunk]`, the chunks computed together.


class Study(Protocol):
    """What a study supplies to the driver."""

    kind: str
    """The manifest's `kind`, e.g. judgment-action."""
    tables: tuple[str, ...]
    """Names of its tables (contract.tables), in writing order."""
    panel_kind: str
    """The panel kind it reads (panels.schema: gap / nsi)."""
    default_panel: str
    default_seed: int
    profiles: Mapping[str, Profile]

    def run_name(self, profile: Profile, seed: int) -> str: ...
    def prepare(self, lm, panel, records: Sequence, profile: Profile) -> dict:
        """Check the model suits the study; returns the study's manifest fields (`letters` object included)."""
    def check_lengths(self, lm, records: Sequence, profile: Profile) -> None:
        """Raise ReadoutError (`file:line: context: N tokens > the model's M`) if a prompt cannot fit."""
    def stratum(self, record) -> str: ...
    def work(self, chunk: Sequence, profile: Profile, seed: int, layers: int | None) -> int:
        """The progress bar's units for one chunk of records (reads, and a depth run's patching forwards for a model
        of `layers` decoder layers)."""
    runner_type: type
    """The class of `runner`'s local runner (the run and `--plan` ask it whether it computes several chunks at once)."""

    def runner(self, lm, profile: Profile, seed: int, options: RunOptions, bar, generate=None) -> ChunkRunner: ...
    # `generate`: what draws the rollouts (engine.generation.generate's signature), None for the own decoder.
    def summary(self, tables: Sequence[pd.DataFrame]) -> list[str]: ...


RANK_TIMEOUT = timedelta(hours=12)
"""Process-group timeout of a torchrun/accelerate run (NCCL's default, 10 minutes, would end a run whose ranks
finish their chunks minutes apart, or resume unevenly, at the final barrier)."""


def parallel_context(shard, force: bool, device: str | None):
    """(rank, world, distributed state or None, device): from --shard, or from an accelerate/torchrun launch."""
    if shard is not None:
        i, n = shard
        if not (n >= 1 and 0 <= i < n):
            raise ReadoutError(f"--shard: '{i}/{n}' must be i/n with 0 <= i < n")
        if force and n > 1:
            raise ReadoutError("--force cannot be combined with --shard (a shard would discard the others' chunks)")
        return i, n, None, device
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch
        from accelerate import PartialState

        # Without CUDA, accelerate only forms a multi-process (gloo) group when told it runs on CPU. The
        # group's timeout bounds every barrier: ranks that finish their chunks early wait at the last one.
        state = PartialState(cpu=not torch.cuda.is_available(), timeout=RANK_TIMEOUT)
        return state.process_index, state.num_processes, state, device or str(state.device)
    return 0, 1, None, device


def prepare_out(path: Path) -> None:
    """Create the run directory and prove it writable, before any model loads (one line, exit 2, if not)."""
    if path.exists() and not path.is_dir():
        raise ReadoutError(f"{path}: --out: is a file, not a run directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"  # ranks of one run probe at once
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ReadoutError(f"{path}: --out: cannot write here ({exc.strerror or exc})") from None


@dataclass(frozen=True)
class _Job:
    """A study run resolved from its options, before any model loads."""

    study: Study
    options: RunOptions
    profile: Profile
    overrides: dict
    panel: object
    records: list
    seed: int
    out: Path

    @property
    def chunks(self) -> list[list]:
        size = self.profile.chunk_size
        return [self.records[i : i + size] for i in range(0, len(self.records), size)]


@dataclass(frozen=True)
class _Ranks:
    """Which share of the chunks this process computes (parallel_context)."""

    rank: int
    world: int
    state: object
    """accelerate's PartialState under torchrun/accelerate, else None."""
    device: str | None


def _part(panel, part: str | None) -> list:
    """The panel's records in `part` of its recorded split (all of them for None)."""
    if part is None:
        return panel.records
    from panels.split import load_split

    try:
        keep = set(load_split(panel.path).ids(part))
    except PanelError as exc:
        raise ReadoutError(f"--panel-part: {exc}") from None
    return [r for r in panel.records if r.id in keep]


def _resolve(study: Study, options: RunOptions) -> _Job:
    if options.profile not in study.profiles:
        raise ReadoutError(f"--profile: '{options.profile}' is not one of {', '.join(study.profiles)}")
    _window(study, options, "cpu")  # a --window the run cannot take is refused before anything loads
    profile, overrides = apply_overrides(study.profiles[options.profile], options.overrides)
    try:
        panel = load_panel(options.panel or study.default_panel)
    except PanelError as exc:
        raise ReadoutError(str(exc)) from None
    if panel.kind != study.panel_kind:
        raise ReadoutError(f"--panel: {panel.name} is a {panel.kind} panel; this study reads {study.panel_kind} panels")
    records = select_units(_part(panel, options.part), profile.max_units, options.limit, study.stratum)
    seed = study.default_seed if options.seed is None else options.seed
    split = getattr(study, "split", None)  # a study that reads a held-out part of the selection (readout steer)
    if split is not None:
        records = split(records, seed)
    out = Path(options.out) if options.out else default_out(options.model.model, panel.name, study.run_name(profile, seed))
    return _Job(study, options, profile, overrides, panel, records, seed, out)


def plan_run(study: Study, options: RunOptions, gpu: str) -> tuple[list[dict], object, str, str | None]:
    """`--plan`: the run's workload per stage and its estimated time on `gpu`, from the panel, the profile and
    the model's tokenizer and config alone (no weights load); with a vLLM generator, its rollouts drawn by the server
    (readouts/vllm_plan.py). Returns (rows, model size, header line, what a vLLM estimate assumed or None)."""
    from engine.loading import load_tokenizer_config
    from readouts.plan import gpu_batch_bounds, model_size, plan_table

    job = _resolve(study, options)
    workload = getattr(study, "workload", None)
    if workload is None:
        raise ReadoutError(f"--plan: not available for the {study.kind} study")
    tokenizer, config = load_tokenizer_config(options.model.model, options.model.loading.registry_files)
    size = model_size(config)
    bounds = gpu_batch_bounds(config, size, gpu, options.model.token_budget)
    window = _window(study, options, "cuda")
    stages = workload(tokenizer, windows(job.chunks, window), job.profile, job.seed, bounds, config.num_hidden_layers)
    header = (f"plan: {options.model.model} on {job.panel.name}, profile {job.profile.name}, {len(job.records)} records "
              f"in {len(job.chunks)} chunks of {job.profile.chunk_size}, decoded {window} chunks at a time")
    if options.generation.engine == "own":
        return plan_table(stages, size, gpu), size, header, None
    from readouts.vllm_plan import vllm_plan_table

    rows, assumed = vllm_plan_table(stages, size, gpu, config)
    return rows, size, header, assumed


def run(study: Study, options: RunOptions, log=print, result=None) -> Path:
    """Run (or resume) a study; returns the run directory. `log` gets progress lines, `result` (default: `log`)
    the run's outcome: where its tables are, the study's summary and the wall time.

    Several processes split the chunks: with `--shard i/n` (independent jobs; `readout merge` afterwards),
    or under `accelerate launch`/`torchrun` (ranks from accelerate's PartialState; rank 0 merges).
    """
    job = _resolve(study, options)
    ranks = _Ranks(*parallel_context(options.shard, options.force, options.model.device))
    if ranks.world > 1:
        log = (lambda inner: lambda line: inner(f"[{ranks.rank}/{ranks.world}] {line}"))(log)
    prepare_out(job.out)
    rundir = RunDir(job.out, study.tables)
    # One process alone holds the directory exclusively; shards and ranks of one run share it (and lock chunks).
    try:
        with rundir.lock(exclusive=ranks.world == 1):
            return _execute(job, ranks, rundir, log, result or log)
    finally:
        if ranks.state is not None:
            ranks.state.destroy_process_group()


def _manifest(job: _Job, lm, extra: dict, generate=None) -> dict:
    import torch

    served = getattr(lm, "served", False)
    drawn = {"generator": {"name": generate.name, **generate.spec.identity}} if generate is not None else {}
    return {
        **(served_model_manifest(lm, extra.pop("letters")) if served else model_manifest(lm, extra.pop("letters"))),
        **extra,
        "engine": ({"served": True} if served else
                   {"token_budget": job.options.model.token_budget, "threads": torch.get_num_threads(), **drawn}),
        "kind": job.study.kind,
        "tables": list(job.study.tables),
        "panel": {"name": job.panel.name, "path": job.panel.path, "sha256": job.panel.sha256,
                  "records": len(job.panel.records), "part": job.options.part,
                  "records_read": [r.id for r in job.records]},
        "frames_version": frame_texts(getattr(job.profile, "frames", DEFAULT_VERSION))["version"],  # the profile's
        "profile": job.profile.as_dict(),
        "overrides": job.overrides,
        "limit": job.options.limit,
        "seed": job.seed,
        "n_chunks": len(job.chunks),
    }


def _generator(options: RunOptions, lm, rundir: RunDir):
    """What draws the run's rollouts besides the own decoder (None: the own decoder): a vLLM generator, its server
    started on first use with its log in the run directory (engine/vllm_generation.py)."""
    g = options.generation
    if g.engine == "own":
        return None
    from engine.vllm_generation import start_generator

    return start_generator(lm, g.url, g.model, log=str(rundir.path / "vllm-server.log"))


def _execute(job: _Job, ranks: _Ranks, rundir: RunDir, log, result) -> Path:
    lm = job.options.model.load(ranks.device)
    generate = _generator(job.options, lm, rundir)
    try:
        return _execute_loaded(job, ranks, rundir, log, result, lm, generate)
    finally:
        if generate is not None:
            from engine.vllm_generation import close_generator

            close_generator(generate)


def _execute_loaded(job: _Job, ranks: _Ranks, rundir: RunDir, log, result, lm, generate) -> Path:
    study, options, profile, state = job.study, job.options, job.profile, ranks.state
    if getattr(lm, "served", False):
        lm.check_logprobs()  # one request, before any of the run's: a server without logprobs is refused here
    extra = study.prepare(lm, job.panel, job.records, profile)
    study.check_lengths(lm, job.records, profile)
    manifest, chunks = _manifest(job, lm, extra, generate), job.chunks
    if state is not None and not state.is_main_process:
        state.wait_for_everyone()  # rank 0 opens (or refuses) the run directory first
        rundir.identity = (rundir.read_manifest() or {}).get("identity")
    else:
        for line in rundir.open(manifest, force=options.force):
            log(line)
        for line in manifest.get("warnings", []):
            log(f"warning: {line}")
        if state is not None:
            state.wait_for_everyone()
    from tqdm.auto import tqdm

    layers = getattr(getattr(getattr(lm, "model", None), "config", None), "num_hidden_layers", None)
    work = [study.work(c, profile, job.seed, layers) for c in chunks]
    total = sum(work)
    done = sum(n for i, (c, n) in enumerate(zip(chunks, work)) if rundir.is_finished(i, [r.id for r in c]))
    bar = tqdm(total=total, initial=done, desc=f"{options.model.model} {job.panel.name} {profile.name}",
               disable=not options.progress, dynamic_ncols=True)
    runner = study.runner(lm, profile, job.seed, options, bar, generate)
    window = _window(job.study, options, _device_type(lm))
    t_start = time.perf_counter()
    try:
        computed = chunk_loop(rundir, chunks, runner, [table(t) for t in study.tables], log, options.stop_after_chunks,
                              shard=(ranks.rank, ranks.world), locked=ranks.world > 1, window=window)
    finally:
        bar.close()
    if state is not None:
        state.wait_for_everyone()
        if not state.is_main_process:
            return rundir.path
    elif ranks.world > 1:
        log(f"shard {ranks.rank}/{ranks.world}: {plural(computed, 'chunk')} computed; after every shard has finished: "
            f"readout merge {rundir.path}")
        return rundir.path
    merged = rundir.merge([[r.id for r in c] for c in chunks])
    wall = time.perf_counter() - t_start
    rundir.write_manifest({**manifest, "identity": rundir.identity, "chunks": rundir.finished(), "complete": True,
                           "last_session": {"computed_chunks": computed, "window": window, "wall_seconds": round(wall, 1),
                                            "seconds_by_stage": {k: round(v, 2) for k, v in runner.timings.items()},
                                            "items_by_stage": runner.counts, **_requests(lm),
                                            **_batches(runner)},
                           **({"served": lm.manifest()} if getattr(lm, "served", False) else {}),
                           **({"generator": generate.manifest()} if generate is not None else {}),
                           **_planned(study, lm, windows(chunks, window, ranks.world), profile, job.seed,
                                      job.options.model.token_budget)})
    result("tables: " + ", ".join(f"{rundir.path / (name + '.parquet')} ({len(df)} rows)"
                                  for name, df in zip(study.tables, merged)))
    for line in study.summary(merged):
        result(line)
    if computed:
        rates = ", ".join(f"{k} {runner.counts[k] / max(t, 1e-9):.2f}/s ({runner.counts[k]} in {t:.1f} s)"
                          for k, t in runner.timings.items())
        result(f"wall time {wall:.1f} s for {plural(computed, 'chunk')}; rates: {rates}")
    command = getattr(study, "stats_command", None)
    if command:
        result(f"next: {command} {rundir.path}   (then: readout report {rundir.path})")
    return rundir.path


def _requests(lm) -> dict:
    """A served model's request counts this session (sent over the network, answered from the cache)."""
    if not getattr(lm, "served", False):
        return {}
    return {"requests": {"sent": lm.client.sent, "from_cache": lm.client.cached}}


def _batches(runner) -> dict:
    """The decoding batches this session formed, per stage (a local runner's; `--plan` lists the same)."""
    batches = getattr(runner, "batches", None)
    return {"decode_batches_by_stage": batches} if batches else {}


def _window(study: Study, options: RunOptions, device_type: str) -> int:
    """The run's window of chunks (readouts/chunks.py): a served model's run and a study whose runner has no
    `run_window` compute one chunk at a time."""
    served = options.model.served is not None
    windowed = not served and hasattr(study.runner_type, "run_window")
    return window_for(options.window, device_type, windowed, "a served model's run" if served else f"the {study.kind} study")


def _device_type(lm) -> str:
    """cuda, cpu ... of a loaded model (a served model's: none)."""
    if getattr(lm, "served", False):
        return "served"
    return lm.model.get_input_embeddings().weight.device.type


def _planned(study: Study, lm, units, profile, seed: int, token_budget: int | None) -> dict:
    """The workload `--plan` would print for this run (per stage, without time estimates; decoding batches under
    this run's own bounds, over `units`: the records of each window a fresh run computes, each rank's windows in
    turn where ranks share the chunks), for the manifest."""
    workload = getattr(study, "workload", None)
    if workload is None or getattr(lm, "served", False):
        return {}
    from dataclasses import asdict

    from engine.generation import batch_bounds

    bounds = batch_bounds(lm.model, lm.model.get_input_embeddings().weight.device, token_budget)
    stages = workload(lm.tokenizer, units, profile, seed, bounds, getattr(lm.model.config, "num_hidden_layers", None))
    return {"workload_by_stage": {st.stage: {k: v for k, v in asdict(st).items() if k != "stage"} for st in stages}}


def merge_run(path: str | Path, summaries: Mapping[str, Callable] | None = None, log=print, shards: int | None = None) -> Path:
    """`readout merge`: after sharded jobs, check every chunk is there and write the tables the manifest names
    (`log` gets what it merged and the study's summary).
    With `shards` (the run's shard count), unfinished chunks are also named by the shard that computes them."""
    probe = RunDir(path, ())
    manifest = probe.read_manifest()
    if manifest is None:
        raise ReadoutError(f"{probe.manifest_path}: manifest: missing; is {path} a run directory?")
    names, n = manifest.get("tables"), manifest.get("n_chunks")
    if not isinstance(names, list) or not names or not isinstance(n, int):
        raise ReadoutError(f"{probe.manifest_path}: tables: missing; the run was not started by `readout run` or `readout nsi`")
    rundir = RunDir(path, tuple(names))
    rundir.identity = manifest.get("identity")
    read = (manifest.get("panel") or {}).get("records_read") or []
    size = (manifest.get("profile") or {}).get("chunk_size") or 1
    chunk_records = [read[i : i + size] for i in range(0, len(read), size)]
    if len(chunk_records) != n:
        raise ReadoutError(f"{rundir.manifest_path}: panel.records_read: {len(read)} records in chunks of {size} is not {n} chunks")
    with rundir.lock(exclusive=True):
        problems = [(i + 1, why) for i, ids in enumerate(chunk_records) if (why := rundir.problem(i, ids)) is not None]
        if problems:
            first, why = problems[0]
            which = ", ".join(str(i) for i, _ in problems[:20]) + (", ..." if len(problems) > 20 else "")
            owners = "" if shards is None else (
                "; shards to rerun: " + ", ".join(str(s) for s in sorted({(i - 1) % shards for i, _ in problems})) + f" of {shards}")
            raise ReadoutError(f"{rundir.chunks}: chunks: {len(problems)} of {n} not finished yet (chunks {which}; "
                               f"first: chunk {first}, {why}){owners}")
        merged = rundir.merge(chunk_records)
    rundir.write_manifest({**manifest, "chunks": rundir.finished(), "complete": True})
    log(f"merged {plural(n, 'chunk')} into {rundir.path}: " + " + ".join(str(len(df)) for df in merged) + " rows")
    summary = (summaries or {}).get(manifest.get("kind"))
    if summary is not None:
        for line in summary(merged):
            log(line)
    return rundir.path
