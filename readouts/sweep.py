"""`readout sweep`: the gap study over a list of checkpoints or revisions, one run directory each, then one
`readout compare` over all of them (or, with `--study nsi`, the framing-stability audit, then `nsi-stats`).

Every checkpoint gets a role (lineage:stage), in this order: `--stage NAME=lineage:stage`; the second column
of its line in the list file; the registry's lineage and stage for a registered alias given without a
revision; otherwise lineage = `--lineage` (default: the registry's lineage of NAME, or NAME, for NAME@REV;
the sweep folder's name for anything else) and stage = the revision (NAME@step_1000 -> step_1000) or the
folder's name (./ckpts/step-1000 -> step-1000). Compare orders stages by the step their names carry; when a
lineage has a stage that carries none, by the order of the list.

The sweep folder holds `sweep.toml` (a user registry naming each checkpoint with its role, which every run's
manifest therefore records with its sha256), `runs/<label>/` (one run directory per checkpoint: a killed run
resumes), `sweep.json` (what each finished run was asked; a re-run skips a finished run asked the same) and
`compare/` (the comparison).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from contract.names import STAGE_NAME
from engine.errors import ReadoutError
from engine.registry import split_revision
from readouts.options import Loading
from readouts.studies import STUDIES, study_named

_SPEC_FIELDS = ("source", "hf_id", "revision", "family", "chat", "path", "lineage", "stage", "base_lineage")
"""The registry fields a sweep.toml entry carries over from the checkpoint's resolved spec."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a sweep."""

    given: str
    """The name as listed (an alias, a folder, an HF id, each optionally @revision)."""
    label: str
    """Its run directory's name under runs/, and its alias in sweep.toml."""
    lineage: str
    stage: str
    alias: str
    """The name its run loads: a registered alias used as is, or `label` (defined in sweep.toml)."""
    entry: dict | None
    """Its sweep.toml entry (None: a registered alias whose own lineage and stage are its role)."""
    adapter: str | None = None
    """A PEFT adapter folder merged into `alias`'s weights for this checkpoint alone (a trainer's adapter checkpoint);
    None: the sweep's own loading."""


