"""Steering directions, one vector per depth (0..L, engine/residuals.py), each a mean over the training split of a
difference of read-position residuals of two prompts of the same scenario in the same option order (D's orders):

- pressure: agent prompt, primary cell, minus agent prompt, twin cell (what the incentive sentence adds);
- judgment: letter-only judge prompt (J0's frame) minus agent prompt, both primary (what asking "which is right"
  instead of "what do you do" adds).

A random null direction at a depth is a seeded Gaussian vector scaled to the steered direction's norm there; the
label-shuffled null is the same mean difference with the two prompts swapped in a seeded half of the scenarios, scaled
to the direction's norm too. A vector file (.npy) holds one vector [hidden] used at every depth, or one per depth
[L + 1, hidden].
"""

from __future__ import annotations

import random
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
    return contrast_parts(lm, scenarios, kind, profile, seed, token_budget)[0].mean(0)


def contrast_parts(lm, scenarios, kind: str, profile, seed: int, token_budget=None) -> tuple[torch.Tensor, list, torch.Tensor]:
    """(diffs [pairs, depths, hidden] fp32: residual(plus) - residual(minus) per scenario x D's option order, the
    scenario id of each pair, the mean residual norm per depth over every prompt read [depths])."""
    from readouts.gap.prompts import prompt_of

    pairs = contrast_renders(scenarios, kind, profile, seed)
    if not pairs:
        raise ReadoutError(f"--direction: {kind}: no training scenario has both cells it contrasts")
    rendered = [r for pair in pairs for r in pair]
    seqs = [tuple(encode_prompt(lm.tokenizer, prompt_of(r))) for r in rendered]
    letters = [lm.letters(r.letters) for r in rendered]
    out = score_ids(lm.model, seqs, letters, residuals=True, pad_id=lm.pad_id, token_budget=token_budget)
    diffs = torch.stack([out[2 * i].residuals - out[2 * i + 1].residuals for i in range(len(pairs))])
    norms = torch.stack([o.residuals.float().norm(dim=-1) for o in out]).mean(0)
    return diffs, [pair[0].scenario_id for pair in pairs], norms


def residual_norms(lm, scenarios, profile, seed: int, token_budget=None) -> torch.Tensor:
    """[depths]: the mean residual norm at the read position of the agent prompts (primary and twin) of `scenarios`
    in D's option orders (what a vector file's perturbation is measured against)."""
    return contrast_parts(lm, scenarios, "pressure", profile, seed, token_budget)[2]


def shuffled_direction(diffs: torch.Tensor, pair_ids: list, seed: int, norms: torch.Tensor) -> torch.Tensor:
    """The label-shuffled null [depths, hidden]: the mean of the contrasts with the two prompts' labels swapped in a
    seeded half of the scenarios (every order of a swapped scenario swapped: the labels are permuted per scenario),
    scaled at each depth to `norms` (the direction's), so that it is read at the same strengths as the direction."""
    ids = sorted(set(pair_ids))
    random.Random(f"steer-shuffle|{seed}").shuffle(ids)
    swapped = set(ids[: len(ids) // 2])
    sign = torch.tensor([-1.0 if i in swapped else 1.0 for i in pair_ids], dtype=diffs.dtype)
    mean = (diffs * sign[:, None, None]).mean(0)
    length = mean.norm(dim=-1, keepdim=True)
    return torch.where(length > 0, mean / length.clamp_min(1e-30) * norms[:, None], mean)


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
