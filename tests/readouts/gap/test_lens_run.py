"""`readout lens train` and a depth run through its lens (`readout run --readouts D,J0,depth --lens FILE`), against
references computed here: every tuned-lens depth row from `output_hidden_states` of a plain forward, translated by
the file's own tensors (read with safetensors), normed and put through the head by hand, and its KL to the final
layer by scipy; on SmolLM2, a lens trained for a few minutes' worth of steps (scaled down) is closer to the final
layer than the logit lens on held-out scenarios."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from scipy.special import log_softmax, rel_entr

from cli.main import main
from contract.tables import DEPTH
from stats.depth.report import run_depth_report
from tests.helpers import DEPTH_PROFILE, FRAME_OF, depth_prompt, forward_states, get_model, letter_mass_of

MODEL = "tiny-llama3"


def _cli(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


@pytest.fixture(scope="module")
def lens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lens") / "tiny.safetensors"
    with pytest.raises(SystemExit) as e:
        main(["lens", "train", "--model", MODEL, "--out", str(path), "--steps", "20", "--scenarios", "8", "--no-progress"])
    assert e.value.code == 0
    return path


@pytest.fixture(scope="module")
def lens_run(lens_file, tmp_path_factory):
    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.gap import profile as gap_profile
    from readouts.gap.study import GapStudy

    out = tmp_path_factory.mktemp("lensrun") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, DEPTH_PROFILE.name, DEPTH_PROFILE)
        run_study(GapStudy(readouts="D,J0,depth", lens=str(lens_file)),
                  RunOptions(model=ModelOptions(MODEL), profile=DEPTH_PROFILE.name, limit=3, out=str(out), progress=False),
                  log=lambda _: None)
    return out


def test_tuned_rows_equal_a_plain_forward_through_the_files_translators(lens_run, lens_file):
    from panels.schema import load_panel

    lm = get_model(MODEL)
    model = lm.model
    tensors = load_file(str(lens_file))
    delta, bias = tensors["delta"].double().numpy(), tensors["bias"].double().numpy()
    assert np.abs(delta).max() > 0  # trained: not the logit lens
    panel = {s.id: s for s in load_panel("gap-v2").records}
    df = pd.read_parquet(lens_run / DEPTH.file)
    DEPTH.check(df, "depth")
    n = model.config.num_hidden_layers
    assert set(df.lens) == {"logit", "tuned"} and len(df[df.lens == "tuned"]) == len(df[df.lens == "logit"])
    w = model.get_output_embeddings().weight.detach().double().numpy()
    checked = 0
    for (sid, cell, readout, _), rows in list(df.groupby(["scenario_id", "cell", "readout", "order_index"]))[:4]:
        ids, _ = depth_prompt(lm, panel[sid], FRAME_OF[readout], cell, rows.order.iloc[0])
        out = forward_states(model, ids)
        final = log_softmax(out.logits[0, -1].double().numpy())
        for row in rows.itertuples():
            if row.layer < n:
                h = out.hidden_states[row.layer][0, -1].double().numpy()
                if row.lens == "tuned":
                    h = h + delta[row.layer] @ h + bias[row.layer]
                with torch.inference_mode():
                    logits = torch.tensor(model.base_model.norm(torch.tensor(h, dtype=torch.float32)).double().numpy() @ w.T)
            else:
                logits = out.logits[0, -1].double()
            want = letter_mass_of(lm, logits, row.letters)
            assert max(abs(a - b) / b for a, b in zip(want, row.mass)) < 1e-4, (sid, row.lens, row.layer)
            kl = rel_entr(np.exp(final), np.exp(log_softmax(logits.numpy()))).sum()
            assert abs(row.kl_final - kl) < 1e-3 + 1e-3 * kl, (sid, row.lens, row.layer, row.kl_final, kl)
            checked += 1
    assert checked == 4 * 2 * (n + 1)
    manifest = json.loads((lens_run / "manifest.json").read_text())
    import hashlib

    assert manifest["tuned_lens"]["sha256"] == hashlib.sha256(lens_file.read_bytes()).hexdigest()
    assert manifest["tuned_lens"]["model"]["name"] == MODEL


def test_stats_write_each_lens_and_its_kl(lens_run):
    lines = run_depth_report(lens_run, out_dir=lens_run / "stats", n_boot=200)
    layers = pd.read_csv(lens_run / "stats" / "depth_layers.csv")
    assert set(layers.lens) == {"logit", "tuned"}
    kl = pd.read_csv(lens_run / "stats" / "depth_lens_kl.csv")
    df = pd.read_parquet(lens_run / DEPTH.file)
    want = df.groupby(["lens", "layer"]).kl_final.mean()
    for row in kl.itertuples():
        assert abs(row.mean - want[(row.lens, row.layer)]) < 1e-12
    assert (kl[kl.layer == kl.layer.max()]["mean"].abs() < 1e-4).all()
    assert any(line.startswith("depth (tuned lens): ") for line in lines)
    assert any("mean KL(final || lens)" in line for line in lines)
    assert (lens_run / "stats" / "depth_lens_kl.png").is_file()


def test_lens_errors_are_one_line(lens_file, tmp_path, capsys):
    code, _, err = _cli(["run", "--model", MODEL, "--readouts", "D,J0", "--lens", str(lens_file), "--limit", "1",
                         "--out", str(tmp_path / "a"), "--no-progress"], capsys)
    assert code == 2 and "--lens: reads the depth tables" in err and len(err.strip().splitlines()) == 1
    code, _, err = _cli(["run", "--model", "tiny-olmo3", "--readouts", "D,depth", "--lens", str(lens_file), "--limit", "1",
                         "--out", str(tmp_path / "b"), "--no-progress"], capsys)
    assert code == 2 and f"--lens: {lens_file}: model.name is 'tiny-llama3', this run's is 'tiny-olmo3'" in err
    assert len(err.strip().splitlines()) == 1
    code, out, _ = _cli(["lens", "show", str(lens_file)], capsys)
    assert code == 0 and "held-out KL(final || lens)" in out


def test_a_base_models_lens_is_refused_with_an_adapter_merged(lens_file, adapter, tmp_path, capsys):  # noqa: F811
    from engine.loading import load_model
    from engine.tuned_lens import TunedLens
    from readouts.lens import lens_model_meta

    folder, _ = adapter
    merged = load_model(MODEL, device="cpu", adapter=str(folder))
    fingerprint = lens_model_meta(merged)["adapter"]
    assert fingerprint and fingerprint == merged.facts.adapter["weights_fingerprint"]
    assert TunedLens.load(lens_file).meta["model"]["adapter"] is None
    code, _, err = _cli(["run", "--model", MODEL, "--peft", str(folder), "--readouts", "D,depth", "--lens", str(lens_file),
                         "--limit", "1", "--out", str(tmp_path / "c"), "--no-progress"], capsys)
    assert code == 2 and f"model.adapter is None, this run's is '{fingerprint}'" in err


@pytest.mark.smollm
def test_a_smollm2_lens_beats_the_logit_lens_on_held_out_scenarios(tmp_path, capsys):
    path = tmp_path / "smol.safetensors"
    code, out, _ = _cli(["lens", "train", "--model", "smollm2-135m", "--out", str(path), "--steps", "10", "--batch", "16",
                         "--scenarios", "10", "--held-out", "3", "--no-progress"], capsys)
    assert code == 0
    from engine.tuned_lens import TunedLens

    meta = TunedLens.load(path).meta
    logit, tuned = np.array(meta["held_out_kl"]["logit"][:-1]), np.array(meta["held_out_kl"]["tuned"][:-1])
    assert len(logit) == 30 and meta["held_out_positions"] > 80
    assert set(meta["panel"]["train"]).isdisjoint(meta["panel"]["held_out"])
    assert tuned.mean() < 0.7 * logit.mean(), (logit, tuned)
    assert (tuned < logit).mean() >= 0.9, (logit, tuned)
    assert f"{29:>5}" in out


def test_the_lens_trains_on_the_recorded_training_part_and_reports_the_read_positions(lens_file):
    """gap-v2 has a recorded split: the lens trains on read prompts of `train` scenarios only, is measured on the
    `validation` slice (never `held-out`), and records its KL at the measured prompts' read positions per depth."""
    from engine.tuned_lens import TunedLens
    from panels.split import load_split

    meta = TunedLens.load(lens_file).meta
    split = load_split("gap-v2")
    assert meta["panel"]["split"].startswith("recorded split")
    assert meta["panel"]["train"] and set(meta["panel"]["train"]) <= set(split.ids("train"))
    assert meta["panel"]["held_out"] and set(meta["panel"]["held_out"]) <= set(split.ids("validation"))
    depths = len(meta["held_out_kl"]["logit"])
    assert len(meta["read_position_kl"]["logit"]) == len(meta["read_position_kl"]["tuned"]) == depths
    assert meta["read_positions"] == 4 * len(meta["panel"]["held_out"])  # two frames x primary and twin
