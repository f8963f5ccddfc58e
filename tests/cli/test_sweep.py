"""`readout sweep`: the gap study over three tiny checkpoints with different weights writes three run directories
(each manifest naming its role and the sweep's registry file) and one comparison with three stages in step order;
a re-run skips the finished runs and resumes a killed one. Also how checkpoints are listed and given roles."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from engine.errors import ReadoutError
from engine.registry import USER_MODELS_ENV
from engine.tiny import ensure_tiny
from readouts.sweep import Checkpoint, listed, plan, stage_order

QUICK = ["--readouts", "D,J", "--limit", "6", "--set", "orders.D=2", "--set", "j_samples=1", "--set", "j_budget=8",
         "--no-progress", "--n-boot", "50", "--mass-floor", "0"]


@pytest.fixture(autouse=True)
def _no_user_files(monkeypatch):
    monkeypatch.delenv(USER_MODELS_ENV, raising=False)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Three copies of tiny-llama3, named by training step, with different weights."""
    import torch
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("ckpts")
    for k, step in enumerate((100, 200, 300)):
        folder = root / f"step-{step}"
        shutil.copytree(ensure_tiny("tiny-llama3"), folder)
        if k:
            model = AutoModelForCausalLM.from_pretrained(folder)
            gen = torch.Generator().manual_seed(k)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.05 * k)
            model.save_pretrained(folder)
    return root


