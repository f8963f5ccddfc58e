"""Scale-out for every study: sharded jobs plus `readout merge`, and 2-process launches with torchrun and
accelerate (gloo on CPU), give the same tables as one process. The launches run the installed console
script by path, so a user's own `stats.py` or `engine/` in the working directory cannot shadow ours."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from engine.errors import ReadoutError
from readouts.driver import Loading, ModelOptions, RunOptions, merge_run, run
from readouts.gap.study import GapStudy
from readouts.nsi.study import NsiStudy

# Each study on a small workload: (study, CLI command, run options, CLI arguments giving the same run).
STUDIES = {
    "gap": (lambda: GapStudy(readouts="D,J0,raw"), "run", dict(model=ModelOptions("tiny-qwen2")),
            ["--model", "tiny-qwen2", "--readouts", "D,J0,raw"]),
    "nsi": (NsiStudy, "nsi", dict(model=ModelOptions("tiny-qwen2"), limit=4, overrides=("samples=1", "budget=8")),
            ["--model", "tiny-qwen2", "--limit", "4", "--set", "samples=1", "--set", "budget=8"]),
}


def tables(path):
    names = ("scenarios", "probes") if (Path(path) / "scenarios.parquet").exists() else ("nsi_replies", "nsi_continuous")
    return [pd.read_parquet(Path(path) / f"{t}.parquet") for t in names]


def run_study(name, out, **kw):
    make, _, options, _ = STUDIES[name]
    logs = []
    run(make(), RunOptions(out=str(out), progress=False, **{**options, **kw}), log=logs.append)
    return logs


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = {}
    for name in STUDIES:
        out[name] = tmp_path_factory.mktemp(f"single-{name}") / "run"
        run_study(name, out[name])
    return out


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_shards_then_merge_equal_single_run(single, tmp_path, study):
    out = tmp_path / "sharded"
    logs = run_study(study, out, shard=(0, 2))
    assert any("readout merge" in line for line in logs)
    with pytest.raises(ReadoutError, match="not finished yet"):
        merge_run(out, log=lambda _: None)
    with pytest.raises(ReadoutError, match=r"shards to rerun: 1 of 2$"):  # shard 0 finished, shard 1 did not run
        merge_run(out, log=lambda _: None, shards=2)
    run_study(study, out, shard=(1, 2))
    with pytest.raises(SystemExit) as exc:
        main(["merge", str(out)])
    assert exc.value.code == 0
    for a, b in zip(tables(single[study]), tables(out)):
        pd.testing.assert_frame_equal(a, b)


def test_bad_shard(tmp_path):
    with pytest.raises(ReadoutError, match="--shard"):
        run_study("gap", tmp_path / "x", shard=(2, 2))
    with pytest.raises(ReadoutError, match="--force"):
        run_study("gap", tmp_path / "x", shard=(0, 2), force=True)


def test_merge_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(ReadoutError, match="manifest: missing"):
        merge_run(tmp_path, log=lambda _: None)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


LAUNCHERS = {
    "torchrun": lambda: ["torchrun", "--nproc_per_node", "2", "--master_port", free_port()],
    # --multi_gpu picks torch's elastic launcher; on a CPU-only machine the ranks form a gloo group.
    "accelerate": lambda: ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", free_port()],
}


@pytest.mark.heavy  # two processes launched by torchrun or accelerate
@pytest.mark.parametrize("launcher, study", [("torchrun", "gap"), ("accelerate", "gap"), ("torchrun", "nsi")])
def test_two_processes_equal_single_run(single, tmp_path, launcher, study):
    out = tmp_path / "ddp"
    head = LAUNCHERS[launcher]()
    bin_dir = Path(sys.executable).parent
    # A shadowing package in the working directory: `-m cli` would import it; the script path does not.
    (tmp_path / "stats.py").write_text("raise ImportError('the working directory shadowed the stats package')\n")
    cmd = [str(bin_dir / head[0]), *head[1:], str(bin_dir / "readout"), STUDIES[study][1], *STUDIES[study][3],
           "--out", str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[0/2] chunk 1/2: computed" in proc.stderr and "[1/2] chunk 2/2: computed" in proc.stderr
    for a, b in zip(tables(single[study]), tables(out)):
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-5, atol=1e-7)


@pytest.mark.heavy  # a bf16 run, single and in two shards
def test_bf16_shards_equal_the_single_bf16_run(tmp_path):
    """In bf16 too (where a different batch composition would change results), shards plus merge give the
    single-process tables: batch limits depend on the chunk and the profile, not on which process runs it."""
    bf16 = dict(model=ModelOptions("tiny-qwen2", loading=Loading(dtype="bfloat16")))
    run_study("gap", tmp_path / "single", **bf16)
    for i in range(2):
        run_study("gap", tmp_path / "sharded", shard=(i, 2), **bf16)
    merge_run(tmp_path / "sharded", log=lambda _: None)
    single, sharded = tables(tmp_path / "single"), tables(tmp_path / "sharded")
    assert "bfloat16" in (tmp_path / "single" / "manifest.json").read_text()
    for a, b in zip(single, sharded):
        pd.testing.assert_frame_equal(a, b)


def test_ranks_wait_longer_than_nccls_default(monkeypatch):
    """Ranks that finish their chunks early wait at the final barrier: the process group is formed with a
    timeout of hours, not NCCL's default 10 minutes."""
    import datetime

    import accelerate

    from readouts.driver import RANK_TIMEOUT, parallel_context

    seen = {}

    class FakeState:
        def __init__(self, cpu=False, **kwargs):
            seen.update(kwargs)
            self.process_index, self.num_processes, self.device = 1, 2, "cpu"

    monkeypatch.setattr(accelerate, "PartialState", FakeState)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert parallel_context(None, False, None)[:2] == (1, 2)
    assert seen["timeout"] == RANK_TIMEOUT >= datetime.timedelta(hours=6)


