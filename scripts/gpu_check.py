"""GPU check: the real OLMo-3-7B architecture with random bf16 weights (nothing downloaded), the D readout
on 64 gap-v1 scenarios x 32 option orders, batched generation, and decoding speed at batch 1 and at a large
batch, each with dynamic shapes and with the static-shape path (`generate(static_shapes=True)`: one CUDA
graph per batch); prints probes/s, tokens/s and their share of the GPU's bf16 matmul rate and HBM bandwidth,
both measured in the same run; with --shapes, the step time at each decoding shape of the paper plan, from the set
made for the device's memory (bench/gpu_shapes.json holds one for the H200 and one for the H100; the result records
which); and the generators side by side on a J workload at one of those shapes (`generators`: compare_generators).
One call of the device tool runs it:

    bash scripts/gpu_check.sh            # or: python scripts/gpu_check.py --arch llama3
    python scripts/gpu_check.py --tiny   # the same code path on CPU with a small config (smoke test)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

ARCHS = {
    # Public configs of the target checkpoints (architecture only).
    "olmo3": dict(model_type="olmo3", vocab_size=100278, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=65536, rms_norm_eps=1e-6,
                  sliding_window=4096, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama3": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
}


def matmul_rate(device, dtype, n=8192, reps=20) -> float:
    """Measured dense matmul FLOP/s for this device and dtype."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def copy_bandwidth(device, megabytes=2048, reps=10) -> float:
    """Measured memory bandwidth (bytes/s) of a large device-to-device copy (each byte read once, written once)."""
    x = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    sync(device)
    return 2 * x.numel() * x.element_size() * reps / (time.perf_counter() - t0)


def decode_speed(model, prompts, tokens, n, static, bounds, max_rows=1024):
    """Decode-only new tokens/s of greedy generation (the prefill and first step timed apart and taken off),
    with the matmul and memory bounds of the same work: each step reads the weights once and the keys/values
    of every prompt once (the cascade state) and of every row's own tokens, and computes 2 x params FLOPs per row."""
    from engine.batching import kv_bytes_per_token
    from engine.generation import generate

    kw = dict(stop_ids=frozenset(), n=n, temperature=0.0, max_rows=max_rows, static_shapes=static)
    device = model.get_input_embeddings().weight.device
    generate(model, prompts, max_new_tokens=2, **kw)  # warm-up (and, static, a first graph capture)
    sync(device)
    t0 = time.perf_counter()
    generate(model, prompts, max_new_tokens=1, **kw)
    sync(device)
    t1 = time.perf_counter()
    out = generate(model, prompts, max_new_tokens=tokens, **kw)
    sync(device)
    t2 = time.perf_counter()
    rows = len(prompts) * n
    seconds = (t2 - t1) - (t1 - t0)
    rate = rows * (tokens - 1) / seconds
    weight_bytes, flops_per_row, matmul, bandwidth = bounds
    kv = kv_bytes_per_token(model) * (sum(len(p) for p in prompts) + rows * tokens / 2)
    step_floor = max((weight_bytes + kv) / bandwidth, rows * flops_per_row / matmul)
    return out, dict(rows=rows, tokens=tokens, static=static, decode_tokens_per_s=rate, seconds=seconds,
                     share_of_bandwidth_bound=rate / (rows * bandwidth / (weight_bytes + kv)),
                     share_of_matmul_bound=rate / (matmul / flops_per_row), share_of_floor=rate / (rows / step_floor))


