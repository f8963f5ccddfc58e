"""The cluster/GPU entry points run: gpu_check on a tiny CPU config, the SLURM script's syntax."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.heavy
def test_gpu_check_runs_on_a_tiny_config(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "D readout:" in proc.stdout and "generation:" in proc.stdout
    assert '"d_probes": 32' in out.read_text() and '"gen_share_of_matmul"' in out.read_text()
    result = __import__("json").loads(out.read_text())
    assert result["complete"] and result["parts_done"] == ["d", "gen", "decode", "generators"]
    assert result["generators"]["paths"]["dynamic"]["sampled_total"] > 0


def test_gpu_check_generators_part_compares_the_paths_and_the_batchings_on_cpu(tmp_path):
    """The generators part on the tiny CPU config: the dynamic path's wall seconds and new tokens/s in one call and
    in two, how many seeded rollouts are equal token for token across the two batchings (all of them: the draws are
    keyed per prompt and rollout), the graph path and the paths' greedy comparison marked CUDA only, and one line on
    vLLM, whether or not it is installed; every figure in the JSON and in bench/gpu_results.py's table."""
    import json

    out = tmp_path / "gpu_generators_olmo3.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--parts", "generators", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["complete"] and result["parts_done"] == ["generators"]
    g = result["generators"]
    assert g["shape"]["label"].startswith("J ") and g["prompts"] == 3 and g["two_calls"] == [1, 2]
    assert g["rollouts_per_prompt"] == 3 and g["temperature"] > 0 and g["new_tokens"] == 8
    assert g["paths"]["graph"] == "CUDA only" and g["greedy_graph_vs_dynamic"] == "CUDA only"
    dynamic = g["paths"]["dynamic"]
    assert dynamic["static_shapes"] is False and dynamic["cuda_graph"] is False
    for run, calls in (("one_call", 1), ("two_calls", 2)):
        assert dynamic[run]["calls"] == calls and dynamic[run]["seconds"] > 0
        assert dynamic[run]["new_tokens"] == 3 * 3 * 8 and dynamic[run]["new_tokens_per_s"] > 0
    assert (dynamic["sampled_equal_across_batchings"], dynamic["sampled_total"]) == (6, 6)
    assert (dynamic["greedy_equal_across_batchings"], dynamic["greedy_total"]) == (3, 3)
    assert g["vllm"].startswith(("not installed on this node: ", "needs a checkpoint folder: "))
    assert "seeded sampled rollouts equal across the two batchings: 6 of 6" in proc.stdout
    table = subprocess.run([sys.executable, "bench/gpu_results.py", "--run", str(tmp_path)], cwd=ROOT, capture_output=True,
                           text=True)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "| own, dynamic path | " in table.stdout and "| 6 of 6 | 3 of 3 |" in table.stdout
    assert "| own, graph path | CUDA only |" in table.stdout and "| vLLM | " in table.stdout


