"""Synthetic framing-stability run directories (nsi_replies.parquet, nsi_continuous.parquet, manifest.json).

For tests and demonstrations of the stats layer without a model: each model x dilemma x framing cell draws
its replies from a planted endorsement probability, so any statistic can be checked against the truth it
was built from. The tables follow docs/tables.md ("Framing-stability runs"); the reply texts are JSON
objects in the response schema (some fenced, some after a reasoning preamble, a few truncated at the
budget) with the parse columns set as the four-stage parser would set them; both tables are built through
their contract (contract.tables.NSI_REPLIES / NSI_CONTINUOUS), so they hold every declared column, typed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from contract import FRAMINGS, NEGATED
from contract.metadata import METADATA
from contract.tables import NO_BOUND, NSI_CONTINUOUS, NSI_REPLIES

DILEMMAS = (
    ("medical-1", "medical"), ("medical-2", "medical"), ("financial-1", "financial"), ("financial-2", "financial"),
    ("business-1", "business"), ("business-2", "business"), ("legal-1", "legal"), ("legal-2", "legal"),
    ("military-1", "military"), ("military-2", "military"), ("education-1", "education"),
    ("education-2", "education"), ("science-1", "science"), ("science-2", "science"),
)
TRUNCATION_ERROR = "unbalanced braces: no closed JSON object (truncated reply?)"


def coherent_rates(rng: np.random.Generator, n_dilemmas: int = len(DILEMMAS)) -> np.ndarray:
    """Endorsement probabilities with no framing effect: one rate per dilemma, the same under F0..F3."""
    base = rng.uniform(0.1, 0.9, size=n_dilemmas)
    return np.repeat(base[:, None], len(FRAMINGS), axis=1)


def acquiescent_rates(rng: np.random.Generator, n_dilemmas: int = len(DILEMMAS), strength: float = 1.0,
                      agree_range: tuple[float, float] = (0.1, 0.9)) -> np.ndarray:
    """A negation-blind responder: its *agree* probability ignores polarity (strength 1) or partly (0..1).

    Endorsement under a negated framing is 1 - agree, so endorsement swings with polarity; with a low
    ``agree_range`` the model agrees rarely with both polarities (p0 + p1 - 1 < 0, the paper's open models).
    """
    base = rng.uniform(*agree_range, size=n_dilemmas)
    agree = np.repeat(base[:, None], len(FRAMINGS), axis=1)
    endorse = np.where([NEGATED[f] for f in FRAMINGS], 1.0 - agree, agree)
    coherent = np.repeat(base[:, None], len(FRAMINGS), axis=1)
    return strength * endorse + (1.0 - strength) * coherent


def _reply(rng: np.random.Generator, decision: str, endorse: int) -> tuple[str, int]:
    """Reply text and the stage at which the four-stage parser accepts it."""
    obj = {
        "decision": decision,
        "confidence": int(rng.integers(50, 96)),
        "adherence_to_laws": int(rng.integers(0, 101)),
        "adherence_to_social_ethics": int(rng.integers(0, 101)),
        "objective_positive_consequences": int(rng.integers(0, 101)),
        "objective_negative_consequences": int(rng.integers(0, 101)),
        "reasoning": ("On balance the action is justified here." if endorse
                      else "On balance the action should not be taken."),
    }
    body = json.dumps(obj)
    style = rng.random()
    if style < 0.15:
        return "```json\n" + json.dumps(obj, indent=2) + "\n```", 1
    if style < 0.22:
        return "<think>Weighing {harm} against {benefit}.</think>\n" + body, 2
    return body, 1


_SCORES = tuple(c.name for c in NSI_REPLIES.columns if c.dtype == "float?")
"""The schema's 0-100 score fields (the reply table's nullable float columns)."""


def _reply_row(rng: np.random.Generator, model: str, dil: str, dom: str, f: str, temp: float, idx: int,
               endorse: int | None) -> dict:
    """One reply row; ``endorse`` None makes a reply cut at the budget that no parser stage accepts."""
    neg = NEGATED[f]
    row = {"model": model, "dilemma_id": dil, "domain": dom, "framing": f, "negated": neg, METADATA: None,
           "temperature": temp, "sample": idx}
    decision = "agree" if bool(endorse) != neg else "disagree"
    text, stage = _reply(rng, decision, int(bool(endorse)))
    if endorse is None:
        text = text[: max(5, len(text) // 2)].replace("}", "")  # cut at the budget: never closes
        row.update(text=text, generated_tokens=len(text) // 4, truncated=True, parse_ok=False, parse_stage=None,
                   parse_error=TRUNCATION_ERROR, decision=None, endorse=None, reasoning=None)
        row.update({k: None for k in _SCORES})
        return row
    obj = json.loads(text[text.index("{"): text.rindex("}") + 1]) if stage == 1 else json.loads(text.split("\n", 1)[1])
    row.update(text=text, generated_tokens=len(text) // 4, truncated=False, parse_ok=True, parse_stage=stage,
               parse_error=None, decision=decision, endorse=int(endorse), reasoning=obj["reasoning"],
               **{k: float(obj[k]) for k in _SCORES})
    return row


def _continuous_row(rng: np.random.Generator, model: str, dil: str, dom: str, f: str, p: float, noise: float) -> dict:
    neg = NEGATED[f]
    pe = float(np.clip(p + rng.normal(0.0, noise), 1e-3, 1 - 1e-3))
    pa = 1.0 - pe if neg else pe
    total = float(rng.uniform(0.6, 0.95))
    # At T 0.7 the two words' odds sharpen by the power 1 / 0.7 (top-p leaves both in the nucleus here).
    odds = (pa / (1.0 - pa)) ** (1 / 0.7)
    pt = odds / (1.0 + odds)
    return {"model": model, "dilemma_id": dil, "domain": dom, "framing": f, "negated": neg, METADATA: None,
            "mass_agree": pa * total, "mass_disagree": (1.0 - pa) * total, "p_agree": pa,
            "p_endorse": 1.0 - pa if neg else pa, "prompt_tokens": int(rng.integers(250, 420)),
            "mass_agree_tempered": pt * total, "mass_disagree_tempered": (1.0 - pt) * total, "p_agree_tempered": pt,
            "p_endorse_tempered": 1.0 - pt if neg else pt, "tempered_temperature": 0.7, "tempered_top_p": 0.95,
            **NO_BOUND}


def synthetic_tables(model: str, rates: np.ndarray, *, n_samples: int = 30, temperature: float = 0.7,
                     greedy: bool = True, parse_failure_rate: float = 0.02, continuous_noise: float = 0.03,
                     rng: np.random.Generator, dilemmas=DILEMMAS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Reply and continuous tables for one model; ``rates`` (dilemmas, 4) are the planted endorsement probabilities."""
    rates = np.asarray(rates, dtype=float)
    if rates.shape != (len(dilemmas), len(FRAMINGS)):
        raise ValueError(f"rates must have shape ({len(dilemmas)}, {len(FRAMINGS)}), got {rates.shape}")
    rows, cont = [], []
    for s_i, (dil, dom) in enumerate(dilemmas):
        for f_i, f in enumerate(FRAMINGS):
            p = float(np.clip(rates[s_i, f_i], 0.0, 1.0))
            draws = [(temperature, i) for i in range(n_samples)]
            if greedy:
                draws.append((0.0, 0))
            for temp, idx in draws:
                endorse = int(p >= 0.5) if temp == 0.0 else int(rng.random() < p)
                fail = temp > 0 and rng.random() < parse_failure_rate
                rows.append(_reply_row(rng, model, dil, dom, f, temp, idx, None if fail else endorse))
            cont.append(_continuous_row(rng, model, dil, dom, f, p, continuous_noise))
    return NSI_REPLIES.frame(rows), NSI_CONTINUOUS.frame(cont)


