"""`readout run`: the judgment–action study on one model and one panel, chunked, resumable, with a
progress bar, ending in a run directory and a short summary.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pandas as pd

from engine.errors import ReadoutError
from engine.loading import load_model
from panels.frames import frame_texts
from panels.schema import PanelError, load_panel
from readouts.profiles import Profile, get_profile, parse_readouts
from readouts.rundir import RunDir
from readouts.study import ChunkRunner, probe_frame, reads_per_scenario, scenario_frame


@dataclass(frozen=True)
class RunConfig:
    """Everything `readout run` was asked to do."""

    model: str
    panel: str = "gap-v1"
    profile: str = "quick"
    readouts: str | None = None
    out: str | None = None
    seed: int = 0
    sample: bool = False
    force: bool = False
    progress: bool = True
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None
    device_map: str | None = None
    token_budget: int | None = None
    shard: tuple[int, int] | None = None
    """(i, n): compute only chunks whose index is i modulo n, and leave the merge to `readout merge`."""
    stop_after_chunks: int | None = None
    """Testing aid: stop (as if killed) after this many newly computed chunks."""


def select_scenarios(records, profile: Profile):
    """The profile's family-stratified subset: the first scenarios of each family in turn, in panel order."""
    if profile.max_scenarios is None or profile.max_scenarios >= len(records):
        return list(records)
    by_family = {}
    for r in records:
        by_family.setdefault(r.family, []).append(r)
    chosen, i = [], 0
    while len(chosen) < profile.max_scenarios:
        for fam in sorted(by_family):
            if i < len(by_family[fam]) and len(chosen) < profile.max_scenarios:
                chosen.append(by_family[fam][i])
        i += 1
    keep = {r.id for r in chosen}
    return [r for r in records if r.id in keep]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict:
    import torch
    import transformers

    try:
        own = metadata.version("logit-readout")
    except metadata.PackageNotFoundError:
        own = None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "logit-readout": own}


def model_manifest(lm, letters) -> dict:
    """Manifest fields shared by every kind of run: the model, its template facts, letters, versions."""
    facts = lm.facts
    return {
        "model": {k: getattr(facts, k) for k in ("name", "source", "hf_id", "revision", "architecture", "dtype", "quantize", "vocab_size")},
        "device": facts.device,
        "template": {"chat_template_sha256": facts.chat_template_sha256, "bos_token_id": facts.bos_token_id,
                     "tokenizer_adds_bos": facts.tokenizer_adds_bos},
        "letters": letters.as_manifest(),
        "versions": _versions(),
        "git_commit": _git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
    }


def chunk_loop(rundir: RunDir, chunks, compute, bar, log, stop_after: int | None = None, shard=(0, 1)) -> int:
    """Compute every unfinished chunk of this shard and write it atomically; returns how many were computed now."""
    computed = 0
    rank, world = shard
    try:
        for i, chunk in enumerate(chunks):
            if i % world != rank:
                continue
            if rundir.is_finished(i):
                log(f"chunk {i + 1}/{len(chunks)}: already finished, skipped")
                continue
            if stop_after is not None and computed >= stop_after:
                raise Interrupted(f"stopped after {computed} chunks (testing aid)")
            t0 = time.perf_counter()
            first, second = compute(chunk)
            rundir.write_chunk(i, first, second)
            computed += 1
            log(f"chunk {i + 1}/{len(chunks)}: computed {len(first)} rows in {time.perf_counter() - t0:.1f} s")
    finally:
        bar.close()
    return computed


def _as_frames(result):
    probes, rows = result
    return probe_frame(probes), scenario_frame(rows)


def default_out(model: str, panel: str, profile: str, seed: int, sample: bool) -> Path:
    safe = model.replace("/", "__").strip("_.") or "model"
    return Path("runs") / Path(safe).name / panel / f"{profile}-seed{seed}{'-sample' if sample else ''}"


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


