"""`readout run --plan`: a run's workload before any model loads, and what it should cost on a named GPU.

A study lists, per stage, the prompts it reads or generates from (tokenized with the model's own tokenizer,
planned into prefix trees chunk by chunk, or window by window, as the engine will), the rollouts and their token budgets. The
estimate puts that work against a GPU's published dense bf16 matmul rate and memory bandwidth, each at an
efficiency a careful engine reaches (PREFILL_EFFICIENCY, DECODE_EFFICIENCY): prefill and re-reads are
matmul-bound; a decoding step reads the weights and the batch's keys/values once, or is matmul-bound for
very wide batches. The model's size is counted from its config (no weights are read, no modeling code imported).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.batching import DEFAULT_BOUNDS, GENERATION_CACHE_SHARE, usable_bytes
from engine.decode import bucket, cascade_config, graph_captures, mean_own_span
from engine.errors import ReadoutError
from engine.generation import BatchBounds
from engine.planner import plan_prefix_groups, planned_tokens
from engine.rowcache import ROW_CACHE_SHARE


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_flops: float
    """Dense bf16 matmul rate (FLOP/s), as the vendor publishes it."""
    bandwidth: float
    """Memory bandwidth (bytes/s)."""
    memory: int
    """Device memory (bytes) as the driver reports it: what engine.batching.usable_memory starts from."""


GPUS = {
    "h200": Gpu("NVIDIA H200 (SXM)", 989e12, 4.8e12, 143771 * 2**20),  # nvidia-smi on the lent H200
    "h100": Gpu("NVIDIA H100 (SXM)", 989e12, 3.35e12, 81559 * 2**20),
    "a100": Gpu("NVIDIA A100 80GB (SXM)", 312e12, 2.04e12, 81920 * 2**20),
    "l40s": Gpu("NVIDIA L40S", 362e12, 0.864e12, 46068 * 2**20),
}
PREFILL_EFFICIENCY = 0.5
"""Share of the matmul rate a prefill or re-read forward pass reaches."""
DECODE_EFFICIENCY = 0.7
"""Share of the memory bandwidth a decoding step reaches."""
LAUNCH_SECONDS = 8e-6
"""Host time per kernel launch (6-10 us on current CUDA drivers; not measured here, no GPU)."""
HOST_OPS = {"graph_outside_forward": 45, "graph_replay": 1, "dynamic_outside_forward": 56,
            "per_layer": {"olmo3": 67}, "per_layer_default": 55}
"""Kernel launches per decoding step, counted on CPU by bench/host_bench.py (engine/hostcount.py's dispatch
counter, 32 layers, bench/results/host_bench_graph.md): on the CUDA graph path (the cascade backend) the ops
outside the forward pass (45: the draw, end-of-row bookkeeping, the running sum that finds logits that are not
finite, the static buffers; at top-p 0.95 and at top-p 1 alike, bench/results/host_bench_top_p1.md) and one replay; on the
dynamic path (the dense fallback) its 56 ops outside the forward and every op of the forward too, 55 per
Llama-layout layer and 67 per OLMo-3 one ((1798 - 56) / 32 and (2188 - 56) / 32, rounded up). tests/readouts/test_plan.py holds
these equal to host_bench_graph.json."""


CAPTURE_FORWARDS = 3
"""Forward passes of host work one CUDA graph capture adds (engine.decode.Cascade._capture): the bucket's first
step run eagerly instead of replayed, the warm-up pass on a side stream and the recorded pass, each at the forward
pass's launches (HOST_OPS' per-layer count: the static forward counts 1,774 at 32 Llama-layout layers, 55.4 a layer,
bench/results/host_bench_graph.md). Instantiating the graph is not counted (not measured here)."""


@dataclass
class StageWork:
    """One stage of a run, summed over its chunks."""

    stage: str
    prompts: int = 0
    """Prompts read at their first token, or generated from."""
    prompt_tokens: int = 0
    computed_tokens: int = 0
    """Prompt tokens actually run after prefix sharing (per chunk or window, as the engine plans)."""
    rollouts: int = 0
    """Rows decoded (prompts x rollouts)."""
    generated_max: int = 0
    """Upper bound of generated tokens (every rollout to its budget)."""
    reread_tokens_max: int = 0
    """Upper bound of tokens run to read letters after generated text: the anchor suffix where the row's own
    cache is held (engine/rowcache.py, within its limit, each row counted at its whole budget), the text and
    the anchor where it is not."""
    reads: int = 0
    """Read positions (probe rows)."""
    decode_batches: list = field(default_factory=list)
    """Each decoding batch, as generate forms it: [call label, rows, distinct prompt tokens, longest budget]."""
    requests: list = field(default_factory=list)
    """Each `generate` call as a vLLM generator asks it (readouts/vllm_plan.py): [call label, rollouts per prompt,
    prompt tokens of each prompt, its budget, the index of the prompt whose rollouts' lengths it follows or None]."""
    reread_tokens_drawn: int = 0
    """Tokens run to read letters after text drawn elsewhere (a vLLM generator: no row cache is held, so every read
    runs its text and anchor, and the prompts run again, shared as the engine plans them)."""


def shared_tokens(seqs) -> int:
    """Tokens run for `seqs` after dropping duplicates and sharing prefixes (the engine's plan)."""
    unique = list(dict.fromkeys(seqs))
    return planned_tokens(unique, plan_prefix_groups(unique)) if unique else 0


@dataclass(frozen=True)
class ModelSize:
    params: int
    weight_bytes: int
    kv_bytes_per_token: int
    host_ops_per_step: int = 0
    """Kernel launches per decoding step (HOST_OPS): the host's side of a step."""
    static: bool = False
    """Whether CUDA decodes it with static shapes (the cascade backend): a step runs its batch's row bucket and reads
    its own buffers whole (engine.decode.own_span), not only the slots written."""
    capture_ops: int = 0
    """Launches of host work a graph capture adds (CAPTURE_FORWARDS forward passes); 0 where no step is captured."""


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
    forward = layers * HOST_OPS["per_layer"].get(config.model_type, HOST_OPS["per_layer_default"])
    if cascade_config(config):  # CUDA decodes it with static shapes, each step a graph replay
        return ModelSize(params, params * dtype_bytes, kv, HOST_OPS["graph_outside_forward"] + HOST_OPS["graph_replay"],
                         True, CAPTURE_FORWARDS * forward)
    return ModelSize(params, params * dtype_bytes, kv, HOST_OPS["dynamic_outside_forward"] + forward, False)


def head_copy_of(config, size: ModelSize) -> int:
    """Bytes of the fp32 head copy the letter reads keep beside 16-bit weights (engine.head.head_copy_bytes)."""
    return 0 if size.weight_bytes == 4 * size.params else 4 * config.vocab_size * config.hidden_size


def gpu_batch_bounds(config, size: ModelSize, gpu_name: str, token_budget: int | None = None) -> BatchBounds:
    """The generation batch bounds a run of this model would have on the named GPU (engine.generation.batch_bounds
    on CUDA: the default rows, half the usable memory (engine.batching.usable_bytes: beside the weights, the fp32
    copy of a 16-bit head and the CUDA context) for keys/values, the cascade backend's rows padded to their bucket)."""
    _known_gpu(gpu_name)
    default_budget, rows = DEFAULT_BOUNDS["generate"]["cuda"]
    usable = usable_bytes(GPUS[gpu_name].memory, size.weight_bytes, head_copy_of(config, size))
    cascade = cascade_config(config)
    return BatchBounds(token_budget or default_budget, rows, int(GENERATION_CACHE_SHARE * usable) // size.kv_bytes_per_token,
                       cascade, int(ROW_CACHE_SHARE * usable) if cascade else 0, size.kv_bytes_per_token, cascade)


def estimate(stage: StageWork, size: ModelSize, gpu: Gpu) -> dict:
    """Seconds for one stage on `gpu` (prefill, decode, re-reads), from its workload and the model's size."""
    matmul = gpu.bf16_flops * PREFILL_EFFICIENCY
    bandwidth = gpu.bandwidth * DECODE_EFFICIENCY
    prefill = stage.computed_tokens * 2 * size.params / matmul
    host = size.host_ops_per_step * LAUNCH_SECONDS  # the host launches the next step while the device runs this one
    decode, captures = 0.0, 0
    for _, rows, prompt_tokens, budget in stage.decode_batches:  # each batch as generate forms it
        if size.static:  # the row bucket steps, each row reading its own buffer whole (doubling up to the budget)
            rows = bucket(rows)
            held = prompt_tokens + rows * mean_own_span(budget)
            captures += graph_captures(budget)  # one graph per own span (compaction's are not counted: rows run to budget)
        else:
            held = prompt_tokens + rows * budget / 2  # keys/values a step reads, on average
        device = max((size.weight_bytes + held * size.kv_bytes_per_token) / bandwidth, rows * 2 * size.params / matmul)
        decode += budget * max(device, host)
    capture = captures * size.capture_ops * LAUNCH_SECONDS
    decode += capture
    reread = stage.reread_tokens_max * 2 * size.params / matmul
    return {"prefill_s": prefill, "decode_s": decode, "reread_s": reread, "total_s": prefill + decode + reread,
            "captures": captures, "capture_s": capture}


def plan_table(stages: list[StageWork], size: ModelSize, gpu_name: str, timed=None) -> list[dict]:
    """One row per stage (and a total row): the workload and the estimated seconds on the named GPU, by `timed(stage,
    size, gpu)` (default `estimate`: the own decoder; readouts/vllm_plan.py's for a vLLM generator)."""
    _known_gpu(gpu_name)
    gpu = GPUS[gpu_name]
    rows = []
    for st in stages:
        rows.append({**asdict(st), **(timed or estimate)(st, size, gpu)})
    total = {"stage": "total"}
    for key in rows[0] if rows else ():
        if key not in ("stage", "decode_batches", "requests"):
            total[key] = sum(r[key] for r in rows)
    return rows + [total]


def _known_gpu(gpu_name: str) -> None:
    if gpu_name not in GPUS:
        raise ReadoutError(f"--gpu: '{gpu_name}' is not one of {', '.join(GPUS)}: --plan estimates GPUs only (no CPU "
                           "estimate; a CPU run's summary prints its measured rates)")


def batch_lines(rows: list[dict]) -> list[str]:
    """Per stage and `generate` call (`plan_table`'s rows), the decoding batches the run forms: how many, their
    rows (and the row bucket a static CUDA batch starts in), the longest budget."""
    lines = []
    for row in rows:
        calls: dict[str, list] = {}
        for label, width, _, budget in row.get("decode_batches", ()):
            calls.setdefault(label, []).append((width, budget))
        for label, batches in calls.items():
            widths = sorted(r for r, _ in batches)
            lines.append(f"  {row['stage']} {label}: {len(batches):,} batches of {widths[0]:,}-{widths[-1]:,} rows "
                         f"(median {widths[len(widths) // 2]:,}, bucket {bucket(widths[-1]):,}), "
                         f"up to {max(b for _, b in batches):,} new tokens")
    return ["decoding batches (as generate forms them under the GPU's row and key/value limits):", *lines] if lines else []


def plan_lines(rows: list[dict], size: ModelSize, gpu_name: str, header: str, generator: str | None = None) -> list[str]:
    """The plan as printed by `--plan` (`generator`: a line saying what a vLLM estimate assumed, printed instead of
    the own decoder's batches)."""
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
    total = rows[-1] if rows else {}
    if generator is not None:
        return lines + [generator, "Upper bounds for generation (every rollout to its budget); times are estimates, "
                                   "not measurements."]
    lines += batch_lines(rows)
    lines.append("Upper bounds for generation (every rollout to its budget); times are estimates, not measurements; "
                 f"a decoding step takes at least its {size.host_ops_per_step:,} kernel launches of host time"
                 + (f"; {total['captures']:,} CUDA graph captures, {_time(total['capture_s'])} of host time in the decode "
                    "column." if total.get("captures") else "."))
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
