"""The Python API example (docs/own-items-and-api.md) runs as written, and a study run on an in-memory model writes the tables the
command line writes for the same checkpoint; score_prompts equals `readout score`'s rows."""

import json

import pandas as pd
import pytest

from cli.main import main
from tests.helpers import readme_example


def test_the_readme_example_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # pasted as it stands: no name defined beforehand
    exec(compile(readme_example(), "docs/own-items-and-api.md (Python API)", "exec"), {})
    out = capsys.readouterr().out
    assert "['probes.parquet', 'scenarios.parquet']" in out
    manifest = json.loads((tmp_path / "my-runs" / "gap" / "manifest.json").read_text())
    assert manifest["model"]["name"] == "my-checkpoint" and manifest["model"]["source"] == "memory"


def test_in_memory_run_equals_the_command_line(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.tiny import ensure_tiny
    from readouts.api import run_study, score_prompts

    folder = ensure_tiny("tiny-llama3")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    api_dir = run_study("gap", model, tokenizer, name="tiny-llama3", out=tmp_path / "api", readouts="D,J", limit=2, log=lambda _: None)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", "tiny-llama3", "--readouts", "D,J", "--limit", "2", "--out", str(tmp_path / "cli"), "--no-progress"])
    assert exc.value.code == 0
    for table in ("probes", "scenarios"):
        pd.testing.assert_frame_equal(pd.read_parquet(api_dir / f"{table}.parquet"), pd.read_parquet(tmp_path / "cli" / f"{table}.parquet"))

    probes = tmp_path / "p.jsonl"
    message = [{"role": "user", "content": "Pick one.\nA) Report\nB) Hide"}]
    probes.write_text(json.dumps({"id": "a", "messages": message, "letters": ["A", "B"]}) + "\n")
    with pytest.raises(SystemExit):
        main(["score", str(probes), "--model", "tiny-llama3", "--out", str(tmp_path / "s.jsonl"), "--temperature", "0.7"])
    cli_row = json.loads((tmp_path / "s.jsonl").read_text())
    api_row = score_prompts(model, tokenizer, [message], letters="AB", temperature=0.7)[0]
    assert api_row["option_mass"] == pytest.approx(cli_row["option_mass"], abs=1e-6)
    assert api_row["tempered"] == pytest.approx(cli_row["tempered"], abs=1e-6)