def sweep(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sweep", *argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.heavy  # three checkpoints' runs, a comparison, a rerun
def test_sweep_over_three_checkpoints_then_rerun(ckpts, tmp_path, capsys):
    out = tmp_path / "sw"
    # listed out of step order: compare orders the stages by the step their names carry
    models = [a for s in (300, 100, 200) for a in ("--model", str(ckpts / f"step-{s}"))]
    code, stdout, err = sweep([*models, "--lineage", "tiny", "--out", str(out), *QUICK], capsys)
    assert code == 0, err
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["step-100", "step-200", "step-300"]
    for name in runs:
        manifest = json.loads((out / "runs" / name / "manifest.json").read_text())
        assert manifest["complete"] and manifest["model"]["name"] == name
        assert (manifest["model"]["lineage"], manifest["model"]["stage"]) == ("tiny", name)
        assert manifest["model"]["path"] == str((ckpts / name).resolve())
        assert manifest["model_registry"]["file"] == str((out / "sweep.toml").absolute())
    est = pd.read_csv(out / "compare" / "compare_estimates.csv")
    sw = est[est["analysis"] == "sweep tiny"]
    e = sw[sw["quantity"].str.startswith("E ") & (sw["subset"] == "unscreened")].set_index("quantity")
    assert list(e.index) == ["E step-100", "E step-200", "E step-300"] and (e["n"] > 0).all()
    assert e["value"].nunique() == 3  # three different checkpoints, three different readings
    assert {"step-200 - step-100", "step-300 - step-200", "step-300 - step-100"} <= set(sw["quantity"])
    assert (out / "compare" / "checkpoint_sweep_tiny.png").is_file()
    assert "sweep tiny: E step-100" in stdout
    report = (out / "compare" / "compare_report.md").read_text()
    assert "Checkpoint sweep: tiny" in report

    # `readout compare OUT/runs/*` with the sweep's --n-boot and --mass-floor reproduces its comparison; at the
    # default floor every tiny checkpoint (letter mass ~1e-5) is named in a warning suggesting --mass-floor
    dirs = [str(out / "runs" / f"step-{s}") for s in (300, 100, 200)]  # the sweep's order
    with pytest.raises(SystemExit) as exc:
        main(["compare", *dirs, "--out", str(tmp_path / "again"), "--n-boot", "50", "--mass-floor", "0"])
    again = capsys.readouterr().out
    assert exc.value.code == 0 and again.replace(str(tmp_path / "again"), str(out / "compare")) == stdout
    assert "mass floor 0" in stdout and "warning:" not in stdout
    with pytest.raises(SystemExit) as exc:
        main(["compare", *dirs, "--out", str(tmp_path / "again"), "--n-boot", "50"])
    warnings = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning:")]
    assert exc.value.code == 0 and [w.split(" (")[0] for w in warnings] == [f"warning: {Path(d).name}" for d in dirs]
    assert all("the mass floor 0.5 removes" in w and "--mass-floor" in w for w in warnings), warnings

    # A re-run skips the three finished runs (nothing is loaded or recomputed) and compares again.
    stamps = {n: (out / "runs" / n / "probes.parquet").stat().st_mtime_ns for n in runs}
    code, stdout2, err = sweep([*models, "--lineage", "tiny", "--out", str(out), *QUICK], capsys)
    assert code == 0 and err.count("run complete, skipped") == 3, err
    assert stamps == {n: (out / "runs" / n / "probes.parquet").stat().st_mtime_ns for n in runs}
    assert stdout2 == stdout  # the same comparison

    # A run killed part-way resumes: its finished chunk is kept, the rest recomputed; the others stay skipped.
    killed = out / "runs" / "step-200"
    manifest = json.loads((killed / "manifest.json").read_text())
    (killed / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    for p in killed.glob("chunks/*-00001.parquet"):
        p.unlink()
    (killed / "probes.parquet").unlink()
    code, _, err = sweep([*models, "--lineage", "tiny", "--out", str(out), *QUICK], capsys)
    assert code == 0 and err.count("run complete, skipped") == 2 and "1 chunks already finished" in err
    assert "chunk 2/2: computed" in err and "chunk 1/2: computed" not in err, err


def test_listing_revisions_files_and_roles(ckpts, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("# my checkpoints\nstep-300  mine:late   \n\nstep-100\n")
    shutil.copytree(ckpts / "step-100", tmp_path / "step-100")
    shutil.copytree(ckpts / "step-300", tmp_path / "step-300")
    items = listed(["org/model@step_10,step_20"], str(listing))
    assert items == [("org/model@step_10", None, "org/model@step_10"), ("org/model@step_20", None, "org/model@step_20"),
                     (str(tmp_path / "step-300"), "mine:late", "step-300"), (str(tmp_path / "step-100"), None, "step-100")]
    cps = plan(items, {"org/model@step_20": "other:rl-20"}, None, "sweepdir")
    got = [(c.label, c.lineage, c.stage) for c in cps]
    assert got == [("model@step_10", "org/model", "step_10"), ("model@step_20", "other", "rl-20"),
                   ("step-300", "mine", "late"), ("step-100", "sweepdir", "step-100")]
    assert cps[0].entry == {"source": "hub", "hf_id": "org/model", "revision": "step_10", "lineage": "org/model",
                            "stage": "step_10"}
    # A registered alias with its own lineage is used as is; given a role, it gets a sweep.toml entry overriding it.
    (olmo,) = plan([("olmo-3-7b-sft", None)], {}, None, "x")
    assert (olmo.alias, olmo.entry, olmo.lineage, olmo.stage) == ("olmo-3-7b-sft", None, "olmo-3-7b", "sft")
    (tiny,) = plan([("tiny-llama3", None)], {"tiny-llama3": "t:step-5"}, None, "x")
    assert tiny.alias == "tiny-llama3" and tiny.entry["override"] is True and tiny.entry["stage"] == "step-5"
    with pytest.raises(ReadoutError, match="role mine:a is also"):
        plan([(str(ckpts / "step-100"), "mine:a"), (str(ckpts / "step-200"), "mine:a")], {}, None, "x")
    with pytest.raises(ReadoutError, match="--stage: nope: not one of the checkpoints"):
        plan([(str(ckpts / "step-100"), None)], {"nope": "a:b"}, None, "x")


def test_stage_names_a_checkpoint_as_listed_by_label_or_by_any_path_to_it(ckpts, tmp_path, monkeypatch):
    """--stage takes the label, the name as written in the list file (relative to the file's folder, not the
    working one), a path relative to the working folder or an absolute one; anything else is refused with the
    names it would take."""
    (tmp_path / "ckpts").symlink_to(ckpts)
    (tmp_path / "lists").mkdir()
    listing = tmp_path / "lists" / "l.txt"
    listing.write_text("".join(f"../ckpts/step-{s}\n" for s in (100, 200, 300)) + "tiny-llama3\n")
    monkeypatch.chdir(tmp_path)
    items = listed([], str(listing))
    stages = {"../ckpts/step-100": "a:s-1", "ckpts/step-200": "a:s-2", str(ckpts / "step-300"): "a:s-3",
              "tiny-llama3": "a:s-4"}
    assert [(c.label, c.lineage, c.stage) for c in plan(items, stages, None, "x")] == [
        ("step-100", "a", "s-1"), ("step-200", "a", "s-2"), ("step-300", "a", "s-3"), ("tiny-llama3", "a", "s-4")]
    assert [c.stage for c in plan(items, {"step-200": "a:by-label"}, None, "x")][1] == "by-label"
    with pytest.raises(ReadoutError, match=r"step-200 and ckpts/step-100/\.\./step-200 name the same checkpoint \(step-200\) with"):
        plan(items, {"step-200": "a:s-2", "ckpts/step-100/../step-200": "a:s-9"}, None, "x")
    with pytest.raises(ReadoutError) as exc:
        plan(items, {"step-100/x": "a:s-1"}, None, "x")
    assert str(exc.value) == ("--stage: step-100/x: not one of the checkpoints listed; name one by its label or its "
                              "name as listed: step-100 (../ckpts/step-100), step-200 (../ckpts/step-200), "
                              "step-300 (../ckpts/step-300), tiny-llama3")


def test_stages_without_steps_follow_the_list():
    def cp(lineage, stage):
        return Checkpoint(stage, stage, lineage, stage, stage, None)

    assert stage_order([cp("a", "step-2"), cp("a", "step-1"), cp("b", "sft"), cp("b", "final")]) == ()
    assert stage_order([cp("a", "late"), cp("a", "early-1"), cp("b", "sft")]) == ("late", "early-1")


def test_sweep_refuses_bad_input_in_one_line(ckpts, tmp_path, capsys, monkeypatch):
    code, _, err = sweep(["--model", str(ckpts / "step-100"), *QUICK], capsys)
    assert code == 2 and err.startswith("error: --out: required")
    code, _, err = sweep(["--model", "no-such-model", "--out", str(tmp_path / "o"), *QUICK], capsys)
    assert code == 2 and "unknown model 'no-such-model'" in err and not (tmp_path / "o").exists()
    code, _, err = sweep(["--model", str(ckpts / "step-100"), "--stage", "x", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "NAME=lineage:stage" in err
    code, _, err = sweep(["--model", str(ckpts / "step-100"), "--stage", "nope=a:b", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and f"as listed: step-100 ({ckpts / 'step-100'})\n" in err and not (tmp_path / "o").exists()
    # A revision not on this machine is found before the first checkpoint runs.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    code, _, err = sweep(["--model", str(ckpts / "step-100"), "--model", "some-org/absent@step_1,step_2",
                          "--out", str(tmp_path / "o2"), *QUICK], capsys)
    assert code == 2 and "some-org/absent@step_1: not in the local HF cache; nothing was run" in err
    assert not (tmp_path / "o2").exists()  # nothing written, not even sweep.toml
    (tmp_path / "o3").mkdir()
    (tmp_path / "o3" / "sweep.toml").write_text("# an earlier sweep's\n")
    code, _, err = sweep(["--model", "some-org/absent@step_1", "--out", str(tmp_path / "o3"), *QUICK], capsys)
    assert code == 2 and (tmp_path / "o3" / "sweep.toml").read_text() == "# an earlier sweep's\n"
    assert sorted(p.name for p in (tmp_path / "o3").iterdir()) == ["sweep.toml"]


def test_compare_order_option(tmp_path, capsys):
    from stats.gap import SyntheticSpec, make_run_dir

    dirs = [str(make_run_dir(tmp_path / s, SyntheticSpec(model=f"m-{s}", n_scenarios=60, effect=e, seed=3, readouts=("D", "J"),
                                                          lineage="lin", stage=s)))
            for s, e in (("late", 0.06), ("warmup", 0.0), ("mid", 0.03))]
    with pytest.raises(SystemExit) as exc:
        main(["compare", *dirs, "--out", str(tmp_path / "c"), "--n-boot", "50"])
    assert exc.value.code == 2 and "stage 'late'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", *dirs, "--out", str(tmp_path / "c"), "--n-boot", "50", "--order", "warmup, mid,late"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "sweep lin: E warmup" in out and out.index("E mid") < out.index("E late")


def test_nsi_sweep(ckpts, tmp_path, capsys):
    out = tmp_path / "nsi"
    models = [a for s in (100, 200) for a in ("--model", str(ckpts / f"step-{s}"))]
    argv = [*models, "--study", "nsi", "--limit", "2", "--set", "samples=2", "--set", "budget=12", "--n-boot", "50",
            "--out", str(out), "--no-progress"]
    code, stdout, err = sweep(argv, capsys)
    assert code == 0, err
    for name in ("step-100", "step-200"):
        manifest = json.loads((out / "runs" / name / "manifest.json").read_text())
        assert manifest["kind"] == "nsi" and manifest["complete"] and manifest["seed"] == 42
        assert manifest["model"]["stage"] == name
    assert (out / "compare" / "fig_nsi_heatmap.png").is_file() and "continuous NSI" in stdout
    code, _, err = sweep(argv, capsys)
    assert code == 0 and err.count("run complete, skipped") == 2
    code, _, err = sweep([*argv, "--readouts", "D"], capsys)
    assert code == 2 and "not of --study nsi" in err
