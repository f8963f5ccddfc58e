"""Host work per decoding step: the aten operations the decode loop issues per step (each a kernel launch on a
GPU) and its host synchronizations per step (scalar reads, device-to-host copies, data-dependent shapes),
counted on CPU with engine/hostcount.py's dispatch-mode counter, for the Llama-3.1-8B and OLMo-3-7B layouts
at 32 layers with tiny dimensions (the counts depend on the layer count and layout, not on the widths).

- layouts: Llama (GQA, 4 query heads per key/value head, full attention everywhere); OLMo-3 (full multi-head
  attention, q/k norms, three sliding-window layers to one full-attention layer, window 4096), both with
  random weights (engine/tiny.py's initialisation: peaked next-token distributions) and the tiny vocabulary.
- workload: P prompts of 30-60 tokens, R rollouts each (rollout 0 greedy, the others at T 0.7 and top-p 0.95, the NSI
  profile's nucleus, or `--top-p 1`, the gap profiles' draw over the whole vocabulary), no stop tokens: every row
  runs its whole budget.
- per step: the difference between a run of T2 and one of T1 new tokens, over T2 - T1 (prefill, set-up and
  the final copies cancel). Host time per step likewise (best of --reps, without the counter), on this CPU.
- `--modes`: which decode paths run (MODES: `dynamic` is generate's CPU default; `static-check8-gpu-ops` the
  path CUDA takes by default, whose forward pass a CUDA graph replays in one launch).
- `outside the forward`: the ops per step issued outside the model's forward pass (the draw, the end-of-row
  bookkeeping, the static buffers' updates): on the CUDA graph path the host launches these and one replay per
  step; readouts/plan.py's HOST_OPS_PER_STEP takes its figure from here.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine import decode  # noqa: E402
from engine.generation import generate  # noqa: E402
from engine.hostcount import HostCounter  # noqa: E402
from engine.tiny import VOCAB_SIZE, _random_weights  # noqa: E402

LAYOUTS = {
    "llama-8b-layout": dict(model_type="llama", num_attention_heads=4, num_key_value_heads=1),
    "olmo3-7b-layout": dict(model_type="olmo3", num_attention_heads=4, num_key_value_heads=4, sliding_window=4096,
                            layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 8),
}


def layout_model(name: str, layers: int = 32):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(LAYOUTS[name])
    model_type = spec.pop("model_type")
    if "layer_types" in spec:
        spec["layer_types"] = spec["layer_types"][:layers]
    cfg = AutoConfig.for_model(model_type, vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=layers, max_position_embeddings=4096, tie_word_embeddings=False,
                               bos_token_id=0, eos_token_id=0, pad_token_id=0, **spec)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _random_weights(model, 7)
    return model


def workload(prompts: int, rollouts: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(10, VOCAB_SIZE, (30 + (17 * i) % 31,), generator=gen).tolist() for i in range(prompts)]


def run(model, prompts, rollouts, tokens, mode, top_p=0.95):
    kwargs, flags = MODES[mode]
    before = {k: getattr(decode, k) for k in flags}
    for k, v in flags.items():
        setattr(decode, k, v)
    try:
        return generate(model, prompts, max_new_tokens=tokens, stop_ids=frozenset(), n=rollouts, greedy_first=True,
                        temperature=0.7, top_p=top_p, seeds=list(range(len(prompts))), **kwargs)
    finally:
        for k, v in before.items():
            setattr(decode, k, v)


MODES = {
    "dynamic": ({}, {}),
    # The attention a GPU runs: the explicit products (CPU decoding uses its flash kernel for the prompt part).
    "dynamic-gpu-ops": ({}, {"USE_FLASH_CPU": False}),
    # CUDA's default (engine.generation STATIC_ON, CHECK_EVERY): static shapes in row-count buckets, the host
    # looking every 8 steps; run eagerly here, on CUDA each step is one replay of its bucket's captured graph.
    "static-check8-gpu-ops": ({"static_shapes": True, "check_every": 8}, {"USE_FLASH_CPU": False}),
    "dynamic-check8-gpu-ops": ({"static_shapes": False, "check_every": 8}, {"USE_FLASH_CPU": False}),
}
"""Decode paths: generate's keyword arguments and engine.decode switches."""


