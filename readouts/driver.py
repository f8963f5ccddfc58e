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
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import pandas as pd

from contract.tables import Table, table
from engine.errors import ReadoutError
from engine.loading import load_model
from panels.frames import frame_texts
from panels.schema import PanelError, load_panel
from readouts.manifest import default_out, model_manifest
from readouts.profiles import Profile, apply_overrides, select_units
from readouts.rundir import RunDir


@dataclass(frozen=True)
class ModelOptions:
    """Which model to load, and how (shared by `readout run`, `readout nsi` and `readout score`)."""

    model: str
    """Alias, local folder or HF id in the local cache."""
    device: str | None = None
    """cpu, cuda, cuda:1 ... (None: cuda if present, else cpu)."""
    dtype: str | None = None
    """float32 / bfloat16 / float16 (None: fp32 on CPU, bf16 on CUDA)."""
    quantize: str | None = None
    """4bit / 8bit (bitsandbytes)."""
    device_map: str | None = None
    """accelerate device map for several GPUs, e.g. auto."""
    token_budget: int | None = None
    """Padded tokens per forward pass (None: the engine's default for the device)."""

    def load(self, device: str | None = None):
        return load_model(self.model, device=device or self.device, dtype=self.dtype, quantize=self.quantize,
                          device_map=self.device_map)


@dataclass(frozen=True)
class RunOptions:
    """What every study run was asked to do, besides the study's own settings."""

    model: ModelOptions
    panel: str | None = None
    """Shipped panel name or JSONL path (None: the study's default panel)."""
    profile: str = "quick"
    overrides: tuple[str, ...] = ()
    """`key=value` profile overrides (`--set`), recorded in the manifest."""
    limit: int | None = None
    """Read only the first N records of the profile's selection (recorded)."""
    out: str | None = None
    """Run directory (None: runs/<model>/<panel>/<study's run name>)."""
    seed: int | None = None
    """None: the study's default seed."""
    force: bool = False
    """Discard an existing run with a different manifest in `out`."""
    progress: bool = True
    shard: tuple[int, int] | None = None
    """(i, n): compute only chunks whose index is i modulo n, and leave the merge to `readout merge`."""
    stop_after_chunks: int | None = None
    """Testing aid: stop (as if killed) after this many newly computed chunks."""


class ChunkRunner(Protocol):
    """A study's recipe on one loaded model: one chunk of records -> rows of each of the study's tables."""

    timings: dict[str, float]
    """Seconds per stage, accumulated over chunks (for the manifest and the rate line)."""
    counts: dict[str, int]
    """Items per stage, accumulated over chunks."""

    def run(self, records: Sequence) -> tuple[list[dict], ...]: ...


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
    def stratum(self, record) -> str: ...
    def work(self, record, profile: Profile) -> int: ...
    def runner(self, lm, profile: Profile, seed: int, options: RunOptions, bar) -> ChunkRunner: ...
    def summary(self, tables: Sequence[pd.DataFrame]) -> list[str]: ...


class Interrupted(Exception):
    """Raised by the stop_after_chunks testing aid, as a kill would stop the run."""


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

        # Without CUDA, accelerate only forms a multi-process (gloo) group when told it runs on CPU.
        state = PartialState(cpu=not torch.cuda.is_available())
        return state.process_index, state.num_processes, state, device or str(state.device)
    return 0, 1, None, device


def chunk_loop(rundir: RunDir, chunks, compute: Callable, contracts: Sequence[Table], log,
               stop_after: int | None = None, shard=(0, 1)) -> int:
    """Compute every unfinished chunk of this shard and write it atomically; returns how many were computed now."""
    computed = 0
    rank, world = shard
    for i, chunk in enumerate(chunks):
        if i % world != rank:
            continue
        if rundir.is_finished(i):
            log(f"chunk {i + 1}/{len(chunks)}: already finished, skipped")
            continue
        if stop_after is not None and computed >= stop_after:
            raise Interrupted(f"stopped after {computed} chunks (testing aid)")
        t0 = time.perf_counter()
        frames = tuple(t.frame(rows) for t, rows in zip(contracts, compute(chunk), strict=True))
        rundir.write_chunk(i, frames)
        computed += 1
        log(f"chunk {i + 1}/{len(chunks)}: computed {len(frames[0])} rows in {time.perf_counter() - t0:.1f} s")
    return computed


def _resolve(study: Study, options: RunOptions):
    if options.profile not in study.profiles:
        raise ReadoutError(f"--profile: '{options.profile}' is not one of {', '.join(study.profiles)}")
    profile, overrides = apply_overrides(study.profiles[options.profile], options.overrides)
    try:
        panel = load_panel(options.panel or study.default_panel)
    except PanelError as exc:
        raise ReadoutError(str(exc)) from None
    if panel.kind != study.panel_kind:
        raise ReadoutError(f"--panel: {panel.name} is a {panel.kind} panel; this study reads {study.panel_kind} panels")
    records = select_units(panel.records, profile.max_units, options.limit, study.stratum)
    return profile, overrides, panel, records


