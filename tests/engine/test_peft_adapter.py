"""A PEFT adapter on a tiny model: loaded with `adapter=` (`--peft`), the letters read move away from the base
model's and equal the unmerged PEFT model's own forward within 1e-5; the manifest records the adapter."""

import json

import pytest
import torch

from cli.main import main
from engine.errors import ReadoutError
from engine.loading import load_model
from engine.render import Prompt, encode_prompt
from engine.scoring import letter_masses, score_ids
from readouts.manifest import model_manifest

PROMPTS = ["Pick one.\nA) Report\nB) Hide\nC) Wait\nReply with only the letter.", "Which is right, A or B?"]


def test_adapter_changes_masses_and_equals_the_unmerged_model(adapter):
    folder, peft_model = adapter
    base = load_model("tiny-llama3", device="cpu")
    adapted = load_model("tiny-llama3", device="cpu", adapter=str(folder))
    seqs = [encode_prompt(base.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in PROMPTS]
    letters = [base.letters("ABC")] * len(seqs)
    ours = score_ids(adapted.model, seqs, letters)
    with torch.inference_mode():
        logits = torch.stack([peft_model(input_ids=torch.tensor([s])).logits[0, -1] for s in seqs])
    reference = letter_masses(logits, letters, [len(s) for s in seqs], 1.0, 1.0)
    plain = score_ids(base.model, seqs, letters)
    for a, r, b in zip(ours, reference, plain):
        assert a.option_mass == pytest.approx(r.option_mass, abs=1e-5)
        assert a.option_mass != pytest.approx(b.option_mass, abs=1e-3)
    facts = model_manifest(adapted, base.letters("AB"))["model"]["adapter"]
    assert facts["path"] == str(folder.resolve()) and len(facts["weights_fingerprint"]) == 64


def test_bad_adapter_folders_are_one_line(tmp_path, capsys):
    with pytest.raises(ReadoutError, match="not a PEFT adapter folder"):
        load_model("tiny-llama3", device="cpu", adapter=str(tmp_path))
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "text": "Option", "letters": ["A", "B"]}) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["score", str(probes), "--model", "tiny-llama3", "--peft", str(tmp_path), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "--peft" in capsys.readouterr().err