def measure(name: str, layers: int, prompts: int, rollouts: int, t1: int, t2: int, reps: int, mode: str,
            top_p: float = 0.95) -> dict:
    model = layout_model(name, layers)
    ids = workload(prompts, rollouts)
    counts, inside = {}, {}
    forward = decode.Cascade._forward

    def counted_forward(self, *a, **k):  # the ops of the model's forward pass: what a CUDA graph replays
        with HostCounter() as inner:
            out = forward(self, *a, **k)
        inside[t] = inside.get(t, 0) + inner.ops
        return out

    for t in (t1, t2):
        decode.Cascade._forward = counted_forward
        try:
            with HostCounter() as c:
                run(model, ids, rollouts, t, mode, top_p)
        finally:
            decode.Cascade._forward = forward
        counts[t] = c
    steps = t2 - t1
    per = lambda f: (f(counts[t2]) - f(counts[t1])) / steps  # noqa: E731
    best = {}
    for t in (t1, t2):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            run(model, ids, rollouts, t, mode, top_p)
            times.append(time.perf_counter() - start)
        best[t] = min(times)
    top = (counts[t2].ops_by_name - counts[t1].ops_by_name).most_common(12)
    syncs = {k: (counts[t2].syncs[k] - counts[t1].syncs[k]) / steps for k in set(counts[t2].syncs) | set(counts[t1].syncs)}
    return dict(layout=name, mode=mode, top_p=top_p, layers=layers, rows=prompts * rollouts, ops_per_step=per(lambda c: c.ops),
                views_per_step=per(lambda c: c.views), syncs_per_step=per(lambda c: c.sync_count),
                outside_forward_ops_per_step=per(lambda c: c.ops) - (inside.get(t2, 0) - inside.get(t1, 0)) / steps,
                syncs_by_kind=dict(sorted(syncs.items())),
                host_ms_per_step_cpu=1000 * (best[t2] - best[t1]) / steps,
                top_ops_per_step={k: v / steps for k, v in top})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--t1", type=int, default=8)
    ap.add_argument("--t2", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--top-p", type=float, default=0.95, help="the sampled rollouts' top-p (1.0: the gap profiles' "
                    "whole-vocabulary draw; 0.95: the NSI profile's nucleus)")
    ap.add_argument("--name", default="host_bench")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = [measure(layout, args.layers, args.prompts, args.rollouts, args.t1, args.t2, args.reps, mode, args.top_p)
               for layout in LAYOUTS for mode in args.modes.split(",")]
    meta = dict(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                argv=sys.argv[1:], t1=args.t1, t2=args.t2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(dict(meta=meta, results=results), indent=2) + "\n")
    lines = [f"# {args.name}", "", f"torch {meta['torch']}, {args.layers} layers, per decoding step "
             f"(runs of {args.t2} and {args.t1} new tokens, differenced), sampled at T 0.7 / top-p {args.top_p:g}", "",
             "| layout | mode | rows | ops/step | of them outside the forward | views/step | syncs/step | syncs by kind "
             "| host ms/step (CPU) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        kinds = ", ".join(f"{k} {v:g}" for k, v in r["syncs_by_kind"].items()) or "none"
        lines.append(f"| {r['layout']} | {r['mode']} | {r['rows']} | {r['ops_per_step']:.0f} "
                     f"| {r['outside_forward_ops_per_step']:.0f} | {r['views_per_step']:.0f} "
                     f"| {r['syncs_per_step']:g} | {kinds} | {r['host_ms_per_step_cpu']:.2f} |")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
