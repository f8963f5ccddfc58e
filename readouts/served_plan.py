"""`--plan` for a served model: the requests a run will send and the tokens they carry, from the study's own
served runner driven over every chunk against a recorder that sends nothing (so the count is the run's, not
a second bookkeeping). Prompt tokens are estimated from characters (no tokenizer of the served model is
here: about 4 characters a token); completion tokens are the budgets asked for, an upper bound. Requests
the cache already holds are counted apart: a rerun does not send them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine.served import Reply, ServedModel, Token, usable
from engine.served_client import cache_key
from readouts.show import plural

CHARS_PER_TOKEN = 4.0
"""The rough prompt-token estimate of `--plan` for a model whose tokenizer is not here."""


@dataclass
class _Tally:
    requests: int = 0
    cached: int = 0
    prompt_chars: int = 0
    completion_max: int = 0
    kinds: dict = field(default_factory=dict)


class _Recorder(ServedModel):
    """A ServedModel that records each request instead of sending it (replies: empty text, ending the turn)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.gen, self.reads = _Tally(), _Tally()

    def _record(self, tally: _Tally, items):
        for body, sample in items:
            tally.requests += 1
            tally.prompt_chars += sum(len(m.get("content") or "") for m in body["messages"])
            tally.prompt_chars += len(json.dumps(body["messages"])) // 20  # role markers and template overhead
            tally.completion_max += body["max_tokens"]
            hit = self.client.cache.get(cache_key(self.spec.name, self.spec.url, body, sample))
            if hit is not None and usable(hit, read=tally is self.reads):  # what the run would take from the cache
                tally.cached += 1

    def complete(self, items, on_done=None):
        self._record(self.gen, items)
        top = ((" A", 0.5), ("A", 0.5))
        return [Reply("", "stop", 0, None, (Token("", top),), None, None) for _ in items]

    def read(self, reads, on_done=None):
        items = [(self.read_bodies(m, p), 0) for m, p in reads]
        self._record(self.reads, items)
        top = tuple((f"{c}", 0.05) for c in "ABCDE") + (("agree", 0.1), ("disagree", 0.1))
        return [Reply("", "length", 1, None, (Token("A", top),), None, None) for _ in items]


def served_plan_lines(study, options) -> list[str]:
    """The lines `readout run|nsi --plan` prints for a served model."""
    from readouts.driver import _resolve

    job = _resolve(study, options)
    rec = _Recorder(options.model.served)
    study.prepare(rec, job.panel, job.records, job.profile)
    runner = study.runner(rec, job.profile, job.seed, options, None)
    for chunk in job.chunks:
        runner.run(chunk)
    spec = options.model.served
    lines = [f"plan: served model {spec.name} at {spec.url}, {job.panel.name}, profile {job.profile.name}, "
             f"{plural(len(job.records), 'record')} in {plural(len(job.chunks), 'chunk')}"]
    for what, t, note in (("generation", rec.gen, "completion tokens at most (the budgets)"),
                          ("read", rec.reads, "completion tokens (1 each; a read after generated text sends that text too)")):
        if not t.requests:
            continue
        lines.append(f"  {what} requests: {t.requests} ({t.cached} already in the cache), prompt ~{t.prompt_chars / CHARS_PER_TOKEN:,.0f} "
                     f"tokens (estimated at {CHARS_PER_TOKEN:g} characters a token), {t.completion_max:,} {note}")
    total = rec.gen.requests + rec.reads.requests
    cached = rec.gen.cached + rec.reads.cached
    lines.append(f"  total: {total} requests, {total - cached} to send (plus one capability check), "
                 f"at most {spec.client.concurrency} at a time; cache {rec.cache_dir}")
    return lines
