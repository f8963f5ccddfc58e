"""The gap analysis's names for contract cells, readouts and frames, by the role each plays here.

Each value is looked up in `contract` (a readout renamed there fails here at import, not in a table);
the gap modules build their sets of cells and readouts from these, never from string literals.
"""

from __future__ import annotations

from contract import CELLS, JUDGE_FRAMES, READOUTS, readout


def _cell(name: str) -> str:
    if name not in CELLS:
        raise KeyError(f"cell {name!r} is not declared in contract.names.CELLS")
    return name


PRIMARY = _cell("primary")
TWIN = _cell("twin")
HARM_TWIN = _cell("harm_twin")
PAIRED = (PRIMARY, TWIN)
"""The cells a paired excess compares."""

D = readout("D").name
J = readout("J").name
J0 = readout("J0").name
RAW_D = readout("raw_D").name
RAW_J = readout("raw_J").name
CONTROL = readout("control").name
CHAT = (D, J)
"""Acting and judging under the chat template."""
RAW = (RAW_D, RAW_J)
"""Acting and judging in the raw completion frame."""
KNOWN_GAP = (CONTROL, J0)
"""The known-gap control and the letter-only judgment it is read against."""

JUDGE_1 = JUDGE_FRAMES[0]
"""The original judge frame (the screen's reference); the others are its paraphrases."""
CHAT_FRAMES = tuple(readout(r).default_frame for r in CHAT)
"""The frames D and J are read in by default (J: its aggregate over the four paraphrases)."""

DOSE_RIDER = readout("dose_rider").name
DOSE_RIDER_CUT = readout("dose_rider_cut").name
RIDER = (DOSE_RIDER, DOSE_RIDER_CUT)
"""The rider (P1-A6): the reasoning rollouts continued to a long budget, read at the end and at the dose budget."""
DOSE = tuple(s.name for s in READOUTS if s.group == "dose" and s.name not in RIDER)
"""The dose arms of Table 8, in table order (the rider rides along in the same group, read apart)."""
DOSE_REASONING = readout("dose_reasoning").name
DOSE_FILLER = readout("dose_filler").name
DOSE_TRUNCATED = readout("dose_truncated_filler").name
DOSE_BRIEF = readout("dose_brief").name
DOSE_NORM = readout("dose_norm").name

READOUT_NAMES = tuple(s.name for s in READOUTS)
DEFAULT_FRAME = {s.name: s.default_frame for s in READOUTS}
"""The frame a readout is read in when a caller does not name one."""
