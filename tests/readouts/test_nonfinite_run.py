"""A model that gives NaN logits stops `readout score` with one line and exit 2, and stops a run naming the chunk it
stopped in; the run keeps the chunks written before it and resumes from them to the tables of a run that never failed."""

from contextlib import contextmanager

import pandas as pd
import pytest
import torch

from engine.errors import NonFiniteLogitsError
from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap.study import GapStudy
from tests.helpers import MSG, cli, register_test_profiles, write_probes
from tests.helpers import gap_run as run


@pytest.fixture(autouse=True)
def test_profiles(monkeypatch):
    register_test_profiles(monkeypatch)


@contextmanager
def nan_embeddings(armed):
    """Every embedding lookup returns NaN while `armed()` is true (a model that overflows, from its first layer on)."""
    def hook(module, args, output):
        if isinstance(module, torch.nn.Embedding) and armed():
            return output * float("nan")
        return None

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def test_a_run_that_meets_nan_logits_stops_and_resumes(tmp_path, capsys):
    probes = write_probes(tmp_path / "p.jsonl", [{"id": "a", "messages": MSG, "letters": ["A", "B"]}])
    with nan_embeddings(lambda: True):
        code, _, err = cli(["score", str(probes), "--model", "tiny-qwen2", "--out", str(tmp_path / "s.jsonl")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: reading letters: the logits read were NaN or infinite for 1 of 1 rows")
    assert not (tmp_path / "s.jsonl").exists()

    full, _ = run(tmp_path, "full")
    logs = []
    with nan_embeddings(lambda: any(line.startswith("chunk 1/3: computed") for line in logs)):
        with pytest.raises(NonFiniteLogitsError, match=r"^chunk 2/3: reading letters: "):
            options = RunOptions(model=ModelOptions("tiny-qwen2"), profile="test", out=str(tmp_path / "resumed"), progress=False)
            run_study(GapStudy(), options, log=logs.append)
    resumed, logs = run(tmp_path, "resumed")
    assert [line for line in logs if "skipped" in line] == ["chunk 1/3: already finished, skipped"]
    for table in ("scenarios.parquet", "probes.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(full / table), pd.read_parquet(resumed / table))
