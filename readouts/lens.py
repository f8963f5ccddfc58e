"""The tuned lens of depth runs: train one (engine/tuned_lens.py) for one model on the panel's own context
sentences, and the checks a depth run makes before reading through it (`readout run --readouts ...,depth --lens FILE`).

Training text: each gap scenario's context with its pressure sentence in place, then its filler sentence and its
options, as plain text (no chat template), tokenized as the tokenizer does by default. The scenarios are split by a
seeded shuffle: the held-out part is never trained on, and the lens's KL to the final layer is measured there at
every depth beside the logit lens's (recorded in the lens file and printed).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from engine.errors import ReadoutError
from readouts.manifest import file_sha256

HELD_OUT_SHARE = 0.125
"""Share of the panel's scenarios held out of training (the KL comparison is measured on them)."""
EVAL_STRIDE = 4
"""The held-out KL is measured at every EVAL_STRIDE-th token (the full-vocabulary KL at every depth is the cost)."""


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


def scenario_text(s) -> str:
    """One scenario as plain prose: context (pressure in place), filler, options."""
    context = s.context.replace("{pressure}", s.pressure)
    return " ".join([context, s.filler, *(f"{o.text}." for o in s.options)])


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
    from engine.tuned_lens import capture_streams, kl_to_final, train_lens

    train, held = split_scenarios(panel.records, settings.seed, settings.max_train_scenarios)
    held = held[: settings.max_held_out_scenarios]
    tok = lm.tokenizer
    seqs = [tok(scenario_text(s))["input_ids"] for s in train]
    held_seqs = [tok(scenario_text(s))["input_ids"] for s in held]
    t0 = time.perf_counter()
    streams = capture_streams(lm.model, seqs)
    t_capture = time.perf_counter() - t0
    lens, losses = train_lens(lm.model, streams, steps=settings.steps, lr=settings.lr, batch=settings.batch,
                              seed=settings.seed, progress=progress)
    t_train = time.perf_counter() - t0 - t_capture
    del streams
    held_streams = capture_streams(lm.model, held_seqs)[::EVAL_STRIDE]
    kl_logit = kl_to_final(lm.model, held_streams).mean(0).tolist()
    kl_tuned = kl_to_final(lm.model, held_streams, lens).mean(0).tolist()
    lens.meta = {
        "model": lens_model_meta(lm),
        "panel": {"name": panel.name, "sha256": panel.sha256, "train": [s.id for s in train], "held_out": [s.id for s in held]},
        "settings": settings.__dict__, "train_tokens": sum(len(s) for s in seqs),
        "held_out_positions": int(held_streams.shape[0]), "loss": losses,
        "held_out_kl": {"logit": kl_logit, "tuned": kl_tuned},
        "seconds": {"capture": round(t_capture, 1), "train": round(t_train, 1),
                    "evaluate": round(time.perf_counter() - t0 - t_capture - t_train, 1)},
    }
    return lens


def kl_lines(meta: dict) -> list[str]:
    """The held-out KL table of a lens's meta: one line per depth."""
    kl = meta["held_out_kl"]
    lines = [f"held-out KL(final || lens) in nats, {meta['held_out_positions']} positions of "
             f"{len(meta['panel']['held_out'])} held-out scenarios:", "depth  logit lens  tuned lens"]
    lines += [f"{d:>5}  {a:10.4f}  {b:10.4f}" for d, (a, b) in enumerate(zip(kl["logit"], kl["tuned"]))]
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