def run(study: Study, options: RunOptions, log=print) -> Path:
    """Run (or resume) a study; returns the run directory.

    Several processes split the chunks: with `--shard i/n` (independent jobs; `readout merge` afterwards),
    or under `accelerate launch`/`torchrun` (ranks from accelerate's PartialState; rank 0 merges).
    """
    profile, overrides, panel, records = _resolve(study, options)
    seed = study.default_seed if options.seed is None else options.seed
    rank, world, state, device = parallel_context(options.shard, options.force, options.model.device)
    if world > 1:
        log = (lambda inner: lambda line: inner(f"[{rank}/{world}] {line}"))(log)
    lm = options.model.load(device)
    extra = study.prepare(lm, panel, records, profile)
    out = Path(options.out) if options.out else default_out(options.model.model, panel.name, study.run_name(profile, seed))
    chunks = [records[i : i + profile.chunk_size] for i in range(0, len(records), profile.chunk_size)]
    manifest = {
        **model_manifest(lm, extra.pop("letters")),
        **extra,
        "kind": study.kind,
        "tables": list(study.tables),
        "panel": {"name": panel.name, "path": panel.path, "sha256": panel.sha256, "records": len(panel.records),
                  "records_read": [r.id for r in records]},
        "frames_version": frame_texts()["version"],
        "profile": profile.as_dict(),
        "overrides": overrides,
        "limit": options.limit,
        "seed": seed,
        "n_chunks": len(chunks),
    }
    rundir = RunDir(out, study.tables)
    if state is not None and not state.is_main_process:
        state.wait_for_everyone()  # rank 0 opens (or refuses) the run directory first
    if state is None or state.is_main_process:
        for line in rundir.open(manifest, force=options.force):
            log(line)
        if state is not None:
            state.wait_for_everyone()
    from tqdm.auto import tqdm

    total = sum(study.work(r, profile) for r in records)
    done = sum(study.work(r, profile) for i, c in enumerate(chunks) if rundir.is_finished(i) for r in c)
    bar = tqdm(total=total, initial=done, desc=f"{options.model.model} {panel.name} {profile.name}",
               disable=not options.progress, dynamic_ncols=True)
    runner = study.runner(lm, profile, seed, options, bar)
    t_start = time.perf_counter()
    try:
        computed = chunk_loop(rundir, chunks, runner.run, [table(t) for t in study.tables], log,
                              options.stop_after_chunks, shard=(rank, world))
    finally:
        bar.close()
    if state is not None:
        state.wait_for_everyone()
        if not state.is_main_process:
            return rundir.path
    elif world > 1:
        log(f"shard {rank}/{world}: {computed} chunks computed; after every shard has finished: readout merge {rundir.path}")
        return rundir.path
    merged = rundir.merge(len(chunks))
    wall = time.perf_counter() - t_start
    rundir.write_manifest({**manifest, "chunks": rundir.finished(), "complete": True,
                           "last_session": {"computed_chunks": computed, "wall_seconds": round(wall, 1),
                                            "seconds_by_stage": {k: round(v, 2) for k, v in runner.timings.items()},
                                            "items_by_stage": runner.counts}})
    log("tables: " + ", ".join(f"{rundir.path / (name + '.parquet')} ({len(df)} rows)"
                               for name, df in zip(study.tables, merged)))
    for line in study.summary(merged):
        log(line)
    if computed:
        rates = ", ".join(f"{k} {runner.counts[k] / max(t, 1e-9):.2f}/s ({runner.counts[k]} in {t:.1f} s)"
                          for k, t in runner.timings.items())
        log(f"wall time {wall:.1f} s for {computed} chunks; rates: {rates}")
    return rundir.path


def merge_run(path: str | Path, summaries: Mapping[str, Callable] | None = None, log=print) -> Path:
    """`readout merge`: after sharded jobs, check every chunk is there and write the tables the manifest names."""
    probe = RunDir(path, ())
    manifest = probe.read_manifest()
    if manifest is None:
        raise ReadoutError(f"{probe.manifest_path}: manifest: missing; is {path} a run directory?")
    names, n = manifest.get("tables"), manifest.get("n_chunks")
    if not isinstance(names, list) or not names or not isinstance(n, int):
        raise ReadoutError(f"{probe.manifest_path}: tables: missing; the run was not started by `readout run` or `readout nsi`")
    rundir = RunDir(path, tuple(names))
    missing = [i + 1 for i in range(n) if not rundir.is_finished(i)]
    if missing:
        raise ReadoutError(f"{rundir.chunks}: chunks: {len(missing)} of {n} not finished yet (first: chunk {missing[0]}); rerun their shards")
    merged = rundir.merge(n)
    rundir.write_manifest({**manifest, "chunks": rundir.finished(), "complete": True})
    log(f"merged {n} chunks into {rundir.path}: " + " + ".join(str(len(df)) for df in merged) + " rows")
    summary = (summaries or {}).get(manifest.get("kind"))
    if summary is not None:
        for line in summary(merged):
            log(line)
    return rundir.path