def test_merge_of_several_chunks_against_an_independent_reference(tmp_path):
    """A run in four chunks against the same run in one chunk, row for row, and against what the workload
    must hold, counted here from the panel: every dilemma read x framing x reply exactly once. The merged
    table is also the plain concatenation of the chunk files in chunk order (no chunk left out)."""
    from contract import FRAMINGS
    from panels.schema import load_panel

    options = dict(model=ModelOptions("tiny-qwen2"), limit=4, progress=False)
    many = run(NsiStudy(), RunOptions(out=str(tmp_path / "many"), overrides=("samples=1", "budget=6", "chunk_size=1"),
                                      **options), log=lambda _: None)
    one = run(NsiStudy(), RunOptions(out=str(tmp_path / "one"), overrides=("samples=1", "budget=6", "chunk_size=4"),
                                     **options), log=lambda _: None)
    assert len(list((many / "chunks").glob("nsi_replies-*.parquet"))) == 4
    assert len(list((one / "chunks").glob("nsi_replies-*.parquet"))) == 1
    for name in ("nsi_replies", "nsi_continuous"):
        merged = pd.read_parquet(many / f"{name}.parquet")
        pd.testing.assert_frame_equal(merged, pd.read_parquet(one / f"{name}.parquet"))
        chunks = sorted((many / "chunks").glob(f"{name}-*.parquet"))
        pd.testing.assert_frame_equal(merged, pd.concat([pd.read_parquet(p) for p in chunks], ignore_index=True))
    ids = [d.id for d in load_panel("nsi-14").records[:4]]
    replies = pd.read_parquet(many / "nsi_replies.parquet")
    want = sorted((d, f, j) for d in ids for f in FRAMINGS for j in range(2))
    assert sorted(zip(replies["dilemma_id"], replies["framing"], replies["sample"])) == want
