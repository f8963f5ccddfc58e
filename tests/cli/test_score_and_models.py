"""`readout score` and `readout models` end to end: outputs, foreign checkpoints, one-line errors, exit 2."""

import json
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine.tiny import ensure_tiny
from tests.helpers import MSG, write_probes
from tests.helpers import cli as run


def test_score_writes_one_line_per_probe(tmp_path, capsys):
    probes = write_probes(tmp_path / "p.jsonl", [
        {"id": "a", "messages": MSG, "letters": ["A", "B", "C"]},
        {"id": 2, "messages": MSG, "letters": ["A", "B", "C"], "system": "You are terse."},
        {"id": "raw", "text": "The agent chooses option", "letters": ["A", "B"]},
    ])
    out = tmp_path / "o.jsonl"
    code, _, err = run(["score", str(probes), "--model", "tiny-olmo3", "--out", str(out), "--temperature", "0.7"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", 2, "raw"]
    for r in rows:
        assert set(r) == {"id", "mass", "letter_mass", "option_mass", "tempered", "tokens"}
        assert sum(r["option_mass"].values()) == pytest.approx(1.0)
        assert r["letter_mass"] == pytest.approx(sum(r["mass"].values()))
    assert rows[0]["tokens"] != rows[1]["tokens"]  # the given system prompt replaced OLMo-3's default one


def _foreign_checkpoint(tmp_path, model_type, **dims):
    """A folder with an architecture the registry has never heard of, and a chat template."""
    folder = tmp_path / model_type
    shutil.copytree(ensure_tiny("tiny-qwen2"), folder)
    for f in ("model.safetensors", "config.json"):
        (folder / f).unlink()
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(folder))
    config = AutoConfig.for_model(model_type, vocab_size=vocab, **dims)
    torch.manual_seed(0)  # test-only weights; the library never seeds globally
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "model_type,dims",
    [
        ("gpt2", dict(n_embd=64, n_layer=2, n_head=4)),
        # Gemma-2 soft-caps its logits, so scoring goes through the model's own head (logits_to_keep).
        ("gemma2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16)),
    ],
)
def test_any_local_causal_lm_folder_works(tmp_path, capsys, model_type, dims):
    folder = _foreign_checkpoint(tmp_path, model_type, **dims)
    case = "the agent must decide what to do about the late report today. "
    rows = [{"id": i, "messages": [{"role": "user", "content": f"Case {i}: {case}" + "x " * i + "A or B?"}], "letters": ["A", "B"]}
            for i in range(6)]
    probes = write_probes(tmp_path / "p.jsonl", rows)
    fast, plain = tmp_path / "fast.jsonl", tmp_path / "plain.jsonl"
    assert run(["score", str(probes), "-m", str(folder), "-o", str(fast), "--max-batch", "4"], capsys)[0] == 0
    assert run(["score", str(probes), "-m", str(folder), "-o", str(plain), "--plain"], capsys)[0] == 0
    for a, b in zip(map(json.loads, fast.read_text().splitlines()), map(json.loads, plain.read_text().splitlines())):
        for letter in ("A", "B"):
            assert a["mass"][letter] == pytest.approx(b["mass"][letter], abs=1e-6)


@pytest.mark.parametrize(
    "rows,model,expect",
    [
        (['{"id": 1, "text": "x", "letters": ["A","B"]}', '{"id": 2, "text": '], "tiny-qwen2", "p.jsonl:2: json: invalid JSON"),
        ([{"id": 1, "text": "x"}], "tiny-qwen2", "p.jsonl:1: letters: missing"),
        ([{"id": 1, "text": "x", "letters": ["A", "AB"]}], "tiny-qwen2", "p.jsonl:1: letters: letter 'AB'"),
        ([{"id": 1, "messages": MSG, "text": "x", "letters": ["A", "B"]}], "tiny-qwen2", "p.jsonl:1: messages/text"),
        ([{"id": 1, "text": "x", "letters": ["A", "B"], "colour": 1}], "tiny-qwen2", "p.jsonl:1: colour: unknown field"),
        ([{"id": 1, "text": "x", "letters": ["A", "B"]}, {"id": 1, "text": "y", "letters": ["A", "B"]}], "tiny-qwen2", "p.jsonl:2: id:"),
        ([{"id": 1, "messages": MSG, "letters": ["A", "B"]}], "tiny-base", "p.jsonl:1: messages: chat frame asked for"),
        ([{"id": 1, "text": "x", "letters": ["A", "B"]}], "no-such-model", "unknown model 'no-such-model'"),
        ([{"id": 1, "text": "x", "letters": ["A", "B"]}], "llama-3.1-8b", "not in the local HF cache"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, capsys, monkeypatch, rows, model, expect):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    probes = write_probes(tmp_path / "p.jsonl", rows)
    out = tmp_path / "o.jsonl"
    code, _, err = run(["score", str(probes), "-m", model, "-o", str(out)], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], err
    assert not out.exists()


def test_missing_probe_file(tmp_path, capsys):
    code, _, err = run(["score", str(tmp_path / "none.jsonl"), "-m", "tiny-qwen2", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "none.jsonl: file: cannot read" in err


def test_usage_error_exits_2(capsys):
    code, _, err = run(["score"], capsys)
    assert code == 2 and "Missing argument" in err


def test_models_lists_aliases_and_availability(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    code, out, _ = run(["models"], capsys)
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "allenai/Olmo-3-7B-Instruct" in lines["olmo-3-7b"] and " no " in lines["olmo-3-7b"]
    assert " yes " in lines["tiny-llama3"]
    assert "smollm2-135m" in lines
