"""The numeric options of the command line, declared once: default, lower and upper bound, help.

`cli.options` builds every numeric option from these (its type checks the bounds before any work, its help
shows the default); the statistics take their defaults from here too, so a default is written in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MASS_FLOOR = 0.5
"""Minimum total letter mass (under the agent frame) for a scenario to enter the screen."""
PAPER_PROFILES = ("paper", "paper-gpu")
"""The profiles that hold the papers' settings (paper-gpu: the same numbers in larger chunks)."""
DEFAULT_N_BOOT = 10_000
"""Bootstrap resamples of every CI."""


@dataclass(frozen=True)
class Numeric:
    """One numeric option's type and bounds (None: unbounded on that side)."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """True: `low` itself is refused (e.g. top-p > 0)."""

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        return f"{'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else f"<= {self.high:g}"


COUNT = Numeric(int, 1)
"""A positive count: resamples, rows, items, tokens, shards."""
INDEX = Numeric(int, 0)
"""A non-negative integer: seeds, indices, a count that may be 0."""
SHARE = Numeric(float, 0.0, 1.0)
"""A probability or share in [0, 1]."""
TOP_P = Numeric(float, 0.0, 1.0, low_open=True)
SPLIT = Numeric(float, 0.0, 1.0, low_open=True)
"""A training share of a split: above 0 (each stratum of two or more keeps one record on each side)."""
RATIO = Numeric(float, 0.0, low_open=True)
"""A positive ratio: a bound on E_steered / E0."""
MARGIN = Numeric(float, 0.0, 1.0, low_open=True)
"""An equivalence margin on a probability: above 0, at most 1."""
TEMPERATURE = Numeric(float, 0.0)
LEARNING_RATE = Numeric(float, 0.0, low_open=True)
"""An optimizer's step size: above 0."""
