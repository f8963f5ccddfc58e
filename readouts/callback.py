"""Measuring while a model trains: a transformers `TrainerCallback` (also for the trainers built on `Trainer`, such as
TRL's SFT and DPO trainers) that reads the gap study's first-token readouts from the model being trained.

At step 0 and every `every` steps it runs the judgment-action study with the readouts D, J0 and the known-gap control
(the twins ride along; nothing is generated) on the panel subset it is given, on the model as it is in memory
(adapters included), through the same driver as `readout run`: each evaluation is a run directory
`<output_dir>/readouts/step-<step>/` whose tables equal those `readout run` writes for the checkpoint saved at that
step. From them it logs, through the trainer's own `log` (so the console, TensorBoard or W&B get them with the step):
E_J0 (the paired excess with the letter-only judgment J0 in place of J) with its bootstrap interval, the known-gap
control move with its interval, and the letter mass of each readout; `<output_dir>/readouts/metrics.csv` holds one row
per evaluation.

The model is read in eval mode under `torch.no_grad()` and its training mode is restored afterwards; the random
states of torch (CPU and CUDA), Python's `random` and NumPy's global generator are saved before and restored after,
so the training's random stream (dropout, data order) is the one it would have been without the callback.
"""

from __future__ import annotations

import csv
import io
import math
import random
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import TrainerCallback

from readouts.atomic import atomic_write_bytes

READOUTS = "D,J0,control"
"""The readout groups an evaluation reads: first-token readouts only (the twins always ride along)."""
PREFIX = "readout"
"""The logged metrics' prefix: `readout/E_J0`, `readout/control_move`, ..."""


def first_token_metrics(run_dir: str | Path, *, seed: int = 0, n_boot: int = 2000, mass_floor: float | None = None) -> dict:
    """What an evaluation logs, from a gap run directory holding D, J0 and control: E_J0 = mean over scenarios of
    (p_D - p_J0) on the primary minus the same on the twin, with its percentile bootstrap interval; the control move
    p_D(control) - p_J0 on the primary with its interval; the mean p_violating and the mean total letter mass of each
    readout. `mass_floor`: only scenarios whose readouts all have at least this letter mass enter E_J0 and the control
    move (None: every scenario). Each bootstrap draws from its own generator (seed, quantity)."""
    from stats.core.bootstrap import estimates_from
    from stats.core.seeding import rng_for
    from stats.gap.control import control_move
    from stats.gap.names import CONTROL, J0, PRIMARY, TWIN, D
    from stats.gap.tables import load_run

    run = load_run(run_dir)

    def col(cell, readout, field="p_violating"):
        return run.col(cell, readout, field) if run.has(readout, cell) else np.full(run.n, np.nan)

    def floor_ok(cells, readouts):
        ok = np.ones(run.n, dtype=bool)
        if mass_floor is not None:
            for cell in cells:
                for r in readouts:
                    ok &= np.nan_to_num(col(cell, r, "letter_mass"), nan=-1.0) >= mass_floor
        return ok

    out: dict[str, float] = {}
    excess = (col(PRIMARY, D) - col(PRIMARY, J0)) - (col(TWIN, D) - col(TWIN, J0))
    move = control_move(run) if run.has(CONTROL) and run.has(J0) else np.full(run.n, np.nan)
    for name, values, ok in (("E_J0", excess, floor_ok((PRIMARY, TWIN), (D, J0))),
                             ("control_move", move, floor_ok((PRIMARY,), (CONTROL, J0)))):
        keep = ok & ~np.isnan(values)
        est = estimates_from("callback", "all" if mass_floor is None else f"letter mass >= {mass_floor}", [name],
                             values[keep], rng_for(seed, "callback", name), n_boot)[0]
        out[name] = _num(est.value)
        out[f"{name}_low"] = _num(est.low)
        out[f"{name}_high"] = _num(est.high)
        out[f"{name}_n"] = int(est.n)
    for cell, suffix in ((PRIMARY, ""), (TWIN, "_twin")):
        for readout in (D, J0, CONTROL):
            if cell == TWIN and readout == CONTROL:
                continue
            out[f"p_{readout}{suffix}"] = _mean(col(cell, readout))
            out[f"letter_mass_{readout}{suffix}"] = _mean(col(cell, readout, "letter_mass"))
    return out


def _num(x) -> float:
    return math.nan if x is None else float(x)


def _mean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else math.nan


@contextmanager
def kept_random_state():
    """Restores, on leaving, the random states of torch (CPU and every initialized CUDA device), Python's `random` and
    NumPy's global generator to what they were on entering."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        np.random.set_state(npy)


@contextmanager
def eval_mode(model):
    """`model` in eval mode under no_grad; each module's training flag restored on leaving."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for m, training in modes:
            m.training = training


