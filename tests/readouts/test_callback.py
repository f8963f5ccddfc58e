"""The training callback (readouts/callback.py) in a real transformers `Trainer`: its logged values at each evaluation
step equal `readout run` on the checkpoint saved at that step, and training with it gives the loss curve training
without it gives (dropout on, so a callback that drew from the random stream would change it)."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest

from tests.helpers import ROOT, cli
from tests.readouts.training import EVAL_LIMIT, EVAL_SET, losses, make_trainer, tiny_model

pytestmark = pytest.mark.heavy

STEPS, EVERY = 4, 2
TOL = 1e-5


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The same training twice, without and with the callback; the model before training saved as `initial`."""
    from readouts.callback import ReadoutCallback

    root = tmp_path_factory.mktemp("train")
    model, tok, _ = tiny_model()
    plain = make_trainer(model, tok, root / "plain", steps=STEPS, save_steps=EVERY)
    plain.train()
    model, tok, _ = tiny_model()
    model.save_pretrained(root / "initial")
    tok.save_pretrained(root / "initial")
    lines = []
    trainer = make_trainer(model, tok, root / "with", steps=STEPS, save_steps=EVERY)
    callback = ReadoutCallback(trainer, every=EVERY, limit=EVAL_LIMIT, overrides=EVAL_SET, print_fn=lines.append)
    trainer.add_callback(callback)
    trainer.train()
    return {"root": root, "plain": plain, "trainer": trainer, "callback": callback, "lines": lines, "model": model}


def _readout_run(model_dir, out, capsys):
    argv = ["run", "--model", str(model_dir), "--readouts", "D,J0,control", "--limit", str(EVAL_LIMIT), "--out", str(out),
            "--no-progress"]
    for item in EVAL_SET:
        argv += ["--set", item]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    return out


def test_loss_curve_unchanged(trained):
    """The callback leaves the random stream and the model as they were: every step's loss is the same."""
    a, b = losses(trained["plain"]), losses(trained["trainer"])
    assert len(a) == STEPS and a == b


def test_logged_values_equal_readout_run_of_each_checkpoint(trained, tmp_path, capsys):
    from readouts.callback import first_token_metrics

    root, cb = trained["root"], trained["callback"]
    assert [h["step"] for h in cb.history] == [0, 2, 4]
    logged = {h["step"]: h for h in trained["trainer"].state.log_history if "readout/E_J0" in h}
    assert sorted(logged) == [0, 2, 4]
    for step in (0, 2, 4):
        folder = root / "initial" if step == 0 else root / "with" / f"checkpoint-{step}"
        ref_dir = _readout_run(folder, tmp_path / f"ref-{step}", capsys)
        ref = first_token_metrics(ref_dir, n_boot=cb.n_boot)
        for key, value in ref.items():
            got = logged[step][f"readout/{key}"]
            assert got == pytest.approx(value, abs=TOL, nan_ok=True), (step, key)
        own = pd.read_parquet(root / "with" / "readouts" / f"step-{step:06d}" / "probes.parquet")
        theirs = pd.read_parquet(ref_dir / "probes.parquet")
        key = ["scenario_id", "cell", "readout", "frame", "order_index", "rollout"]
        m = own.merge(theirs, on=key, suffixes=("", "_ref"))
        assert len(m) == len(own) == len(theirs) > 0
        assert np.abs(m.p_violating - m.p_violating_ref).max() <= TOL
        assert np.abs(m.letter_mass - m.letter_mass_ref).max() <= TOL
    # The values moved with training (a callback reading a frozen copy would log the same thing three times).
    assert logged[0]["readout/letter_mass_D"] != logged[4]["readout/letter_mass_D"]


def test_table_and_cost_per_evaluation(trained):
    folder = trained["root"] / "with" / "readouts"
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 2, 4]
    assert all(float(r["seconds"]) > 0 for r in rows)
    assert sorted(p.name for p in folder.glob("step-*")) == ["step-000000", "step-000002", "step-000004"]
    assert len(trained["lines"]) == 3 and all(line.rstrip().endswith(" s") for line in trained["lines"])
    assert "readout/seconds" in next(h for h in trained["trainer"].state.log_history if "readout/E_J0" in h)


