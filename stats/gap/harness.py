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
from stats.gap.names import DOSE_TRUNCATED

#: The readout cut mid-way with its answer forced on purpose (contract.readouts): never warned about.
TRUNCATED = DOSE_TRUNCATED
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
    """One line per readout whose reads are mostly forced in some frame and cell (the truncated filler is
    forced by construction and left out), naming the worst groups."""
    if table is None:
        return []
    bad = table[(table["share_forced"] > limit) & (table["readout"] != TRUNCATED)]
    lines = []
    for readout, g in bad.groupby("readout", sort=True):
        g = g.sort_values("share_forced", ascending=False)
        worst = ", ".join(f"{r.frame}/{r.cell} {r.share_forced:.0%}" for r in g.head(3).itertuples())
        total = int((table["readout"] == readout).sum())
        lines.append(f"warning: forced reads dominate {readout} in {len(g)} of {total} frame x cell groups "
                     f"({worst}{', ...' if len(g) > 3 else ''}): the model rarely wrote an answer anchor the harness "
                     "recognizes, so these letters are read after an appended anchor (harness.csv)")
    return lines
