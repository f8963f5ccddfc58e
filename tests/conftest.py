"""Shared fixtures and the test tiers' hooks: tiny models (built offline, cached across runs), the embedded SmolLM2
model, the served-model server, a PEFT adapter; `slow` tests skip unless the slow tier is asked for. The helpers these
fixtures use, and that test modules import, are in tests/helpers.py."""

import os

import pytest

from tests.helpers import get_model, make_adapter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    # Each xdist worker gets its share of the cores: torch's default (every core in every process) oversubscribes
    # them, and OpenMP threads waiting on each other make the tiny-model runs several times slower.
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


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


@pytest.fixture()
def adapter(tmp_path):
    """A LoRA adapter on tiny-llama3, saved: (its folder, the unmerged PEFT model)."""
    return make_adapter(tmp_path / "adapter")


SLOW_ENV = "LOGIT_READOUT_SLOW"
"""Set (to anything but empty) it runs the `slow` tests, as --run-slow does."""


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help=f"run the tests marked slow (make test-slow; or set {SLOW_ENV}=1); without it they skip")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or os.environ.get(SLOW_ENV):
        return
    skip = pytest.mark.skip(reason=f"slow tier: make test-slow (or --run-slow, or {SLOW_ENV}=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
