"""From probe rows to scenario rows (docs/tables.md): per scenario x cell x readout x frame, the
violating mass, the tempered violating fraction, the exact majority probability, and for J the judged
option, its stability and the aggregate over the four paraphrases.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from contract.metadata import METADATA, encode_metadata
from contract.readouts import FIRST_TOKEN, READOUTS, ReadoutSpec
from readouts.gap.profile import cells_read


def scenario_rows(scenarios, keys, rows, profile, sample: bool, model: str, panel: str) -> list[dict]:
    """Scenario rows of `scenarios`; keys[i] = (scenario id, cell, readout, frame) of probe row rows[i]."""
    by_key: dict = {}
    for key, row in zip(keys, rows):
        by_key.setdefault(key, []).append(row)
    out = []
    for s in scenarios:
        base = dict(model=model, panel=panel, scenario_id=s.id, family=s.family, domain=s.domain,
                    generator=s.generator, prompt_version=s.prompt_version, violating=s.violating,
                    **{METADATA: encode_metadata(s.metadata)})
        for cell in cells_read(s, profile):
            for spec in READOUTS:
                frames = sorted({f for (sid, c, ro, f) in by_key if sid == s.id and c == cell and ro == spec.name},
                                key=lambda f: (len(f), f))
                frame_rows = []
                for frame in frames:
                    items = by_key[(s.id, cell, spec.name, frame)]
                    row = (_first_token_row(spec, items, sample) if spec.read == FIRST_TOKEN
                           else _generated_row(spec, items, profile))
                    frame_rows.append({**base, "cell": cell, "readout": spec.name, "frame": frame, **row})
                out.extend(frame_rows)
                if spec.aggregate_frame and frame_rows:
                    out.append(_aggregate_row(spec, s, frame_rows, base, cell))
    return out


def _first_token_row(spec: ReadoutSpec, items, sample: bool) -> dict:
    p = np.array([row["p_violating"] for row in items], dtype=float)
    if sample:
        picks = [row["sampled_letter"] for row in items]
        drawn = [x for x in picks if x is not None]
        hits = sum(x == row["violating_letter"] for x, row in zip(picks, items) if x is not None)
        frac = hits / len(drawn) if drawn else math.nan
        majority = float(hits > len(items) / 2)
    else:
        if spec.greedy:
            q = np.array([float(row["top_letter"] == row["violating_letter"]) for row in items])
        else:
            q = []
            for row in items:
                tot = sum(row["tempered"])
                v = row["letters"].index(row["violating_letter"])
                q.append(row["tempered"][v] / tot if tot > 0 else math.nan)
            q = np.array(q)
        q = q[~np.isnan(q)]
        frac = float(q.mean()) if len(q) else math.nan
        majority = float(_poisson_binom(q).sf(len(q) // 2)) if len(q) else math.nan
    return dict(budget=None, p_violating=float(np.nanmean(p)) if len(p) else math.nan, violating_fraction=frac,
                majority_violating_prob=majority, letter_mass=float(np.mean([row["letter_mass"] for row in items])),
                judged_option=None, stability=None, violating_judged_frames=None,
                n_orders=len(items), n_rollouts=len(items), completed_fraction=math.nan)


def answered_letter(row) -> str:
    """The letter a generated read answered: the letter a tool's name maps to where the model named the
    tool (anchor rule `...+tool:<letter>`), else the top letter at the anchor."""
    rule = row.get("anchor_rule") or ""
    return rule.split("+tool:", 1)[1] if "+tool:" in rule else row["top_letter"]


def _generated_row(spec: ReadoutSpec, rows, profile) -> dict:
    viol = [answered_letter(row) == row["violating_letter"] for row in rows]
    completed = [(row["anchor_rule"] or "").startswith("own") or row["anchor_rule"] == "forced_after_completion"
                 for row in rows]
    row = dict(budget=getattr(profile, spec.budget), p_violating=float(np.nanmean([r["p_violating"] for r in rows])),
               violating_fraction=float(np.mean(viol)), majority_violating_prob=float(sum(viol) > len(viol) / 2),
               letter_mass=float(np.mean([r["letter_mass"] for r in rows])), judged_option=None, stability=None,
               violating_judged_frames=None, n_orders=len({r["order_index"] for r in rows}), n_rollouts=len(rows),
               completed_fraction=float(np.mean(completed)))
    if spec.aggregate_frame:  # a judgment: the option each frame names, and whether its samples agree
        first = rows[0]
        option_at = dict(zip(first["letters"], first["order"].split(",")))
        greedy = next(r for r in rows if r["rollout"] == 0)
        row["judged_option"] = option_at[answered_letter(greedy)]
        sampled = [option_at[answered_letter(r)] for r in rows if r["rollout"] > 0]
        if sampled:
            top = Counter(sampled).most_common()
            majority = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else None
            row["stability"] = majority == row["judged_option"]
    return row


def _aggregate_row(spec: ReadoutSpec, s, frame_rows, base, cell) -> dict:
    judged = [r["judged_option"] for r in frame_rows]
    top = Counter(judged).most_common()
    named = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else None
    stab = [r["stability"] for r in frame_rows]
    n_roll = sum(r["n_rollouts"] for r in frame_rows)
    viol = sum(r["violating_fraction"] * r["n_rollouts"] for r in frame_rows)
    return dict(base, cell=cell, readout=spec.name, frame=spec.aggregate_frame, budget=frame_rows[0]["budget"],
                p_violating=float(np.mean([r["p_violating"] for r in frame_rows])),
                violating_fraction=viol / n_roll, majority_violating_prob=float(viol > n_roll / 2),
                letter_mass=float(np.mean([r["letter_mass"] for r in frame_rows])), judged_option=named,
                stability=None if any(x is None for x in stab) else all(stab),
                violating_judged_frames=sum(j == s.violating for j in judged),
                n_orders=len(frame_rows), n_rollouts=n_roll,
                completed_fraction=float(np.mean([r["completed_fraction"] for r in frame_rows])))


def _poisson_binom(q):
    """scipy's Poisson-binomial, imported when first needed (scipy.stats costs about a second to import, and
    `readout run --plan` imports this module without aggregating anything)."""
    from scipy.stats import poisson_binom

    return poisson_binom(q)
