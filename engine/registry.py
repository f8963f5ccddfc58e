"""Model specs: the registry of aliases (data in engine/data/models.toml, plus the user's registry files) and
resolution of any name.

A name is, in this order: a registered alias, an existing local folder, or an HF id ("org/name").
Hub models are only ever read from the local HF cache; nothing here downloads.

User registry files (`--models FILE` on every command that loads a model, and the environment variable
LOGIT_READOUT_MODELS: one path or several joined by the OS path separator) have models.toml's format. They
add aliases and lineages. An alias that is already registered (built in, or in an earlier user file) is
refused unless its entry says `override = true`, which replaces it. A local `path` is read relative to the
file's folder. Every alias remembers the file that defined it and its sha256 (recorded in run manifests).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from contract.names import STAGE_NAME
from engine.errors import ReadoutError, UnknownModelError

SOURCES = ("hub", "tiny", "embedded", "local")
HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
USER_MODELS_ENV = "LOGIT_READOUT_MODELS"
"""Environment variable naming user registry files (os.pathsep-separated), read besides `--models`."""
BUILTIN = "engine/data/models.toml"
"""How the built-in registry is named in messages and manifests."""


class RegistryError(ReadoutError):
    """A registry file is unreadable or an entry in it is malformed; the message names the file, alias and field."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's weights come from and how it is framed."""

    name: str
    """The alias, local path or HF id the user gave."""
    source: str
    """One of SOURCES, or "memory" for a model the caller already holds (engine.loading.from_memory)."""
    hf_id: str | None = None
    """HF repository id (hub models; for the embedded model, the checkpoint it was quantized from)."""
    revision: str | None = None
    """Pinned revision; None means the snapshot present in the local HF cache."""
    family: str | None = None
    """Template family (olmo3, qwen2, llama3, tulu3, chatml, base), informational."""
    chat: bool | None = None
    """Whether the model is meant to be used through its chat template; None = decided by the tokenizer."""
    path: str | None = None
    """Local folder (local models)."""
    notes: str | None = None
    """Free text shown by `readout models`."""
    lineage: str | None = None
    """The post-training lineage this checkpoint belongs to (e.g. olmo-3-7b); None for unlisted models."""
    stage: str | None = None
    """Where in its lineage: base, sft, dpo, final, or any stage name (rl-200, step-1000 ...; contract.names)."""
    base_lineage: str | None = None
    """The lineage whose base weights it was post-trained from, when that is another one (Tulu 3: llama-3.1-8b)."""
    registry_file: str | None = None
    """The registry file that defined this alias (BUILTIN, or a user file's absolute path); None: not an alias."""
    registry_sha256: str | None = None
    """sha256 of that file's bytes, so a run names the exact registry it resolved its model from."""


_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.name not in ("name", "registry_file", "registry_sha256"))
"""The fields a registry entry may set (plus `override` in a user file)."""


def user_model_files(files: Sequence[str | Path] = ()) -> tuple[Path, ...]:
    """The user registry files in force: LOGIT_READOUT_MODELS's, then `files` (a command's `--models`), each once,
    absolute."""
    env = [p for p in os.environ.get(USER_MODELS_ENV, "").split(os.pathsep) if p.strip()]
    out: list[Path] = []
    for where, raw in [(USER_MODELS_ENV, p) for p in env] + [("--models", str(p)) for p in files]:
        path = Path(raw).expanduser().absolute()
        if not path.is_file():
            raise RegistryError(f"{where}: {raw}: no such registry file")
        if path not in out:
            out.append(path)
    return tuple(out)


def registry(files: Sequence[str | Path] = ()) -> dict[str, ModelSpec]:
    """All registered aliases: the built-in ones in file order, then each user file's new ones (LOGIT_READOUT_MODELS's,
    then `files`). Cached per set of user files (and their modification times), so a changed environment or an
    edited file is read afresh."""
    key = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in user_model_files(files))
    return _registry(key)


@functools.lru_cache(maxsize=8)
def _registry(files: tuple[tuple[str, int, int], ...]) -> dict[str, ModelSpec]:
    data = resources.files("engine").joinpath("data/models.toml").read_bytes()
    specs = _entries(data, BUILTIN, None, {})
    for path, _, _ in files:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise RegistryError(f"{path}: cannot read ({exc.strerror or exc})") from None
        specs.update(_entries(data, path, Path(path).parent, specs))
    return specs


