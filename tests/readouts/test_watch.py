"""`readout watch` (readouts/watch.py): checkpoints a real transformers `Trainer` writes while the watch runs are each
read once, in step order, as runs of a sweep, then compared; a killed watch resumes; a signal stops it; a truncated
safetensors file is named in one line and the folder read once it is whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT
from tests.readouts.training import EVAL_LIMIT, EVAL_SET

pytestmark = pytest.mark.heavy

READ_ARGS = ["--readouts", "D,J0,control", "--limit", str(EVAL_LIMIT), "--n-boot", "200", "--no-progress"]
for _item in EVAL_SET:
    READ_ARGS += ["--set", _item]
STUDY = {"profile": "quick", "overrides": EVAL_SET, "limit": EVAL_LIMIT, "seed": None, "force": False, "progress": False,
         "panel": None, "readouts": "D,J0,control", "sample": False}

TRAIN = """
import sys, time
from pathlib import Path
from transformers import TrainerCallback
from tests.readouts.training import make_trainer, tiny_model

class Pause(TrainerCallback):
    def on_save(self, args, state, control, **kw):
        time.sleep(float(sys.argv[3]))

model, tok, _ = tiny_model()
make_trainer(model, tok, Path(sys.argv[1]), steps=int(sys.argv[2]), save_steps=2, callbacks=[Pause()]).train()
"""


def _train(out, steps, pause=0.0):
    return subprocess.Popen([sys.executable, "-c", TRAIN, str(out), str(steps), str(pause)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder a Trainer wrote checkpoint-2 and checkpoint-4 into."""
    out = tmp_path_factory.mktemp("trained") / "mine"
    proc = _train(out, 4)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    return out


def _runs(lines):
    """The checkpoints the sweep ran (not skipped), in order."""
    return [line.split(": ")[1].split(" ")[0] for line in lines if line.startswith("sweep ") and " -> " in line]


def test_checkpoints_written_during_training_read_once_in_order(tmp_path):
    from readouts.watch import watch

    folder = tmp_path / "train"
    proc = _train(folder, 6, pause=2.0)
    try:
        end = time.monotonic() + 300
        while not (folder / "checkpoint-2" / "trainer_state.json").exists() and time.monotonic() < end:
            time.sleep(0.2)
        lines = []
        watch(folder, tmp_path / "sweep", study=STUDY, n_boot=200, poll=0.2, quiet=12, settle=1.5, log=lines.append)
    finally:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()
    assert _runs(lines) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"], lines
    state = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert sorted(state) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert [state[k]["role"] for k in sorted(state)] == ["train:step-2", "train:step-4", "train:step-6"]
    assert (tmp_path / "sweep" / "compare" / "compare_report.md").exists()
    assert not any("not read yet" in line for line in lines)  # being written is waited for, not reported


