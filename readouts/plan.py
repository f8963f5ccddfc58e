"""`readout run --plan`: a run's workload before any model loads, and what it should cost on a named GPU.

A study lists, per stage, the prompts it reads or generates from (tokenized with the model's own tokenizer,
planned into prefix trees chunk by chunk as the engine will), the rollouts and their token budgets. The
estimate puts that work against a GPU's published dense bf16 matmul rate and memory bandwidth, each at an
efficiency a careful engine reaches (PREFILL_EFFICIENCY, DECODE_EFFICIENCY): prefill and re-reads are
matmul-bound; a decoding step reads the weights and the batch's keys/values once, or is matmul-bound for
very wide batches. The model's size is counted from its config (no weights are read, no modeling code imported).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.batching import DEFAULT_BOUNDS
from engine.errors import ReadoutError
from engine.planner import plan_prefix_groups, planned_tokens


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_flops: float
    """Dense bf16 matmul rate (FLOP/s), as the vendor publishes it."""
    bandwidth: float
    """Memory bandwidth (bytes/s)."""


GPUS = {
    "h200": Gpu("NVIDIA H200 (SXM)", 989e12, 4.8e12),
    "h100": Gpu("NVIDIA H100 (SXM)", 989e12, 3.35e12),
    "a100": Gpu("NVIDIA A100 80GB (SXM)", 312e12, 2.04e12),
    "l40s": Gpu("NVIDIA L40S", 362e12, 0.864e12),
}
PREFILL_EFFICIENCY = 0.5
"""Share of the matmul rate a prefill or re-read forward pass reaches."""
DECODE_EFFICIENCY = 0.7
"""Share of the memory bandwidth a decoding step reaches."""


@dataclass
class StageWork:
    """One stage of a run, summed over its chunks."""

    stage: str
    prompts: int = 0
    """Prompts read at their first token, or generated from."""
    prompt_tokens: int = 0
    computed_tokens: int = 0
    """Prompt tokens actually run after prefix sharing (per chunk, as the engine plans)."""
    rollouts: int = 0
    """Rows decoded (prompts x rollouts)."""
    generated_max: int = 0
    """Upper bound of generated tokens (every rollout to its budget)."""
    reread_tokens_max: int = 0
    """Upper bound of tokens run to read letters after generated text (the text, the forced anchor)."""
    reads: int = 0
    """Read positions (probe rows)."""
    decode_batches: list = field(default_factory=list)
    """Per chunk: (rows, prompt tokens, longest budget) of its decoding, for the decode estimate."""


def shared_tokens(seqs) -> int:
    """Tokens run for `seqs` after dropping duplicates and sharing prefixes (the engine's plan)."""
    unique = list(dict.fromkeys(seqs))
    return planned_tokens(unique, plan_prefix_groups(unique)) if unique else 0


@dataclass(frozen=True)
class ModelSize:
    params: int
    weight_bytes: int
    kv_bytes_per_token: int


def model_size(config, dtype_bytes: int = 2) -> ModelSize:
    """Parameters of a decoder in `config`, counted from its dimensions (embeddings, attention and gated-MLP
    projections, norms, the head unless tied): the Llama / Qwen / OLMo / Mistral layout, within a percent of
    the built model (tested); no modeling code is imported and no memory is allocated."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    embed = config.vocab_size * hidden
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config.intermediate_size
    params = embed + layers * (attention + mlp + 2 * hidden) + hidden
    if not getattr(config, "tie_word_embeddings", False):
        params += embed
    kv = 2 * layers * kv_heads * head_dim * dtype_bytes
    return ModelSize(params, params * dtype_bytes, kv)


def estimate(stage: StageWork, size: ModelSize, gpu: Gpu) -> dict:
    """Seconds for one stage on `gpu` (prefill, decode, re-reads), from its workload and the model's size."""
    matmul = gpu.bf16_flops * PREFILL_EFFICIENCY
    bandwidth = gpu.bandwidth * DECODE_EFFICIENCY
    prefill = stage.computed_tokens * 2 * size.params / matmul
    rows_bound = DEFAULT_BOUNDS["generate"]["cuda"][1]
    decode = 0.0
    for rows, prompt_tokens, budget in stage.decode_batches:
        batches = math.ceil(rows / rows_bound)
        width = rows / batches
        held = prompt_tokens / batches + width * budget / 2  # keys/values a step reads, on average
        step = max((size.weight_bytes + held * size.kv_bytes_per_token) / bandwidth, width * 2 * size.params / matmul)
        decode += batches * budget * step
    reread = stage.reread_tokens_max * 2 * size.params / matmul
    return {"prefill_s": prefill, "decode_s": decode, "reread_s": reread, "total_s": prefill + decode + reread}


def plan_table(stages: list[StageWork], size: ModelSize, gpu_name: str) -> list[dict]:
    """One row per stage (and a total row): the workload and the estimated seconds on the named GPU."""
    if gpu_name not in GPUS:
        raise ReadoutError(f"--gpu: '{gpu_name}' is not one of {', '.join(GPUS)}: --plan estimates GPUs only (no CPU "
                           "estimate; a CPU run's summary prints its measured rates)")
    gpu = GPUS[gpu_name]
    rows = []
    for st in stages:
        work = {k: v for k, v in asdict(st).items() if k != "decode_batches"}
        rows.append({**work, **estimate(st, size, gpu)})
    total = {"stage": "total"}
    for key in rows[0] if rows else ():
        if key != "stage":
            total[key] = sum(r[key] for r in rows)
    return rows + [total]


def plan_lines(rows: list[dict], size: ModelSize, gpu_name: str, header: str) -> list[str]:
    """The plan as printed by `--plan`."""
    gpu = GPUS[gpu_name]
    lines = [header,
             f"model: {_count(size.params)} parameters, {_count(size.weight_bytes, 'B')} in bf16, "
             f"{_count(size.kv_bytes_per_token, 'B')} of keys/values per token",
             f"estimate on {gpu.name} (GPUs only: on a CPU the run takes far longer): "
             f"{gpu.bf16_flops / 1e12:.0f} TFLOP/s bf16 at {PREFILL_EFFICIENCY:.0%}, "
             f"{gpu.bandwidth / 1e12:.2f} TB/s at {DECODE_EFFICIENCY:.0%}",
             f"{'stage':<10} {'prompts':>8} {'prompt tok':>11} {'computed':>10} {'rollouts':>9} {'gen. max':>10} "
             f"{'reads':>8} {'prefill':>8} {'decode':>8} {'re-read':>8} {'total':>8}"]
    for r in rows:
        lines.append(f"{r['stage']:<10} {r['prompts']:>8,} {r['prompt_tokens']:>11,} {r['computed_tokens']:>10,} "
                     f"{r['rollouts']:>9,} {r['generated_max']:>10,} {r['reads']:>8,} {_time(r['prefill_s']):>8} "
                     f"{_time(r['decode_s']):>8} {_time(r['reread_s']):>8} {_time(r['total_s']):>8}")
    lines.append("Upper bounds for generation (every rollout to its budget); times are estimates, not measurements.")
    return lines


def _count(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M', with the unit after it ('1.23 MB'); small numbers as they are."""
    for scale, prefix in ((1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _time(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"
