"""Small defects a new user hits, each fixed: `--version`, `compare --role` says what it parses, a CUDA device
on a CPU-only torch is one line, panel quartiles stay inside the data,
`readout score` records how its output was made, and manifests say where a run ran."""

import json

import pytest
import torch

from engine.errors import ReadoutError
from engine.loading import check_device, load_model
from readouts.manifest import environment
from readouts.panel_tools import quartile_line
from tests.readouts.test_cli import MSG, run


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.startswith("readout (logit-readout) ")


def test_compare_role_names_the_form_it_parses(tmp_path, capsys):
    code, out, _ = run(["compare", "--help"], capsys)
    assert code == 0 and "RUN_DIR=lineage:stage" in out
    code, _, err = run(["compare", str(tmp_path), "--out", str(tmp_path / "o"), "--role", f"{tmp_path}=sft"], capsys)
    assert code == 2 and "must look like RUN_DIR=lineage:stage" in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_on_a_cpu_only_torch_is_one_line(tmp_path, capsys):
    with pytest.raises(ReadoutError, match=r"--device: 'cuda' asked for, but this torch .* use --device cpu"):
        check_device("cuda")
    with pytest.raises(ReadoutError, match="--device: 'cuda:1'"):
        load_model("tiny-qwen2", device="cuda:1")
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "messages": MSG, "letters": ["A", "B"]}) + "\n")
    code, _, err = run(["score", str(probes), "--model", "tiny-qwen2", "--out", str(probes) + ".out", "--device", "cuda"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--device: 'cuda'" in err
    check_device("cpu")


def test_quartiles_stay_inside_the_data():
    # Two values: the exclusive method would put q1 at 0 and q3 at 12, outside [2, 10].
    line = quartile_line([2, 10])
    q = dict(part.split() for part in line.split(", "))
    assert float(q["min"]) <= float(q["q1"]) <= float(q["median"]) <= float(q["q3"]) <= float(q["max"])
    assert quartile_line([5]) == "5 (one scenario)" and quartile_line([]) == "no scenarios"


def test_score_records_how_it_was_made(tmp_path, capsys):
    probes = tmp_path / "p.jsonl"
    probes.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "messages": MSG, "letters": ["A", "B", "C"]},
        {"id": "b", "text": "The agent chooses option", "letters": ["A", "B"]},
    ]))
    out = tmp_path / "scores.jsonl"
    code, _, err = run(["score", str(probes), "--model", "tiny-llama3", "--out", str(out), "--temperature", "0.7"], capsys)
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


def test_panels_list_names_every_shipped_panel(capsys):
    code, out, _ = run(["panels", "list"], capsys)
    lines = {line.split()[0]: line.split() for line in out.splitlines()}
    assert code == 0 and set(lines) == {"gap-v1", "gap-v2", "nsi-14"}
    assert lines["gap-v2"][1:3] == ["gap", "248"] and lines["nsi-14"][1:3] == ["nsi", "14"]


def test_attention_implementation_and_remote_code_are_passed_and_recorded(tmp_path, capsys):
    from engine.loading import load_model
    from readouts.manifest import model_manifest

    lm = load_model("tiny-llama3", device="cpu", attn_implementation="eager", trust_remote_code=True)
    assert lm.model.config._attn_implementation == "eager"
    recorded = model_manifest(lm, lm.letters("AB"))["model"]
    assert recorded["load_options"] == {"attn_implementation": "eager", "trust_remote_code": True}
    default = load_model("tiny-llama3", device="cpu")
    assert "load_options" not in model_manifest(default, default.letters("AB"))["model"]
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "messages": MSG, "letters": ["A", "B"]}) + "\n")
    code, _, err = run(["score", str(probes), "--model", "tiny-llama3", "--out", str(tmp_path / "o.jsonl"),
                        "--attn-implementation", "eager", "--trust-remote-code"], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "o.jsonl.manifest.json").read_text())
    assert meta["model"]["load_options"] == {"attn_implementation": "eager", "trust_remote_code": True}
