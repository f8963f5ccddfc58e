"""A steering grid's workload, stage by stage, for `readout steer --plan`, as the run computes it: the direction's
contrast reads over the training split (unless a vector file is given), the held-out first-token reads unsteered
(the gap study's own plan, readouts/gap/plan.py), the same reads under every other condition of the grid, and the
capability text under every condition (with the vector at each predicting position alone, or at every position).

A read-position steering runs each steered read's last token only, through the layers above its depth (the steered
tail, engine/steered_tail.py; each distinct prompt's prefix runs once more beside it, per prompt, not per condition,
and is not counted here); an all-position steering runs every read's prompt again, in a tree of its own. The
capability text is counted once per condition (the tail's rows, or one all-position forward); where the tail does not
apply, a read-position condition reads the text twice over in one forward (readouts/steer/capability.py).
"""

from __future__ import annotations

from contract.names import STEER_DIRECTIONS, STEER_PARTS
from engine.render import encode_prompts
from readouts.gap.prompts import prompt_of
from readouts.plan import StageWork, shared_tokens


def n_conditions(settings, test: bool = True) -> int:
    """The grid's conditions a part's scenarios are read under, the unsteered one included: layers x strengths x
    (the direction + its label-shuffled null + on the test part its random nulls)."""
    shuffled = int(settings.shuffled and settings.direction in STEER_DIRECTIONS)
    return 1 + len(settings.layers) * len(settings.strengths) * (1 + shuffled + (settings.random if test else 0))


def steer_workload(tok, study, base: list[StageWork], parts: dict, profile, seed: int) -> list[StageWork]:
    """The grid's stages around `base`, the unsteered reads' own stages (`parts`: part -> those stages of the part's
    scenarios alone, whose reads the part's conditions repeat)."""
    from readouts.steer.capability import capability_ids
    from readouts.steer.directions import contrast_renders

    st = study.settings
    # A vector file's run reads the pressure contrast's prompts too: the residual norms it is measured against.
    kind = st.direction if st.direction in STEER_DIRECTIONS else STEER_DIRECTIONS[0]
    pairs = contrast_renders(study.train, kind, profile, seed)
    seqs = [tuple(ids) for ids in encode_prompts(tok, [prompt_of(r) for pair in pairs for r in pair])]
    stages = [StageWork("directions", prompts=len(seqs), prompt_tokens=sum(map(len, seqs)),
                        computed_tokens=shared_tokens(seqs), reads=len(seqs))]
    grid = StageWork("grid")
    for part, stages_of in parts.items():
        steered = n_conditions(st, part == STEER_PARTS[2]) - 1
        for b in stages_of:
            grid.prompts += b.prompts * steered
            grid.reads += b.reads * steered
            grid.prompt_tokens += b.prompt_tokens * steered
            grid.computed_tokens += (b.reads if st.positions == "read" else b.computed_tokens) * steered
    conds, text = n_conditions(st), len(capability_ids(tok))
    capability = StageWork("capability", prompts=conds, prompt_tokens=text * conds, computed_tokens=text * conds)
    return [*stages, *base, grid, capability]
