"""Hub checkpoints at a revision (`org/name@rev`, `--revision`): a fake local HF cache holding two revisions of a
tiny model with different weights; each revision loads its own weights and the resolved commit is recorded."""

import shutil

import pytest
import torch

from engine.errors import ReadoutError, UnknownModelError
from engine.loading import load_model
from engine.registry import resolve
from engine.render import Prompt, encode_prompt
from engine.scoring import score_ids
from engine.tiny import ensure_tiny

MAIN, STEP = "a" * 40, "b" * 40


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """models--lab--tiny with refs main -> MAIN and step_100 -> STEP; STEP's weights are MAIN's scaled."""
    from transformers import AutoModelForCausalLM

    repo = tmp_path / "hub" / "models--lab--tiny"
    for commit in (MAIN, STEP):
        shutil.copytree(ensure_tiny("tiny-qwen2"), repo / "snapshots" / commit)
    model = AutoModelForCausalLM.from_pretrained(repo / "snapshots" / STEP)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.save_pretrained(repo / "snapshots" / STEP)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "step_100").write_text(STEP)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at call time
    return repo


def masses(lm):
    ids = encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": "Pick A or B."},)))
    return score_ids(lm.model, [ids], [lm.letters("AB")])[0].option_mass


def test_each_revision_loads_its_own_weights_and_records_its_commit(hub):
    main, step = load_model("lab/tiny", device="cpu"), load_model("lab/tiny@step_100", device="cpu")
    assert main.facts.revision == MAIN and step.facts.revision == STEP
    assert load_model(f"lab/tiny@{STEP}", device="cpu").facts.revision == STEP
    assert masses(main) != pytest.approx(masses(step), abs=1e-3)
    assert masses(step) == pytest.approx(masses(load_model(f"lab/tiny@{STEP}", device="cpu")), abs=1e-6)


def test_revision_on_the_command_line(hub, tmp_path, capsys):
    import json

    from cli.main import main

    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "A or B?"}], "letters": ["A", "B"]}) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["score", str(probes), "--model", "lab/tiny", "--revision", "step_100", "--out", str(tmp_path / "o.jsonl")])
    assert exc.value.code == 0
    meta = json.loads((tmp_path / "o.jsonl.manifest.json").read_text())
    assert meta["model"]["name"] == "lab/tiny@step_100" and meta["model"]["revision"] == STEP
    with pytest.raises(SystemExit) as exc:
        main(["score", str(probes), "--model", "lab/tiny@main", "--revision", "step_100", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and "already names a revision" in capsys.readouterr().err


def test_revisions_apply_to_hub_checkpoints_only(hub):
    with pytest.raises(UnknownModelError, match="applies to hub checkpoints only"):
        resolve("tiny-qwen2@step_100")
    with pytest.raises(ReadoutError, match="not in the local HF cache"):
        load_model("lab/tiny@step_999", device="cpu")
