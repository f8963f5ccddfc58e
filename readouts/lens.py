"""The tuned lens of depth runs: train one (engine/tuned_lens.py) for one model on the prompts the instrument itself
reads, and the checks a depth run makes before reading through it (`readout run --readouts ...,depth --lens FILE`).

Training text: each training scenario's first-token read prompts as a run renders them (`read_prompts`: the agent
frame and the letter-only judge, primary and twin cells, under the model's chat template; the raw frames for a model
without one), every TRAIN_STRIDE-th position and every read position (the prompt's last token). The scenarios: a
panel with a recorded split (panels/split.py, gap-v2) trains on its `train` part and is measured on its `validation`
slice, never on `held-out`; another panel is split by a seeded shuffle. The lens's KL to the final layer is measured
on the measured scenarios at every depth beside the logit lens's, over their positions and at their read positions
alone (recorded in the lens file and printed).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from contract.names import DEPTH_CELLS
from engine.errors import ReadoutError
from readouts.manifest import file_sha256

HELD_OUT_SHARE = 0.125
"""Share of the panel's scenarios held out of training (the KL comparison is measured on them)."""
EVAL_STRIDE = 4
"""The held-out KL is measured at every EVAL_STRIDE-th token (the full-vocabulary KL at every depth is the cost)."""
TRAIN_STRIDE = 4
"""The lens trains on every TRAIN_STRIDE-th position of each prompt and on its read position (the streams of every
position of every prompt would take gigabytes: positions x depths x hidden)."""
READ_CELLS = DEPTH_CELLS[:2]
"""The cells whose read prompts the lens trains on: the primary and its twin (the pair E compares)."""


@dataclass(frozen=True)
class LensSettings:
    steps: int = 100
    batch: int = 32
    lr: float = 1e-3
    seed: int = 0
    max_train_scenarios: int = 64
    """Scenarios the streams are captured from (every token of each; the memory is tokens x depths x hidden)."""
    max_held_out_scenarios: int = 16
    """Held-out scenarios the KL comparison is measured on (at most; the rest of the held-out share is not read)."""


def read_prompts(lm, scenarios) -> list[list[int]]:
    """Each scenario's first-token read prompts as a run encodes them (the agent frame and the letter-only judge, or
    the raw frames without a chat template; primary and twin; the options as listed): the read is at the last token."""
    from engine.render import encode_prompt
    from panels.frames import render
    from readouts.gap.prompts import prompt_of

    chat = lm.facts.chat_template_sha256 is not None
    frames = ("agent", "judge_letter") if chat else ("raw_agent", "raw_judge")
    return [encode_prompt(lm.tokenizer, prompt_of(render(s, f, c))) for s in scenarios for f in frames for c in READ_CELLS]


def lens_scenarios(panel, settings) -> tuple[list, list, str]:
    """(training, measured, how they were split): a recorded split's `train` and `validation` parts, else
    `split_scenarios`; each capped by the settings."""
    from panels.records import PanelError
    from panels.split import records_of

    try:
        train, held, how = records_of(panel, "train"), records_of(panel, "validation"), "recorded split: train / validation"
    except PanelError:
        train, held = split_scenarios(panel.records, settings.seed, settings.max_train_scenarios)
        how = f"seeded shuffle ({HELD_OUT_SHARE:.3g} held out)"
    return train[: settings.max_train_scenarios], held[: settings.max_held_out_scenarios], how


def split_scenarios(records, seed: int, max_train: int) -> tuple[list, list]:
    """(training, held-out) scenarios: a seeded shuffle, HELD_OUT_SHARE held out (at least one), training capped
    (the held-out share does not depend on the cap, so a smaller lens never trains on a larger one's held-out part)."""
    order = list(records)
    random.Random(f"lens:{seed}").shuffle(order)
    held = max(1, round(len(order) * HELD_OUT_SHARE))
    if len(order) < 2:
        raise ReadoutError(f"--panel: {len(order)} scenario(s): a lens needs at least 2 (one held out)")
    return order[held:][:max_train], order[:held]


def lens_model_meta(lm) -> dict:
    """What identifies the model a lens is trained for (a run through the lens must match every field)."""
    f = lm.facts
    return {"name": f.name, "hf_id": f.hf_id, "revision": f.revision,
            "weights_fingerprint": getattr(f, "weights_fingerprint", None) if f.source == "local" else None,
            "adapter": (f.adapter or {}).get("weights_fingerprint")}


