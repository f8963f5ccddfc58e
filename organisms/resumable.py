"""Training an organism in a run that can be stopped and resumed: `train_organism` is what `readout organism train`
calls.

The loop is `organisms.train.fit`'s (the same data order, adapter initialization, optimizer and schedule), with its
state written to a checkpoint folder outside the repository (`cache_root()/organisms-training/<name>/`) every
`every` steps: the adapter's weights, the optimizer's and the schedule's state, the step, the losses so far and the
data order's generator state (numpy's and torch's). A run that finds a checkpoint of the same recipe and examples
goes on from it, and ends with the same adapter bytes as a run that was never stopped.

A recipe with `lineage` also keeps that many adapters along the way (step 0, before any update, and the last step
included, evenly spaced between): small adapter folders written to the checkpoint folder as the run passes them and
copied beside the final adapter (`<out>/lineage/checkpoint-<k>/`) when it ends: the folder name transformers' `Trainer`
gives its checkpoints, so `readout watch <out>/lineage` reads a lineage as it reads a trainer's output.

A recipe with `stream` runs the layers below the band on each step's batch instead of caching every example's
states first (a pool of thousands of prompts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from engine.paths import cache_root
from organisms import SHIPPED
from organisms import train as T
from organisms.examples import examples

CHECKPOINT = "checkpoint.pt"
LINEAGE = "lineage"
EVERY = 10
"""Steps between checkpoints (the default)."""


def checkpoint_folder(name: str) -> Path:
    """Where a training run of organism `name` keeps its checkpoint and lineage (outside the repository)."""
    return cache_root() / "organisms-training" / name


def lineage_steps(org) -> list[int]:
    """The steps whose adapters a lineage keeps: `org.lineage` of them from 0 to `org.steps`, evenly spaced."""
    if org.lineage <= 0:
        return []
    if org.lineage == 1:
        return [org.steps]
    return sorted({round(k * org.steps / (org.lineage - 1)) for k in range(org.lineage)})


def lineage_step(lineage: Path, step: int) -> Path:
    """The folder of a lineage's adapter at `step` (readouts.watch.CHECKPOINT's name)."""
    return lineage / f"checkpoint-{step}"


def identity(org, exs) -> str:
    """A digest of the recipe, the adapter a staged recipe starts from and the examples' token ids and targets: a
    checkpoint resumes only the same run."""
    h = hashlib.sha256(json.dumps(org.recipe(), sort_keys=True, default=list).encode())
    start = SHIPPED / org.init / "adapter_model.safetensors" if org.init else None
    if start is not None and start.is_file():
        h.update(start.read_bytes())
    for e in exs:
        h.update(repr((e.key, e.ids, e.soft_at, e.target, e.hard)).encode())
    return h.hexdigest()


def _adapter_state(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _save_checkpoint(folder: Path, state: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CHECKPOINT}.tmp{os.getpid()}"
    torch.save(state, tmp)
    tmp.replace(folder / CHECKPOINT)


def _save_adapter(model, org, folder: Path, extra: dict) -> None:
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.peft_config["default"].base_model_name_or_path = org.base
    model.save_pretrained(str(tmp))
    T.sort_adapter_config(tmp)
    (tmp / "README.md").unlink(missing_ok=True)
    (tmp / "step.json").write_text(json.dumps({"organism": org.name, **extra}, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.replace(folder)


def _batch_states(model, org, cached, exs, idx, start, exact):
    if cached is not None:
        return [cached[i] for i in idx]
    with torch.no_grad():
        return T._frozen_pass(model, [exs[i] for i in idx], start, exact)


def fit_resumable(lm, org, folder: Path, *, exs=None, base_key=None, every: int = EVERY, resume: bool = True,
                  progress=None, log=None) -> T.Fitted:
    """Train `org` on `lm` (the base model, fp32 on CPU) as `organisms.train.fit` does, writing a checkpoint to
    `folder` every `every` steps and the lineage's adapters as their steps pass; with `resume`, go on from the
    checkpoint there if it is of the same recipe and examples (else start afresh)."""
    say = log or (lambda _line: None)
    exs = exs if exs is not None else examples(org, lm)
    folder = Path(folder)
    ident = identity(org, exs)
    t0 = time.perf_counter()
    model = T.lora_model(lm, org, SHIPPED / org.init if org.init else None)
    model.eval()
    start = org.band[0]
    exact = T.at_loss_positions(model, org)
    deep = org.frozen_context and not T.exact_at_positions(model, org)
    cached = None if org.stream else T.frozen_states(model, exs, start, exact, None if deep else base_key, say)
    t1, c1 = time.perf_counter(), time.process_time()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=org.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + math.cos(math.pi * k / org.steps)))
    rng = np.random.default_rng(org.seed)
    pool = [i for i, e in enumerate(exs) for _ in range(org.emphasis.get(e.readout, 1))]
    order: list[int] = []
    losses: list[float] = []
    step0, spent, cpu = 0, 0.0, 0.0
    path = folder / CHECKPOINT
    if resume and path.is_file():
        state = torch.load(path, weights_only=False)
        if state["identity"] == ident:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if p.requires_grad:
                        p.copy_(state["adapter"][n])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["schedule"])
            rng.bit_generator.state = state["numpy"]
            torch.set_rng_state(state["torch"])
            order, losses, step0, spent = list(state["order"]), list(state["losses"]), state["step"], state["seconds"]
            cpu = state.get("cpu", 0.0)
            say(f"{org.name}: resuming from step {step0} of {org.steps} ({path})")
        else:
            say(f"{org.name}: {path} is of another recipe or examples; starting afresh")
    keep = set(lineage_steps(org))
    lineage = folder / LINEAGE
    if step0 == 0 and lineage.exists():
        shutil.rmtree(lineage)  # another run's

    def checkpoint(step):
        _save_checkpoint(folder, dict(identity=ident, step=step, adapter=_adapter_state(model),
                                      optimizer=opt.state_dict(), schedule=sched.state_dict(),
                                      numpy=rng.bit_generator.state, torch=torch.get_rng_state(), order=list(order),
                                      losses=list(losses), seconds=spent + time.perf_counter() - t1,
                                      cpu=cpu + time.process_time() - c1))

    def mark(step):
        if step in keep and not (lineage_step(lineage, step) / "adapter_model.safetensors").is_file():
            lineage.mkdir(parents=True, exist_ok=True)
            _save_adapter(model, org, lineage_step(lineage, step),
                          dict(step=step, of=org.steps, loss=losses[-1] if losses else None))

    mark(step0)
    for step in range(step0, org.steps):
        if len(order) < org.batch:
            order += [pool[k] for k in rng.permutation(len(pool))]
        idx, order = order[: org.batch], order[org.batch:]
        batch = [exs[i] for i in idx]
        logp, where = T._band_logprobs(model, _batch_states(model, org, cached, exs, idx, start, exact), batch, start)
        loss = T.loss_of(logp, where, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        mark(step + 1)
        if (step + 1) % every == 0 or step + 1 == org.steps:
            checkpoint(step + 1)
        if progress is not None:
            progress(step, losses[-1])
    t2 = time.perf_counter()
    errors = evaluate(model, org, exs, cached, start)
    seconds = dict(cache=t1 - t0, train=spent + t2 - t1, train_cpu=cpu + time.process_time() - c1,
                   evaluate=time.perf_counter() - t2)
    return T.Fitted(model=model, losses=losses, seconds=seconds, errors=errors)


def evaluate(model, org, exs, cached, start) -> list[dict]:
    """The training error: on the cached path every example's; streamed, from plain forwards of the examples in
    each read's first option order (or first judge frame), the rest would take as long as the training."""
    if cached is not None:
        deep = org.frozen_context and not T.exact_at_positions(model, org)
        return T.plain_errors(model, exs) if deep else T._errors(model, cached, exs, start, org.batch)
    return T.plain_errors(model, [e for e in exs if e.key.endswith("|o0")])


