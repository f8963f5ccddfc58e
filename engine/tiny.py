"""Tiny offline test models: a locally trained byte-level BPE tokenizer, each family's chat template,
and small random-weight causal LMs of the real architectures. Deterministic: the same bytes every build.

Nothing here downloads anything. Models are built on first use into `cache_root()/tiny/<fingerprint>/<alias>`
(about a second each) and reused afterwards; the fingerprint hashes this builder, its corpus, the
templates and the library versions, so any change builds afresh.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from engine.paths import build_lock, cache_root, staging_dir

BUILD_VERSION = 1
SEED = 20261130
VOCAB_SIZE = 1200

# Every special token any tiny family uses lives in the one shared vocabulary.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|pad|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
]


@dataclass(frozen=True)
class TinyFamily:
    """How one tiny model mirrors its real family."""

    architecture: str
    """transformers class name of the model."""
    template: str | None
    """File name of the chat template in engine/templates, or None for a base model."""
    bos: str | None
    """BOS token, or None when the family has none."""
    eos: str
    """End-of-turn token."""
    pad: str
    """Padding token."""
    tokenizer_adds_bos: bool
    """Whether encoding plain text prepends BOS (Llama-3 style post-processor)."""


FAMILIES: dict[str, TinyFamily] = {
    "tiny-olmo3": TinyFamily("Olmo3ForCausalLM", "olmo3.jinja", "<|endoftext|>", "<|endoftext|>", "<|pad|>", False),
    "tiny-qwen2": TinyFamily("Qwen2ForCausalLM", "qwen2.jinja", None, "<|im_end|>", "<|endoftext|>", False),
    "tiny-llama3": TinyFamily("LlamaForCausalLM", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>", "<|pad|>", True),
    "tiny-tulu3": TinyFamily("LlamaForCausalLM", "tulu3.jinja", "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", True),
    "tiny-base": TinyFamily("LlamaForCausalLM", None, "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", True),
}


def template_text(name: str) -> str:
    """The text of a chat template shipped in engine/templates."""
    return resources.files("engine").joinpath(f"templates/{name}").read_text(encoding="utf-8")


def _training_lines() -> list[str]:
    corpus = resources.files("engine").joinpath("data/tiny_corpus.txt").read_text(encoding="utf-8")
    lines = corpus.splitlines()
    # Drill lines so that " A".." E" (and "Answer") become single tokens, as in the real vocabularies.
    for letter in "ABCDEFGH":
        lines += [f"Answer: {letter}", f"option {letter} or {letter}", f"({letter}) {letter}. {letter}"] * 12
    return lines


@functools.lru_cache(maxsize=1)
def _trained_tokenizer_json() -> str:
    """Train the shared byte-level BPE once per process; returns its JSON serialization."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_lines(), trainer=trainer)
    return tok.to_str()


def _family_tokenizer(fam: TinyFamily):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(_trained_tokenizer_json())
    if fam.tokenizer_adds_bos:
        bos_id = backend.token_to_id(fam.bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A", pair=f"{fam.bos} $A {fam.bos} $B", special_tokens=[(fam.bos, bos_id)]
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=fam.bos, eos_token=fam.eos, pad_token=fam.pad, unk_token=None
    )
    if fam.template is not None:
        tok.chat_template = template_text(fam.template)
    return tok


def _config(fam: TinyFamily, tok):
    from transformers import AutoConfig

    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if fam.architecture == "Olmo3ForCausalLM":
        # The real OLMo-3 alternates sliding-window and full attention; keep both layer kinds.
        return AutoConfig.for_model(
            "olmo3", sliding_window=4096, layer_types=["sliding_attention", "full_attention"], **common
        )
    if fam.architecture == "Qwen2ForCausalLM":
        return AutoConfig.for_model("qwen2", **common)
    return AutoConfig.for_model("llama", **common)


def _random_weights(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter from an explicit generator (no global seeding)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:  # norm scales: near one
                value = 1.0 + 0.1 * torch.randn(param.shape, generator=gen)
            elif "embed_tokens" in name:
                value = torch.randn(param.shape, generator=gen)
            elif "lm_head" in name:
                # Large enough that next-token distributions are peaked, so letter masses are not all ~1/V.
                value = 0.6 * torch.randn(param.shape, generator=gen)
            else:
                value = 0.08 * torch.randn(param.shape, generator=gen)
            param.copy_(value.to(param.dtype))


def build_tiny(alias: str, out_dir: Path) -> Path:
    """Write the tiny model `alias` (tokenizer, template, config, weights) into `out_dir`."""
    from transformers import AutoModelForCausalLM

    fam = FAMILIES[alias]
    tok = _family_tokenizer(fam)
    config = _config(fam, tok)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _random_weights(model, SEED + sorted(FAMILIES).index(alias))
    out_dir.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """Short hash of everything a build depends on, so a changed builder never reuses a stale model."""
    import tokenizers
    import transformers

    h = hashlib.sha256(f"{BUILD_VERSION}|{transformers.__version__}|{tokenizers.__version__}|{torch.__version__}".encode())
    h.update(Path(__file__).read_bytes())
    h.update(resources.files("engine").joinpath("data/tiny_corpus.txt").read_bytes())
    for fam in sorted(FAMILIES):
        if FAMILIES[fam].template:
            h.update(template_text(FAMILIES[fam].template).encode())
    return h.hexdigest()[:12]


def ensure_tiny(alias: str) -> Path:
    """Path of the built tiny model, building it (atomically) if it is not in the cache yet."""
    if alias not in FAMILIES:
        raise KeyError(f"no tiny model named {alias!r}; tiny models: {', '.join(sorted(FAMILIES))}")
    final = cache_root() / "tiny" / fingerprint() / alias
    if (final / "BUILD_OK").exists():
        return final
    with build_lock(f"tiny-{alias}"):
        if not (final / "BUILD_OK").exists():
            _build_into(alias, final)
    return final


def _build_into(alias: str, final: Path) -> None:
    tmp = staging_dir(final)
    try:
        build_tiny(alias, tmp)
        (tmp / "BUILD_OK").write_text(f"tiny build v{BUILD_VERSION}\n")
        if final.exists():  # a half-built leftover without BUILD_OK
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
