"""The harness calibration table (the paper's Table 11 asks how the answer was read): for each anchor
readout, frame and cell, the share of reads taken at each anchor rule and the share forced.

Owns: reading the `anchor_rule` column of a run's probes.parquet (optional: a run directory without it,
or a synthetic one, has no such table) and the warning when forced reads dominate a frame. A forced read
is the letter after an anchor the harness appended, not one the model wrote: when most reads of a frame
are forced, its judgment is mostly the harness's prompt, not the model's own answer.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from contract.readouts import ANCHOR_RULES, FORCED_RULES
from contract.tables import PROBES

#: A frame whose forced share exceeds this gets a warning.
FORCED_WARNING = 0.5
COLUMNS = ("readout", "frame", "cell", "reads", *[f"share_{r}" for r in ANCHOR_RULES], "share_wrapped",
           "share_tool_name", "share_forced")


def harness_table(run_dir: str | Path) -> pd.DataFrame | None:
    """One row per (readout, frame, cell) of the anchor reads; None when the run has no probes table."""
    path = Path(run_dir) / PROBES.file
    if not path.is_file():
        return None
    df = pd.read_parquet(path, columns=["readout", "frame", "cell", "anchor_rule"])
    df = df[df["anchor_rule"].notna()]
    if df.empty:
        return None
    rule = df["anchor_rule"].astype(str)
    df = df.assign(base=rule.str.split("+", n=1).str[0], wrapped=rule.str.contains("+wrapped", regex=False),
                   tool=rule.str.contains("+tool:", regex=False))
    rows = []
    for (readout, frame, cell), g in df.groupby(["readout", "frame", "cell"], sort=True):
        n = len(g)
        row = {"readout": readout, "frame": frame, "cell": cell, "reads": n}
        row.update({f"share_{r}": float((g["base"] == r).mean()) for r in ANCHOR_RULES})
        row.update(share_wrapped=float(g["wrapped"].mean()), share_tool_name=float(g["tool"].mean()),
                   share_forced=float(g["base"].isin(FORCED_RULES).mean()))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def forced_warnings(table: pd.DataFrame | None, limit: float = FORCED_WARNING) -> list[str]:
    """One line per frame and cell whose reads are mostly forced."""
    if table is None:
        return []
    bad = table[table["share_forced"] > limit]
    return [f"warning: {r.share_forced:.0%} of the {r.reads} {r.readout} reads in frame {r.frame} ({r.cell}) are forced "
            "(the model wrote no answer anchor the harness recognizes); their letter is read after an appended anchor"
            for r in bad.itertuples()]
