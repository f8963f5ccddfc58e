"""The decoding shapes scripts/gpu_check.py times (bench/gpu_shapes.json): a set for the H200 and one for the H100, the
set picked by the device's total memory and recorded, and every H100 shape's keys/values within what a run on the
H100 lets one generation batch hold."""

import importlib.util
import json
import types

import pytest
import torch
from transformers import AutoConfig

from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

SHAPES = ROOT / "bench" / "gpu_shapes.json"
GB, GIB = 10**9, 2**30
KV_BYTES_PER_TOKEN = {  # keys and values, every layer, bf16: 2 x layers x KV heads x head_dim x 2 bytes
    "llama3": 2 * 32 * 8 * 128 * 2,  # Llama-3.1-8B: 32 layers, 8 KV heads of 128
    "olmo3": 2 * 32 * 32 * 128 * 2,  # OLMo-3-7B: 32 layers, 32 KV heads (full multi-head) of 128
}


def _device(monkeypatch, total_memory):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: types.SimpleNamespace(total_memory=total_memory))
    return gpu_check.device_total_memory("cuda")


@pytest.mark.parametrize("total, expected", [
    (80 * GB, "h100"), (79.2 * GIB, "h100"), (78 * GIB, "h100"),  # an H100 80 GB as quoted, as torch reports it, as lent
    (141 * GB, "h200"), (143771 * 2**20, "h200"), (139 * GIB, "h200"),
    (96 * GIB, "h100"), (192 * GB, "h200"),  # larger cards get the largest set they hold
])
def test_the_shape_set_follows_the_devices_total_memory(monkeypatch, total, expected):
    memory = _device(monkeypatch, int(total))
    assert memory == int(total)
    for arch in ("llama3", "olmo3"):
        shapes, chosen = gpu_check.load_shapes(str(SHAPES), arch, memory)
        assert chosen["shape_set"] == expected and "device memory" in chosen["shape_set_reason"]
        assert shapes == json.loads(SHAPES.read_text())[expected]["shapes"][arch]


def test_the_shape_set_without_a_fitting_gpu_on_cpu_or_named(tmp_path):
    shapes, chosen = gpu_check.load_shapes(str(SHAPES), "llama3", 46 * GB)  # an L40S: less than every set's GPU
    assert chosen["shape_set"] == "h100" and "may not fit" in chosen["shape_set_reason"]
    assert gpu_check.device_total_memory("cpu") is None
    _, chosen = gpu_check.load_shapes(str(SHAPES), "llama3", None)
    assert chosen["shape_set"] == "h200" and chosen["shape_set_reason"] == "no CUDA device: the largest set"
    _, chosen = gpu_check.load_shapes(str(SHAPES), "olmo3", 141 * GB, "h100")
    assert chosen == dict(shape_set="h100", shape_set_memory_gb=pytest.approx(85.52, abs=0.01),
                          shape_set_reason="named by --shape-set")
    with pytest.raises(SystemExit, match=r"^error: --shape-set: 'a100' is not a set of the shapes file \(it holds h100, h200\)$"):
        gpu_check.load_shapes(str(SHAPES), "llama3", None, "a100")
    flat = tmp_path / "flat.json"  # one architecture -> shapes map, with no GPU named
    flat.write_text(json.dumps({"llama3": [dict(label="J x9")]}))
    with pytest.raises(SystemExit, match=rf"^error: --shapes: {flat}: not a map of GPU name"):
        gpu_check.load_shapes(str(flat), "llama3", None)


@pytest.mark.parametrize("arch", ["llama3", "olmo3"])
def test_every_h100_shape_holds_its_keys_and_values_in_half_the_usable_memory(arch):
    """Each H100 shape's batch as the static path allocates it (its distinct prompts, and every row of its bucket with
    an own buffer of the whole budget) holds at most half the H100's usable memory in keys/values: what is left beside
    the bf16 weights, the fp32 copy of the head and the CUDA context (engine.batching.usable_bytes), the share one
    generation batch may take. The H200's set would not: its widest batches hold about twice as much."""
    from engine.batching import GENERATION_CACHE_SHARE, usable_bytes
    from readouts.plan import GPUS, model_size

    spec = dict(gpu_check.ARCHS[arch])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    size = model_size(config)
    assert size.kv_bytes_per_token == KV_BYTES_PER_TOKEN[arch]
    sets = json.loads(SHAPES.read_text())
    h100 = sets["h100"]
    assert h100["memory_bytes"] == GPUS["h100"].memory
    head_copy = 4 * config.vocab_size * config.hidden_size
    half = 0.5 * usable_bytes(h100["memory_bytes"], size.weight_bytes, head_copy)
    assert GENERATION_CACHE_SHARE == 0.5 and half < 0.5 * (h100["memory_bytes"] - size.weight_bytes)
    shapes = h100["shapes"][arch]
    assert shapes and {s["budget"] for s in shapes} == {64, 512, 2048}

    def allocated(s):
        return (s["prompt_tokens"] + s["bucket"] * s["budget"]) * KV_BYTES_PER_TOKEN[arch]

    for s in shapes:
        assert s["rows"] <= s["bucket"] and allocated(s) <= half, s
    assert any(allocated(s) > half for s in sets["h200"]["shapes"][arch])
