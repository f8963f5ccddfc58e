"""`readout nsi`: the negation-sensitivity audit as the run driver sees it (panel kind, tables, profiles, what a
run records of its decision words, the runner, local or served, and the summary printed at the end). What is
read is readouts/nsi/recipe.py's (local weights) and readouts/nsi/served.py's (a served model).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.names import FRAMINGS
from contract.tables import NSI_CONTINUOUS, NSI_REPLIES
from engine.errors import ReadoutError
from engine.render import Prompt, encode_prompt
from panels.frames import render_polarity
from readouts.nsi.profile import PROFILES, run_name, settings_note
from readouts.nsi.recipe import DECISION_PREFIX, DECISION_WORDS, MIN_WORD_START, NsiRunner, decision_words


@dataclass
class NsiStudy:
    """The framing-stability audit as the run driver sees it."""

    kind: str = "nsi"
    runner_type = NsiRunner  # not a field: the local runner's class
    tables: tuple[str, ...] = (NSI_REPLIES.name, NSI_CONTINUOUS.name)
    panel_kind: str = "nsi"
    default_panel: str = "nsi-14"
    default_seed: int = 42
    words: object = None
    """The tokens read for "agree" and "disagree" (`decision_words`, set by `prepare`)."""
    profile: object = None
    """The resolved profile of the run (set by `prepare`), for the summary's settings note."""
    stats_command: str = "readout nsi-stats"
    """What reads the run next (the summary's last line names it)."""

    @property
    def profiles(self):
        return PROFILES

    def run_name(self, profile, seed: int) -> str:
        return run_name(profile.name, seed)

    def stratum(self, record) -> str:
        return record.domain

    def prepare(self, lm, panel, records, profile) -> dict:
        if getattr(lm, "served", False):
            self.profile = profile
            return {"letters": {"words": list(DECISION_WORDS), "rule": f"token text starting the word, >= {MIN_WORD_START} "
                                "characters (served top-k)"}, "readouts": ["replies", "continuous"],
                    "decision_prefix": DECISION_PREFIX, "continuous_settings": [
                        {"temperature": 1.0, "top_p": 1.0, "columns": "p_agree"},
                        {"temperature": profile.temperature, "top_p": profile.top_p, "columns": "p_agree_tempered",
                         "over": "the top k"}], "sample": True,
                    "served_requests": {"replies": {"sample 0": {"temperature": 0.0, "top_p": 1.0},
                                                    "samples 1..n": {"temperature": profile.temperature, "top_p": profile.top_p},
                                                    "max_tokens": profile.budget, "seed": "derive_seed(run seed, dilemma, framing, sample)"},
                                        "continuous": {**lm.read_params(), "assistant_prefill": DECISION_PREFIX}}}
        if lm.facts.chat_template_sha256 is None:
            raise ReadoutError(f"--model: {lm.facts.name} has no chat template; the JSON-schema prompt is a chat prompt")
        self.words = decision_words(lm.tokenizer)
        self.profile = profile
        return {"letters": self.words, "readouts": ["replies", "continuous"], "decision_prefix": DECISION_PREFIX,
                "continuous_settings": [{"temperature": 1.0, "top_p": 1.0, "columns": "p_agree"},
                                        {"temperature": profile.temperature, "top_p": profile.top_p,
                                         "columns": "p_agree_tempered"}],
                "sample": True}

    def check_lengths(self, lm, records, profile) -> None:
        """Every framing's prompt, with its reply budget, fits the model's context (a served model's server checks)."""
        if getattr(lm, "served", False):
            return
        for d in records:
            for f in FRAMINGS:
                n = len(encode_prompt(lm.tokenizer, Prompt(messages=render_polarity(d, f).messages))) + profile.budget
                lm.check_fits(n, f"{d.source}: scenario ({f}, with the {profile.budget}-token reply budget)")

    def work(self, chunk, profile, seed: int, layers: int | None) -> int:
        return len(chunk) * len(FRAMINGS) * (1 + profile.samples)

    def workload(self, tokenizer, chunks, profile, seed: int, bounds, layers: int | None = None):
        """The run's workload per stage without a model (`--plan`; readouts/nsi/plan.py)."""
        from readouts.nsi.plan import nsi_workload

        prefix = tuple(tokenizer.encode(DECISION_PREFIX, add_special_tokens=False))
        return nsi_workload(tokenizer, chunks, profile, prefix, bounds)

    def runner(self, lm, profile, seed, options, bar, generate=None):
        if getattr(lm, "served", False):
            from readouts.nsi.served import ServedNsiRunner

            return ServedNsiRunner(lm, profile, seed, options.model.model, DECISION_PREFIX, DECISION_WORDS, MIN_WORD_START, bar)
        return self.runner_type(lm, profile, seed, options.model.model, self.words, bar=bar, generate=generate)

    def summary(self, tables) -> list[str]:
        replies, continuous = tables
        note = settings_note(self.profile) if self.profile is not None else None
        lines = [note] if note else []
        lines += [f"{len(replies)} replies, {replies.parse_ok.mean():.0%} schema-valid; {len(continuous)} continuous reads"]
        rates = continuous.groupby("framing").p_endorse.mean()
        lines.append("mean continuous endorsement by framing: " + ", ".join(f"{f} {v:.3f}" for f, v in rates.items()))
        valid = replies[replies.parse_ok]
        if len(valid):
            lines.append("sampled endorsement rate by framing: " + ", ".join(
                f"{f} {v:.3f}" for f, v in valid.groupby("framing").endorse.mean().items()))
        return lines
