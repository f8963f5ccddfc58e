"""The NSI study's profiles (negation paper, Appendix C.3), importable without torch: the command line's help
and the run driver read the same declarations."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ReadoutError
from readouts.profiles import Profile, not_paper_note


@dataclass(frozen=True, kw_only=True)
class NsiProfile(Profile):
    """Sampling settings of an NSI run (negation paper, Appendix C.3)."""

    samples: int
    """Sampled replies per dilemma x framing at `temperature` (plus one greedy reply)."""
    budget: int
    """New-token budget per reply."""
    temperature: float = 0.7
    top_p: float = 0.95

    def check(self) -> None:
        super().check()
        if self.samples < 0:
            raise ReadoutError(f"--samples: must be >= 0, got {self.samples}")


PROFILES = {
    "paper": NsiProfile(name="paper", chunk_size=2, samples=30, budget=4096),
    # Sized for two CPU cores: enough budget for a short JSON object (~80-100 tokens), few samples. One
    # chunk of 2 dilemmas x 4 framings x (1 + 4) rollouts decodes as a single batch of 40 rows.
    "quick": NsiProfile(name="quick", chunk_size=2, samples=4, budget=96),
}


PAPER_FIELDS = ("samples", "budget", "temperature", "top_p")
"""The decoding settings of Appendix C.3 that the `paper` profile holds."""


def settings_note(profile: NsiProfile) -> str | None:
    """A line saying that a run's decoding settings are not the paper's, or None when they are."""
    return not_paper_note(profile, PROFILES["paper"], PAPER_FIELDS)


def run_name(profile: str, seed) -> str:
    """The run directory's last part (under runs/<model>/<panel>/) for a profile and seed."""
    return f"nsi-{profile}-seed{seed}"
