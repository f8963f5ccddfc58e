"""A 16-model reply corpus whose counts match the negation paper's published tables, for reproduction tests.

Per model, the endorsing replies per framing over its 14 dilemmas (``POOLED``, of 30 parsed replies per cell,
Qwen3-8B 17: the paper's "per-cell denominators vary because some samples failed JSON parsing") were set by
hand so that:

* each model's NSI on its pooled rates is Table 4's observed NSI (to the 1/840 a count allows);
* pooled within each category (Table 1), the rates are Table 2's, the negated-minus-affirmative contrasts
  are sec. 4.1's +61.5 / +16.7 / -5.8 pp and p0 + p1 - 1 is sec. 4.2's -0.54 / -0.08 / +0.16;
* |p0 + p1 - 1| is sec. 4.2's 0.68 / 0.50 / 0.50 for LLaMA / Phi / Granite and 0.01 / 0.01 / 0.06 for GLM /
  Grok-4.1-reasoning / GPT-5.1;
* the financial-1 row, pooled within category, is Table 5 (``TABLE5``, split evenly over the category's
  models); the rest of each model's count is spread evenly over its other 13 dilemmas.

Nothing here computes a statistic: the tests run `readout nsi-stats` on these tables and compare its output
with the paper.
"""

from __future__ import annotations

import numpy as np

from stats.nsi import DILEMMAS, write_count_run

N_CELL = 30
GROUPS = {
    "Phi-4-mini-3.8B": "OSS", "LLaMA-3.2-1B": "OSS", "Gemma-3-4B": "OSS", "Granite-3.3-2B": "OSS",
    "Claude-Haiku-4.5": "US", "Grok-4.1-non-reasoning": "US", "Claude-Sonnet-4.5": "US", "GPT-5.2": "US",
    "GPT-5-mini": "US", "Grok-4.1-reasoning": "US", "Gemini-3-Flash": "US", "GPT-5.1": "US",
    "GLM-4.6": "CN", "Kimi-K2": "CN", "DeepSeek-V3.2": "CN", "Qwen3-8B": "CN",
}
VALID = {m: (17 if m == "Qwen3-8B" else N_CELL) for m in GROUPS}
"""Parsed replies per cell (of 30 sampled)."""
POOLED = {  # endorsing replies per framing F0..F3, over 14 dilemmas x VALID[m]
    "Phi-4-mini-3.8B": (60, 270, 100, 420), "LLaMA-3.2-1B": (95, 381, 60, 420),
    "Gemma-3-4B": (95, 294, 150, 418), "Granite-3.3-2B": (145, 355, 203, 415),
    "Claude-Haiku-4.5": (40, 120, 79, 338), "Grok-4.1-non-reasoning": (60, 150, 100, 256),
    "Claude-Sonnet-4.5": (100, 200, 150, 277), "GPT-5.2": (120, 100, 150, 255), "GPT-5-mini": (150, 180, 120, 260),
    "Grok-4.1-reasoning": (130, 126, 150, 211), "Gemini-3-Flash": (120, 145, 150, 196), "GPT-5.1": (133, 108, 183, 136),
    "GLM-4.6": (100, 96, 150, 246), "Kimi-K2": (148, 60, 150, 196), "DeepSeek-V3.2": (150, 80, 169, 130),
    "Qwen3-8B": (155, 74, 121, 87),
}
TABLE5 = {"CN": (27, 44, 21, 53), "US": (96, 235, 106, 0), "OSS": (62, 120, 120, 118)}
"""Financial-1 endorsing replies pooled per category (of 107 CN, 240 US, 120 OSS): Table 5's percentages."""


def _even(total: int, caps: list[int]) -> list[int]:
    """``total`` split as evenly as possible over slots with the given caps (earlier slots first)."""
    out = [0] * len(caps)
    left = total
    while left > 0:
        open_ = [i for i in range(len(caps)) if out[i] < caps[i]]
        if not open_:
            raise ValueError(f"cannot place {total} within caps {caps}")
        for i in open_:
            if left == 0:
                break
            out[i] += 1
            left -= 1
    return out


def corpus_counts() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """model -> (n, k), each (14 dilemmas, 4 framings), as described in the module docstring."""
    fin = [i for i, (d, _) in enumerate(DILEMMAS) if d == "financial-1"][0]
    others = [i for i in range(len(DILEMMAS)) if i != fin]
    out = {}
    by_group = {g: [m for m in GROUPS if GROUPS[m] == g] for g in TABLE5}
    fin_k = {}
    for g, models in by_group.items():
        for f in range(4):
            split = _even(TABLE5[g][f], [min(VALID[m], POOLED[m][f]) for m in models])
            for m, c in zip(models, split):
                fin_k[(m, f)] = c
    for m in GROUPS:
        n = np.full((len(DILEMMAS), 4), VALID[m])
        k = np.zeros_like(n)
        for f in range(4):
            k[fin, f] = fin_k[(m, f)]
            k[others, f] = _even(POOLED[m][f] - fin_k[(m, f)], [VALID[m]] * len(others))
        out[m] = (n, k)
    return out


def write_corpus(folder) -> list:
    """One run directory per model under ``folder``; returns them."""
    return [write_count_run(folder / m, m, n, k, seed=i, n_samples=N_CELL)
            for i, (m, (n, k)) in enumerate(corpus_counts().items())]