def test_training_mode_weights_and_random_state_restored(tmp_path, monkeypatch):
    """An evaluation leaves every module's training flag, every weight and the random states as they were, even when
    what it runs draws from torch's, Python's and NumPy's global generators."""
    import random

    import torch

    import readouts.driver
    from readouts.callback import ReadoutCallback

    real_run = readouts.driver.run

    def drawing_run(*args, **kwargs):
        torch.rand(3), random.random(), np.random.rand(2)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(readouts.driver, "run", drawing_run)
    py_state, np_state = random.getstate(), np.random.get_state()[1].copy()

    model, tok, _ = tiny_model()
    model.train()
    model.model.layers[0].eval()  # a mixed state, restored module by module
    flags = [m.training for m in model.modules()]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cb = ReadoutCallback(every=1, limit=1, overrides=EVAL_SET, print_fn=None)
    state = torch.get_rng_state()
    cb.evaluate(model, tok, 0, tmp_path)
    assert [m.training for m in model.modules()] == flags
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), state)
    assert random.getstate() == py_state and np.array_equal(np.random.get_state()[1], np_state)
    assert all(p.grad is None for p in model.parameters())


def test_refuses_generated_readouts():
    from engine.errors import ReadoutError
    from readouts.callback import ReadoutCallback

    with pytest.raises(ReadoutError, match="first-token readouts only"):
        ReadoutCallback(every=2, readouts="D,J")
    with pytest.raises(ReadoutError, match="every"):
        ReadoutCallback(every=0)


