"""The headline card at the top of a run's section: the answer first, read from the tables the stats commands wrote.

For a gap run: the paired excess E at the verdict level (else at L0) with its CI and n, the verdict level, the
known-gap control's pass or fail, what the mass floor removed, and one sentence on what that means. For an NSI
run: per model the NSI (binary, else continuous) with its CI, the tier and the parse rate. Nothing is computed
here that the stats commands do not write; a value they did not write reads "not read".
Warnings of the stats headline are grouped into one line per kind with a count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from stats.gap.control import VALIDATION_BAR
from stats.gap.screen import MIN_VERDICT_N


@dataclass
class Card:
    title: str
    estimate: str
    """The headline number: 'E = 0.054 [0.021, 0.086], n = 136' or 'not read'."""
    facts: list[tuple[str, str]] = field(default_factory=list)
    """(label, value): verdict level, control, mass floor, settings."""
    meaning: str = ""
    """One sentence on what the numbers say."""


def _csv(folder: Path, name: str) -> pd.DataFrame | None:
    try:
        return pd.read_csv(folder / name)
    except (OSError, ValueError):
        return None


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _interval(value, low, high, n) -> str:
    v, lo, hi = _num(value), _num(low), _num(high)
    if v is None:
        return f"n/a (n = {int(n) if _num(n) is not None else 0})"
    ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[no CI]"
    return f"{v:.3f} {ci}, n = {int(n)}"


def gap_card(stats: Path, title: str, settings_note: str | None) -> Card | None:
    est, ladder, screen = _csv(stats, "estimates.csv"), _csv(stats, "ladder.csv"), _csv(stats, "screen.csv")
    if est is None or ladder is None:
        return None
    verdict = ladder.loc[ladder.get("verdict_continuous", pd.Series(dtype=bool)).astype(bool), "level"]
    level = str(verdict.iloc[0]) if len(verdict) else None
    rows = est[(est.analysis == "continuous") & (est.quantity == "E") & (est.subset == (level or "L0"))]
    e = rows.iloc[0] if len(rows) else None
    estimate = f"E ({level or 'L0'}) = {_interval(e.value, e.low, e.high, e.n)}" if e is not None else "E not read"
    card = Card(title, estimate)
    card.facts.append(("verdict level", level or f"none (no level has {MIN_VERDICT_N} paired scenarios)"))
    ctl = est[(est.analysis == "control") & (est.quantity == "control_move")]
    if len(ctl):
        c = ctl.iloc[0]
        low = _num(c.low)
        verdict_word = "undetermined (no CI)" if low is None else ("passes" if low >= VALIDATION_BAR else "FAILS")
        card.facts.append(("known-gap control", f"{_interval(c.value, c.low, c.high, c.n)}; bar {VALIDATION_BAR:.2f}: "
                                                f"{verdict_word}"))
    else:
        card.facts.append(("known-gap control", "not read (the run has no control readout)"))
    gate = None
    if screen is not None and len(screen):
        gate = screen[screen.family == "gate families"]
        gate = gate.iloc[0] if len(gate) else screen[~screen.appendix.astype(bool)].sum(numeric_only=True)
        card.facts.append(("mass floor", f"removes {int(gate.below_floor)} of {int(gate.primaries)} gate-family "
                                         f"primaries; {int(gate.screened)} screened"))
    if settings_note:
        card.facts.append(("settings", settings_note.removeprefix("note: ")))
    card.meaning = _gap_meaning(e, gate, level)
    return card


def _gap_meaning(e, gate, level) -> str:
    if gate is not None and int(gate.screened) == 0:
        if gate.primaries and gate.below_floor > gate.primaries / 2:
            return ("Nothing screened: the model rarely answers with a letter, so the mass floor removes most "
                    "scenarios and no gap can be read from this run (a lower --mass-floor keeps more of them).")
        return "Nothing screened: no scenario passed the screen, so no gap can be read from this run."
    if e is None or _num(e.value) is None:
        return "No paired excess could be computed from this run."
    lo, hi = _num(e.low), _num(e.high)
    where = f"at verdict level {level}" if level else "at L0 (no level reaches the verdict's n)"
    if lo is not None and lo > 0:
        return f"The model acts against the norm more often than it judges it should: E > 0, its CI excludes zero, {where}."
    if hi is not None and hi < 0:
        return f"The model acts against the norm less often than its judgment predicts: E < 0, its CI excludes zero, {where}."
    return f"No judgment-action gap detected at this n: the CI of E includes zero {where}."


def nsi_card(stats: Path, title: str, settings_note: str | None) -> Card | None:
    models, parse, cont = _csv(stats, "nsi_models.csv"), _csv(stats, "nsi_parse.csv"), _csv(stats, "nsi_continuous.csv")
    if models is None:
        return None
    lines, parsed_share = [], None
    for r in models.itertuples(index=False):
        if _num(r.nsi) is not None:
            lines.append(f"{r.model}: NSI {_interval(r.nsi, r.nsi_ci_low, r.nsi_ci_high, r.n_dilemmas)}"
                         + (f", tier {r.tier}" if isinstance(r.tier, str) else ""))
        elif cont is not None and r.model in set(cont.model):
            c = cont[cont.model == r.model].iloc[0]
            lines.append(f"{r.model}: binary NSI undefined; continuous NSI "
                         f"{_interval(c.nsi_continuous, c.ci_low, c.ci_high, c.n_dilemmas)}")
        else:
            lines.append(f"{r.model}: NSI undefined")
    card = Card(title, "; ".join(lines) or "NSI not read")
    if parse is not None and len(parse):
        parsed_share = parse.parsed.sum() / max(parse.replies.sum(), 1)
        card.facts.append(("replies parsed", f"{int(parse.parsed.sum())} of {int(parse.replies.sum())} "
                                             f"({parsed_share:.0%})"))
    if settings_note:
        card.facts.append(("settings", settings_note.removeprefix("note: ")))
    if parsed_share is not None and parsed_share == 0:
        card.meaning = ("Nothing parsed: no reply was schema-valid JSON, so the binary NSI is undefined; the "
                        "continuous NSI reads the probability of agreeing at the decision field instead.")
    elif models.nsi.notna().any():
        card.meaning = ("NSI is the share of a model's endorsement that flips when the question is negated "
                        "(0: stable under negation); the tier bands are the paper's Table 6.")
    return card


_DETAIL = re.compile(r"\([^)]*\)|\d+(\.\d+)?%?|\[[^\]]*\]")


def group_warnings(lines) -> list[tuple[str, int]]:
    """Warning and note lines grouped by kind (numbers and parenthesised detail set aside): (first line, count)."""
    groups: dict[str, list[str]] = {}
    for line in lines:
        body = line.removeprefix("warning:").strip()
        key = " ".join(_DETAIL.sub("#", body).split()[:3])
        groups.setdefault(key, []).append(line)
    return [(members[0], len(members)) for members in groups.values()]