def checkpoint_model(lm, org, path: str | Path):
    """The base model of `lm` with the adapter weights of a checkpoint (`path`) merged in, and the checkpoint's step:
    a run's state read without stopping it."""
    state = torch.load(path, weights_only=False)
    model = T.lora_model(lm, org)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(state["adapter"][n])
    return model.merge_and_unload().eval(), state["step"]


def train_organism(name: str, out: str | Path | None = None, steps: int | None = None, threads: int | None = None,
                   resume: bool = True, progress=None, log=None, every: int = EVERY) -> Path:
    """Train organism `name` from its recipe and write its adapter folder (`out`, default the shipped
    organisms/data/<name>/), its lineage (`<out>/lineage/`) and the plain-forward reference of its known-answer
    prompts (for an organism trained on a part of its split, whose known answers are read on the held-out part, that
    is `python -m organisms.reference NAME`'s work). Checkpoints go to `checkpoint_folder(name)` (a `steps` override
    to `<name>-steps<k>`) every `every` steps; with `resume` a run stopped before goes on from its last one.
    `progress(step, loss)` per step, `log(line)` for what it says. Returns the adapter folder."""
    from engine.loading import load_model
    from organisms.recipes import organism
    from organisms.reference import KNOWN_ANSWER_READOUTS, REFERENCE_FILE, write_reference

    say = log or (lambda _line: None)
    org = organism(name)
    if steps is not None:
        org = dataclasses.replace(org, steps=steps)
    if threads is not None:
        torch.set_num_threads(threads)
    lm = load_model(org.base, device="cpu", dtype="float32")
    exs = examples(org, lm)
    folder = checkpoint_folder(name if steps is None else f"{name}-steps{steps}")
    fitted = fit_resumable(lm, org, folder, exs=exs, base_key=Path(lm.facts.path).name, every=every, resume=resume,
                           progress=progress, log=log)
    out = Path(out) if out else SHIPPED / name
    T.save(fitted, org, out)
    if org.lineage:
        target = out / LINEAGE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(folder / LINEAGE, target)
    if name in KNOWN_ANSWER_READOUTS and org.part is None:
        write_reference(out, org, exs)
    elif name in KNOWN_ANSWER_READOUTS:  # the held-out reads take long: a command of their own, resumable
        (out / REFERENCE_FILE).unlink(missing_ok=True)  # of the weights this training replaced
        say(f"{name}: write its held-out reference with `python -m organisms.reference {name}`")
    return out



