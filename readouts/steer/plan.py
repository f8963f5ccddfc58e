"""A steering grid's workload, stage by stage, for `readout steer --plan`, as the run computes it: the direction's
contrast reads over the training split (unless a vector file is given), the held-out first-token reads unsteered
(the gap study's own plan, readouts/gap/plan.py), the same reads under every other condition of the grid, and the
capability text under every condition.

A read-position steering shares the unsteered reads' prefix tree and runs each steered read's last token only
(engine/steering.py); an all-position steering runs every read's prompt again, in a tree of its own.
"""

from __future__ import annotations

from contract.names import STEER_DIRECTIONS
from engine.render import Prompt, encode_prompt, encode_prompts
from readouts.gap.prompts import prompt_of
from readouts.plan import StageWork, shared_tokens


def n_conditions(settings) -> int:
    """The grid's conditions, the unsteered one included: layers x strengths x (the direction + its random nulls)."""
    return 1 + len(settings.layers) * len(settings.strengths) * (1 + settings.random)


def steer_workload(tok, study, base: list[StageWork], profile, seed: int) -> list[StageWork]:
    """The grid's stages around `base`, the unsteered held-out reads' own stages."""
    from readouts.steer.directions import CAPABILITY_TEXT, contrast_renders

    st, stages = study.settings, []
    if st.direction in STEER_DIRECTIONS:
        pairs = contrast_renders(study.train, st.direction, profile, seed)
        seqs = [tuple(ids) for ids in encode_prompts(tok, [prompt_of(r) for pair in pairs for r in pair])]
        stages.append(StageWork("directions", prompts=len(seqs), prompt_tokens=sum(map(len, seqs)),
                                computed_tokens=shared_tokens(seqs), reads=len(seqs)))
    steered = n_conditions(st) - 1
    grid = StageWork("grid")
    for b in base:
        grid.prompts += b.prompts * steered
        grid.reads += b.reads * steered
        grid.prompt_tokens += b.prompt_tokens * steered
        grid.computed_tokens += (b.reads if st.positions == "read" else b.computed_tokens) * steered
    text = len(encode_prompt(tok, Prompt(text=CAPABILITY_TEXT.read_text(encoding="utf-8"))))
    capability = StageWork("capability", prompts=steered + 1, prompt_tokens=text * (steered + 1),
                           computed_tokens=text * (steered + 1))
    return [*stages, *base, grid, capability]