def run_study(cfg: RunConfig, log=print) -> Path:
    """Run (or resume) the study; returns the run directory.

    Several processes split the chunks: with `--shard i/n` (independent jobs; `readout merge` afterwards),
    or under `accelerate launch`/`torchrun` (ranks from accelerate's PartialState; rank 0 merges).
    """
    profile = get_profile(cfg.profile)
    rank, world, state, device = parallel_context(cfg.shard, cfg.force, cfg.device)
    if world > 1:
        log = (lambda inner: lambda line: inner(f"[{rank}/{world}] {line}"))(log)
    try:
        panel = load_panel(cfg.panel)
    except PanelError as exc:
        raise ReadoutError(str(exc)) from None
    if panel.kind != "gap":
        raise ReadoutError(f"--panel: {panel.name} is a {panel.kind} panel; `readout run` reads judgment-action panels (use `readout nsi`)")
    lm = load_model(cfg.model, device=device, dtype=cfg.dtype, quantize=cfg.quantize, device_map=cfg.device_map)
    chat = lm.facts.chat_template_sha256 is not None
    groups = parse_readouts(cfg.readouts, chat)
    scenarios = select_scenarios(panel.records, profile)
    letters = lm.letters("ABCDE"[: max(len(s.options) for s in scenarios)])
    out = Path(cfg.out) if cfg.out else default_out(cfg.model, panel.name, profile.name, cfg.seed, cfg.sample)
    manifest = {
        **model_manifest(lm, letters),
        "kind": "judgment-action",
        "panel": {"name": panel.name, "path": panel.path, "sha256": panel.sha256, "records": len(panel.records),
                  "scenarios_read": [s.id for s in scenarios]},
        "frames_version": frame_texts()["version"],
        "profile": profile.as_dict(),
        "readouts": list(groups),
        "seed": cfg.seed,
        "sample": cfg.sample,
    }
    chunks = [scenarios[i : i + profile.chunk_scenarios] for i in range(0, len(scenarios), profile.chunk_scenarios)]
    manifest["n_chunks"] = len(chunks)
    rundir = RunDir(out)
    if state is not None and not state.is_main_process:
        state.wait_for_everyone()  # rank 0 opens (or refuses) the run directory first
    if state is None or state.is_main_process:
        for line in rundir.open(manifest, force=cfg.force):
            log(line)
        if state is not None:
            state.wait_for_everyone()
    total = sum(reads_per_scenario(s, profile, groups) for s in scenarios)
    done_reads = sum(reads_per_scenario(s, profile, groups) for i, c in enumerate(chunks) if rundir.is_finished(i) for s in c)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=done_reads, desc=f"{cfg.model} {panel.name} {profile.name}", unit="probe",
               disable=not cfg.progress, dynamic_ncols=True)
    runner = ChunkRunner(lm, profile, groups, cfg.seed, cfg.sample, panel.name, cfg.model, progress=bar,
                         token_budget=cfg.token_budget)
    t_start = time.perf_counter()
    computed = chunk_loop(rundir, chunks, lambda chunk: _as_frames(runner.run(chunk)), bar, log, cfg.stop_after_chunks,
                          shard=(rank, world))
    if state is not None:
        state.wait_for_everyone()
        if not state.is_main_process:
            return rundir.path
    elif world > 1:
        log(f"shard {rank}/{world}: {computed} chunks computed; after every shard has finished: readout merge {rundir.path}")
        return rundir.path
    probes_df, scenarios_df = rundir.merge(len(chunks))
    wall = time.perf_counter() - t_start
    rundir.write_manifest({**manifest, "chunks": rundir.finished(), "complete": True,
                           "last_session": {"computed_chunks": computed, "wall_seconds": round(wall, 1),
                                            "seconds_by_readout": {k: round(v, 2) for k, v in runner.timings.items()},
                                            "probes_by_readout": runner.counts}})
    log(f"tables: {rundir.path / 'scenarios.parquet'} ({len(scenarios_df)} rows), {rundir.path / 'probes.parquet'} ({len(probes_df)} probes)")
    for line in summary_lines(scenarios_df):
        log(line)
    if computed:
        rates = ", ".join(f"{k} {runner.counts[k] / max(t, 1e-9):.2f}/s ({runner.counts[k]} in {t:.1f} s)"
                          for k, t in runner.timings.items())
        log(f"wall time {wall:.1f} s for {computed} chunks; probe rates: {rates}")
    return rundir.path


def merge_run(path: str | Path, log=print) -> Path:
    """`readout merge`: after sharded jobs, check every chunk is there and write the tables."""
    rundir = RunDir(path)
    manifest = rundir.read_manifest()
    if manifest is None:
        raise ReadoutError(f"{rundir.manifest_path}: manifest: missing; is {path} a run directory?")
    if manifest.get("kind") == "nsi":
        rundir = RunDir(path, tables=("nsi_replies", "nsi_continuous"))
    n = manifest.get("n_chunks")
    if not isinstance(n, int):
        raise ReadoutError(f"{rundir.manifest_path}: n_chunks: missing; the run was not started by `readout run`")
    missing = [i + 1 for i in range(n) if not rundir.is_finished(i)]
    if missing:
        raise ReadoutError(f"{rundir.chunks}: chunks: {len(missing)} of {n} not finished yet (first: chunk {missing[0]}); rerun their shards")
    first, second = rundir.merge(n)
    rundir.write_manifest({**manifest, "chunks": rundir.finished(), "complete": True})
    log(f"merged {n} chunks into {rundir.path}: {len(first)} + {len(second)} rows")
    if manifest.get("kind") == "judgment-action":
        for line in summary_lines(second):
            log(line)
    return rundir.path


def summary_lines(df: pd.DataFrame) -> list[str]:
    """p_D, p_J, their twins, g and the raw (unscreened) paired excess, per family."""
    d = df[(df.readout == "D") & (df.frame == "agent")]
    j = df[(df.readout == "J") & (df.frame == "judge")]
    if d.empty or j.empty:
        return ["summary: needs the D and J readouts (run with --readouts including D,J)"]
    key = ["scenario_id", "family", "cell"]
    m = d[key + ["p_violating"]].merge(j[key + ["p_violating"]], on=key, suffixes=("_D", "_J"))
    m["g"] = m.p_violating_D - m.p_violating_J
    wide = m.pivot_table(index=["scenario_id", "family"], columns="cell", values=["p_violating_D", "p_violating_J", "g"])
    lines = ["family  n    p_D    p_J    p_D(twin) p_J(twin) g      g(twin) E(raw, unscreened)"]
    groups = list(wide.groupby(level="family")) + [("all", wide)]
    for fam, w in groups:
        e = (w[("g", "primary")] - w[("g", "twin")]).mean()
        vals = [w[(c, cell)].mean() for c, cell in [("p_violating_D", "primary"), ("p_violating_J", "primary"),
                                                    ("p_violating_D", "twin"), ("p_violating_J", "twin"),
                                                    ("g", "primary"), ("g", "twin")]]
        fmt = lambda x: "  nan " if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:6.3f}"  # noqa: E731
        lines.append(f"{fam:<7} {len(w):<4} " + " ".join(fmt(v) for v in vals) + f"  {fmt(e)}")
    return lines
