"""The batch scripts (scripts/slurm_submit.sh, slurm_readout.sh, slurm_merge.sh) on a real SLURM: a one-node cluster
on localhost (tests/scripts/slurm_cluster.py). A sharded run submitted as a job array, merged by the merge job, equals a
single run; an array task cancelled mid-run and resubmitted resumes from its finished chunks; a job asking for a GPU on
a node without one is refused in one line; a task left on its default device (cuda) on that node fails at once in one
line. Without SLURM (or root) the tests skip, naming why; with
LOGIT_READOUT_REQUIRE_SLURM set (.ci/run sets it) they fail instead."""

from __future__ import annotations

import os
import re
import time

import pandas as pd
import pytest

from tests.helpers import ROOT
from tests.scripts.slurm_cluster import REQUIRE_ENV, Cluster, ClusterError, why_not

pytestmark = [pytest.mark.slurm, pytest.mark.heavy]

MODEL, PANEL, PROFILE = "tiny-qwen2", "gap-v1", "quick"
RUN_ARGS = ("--readouts", "D,J0,control", "--limit", "6", "--set", "chunk_size=1", "--set", "orders.D=2", "--set", "orders.J0=2",
            "--set", "orders.control=2")
"""What each shard reads: six scenarios of gap-v1, one chunk each, first-token readouts with two orders (seconds a chunk)."""
SHARDS = 2


