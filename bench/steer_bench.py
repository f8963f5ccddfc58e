"""Steering-grid benchmark: what a `readout steer` grid costs against the unsteered read of the same probes, with
the steering at the read position (every condition shares one prefix tree) and at every position (one tree per
condition), on SmolLM2-135M (fp32 CPU by default), in one process run. Writes bench/results/steering.md|json.

Probes: D's agent prompt of N gap-v1 scenarios x primary and twin x K orders. A grid of C conditions (layers x
strengths, each steered along a fixed random direction) is scored in one `score_steered` call per mode, so the
reported time per condition is what `readout steer` pays per condition and layer. Before timing, one steered read of
each mode is checked against a hand-written hook on a plain forward (1e-5). Not part of `make test`.
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

from engine.loading import load_model  # noqa: E402
from engine.render import Prompt, encode_prompt  # noqa: E402
from engine.scoring import ScoreStats, letter_masses, score_ids  # noqa: E402
from engine.steering import Steering, score_steered  # noqa: E402
from panels.frames import render  # noqa: E402
from panels.orders import option_orders  # noqa: E402
from panels.schema import load_panel  # noqa: E402


def hooked(model, ids, st: Steering) -> torch.Tensor:
    layer = model.base_model.layers[st.depth - 1]
    last = st.positions == "read"

    def add(h):
        h = h.clone()
        if last:
            h[:, -1] += st.vector * st.strength
        else:
            h += st.vector * st.strength
        return h

    handle = layer.register_forward_hook(lambda m, a, out: (add(out[0]), *out[1:]) if isinstance(out, tuple) else add(out))
    try:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0, -1].float()
    finally:
        handle.remove()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scenarios", type=int, default=4)
    ap.add_argument("--orders", type=int, default=4)
    ap.add_argument("--layers", default="15,29")
    ap.add_argument("--strengths", default="-2,-1,1,2")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--name", default="steering")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    lm = load_model(args.model)
    tok, pad, model = lm.tokenizer, lm.pad_id, lm.model
    scenarios = load_panel("gap-v1").records[: args.scenarios]
    seqs, letters = [], []
    for s in scenarios:
        for cell in ("primary", "twin"):
            for order in option_orders(len(s.options), args.orders, 0, f"{s.id}|D"):
                r = render(s, "agent", cell, order)
                seqs.append(encode_prompt(tok, Prompt(messages=r.messages)))
                letters.append(lm.letters(r.letters))
    n = len(seqs)
    v = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    layers = [int(x) for x in args.layers.split(",")]
    strengths = [float(x) for x in args.strengths.split(",")]
    grid = [(d, s) for d in layers for s in strengths]

    for positions in ("read", "all"):
        st = Steering(layers[0], v, strengths[0], positions)
        got = score_steered(model, seqs[:1], letters[:1], st, pad_id=pad)[0]
        want = letter_masses(hooked(model, seqs[0], st)[None], letters[:1], [len(seqs[0])], 1.0, 1.0)[0]
        assert max(abs(a - b) for a, b in zip(got.mass, want.mass)) < 1e-5, positions

    def unsteered():
        stats = ScoreStats()
        score_ids(model, seqs, letters, pad_id=pad, stats=stats)
        return stats

    def grid_run(positions):
        def run():
            stats = ScoreStats()
            steer = [Steering(d, v, s, positions) for d, s in grid for _ in seqs]
            score_steered(model, seqs * len(grid), letters * len(grid), steer, pad_id=pad, stats=stats)
            return stats
        return run

    sides = {"unsteered": unsteered, "grid, read position": grid_run("read"), "grid, every position": grid_run("all")}
    times = {k: [] for k in sides}
    tokens = {}
    for _ in range(args.reps):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            stats = fn()
            times[name].append(time.perf_counter() - t0)
            tokens[name] = stats.computed_tokens
    best = {k: min(t) for k, t in times.items()}
    per_condition = {k: best[k] / len(grid) for k in sides if k != "unsteered"}
    result = dict(benchmark=args.name, model=args.model, dtype=lm.facts.dtype, device=lm.facts.device,
                  threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__, probes=n,
                  conditions=len(grid), layers=layers, strengths=strengths, seconds=times, best_seconds=best,
                  computed_tokens=tokens, seconds_per_condition=per_condition,
                  mean_prompt_tokens=round(sum(map(len, seqs)) / n, 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# {args.name}", "",
             f"{args.model} ({lm.facts.dtype}, {lm.facts.device}, {torch.get_num_threads()} threads): {n} D probes "
             f"({len(scenarios)} gap-v1 scenarios x 2 cells x {args.orders} orders, mean {result['mean_prompt_tokens']} "
             f"tokens); a grid of {len(grid)} conditions (layers {layers} x strengths {strengths}).", "",
             f"| side | best of {args.reps} (s) | per condition (s) | x unsteered per condition | tokens computed |",
             "|---|---|---|---|---|",
             f"| unsteered read | {best['unsteered']:.2f} | | | {tokens['unsteered']} |"]
    for k, t in per_condition.items():
        lines.append(f"| {k} | {best[k]:.2f} | {t:.2f} | {t / best['unsteered']:.2f} | {tokens[k]} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
