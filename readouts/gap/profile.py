"""The judgment-action study's profiles. `paper` is the paper's settings; `quick` is sized so the
default `make readout` (SmolLM2-135M) finishes in minutes on two CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.names import PARAPHRASE_CELLS
from contract.readouts import FIRST_TOKEN, READOUTS, ReadoutSpec, readout
from engine.errors import ReadoutError
from panels.frames import DEFAULT_VERSION, frame_texts
from panels.records import PanelError
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
    rider_budget: int = 2048
    """The rider's new-token budget (amendment P1-A6: 2,048): the reasoning arm's rollouts continued past
    `dose_budget`, read at the end and at `dose_budget`."""
    rider_rollouts: int = 8
    """The rider's rollouts per scenario, on its primary cell (the greedy one first; P1-A6: "8 rollouts per
    scenario"); 0 switches it off."""
    patch_stride: int = 1
    """Depth runs (`--readouts ...,depth`): patch the agent read at every `patch_stride`-th depth (and the last);
    0: no patching.parquet rows."""
    patch_orders: int = 2
    """Depth runs: the first this many of D's option orders are patched, per primary scenario."""
    grid_stride: int = 0
    """Depth runs: the patching grid (patch_grid.parquet: the pressure pair and its filler-swap control, every group
    of positions, both directions) at every `grid_stride`-th depth (and the last), in the same orders; 0: none (the
    default: each cell of the grid is a plain forward of the whole prompt, about 16 / grid_stride forwards per
    scenario, order and layer of the model, which on two CPU cores is minutes per scenario)."""
    frames: str = DEFAULT_VERSION
    """The frames version the prompts are rendered in (panels/frames/<frames>.toml): `v1` as every run before
    it; `v2` adds the scenario's norm to the norm-naming dose arm, every other text as in v1."""

    def check(self) -> None:
        super().check()
        keys = {s.orders for s in READOUTS if s.orders is not None}
        if set(self.orders) != keys:
            raise ReadoutError(f"profile {self.name}: orders: keys {sorted(self.orders)} must be the readout specs' {sorted(keys)}")
        bad = next((k for k, v in self.orders.items() if v < 1), None)
        if bad is not None:
            raise ReadoutError(f"--set: orders.{bad}: must be >= 1, got {self.orders[bad]}")
        if self.patch_stride < 0 or self.patch_orders < 1 or self.grid_stride < 0:
            raise ReadoutError(f"--set: patch_stride and grid_stride must be >= 0 and patch_orders >= 1, got "
                               f"{self.patch_stride}, {self.grid_stride}, {self.patch_orders}")
        if self.rider_rollouts < 0:
            raise ReadoutError(f"--set: rider_rollouts: must be >= 0 (0: no rider), got {self.rider_rollouts}")
        if self.rider_rollouts and self.rider_budget < self.dose_budget:
            raise ReadoutError(f"--set: rider_budget: must be >= dose_budget ({self.dose_budget}): the rider is read "
                               f"at dose_budget and at its own end, got {self.rider_budget}")
        try:
            frame_texts(self.frames)
        except PanelError as exc:
            raise ReadoutError(f"--set: frames: {exc}") from None


PROFILES = {
    "paper": GapProfile(name="paper", chunk_size=4, orders=dict(D=32, J0=32, control=32, raw=8)),
    # The paper's settings in chunks sized for a GPU: a chunk is the unit one batch plan covers, so larger
    # chunks give the engine batches of thousands of rows instead of a few hundred (same numbers otherwise).
    "paper-gpu": GapProfile(name="paper-gpu", chunk_size=32, orders=dict(D=32, J0=32, control=32, raw=8)),
    "quick": GapProfile(name="quick", chunk_size=5, max_units=10, orders=dict(D=6, J0=4, control=4, raw=2),
                        j_samples=2, j_budget=24, dose_samples=0, dose_budget=24, dose_brief_budget=12,
                        paraphrase=False, rider_rollouts=0),
}


PAPER_FIELDS = ("max_units", "orders", "j_samples", "j_budget", "temperature", "top_p", "dose_samples", "dose_budget",
                "dose_brief_budget", "paraphrase", "rider_budget", "rider_rollouts")
"""The settings of the paper profile a run's numbers depend on (chunk_size and the frames version do not change
what is read at the paper's settings: paper-gpu is the paper in larger chunks)."""


def run_name(profile: str, seed, sample: bool = False) -> str:
    """The run directory's last part (under runs/<model>/<panel>/) for a profile and seed."""
    return f"{profile}-seed{seed}{'-sample' if sample else ''}"


def rollouts(spec: ReadoutSpec, profile: GapProfile) -> int:
    """Rollouts per prompt of an anchor readout: the greedy one plus the sampled ones, or the spec's own
    total (`rollouts`); a derived readout has as many as the readout it re-reads."""
    source = readout(spec.derived_from) if spec.derived_from else spec
    if source.rollouts is not None:
        return getattr(profile, source.rollouts)
    return 1 + getattr(profile, source.samples)


def is_on(spec: ReadoutSpec, profile: GapProfile) -> bool:
    """Whether this profile reads `spec` at all (an anchor readout with 0 rollouts is off: the rider in quick)."""
    return spec.read == FIRST_TOKEN or rollouts(spec, profile) > 0


def cells_read(scenario, profile: GapProfile) -> tuple[str, ...]:
    """The cells of `scenario` this profile reads."""
    return tuple(c for c in scenario.cells if profile.paraphrase or c not in PARAPHRASE_CELLS)


for _profile in PROFILES.values():
    _profile.check()
