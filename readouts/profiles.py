"""Profiles: how much of the paper's design a run reads. `paper` is the paper's settings; `quick` is sized
so the default `make readout` (SmolLM2-135M on gap-v1) finishes in minutes on two CPU cores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.errors import ReadoutError

READOUT_GROUPS = ("D", "J", "J0", "raw", "control", "dose")


@dataclass(frozen=True)
class Profile:
    """Settings of one profile (all recorded in the manifest)."""

    name: str
    max_scenarios: int | None
    """Family-stratified subset of the panel (None: every scenario)."""
    d_orders: int
    """Option orders for the action readout D (rollouts are exact at `temperature`)."""
    j0_orders: int
    """Option orders for the letter-only judgment J0."""
    control_orders: int
    """Option orders for the known-gap control."""
    raw_orders: int
    """Option orders for raw D / raw J (greedy)."""
    temperature: float
    """Sampling temperature of rollouts (D, J0, control, sampled J and dose rollouts)."""
    top_p: float
    """Nucleus for sampled rollouts."""
    j_samples: int
    """Sampled judgments per judge frame, besides the greedy one."""
    j_budget: int
    """New-token budget of a judgment's reasoning before the anchor is forced."""
    dose_budget: int
    """Budget of the reasoning, filler and norm-naming dose arms."""
    dose_brief_budget: int
    """Budget of the brief-reasoning arm."""
    dose_rollouts: int
    """Rollouts per dose arm (the first greedy, the rest sampled)."""
    chunk_scenarios: int
    """Scenarios per chunk: the unit of atomic writes and of resuming."""

    def as_dict(self) -> dict:
        return asdict(self)


PROFILES = {
    "paper": Profile("paper", None, 32, 32, 32, 8, 0.7, 1.0, 8, 512, 512, 64, 4, 4),
    "quick": Profile("quick", 10, 6, 4, 4, 2, 0.7, 1.0, 2, 24, 24, 12, 1, 5),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ReadoutError(f"--profile: '{name}' is not one of {', '.join(PROFILES)}")
    return PROFILES[name]


def parse_readouts(spec: str | None, chat: bool) -> tuple[str, ...]:
    """`--readouts D,J,...` to a tuple of groups; the default is every group the model supports."""
    if spec is None:
        return READOUT_GROUPS if chat else ("raw",)
    groups = tuple(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()))
    bad = [g for g in groups if g not in READOUT_GROUPS]
    if bad or not groups:
        raise ReadoutError(f"--readouts: '{','.join(bad) or spec}' not among {','.join(READOUT_GROUPS)}")
    if not chat:
        needs_chat = [g for g in groups if g != "raw"]
        if needs_chat:
            raise ReadoutError(f"--readouts: {','.join(needs_chat)} need a chat template, and this model has none (use --readouts raw)")
    return groups