def train_lens_for(lm, panel, settings: LensSettings, progress=None):
    """The lens trained on streams captured from the panel's training scenarios; its `meta` records the model, the
    split, the settings, the loss per step and both lenses' KL per depth on the held-out scenarios."""
    import torch

    from engine.tuned_lens import capture_streams, kl_to_final, train_lens

    train, held, how = lens_scenarios(panel, settings)
    seqs, held_seqs = read_prompts(lm, train), read_prompts(lm, held)
    t0 = time.perf_counter()
    streams = torch.cat([_positions(capture_streams(lm.model, [s]), TRAIN_STRIDE) for s in seqs])
    t_capture = time.perf_counter() - t0
    positions = int(streams.shape[0])
    lens, losses = train_lens(lm.model, streams, steps=settings.steps, lr=settings.lr, batch=settings.batch,
                              seed=settings.seed, progress=progress)
    t_train = time.perf_counter() - t0 - t_capture
    del streams
    captured = [capture_streams(lm.model, [s]) for s in held_seqs]
    held_streams = torch.cat([c[::EVAL_STRIDE] for c in captured])
    at_reads = torch.cat([c[-1:] for c in captured])
    kl_logit = kl_to_final(lm.model, held_streams).mean(0).tolist()
    kl_tuned = kl_to_final(lm.model, held_streams, lens).mean(0).tolist()
    read_logit = kl_to_final(lm.model, at_reads).mean(0).tolist()
    read_tuned = kl_to_final(lm.model, at_reads, lens).mean(0).tolist()
    lens.meta = {
        "model": lens_model_meta(lm),
        "panel": {"name": panel.name, "sha256": panel.sha256, "split": how, "train": [s.id for s in train],
                  "held_out": [s.id for s in held]},
        "prompts": "first-token read prompts (agent and letter-only judge frames, primary and twin)",
        "settings": settings.__dict__, "train_tokens": sum(len(s) for s in seqs), "train_positions": positions,
        "held_out_positions": int(held_streams.shape[0]), "read_positions": int(at_reads.shape[0]), "loss": losses,
        "held_out_kl": {"logit": kl_logit, "tuned": kl_tuned},
        "read_position_kl": {"logit": read_logit, "tuned": read_tuned},
        "seconds": {"capture": round(t_capture, 1), "train": round(t_train, 1),
                    "evaluate": round(time.perf_counter() - t0 - t_capture - t_train, 1)},
    }
    return lens


def _positions(streams, stride: int):
    """Every `stride`-th position of one prompt's streams, and its last (the read position)."""
    keep = list(range(0, streams.shape[0] - 1, stride)) + [streams.shape[0] - 1]
    return streams[keep]


def kl_lines(meta: dict) -> list[str]:
    """The held-out KL table of a lens's meta: one line per depth, over the positions and at the read positions."""
    kl, reads = meta["held_out_kl"], meta.get("read_position_kl")
    lines = [f"held-out KL(final || lens) in nats, {meta['held_out_positions']} positions of "
             f"{len(meta['panel']['held_out'])} held-out scenarios"
             + (f" and their {meta['read_positions']} read positions:" if reads else ":"),
             "depth  logit lens  tuned lens" + ("  at reads: logit  tuned" if reads else "")]
    for d, (a, b) in enumerate(zip(kl["logit"], kl["tuned"])):
        tail = f"  {reads['logit'][d]:16.4f}  {reads['tuned'][d]:6.4f}" if reads else ""
        lines.append(f"{d:>5}  {a:10.4f}  {b:10.4f}{tail}")
    return lines


def load_for_run(path, lm):
    """The lens file a depth run reads through, checked against the run's model; (lens, manifest fields)."""
    from engine.tuned_lens import TunedLens

    lens = TunedLens.load(path)
    lens.check_fits(lm.model, lens_model_meta(lm), path)
    meta = lens.meta
    return lens, {"path": str(path), "sha256": file_sha256(path), "model": meta.get("model"),
                  "panel": {k: v for k, v in meta.get("panel", {}).items() if k in ("name", "sha256")},
                  "settings": meta.get("settings"), "held_out_kl": meta.get("held_out_kl")}


def train_lens_file(model, panel_name: str, settings: LensSettings, out, progress=None):
    """Load `model` (readouts.options.ModelOptions) and the gap panel `panel_name`, train the lens, write it to `out`;
    returns (the file's path, the lens's meta)."""
    from panels.schema import load_panel

    panel = load_panel(panel_name)
    if panel.kind != "gap":
        raise ReadoutError(f"--panel: {panel.path}: a {panel.kind} panel; the lens reads gap scenarios")
    lm = model.load()
    if getattr(lm, "served", False):
        raise ReadoutError("--model: a served model exposes no residual stream; a lens needs local weights")
    lens = train_lens_for(lm, panel, settings, progress=progress)
    return lens.save(out), lens.meta
