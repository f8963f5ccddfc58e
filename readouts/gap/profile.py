"""The judgment-action study's profiles. `paper` is the paper's settings; `quick` is sized so the
default `make readout` (SmolLM2-135M) finishes in minutes on two CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.names import PARAPHRASE_CELLS
from contract.readouts import READOUTS, ReadoutSpec, readout
from engine.errors import ReadoutError
from readouts.profiles import Profile


@dataclass(frozen=True, kw_only=True)
class GapProfile(Profile):
    """Settings of a judgment-action run (all recorded in the manifest)."""

    orders: dict[str, int] = field(default_factory=dict)
    """Option orders per first-token readout key (a spec's `orders`): D, J0, control, raw."""
    temperature: float = 0.7
    """Sampling temperature of rollouts (first-token readouts exact at it; sampled J and dose rollouts)."""
    top_p: float = 1.0
    """Nucleus for sampled rollouts."""
    j_samples: int = 8
    """Sampled judgments per judge frame, besides the greedy one."""
    j_budget: int = 512
    """New-token budget of a judgment's reasoning before the anchor is forced."""
    dose_samples: int = 3
    """Sampled rollouts per dose arm, besides the greedy one."""
    dose_budget: int = 512
    """Budget of the reasoning, filler and norm-naming dose arms."""
    dose_brief_budget: int = 64
    """Budget of the brief-reasoning arm."""
    paraphrase: bool = True
    """Also read the F4 paraphrase cells (the paraphrase-swap table); they never enter the gate."""

    def check(self) -> None:
        super().check()
        keys = {s.orders for s in READOUTS if s.orders is not None}
        if set(self.orders) != keys:
            raise ReadoutError(f"profile {self.name}: orders: keys {sorted(self.orders)} must be the readout specs' {sorted(keys)}")
        bad = next((k for k, v in self.orders.items() if v < 1), None)
        if bad is not None:
            raise ReadoutError(f"--set: orders.{bad}: must be >= 1, got {self.orders[bad]}")


PROFILES = {
    "paper": GapProfile(name="paper", chunk_size=4, orders=dict(D=32, J0=32, control=32, raw=8)),
    # The paper's settings in chunks sized for a GPU: a chunk is the unit one batch plan covers, so larger
    # chunks give the engine batches of thousands of rows instead of a few hundred (same numbers otherwise).
    "paper-gpu": GapProfile(name="paper-gpu", chunk_size=32, orders=dict(D=32, J0=32, control=32, raw=8)),
    "quick": GapProfile(name="quick", chunk_size=5, max_units=10, orders=dict(D=6, J0=4, control=4, raw=2),
                        j_samples=2, j_budget=24, dose_samples=0, dose_budget=24, dose_brief_budget=12,
                        paraphrase=False),
}


def rollouts(spec: ReadoutSpec, profile: GapProfile) -> int:
    """Rollouts per prompt of an anchor readout: the greedy one plus the sampled ones (a derived readout
    has as many as the readout it re-reads)."""
    source = readout(spec.derived_from) if spec.derived_from else spec
    return 1 + getattr(profile, source.samples)


def cells_read(scenario, profile: GapProfile) -> tuple[str, ...]:
    """The cells of `scenario` this profile reads."""
    return tuple(c for c in scenario.cells if profile.paraphrase or c not in PARAPHRASE_CELLS)


for _profile in PROFILES.values():
    _profile.check()
