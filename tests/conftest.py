"""Shared fixtures: tiny models (built offline, cached across runs) and the embedded SmolLM2 model."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    # Each xdist worker gets its share of the cores: torch's default (every core in every process) oversubscribes
    # them, and OpenMP threads waiting on each other make the tiny-model runs several times slower.
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

ROOT = Path(__file__).resolve().parents[1]
"""The repository root."""
FIXTURES = ROOT / "tests" / "fixtures"
GOLDENS = ROOT / "tests" / "goldens"

TINY = ["tiny-olmo3", "tiny-qwen2", "tiny-llama3", "tiny-tulu3", "tiny-base"]
CHAT_TINY = ["tiny-olmo3", "tiny-qwen2", "tiny-llama3", "tiny-tulu3"]

_loaded = {}


def get_model(name):
    """Load a model once per test process."""
    from engine.loading import load_model

    if name not in _loaded:
        _loaded[name] = load_model(name, device="cpu")
    return _loaded[name]


def one_batch(fake):
    """A stand-in for engine.generation.generate that returns `fake(model, prompts, **kw)`'s rollouts as one batch:
    like the real one, it hands them to `on_rollouts` (the runner reads each batch there) before returning."""
    def generate(model, prompts, **kw):
        out = fake(model, prompts, **kw)
        if kw.get("on_rollouts") is not None:
            kw["on_rollouts"](list(range(len(prompts))), out)
        return out
    return generate


@pytest.fixture(scope="session")
def models():
    return get_model


@pytest.fixture(scope="session")
def served_server(tmp_path_factory):
    """vLLM on the embedded SmolLM2 at 127.0.0.1 (tests/served_helpers.py), started once per test process (under
    `-n 2` each worker that runs a served test starts its own: xdist_group does not group tests under pytest 9.2,
    whose node ids xdist 3.8 can no longer suffix)."""
    from engine.embedded import ensure_smollm2
    from tests.served_helpers import VllmServer, require_server

    server = VllmServer(require_server(), ensure_smollm2(), log=tmp_path_factory.mktemp("vllm") / "server.log")
    server.start()
    yield server
    server.stop()
