"""Each readout declared once, as a frozen spec.

The frame registry (panels), the recipes and the progress totals (readouts), the profile groups
(`--readouts`) and the stats' readout list and default frames all derive from `READOUTS`. Adding a readout
is a spec here, its frame text (panels/frames/), and its analysis (stats/).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.names import CELLS, DOSE_ARMS, JUDGE_AGGREGATE, JUDGE_FRAMES

FIRST_TOKEN = "first_token"
"""Read at the first generated token: exact over option orders, no text generated."""
ANCHOR = "anchor"
"""Read at the letter after an anchor ("Answer:") that follows generated text."""
ANCHOR_RULES = ("own", "own_bold", "own_final", "own_dash", "own_case", "forced_after_completion", "forced_at_budget")
"""The base rules of the probes' `anchor_rule` (engine.anchor.ANCHOR_RULES, which must equal it): the
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
    """A readout whose generated text this one re-reads instead of generating its own, cut at the profile's
    `budget` (or where `cut_like` says) with the answer read there."""
    rollouts: str | None = None
    """Anchor readouts: the profile field with the total rollouts (the greedy one first) in place of 1 +
    `samples`; 0 switches the readout off."""
    length_of: str | None = None
    """A readout of the same group whose rollout (same scenario, cell, option order and rollout index) sets
    this one's length: generated to exactly as many tokens (the same-length filler)."""
    cut_like: str | None = None
    """Derived readouts: cut the source text where this readout's read of the same scenario, cell and rollout
    kept its own (the truncated filler at the paired reasoning's cut), with the answer forced there."""
    seeded_as: str | None = None
    """A readout whose rollout seeds this one shares: with the same option order and frame its rollouts
    continue that readout's (the rider continues the reasoning arm's rollouts past its budget)."""
    cells: tuple[str, ...] | None = None
    """The cells it is read in (None: every cell the profile reads). The rider reads the primary cell only
    (P1-A6: "8 rollouts per scenario"); a readout derived from another reads the cells its source does."""

    def reads_cell(self, cell: str) -> bool:
        """Whether this readout is read in `cell` (when the profile reads that cell at all)."""
        return self.cells is None or cell in self.cells

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
    # The non-moral filler task, generated to the paired reasoning rollout's length (the paper's "same-length").
    ReadoutSpec("dose_filler", "dose", ("dose_filler",), ANCHOR, samples="dose_samples", budget="dose_budget",
                length_of="dose_reasoning"),
    # The filler's text cut where the paired reasoning rollout's read sits, with the answer forced there: the
    # restatement in the cut-off, forced form that truncated reasoning has.
    ReadoutSpec("dose_truncated_filler", "dose", ("dose_filler",), ANCHOR, budget="dose_budget",
                derived_from="dose_filler", cut_like="dose_reasoning"),
    _dose("brief", budget="dose_brief_budget"),
    _dose("norm"),
    # The rider (amendment P1-A6): the reasoning arm's rollouts continued to a long budget, read at the end
    # (dose_rider) and at the dose budget (dose_rider_cut); their per-rollout agreement is its readout.
    ReadoutSpec("dose_rider", "dose", ("dose_reasoning",), ANCHOR, budget="rider_budget", rollouts="rider_rollouts",
                seeded_as="dose_reasoning", cells=(CELLS[0],)),
    ReadoutSpec("dose_rider_cut", "dose", ("dose_reasoning",), ANCHOR, budget="dose_budget", derived_from="dose_rider",
                cells=(CELLS[0],)),
)
"""Every judgment-action readout, in the order of the run tables' rows."""

assert {s.frames[0] for s in READOUTS if s.group == "dose" and s.generates} == {f"dose_{a}" for a in DOSE_ARMS}
RIDER, RIDER_CUT = "dose_rider", "dose_rider_cut"
"""The rider's two reads of each rollout: at its end (the long budget) and cut at the dose budget."""


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
