"""Manifest facts shared by every study: the model and its template, letters or words read, versions,
the git commit, and the default run directory.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict:
    import torch
    import transformers

    try:
        own = metadata.version("logit-readout")
    except metadata.PackageNotFoundError:
        own = None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "logit-readout": own}


def _version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def environment() -> dict:
    """Where the run ran (not part of a run's identity): threads, GPUs, CUDA and driver, and the versions of the
    libraries that shape tokenization, loading and quantization."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "gpus": gpus,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nvidia_driver": _nvidia_driver() if gpus else None,
        "packages": {p: _version_of(p) for p in ("tokenizers", "accelerate", "bitsandbytes", "safetensors", "peft", "numpy")},
    }


def model_manifest(lm, letters) -> dict:
    """The model, its template facts, the tokens read (`letters.as_manifest()`), versions, commit, command."""
    facts = lm.facts
    return {
        "model": {**{k: getattr(facts, k) for k in ("name", "source", "hf_id", "revision", "architecture", "dtype", "quantize",
                                                    "vocab_size", "lineage", "stage", "base_lineage")},
                  # A local folder: where it is and what it holds (absent for other sources, whose runs keep their identity).
                  **({"path": facts.path, "weights_fingerprint": facts.weights_fingerprint} if facts.source == "local" else {}),
                  **({"adapter": facts.adapter} if facts.adapter else {}),
                  **({"load_options": facts.load_options} if facts.load_options else {})},
        "device": facts.device,
        "template": {"chat_template_sha256": facts.chat_template_sha256, "bos_token_id": facts.bos_token_id,
                     "tokenizer_adds_bos": facts.tokenizer_adds_bos,
                     **({"template_kwargs": facts.template_kwargs} if facts.template_kwargs else {})},
        "letters": letters.as_manifest(),
        **_registry_provenance(getattr(lm, "spec", None)),
        "versions": _versions(),
        "environment": environment(),
        "git_commit": _git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
    }


def served_model_manifest(sm, letters: dict) -> dict:
    """The manifest's model facts for a served model (engine/served.py): the endpoint's model name and the
    id the server reports go in `model` (the run's identity); where it is served, the request settings and
    fingerprints go in `served` (outside the identity: a run resumes against the same model at a new address).
    The API key's value is never read here, only the name of its environment variable."""
    return {
        "model": {"name": sm.spec.name, "source": "served", "served": True, "served_id": sorted(sm.served_ids)},
        "device": "served",
        "template": {"chat_template_sha256": None, "rendered_by": "the server"},
        "letters": letters,
        "served": sm.manifest(),
        "versions": _versions(),
        "environment": environment(),
        "git_commit": _git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
    }


def _registry_provenance(spec) -> dict:
    """For a registered alias: the registry file that defined it and that file's sha256 (the built-in
    engine/data/models.toml or a user's `--models` file), so the run can be reproduced. Kept out of the run's
    identity: the model's own facts (id, revision, path, fingerprint) already are in it."""
    if spec is None or not getattr(spec, "registry_file", None):
        return {}
    return {"model_registry": {"file": spec.registry_file, "sha256": spec.registry_sha256}}


def default_out(model: str, panel: str, run_name: str) -> Path:
    """runs/<model>/<panel>/<run name>, the model name made safe as a folder name."""
    safe = model.replace("/", "__").strip("_.") or "model"
    return Path("runs") / Path(safe).name / panel / run_name


def file_sha256(path) -> str:
    """A file's sha256 (recorded beside every file a run reads: vector files, lenses)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