def _skip_or_fail(why: str):
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"SLURM cluster: {why}")
    pytest.skip(f"SLURM cluster: {why}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = why_not()
    if why is not None:
        _skip_or_fail(why)
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
    except (ClusterError, OSError, FileNotFoundError) as exc:
        c.stop()
        _skip_or_fail(f"could not start: {str(exc).splitlines()[0]}")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def readout_cmd(tmp_path_factory):
    """The READOUT the scripts run: the installed console script, with the small reading above added to `run`. With
    PAUSE_AFTER set to a file, a run stops (SIGSTOP) once that file exists, so that the test cancels the task at a known
    point: after its first chunk, before its last."""
    folder = tmp_path_factory.mktemp("bin")
    path = folder / "readout"
    args = " ".join(RUN_ARGS)
    path.write_text(f"""#!/usr/bin/env bash
if [ "$1" != run ]; then exec {ROOT}/.venv/bin/readout "$@"; fi
if [ -z "${{PAUSE_AFTER:-}}" ]; then exec {ROOT}/.venv/bin/readout "$@" {args}; fi
{ROOT}/.venv/bin/readout "$@" {args} &
child=$!
while [ ! -e "$PAUSE_AFTER" ] && kill -0 $child 2>/dev/null; do sleep 0.05; done
kill -STOP $child
wait $child
""")
    path.chmod(0o755)
    return str(path)


def _submit(cluster, readout_cmd, out, logs, *extra, gres="--gres=none", env=None):
    env = {"READOUT": readout_cmd, "LOGS": str(logs), "SBATCH_ARGS": gres, "HF_HUB_OFFLINE": "1", "PAUSE_AFTER": "",
           "DEVICE": "cpu", **(env or {})}
    proc = cluster.run(str(ROOT / "scripts" / "slurm_submit.sh"), MODEL, PANEL, PROFILE, str(out), str(SHARDS), *extra,
                       check=False, env=env)
    jobs = re.findall(r"submitted (?:array|merge) job (\d+)", proc.stdout)
    return proc, jobs


def _tables(run):
    return [pd.read_parquet(run / f"{name}.parquet") for name in ("probes", "scenarios")]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    from cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", MODEL, "--panel", PANEL, "--profile", PROFILE, "--out", str(out), "--no-progress", *RUN_ARGS])
    assert exc.value.code == 0
    return out


def test_sharded_array_merged_equals_single_run(cluster, readout_cmd, single, tmp_path):
    out, logs = tmp_path / "run", tmp_path / "logs"
    proc, jobs = _submit(cluster, readout_cmd, out, logs)
    assert proc.returncode == 0, proc.stderr
    assert len(jobs) == 2, proc.stdout
    cluster.wait_jobs(jobs)
    states = cluster.job_states(jobs[0])
    assert sorted(states.values()) == ["COMPLETED"] * SHARDS, (states, _logs(logs))
    assert cluster.job_states(jobs[1]) == {jobs[1]: "COMPLETED"}, _logs(logs)
    merge_log = next(logs.glob("readout-merge-*.out")).read_text()
    assert "merged 6 chunks" in merge_log
    for a, b in zip(_tables(single), _tables(out)):
        pd.testing.assert_frame_equal(a, b)


def test_cancelled_task_resubmitted_resumes(cluster, readout_cmd, single, tmp_path):
    out, logs = tmp_path / "run", tmp_path / "logs"
    # Shard 0 computes chunks 1, 3 and 5: its run is paused once chunk 1 is written (scenarios is its last table),
    # and the task is cancelled there.
    first = out / "chunks" / "scenarios-00000.parquet"
    proc, jobs = _submit(cluster, readout_cmd, out, logs, "--only", "0", env={"PAUSE_AFTER": str(first)})
    assert proc.returncode == 0, proc.stderr
    array, merge = jobs
    end = time.monotonic() + 300
    while not first.exists() and time.monotonic() < end:
        time.sleep(0.2)
    assert first.exists(), _logs(logs)
    time.sleep(0.5)
    cluster.run("scancel", f"{array}_0")
    cluster.wait_jobs([array, merge])
    assert cluster.job_states(array) == {f"{array}_0": "CANCELLED"}, _logs(logs)
    assert cluster.job_states(merge) == {merge: "FAILED"}
    merge_log = next(logs.glob(f"readout-merge-{merge}.out")).read_text()
    assert "shards to rerun: 0, 1 of 2" in merge_log and "--only <index>" in merge_log
    done = sorted(p.name for p in (out / "chunks").glob("scenarios-*.parquet"))
    assert "scenarios-00000.parquet" in done and "scenarios-00004.parquet" not in done
    for index in ("0", "1"):
        proc, jobs = _submit(cluster, readout_cmd, out, logs, "--only", index)
        assert proc.returncode == 0, proc.stderr
        cluster.wait_jobs(jobs)
        if index == "0":
            task_log = (logs / f"readout-{jobs[0]}_0.out").read_text()
            assert "chunk 1/6: already finished, skipped" in task_log, task_log
            assert "chunk 5/6: computed" in task_log
    assert "merged 6 chunks" in (logs / f"readout-merge-{jobs[1]}.out").read_text()
    for a, b in zip(_tables(single), _tables(out)):
        pd.testing.assert_frame_equal(a, b)


def test_gpu_job_on_a_node_without_one_fails_in_one_line(cluster, readout_cmd, tmp_path):
    proc, jobs = _submit(cluster, readout_cmd, tmp_path / "run", tmp_path / "logs", gres="")
    assert proc.returncode != 0 and not jobs
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: sbatch refused the job:") and "gres" in lines[0] and "SBATCH_ARGS=--gres=none" in lines[0]
    assert not cluster.run("squeue", "-h").stdout.strip()


def test_task_on_its_default_device_fails_at_once_on_a_node_without_a_gpu(cluster, readout_cmd, tmp_path):
    """Without DEVICE=cpu the tasks ask for cuda: on the GPU-less node each fails within seconds, its log holding one
    line naming CUDA, nothing computed; the merge fails, its resubmission line naming the device the tasks asked for."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    proc, jobs = _submit(cluster, readout_cmd, out, logs, env={"DEVICE": ""})  # empty: the script's default
    assert proc.returncode == 0, proc.stderr
    t0 = time.monotonic()
    cluster.wait_jobs(jobs)
    assert time.monotonic() - t0 < 120, _logs(logs)
    assert sorted(cluster.job_states(jobs[0]).values()) == ["FAILED"] * SHARDS, _logs(logs)
    for index in range(SHARDS):
        lines = (logs / f"readout-{jobs[0]}_{index}.out").read_text().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --device: 'cuda'"), _logs(logs)
    merge_log = next(logs.glob("readout-merge-*.out")).read_text()
    assert cluster.job_states(jobs[1]) == {jobs[1]: "FAILED"}
    assert "DEVICE=cuda" in merge_log and "--only <index>" in merge_log, merge_log
    assert not list(out.glob("chunks/*.parquet"))


def _logs(folder) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(folder.glob("*.out"))) if folder.exists() else ""

