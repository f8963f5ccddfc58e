"""Tiny offline models: deterministic bytes, the real architectures, and the embedded model's conversion."""

import hashlib
import os

import pytest

from engine import tiny
from tests.helpers import TINY, get_model


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_builds_are_byte_identical(tmp_path):
    first = {a: _digest(tiny.build_tiny(a, tmp_path / "one" / a)) for a in TINY}
    tiny._trained_tokenizer_json.cache_clear()  # retrain the tokenizer from scratch too
    second = {a: _digest(tiny.build_tiny(a, tmp_path / "two" / a)) for a in TINY}
    assert first == second
    for files in first.values():
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)


@pytest.mark.parametrize(
    "alias,arch",
    [("tiny-olmo3", "Olmo3ForCausalLM"), ("tiny-qwen2", "Qwen2ForCausalLM"), ("tiny-llama3", "LlamaForCausalLM"),
     ("tiny-tulu3", "LlamaForCausalLM"), ("tiny-base", "LlamaForCausalLM")],
)
def test_architectures_and_templates(alias, arch):
    lm = get_model(alias)
    assert lm.facts.architecture == arch
    assert lm.facts.dtype == "float32" and lm.facts.device == "cpu"
    assert (lm.facts.chat_template_sha256 is None) == (alias == "tiny-base")


def test_olmo3_keeps_both_attention_kinds():
    cfg = get_model("tiny-olmo3").model.config
    assert cfg.layer_types == ["sliding_attention", "full_attention"]


def test_unknown_tiny_name():
    with pytest.raises(KeyError):
        tiny.ensure_tiny("tiny-gpt9")


def test_built_models_follow_the_umask(tmp_path, monkeypatch):
    """A shared cache must not become private to one user: build folders get the umask's permissions."""
    monkeypatch.setenv("LOGIT_READOUT_CACHE", str(tmp_path))
    old = os.umask(0o022)
    try:
        folder = tiny.ensure_tiny("tiny-base")
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o755