def listed(models: Sequence[str], list_file: str | None) -> list[tuple[str, str | None, str]]:
    """(name, role or None, the name as written) in order: each `--model`, then the list file's lines (`NAME
    [lineage:stage]`; `#` starts a comment; a relative folder is read from the file's folder, so its name differs
    from the one written). `NAME@r1,r2` gives one per revision."""
    items = [(m, None, m) for m in models]
    if list_file is not None:
        path = Path(list_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ReadoutError(f"{list_file}: --list: cannot read ({exc.strerror or exc})") from None
        for n, line in enumerate(lines, 1):
            parts = line.split("#", 1)[0].split()
            if not parts:
                continue
            if len(parts) > 2 or (len(parts) == 2 and ":" not in parts[1]):
                raise ReadoutError(f"{list_file}: line {n}: must be NAME or NAME lineage:stage, got '{line.strip()}'")
            name = str(path.parent / parts[0]) if (path.parent / parts[0]).exists() else parts[0]
            items.append((name, parts[1] if len(parts) == 2 else None, parts[0]))
    out = []
    for name, role, written in items:
        base, revs = split_revision(name)
        if revs is not None and "," in revs:
            out += [(f"{base}@{r.strip()}", role, f"{base}@{r.strip()}") for r in revs.split(",") if r.strip()]
        else:
            out.append((name, role, written))
    if not out:
        raise ReadoutError("--model: no checkpoints given (--model NAME, repeated, or --list FILE)")
    return out


def parse_stages(items: Sequence[str]) -> dict[str, str]:
    """`--stage NAME=lineage:stage` items as {NAME: role}, each role checked."""
    role_map = {}
    for item in items:
        name, sep, role = item.rpartition("=")
        if not sep or not name:
            raise ReadoutError(f"--stage: '{item}' must look like NAME=lineage:stage, e.g. ./ckpt=mine:step-100")
        _role(role, "--stage")
        role_map[name] = role
    return role_map


def _role(text: str, where: str) -> tuple[str, str]:
    lineage, sep, stage = text.partition(":")
    if not sep or not lineage or not re.fullmatch(STAGE_NAME, stage):
        raise ReadoutError(f"{where}: '{text}' must look like lineage:stage, e.g. mine:step-1000")
    return lineage, stage


def plan(items: Sequence[tuple], stages: Mapping[str, str], lineage: str | None,
         default_lineage: str, registry_files: Sequence[str] = ()) -> list[Checkpoint]:
    """Each listed checkpoint (name, role or None[, name as written]) resolved (in the registry with the user files
    `registry_files`) and given its label, role and sweep.toml entry; bad names and clashing roles fail here, before
    any model loads. `stages` names a checkpoint by its label, its name as written, or (a folder) any path to the
    same folder."""
    from engine.registry import registry, resolve

    known, labels, roles, out = registry(registry_files), set(), {}, []
    unused, names = set(stages), []
    for given, listed_role, *written in items:
        spec = resolve(given, registry_files)
        base, revision = split_revision(given)
        revision = revision if revision is not None and spec.revision == revision else None
        name = base if revision else given
        short = name if name in known else Path(name).name if spec.source == "local" else name.split("/")[-1]
        label = _label(short, revision)
        label = next(f"{label}-{i}" if i else label for i in range(len(items) + 1)
                     if (f"{label}-{i}" if i else label) not in labels)
        labels.add(label)
        keys = _stage_keys(stages, {given, label, *written}, spec.path if spec.source == "local" else None)
        if len({stages[k] for k in keys}) > 1:
            raise ReadoutError(f"--stage: {' and '.join(keys)} name the same checkpoint ({label}) with different roles")
        role_text = stages[keys[0]] if keys else listed_role
        unused -= set(keys)
        as_listed = written[0] if written else given
        names.append(label if as_listed == label else f"{label} ({as_listed})")
        if role_text is not None:
            role = _role(role_text, f"{given}: role")
        elif spec.lineage and not revision:
            role = (spec.lineage, spec.stage)
        else:
            role = (lineage or (spec.lineage or name if revision else default_lineage), revision or label)
            if not re.fullmatch(STAGE_NAME, role[1]):
                raise ReadoutError(f"{given}: the stage '{role[1]}' it would get is not a stage name; give --stage {given}=lineage:stage")
        if role in roles:
            raise ReadoutError(f"{given}: role {role[0]}:{role[1]} is also {roles[role]}'s; give each its own with --stage")
        roles[role] = given
        if (spec.lineage, spec.stage) == role and given in known:
            out.append(Checkpoint(given, label, *role, alias=given, entry=None))
            continue
        entry = {k: getattr(spec, k) for k in _SPEC_FIELDS if getattr(spec, k) is not None}
        entry.update(lineage=role[0], stage=role[1])
        if spec.base_lineage and spec.lineage == role[0]:
            entry["base_lineage"] = spec.base_lineage
        elif "base_lineage" in entry:
            del entry["base_lineage"]
        if label in known:
            entry["override"] = True
        out.append(Checkpoint(given, label, *role, alias=label, entry=entry))
    if unused:
        raise ReadoutError(f"--stage: {sorted(unused)[0]}: not one of the checkpoints listed; name one by its label or "
                           f"its name as listed: {', '.join(names)}")
    return out


def _stage_keys(stages: Mapping[str, str], names: set[str], folder: str | None) -> list[str]:
    """The `--stage` names that name this checkpoint: one of `names` (its label and names as given or written),
    or, for a local folder, any path that resolves to it."""
    def same_folder(key: str) -> bool:
        try:
            return folder is not None and Path(key).expanduser().resolve() == Path(folder).resolve()
        except (OSError, RuntimeError):
            return False

    return [k for k in stages if k in names or same_folder(k)]


def _label(name: str, revision: str | None) -> str:
    text = f"{name}@{revision}" if revision else name
    return re.sub(r"[^A-Za-z0-9_.@\-]", "_", text).strip("._") or "checkpoint"


def registry_text(checkpoints: Sequence[Checkpoint]) -> str:
    """sweep.toml: a user registry with one entry per checkpoint that needs one."""
    lines = ["# Written by `readout sweep`: each checkpoint of the sweep with its role (lineage and stage).", ""]
    for c in checkpoints:
        if c.entry is None:
            continue
        lines.append(f"[{json.dumps(c.alias)}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in c.entry.items()]
        lines.append("")
    return "\n".join(lines)


def stage_order(checkpoints: Sequence[Checkpoint]) -> tuple[str, ...]:
    """The order compare is given: none when every stage sorts by its name (sft, dpo, final, a step), else the
    list's order of each lineage that has a stage without a step."""
    from stats.core.errors import CompareError
    from stats.gap.compare import stage_key

    order: list[str] = []
    for lineage in dict.fromkeys(c.lineage for c in checkpoints):
        stages = [c.stage for c in checkpoints if c.lineage == lineage and c.stage != "base"]
        try:
            for s in stages:
                stage_key(s)
        except CompareError:
            order += [s for s in stages if s not in order]
    return tuple(order)


def _request(c: Checkpoint, study: Mapping, loading: Loading) -> str:
    """What a checkpoint's run is asked, hashed: a finished run asked the same is skipped."""
    from engine.registry import resolve

    spec = {k: v for k, v in dataclasses.asdict(resolve(c.alias, loading.registry_files)).items()
            if k not in ("registry_file", "registry_sha256")}
    model = {k: v for k, v in dataclasses.asdict(loading).items() if k != "registry_files"}
    text = json.dumps({"spec": spec, "role": [c.lineage, c.stage], "study": study, "model": model}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def run_sweep(checkpoints: Sequence[Checkpoint], out: str | Path, *, study: Mapping, loading: Loading = Loading(),
              n_boot: int = 10_000, mass_floor: float | None = None, kind: str = "gap",
              log: Callable[[str], None] = print) -> list[str]:
    """Run the study `kind` on each checkpoint (skipping finished runs asked the same, resuming killed ones), then
    compare them all. `study`: panel, readouts, sample, profile, overrides, limit, part (optional), seed, force, progress;
    `loading`: how every checkpoint loads (its registry files are read before the sweep's own sweep.toml).
    Returns the comparison's lines."""
    import gc

    from readouts.atomic import atomic_write_bytes
    from readouts.driver import ModelOptions, RunOptions, run

    if kind not in STUDIES:
        raise ReadoutError(f"--study: '{kind}' is not one of {', '.join(STUDIES)}")
    study_obj = study_named(kind, readouts=study["readouts"], sample=study["sample"])
    out = Path(out)
    toml = out / "sweep.toml"
    text = registry_text(checkpoints).encode()
    out_existed, before = out.exists(), toml.read_bytes() if toml.exists() else None
    if before != text:
        atomic_write_bytes(toml, text)
    loading = dataclasses.replace(loading, registry_files=(*loading.registry_files, str(toml)))
    state_path = out / "sweep.json"
    try:
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
    except (ValueError, UnicodeDecodeError):
        state = {}  # unreadable: nothing is skipped, and every run directory resumes on its own
    asked = {"study": kind, **{k: v for k, v in study.items() if k not in ("force", "progress")}}
    dirs = [out / "runs" / c.label for c in checkpoints]
    loadings = [loading if c.adapter is None else dataclasses.replace(loading, adapter=c.adapter) for c in checkpoints]
    requests = [_request(c, asked, lo) for c, lo in zip(checkpoints, loadings)]
    done = [state.get(c.label, {}).get("request") == r and _complete(d) for c, r, d in zip(checkpoints, requests, dirs)]
    try:
        _check_available([c for c, skip in zip(checkpoints, done) if not skip], loading.registry_files)
    except ReadoutError:  # nothing ran: the folder is left as it was
        if before is not None:
            atomic_write_bytes(toml, before)
        else:
            toml.unlink(missing_ok=True)
            if not out_existed and not any(out.iterdir()):
                out.rmdir()
        raise
    for i, (c, rundir, request, skip, own) in enumerate(zip(checkpoints, dirs, requests, done, loadings), 1):
        if skip:
            log(f"sweep {i}/{len(checkpoints)}: {c.label} ({c.lineage}:{c.stage}): run complete, skipped ({rundir})")
            continue
        log(f"sweep {i}/{len(checkpoints)}: {c.label} ({c.lineage}:{c.stage}) -> {rundir}")
        options = RunOptions(model=ModelOptions(model=c.alias, loading=own), panel=study["panel"], profile=study["profile"],
                             overrides=tuple(study["overrides"]), limit=study["limit"], part=study.get("part"), out=str(rundir),
                             seed=study["seed"], force=study["force"], progress=study["progress"])
        run(study_obj, options, log=log)
        state[c.label] = {"given": c.given, "role": f"{c.lineage}:{c.stage}", "request": request, "run_dir": str(rundir)}
        atomic_write_bytes(state_path, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
        gc.collect()  # the finished model's weights go before the next one loads
        _empty_cuda_cache()
    if kind == "nsi":
        from stats.nsi import run_nsi_stats

        return run_nsi_stats([str(d) for d in dirs], out / "compare", seed=study["seed"] or 0, n_boot=n_boot)
    from stats.gap import compare_runs

    floor = {} if mass_floor is None else {"mass_floor": mass_floor}
    return compare_runs([str(d) for d in dirs], out / "compare", seed=study["seed"] or 0, n_boot=n_boot,
                        order=stage_order(checkpoints), **floor)


def _check_available(checkpoints: Sequence[Checkpoint], registry_files: Sequence[str]) -> None:
    """Every checkpoint still to run is on this machine, checked before the first one loads (a missing revision
    is found now, not after hours of runs)."""
    from engine.loading import is_available
    from engine.registry import resolve

    for c in checkpoints:
        ok, why = is_available(resolve(c.alias, registry_files))
        if not ok:
            raise ReadoutError(f"{c.given}: {why}; nothing was run (every checkpoint is checked before the first loads)")


def _complete(rundir: Path) -> bool:
    try:
        return json.loads((rundir / "manifest.json").read_text()).get("complete") is True
    except (OSError, ValueError):
        return False


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
