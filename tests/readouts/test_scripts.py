"""The cluster/GPU entry points run: gpu_check on a tiny CPU config, the SLURM script's syntax."""

import subprocess
import sys

from tests.conftest import ROOT


def test_gpu_check_runs_on_a_tiny_config(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "D readout:" in proc.stdout and "generation:" in proc.stdout
    assert '"d_probes": 32' in out.read_text() and '"gen_share_of_matmul"' in out.read_text()


def test_shell_scripts_parse():
    for script in ("scripts/slurm_readout.sh", "scripts/gpu_check.sh"):
        assert subprocess.run(["bash", "-n", script], cwd=ROOT).returncode == 0
