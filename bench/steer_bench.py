"""Steering-grid benchmark: what a `readout steer` grid costs against the unsteered read of the same probes, on
SmolLM2-135M (fp32 CPU by default), in one process run: at the read position as a steered tail (the default:
engine/steered_tail.py) and through the prefix tree as an additive patch (`tail=False`), and at every position (one
tree per condition); and the capability text's loss under read-position steering, by the tail and by the text read
twice over in one forward. Writes bench/results/steering.md|json.

Probes: D's agent prompt of N gap-v1 scenarios x primary and twin x K orders. The read-position grid is layers x
strengths x R random directions (a grid of `readout steer`'s shape, whose random nulls make hundreds of conditions per
prompt), scored in one `score_steered` call per path; the every-position grid is the first direction's layers x
strengths only (each of its conditions runs every prompt again). Before timing, steered reads of each path are checked
against a hand-written hook on a plain forward (1e-5). Not part of `make test`.
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

from engine import steered_tail  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.render import Prompt, encode_prompt  # noqa: E402
from engine.scoring import ScoreStats, letter_masses, score_ids  # noqa: E402
from engine.steering import Steering, score_steered  # noqa: E402
from panels.frames import render  # noqa: E402
from panels.orders import option_orders  # noqa: E402
from panels.schema import load_panel  # noqa: E402
from readouts.steer.capability import capability_ids, read_position_loss  # noqa: E402


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
    ap.add_argument("--directions", type=int, default=16, help="random directions of the read-position grid")
    ap.add_argument("--capability-tokens", type=int, default=256, help="tokens of the capability text timed")
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
    gen = torch.Generator().manual_seed(0)
    vectors = [torch.randn(model.config.hidden_size, generator=gen) for _ in range(args.directions)]
    layers = [int(x) for x in args.layers.split(",")]
    strengths = [float(x) for x in args.strengths.split(",")]
    read_grid = [Steering(d, v, s, "read") for d in layers for s in strengths for v in vectors]
    all_grid = [Steering(d, vectors[0], s, "all") for d in layers for s in strengths]
    text = capability_ids(tok)[: args.capability_tokens]
    text_grid = [Steering(d, vectors[0], s, "read") for d in layers for s in strengths]

    for st in (read_grid[0], read_grid[-1], all_grid[0]):
        for tail in (True, False):
            got = score_steered(model, seqs[:1], letters[:1], st, pad_id=pad, tail=tail)[0]
            want = letter_masses(hooked(model, seqs[0], st)[None], letters[:1], [len(seqs[0])], 1.0, 1.0)[0]
            assert max(abs(a - b) for a, b in zip(got.mass, want.mass)) < 1e-5, (st.positions, tail)

    def unsteered():
        stats = ScoreStats()
        score_ids(model, seqs, letters, pad_id=pad, stats=stats)
        return stats.computed_tokens

    def grid_run(grid, tail=True):
        def run():
            stats = ScoreStats()
            score_steered(model, seqs * len(grid), letters * len(grid), [st for st in grid for _ in seqs], pad_id=pad,
                          stats=stats, tail=tail)
            return stats.computed_tokens
        return run

    def text_run(tail):
        def run():
            if tail:
                steered_tail.read_position_text_losses(model, text, text_grid)
            else:
                [read_position_loss(model, text, st) for st in text_grid]
            return len(text) * len(text_grid)
        return run

    sides = {  # name: (run, conditions, steered reads)
        "unsteered read": (unsteered, 1, 0),
        "read position, steered tail": (grid_run(read_grid), len(read_grid), n * len(read_grid)),
        "read position, prefix tree": (grid_run(read_grid, tail=False), len(read_grid), n * len(read_grid)),
        "every position": (grid_run(all_grid), len(all_grid), n * len(all_grid)),
        "capability text, steered tail": (text_run(True), len(text_grid), 0),
        "capability text, read twice over": (text_run(False), len(text_grid), 0),
    }
    times = {k: [] for k in sides}
    tokens = {}
    for _ in range(args.reps):
        for name, (fn, _, _) in sides.items():
            t0 = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - t0)
    best = {k: min(t) for k, t in times.items()}
    per_condition = {k: best[k] / c for k, (_, c, _) in sides.items()}
    per_read = {k: best[k] / r for k, (_, _, r) in sides.items() if r}
    result = dict(benchmark=args.name, model=args.model, dtype=lm.facts.dtype, device=lm.facts.device,
                  threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__, probes=n,
                  read_conditions=len(read_grid), every_position_conditions=len(all_grid), directions=args.directions,
                  layers=layers, strengths=strengths, capability_tokens=len(text), seconds=times, best_seconds=best,
                  computed_tokens=tokens, seconds_per_condition=per_condition, seconds_per_steered_read=per_read,
                  mean_prompt_tokens=round(sum(map(len, seqs)) / n, 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    tail, tree = "read position, steered tail", "read position, prefix tree"
    lines = [f"# {args.name}", "",
             f"{args.model} ({lm.facts.dtype}, {lm.facts.device}, {torch.get_num_threads()} threads): {n} D probes "
             f"({len(scenarios)} gap-v1 scenarios x 2 cells x {args.orders} orders, mean {result['mean_prompt_tokens']} "
             f"tokens). Read-position grid: {len(read_grid)} conditions (layers {layers} x strengths {strengths} x "
             f"{args.directions} random directions); every-position grid: {len(all_grid)} conditions (one direction); "
             f"capability text: its first {len(text)} tokens under {len(text_grid)} read-position conditions.", "",
             f"| side | best of {args.reps} (s) | per condition (s) | per steered read (ms) | tokens computed |",
             "|---|---|---|---|---|"]
    for k in sides:
        ms = f"{1000 * per_read[k]:.2f}" if k in per_read else ""
        unit = "" if k == "unsteered read" else f"{per_condition[k]:.3f}"
        lines.append(f"| {k} | {best[k]:.2f} | {unit} | {ms} | {tokens[k]} |")
    lines += ["", f"Steered tail against the prefix tree at the read position, same grid and run: "
              f"{best[tree] / best[tail]:.1f}x faster; capability text: "
              f"{best['capability text, read twice over'] / best['capability text, steered tail']:.1f}x."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
