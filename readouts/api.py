"""The Python API, for notebooks: score prompts with a model and tokenizer you already hold (PEFT-wrapped,
hooked, steered), and run a study on such a model. The same engine and driver as the command line: a study run
on an in-memory model writes the tables `readout run` writes for the same checkpoint.

    from readouts.api import run_study, score_prompts
    rows = score_prompts(model, tokenizer, ["Pick one. A) stay B) go"], letters="AB", temperature=0.7)
    run_dir = run_study("gap", model, tokenizer, name="my-ckpt", out="runs/my-ckpt", limit=5)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from engine.errors import ReadoutError
from engine.loading import from_memory
from engine.render import Prompt, encode_prompts
from engine.scoring import score_ids


def _prompt(item) -> Prompt:
    if isinstance(item, Prompt):
        return item
    if isinstance(item, str):
        return Prompt(messages=({"role": "user", "content": item},))
    if isinstance(item, (list, tuple)) and all(isinstance(m, dict) for m in item):
        return Prompt(messages=tuple(item))
    raise ReadoutError(f"prompts: {item!r} is neither a string (one user turn), a list of messages, nor a Prompt")


def score_prompts(model, tokenizer, prompts: Sequence, letters: str | Sequence[str] = "AB", *, temperature: float = 1.0,
                  top_p: float = 1.0, template_kwargs: dict | None = None) -> list[dict]:
    """Letter masses at the token after each prompt (a string is one user turn under the chat template; a list
    of messages; or an engine.render.Prompt, also for raw text): one dict per prompt, as `readout score` writes."""
    lm = from_memory(model, tokenizer, template_kwargs=template_kwargs)
    items = [_prompt(p) for p in prompts]
    seqs = encode_prompts(lm.tokenizer, items)
    results = score_ids(lm.model, seqs, [lm.letters(tuple(letters))] * len(seqs), temperature=temperature, top_p=top_p,
                        pad_id=lm.pad_id)
    return [res.as_dict() for res in results]


def run_study(kind: str, model, tokenizer, *, name: str, out: str | Path, profile: str = "quick", panel: str | None = None,
              readouts: str | None = None, seed: int | None = None, limit: int | None = None,
              overrides: Sequence[str] = (), progress: bool = False, log=print) -> Path:
    """Run (or resume) a study, "gap" (`readout run`) or "nsi" (`readout nsi`), on an in-memory model; returns the
    run directory. `name` stands for the checkpoint in the manifest (source: memory)."""
    from readouts.driver import ModelOptions, RunOptions, run
    from readouts.studies import study_named

    study = study_named(kind, readouts=readouts)
    options = RunOptions(model=ModelOptions(model=name, loaded=from_memory(model, tokenizer, name=name)), panel=panel,
                         profile=profile, overrides=tuple(overrides), limit=limit, out=str(out), seed=seed, progress=progress)
    return run(study, options, log=log)