def _watch_process(folder, out, quiet):
    return subprocess.Popen([str(ROOT / ".venv" / "bin" / "readout"), "watch", str(folder), "--out", str(out), "--poll", "0.2",
                             "--settle", "0.2", "--quiet", str(quiet), *READ_ARGS], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _wait_for(path, label, timeout=300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if label in json.loads(path.read_text()):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{label} never finished in {path}")


def test_killed_watch_resumes_and_a_signal_stops_it(trained, tmp_path):
    folder = shutil.copytree(trained, tmp_path / "mine")
    out = tmp_path / "sweep"
    first = _watch_process(folder, out, quiet=600)
    _wait_for(out / "sweep.json", "checkpoint-2")
    first.kill()
    first.wait(timeout=60)
    second = _watch_process(folder, out, quiet=600)
    _wait_for(out / "sweep.json", "checkpoint-4")
    time.sleep(1.0)
    second.send_signal(signal.SIGTERM)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    lines = err.splitlines()
    assert any(line.startswith("sweep 1/2: checkpoint-2") and "run complete, skipped" in line for line in lines), err
    assert "checkpoint-2" not in _runs(lines)
    assert any("watch: stopped by SIGTERM" in line for line in lines), err
    assert json.loads((out / "runs" / "checkpoint-4" / "manifest.json").read_text())["complete"] is True


def test_truncated_safetensors_named_once_then_read_when_whole(trained, tmp_path):
    from readouts.watch import watch

    folder = shutil.copytree(trained, tmp_path / "mine")
    weights = folder / "checkpoint-4" / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    lines = []
    watch(folder, tmp_path / "sweep", study=STUDY, n_boot=200, poll=0.1, quiet=2, settle=0, log=lines.append)
    named = [line for line in lines if "checkpoint-4: not read yet" in line]
    assert len(named) == 1 and f"model.safetensors: truncated ({len(whole) // 2} bytes of {len(whole)})" in named[0], lines
    assert _runs(lines) == ["checkpoint-2"]
    assert any("checkpoint-4: never read: model.safetensors: truncated" in line for line in lines)
    weights.write_bytes(whole)
    lines = []
    watch(folder, tmp_path / "sweep", study=STUDY, n_boot=200, poll=0.1, quiet=1, settle=0, log=lines.append)
    assert _runs(lines) == ["checkpoint-4"], lines


def _safetensors(path, header: dict, data: bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_inspect_names_each_way_a_checkpoint_is_not_whole(tmp_path):
    from readouts.watch import inspect, scan

    ck = tmp_path / "checkpoint-7"
    ck.mkdir()
    assert inspect(ck, settle=0).problem == "no config.json or adapter_config.json yet"
    (ck / "config.json").write_text('{"model_type": ')
    assert inspect(ck, settle=0).problem == "config.json: not complete JSON"
    (ck / "config.json").write_text("{}")
    assert inspect(ck, settle=0).problem == "no model.safetensors yet"
    tensor = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    _safetensors(ck / "model.safetensors", tensor, b"\0" * 8)
    assert inspect(ck, settle=0).problem is None and inspect(ck, settle=0).kind == "weights"
    assert inspect(ck, settle=60).problem.startswith("being written")
    _safetensors(ck / "model.safetensors", tensor, b"\0" * 5)
    size = (ck / "model.safetensors").stat().st_size
    assert inspect(ck, settle=0).problem == f"model.safetensors: truncated ({size} bytes of {size + 3})"
    assert inspect(ck, settle=60).problem.startswith("being written")  # still changing: waited for, not named
    assert inspect(ck, settle=60, now=time.time() + 61).problem.startswith("model.safetensors: truncated")
    _safetensors(ck / "model.safetensors", tensor, b"\0" * 12)
    assert inspect(ck, settle=0).problem == "model.safetensors: corrupt (4 bytes past its tensors' end)"
    (ck / "model.safetensors").write_bytes(struct.pack("<Q", 10) + b"not json!!")
    assert inspect(ck, settle=0).problem == "model.safetensors: corrupt (its header is not JSON)"
    (ck / "model.safetensors").write_bytes(b"\1\2")
    assert "truncated (2 bytes, no header)" in inspect(ck, settle=0).problem
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
    _safetensors(ck / "model-1.safetensors", tensor, b"\0" * 8)
    assert inspect(ck, settle=0).problem == "model.safetensors.index.json: 1 of 2 shards not there yet (first: model-2.safetensors)"
    ad = tmp_path / "checkpoint-12"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny-llama3"}))
    (ad / "adapter_model.bin").write_bytes(b"PK\3\4 half a zip")
    assert "adapter_model.bin: truncated or corrupt" in inspect(ad, settle=0).problem
    (ad / "adapter_model.bin").unlink()
    _safetensors(ad / "adapter_model.safetensors", tensor, b"\0" * 8)
    found = inspect(ad, settle=0)
    assert (found.kind, found.problem, found.base) == ("adapter", None, "tiny-llama3")
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "other").mkdir()
    assert [f.step for f in scan(tmp_path, settle=0)] == [7, 12]


def test_adapter_checkpoints_read_on_their_base(tmp_path, capsys):
    """peft's layout: checkpoint-<step>/ holding adapter_config.json and adapter_model.safetensors; the run reads the
    declared base with the adapter merged, as `readout run --peft` does."""
    import pandas as pd

    from readouts.watch import watch
    from tests.helpers import cli, make_adapter

    folder = tmp_path / "lora"
    make_adapter(folder / "checkpoint-3")
    lines = []
    watch(folder, tmp_path / "sweep", study=STUDY, base="tiny-llama3", n_boot=200, poll=0.1, quiet=0.5, settle=0,
          log=lines.append)
    assert _runs(lines) == ["checkpoint-3"], lines
    run = tmp_path / "sweep" / "runs" / "checkpoint-3"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["model"]["adapter"]["path"] == str((folder / "checkpoint-3").resolve())
    argv = ["run", "--model", "tiny-llama3", "--peft", str(folder / "checkpoint-3"), "--out", str(tmp_path / "ref"), *READ_ARGS]
    argv.remove("--n-boot")
    argv.remove("200")
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    a, b = pd.read_parquet(run / "probes.parquet"), pd.read_parquet(tmp_path / "ref" / "probes.parquet")
    assert (a.p_violating - b.p_violating).abs().max() <= 1e-6