@pytest.mark.slow
@pytest.mark.smollm
def test_lora_on_smollm2(tmp_path, capsys):
    """A LoRA on the embedded SmolLM2 trained a few steps: the callback's values at each saved step equal
    `readout run --peft checkpoint-<step>` within 1e-5."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.embedded import ensure_smollm2
    from readouts.callback import ReadoutCallback, first_token_metrics

    folder = ensure_smollm2()
    tok = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)  # as `readout run` loads it on CPU
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))
    trainer = make_trainer(model, tok, tmp_path / "lora", steps=2, save_steps=2, lr=5e-3)
    cb = ReadoutCallback(trainer, every=2, limit=EVAL_LIMIT, overrides=EVAL_SET, print_fn=None)
    trainer.add_callback(cb)
    trainer.train()
    logged = {h["step"]: h for h in trainer.state.log_history if "readout/E_J0" in h}
    argv = ["run", "--model", "smollm2-135m", "--peft", str(tmp_path / "lora" / "checkpoint-2"), "--readouts", "D,J0,control",
            "--limit", str(EVAL_LIMIT), "--out", str(tmp_path / "ref"), "--no-progress"]
    for item in EVAL_SET:
        argv += ["--set", item]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    for key, value in first_token_metrics(tmp_path / "ref", n_boot=cb.n_boot).items():
        assert logged[2][f"readout/{key}"] == pytest.approx(value, abs=TOL, nan_ok=True), key


def test_the_documented_example_runs(tmp_path):
    """examples/measure_during_training.py, the page's example, at tiny size: two evaluations logged and tabled."""
    import runpy

    example = runpy.run_path(str(ROOT / "examples" / "measure_during_training.py"))
    example["main"](["--model", "tiny-qwen2", "--out", str(tmp_path / "out"), "--steps", "2", "--every", "2", "--limit", "1"])
    rows = list(csv.DictReader((tmp_path / "out" / "readouts" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 2]
    assert (tmp_path / "out" / "checkpoint-2" / "model.safetensors").is_file()


def test_metrics_are_the_tables_means(trained):
    """E_J0, the control move, p and letter mass of an evaluation, recomputed from its scenarios table by hand."""
    from readouts.callback import first_token_metrics

    run = trained["root"] / "with" / "readouts" / "step-000004"
    df = pd.read_parquet(run / "scenarios.parquet").set_index(["scenario_id", "cell", "readout"])
    p = df.p_violating.unstack(["cell", "readout"])
    got = first_token_metrics(run, n_boot=200)
    e = (p["primary", "D"] - p["primary", "J0"]) - (p["twin", "D"] - p["twin", "J0"])
    assert got["E_J0"] == pytest.approx(e.mean(), abs=1e-12) and got["E_J0_n"] == len(e) == EVAL_LIMIT
    assert got["E_J0_low"] <= got["E_J0"] <= got["E_J0_high"]
    assert got["control_move"] == pytest.approx((p["primary", "control"] - p["primary", "J0"]).mean(), abs=1e-12)
    assert got["p_D_twin"] == pytest.approx(p["twin", "D"].mean(), abs=1e-12)
    mass = df.letter_mass.unstack(["cell", "readout"])
    assert got["letter_mass_J0"] == pytest.approx(mass["primary", "J0"].mean(), abs=1e-12)


def test_a_resumed_training_keeps_the_earlier_rows(tmp_path):
    """Training resumed from checkpoint-4 evaluates from step 6 on: metrics.csv keeps steps 0, 2 and 4 from before and
    drops the rows of the earlier training past its resume point."""
    from readouts.callback import ReadoutCallback

    before = ReadoutCallback(every=2, print_fn=None)
    before.history = [{"step": s, "seconds": 1.0, "E_J0": s / 10} for s in (0, 2, 4, 6, 8)]
    before._write_table(tmp_path)
    after = ReadoutCallback(every=2, print_fn=None)
    after.history = [{"step": 6, "seconds": 2.0, "E_J0": 0.66}]
    after._write_table(tmp_path)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [(int(r["step"]), float(r["E_J0"])) for r in rows] == [(0, 0.0), (2, 0.2), (4, 0.4), (6, 0.66)]
    after.history.append({"step": 8, "seconds": 2.0, "E_J0": 0.88})
    after._write_table(tmp_path)
    assert [int(r["step"]) for r in csv.DictReader((tmp_path / "metrics.csv").open())] == [0, 2, 4, 6, 8]


def test_an_adapter_being_trained_is_read_with_its_adapter(tmp_path, capsys):
    """A peft-wrapped model (LoRA on tiny-llama3, unmerged, as a trainer holds it) reads as `readout run --peft` of the
    saved adapter does, within 1e-5."""
    from transformers import AutoTokenizer

    from engine.tiny import ensure_tiny
    from readouts.callback import ReadoutCallback
    from tests.helpers import make_adapter

    folder, peft_model = make_adapter(tmp_path / "adapter")
    tok = AutoTokenizer.from_pretrained(ensure_tiny("tiny-llama3"))
    cb = ReadoutCallback(every=1, limit=EVAL_LIMIT, overrides=EVAL_SET, print_fn=None)
    cb.evaluate(peft_model, tok, 0, tmp_path / "evals")
    argv = ["run", "--model", "tiny-llama3", "--peft", str(folder), "--readouts", "D,J0,control", "--limit", str(EVAL_LIMIT),
            "--out", str(tmp_path / "ref"), "--no-progress"]
    for item in EVAL_SET:
        argv += ["--set", item]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    own = pd.read_parquet(tmp_path / "evals" / "step-000000" / "probes.parquet")
    ref = pd.read_parquet(tmp_path / "ref" / "probes.parquet")
    assert len(own) == len(ref) > 0
    assert np.abs(own.p_violating.to_numpy() - ref.p_violating.to_numpy()).max() <= TOL
    assert np.abs(own.letter_mass.to_numpy() - ref.letter_mass.to_numpy()).max() <= TOL


def test_the_python_api_scores_a_peft_wrapped_model(adapter):
    """readouts.api.score_prompts on an unmerged peft model equals the same prompts on the adapter merged."""
    import copy

    from transformers import AutoTokenizer

    from engine.tiny import ensure_tiny
    from readouts.api import score_prompts

    _, peft_model = adapter
    tok = AutoTokenizer.from_pretrained(ensure_tiny("tiny-llama3"))
    prompts = ["Pick one. A) stay B) go C) wait", "Which is right, A or B?"]
    wrapped = score_prompts(peft_model, tok, prompts, letters="ABC")
    merged = score_prompts(copy.deepcopy(peft_model).merge_and_unload(), tok, prompts, letters="ABC")
    for a, b in zip(wrapped, merged):
        assert a["mass"].keys() == b["mass"].keys() == set("ABC")
        assert all(abs(a["mass"][k] - b["mass"][k]) <= 1e-6 for k in "ABC")