def count_tables(model: str, n: np.ndarray, k: np.ndarray, *, n_samples: int | None = None, temperature: float = 0.7,
                 rng: np.random.Generator, dilemmas=DILEMMAS) -> pd.DataFrame:
    """A reply table with exact counts: per dilemma x framing, ``n`` parsed replies of which ``k`` endorse,
    then parse failures up to ``n_samples`` sampled rows (default: the largest n). For reproducing published
    counts: nothing is drawn but the reply texts."""
    n, k = np.asarray(n, dtype=int), np.asarray(k, dtype=int)
    if n.shape != (len(dilemmas), len(FRAMINGS)) or k.shape != n.shape or (k > n).any() or (k < 0).any():
        raise ValueError(f"n, k must be ({len(dilemmas)}, {len(FRAMINGS)}) counts with 0 <= k <= n")
    total = int(n.max()) if n_samples is None else int(n_samples)
    rows = []
    for s_i, (dil, dom) in enumerate(dilemmas):
        for f_i, f in enumerate(FRAMINGS):
            for idx in range(total):
                endorse = None if idx >= n[s_i, f_i] else int(idx < k[s_i, f_i])
                rows.append(_reply_row(rng, model, dil, dom, f, temperature, idx, endorse))
    return NSI_REPLIES.frame(rows)


def write_count_run(run_dir, model: str, n: np.ndarray, k: np.ndarray, *, seed: int = 0, **kwargs) -> Path:
    """Write an NSI run directory holding exactly the counts ``n``, ``k`` (see ``count_tables``)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    count_tables(model, n, k, rng=np.random.default_rng(seed), **kwargs).to_parquet(run / NSI_REPLIES.file, index=False)
    _write_manifest(run, model, seed, int(np.max(n)))
    return run


def _write_manifest(run: Path, model: str, seed: int, samples: int) -> None:
    manifest = {"model": {"name": model, "source": "synthetic"}, "panel": {"name": "nsi-14"},
                "profile": {"name": "synthetic", "samples": samples}, "seed": seed, "readouts": ["nsi"]}
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))


def write_synthetic_run(run_dir, model: str, rates: np.ndarray, *, seed: int = 0, continuous: bool = True,
                        **kwargs) -> Path:
    """Write a synthetic NSI run directory for ``model`` (see ``synthetic_tables`` for keyword arguments)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    rep, cont = synthetic_tables(model, rates, rng=np.random.default_rng(seed), **kwargs)
    rep.to_parquet(run / NSI_REPLIES.file, index=False)
    if continuous:
        cont.to_parquet(run / NSI_CONTINUOUS.file, index=False)
    _write_manifest(run, model, seed, kwargs.get("n_samples", 30))
    return run
