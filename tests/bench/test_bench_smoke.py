"""`make bench`'s scripts run end to end, at the smallest sizes on a tiny model, and write their results:
a benchmark that no longer runs is found by the tests, not by the next person who times something."""

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.heavy  # every bench script in a subprocess: minutes on two cores

SMOKE = {
    "gen_bench": ["--model", "tiny-qwen2", "--prompts", "2", "--rollouts", "2", "--tokens", "3", "--reps", "1"],
    "score_bench": ["--model", "tiny-qwen2", "--scenarios", "1", "--orders", "2"],
    "d_readout_bench": ["--model", "tiny-qwen2", "--scenarios", "1", "--orders", "2", "--subset", "2"],
    "stats_bench": ["--n-scenarios", "60", "--n-boot", "20"],
    "plan_bench": ["--model", "tiny-qwen2", "--reps", "1"],
    "plan_8b_bench": ["--studies", "nsi-14"],
    "depth_bench": ["--model", "tiny-qwen2", "--scenarios", "1", "--orders", "2", "--reps", "1"],
    "draw_bench": ["--shapes", "2x1500", "--model", "tiny-qwen2", "--prompts", "1", "--rollouts", "2", "--tokens", "3",
                   "--reps", "1"],
    "host_bench": ["--layers", "2", "--prompts", "1", "--rollouts", "2", "--t1", "2", "--t2", "3", "--reps", "1"],
}


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_runs(script, tmp_path):
    proc = subprocess.run([sys.executable, f"bench/{script}.py", *SMOKE[script], "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written, f"{script} wrote no results"
    for name in written:
        assert json.loads((tmp_path / name).read_text())