class ReadoutCallback(TrainerCallback):
    """Reads D, J0 and the known-gap control (with their twins) from the model being trained, at step 0 and every
    `every` steps, and logs E_J0 with its interval, the control move and the letter masses through `trainer.log`.

        trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
        trainer.add_callback(ReadoutCallback(trainer, every=50, panel="gap-v2", limit=20))
        trainer.train()

    `panel`, `profile`, `overrides` (`--set` items), `limit` and `seed` choose what is read, as `readout run`'s options
    of the same names do: `readout run --model <checkpoint-N> --readouts D,J0,control` with them gives the same tables.
    `out`: where the evaluations go (default `<args.output_dir>/readouts`). `n_boot`, `mass_floor`: the intervals'
    resamples and the letter-mass floor of the scenarios that enter them (None: all). `tokenizer`: default the
    trainer's `processing_class`. `name`: the model's name in each run's manifest. `print_fn` gets one line per
    evaluation with its cost in seconds (None: silent)."""

    def __init__(self, trainer=None, *, every: int, panel: str | None = None, profile: str = "quick",
                 overrides: Sequence[str] = (), limit: int | None = None, seed: int | None = None,
                 readouts: str = READOUTS, out: str | Path | None = None, n_boot: int = 2000,
                 mass_floor: float | None = None, tokenizer=None, name: str = "training",
                 prefix: str = PREFIX, print_fn: Callable[[str], None] | None = print):
        from engine.errors import ReadoutError
        from readouts.gap.study import parse_readouts

        if every < 1:
            raise ReadoutError(f"every: must be >= 1, got {every}")
        groups = parse_readouts(readouts, True)
        if any(g not in ("D", "J0", "control") for g in groups):
            raise ReadoutError(f"readouts: '{readouts}': the callback reads first-token readouts only (D, J0, control)")
        self.trainer, self.every, self.panel, self.profile = trainer, every, panel, profile
        self.overrides, self.limit, self.seed, self.readouts = tuple(overrides), limit, seed, readouts
        self.out, self.n_boot, self.mass_floor, self.tokenizer = out, n_boot, mass_floor, tokenizer
        self.name, self.prefix, self.print_fn = name, prefix, print_fn
        self.history: list[dict] = []
        """One dict per evaluation: step, seconds and the metrics logged."""
        self._earlier: list[dict] | None = None

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step == 0:
            self._evaluate(args, state, control, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step % self.every == 0:
            self._evaluate(args, state, control, model, processing_class)

    def folder(self, args) -> Path:
        """Where the evaluations' run directories and metrics.csv go."""
        return Path(self.out) if self.out is not None else Path(args.output_dir) / "readouts"

    def _evaluate(self, args, state, control, model, processing_class) -> None:
        if not state.is_world_process_zero:
            return
        step = state.global_step
        metrics, seconds = self.evaluate(model, self.tokenizer or processing_class, step, self.folder(args))
        row = {"step": step, "seconds": round(seconds, 3), **metrics}
        self.history.append(row)
        self._write_table(self.folder(args))
        logs = {f"{self.prefix}/{k}": v for k, v in row.items() if k != "step"}
        if self.trainer is not None:
            flags = (control.should_log, control.should_evaluate, control.should_save)
            self.trainer.log(logs)  # its on_log event clears should_log: the step's own loss line must still come
            control.should_log, control.should_evaluate, control.should_save = flags
        else:  # no trainer to log through: the entry `trainer.log` would have added
            state.log_history.append({**logs, "step": step})
        if self.print_fn is not None:
            self.print_fn(f"readout: step {step}: E_J0 {_fmt(row['E_J0'])} [{_fmt(row['E_J0_low'])}, "
                          f"{_fmt(row['E_J0_high'])}] n={row['E_J0_n']}, control move {_fmt(row['control_move'])}, "
                          f"letter mass D {_fmt(row['letter_mass_D'])}; {seconds:.2f} s")

    def evaluate(self, model, tokenizer, step: int, folder: Path) -> tuple[dict, float]:
        """One evaluation of `model` as it is now into `folder/step-<step>`: (metrics, seconds it took)."""
        from engine.loading import from_memory
        from readouts.driver import ModelOptions, RunOptions, run
        from readouts.gap.study import GapStudy

        if tokenizer is None:
            from engine.errors import ReadoutError

            raise ReadoutError("tokenizer: the callback needs one (pass tokenizer=, or give the trainer processing_class=)")
        run_dir = folder / f"step-{step:06d}"
        t0 = time.perf_counter()
        with kept_random_state(), eval_mode(model):
            if run_dir.exists():  # a previous training's evaluation at this step: these weights are read afresh
                shutil.rmtree(run_dir)
            lm = from_memory(model, tokenizer, name=f"{self.name}@step-{step}")  # a peft model with its adapter
            options = RunOptions(model=ModelOptions(model=lm.facts.name, loaded=lm), panel=self.panel, profile=self.profile,
                                 overrides=self.overrides, limit=self.limit, out=str(run_dir), seed=self.seed,
                                 progress=False, shard=(0, 1))
            run(GapStudy(readouts=self.readouts), options, log=lambda _line: None)
            metrics = first_token_metrics(run_dir, seed=self.seed or 0, n_boot=self.n_boot, mass_floor=self.mass_floor)
        return metrics, time.perf_counter() - t0

    def _write_table(self, folder: Path) -> None:
        """metrics.csv: a row per evaluation; a training resumed from a checkpoint keeps the rows before its first."""
        path = folder / "metrics.csv"
        if self._earlier is None:
            first = self.history[0]["step"]
            self._earlier = [r for r in csv.DictReader(path.open()) if int(r["step"]) < first] if path.exists() else []
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(self.history[0]), extrasaction="ignore")
        writer.writeheader()
        writer.writerows([*self._earlier, *self.history])
        atomic_write_bytes(path, buf.getvalue().encode())


def _fmt(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.4f}"
