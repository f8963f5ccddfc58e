"""Each readout declared once, as a frozen spec.

The frame registry (panels), the recipes and the progress totals (readouts), the profile groups
(`--readouts`) and the stats' readout list and default frames all derive from `READOUTS`. Adding a readout
is a spec here, its frame text (panels/frames/), and its analysis (stats/).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.names import DOSE_ARMS, JUDGE_AGGREGATE, JUDGE_FRAMES

FIRST_TOKEN = "first_token"
"""Read at the first generated token: exact over option orders, no text generated."""
ANCHOR = "anchor"
"""Read at the letter after an anchor ("Answer:") that follows generated text."""
ANCHOR_RULES = ("own", "own_bold", "own_final", "own_dash", "own_case", "forced_after_completion", "forced_at_budget")
"""The base rules of the probes' `anchor_rule` (engine.generation.ANCHOR_RULES, which must equal it): the
model's own anchor (`own`) or a variant of it, or an anchor forced after a finished reply or at the budget.
A value may carry `+wrapped` (the letter wrapped in `**`/`()`/`[]`) and `+tool:<letter>` (an F3 tool's name
where the letter would be)."""
FORCED_RULES = ("forced_after_completion", "forced_at_budget")


@dataclass(frozen=True)
class ReadoutSpec:
    """What one readout reads, and how (the `readout` value of the run tables)."""

    name: str
    """The readout's name in the tables, e.g. `D`."""
    group: str
    """The `--readouts` group that switches it on (raw_D and raw_J share `raw`)."""
    frames: tuple[str, ...]
    """The frames it is read in; one table row per frame (J: the four paraphrases)."""
    read: str
    """FIRST_TOKEN or ANCHOR."""
    orders: str | None = None
    """First-token readouts: the key of the profile's `orders` giving the number of option orders."""
    greedy: bool = False
    """First-token readouts: read at temperature 0 (argmax) rather than the profile's temperature."""
    samples: str | None = None
    """Anchor readouts: the profile field with the sampled rollouts besides the greedy one."""
    budget: str | None = None
    """Anchor readouts: the profile field with the new-token budget before the answer is forced."""
    aggregate_frame: str | None = None
    """A frame name for an extra row aggregating the per-frame rows (J: `judge`)."""
    derived_from: str | None = None
    """A readout whose generated text this one re-reads instead of generating its own."""

    @property
    def default_frame(self) -> str:
        """The frame an analysis reads when it names none."""
        return self.aggregate_frame or self.frames[0]

    @property
    def generates(self) -> bool:
        """Whether this readout generates text of its own."""
        return self.read == ANCHOR and self.derived_from is None


def _dose(arm: str, budget: str = "dose_budget") -> ReadoutSpec:
    return ReadoutSpec(f"dose_{arm}", "dose", (f"dose_{arm}",), ANCHOR, samples="dose_samples", budget=budget)


READOUTS: tuple[ReadoutSpec, ...] = (
    ReadoutSpec("D", "D", ("agent",), FIRST_TOKEN, orders="D"),
    ReadoutSpec("J", "J", JUDGE_FRAMES, ANCHOR, samples="j_samples", budget="j_budget", aggregate_frame=JUDGE_AGGREGATE),
    ReadoutSpec("J0", "J0", ("judge_letter",), FIRST_TOKEN, orders="J0"),
    ReadoutSpec("raw_D", "raw", ("raw_agent",), FIRST_TOKEN, orders="raw", greedy=True),
    ReadoutSpec("raw_J", "raw", ("raw_judge",), FIRST_TOKEN, orders="raw", greedy=True),
    ReadoutSpec("control", "control", ("control",), FIRST_TOKEN, orders="control"),
    _dose("reasoning"),
    _dose("filler"),
    # The filler arm's text cut mid-way with the answer forced there: the forced form of truncated reasoning.
    ReadoutSpec("dose_truncated_filler", "dose", ("dose_filler",), ANCHOR, budget="dose_budget",
                derived_from="dose_filler"),
    _dose("brief", budget="dose_brief_budget"),
    _dose("norm"),
)
"""Every judgment-action readout, in the order of the run tables' rows."""

assert {s.frames[0] for s in READOUTS if s.group == "dose" and s.generates} == {f"dose_{a}" for a in DOSE_ARMS}


def readout(name: str) -> ReadoutSpec:
    """The spec of readout `name` (KeyError if there is none)."""
    for spec in READOUTS:
        if spec.name == name:
            return spec
    raise KeyError(name)


def readout_names() -> tuple[str, ...]:
    return tuple(s.name for s in READOUTS)


def readout_groups() -> tuple[str, ...]:
    """The `--readouts` groups in table order."""
    return tuple(dict.fromkeys(s.group for s in READOUTS))