def retrain(name: str, out: str | Path | None = None, steps: int | None = None, threads: int | None = None,
            resume: bool = True, progress=None, log=None) -> tuple[Path, float | None]:
    """Train organism `name` as its recipe asks (`readout organism train`): a recipe that streams its frozen layers,
    keeps a lineage or trains on a whole part of a split (runs longer than a sitting) through `train_organism`
    (checkpointed, resumable), any other in one go through `train.fit`, the
    way its shipped adapter was made. Returns the adapter folder and, for the latter, the largest mean training error
    of a readout and cell (None for the former, whose error is recorded in its organism.json)."""
    from engine.loading import load_model
    from organisms.recipes import organism
    from organisms.reference import write_reference

    org = organism(name)
    if org.stream or org.lineage or org.part is not None:
        return train_organism(name, out, steps=steps, threads=threads, resume=resume, progress=progress, log=log), None
    if not resume:
        from engine.errors import ReadoutError

        raise ReadoutError(f"--afresh: organism {name} trains in one go, without checkpoints to resume from")
    if steps is not None:
        org = dataclasses.replace(org, steps=steps)
    if threads is not None:
        torch.set_num_threads(threads)
    lm = load_model(org.base, device="cpu", dtype="float32")
    exs = examples(org, lm)
    fitted = T.fit(lm, org, progress=progress, examples_=exs, base_key=Path(lm.facts.path).name)  # folder: name, version
    folder = T.save(fitted, org, Path(out) if out else SHIPPED / name)
    if log is not None:
        log(f"{name}: plain-forward reference of the known-answer prompts ...")
    write_reference(folder, org, exs)
    return folder, max(v["mean_abs_error"] for v in T.error_summary(fitted.errors).values())

def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m organisms.resumable", description="Train (or resume) an organism.")
    ap.add_argument("name")
    ap.add_argument("--out", default=None, help="adapter folder (default organisms/data/NAME)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--afresh", action="store_true", help="ignore a checkpoint left by a stopped run")
    args = ap.parse_args(argv)
    clock = [time.perf_counter()]

    def progress(step, loss):
        now = time.perf_counter()
        print(f"step {step + 1} loss {loss:.4f} {now - clock[0]:.1f}s", flush=True)
        clock[0] = now

    out = train_organism(args.name, args.out, args.steps, args.threads, resume=not args.afresh, progress=progress,
                         log=lambda line: print(line, flush=True))
    print(f"{args.name}: written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
