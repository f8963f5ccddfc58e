"""Cells, frames and polarity framings: the vocabulary of the run tables.

A cell is a variant of a scenario (the primary, its pressure-removed twin, its harm-matched twin); a
frame is the wording a scenario is posed in; a framing is one of the negation audit's four polarities.
"""

from __future__ import annotations

import re

CELLS = ("primary", "twin", "harm_twin", "paraphrase", "paraphrase_twin")
"""primary: as written; twin: the pressure sentence replaced by the filler; harm_twin (F5): replaced by a
sentence that removes the incentive and restates the harm; paraphrase / paraphrase_twin (F4): the second
writer's rewording of the scenario, with its pressure and with its filler. Paraphrase cells are read for
the paraphrase-swap table only: they never count as primaries or enter the gate."""
PARAPHRASE_CELLS = {"paraphrase": "primary", "paraphrase_twin": "twin"}
"""Cells rendered from a scenario's paraphrase -> the cell of the paraphrase they mirror."""

JUDGE_FRAMES = ("judge_1", "judge_2", "judge_3", "judge_4")
"""The four third-person paraphrases of the judgment readout J."""
JUDGE_AGGREGATE = "judge"
"""The frame name of J's aggregate row over the four paraphrases."""

DOSE_ARMS = ("reasoning", "filler", "brief", "norm")
"""The dose arms that generate text before the forced answer (the truncated filler is cut from `filler`)."""
DOSE_FRAMES = tuple(f"dose_{arm}" for arm in DOSE_ARMS)

FRAMES = ("agent", *JUDGE_FRAMES, "judge_letter", "raw_agent", "raw_judge", "control", *DOSE_FRAMES)
"""Every frame a judgment-action scenario is rendered in (panels/frames.py renders each)."""

FRAMINGS = ("F0", "F1", "F2", "F3")
"""The negation audit's framings: F0 "should X", F1 "should not X", F2/F3 the compound goal framings."""
NEGATED = {"F0": False, "F1": True, "F2": False, "F3": True}
"""Whether a framing negates the action: endorsement a = decision XOR negated."""
POLARITY_PAIR = ("F0", "F1")
"""The simple polarity pair of the headline NSI."""
NSI_NULLS = {
    "dilemma-rates": "NSI of the model-pooled rates against a null in which each dilemma keeps its own rate "
                     "(pooled over the framings compared) and each cell's observed number of replies",
    "common-rate": "NSI of the model-pooled rates against a null in which every reply of the model shares one "
                   "rate (Binomial(N_f, p) on the pooled counts)",
    "per-dilemma": "mean of the per-dilemma NSI against per-dilemma nulls",
}
"""The nulls of the NSI ("no framing effect"), the default first (`readout nsi-stats --null`; stats.nsi.measures)."""

STAGES = ("base", "sft", "dpo", "final")
"""The classic post-training stages, in order. A lineage may also hold any number of checkpoints named by a
step (`rl-200`, `step-1000`, `step_1000`, `checkpoint-500`: see `stage_step`), which sort by step between dpo
and final, or checkpoints ordered by a given list (`readout compare --order`, the list of a `readout sweep`)."""
STAGE_STEP = re.compile(r"[A-Za-z][A-Za-z0-9_.]*?[-_]?(\d+)")
"""A stage name that carries a step; the step is its one group."""
STAGE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"
"""What a stage name may look like (a registry entry's `stage`, the stage of a `lineage:stage` role)."""


def stage_step(stage: str) -> int | None:
    """The training step a stage name carries: the integer it ends with after a letter and an optional `-` or
    `_` (`rl-200`, `step-1000`, `step_1000`, `ckpt3` -> 200, 1000, 1000, 3); None when it carries none."""
    m = STAGE_STEP.fullmatch(stage)
    return int(m.group(1)) if m else None


ADAPTER_RECIPE = "organism.json"
"""The file beside a PEFT adapter that records how it was made (a model organism's recipe, training log and
measured values; organisms/); a run that merges such an adapter records its organism name and recipe."""


DEPTH_GROUP = "depth"
"""The `--readouts` token that turns on the depth tables (depth.parquet, patching.parquet, patch_grid.parquet) on the
first-token reads."""
DEPTH_CELLS = ("primary", "twin", "harm_twin")
"""The cells the depth readout reads (every first-token readout of these cells)."""
LENSES = ("logit", "tuned")
"""How a residual stream becomes letter mass at each depth: `logit`, the logit lens (the model's final norm, then
its head in fp32); `tuned`, the tuned lens (a trained affine translator per depth before the same norm and head,
engine/tuned_lens.py), read only when a run is given a lens file (`--lens`)."""
PATCH_SOURCES = ("judge", "twin_agent", "foreign_judge", "foreign_agent")
"""Whose residual replaces the agent prompt's at its read position: the same scenario's letter-only judge prompt
(same cell and option order: the patch), the twin cell's agent prompt (same order), and another scenario's
letter-only judge prompt and agent prompt (same cell), with as many options, in the same order (what a foreign
residual does: the judge frame without this scenario, and neither the judge frame nor this scenario)."""
PATCH_GROUPS = ("span", "options", "context", "read")
"""The groups of positions the patching grid patches between a pressure prompt and its twin (readouts/gap/
span_patch.py): the differing sentence's paired tokens, the options' texts, the other shared tokens after the
sentence, the read position."""
PATCH_DIRECTIONS = ("noising", "denoising")
"""noising: a pair's first prompt (the pressure prompt) read with a group's streams from its second (the twin);
denoising: the second read with the first's."""
PATCH_PAIRS = ("pressure", "filler_swap")
"""The prompt pairs the patching grid patches between: `pressure`, a scenario's pressure prompt and its twin;
`filler_swap`, its scenario-specific control, the twin and the twin with another scenario's filler sentence in its
place (no pressure in either, so a move there is a reaction to any change of that sentence, not to the pressure)."""


STEER_DIRECTIONS = ("pressure", "judgment")
"""Directions `readout steer` computes from the panel's own contrasts on the training split, at the read position:
pressure = agent prompt (primary) minus agent prompt (twin), judgment = letter-only judge prompt minus agent prompt
(primary); same scenario and option order. A user's vector file is the third kind (FILE_DIRECTION)."""
FILE_DIRECTION = "file"
"""The `direction` column of rows steered along a user-given vector file."""
SHUFFLED_DIRECTION = "shuffled"
"""The `direction` column of the label-shuffled null: the computed direction's mean difference with the two prompts'
labels swapped in a seeded half of the direction part's scenarios, scaled to the direction's norm at each depth."""
RANDOM_DIRECTION = "random"
"""The `direction` column of the null rows: a seeded random direction of the steered direction's norm at that layer."""
UNSTEERED = "none"
"""The `direction` column of the unsteered reads (strength 0, layer null): the baseline every row is compared with."""
STEER_PARTS = ("direction", "selection", "test")
"""The parts of a steering run's selection: the direction is computed on the first, the layer and strength chosen on
the second by the rule the manifest records, the verdict read on the third only (readouts/steer/split.py)."""
STEER_READOUTS = ("D", "J0", "control")
"""The first-token readouts read under steering (each in every cell it reads: the twins ride along)."""
