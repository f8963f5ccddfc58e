"""The result row every number of the gap analysis is reported in: `Estimate` (value, n, percentile CI,
bootstrap SE, detection bar), and its constructors."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Detection bar multiplier: a true effect of 2.8 SE is found with 80% power by a two-sided 5% test
#: (1.96 + 0.84); the paper's "MDE = 2.8 x bootstrap SE".
MDE_FACTOR = 2.8


@dataclass(frozen=True)
class Estimate:
    """One reported number with its n and its uncertainty."""

    analysis: str
    """Which analysis produced it (continuous, binary, ladder, slices, control, dose, ...)."""
    quantity: str
    """What it is: p_D, p_J, g, g_twin, E, binary_gap, binary_null, binary_excess, control_move, ..."""
    subset: str
    """The scenario set it is computed on (screened, all, L1, family=F3, stage=dpo, ...)."""
    n: int
    """Scenarios with a defined value that entered the estimate."""
    value: float | None
    """Point estimate; None when n is 0."""
    low: float | None
    """Lower end of the CI; None when it cannot be computed (n < 2)."""
    high: float | None
    """Upper end of the CI."""
    se: float | None
    """Bootstrap standard error (SD of the bootstrap distribution)."""
    mde: float | None
    """Detection bar: 2.8 x se, the smallest true effect this n resolves with 80% power."""
    method: str
    """How the CI was made, e.g. 'scenario bootstrap (10000)' or 'nested bootstrap (10000)'."""
    note: str | None = None
    """Anything a reader needs beside the number (why no CI, a failed bar, ...)."""

    def fmt(self, digits: int = 3, n: bool = True) -> str:
        """'0.054 [0.021, 0.086] (n=136)'; the n is always shown unless asked not to."""
        if self.value is None:
            body = "n/a"
        elif self.low is None or self.high is None:
            body = f"{self.value:.{digits}f} [no CI]"
        else:
            body = f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"
        return f"{body} (n={self.n})" if n else body

    @property
    def above_zero(self) -> bool:
        """The CI excludes zero from below (the paper's 'declared above zero')."""
        return self.low is not None and self.low > 0


def as_float(x) -> float | None:
    """A float, or None for None and NaN."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def make_estimate(analysis, quantity, subset, n, value, low, high, se, method, note=None) -> Estimate:
    """Build an Estimate from possibly-NaN floats (NaN -> None), adding the detection bar."""
    se_f = as_float(se)
    if n < 2:
        note = note or "n < 2: no CI"
    return Estimate(analysis=analysis, quantity=quantity, subset=subset, n=int(n), value=as_float(value),
                    low=as_float(low), high=as_float(high), se=se_f, mde=None if se_f is None else MDE_FACTOR * se_f,
                    method=method, note=note)


def empty(analysis: str, quantity: str, subset: str, note: str | None = None) -> Estimate:
    """The row for a quantity with no defined scenario (kept, never dropped)."""
    return Estimate(analysis, quantity, subset, 0, None, None, None, None, None, "none",
                    note or "no scenario with a defined value")