def test_gpu_check_generators_part_says_vllm_is_not_installed_without_failing(tmp_path, monkeypatch):
    """Where no Python here imports vllm, the vLLM generator's figure is one line saying so."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    import engine.vllm_server as vllm_server

    monkeypatch.setattr(vllm_server, "server_python", lambda: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert gpu_check.vllm_here().startswith("not installed on this node: no .venv-served beside the project")
    broken = tmp_path / "python"
    broken.write_text("#!/usr/bin/env bash\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(vllm_server, "server_python", lambda: str(broken))
    assert gpu_check.vllm_here() == f"not installed on this node: {broken} -c 'import vllm': ModuleNotFoundError: No module named vllm"


def test_generator_shape_is_the_smallest_j_shape_holding_two_prompts():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    shapes = [dict(label="J x9", n=9, rows=481), dict(label="J x9", n=9, rows=9), dict(label="J x9", n=9, rows=72),
              dict(label="dose_brief x4", n=4, rows=8)]
    assert gpu_check.generator_shape(shapes)["rows"] == 72
    with pytest.raises(SystemExit, match="no J shape"):
        gpu_check.generator_shape(shapes[3:])


@pytest.mark.heavy
def test_gpu_check_stopped_mid_run_keeps_the_figures_of_the_parts_before(tmp_path):
    """Stopped as a time limit stops it (SIGTERM) once the generation part has printed, during the decode part: the
    JSON holds the D readout's and generation's figures, and says which parts finished."""
    import json
    import signal

    out = tmp_path / "gpu.json"
    proc = subprocess.Popen([sys.executable, "scripts/gpu_check.py", "--tiny", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("generation:"):
                proc.send_signal(signal.SIGTERM)
                break
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert any(line.startswith("generation:") for line in seen), "".join(seen)[-2000:]
    assert proc.returncode == -signal.SIGTERM
    result = json.loads(out.read_text())
    assert result["parts_done"] == ["d", "gen"] and not result.get("complete")
    assert result["d_probes"] == 32 and result["gen_tokens"] > 0 and "decode" not in result


def test_token_agreement_counts_equal_rows_and_where_the_others_part():
    import importlib.util

    from engine.generation import Rollout

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    r = lambda *t: Rollout(tuple(t), False, True)  # noqa: E731
    a = [[r(1, 2, 3), r(4, 5, 6)], [r(7, 8, 9)]]
    b = [[r(1, 2, 3), r(4, 0, 6)], [r(0, 8, 9)]]
    assert gpu_check.token_agreement(a, b) == dict(rows=3, rows_equal=1, median_first_difference=1)
    assert gpu_check.token_agreement(a, a) == dict(rows=3, rows_equal=3, median_first_difference=None)


def test_gpu_check_sh_limits_fit_a_device_call(tmp_path):
    """The parts' time limits, start-up and kill grace included, add up to under 9 minutes (a device call stops at 10),
    for the default architectures; limits that add up to more are refused in one line before anything runs."""
    import re

    env = {k: v for k, v in os.environ.items() if not k.endswith("_SECONDS") and k not in ("ARCH", "OUT")}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--limits"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    total = int(re.match(r"time limits: (\d+) s in all, under 540 s \(", proc.stdout).group(1))
    assert total < 540 and "x 2 (llama3 olmo3)" in proc.stdout
    parts = [int(x) for x in re.findall(r"(\d+) s", proc.stdout.split("(", 1)[1])]
    setup, equal, draw, arch, generators, results, grace = parts
    assert setup + equal + draw + 2 * arch + generators + results + 7 * grace == total
    over = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env={**env, "ARCH_SECONDS": "300", "OUT": str(tmp_path)},
                          capture_output=True, text=True)
    assert over.returncode == 2 and len(over.stderr.strip().splitlines()) == 1
    assert over.stderr.startswith("error: time limits: ") and "not under 540 s" in over.stderr and "ARCH_SECONDS" in over.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.log"]  # refused before any part ran; the log says why
    assert (tmp_path / "gpu_check.log").read_text() == over.stderr


def test_shell_scripts_parse():
    for script in ("scripts/slurm_readout.sh", "scripts/slurm_submit.sh", "scripts/slurm_merge.sh", "scripts/gpu_check.sh"):
        assert subprocess.run(["bash", "-n", script], cwd=ROOT).returncode == 0


def _fake(path, body):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return str(path)


def test_slurm_submission_dry_run(tmp_path):
    """The submit script with a fake sbatch: an array of shard tasks, logs in a folder it creates, the shard
    count passed explicitly, absolute paths, a merge after every task has ended (afterany); --only resubmits
    one index. The task script then runs shard i of n whatever the array's size."""
    calls = tmp_path / "sbatch.calls"
    sbatch = _fake(tmp_path / "sbatch", f'echo "$*" >> {calls}\necho $((1000 + $(wc -l < {calls})))\n')
    env = {**os.environ, "SBATCH": sbatch, "LOGS": str(tmp_path / "logs")}
    submit = str(ROOT / "scripts" / "slurm_submit.sh")
    proc = subprocess.run([submit, "tiny-llama3", "gap-v1", "quick", "runs/x", "4"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    array, merge = calls.read_text().splitlines()
    assert (tmp_path / "logs").is_dir()
    assert "--array=0-3" in array and "SHARDS=4" in array and f"ROOT={ROOT}" in array and f"{ROOT}/runs/x" in array
    assert "DEVICE=cuda" in array
    assert f"--output={tmp_path}/logs/readout-%A_%a.out" in array
    assert "--dependency=afterany:1001" in merge and "slurm_merge.sh" in merge
    proc = subprocess.run([submit, "tiny-llama3", "gap-v1", "quick", "/abs/run", "4", "--only", "2"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "--array=2 " in calls.read_text().splitlines()[2] and " /abs/run" in calls.read_text()
    bad = subprocess.run([submit, "m", "p", "q", "o", "4", "--only", "4"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a shard index of 4" in bad.stderr

    readout = _fake(tmp_path / "readout", 'echo "$*"\n')
    task_env = {**os.environ, "ROOT": str(ROOT), "SHARDS": "8", "SLURM_ARRAY_TASK_ID": "5", "READOUT": readout}
    task = subprocess.run(["bash", "scripts/slurm_readout.sh", "m", "gap-v2", "paper", "runs/y"], cwd=ROOT, env=task_env,
                          capture_output=True, text=True)
    assert task.returncode == 0, task.stderr
    assert task.stdout.split() == ["run", "--model", "m", "--panel", "gap-v2", "--profile", "paper", "--out", f"{ROOT}/runs/y",
                                   "--shard", "5/8", "--device", "cuda", "--no-progress"]
    task_env["SLURM_ARRAY_TASK_ID"] = "8"
    task = subprocess.run(["bash", "scripts/slurm_readout.sh", "m", "gap-v2", "paper", "runs/y"], cwd=ROOT, env=task_env,
                          capture_output=True, text=True)
    assert task.returncode == 2 and "not a shard index of 8 shards" in task.stderr

    failing = _fake(tmp_path / "readout-fails", 'echo "error: chunks: 2 of 8 not finished yet; shards to rerun: 3 of 8" >&2\nexit 2\n')
    merge_env = {**os.environ, "ROOT": str(ROOT), "SHARDS": "8", "READOUT": failing}
    merged = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_merge.sh"), "/abs/run", "m", "gap-v2", "paper"], cwd=tmp_path, env=merge_env,
                            capture_output=True, text=True)
    assert merged.returncode == 1 and "shards to rerun: 3 of 8" in merged.stderr
    assert "slurm_submit.sh m gap-v2 paper /abs/run 8 --only <index>" in merged.stderr


def test_slurm_task_without_a_usable_gpu_fails_at_once_in_one_line(tmp_path):
    """An array task on a node where CUDA cannot be used (this machine) stops before loading anything, with one line
    naming CUDA, instead of running the model on the CPU until the time limit; DEVICE=cpu is the CPU by choice."""
    import time

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU: the task would run on it")
    env = {**os.environ, "ROOT": str(ROOT), "SHARDS": "2", "SLURM_ARRAY_TASK_ID": "0"}
    env.pop("DEVICE", None)
    env.pop("READOUT", None)  # the installed readout
    args = ["bash", "scripts/slurm_readout.sh", "tiny-llama3", "gap-v1", "quick", str(tmp_path / "run")]
    t0 = time.monotonic()
    task = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - t0
    assert task.returncode != 0, task.stdout[-2000:]
    lines = task.stderr.strip().splitlines()
    assert len(lines) == 1, task.stderr
    assert lines[0].startswith("error: --device: 'cuda'") and "cuda" in lines[0].lower(), lines[0]
    assert seconds < 60, f"the task ran {seconds:.0f} s before failing"
    assert not (tmp_path / "run" / "chunks").exists()

    readout = _fake(tmp_path / "readout", 'echo "$*"\n')
    cpu = subprocess.run(args, cwd=ROOT, env={**env, "READOUT": readout, "DEVICE": "cpu"}, capture_output=True, text=True)
    assert cpu.returncode == 0, cpu.stderr
    assert "--device cpu" in cpu.stdout and "--shard 0/2" in cpu.stdout
