"""What manifests record: `readout score` writes beside its output how it was made (model, probes, letters,
settings, environment), with the user's umask; the environment names threads, GPUs and library versions; load options
(attention implementation, remote code) reach the model and are recorded."""

import json

import torch

from engine.loading import load_model
from readouts.manifest import environment
from tests.helpers import MSG, cli


def test_score_records_how_it_was_made(tmp_path, capsys):
    probes = tmp_path / "p.jsonl"
    probes.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "messages": MSG, "letters": ["A", "B", "C"]},
        {"id": "b", "text": "The agent chooses option", "letters": ["A", "B"]},
    ]))
    out = tmp_path / "scores.jsonl"
    code, _, err = cli(["score", str(probes), "--model", "tiny-llama3", "--out", str(out), "--temperature", "0.7"], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "scores.jsonl.manifest.json").read_text())
    assert meta["kind"] == "score" and meta["model"]["name"] == "tiny-llama3" and meta["probes"]["records"] == 2
    assert set(meta["letters"]) == {"ABC", "AB"} and meta["settings"]["temperature"] == 0.7
    assert len(meta["probes"]["sha256"]) == 64 and meta["environment"]["threads"] >= 1
    assert oct((tmp_path / "scores.jsonl.manifest.json").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_environment_names_threads_gpus_and_library_versions():
    env = environment()
    assert env["threads"] == torch.get_num_threads()
    assert env["gpus"] == ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [])
    assert env["packages"]["tokenizers"] and env["packages"]["accelerate"]
    assert "bitsandbytes" in env["packages"]


def test_attention_implementation_and_remote_code_are_passed_and_recorded(tmp_path, capsys):
    from readouts.manifest import model_manifest

    lm = load_model("tiny-llama3", device="cpu", attn_implementation="eager", trust_remote_code=True)
    assert lm.model.config._attn_implementation == "eager"
    recorded = model_manifest(lm, lm.letters("AB"))["model"]
    assert recorded["load_options"] == {"attn_implementation": "eager", "trust_remote_code": True}
    default = load_model("tiny-llama3", device="cpu")
    assert "load_options" not in model_manifest(default, default.letters("AB"))["model"]
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "messages": MSG, "letters": ["A", "B"]}) + "\n")
    code, _, err = cli(["score", str(probes), "--model", "tiny-llama3", "--out", str(tmp_path / "o.jsonl"),
                        "--attn-implementation", "eager", "--trust-remote-code"], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "o.jsonl.manifest.json").read_text())
    assert meta["model"]["load_options"] == {"attn_implementation": "eager", "trust_remote_code": True}
