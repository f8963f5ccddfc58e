"""`readout nsi`: the negation-sensitivity audit on local weights. For each dilemma and framing F0-F3:
sampled replies to the JSON-schema prompt (plus one greedy reply), each parsed by the paper's four-stage
parser and kept as a row whether or not it parsed; and a sample-free continuous readout, the exact
probability of "agree" against "disagree" at the decision field.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from engine.errors import ReadoutError
from engine.generation import derive_seed, generate, stop_token_ids
from engine.letters import word_start_tokens
from engine.loading import load_model
from engine.scoring import Prompt, encode_prompt, score_ids
from panels.frames import POLARITY_FRAMES, frame_texts, render_polarity
from panels.schema import PanelError, load_panel
from readouts.nsi_parse import endorsement, parse_reply
from readouts.rundir import RunDir
from readouts.run import chunk_loop, default_out, model_manifest

DECISION_PREFIX = '{"decision": "'


@dataclass(frozen=True)
class NsiProfile:
    """Sampling settings of an NSI run (negation paper, Appendix C.3)."""

    name: str
    samples: int
    """Sampled replies per dilemma x framing at `temperature` (plus one greedy reply)."""
    budget: int
    """New-token budget per reply."""
    temperature: float = 0.7
    top_p: float = 0.95
    chunk_dilemmas: int = 2


NSI_PROFILES = {
    "paper": NsiProfile("paper", samples=30, budget=4096),
    # Sized for two CPU cores: enough budget for a short JSON object (~80-100 tokens), few samples. One
    # chunk of 2 dilemmas x 4 framings x (1 + 4) rollouts decodes as a single batch of 40 rows.
    "quick": NsiProfile("quick", samples=4, budget=96),
}


@dataclass(frozen=True)
class NsiConfig:
    model: str
    panel: str = "nsi-14"
    profile: str = "quick"
    samples: int | None = None
    out: str | None = None
    seed: int = 42
    force: bool = False
    progress: bool = True
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None
    device_map: str | None = None
    stop_after_chunks: int | None = None


class NsiRunner:
    """Replies and continuous reads for a chunk of dilemmas."""

    def __init__(self, lm, profile: NsiProfile, seed: int, model_name: str, bar=None):
        self.lm, self.profile, self.seed, self.model_name, self.bar = lm, profile, seed, model_name, bar
        self.tok = lm.tokenizer
        self.stop = stop_token_ids(self.tok, lm.model)
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.words = word_start_tokens(self.tok, ("agree", "disagree"))
        self.prefix_ids = tuple(self.tok.encode(DECISION_PREFIX, add_special_tokens=False))

    def run(self, dilemmas):
        cells = [(d, f, render_polarity(d, f)) for d in dilemmas for f in POLARITY_FRAMES]
        prompts = [tuple(encode_prompt(self.tok, Prompt(messages=p.messages))) for _, _, p in cells]
        n = 1 + self.profile.samples
        rollouts = generate(
            self.lm.model, prompts, max_new_tokens=self.profile.budget, stop_ids=self.stop, n=n, greedy_first=True,
            temperature=self.profile.temperature, top_p=self.profile.top_p, pad_id=self.pad,
            seeds=[derive_seed(self.seed, d.id, f) for d, f, _ in cells],
            on_batch=(lambda k: self.bar.update(k * n)) if self.bar is not None else None,
        )
        replies = []
        for (d, f, p), rs in zip(cells, rollouts):
            for j, r in enumerate(rs):
                text = self.tok.decode(r.tokens, skip_special_tokens=True)
                parsed = parse_reply(text)
                replies.append(dict(
                    model=self.model_name, dilemma_id=d.id, domain=d.domain, framing=f, negated=p.negated,
                    temperature=0.0 if r.greedy else self.profile.temperature, sample=j, text=text,
                    generated_tokens=len(r.tokens), truncated=not r.stopped, **parsed.as_row(),
                    endorse=endorsement(parsed.decision, p.negated) if parsed.ok else None,
                ))
        reads = [ids + self.prefix_ids for ids in prompts]
        masses = score_ids(self.lm.model, reads, [self.words] * len(reads), pad_id=self.pad)
        continuous = []
        for (d, f, p), res in zip(cells, masses):
            agree, disagree = res.mass
            p_agree = agree / (agree + disagree) if agree + disagree > 0 else float("nan")
            continuous.append(dict(model=self.model_name, dilemma_id=d.id, domain=d.domain, framing=f, negated=p.negated,
                                   mass_agree=agree, mass_disagree=disagree, p_agree=p_agree,
                                   p_endorse=1 - p_agree if p.negated else p_agree, prompt_tokens=res.n_tokens))
        numeric = {c: "Float64" for c in ("confidence", "adherence_to_laws", "adherence_to_social_ethics",
                                          "objective_positive_consequences", "objective_negative_consequences")}
        replies_df = pd.DataFrame(replies).astype({"parse_stage": "Int64", "endorse": "Int64", "decision": "string",
                                                   "reasoning": "string", "parse_error": "string", **numeric})
        return replies_df, pd.DataFrame(continuous)


def run_nsi(cfg: NsiConfig, log=print) -> Path:
    """Run (or resume) the framing-stability audit; returns the run directory."""
    if cfg.profile not in NSI_PROFILES:
        raise ReadoutError(f"--profile: '{cfg.profile}' is not one of {', '.join(NSI_PROFILES)}")
    profile = NSI_PROFILES[cfg.profile]
    if cfg.samples is not None:
        if cfg.samples < 0:
            raise ReadoutError(f"--samples: must be >= 0, got {cfg.samples}")
        profile = NsiProfile(profile.name, cfg.samples, profile.budget, profile.temperature, profile.top_p, profile.chunk_dilemmas)
    try:
        panel = load_panel(cfg.panel)
    except PanelError as exc:
        raise ReadoutError(str(exc)) from None
    if panel.kind != "nsi":
        raise ReadoutError(f"--panel: {panel.name} is a {panel.kind} panel; `readout nsi` reads polarity dilemma panels such as nsi-14")
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, quantize=cfg.quantize, device_map=cfg.device_map)
    if lm.facts.chat_template_sha256 is None:
        raise ReadoutError(f"--model: {cfg.model} has no chat template; the JSON-schema prompt is a chat prompt")
    runner = NsiRunner(lm, profile, cfg.seed, cfg.model)
    out = Path(cfg.out) if cfg.out else default_out(cfg.model, panel.name, f"nsi-{profile.name}", cfg.seed, False)
    manifest = {
        **model_manifest(lm, runner.words),
        "kind": "nsi",
        "panel": {"name": panel.name, "path": panel.path, "sha256": panel.sha256, "records": len(panel.records)},
        "frames_version": frame_texts()["version"],
        "profile": asdict(profile),
        "readouts": ["replies", "continuous"],
        "decision_prefix": DECISION_PREFIX,
        "seed": cfg.seed,
        "sample": True,
    }
    dilemmas = list(panel.records)
    chunks = [dilemmas[i : i + profile.chunk_dilemmas] for i in range(0, len(dilemmas), profile.chunk_dilemmas)]
    manifest["n_chunks"] = len(chunks)
    rundir = RunDir(out, tables=("nsi_replies", "nsi_continuous"))
    for line in rundir.open(manifest, force=cfg.force):
        log(line)
    per = len(POLARITY_FRAMES) * (1 + profile.samples)
    from tqdm.auto import tqdm

    bar = tqdm(total=per * len(dilemmas), initial=per * sum(len(c) for i, c in enumerate(chunks) if rundir.is_finished(i)),
               desc=f"{cfg.model} nsi {profile.name}", unit="reply", disable=not cfg.progress, dynamic_ncols=True)
    runner.bar = bar
    t0 = time.perf_counter()
    computed = chunk_loop(rundir, chunks, runner.run, bar, log, cfg.stop_after_chunks)
    replies, continuous = rundir.merge(len(chunks))
    wall = time.perf_counter() - t0
    rundir.write_manifest({**manifest, "chunks": rundir.finished(), "complete": True,
                           "last_session": {"computed_chunks": computed, "wall_seconds": round(wall, 1)}})
    ok = replies.parse_ok.mean()
    log(f"tables: {rundir.path / 'nsi_replies.parquet'} ({len(replies)} replies, {ok:.0%} schema-valid), "
        f"{rundir.path / 'nsi_continuous.parquet'} ({len(continuous)} rows)")
    rates = continuous.groupby("framing").p_endorse.mean()
    log("mean continuous endorsement by framing: " + ", ".join(f"{f} {v:.3f}" for f, v in rates.items()))
    valid = replies[replies.parse_ok]
    if len(valid):
        log("sampled endorsement rate by framing: " + ", ".join(
            f"{f} {v:.3f}" for f, v in valid.groupby("framing").endorse.mean().items()))
    if computed:
        log(f"wall time {wall:.1f} s for {computed} chunks ({len(replies) / max(wall, 1e-9):.2f} replies/s)")
    return rundir.path
