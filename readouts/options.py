"""What a study run is asked: which model, loaded how (`ModelOptions`, `Loading`), and the run's own options
(`RunOptions`). The command line (cli/options.py) builds these from its options; the Python API and the tests
build them directly."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Loading:
    """How a model is found, loaded and batched: the same for every checkpoint a command reads (a sweep's too)."""

    device: str | None = None
    """cpu, cuda, cuda:1 ... (None: cuda if present, else cpu)."""
    dtype: str | None = None
    """float32 / bfloat16 / float16 (None: fp32 on CPU, bf16 on CUDA)."""
    quantize: str | None = None
    """4bit / 8bit (bitsandbytes)."""
    device_map: str | None = None
    """accelerate device map for several GPUs, e.g. auto."""
    token_budget: int | None = None
    """Padded tokens per forward pass (None: the engine's default for the device)."""
    chat_template: str | None = None
    """A file whose template replaces the tokenizer's (its sha256 is recorded)."""
    template_kwargs: tuple[tuple[str, object], ...] = ()
    """Extra variables the chat template is rendered with, e.g. (("date_string", "26 Jul 2024"),) (recorded)."""
    adapter: str | None = None
    """A PEFT adapter folder, merged into the weights (recorded with its fingerprint)."""
    attn_implementation: str | None = None
    """transformers attention implementation (eager, sdpa, flash_attention_2; None: transformers' default)."""
    trust_remote_code: bool = False
    """Let a checkpoint's own modeling code run (transformers' trust_remote_code)."""
    registry_files: tuple[str, ...] = ()
    """User registry files (`--models`) the model's name is resolved with, after LOGIT_READOUT_MODELS's."""


@dataclass(frozen=True)
class ModelOptions:
    """Which model to load, and how (shared by `readout run`, `readout nsi`, `readout score` and each checkpoint of
    `readout sweep`)."""

    model: str
    """Alias, local folder or HF id in the local cache (optionally NAME@REV)."""
    loading: Loading = Loading()
    loaded: object = field(default=None, compare=False, repr=False)
    """A LoadedModel the caller already holds (engine.loading.from_memory): used as is, nothing is loaded."""
    served: object = None
    """An engine.served.ServedSpec: `model` is then the endpoint's model name, and nothing loads locally."""

    @property
    def device(self) -> str | None:
        return self.loading.device

    @property
    def token_budget(self) -> int | None:
        return self.loading.token_budget

    def load(self, device: str | None = None):
        if self.loaded is not None:
            return self.loaded
        if self.served is not None:
            from engine.served import ServedModel

            return ServedModel(self.served)
        from engine.loading import load_model

        o = self.loading
        return load_model(self.model, device=device or o.device, dtype=o.dtype, quantize=o.quantize,
                          device_map=o.device_map, chat_template=o.chat_template,
                          template_kwargs=dict(o.template_kwargs) or None, adapter=o.adapter,
                          attn_implementation=o.attn_implementation, trust_remote_code=o.trust_remote_code,
                          registry_files=o.registry_files)


GENERATORS = ("own", "vllm")
"""What draws a generating readout's rollouts: the project's own decoder, or a vLLM server (engine/vllm_generation.py);
either way the letters are read by the project's own exact forward."""


@dataclass(frozen=True)
class Generation:
    """Which engine draws the rollouts of a run's generating readouts (J, dose, the NSI replies)."""

    engine: str = "own"
    """One of GENERATORS."""
    url: str | None = None
    """A vLLM server's /v1 address to draw from (None: the project starts one for the run's checkpoint)."""
    model: str | None = None
    """The model name that server answers to (with `url`)."""


@dataclass(frozen=True)
class RunOptions:
    """What every study run was asked to do, besides the study's own settings."""

    model: ModelOptions
    panel: str | None = None
    """Shipped panel name or JSONL path (None: the study's default panel)."""
    profile: str = "quick"
    overrides: tuple[str, ...] = ()
    """`key=value` profile overrides (`--set`), recorded in the manifest."""
    limit: int | None = None
    """Read only the first N records of the profile's selection (recorded)."""
    part: str | None = None
    """Read only this part of the panel's recorded split (panels/split.py: `held-out`, `validation`, `train`,
    `training`) before the profile selects from it (recorded); None: the whole panel."""
    out: str | None = None
    """Run directory (None: runs/<model>/<panel>/<study's run name>)."""
    seed: int | None = None
    """None: the study's default seed."""
    force: bool = False
    """Discard an existing run with a different manifest in `out`."""
    progress: bool = True
    shard: tuple[int, int] | None = None
    """(i, n): compute only chunks whose index is i modulo n, and leave the merge to `readout merge`."""
    stop_after_chunks: int | None = None
    """Testing aid: stop (as if killed) after this many newly computed chunks."""
    generation: Generation = Generation()
    window: int | None = None
    """Chunks decoded together (readouts/chunks.py; None: the device's default, WINDOW_DEFAULT). Not part of the
    run's identity: a run may resume under another window."""
