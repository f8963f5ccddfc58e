"""Model registry and resolution: aliases as data, local folders, HF ids, and clear errors."""

import pytest

from engine.errors import ModelUnavailableError, UnknownModelError
from engine.loading import is_available, load_model
from engine.registry import registry, resolve
from engine.tiny import ensure_tiny

EXPECTED = {
    "olmo-3-7b": "allenai/Olmo-3-7B-Instruct",
    "olmo-3-7b-sft": "allenai/Olmo-3-7B-Instruct-SFT",
    "olmo-3-7b-dpo": "allenai/Olmo-3-7B-Instruct-DPO",
    "olmo-3-7b-base": "allenai/Olmo-3-1025-7B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-8b-base": "meta-llama/Llama-3.1-8B",
    "tulu-3-8b-sft": "allenai/Llama-3.1-Tulu-3-8B-SFT",
    "tulu-3-8b-dpo": "allenai/Llama-3.1-Tulu-3-8B-DPO",
    "tulu-3-8b": "allenai/Llama-3.1-Tulu-3-8B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-7b-base": "Qwen/Qwen2.5-7B",
}


def test_aliases_of_the_design():
    specs = registry()
    for alias, hf_id in EXPECTED.items():
        assert specs[alias].source == "hub" and specs[alias].hf_id == hf_id
    assert specs["smollm2-135m"].source == "embedded"
    assert {a for a, s in specs.items() if s.source == "tiny"} == {
        "tiny-olmo3", "tiny-qwen2", "tiny-llama3", "tiny-tulu3", "tiny-base"}
    assert [a for a in EXPECTED if a.endswith("-base")] and not specs["olmo-3-7b-base"].chat


def test_resolve_folder_and_hf_id():
    folder = ensure_tiny("tiny-qwen2")
    spec = resolve(str(folder))
    assert spec.source == "local" and spec.path == str(folder.resolve())
    assert resolve("some-org/some-model").source == "hub"


@pytest.mark.parametrize("name", ["nope", "./does/not/exist", "a b/c"])
def test_unknown_model(name):
    with pytest.raises(UnknownModelError, match="unknown model"):
        resolve(name)


def test_folder_without_config(tmp_path):
    with pytest.raises(UnknownModelError, match="config.json"):
        resolve(str(tmp_path))


def test_missing_hub_model_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelUnavailableError) as err:
        load_model("qwen2.5-7b")
    msg = str(err.value)
    assert "\n" not in msg and "Qwen/Qwen2.5-7B-Instruct" in msg and "`hf download Qwen/Qwen2.5-7B-Instruct`" in msg
    assert is_available(registry()["qwen2.5-7b"])[0] is False


def test_quantize_is_validated():
    from engine.errors import ReadoutError

    with pytest.raises(ReadoutError, match="--quantize"):
        load_model("tiny-qwen2", quantize="3bit")