def _entries(data: bytes, file: str, folder: Path | None, known: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
    """The aliases one registry file defines, validated; `folder` is None for the built-in file (no overrides)."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"{file}: not valid TOML ({exc})") from None
    sha = hashlib.sha256(data).hexdigest()
    specs = {}
    for alias, fields in raw.items():
        where = f"{file}: [{alias}]"
        if not isinstance(fields, dict):
            raise RegistryError(f"{where}: must be a table of fields, e.g. [\"{alias}\"] then source = \"hub\" ...")
        fields = dict(fields)
        override = fields.pop("override", False) if folder is not None else False
        if not isinstance(override, bool):
            raise RegistryError(f"{where} override: must be true or false")
        if not alias.strip() or any(ch.isspace() for ch in alias):
            raise RegistryError(f"{where}: an alias must be non-empty and without spaces")
        _check_fields(where, fields)
        if fields.get("source") == "local" and folder is not None:
            fields["path"] = str((folder / Path(fields["path"]).expanduser()).resolve())
        if alias in known and not override:
            prior = known[alias].registry_file
            raise RegistryError(f"{where}: alias already defined in {prior}; set override = true in this entry to "
                                f"replace it, or choose another name")
        if override and alias not in known:
            raise RegistryError(f"{where} override: there is no earlier alias '{alias}' to replace")
        built = fields.get("source") in ("tiny", "embedded")
        if built and folder is not None and (alias not in known or known[alias].source != fields["source"]):
            raise RegistryError(f"{where} source: {fields['source']} models are built in by name; a user entry can only "
                                f"override one of them (e.g. to give it a lineage), or use hub or local")
        specs[alias] = ModelSpec(name=alias, registry_file=file, registry_sha256=sha, **fields)
    return specs


def _check_fields(where: str, fields: dict) -> None:
    """One line naming the first bad field of an entry."""
    for key, value in fields.items():
        if key not in _FIELDS:
            raise RegistryError(f"{where} {key}: unknown field; allowed: {', '.join([*_FIELDS, 'override'])}")
        wanted = bool if key == "chat" else str
        if not isinstance(value, wanted):
            raise RegistryError(f"{where} {key}: must be {'true or false' if wanted is bool else 'a string'}")
    source = fields.get("source")
    if source not in SOURCES:
        raise RegistryError(f"{where} source: must be one of {', '.join(SOURCES)}")
    needed = {"hub": "hf_id", "local": "path"}.get(source)
    if needed and not fields.get(needed):
        raise RegistryError(f"{where} {needed}: required for a {source} model")
    if fields.get("revision") is not None and source != "hub":
        raise RegistryError(f"{where} revision: applies to hub models only")
    stage = fields.get("stage")
    if stage is not None and not re.fullmatch(STAGE_NAME, stage):
        raise RegistryError(f"{where} stage: '{stage}' must be a name like sft, dpo, final, rl-200 or step-1000")
    if (stage is None) != (fields.get("lineage") is None):
        raise RegistryError(f"{where} lineage: lineage and stage go together")
    if fields.get("base_lineage") is not None and fields.get("lineage") is None:
        raise RegistryError(f"{where} base_lineage: needs a lineage and stage")


def split_revision(name: str) -> tuple[str, str | None]:
    """`NAME@REV` -> (NAME, REV): the one place a model name's revision is parsed. (name, None) when it names none:
    no `@`, nothing on either side of the last one, or an existing file or folder whose name holds it."""
    base, at, revision = name.rpartition("@")
    if at and base and revision and not Path(name).expanduser().exists():
        return base, revision
    return name, None


def resolve(name: str, files: Sequence[str | Path] = ()) -> ModelSpec:
    """Spec for an alias, a local folder or an HF id, each optionally `@revision` (a branch, tag or commit of a
    hub checkpoint, e.g. an RL `step_XXXX` branch), with the user registry `files` (a command's `--models`) in
    force; UnknownModelError otherwise."""
    specs = registry(files)
    if name in specs:
        return specs[name]
    base, revision = split_revision(name)
    if revision is not None:
        spec = resolve(base, files)
        if spec.source != "hub":
            raise UnknownModelError(f"model '{name}': a revision (@{revision}) applies to hub checkpoints only, "
                                    f"and '{base}' is a {spec.source} model")
        return dataclasses.replace(spec, name=name, revision=revision)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UnknownModelError(f"model '{name}': the folder has no config.json, so it is not a transformers checkpoint")
        return ModelSpec(name=name, source="local", path=str(path.resolve()))
    if path.exists():
        raise UnknownModelError(f"model '{name}': is a file, expected a checkpoint folder, an alias or an HF id")
    if HF_ID.match(name) and not name.startswith((".", "/")):
        return ModelSpec(name=name, source="hub", hf_id=name)
    near = difflib.get_close_matches(name, list(specs), n=1, cutoff=0.6)
    hint = f"did you mean '{near[0]}'? " if near else ""
    raise UnknownModelError(
        f"unknown model '{name}': {hint}not an alias (see `readout models`; add your own with --models FILE or "
        f"{USER_MODELS_ENV}), not an existing folder, not an HF id (org/name)"
    )
