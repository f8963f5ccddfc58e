"""Run directories a user can trust: one process at a time, chunks that prove what they are, identity
covering what changes the numbers, and one-line errors (exit 2) for bad environments, before any model loads."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from cli.main import main
from engine.errors import ReadoutError
from readouts.driver import Interrupted, Loading, ModelOptions, RunOptions, run
from readouts.gap.study import GapStudy
from readouts.nsi.study import NsiStudy
from readouts.rundir import ManifestMismatch, RunLocked

SMALL = ("orders.D=2", "chunk_size=1")


def gap(out, model="tiny-qwen2", logs=None, **kw):
    """A 3-chunk D-only gap run: small enough to repeat many times."""
    options = RunOptions(model=ModelOptions(model, loading=Loading(token_budget=kw.pop("token_budget", None))), limit=3, out=str(out),
                         progress=False, overrides=SMALL, **kw)
    return run(GapStudy(readouts="D"), options, log=(logs.append if logs is not None else lambda _: None))


def tables(path):
    return [pd.read_parquet(Path(path) / f) for f in ("probes.parquet", "scenarios.parquet")]


def same_tables(a, b):
    for x, y in zip(tables(a), tables(b)):
        pd.testing.assert_frame_equal(x, y)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return gap(tmp_path_factory.mktemp("ref") / "run")


@pytest.mark.heavy  # a run in a second interpreter
def test_a_second_process_is_refused_while_the_first_runs(reference, tmp_path):
    out = tmp_path / "busy"
    cmd = [str(Path(sys.executable).with_name("readout")), "run", "--model", "tiny-qwen2", "--readouts", "D", "--limit", "3",
           "--set", SMALL[0], "--set", SMALL[1], "--out", str(out), "--no-progress"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / ".lock").exists() or not (out / ".lock").read_text().strip():
            assert time.time() < deadline and first.poll() is None, "the first run never took its lock"
            time.sleep(0.05)
        with pytest.raises(RunLocked, match="in use by another process"):
            gap(out, seed=7, force=True)
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    same_tables(reference, out)


def _corrupt(path: Path, how: str):
    chunk = path / "chunks" / "scenarios-00001.parquet"
    if how == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:100])
    elif how == "garbage":
        chunk.write_bytes(b"not a parquet file at all")
    elif how == "swapped":
        other = path / "chunks" / "scenarios-00002.parquet"
        a, b = chunk.read_bytes(), other.read_bytes()
        chunk.write_bytes(b)
        other.write_bytes(a)
    elif how == "rows dropped":  # rewritten by a tool that keeps the metadata but loses rows
        table = pq.read_table(chunk)
        pq.write_table(table.slice(0, table.num_rows - 1), chunk)


@pytest.mark.parametrize("how", ["truncated", "garbage", "swapped", "rows dropped"])
def test_a_bad_chunk_is_moved_aside_and_recomputed(reference, tmp_path, how):
    out = gap(tmp_path / "run")
    _corrupt(out, how)
    logs = []
    with pytest.raises(ReadoutError, match="chunk 2"):
        main_merge(out)
    gap(out, logs=logs)
    assert any("moved to" in line and line.startswith("chunk 2/3") for line in logs), logs
    assert list((out / "chunks" / "rejected").iterdir())
    same_tables(reference, out)


def main_merge(out):
    from readouts.driver import merge_run

    merge_run(out, log=lambda _: None)


def test_deleted_manifest_and_another_model_never_mixes(tmp_path):
    out = gap(tmp_path / "run", model="tiny-qwen2")
    (out / "manifest.json").unlink()
    logs = []
    gap(out, model="tiny-olmo3", logs=logs)
    assert sum("computed by another run" in line for line in logs) == 3
    df = pd.read_parquet(out / "scenarios.parquet")
    assert set(df.model) == {"tiny-olmo3"} and json.loads((out / "manifest.json").read_text())["model"]["name"] == "tiny-olmo3"


def test_identity_covers_the_token_budget_and_force_recovers_a_broken_manifest(tmp_path):
    out = gap(tmp_path / "run")
    with pytest.raises(ManifestMismatch, match="engine"):
        gap(out, token_budget=512)
    (out / "manifest.json").write_text("[1, 2")
    with pytest.raises(ReadoutError, match="not valid JSON"):
        gap(out)
    (out / "stale.parquet").write_bytes(b"x")
    logs = []
    gap(out, force=True, logs=logs)
    assert "unreadable" in logs[0] and not (out / "stale.parquet").exists()


def test_temp_files_of_a_killed_writer_are_removed(tmp_path):
    with pytest.raises(Interrupted):
        gap(tmp_path / "run", stop_after_chunks=1)
    leftover = tmp_path / "run" / "chunks" / ".scenarios-00001.parquet.k1ll3d"
    leftover.write_bytes(b"half")
    logs = []
    gap(tmp_path / "run", logs=logs)
    assert not leftover.exists() and any("temporary files" in line for line in logs)


def test_nsi_kill_and_resume_equals_uninterrupted(tmp_path):
    def nsi(out, **kw):
        options = RunOptions(model=ModelOptions("tiny-qwen2"), limit=4, out=str(out), progress=False,
                             overrides=("samples=1", "budget=6", "chunk_size=1"), **kw)
        return run(NsiStudy(), options, log=lambda _: None)

    full = nsi(tmp_path / "full")
    with pytest.raises(Interrupted):
        nsi(tmp_path / "cut", stop_after_chunks=2)
    cut = nsi(tmp_path / "cut")
    for name in ("nsi_replies.parquet", "nsi_continuous.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(full / name), pd.read_parquet(cut / name))


def cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return exc.value.code, err


def test_prompt_longer_than_the_context_names_file_and_line(tmp_path, capsys):
    probes = tmp_path / "probes.jsonl"
    lines = [{"id": "ok", "text": "Pick one. Answer:", "letters": ["A", "B"]},
             {"id": "long", "text": "word " * 6000 + "Answer:", "letters": ["A", "B"]}]
    probes.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code, err = cli(["score", str(probes), "--model", "tiny-qwen2", "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and len(err) == 1 and f"{probes}:2: text: " in err[0] and "> the model's 4096" in err[0]
    assert not (tmp_path / "o.jsonl").exists()
    panel = tmp_path / "long.jsonl"
    record = json.loads(Path("panels/data/gap-v1.jsonl").read_text().splitlines()[0])
    record["context"] = "The day was long. " * 1500 + record["context"]
    panel.write_text(json.dumps(record) + "\n")
    code, err = cli(["run", "--model", "tiny-qwen2", "--panel", str(panel), "--readouts", "D", "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and len(err) == 1 and f"{panel}:1: context (agent, primary): " in err[0]


def _read_only_dir(tmp_path) -> Path:
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro / "run"
    candidate = Path("/sys/logit-readout-test-run")  # root writes anywhere else; sysfs refuses new folders
    try:
        candidate.mkdir()
    except OSError:
        return candidate
    candidate.rmdir()
    pytest.skip("no read-only folder to test with")


@pytest.mark.parametrize("case", ["read-only", "out is a file", "invalid utf-8"])
def test_environment_errors_are_one_line_before_any_model_loads(tmp_path, capsys, case):
    # The model does not exist: reaching the model would say so instead of naming the path.
    if case == "invalid utf-8":
        bad = tmp_path / "probes.jsonl"
        bad.write_bytes(b'{"id": 1, "text": "caf\xe9", "letters": ["A"]}\n')
        code, err = cli(["score", str(bad), "--model", "no-such-model", "--out", str(tmp_path / "o.jsonl")], capsys)
        assert code == 2 and len(err) == 1 and f"{bad}: file: not UTF-8" in err[0]
        return
    out = _read_only_dir(tmp_path) if case == "read-only" else tmp_path / "file"
    if case == "out is a file":
        out.write_text("x")
    code, err = cli(["run", "--model", "no-such-model", "--out", str(out)], capsys)
    assert code == 2 and len(err) == 1 and str(out) in err[0] and "--out" in err[0], err


def test_line_separators_inside_strings_and_nan_temperature(tmp_path, capsys):
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": 1, "text": "one\u2028two\u0085three Answer:", "letters": ["A", "B"]}, ensure_ascii=False) + "\n",
                      encoding="utf-8")
    code, err = cli(["score", str(probes), "--model", "tiny-qwen2", "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 0 and len((tmp_path / "o.jsonl").read_text().splitlines()) == 1
    assert oct((tmp_path / "o.jsonl").stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    code, err = cli(["score", str(probes), "--model", "tiny-qwen2", "--out", str(tmp_path / "n.jsonl"), "--temperature", "nan"], capsys)
    assert code == 2 and "--temperature" in err[0]


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_lock_of_a_killed_process_is_taken_over(reference, tmp_path):
    out = tmp_path / "stale"
    code = ("import os, signal; from readouts.rundir import RunDir\n"
            f"with RunDir({str(out)!r}, ('x',)).lock():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -9 and "pid" in (out / ".lock").read_text()
    gap(out)
    same_tables(reference, out)


def test_an_interrupt_says_what_was_kept(monkeypatch, capsys):
    import engine.registry

    def interrupted(*files):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.registry, "registry", interrupted)
    code, err = cli(["models"], capsys)
    assert code == 130 and err == ["interrupted: finished chunks are kept; give the same command again to resume"]


def test_the_outcome_goes_to_stdout_and_progress_to_stderr(tmp_path, capsys):
    """`readout run` and `readout merge` print where the tables are, the summary and the wall time on stdout (a
    script can capture them), the chunk-by-chunk progress on stderr; one chunk is '1 chunk'."""
    out = tmp_path / "run"
    args = ["run", "--model", "tiny-qwen2", "--readouts", "D", "--limit", "1", "--no-progress", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main(args)
    cap = capsys.readouterr()
    stdout, stderr = cap.out.splitlines(), cap.err.splitlines()
    assert exc.value.code == 0
    assert stdout[0].startswith("tables: ") and str(out / "probes.parquet") in stdout[0]
    wall = [line for line in stdout if line.startswith("wall time ")]
    assert len(wall) == 1 and " s for 1 chunk; rates: D " in wall[0] and stdout[-1].startswith("next: readout stats ")
    assert "summary: needs the D and J readouts (run with --readouts including D,J)" in stdout
    assert any(line.startswith("chunk 1/1: computed ") for line in stderr)
    assert not any(line.startswith(("tables: ", "wall time ")) for line in stderr)
    with pytest.raises(SystemExit) as exc:
        main(["merge", str(out)])
    stdout = capsys.readouterr().out.splitlines()
    assert exc.value.code == 0 and stdout[0].startswith(f"merged 1 chunk into {out}: ")
