"""Steering directions, one vector per depth (0..L, engine/residuals.py), each a mean over the training split of a
difference of read-position residuals of two prompts of the same scenario in the same option order (D's orders):

- pressure: agent prompt, primary cell, minus agent prompt, twin cell (what the incentive sentence adds);
- judgment: letter-only judge prompt (J0's frame) minus agent prompt, both primary (what asking "which is right"
  instead of "what do you do" adds).

A random null direction at a depth is a seeded Gaussian vector scaled to the steered direction's norm there. A vector
file (.npy) holds one vector [hidden] used at every depth, or one per depth [L + 1, hidden].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from contract.names import STEER_DIRECTIONS
from contract.readouts import readout
from engine.errors import ReadoutError
from engine.render import encode_prompt
from engine.residuals import n_depths
from engine.sampling import derive_seed
from engine.scoring import score_ids
from panels.frames import render
from panels.orders import balanced_by_position

AGENT_FRAME = readout("D").frames[0]
JUDGE_FRAME = readout("J0").frames[0]
PAIRS = {"pressure": ((AGENT_FRAME, "primary"), (AGENT_FRAME, "twin")),
         "judgment": ((JUDGE_FRAME, "primary"), (AGENT_FRAME, "primary"))}
"""Per direction: (frame, cell) of the prompt whose residual is added, and of the one subtracted."""
assert tuple(PAIRS) == STEER_DIRECTIONS

CAPABILITY_TEXT = Path(__file__).parent / "data" / "capability.txt"
"""The held-out text whose mean per-token loss is the capability check (prose written for this project)."""


def contrast_renders(scenarios, kind: str, profile, seed: int) -> list[tuple]:
    """(plus, minus) rendered prompts of direction `kind`: each scenario holding both cells, in D's option orders
    (what contrast_direction reads, and `readout steer --plan` counts)."""
    from readouts.gap.recipe import orders_for

    if kind not in PAIRS:
        raise ReadoutError(f"--direction: '{kind}' is not one of {', '.join(STEER_DIRECTIONS)} or a .npy file")
    plus, minus = PAIRS[kind]
    return [tuple(render(s, frame, cell, order, profile.frames) for frame, cell in (plus, minus))
            for s in scenarios if all(cell in s.cells for _, cell in (plus, minus))
            for order in orders_for(s, readout("D"), profile, seed)]


def unbalanced_orders(scenarios, profile, seed: int) -> list[str]:
    """Ids of `scenarios` whose D option orders (the contrast's) do not put every option at every letter equally
    often. A mean contrast over such orders also carries which letters the scenarios' options stood at: under
    pressure the violating option's letter rises, and where it stood more often at one letter the direction raises
    that letter in any prompt it is added to, the judge's included."""
    from readouts.gap.recipe import orders_for

    return [s.id for s in scenarios if not balanced_by_position(orders_for(s, readout("D"), profile, seed))]


def contrast_direction(lm, scenarios, kind: str, profile, seed: int, token_budget=None) -> torch.Tensor:
    """[depths, hidden] fp32: the mean over `scenarios` x D's option orders of residual(plus) - residual(minus)."""
    from readouts.gap.prompts import prompt_of

    pairs = contrast_renders(scenarios, kind, profile, seed)
    if not pairs:
        raise ReadoutError(f"--direction: {kind}: no training scenario has both cells it contrasts")
    rendered = [r for pair in pairs for r in pair]
    seqs = [tuple(encode_prompt(lm.tokenizer, prompt_of(r))) for r in rendered]
    letters = [lm.letters(r.letters) for r in rendered]
    out = score_ids(lm.model, seqs, letters, residuals=True, pad_id=lm.pad_id, token_budget=token_budget)
    diffs = torch.stack([out[2 * i].residuals - out[2 * i + 1].residuals for i in range(len(pairs))])
    return diffs.mean(0)


def random_direction(norm: float, hidden: int, seed: int, k: int, depth: int) -> torch.Tensor:
    """The k-th seeded random direction at `depth`, of Euclidean norm `norm`."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "steer-random", k, depth) % (1 << 62))
    v = torch.randn(hidden, generator=gen, dtype=torch.float64)
    return (v / v.norm() * norm).float()


def load_vector_file(path: str, model) -> torch.Tensor:
    """[depths, hidden] fp32 from a .npy file (one vector for every depth, or one per depth); ReadoutError naming
    the file and what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise ReadoutError(f"{path}: --direction: no such vector file (or give one of {', '.join(STEER_DIRECTIONS)})")
    try:
        a = np.load(p, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ReadoutError(f"{path}: --direction: not a .npy array ({exc})") from None
    hidden, depths = model.config.hidden_size, n_depths(model)
    if a.ndim == 1 and a.shape[0] == hidden:
        a = np.broadcast_to(a, (depths, hidden))
    if a.shape != (depths, hidden) or not np.issubdtype(a.dtype, np.floating):
        raise ReadoutError(f"{path}: shape: {a.shape} {a.dtype}; want floats of shape ({hidden},) or ({depths}, {hidden})")
    if not np.isfinite(a).all():
        raise ReadoutError(f"{path}: values: not all finite")
    return torch.tensor(np.array(a), dtype=torch.float32)
