"""`readout watch DIR`: the checkpoints a trainer writes under DIR, each read as a run of a sweep (readouts/sweep.py)
once it is complete, in step order, then compared.

A checkpoint is a folder `checkpoint-<step>` directly under DIR, as transformers' `Trainer` (and TRL's trainers built
on it) and peft write them: full weights (config.json with model.safetensors, a sharded model.safetensors.index.json,
or pytorch_model.bin) or a PEFT adapter (adapter_config.json with adapter_model.safetensors or .bin), whose base model
is `--model` or else the adapter's own `base_model_name_or_path`. A folder is read only once it is complete: nothing
in it (nor its list of files) has changed for `settle` seconds, its JSON files parse, every safetensors file holds
exactly the bytes its header declares, a .bin is a whole zip archive and the shards an index names are all there. A
folder still changing is being written and waited for in silence; one that has stopped changing while incomplete (a
truncated or corrupt file) is named in one line and tried again at the next look.

The sweep folder (`--out`) is the sweep's: sweep.toml, sweep.json, runs/checkpoint-<step>/ and compare/. Its role of
each checkpoint is lineage:step-<step>. Watching again resumes: finished runs are skipped, a killed one resumes from its
finished chunks. The watch stops after `quiet` seconds with no new complete checkpoint, or on SIGINT / SIGTERM.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import struct
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from engine.errors import ReadoutError
from readouts.options import Loading

CHECKPOINT = re.compile(r"checkpoint-(\d+)")
"""The folder names a trainer gives its checkpoints (transformers' PREFIX_CHECKPOINT_DIR and the step)."""


@dataclass(frozen=True)
class Found:
    """A checkpoint folder as last looked at."""

    step: int
    path: Path
    kind: str | None
    """`weights` or `adapter` (None: neither config file is there yet)."""
    problem: str | None
    """Why it cannot be read yet (None: complete)."""
    base: str | None = None
    """An adapter's declared base model (adapter_config.json's base_model_name_or_path)."""


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be read whole (None: its size is exactly what its header declares)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{path.name}: truncated ({size} bytes, no header)"
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            return f"{path.name}: corrupt (a header of {n} bytes declared)"
        if size < 8 + n:
            return f"{path.name}: truncated ({size} bytes; the header alone declares {8 + n})"
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            return f"{path.name}: corrupt (its header is not JSON)"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{path.name}: corrupt (a tensor entry without data_offsets)"
    if size < 8 + n + end:
        return f"{path.name}: truncated ({size} bytes of {8 + n + end})"
    if size > 8 + n + end:
        return f"{path.name}: corrupt ({size - 8 - n - end} bytes past its tensors' end)"
    return None


def _json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{path.name}: not complete JSON"
    return None


def _weights_problem(folder: Path, stem: str) -> str | None:
    """Why the weights `stem`.safetensors / .bin (or their sharded index) in `folder` are not all readable."""
    index = next((folder / f"{stem}{ext}.index.json" for ext in (".safetensors", ".bin")
                  if (folder / f"{stem}{ext}.index.json").is_file()), None)
    if index is not None:
        why = _json_problem(index)
        if why:
            return why
        files = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            return f"{index.name}: {len(missing)} of {len(files)} shards not there yet (first: {missing[0]})"
    elif (folder / f"{stem}.safetensors").is_file():
        files = [f"{stem}.safetensors"]
    elif (folder / f"{stem}.bin").is_file():
        files = [f"{stem}.bin"]
    else:
        return f"no {stem}.safetensors yet"
    for name in files:
        path = folder / name
        if name.endswith(".safetensors"):
            why = safetensors_problem(path)
        else:
            why = None if zipfile.is_zipfile(path) else f"{name}: truncated or corrupt (not a whole zip archive)"
        if why:
            return why
    return None


def inspect(path: Path, settle: float = 5.0, now: float | None = None) -> Found:
    """A checkpoint folder: its kind and why it cannot be read yet (None: complete)."""
    step = int(CHECKPOINT.fullmatch(path.name).group(1))
    now = time.time() if now is None else now
    if (path / "adapter_config.json").is_file():
        kind, config, stem = "adapter", path / "adapter_config.json", "adapter_model"
    elif (path / "config.json").is_file():
        kind, config, stem = "weights", path / "config.json", "model"
        if not any(path.glob("model*.safetensors*")) and any(path.glob("pytorch_model*.bin*")):
            stem = "pytorch_model"
    else:
        kind, config, stem = None, None, None
    why = ("no config.json or adapter_config.json yet" if kind is None
           else _json_problem(config) or _weights_problem(path, stem))
    base = None
    if why is None and kind == "adapter":
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    newest = max(p.stat().st_mtime for p in (path, *(p for p in path.iterdir() if p.is_file())))
    if now - newest < settle:  # a missing or partial file in a folder still changing is being written, not named
        why = f"being written (a file changed {max(0.0, now - newest):.1f} s ago)"
    return Found(step, path, kind, why, base)


def scan(folder: Path, settle: float = 5.0) -> list[Found]:
    """Every `checkpoint-<step>` folder directly under `folder`, in step order."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.is_dir() and CHECKPOINT.fullmatch(path.name):
            try:
                found.append(inspect(path, settle))
            except FileNotFoundError:  # removed while looked at (a trainer's save_total_limit)
                continue
    return sorted(found, key=lambda f: f.step)


def _checkpoints(ready: list[Found], lineage: str, base: str | None, registry_files) -> list:
    """The sweep's Checkpoint of each complete folder: label checkpoint-<step>, role lineage:step-<step>; an adapter
    is read on its base model."""
    from readouts.sweep import plan

    items = []
    for f in ready:
        if f.kind == "adapter":
            model = base or f.base
            if not model:
                raise ReadoutError(f"{f.path}: an adapter whose adapter_config.json names no base model; give --model")
            model = _aliasable(model, registry_files)
            items.append((model, f"{lineage}:step-{f.step}", model))
        else:
            items.append((str(f.path), f"{lineage}:step-{f.step}", str(f.path)))
    out = []
    for f, c in zip(ready, plan(items, {}, lineage, lineage, registry_files)):
        label = f.path.name
        entry = None if c.entry is None else {k: v for k, v in c.entry.items() if k != "override"}  # the label is new
        out.append(dataclasses.replace(c, label=label, alias=label if entry is not None else c.alias, entry=entry,
                                       adapter=str(f.path) if f.kind == "adapter" else None))
    return out


def _aliasable(model: str, registry_files) -> str:
    """A base model each adapter checkpoint's sweep.toml entry can name: a built-in model (tiny, embedded), which a
    user entry cannot alias, by its folder on disk."""
    from engine.loading import locate
    from engine.registry import resolve

    spec = resolve(model, registry_files)
    return str(locate(spec)[0]) if spec.source in ("tiny", "embedded") else model


class Stop:
    """Set by SIGINT or SIGTERM while the watch runs (or by a caller): the watch ends at its next look. A signal
    that comes while a checkpoint is being read interrupts that run (its finished chunks are kept)."""

    def __init__(self):
        self.event = threading.Event()
        self.busy = False

    def __call__(self, signum, _frame):
        self.event.set()
        self.signal = signal.Signals(signum).name
        if self.busy:
            raise KeyboardInterrupt

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}


def watch(folder: str | Path, out: str | Path, *, study: Mapping, loading: Loading = Loading(), base: str | None = None,
          lineage: str | None = None, kind: str = "gap", n_boot: int = 10_000, mass_floor: float | None = None,
          poll: float = 10.0, quiet: float = 600.0, settle: float = 5.0, log: Callable[[str], None] = print,
          stop: Stop | None = None) -> list[str]:
    """Watch `folder` until `quiet` seconds pass with no new complete checkpoint, or a signal; returns the last
    comparison's lines (empty when no checkpoint was read)."""
    from readouts.sweep import run_sweep

    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise ReadoutError(f"{folder}: not a folder to watch")
    lineage = lineage or folder.resolve().name
    stop = stop or Stop()
    previous = stop.install()
    named: dict[Path, str] = {}
    done: set[int] = set()
    lines: list[str] = []
    last = time.monotonic()
    log(f"watching {folder} for checkpoint-<step> folders (a look every {poll:g} s; stops after {quiet:g} s without a new one)")
    try:
        while not stop.event.is_set():
            found = scan(folder, settle)
            for f in found:
                if f.problem is not None and named.get(f.path) != f.problem and not f.problem.startswith("being written"):
                    log(f"{f.path}: not read yet: {f.problem}; tried again at the next look")
                named[f.path] = f.problem or ""
            ready = [f for f in found if f.problem is None]
            if loading.adapter is not None and any(f.kind == "adapter" for f in ready):
                raise ReadoutError("--peft: the checkpoints under the folder are adapters themselves; give their base "
                                   "with --model instead")
            if {f.step for f in ready} - done:
                stop.busy = True
                try:
                    lines = run_sweep(_checkpoints(ready, lineage, base, loading.registry_files), out, study=study,
                                      loading=loading, n_boot=n_boot, mass_floor=mass_floor, kind=kind, log=log)
                finally:
                    stop.busy = False
                done |= {f.step for f in ready}
                last = time.monotonic()
                continue
            if time.monotonic() - last >= quiet:
                log(f"watch: no new checkpoint for {quiet:g} s; stopped ({len(done)} read)")
                break
            stop.event.wait(poll)
        else:
            log(f"watch: stopped by {getattr(stop, 'signal', 'request')} ({len(done)} read); the same command resumes")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    unread = [f for f in scan(folder, settle) if f.problem is not None]
    for f in unread:
        log(f"{f.path}: never read: {f.problem}")
    return lines
