"""Local checkpoint folders are identified by what they hold: two folders with different weights (same name,
same layout) get different fingerprints in the manifest; a copy of the same folder gets the same one."""

import shutil

import torch

from engine.loading import load_model, weights_fingerprint
from engine.tiny import ensure_tiny
from readouts.manifest import model_manifest


def test_two_local_folders_with_different_weights_differ(tmp_path):
    from transformers import AutoModelForCausalLM

    a, b, c = tmp_path / "a" / "ckpt", tmp_path / "b" / "ckpt", tmp_path / "c" / "ckpt"
    for folder in (a, b, c):
        shutil.copytree(ensure_tiny("tiny-llama3"), folder)
    model = AutoModelForCausalLM.from_pretrained(b)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3)  # "retrained": same names, shapes, dtype and file sizes; other values
    model.save_pretrained(b)
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    assert weights_fingerprint(a) == weights_fingerprint(c) != weights_fingerprint(b)
    manifests = [model_manifest(lm, lm.letters("AB"))["model"] for lm in (load_model(str(a), device="cpu"),
                                                                          load_model(str(b), device="cpu"))]
    assert manifests[0]["path"] == str(a.resolve()) and manifests[1]["path"] == str(b.resolve())
    assert manifests[0]["weights_fingerprint"] != manifests[1]["weights_fingerprint"]
    tiny = load_model("tiny-llama3", device="cpu")
    assert "weights_fingerprint" not in model_manifest(tiny, tiny.letters("AB"))["model"]  # other sources keep their identity