def shape_prompts(prompts, shape) -> list[list[int]]:
    """A shape's distinct prompts as the plan forms them: `rows` / `n` of them (its mean real rows over its rollouts
    per prompt), each cycled from `prompts`' tokens to the shape's mean distinct prompt tokens per prompt."""
    k = max(1, shape["rows"] // shape["n"])  # k x n rows stay within the bucket
    length = max(2, shape["prompt_tokens"] // k)
    return [[prompts[i % len(prompts)][j % len(prompts[i % len(prompts)])] for j in range(length)] for i in range(k)]


def step_grid(model, prompts, shapes, token_budget, steps=12, rows_out=None, on_row=None):
    """Seconds per decoding step on the static path (one CUDA graph per bucket on CUDA) at each shape the paper
    profile's plan forms (bench/plan_8b_bench.py --shapes-out): its mean real rows (`n` rollouts of each of
    shape_prompts' prompts, padded to the bucket as a run pads them) stepped toward a `budget`-token budget. A
    static step reads its own buffer whole under a mask, so its cost depends on the buffer's span, not on how far
    into it the batch is: a few steps at each span measure it (_time_steps). Each row also records the bytes a step
    reads on average (weights, the prompts' and the bucket's own keys/values over the mean span) and its share of
    the measured bandwidth. Rows go into `rows_out` (a new list unless given) as each shape is timed, and `on_row`
    (if given) is called after each, so a run stopped mid-grid keeps the shapes timed before."""
    from engine.batching import kv_bytes_per_token
    from engine.decode import Cascade, mean_own_span

    device = model.get_input_embeddings().weight.device
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = kv_bytes_per_token(model)
    rows_out = [] if rows_out is None else rows_out
    for shape in shapes:
        n, budget = shape["n"], shape["budget"]
        ps = shape_prompts(prompts, shape)
        rows = min(shape["bucket"], len(ps) * n)
        row_prompt = [i // n for i in range(rows)]
        row = dict(shape, real_rows=rows, prompts=len(ps), prompt_tokens_run=sum(len(p) for p in ps))
        try:
            with torch.inference_mode():  # as generate runs its steps (without it autograd keeps every step's activations)
                seconds = _time_steps(Cascade(model, ps, row_prompt, budget, pad_id=0, token_budget=token_budget,
                                              max_rows=rows, static=True), steps, row)
            read = weights + kv * (row["prompt_tokens_run"] + shape["bucket"] * mean_own_span(budget))
            row.update(seconds_per_step=seconds, bytes_per_step=read, bytes_per_s=read / seconds)
        except torch.cuda.OutOfMemoryError as exc:
            row.update(error=f"out of memory: {exc}".splitlines()[0])
        finally:  # a failed shape's tensors (held by its traceback's frames) go before the next shape
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows_out.append(row)
        if on_row is not None:
            on_row()
        shown = (f"{1e3 * row['seconds_per_step']:.2f} ms/step, {row['bytes_per_s'] / 1e9:.0f} GB/s read"
                 if "seconds_per_step" in row else row["error"])
        print(f"step {shape['label']:>42s}: {rows:4d} rows (bucket {shape['bucket']}) toward a {budget:5d}-token budget: "
              f"{shown}", flush=True)
    return rows_out


def _time_steps(state, steps: int, row: dict) -> float:
    """Seconds per step of a static decode state, averaged over its budget: the own buffers double as the steps
    reach their end (engine.decode.own_span) and a step reads its buffer whole, so each span is timed (its first
    step eager and captured, 3 replays, then `steps` timed replays) and weighted by the steps the budget spends in it."""
    from engine.decode import own_span

    device, budget = state.device, state.budget
    spans = sorted({own_span(k, budget) for k in range(budget)})
    steps = min(steps, budget // len(spans) - 4)  # every step within the budget
    if steps < 1:
        raise ValueError(f"a budget of {budget} tokens is too short to time {len(spans)} spans")
    per_span = {}
    tok = None
    for span in spans:
        if span > state.ks[0].shape[2]:
            state._grow(span)
        tok = state.step(tok).argmax(-1)
        for _ in range(3):
            tok = state.step(tok).argmax(-1)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = state.step(tok).argmax(-1)
        sync(device)
        per_span[span] = (time.perf_counter() - t0) / steps
    row.update(cuda_graph=bool(getattr(state, "graph_used", False)), seconds_per_step_by_span=per_span)
    return sum(per_span[own_span(k, budget)] for k in range(budget)) / budget


def generate_per_step(model, prompts, shape, token_budget):
    """The whole generation loop (sampling, checks, compaction, the captures at each span) at one shape, every row
    to its budget, sampled as the plan's profile samples (the shape's temperature and top-p, the first rollout
    greedy): seconds per step, from the difference of a run to the budget and one of 8 steps (so the prefill and
    the first step fall out), to compare with step_grid's step alone."""
    from engine.generation import generate

    device = model.get_input_embeddings().weight.device
    ps = shape_prompts(prompts, shape)
    seconds = {}
    for budget in (8, shape["budget"]):
        sync(device)
        t0 = time.perf_counter()
        generate(model, ps, max_new_tokens=budget, stop_ids=frozenset(), n=shape["n"], greedy_first=True,
                 temperature=shape["temperature"], top_p=shape["top_p"], token_budget=token_budget, max_rows=shape["bucket"])
        sync(device)
        seconds[budget] = time.perf_counter() - t0
    per_step = (seconds[shape["budget"]] - seconds[8]) / (shape["budget"] - 8)
    return dict(shape, rows=len(ps) * shape["n"], seconds=seconds[shape["budget"]], seconds_per_step=per_step)


def generator_shape(shapes: list[dict]) -> dict:
    """The J shape the generators are compared at: of the set's J shapes (the judge frame's rollouts), the one with
    the fewest rows that still holds two prompts (so the prompts can be split into two calls)."""
    j = sorted((s for s in shapes if s["label"].split()[0] == "J"), key=lambda s: s["rows"])
    if not j:
        raise SystemExit("error: --shapes: the set holds no J shape to compare the generators at")
    return next((s for s in j if s["rows"] // s["n"] >= 2), j[-1])


def vllm_here() -> str:
    """Whether the vLLM generator can run in this check, in one line: "not installed on this node: <why>" where no
    Python here imports vllm, else "needs a checkpoint folder: ..." (the server loads a model folder from disk, and
    this check builds its random-weight model in memory)."""
    import importlib.util
    import subprocess

    from engine.vllm_server import SERVER_PYTHON_ENV, server_python

    python = server_python()
    if python is None:
        if importlib.util.find_spec("vllm") is None:
            return (f"not installed on this node: no .venv-served beside the project, {SERVER_PYTHON_ENV} unset, and "
                    f"{sys.executable} holds no vllm package")
        python = sys.executable
    try:
        probe = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                               timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not installed on this node: {python} -c 'import vllm': {str(exc).splitlines()[0]}"
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"]
        return f"not installed on this node: {python} -c 'import vllm': {lines[-1]}"
    return (f"needs a checkpoint folder: vLLM {probe.stdout.strip()} imports in {python}, but its server loads a model "
            "folder from disk and this check builds the random-weight model in memory (saving it would write ~16 GB)")


def compare_generators(model, prompts, shape, token_budget, new_tokens, out, on_figure=None):
    """The generators side by side on a J workload at `shape` (generator_shape): shape_prompts' prompts, each with
    `shape["n"]` rollouts (the first greedy, the others sampled at the shape's temperature and top-p, seeded per
    prompt as a run seeds them), every row decoded `new_tokens` tokens (no stop tokens).

    For the own decoder's graph path (static shapes, CUDA graphs; on CUDA only) and its dynamic path: wall seconds
    and new tokens/s of the prompts in one call, and of the same prompts split into two calls of different sizes;
    how many rollouts (sampled, and greedy) are the same token for token in both batchings; and whether the two
    paths' greedy rollouts are equal. The vLLM generator: vllm_here's line. Figures go into `out` (a dict) as each is
    measured, and `on_figure` (if given) is called after each, so a run stopped midway keeps them."""
    import engine.decode as decode
    from engine.generation import generate
    from engine.sampling import derive_seed

    device = model.get_input_embeddings().weight.device
    n = shape["n"]
    ps = shape_prompts(prompts, dict(shape, rows=max(shape["rows"], 2 * n)))  # at least two prompts to split
    seeds = [derive_seed("gpu_check", "generators", i) for i in range(len(ps))]
    cut = max(1, len(ps) // 3)  # two calls, each a batch other than the one call's (1 and 2 prompts of 3; 2 and 6 of 8)
    out.update(shape={k: shape[k] for k in ("label", "bucket", "budget", "n", "rows", "prompt_tokens") if k in shape},
               prompts=len(ps), prompt_tokens=sum(len(p) for p in ps), rollouts_per_prompt=n, greedy_rollouts_per_prompt=1,
               temperature=shape["temperature"], top_p=shape["top_p"], new_tokens=new_tokens, max_rows=shape["bucket"],
               two_calls=[cut, len(ps) - cut], paths={})

    def figure():
        if on_figure is not None:
            on_figure()

    captured = []
    capture = decode.Cascade._capture
    decode.Cascade._capture = lambda self: (capture(self), captured.append(True))[0]
    rollouts = {}
    try:
        for path, static in (("graph", True), ("dynamic", False)):
            if static and device.type != "cuda":
                out["paths"][path] = "CUDA only"
                figure()
                continue
            kw = dict(max_new_tokens=new_tokens, stop_ids=frozenset(), n=n, greedy_first=True,
                      temperature=shape["temperature"], top_p=shape["top_p"], token_budget=token_budget,
                      max_rows=shape["bucket"], static_shapes=static)
            generate(model, ps[:1], **dict(kw, max_new_tokens=2), seeds=seeds[:1])  # warm-up
            row = out["paths"][path] = dict(static_shapes=static)
            before = len(captured)
            runs = {}
            for label, calls in (("one_call", [slice(0, len(ps))]), ("two_calls", [slice(0, cut), slice(cut, len(ps))])):
                sync(device)
                t0 = time.perf_counter()
                got = [r for part in calls for r in generate(model, ps[part], seeds=seeds[part], **kw)]
                sync(device)
                seconds = time.perf_counter() - t0
                new = sum(len(r.tokens) for rs in got for r in rs)
                runs[label] = got
                row[label] = dict(calls=len(calls), seconds=seconds, new_tokens=new, new_tokens_per_s=new / seconds)
                figure()
                print(f"generators, own {path} path, {len(ps)} prompts x {n} rollouts x {new_tokens} tokens in "
                      f"{len(calls)} call{'s' if len(calls) > 1 else ''}: {seconds:.2f} s, {new / seconds:.0f} new tokens/s",
                      flush=True)
            row["cuda_graph"] = len(captured) > before
            sampled = token_agreement([rs[1:] for rs in runs["one_call"]], [rs[1:] for rs in runs["two_calls"]])
            greedy = token_agreement([rs[:1] for rs in runs["one_call"]], [rs[:1] for rs in runs["two_calls"]])
            row.update(sampled_equal_across_batchings=sampled["rows_equal"], sampled_total=sampled["rows"],
                       greedy_equal_across_batchings=greedy["rows_equal"], greedy_total=greedy["rows"])
            rollouts[path] = runs["one_call"]
            figure()
            print(f"generators, own {path} path: seeded sampled rollouts equal across the two batchings: "
                  f"{sampled['rows_equal']} of {sampled['rows']}; greedy {greedy['rows_equal']} of {greedy['rows']}", flush=True)
    finally:
        decode.Cascade._capture = capture
    if len(rollouts) == 2:
        agree = token_agreement([rs[:1] for rs in rollouts["graph"]], [rs[:1] for rs in rollouts["dynamic"]])
        out["greedy_graph_vs_dynamic"] = dict(agree, equal=agree["rows_equal"] == agree["rows"])
        print(f"generators: greedy rollouts of the graph path equal the dynamic path's: {agree['rows_equal']} of "
              f"{agree['rows']}", flush=True)
    else:
        out["greedy_graph_vs_dynamic"] = "CUDA only"
    figure()
    out["vllm"] = vllm_here()
    figure()
    print(f"generators, vLLM: {out['vllm']}", flush=True)
    return out


def d_readout(model, tok, scenarios, args, body, head, rate, result):
    """The D readout (agent frame, primary and twin, `args.orders` option orders) on `scenarios`: probes/s and
    computed (prefill) tokens/s, into `result`."""
    from engine.letters import resolve_letters
    from engine.render import Prompt, encode_prompt
    from engine.scoring import ScoreStats, score_ids
    from panels.frames import render
    from panels.orders import option_orders

    device = model.get_input_embeddings().weight.device
    seqs, letters = [], []
    for s in scenarios:
        lt = resolve_letters(tok, "ABCDE"[: len(s.options)])
        for cell in ("primary", "twin"):
            for order in option_orders(len(s.options), args.orders, 0, f"{s.id}|D"):
                r = render(s, "agent", cell, order)
                seqs.append(encode_prompt(tok, Prompt(messages=r.messages)))
                letters.append(lt)
    score_ids(model, seqs[:8], letters[:8], token_budget=args.token_budget)  # warm-up
    sync(device)
    stats = ScoreStats()
    t0 = time.perf_counter()
    score_ids(model, seqs, letters, token_budget=args.token_budget, stats=stats)
    sync(device)
    secs = time.perf_counter() - t0
    flops = 2 * body * stats.computed_tokens + 2 * head * len(seqs)
    result.update(d_probes=len(seqs), d_seconds=secs, d_probes_per_s=len(seqs) / secs, d_prompt_tokens=stats.prompt_tokens,
                  d_computed_tokens=stats.computed_tokens, d_tokens_per_s=stats.computed_tokens / secs,
                  d_share_of_matmul=flops / secs / rate)
    print(f"D readout: {len(seqs)} probes in {secs:.1f} s = {len(seqs) / secs:.1f} probes/s; "
          f"{stats.computed_tokens / secs:.0f} computed tokens/s ({stats.computed_tokens / stats.prompt_tokens:.2f} per prompt token); "
          f"{100 * flops / secs / rate:.1f}% of the matmul rate")


def token_agreement(a, b) -> dict:
    """How far two runs' rollouts agree, row by row: rows equal, and the median step at which the others first
    differ (in bf16 the two paths' kernels round differently, and a near tie in random weights' logits can flip)."""
    rows = [(x.tokens, y.tokens) for xs, ys in zip(a, b) for x, y in zip(xs, ys)]
    first = sorted(next((i for i, (p, q) in enumerate(zip(s, t)) if p != q), min(len(s), len(t))) for s, t in rows if s != t)
    return dict(rows=len(rows), rows_equal=len(rows) - len(first), median_first_difference=first[len(first) // 2] if first else None)


def pick_shape_set(sets: dict, device_memory: int | None, name: str = "auto") -> tuple[str, str]:
    """The set of decoding shapes (bench/gpu_shapes.json: GPU name -> its memory and shapes) for a device of
    `device_memory` bytes (None: no CUDA device), and why: `name` when given; else the set of the largest GPU whose
    memory the device has (within 10%: a card's total is quoted in GB or GiB, and drivers reserve some), or the
    smallest set where the device has less than every set's GPU (some shapes may not fit), or the largest set on CPU
    (where --tiny cuts the shapes down)."""
    by_memory = sorted(sets, key=lambda k: sets[k]["memory_bytes"])
    if name != "auto":
        if name not in sets:
            raise SystemExit(f"error: --shape-set: '{name}' is not a set of the shapes file (it holds {', '.join(by_memory)})")
        return name, "named by --shape-set"
    if device_memory is None:
        return by_memory[-1], "no CUDA device: the largest set"
    fitting = [k for k in by_memory if sets[k]["memory_bytes"] <= 1.1 * device_memory]
    if fitting:
        return fitting[-1], f"the largest set for {device_memory / 2**30:.1f} GiB of device memory"
    return by_memory[0], (f"the device's {device_memory / 2**30:.1f} GiB is less than every set's GPU: the smallest "
                          "set, whose largest shapes may not fit")


def device_total_memory(device: str) -> int | None:
    """Total memory of the CUDA device the check runs on (bytes, as the driver reports it); None on CPU."""
    return torch.cuda.get_device_properties(0).total_memory if str(device).startswith("cuda") else None


def load_shapes(path: str, arch: str, device_memory: int | None, name: str = "auto") -> tuple[list[dict], dict]:
    """`arch`'s shapes from the set pick_shape_set chooses in the shapes file `path`, and what to record of the
    choice."""
    try:
        sets = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: --shapes: {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(sets, dict) or not sets or not all(isinstance(v, dict) and "memory_bytes" in v and "shapes" in v
                                                         for v in sets.values()):
        raise SystemExit(f"error: --shapes: {path}: not a map of GPU name -> {{memory_bytes, shapes}} "
                         "(bench/plan_8b_bench.py --shapes-out writes it)")
    chosen, why = pick_shape_set(sets, device_memory, name)
    if arch not in sets[chosen]["shapes"]:
        raise SystemExit(f"error: --shapes: {path}: set '{chosen}' holds no shapes for {arch}")
    return sets[chosen]["shapes"][arch], dict(shape_set=chosen, shape_set_memory_gb=sets[chosen]["memory_bytes"] / 1e9,
                                              shape_set_reason=why)


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def load_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def prompt_tokenizer(folder: str | None):
    """A real tokenizer for the prompts (its ids fit inside both architectures' vocabularies): `folder`, a carried
    .gpu-tokenizer/, or the embedded SmolLM2's; the tiny ChatML family's only when none is there."""
    from engine import embedded
    from engine.loading import load_model

    candidates = [folder] if folder else [str(ROOT / ".gpu-tokenizer")]
    if not folder and embedded.is_converted():
        candidates.append(str(embedded.converted_dir()))
    for path in candidates:
        if Path(path, "tokenizer.json").is_file() or Path(path, "tokenizer_config.json").is_file():
            return load_tokenizer(path), path
    if folder:
        raise SystemExit(f"error: --tokenizer: {folder} holds no tokenizer")
    print("warning: no real tokenizer found (pass --tokenizer, or carry .gpu-tokenizer/): prompts use tiny-olmo3's "
          "1,200-token vocabulary and are about twice as long as real ones; rates are not representative")
    return load_model("tiny-olmo3", device="cpu").tokenizer, "tiny-olmo3 (not representative)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="olmo3")
    ap.add_argument("--scenarios", type=int, default=64)
    ap.add_argument("--orders", type=int, default=32)
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--token-budget", type=int, default=65536)
    ap.add_argument("--tiny", action="store_true", help="small config on CPU: checks the script, measures nothing useful")
    ap.add_argument("--tokenizer", default=None,
                    help="folder holding a real tokenizer for the prompts (default: the embedded SmolLM2's if it is "
                         "installed or carried in .gpu-tokenizer/, else tiny-olmo3's 1,200-token one, whose prompts "
                         "are about twice as long as a real tokenizer's)")
    ap.add_argument("--prepare-tokenizer", action="store_true",
                    help="copy the embedded SmolLM2's tokenizer into .gpu-tokenizer/ (to carry to a GPU machine) and exit")
    ap.add_argument("--shapes", default=None, help="JSON of the decoding shapes to time per step (bench/plan_8b_bench.py "
                    "--shapes-out writes the paper profile's, per GPU and architecture)")
    ap.add_argument("--shape-set", default="auto", help="which GPU's set of --shapes to time (auto: by the device's "
                    "total memory, the largest GPU's set the device holds)")
    ap.add_argument("--parts", default="d,gen,decode,grid,generators", help="comma-separated, of d (the D readout's "
                    "prefill rate), gen (batched generation), decode (batch 1 and large, dynamic and graph), grid (--shapes' "
                    "step times), generators (the own decoder's graph and dynamic paths and vLLM on a J workload at one of "
                    "--shapes' J shapes, bench/gpu_shapes.json's without --shapes)")
    ap.add_argument("--compare-tokens", type=int, default=64, help="new tokens per rollout in the generators part (the "
                    "J shape's own budget is longer; the part's time limit bounds it)")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if args.prepare_tokenizer:
        from engine import embedded

        target = ROOT / ".gpu-tokenizer"
        load_tokenizer(embedded.ensure_smollm2()).save_pretrained(target)
        print(f"wrote the embedded SmolLM2 tokenizer to {target}")
        return

    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.generation import generate
    from engine.render import Prompt, encode_prompt
    from panels.frames import render
    from panels.schema import load_panel

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    spec = dict(ARCHS[args.arch])
    if args.tiny:
        spec.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        args.scenarios, args.orders, args.gen_prompts, args.gen_tokens = 4, 4, 4, 8
    device_memory = device_total_memory(device)
    shapes, chosen, gen_shape = None, {}, None
    if args.shapes and "grid" in parts:  # read before anything is built: a wrong file stops the check at once
        shapes, chosen = load_shapes(args.shapes, args.arch, device_memory, args.shape_set)
        print(f"decoding shapes: the {chosen['shape_set']} set of {args.shapes} ({chosen['shape_set_reason']})", flush=True)
    if "generators" in parts:
        gen_shapes, gen_chosen = load_shapes(args.shapes or str(ROOT / "bench" / "gpu_shapes.json"), args.arch,
                                             device_memory, args.shape_set)
        gen_shape = generator_shape(gen_shapes)
        chosen = chosen or gen_chosen
        if args.tiny:
            gen_shape = dict(gen_shape, n=min(gen_shape["n"], 3), rows=3 * min(gen_shape["n"], 3),
                             bucket=min(gen_shape["bucket"], 16), prompt_tokens=3 * 40)  # 3 prompts of 40 tokens
            args.compare_tokens = min(args.compare_tokens, 8)
    tok, tokenizer_name = prompt_tokenizer(args.tokenizer)
    print(f"prompt tokenizer: {tokenizer_name} ({len(tok)} tokens)")
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    # FLOPs per token: the transformer body (no embedding lookup); the output head counted where it runs.
    head = model.get_output_embeddings().weight.numel()
    body = params - model.get_input_embeddings().weight.numel() - (0 if config.tie_word_embeddings else head)
    print(f"{args.arch}: {params / 1e9:.2f} B parameters, random {dtype} weights on {device} ({time.perf_counter() - t0:.1f} s)")
    rate = matmul_rate(device, dtype, n=8192 if device == "cuda" else 512, reps=20 if device == "cuda" else 3)
    print(f"dense matmul: {rate / 1e12:.1f} TFLOP/s")

    import transformers

    result = dict(arch=args.arch, device=device, gpu=torch.cuda.get_device_name() if device == "cuda" else None,
                  device_memory_gb=device_memory / 1e9 if device_memory else None,
                  torch=torch.__version__, transformers=transformers.__version__, tokenizer=tokenizer_name, params=params,
                  dtype=str(dtype).removeprefix("torch."), matmul_tflops=rate / 1e12, parts=sorted(parts), parts_done=[])
    result.update(chosen)

    def save(done: str | None = None):
        """The figures so far, written as each part (and each shape of the grid) is measured: a run stopped by its
        time limit keeps what it measured."""
        if done:
            result["parts_done"].append(done)
        if args.out:
            tmp = Path(args.out).with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=2) + "\n")
            tmp.replace(args.out)

    save()
    scenarios = load_panel("gap-v1").records[: args.scenarios]
    prompts = [encode_prompt(tok, Prompt(messages=render(s, "judge_1").messages)) for s in scenarios[: args.gen_prompts]]
    if "d" in parts:
        d_readout(model, tok, scenarios, args, body, head, rate, result)
        save("d")
    if "gen" in parts:
        t0 = time.perf_counter()
        out = generate(model, prompts, max_new_tokens=args.gen_tokens, stop_ids=frozenset(), n=9, greedy_first=True,
                       temperature=0.7, token_budget=args.token_budget, max_rows=1024)
        sync(device)
        secs = time.perf_counter() - t0
        new = sum(len(r.tokens) for rs in out for r in rs)
        prefill = sum(len(p) for p in prompts)  # one prefill per prompt, shared by its 9 rollouts
        gen_flops = 2 * body * (prefill + new) + 2 * head * (len(prompts) + new)
        result.update(gen_rollouts=sum(len(rs) for rs in out), gen_tokens=new, gen_seconds=secs, gen_tokens_per_s=new / secs,
                      gen_share_of_matmul=gen_flops / secs / rate)
        save("gen")
        print(f"generation: {len(prompts)} prompts x 9 rollouts x {args.gen_tokens} tokens: {new / secs:.0f} new tokens/s; "
              f"{100 * gen_flops / secs / rate:.1f}% of the matmul rate")
    if "decode" in parts:  # decoding speed at batch 1 and at a large batch, dynamic and static shapes (CUDA graphs on CUDA).
        import engine.decode as decode

        captured = []
        capture = decode.Cascade._capture
        decode.Cascade._capture = lambda self: (capture(self), captured.append(True))[0]
        bandwidth = copy_bandwidth(device, 2048 if device == "cuda" else 64, 10 if device == "cuda" else 3)
        itemsize = next(model.parameters()).element_size()
        bounds = ((body + head) * itemsize, 2 * (body + head), rate, bandwidth)
        result["hbm_gb_per_s"] = bandwidth / 1e9
        print(f"memory bandwidth (copy): {bandwidth / 1e9:.0f} GB/s")
        one = prompts[:1]
        large = prompts[: args.gen_prompts]
        decode_rows = []
        for label, ps, n in (("batch 1", one, 1), (f"batch {len(large) * 9}", large, 9)):
            outs = {}
            for static in (False, True):
                before = len(captured)
                outs[static], row = decode_speed(model, ps, args.gen_tokens, n, static, bounds)
                row.update(batch=label, cuda_graph=len(captured) > before)
                decode_rows.append(row)
                print(f"decode {label}, {'static' if static else 'dynamic'} shapes{' + CUDA graph' if row['cuda_graph'] else ''}: "
                      f"{row['decode_tokens_per_s']:.0f} tokens/s = {100 * row['share_of_bandwidth_bound']:.0f}% of the bandwidth bound, "
                      f"{100 * row['share_of_matmul_bound']:.1f}% of the matmul bound, {100 * row['share_of_floor']:.0f}% of the larger bound")
            agree = token_agreement(outs[False], outs[True])
            same = agree["rows_equal"] == agree["rows"]
            decode_rows[-1].update(greedy_equal_to_dynamic=same, **agree)
            parted = "" if same else f"; the others part at step {agree['median_first_difference']} in the median"
            print(f"decode {label}: static greedy tokens equal to dynamic: {same} ({agree['rows_equal']} of {agree['rows']} "
                  f"rows equal{parted})")
        decode.Cascade._capture = capture
        result["decode"] = decode_rows
        save("decode")
    if "generators" in parts:
        result["generators"] = {}
        compare_generators(model, prompts, gen_shape, args.token_budget, args.compare_tokens, result["generators"],
                           on_figure=save)
        save("generators")
    if shapes is not None:
        gc.collect()  # what the parts before held (dead batches, graphs) goes before the grid's largest shapes
        if device == "cuda":
            torch.cuda.empty_cache()
            result["allocated_gb_before_grid"] = torch.cuda.memory_allocated() / 1e9
            print(f"allocated before the grid: {result['allocated_gb_before_grid']:.1f} GB", flush=True)
        if args.tiny:
            shapes = [dict(s, bucket=min(s["bucket"], 8), rows=min(s["rows"], 8), budget=min(s["budget"], 160))
                      for s in shapes[:2]]  # 3 spans
        result["step_grid_inference_mode"] = True  # bench/gpu_results.py trusts grid times only under inference mode
        result["step_grid"] = []
        step_grid(model, prompts, shapes, args.token_budget, rows_out=result["step_grid"], on_row=save)
        save("grid")
        main_shape = max(shapes, key=lambda s: s["batches"] * s["budget"])  # where the plan spends most steps
        e2e = generate_per_step(model, prompts, main_shape, args.token_budget)
        grid = next((r for r in result["step_grid"] if r["label"] == main_shape["label"] and r["bucket"] == main_shape["bucket"]
                     and r["budget"] == main_shape["budget"] and "seconds_per_step" in r), None)
        e2e["loop_overhead_per_step"] = e2e["seconds_per_step"] - grid["seconds_per_step"] if grid else None
        result["generate_per_step"] = e2e
        save("generate_per_step")
        print(f"generate at {main_shape['label']} ({e2e['rows']} rows, {main_shape['budget']} tokens each): "
              f"{1e3 * e2e['seconds_per_step']:.2f} ms/step in all"
              + (f", {1e3 * e2e['loop_overhead_per_step']:.2f} ms above the step alone" if grid else ""), flush=True)
    if device == "cuda":
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
        print(f"peak memory {result['peak_memory_gb']:.1f} GB")
    result["complete"] = True
    save()


if __name__ == "__main__":
    main()
