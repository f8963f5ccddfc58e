"""`readout score`: score a probe file on one model and write one JSON line per probe."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from contract.metadata import METADATA
from engine.errors import LetterTokenError, ProbeInputError, RenderError
from engine.render import encode_prompt
from engine.scoring import score_ids
from readouts.atomic import atomic_write_bytes
from readouts.driver import ModelOptions
from readouts.manifest import model_manifest
from readouts.probes_io import read_probes, write_jsonl_atomic


@dataclass(frozen=True)
class ScoreConfig:
    """Everything `readout score` was asked to do."""

    probes: str
    model: ModelOptions
    out: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_batch: int | None = None
    prefix_reuse: bool = True
    plain: bool = False
    progress: bool = False


def run_score(cfg: ScoreConfig) -> int:
    """Validate the probes, load the model, score, write `cfg.out` atomically; returns the probe count."""
    if not math.isfinite(cfg.temperature) or cfg.temperature < 0:
        raise ProbeInputError(f"--temperature: must be a number >= 0, got {cfg.temperature}")
    if not math.isfinite(cfg.top_p) or not 0 < cfg.top_p <= 1:
        raise ProbeInputError(f"--top-p: must be in (0, 1], got {cfg.top_p}")
    records = read_probes(cfg.probes)  # before loading the model: bad input fails fast
    lm = cfg.model.load()
    seqs, letters = [], []
    for rec in records:
        where = rec.where
        try:
            letters.append(lm.letters(rec.letters))
        except LetterTokenError as exc:
            raise LetterTokenError(f"{where}: letters: {exc}") from None
        field = "messages" if rec.prompt.messages else "text"
        try:
            seqs.append(encode_prompt(lm.tokenizer, rec.prompt))
        except RenderError as exc:
            raise RenderError(f"{where}: {field}: {exc}") from None
        lm.check_fits(len(seqs[-1]), f"{where}: {field}")
    results = score_ids(
        lm.model, seqs, letters, temperature=cfg.temperature, top_p=cfg.top_p, fast=not cfg.plain,
        prefix_reuse=cfg.prefix_reuse, token_budget=cfg.model.token_budget, max_batch=cfg.max_batch, pad_id=lm.pad_id,
        progress=cfg.progress,
    )
    write_jsonl_atomic(cfg.out, (score_row(rec, res) for rec, res in zip(records, results)))
    atomic_write_bytes(manifest_path(cfg.out), json.dumps(score_manifest(cfg, lm, letters), indent=2, default=str).encode())
    return len(records)


def score_row(rec, res) -> dict:
    """One output line: the probe's id, its metadata when it has any, and the readout."""
    meta = {METADATA: dict(rec.metadata)} if rec.metadata else {}
    return {"id": rec.id, **meta, **res.as_dict()}


def manifest_path(out: str) -> Path:
    """Where `readout score` records how its output was made: beside it, `<out>.manifest.json`."""
    return Path(f"{out}.manifest.json")


def score_manifest(cfg: ScoreConfig, lm, letters) -> dict:
    """The model and its facts, the settings, the probe file's hash and every letter set read."""
    sets = {lt.letters: lt for lt in letters}
    return {
        **{k: v for k, v in model_manifest(lm, next(iter(sets.values()))).items() if k != "letters"},
        "kind": "score",
        "letters": {"".join(k): lt.as_manifest() for k, lt in sets.items()},
        "probes": {"path": str(cfg.probes), "sha256": hashlib.sha256(Path(cfg.probes).read_bytes()).hexdigest(),
                   "records": len(letters)},
        "settings": {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_batch": cfg.max_batch,
                     "prefix_reuse": cfg.prefix_reuse, "plain": cfg.plain, "token_budget": cfg.model.token_budget},
        "output": str(cfg.out),
    }
