"""Model specs: the registry of aliases (data in engine/data/models.toml) and resolution of any name.

A name is, in this order: a registered alias, an existing local folder, or an HF id ("org/name").
Hub models are only ever read from the local HF cache; nothing here downloads.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine.errors import UnknownModelError

SOURCES = ("hub", "tiny", "embedded", "local")
STAGES = ("base", "sft", "dpo", "final")
"""Post-training stages in order (an `rl-<step>` stage sorts between dpo and final by its step)."""
HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


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
    """Where in its lineage: base, sft, dpo, final, or rl-<step>."""
    base_lineage: str | None = None
    """The lineage whose base weights it was post-trained from, when that is another one (Tulu 3: llama-3.1-8b)."""


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, ModelSpec]:
    """All registered aliases, in file order."""
    raw = tomllib.loads(resources.files("engine").joinpath("data/models.toml").read_text(encoding="utf-8"))
    specs = {}
    for alias, fields in raw.items():
        if fields.get("source") not in SOURCES:
            raise ValueError(f"engine/data/models.toml: [{alias}] source: must be one of {SOURCES}")
        stage = fields.get("stage")
        if stage is not None and stage not in STAGES and not re.fullmatch(r"rl-\d+", stage):
            raise ValueError(f"engine/data/models.toml: [{alias}] stage: must be one of {STAGES} or rl-<step>")
        if (stage is None) != (fields.get("lineage") is None):
            raise ValueError(f"engine/data/models.toml: [{alias}] lineage: lineage and stage go together")
        specs[alias] = ModelSpec(name=alias, **fields)
    return specs


def resolve(name: str) -> ModelSpec:
    """Spec for an alias, a local folder or an HF id, each optionally `@revision` (a branch, tag or commit of a
    hub checkpoint, e.g. an RL `step_XXXX` branch); UnknownModelError otherwise."""
    specs = registry()
    if name in specs:
        return specs[name]
    base, at, revision = name.rpartition("@")
    if at and base and revision and not Path(name).expanduser().exists():
        spec = resolve(base)
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
    raise UnknownModelError(
        f"unknown model '{name}': not an alias (see `readout models`), not an existing folder, not an HF id (org/name)"
    )
