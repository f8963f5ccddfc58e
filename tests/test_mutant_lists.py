"""The mutation lists follow the code (`make test`): every entry of tests/mutants/*.toml names a file that
exists, a `find` text that occurs in it exactly once (so `make mutants` can apply it), and tests that exist,
so an entry cannot go stale silently when the code it targets moves."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("mutants_script", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module while the class is made
    spec.loader.exec_module(module)
    return module


SCRIPT = _load_script()
MUTANTS = SCRIPT.load_mutants()


def test_the_lists_are_not_empty():
    assert len(MUTANTS) >= 50


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_every_find_matches_exactly_once(mutant):
    target = ROOT / mutant.file
    assert target.is_file(), f"{mutant.source}: {mutant.id}: file {mutant.file} does not exist"
    count = target.read_text(encoding="utf-8").count(mutant.find)
    assert count == 1, f"{mutant.source}: {mutant.id}: 'find' occurs {count} times in {mutant.file}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_every_listed_test_exists(mutant):
    for node in mutant.tests:
        path, _, rest = node.partition("::")
        test_file = ROOT / path
        assert test_file.is_file(), f"{mutant.source}: {mutant.id}: {path} does not exist"
        name = rest.split("::")[-1].split("[")[0]
        if name:
            assert re.search(rf"^\s*def {re.escape(name)}\(", test_file.read_text(encoding="utf-8"), re.M), (
                f"{mutant.source}: {mutant.id}: no test {name} in {path}")


def test_the_scratch_copy_runs_its_tests_against_this_checkout_s_vllm(monkeypatch, tmp_path):
    """The scratch copy has no .venv-served: its tests are pointed at the vLLM this checkout finds."""
    from engine import vllm_server

    served = tmp_path / "python"
    monkeypatch.setenv(vllm_server.SERVER_PYTHON_ENV, str(served))
    env = SCRIPT._env()
    assert env[vllm_server.SERVER_PYTHON_ENV] == str(served) and env["HF_HUB_OFFLINE"] == "1"
