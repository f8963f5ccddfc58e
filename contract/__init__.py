"""The table contract: the names every layer agrees on, importable without torch.

Cells, frames, polarity framings, the readout specs, and every column of every run table with its dtype
are declared here once. Writers (readouts/) and readers (stats/) both import them; panels/ renders the
frames named here. This package imports nothing of ours and nothing heavier than pandas.
"""

from contract.names import (
    CELLS,
    DOSE_ARMS,
    DOSE_FRAMES,
    FRAMES,
    FRAMINGS,
    JUDGE_AGGREGATE,
    JUDGE_FRAMES,
    NEGATED,
    NSI_NULLS,
    PARAPHRASE_CELLS,
    POLARITY_PAIR,
)
from contract.readouts import READOUTS, ReadoutSpec, readout, readout_groups, readout_names
from contract.tables import TABLES, Column, Table, table

__all__ = [
    "CELLS", "DOSE_ARMS", "PARAPHRASE_CELLS", "DOSE_FRAMES", "FRAMES", "FRAMINGS", "JUDGE_AGGREGATE", "JUDGE_FRAMES", "NEGATED", "NSI_NULLS",
    "POLARITY_PAIR", "READOUTS", "ReadoutSpec", "readout", "readout_groups", "readout_names", "TABLES", "Column",
    "Table", "table",
]
