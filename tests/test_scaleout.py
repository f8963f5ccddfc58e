"""Scale-out: sharded jobs plus `readout merge`, and 2-process launches with torchrun and with accelerate
(gloo on CPU), give the same tables as one process."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from engine.errors import ReadoutError
from readouts.cli import main
from readouts.run import RunConfig, merge_run, run_study

ARGS = dict(model="tiny-qwen2", profile="quick", readouts="D,J0,raw", progress=False)


def tables(path):
    return [pd.read_parquet(Path(path) / t) for t in ("scenarios.parquet", "probes.parquet")]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    run_study(RunConfig(out=str(out), **ARGS), log=lambda _: None)
    return out


def test_shards_then_merge_equal_single_run(single, tmp_path):
    out = tmp_path / "sharded"
    logs = []
    run_study(RunConfig(out=str(out), shard=(0, 2), **ARGS), log=logs.append)
    assert any("readout merge" in line for line in logs)
    with pytest.raises(ReadoutError, match="not finished yet"):
        merge_run(out, log=lambda _: None)
    run_study(RunConfig(out=str(out), shard=(1, 2), **ARGS), log=lambda _: None)
    with pytest.raises(SystemExit) as exc:
        main(["merge", str(out)])
    assert exc.value.code == 0
    for a, b in zip(tables(single), tables(out)):
        pd.testing.assert_frame_equal(a, b)


def test_bad_shard(tmp_path):
    with pytest.raises(ReadoutError, match="--shard"):
        run_study(RunConfig(out=str(tmp_path / "x"), shard=(2, 2), **ARGS), log=lambda _: None)
    with pytest.raises(ReadoutError, match="--force"):
        run_study(RunConfig(out=str(tmp_path / "x"), shard=(0, 2), force=True, **ARGS), log=lambda _: None)


LAUNCHERS = {
    "torchrun": ["torchrun", "--nproc_per_node", "2", "--master_port", "29517"],
    # --multi_gpu picks torch's elastic launcher; on a CPU-only machine the ranks form a gloo group.
    "accelerate": ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29518"],
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_processes_equal_single_run(single, tmp_path, launcher):
    out = tmp_path / "ddp"
    head = LAUNCHERS[launcher]
    cmd = [str(Path(sys.executable).with_name(head[0])), *head[1:], "-m", "readouts", "run",
           "--model", ARGS["model"], "--profile", ARGS["profile"], "--readouts", ARGS["readouts"], "--out", str(out),
           "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[0/2] chunk 1/2: computed" in proc.stderr and "[1/2] chunk 2/2: computed" in proc.stderr
    for a, b in zip(tables(single), tables(out)):
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-5, atol=1e-7)
