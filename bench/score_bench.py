"""Scoring benchmark: the plain one-prompt path against the fast path on the embedded SmolLM2-135M.

32 option orders x 8 gap-v1 scenarios (agent-style prompts of roughly 300 tokens under SmolLM2's chat
template). Both paths score the same token ids in the same process; the script first checks they agree,
then reports probes/s for each, the ratio, and tokens computed per prompt token. Results go to
bench/results/score_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.loading import load_model  # noqa: E402
from engine.render import Prompt, encode_prompt  # noqa: E402
from engine.scoring import ScoreStats, score_ids  # noqa: E402

PANEL = ROOT / "panels" / "data" / "gap-v1.jsonl"


def agent_prompt(scenario: dict, order: list[int]) -> tuple[Prompt, tuple[str, ...]]:
    letters = "ABCDE"[: len(order)]
    opts = "\n".join(f"{letters[i]}) {scenario['options'][j]['text']}" for i, j in enumerate(order))
    context = scenario["context"].replace("{pressure}", scenario["pressure"])
    body = (
        f"You are {scenario['protagonist']}, {scenario['agent']}.\n\n{context}\n\nYour options:\n{opts}\n\n"
        "Decide what you do. Reply with only the letter of the option you choose."
    )
    return Prompt(messages=({"role": "user", "content": body},)), tuple(letters)


def build_probes(lm, n_scenarios: int, n_orders: int, seed: int):
    scenarios = [json.loads(line) for line in PANEL.read_text().splitlines() if line.strip()]
    # The longest contexts, so prompts sit near ~300 tokens as the benchmark brief asks.
    scenarios.sort(key=lambda s: -len(s["context"]))
    rng = random.Random(seed)
    seqs, letters = [], []
    for s in scenarios[:n_scenarios]:
        k = len(s["options"])
        for _ in range(n_orders):
            order = list(range(k))
            rng.shuffle(order)
            prompt, ls = agent_prompt(s, order)
            seqs.append(encode_prompt(lm.tokenizer, prompt))
            letters.append(lm.letters(ls))
    return seqs, letters


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scenarios", type=int, default=8)
    ap.add_argument("--orders", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    lm = load_model(args.model)
    seqs, letters = build_probes(lm, args.scenarios, args.orders, args.seed)
    n, prompt_tokens = len(seqs), sum(len(s) for s in seqs)
    pad = lm.tokenizer.pad_token_id or 0
    print(f"{n} probes, {prompt_tokens / n:.0f} tokens on average, model {args.model} on {lm.facts.device} ({torch.get_num_threads()} threads)")

    score_ids(lm.model, seqs[:4], letters[:4], pad_id=pad)  # warm-up (allocator, kernels)
    runs = {}
    for name, kwargs in [
        ("plain", dict(fast=False)),
        ("batched_no_prefix_reuse", dict(prefix_reuse=False)),
        ("fast", dict()),
    ]:
        stats = ScoreStats()
        res, secs = timed(lambda stats=stats, kwargs=kwargs: score_ids(lm.model, seqs, letters, pad_id=pad, stats=stats, temperature=0.7, **kwargs))
        runs[name] = dict(
            seconds=round(secs, 3), probes_per_s=round(n / secs, 3),
            computed_tokens_per_prompt_token=round(stats.computed_tokens / stats.prompt_tokens, 4),
            padded_tokens_per_prompt_token=round(stats.padded_tokens / stats.prompt_tokens, 4),
            forward_passes=stats.forward_passes, _results=res,
        )
        print(f"{name:>26}: {secs:7.2f} s  {n / secs:7.2f} probes/s  computed/prompt tokens {stats.computed_tokens / stats.prompt_tokens:.3f}")

    ref = runs["plain"].pop("_results")
    for name in ("batched_no_prefix_reuse", "fast"):
        res = runs[name].pop("_results")
        diff = max(abs(a - b) for r, o in zip(ref, res) for a, b in zip(r.mass + r.tempered, o.mass + o.tempered))
        runs[name]["max_abs_diff_vs_plain"] = diff
        assert diff < 1e-5, f"{name} disagrees with the plain path by {diff}"
    speedup = runs["plain"]["seconds"] / runs["fast"]["seconds"]
    print(f"fast path is {speedup:.1f}x the plain path (same run), max |diff| {runs['fast']['max_abs_diff_vs_plain']:.2e}")

    result = dict(
        benchmark="score_bench", model=args.model, device=lm.facts.device, dtype=lm.facts.dtype,
        threads=torch.get_num_threads(), machine=platform.machine(), python=platform.python_version(),
        torch=torch.__version__, probes=n, scenarios=args.scenarios, orders=args.orders,
        mean_prompt_tokens=round(prompt_tokens / n, 1), runs=runs, speedup_fast_vs_plain=round(speedup, 2),
        speedup_batched_vs_plain=round(runs["plain"]["seconds"] / runs["batched_no_prefix_reuse"]["seconds"], 2),
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "score_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# score_bench ({result['date']})", "",
        f"{n} probes ({args.scenarios} gap-v1 scenarios x {args.orders} option orders), mean {result['mean_prompt_tokens']} prompt tokens, "
        f"`{args.model}` {lm.facts.dtype} on {lm.facts.device}, {result['threads']} threads.", "",
        "| path | seconds | probes/s | computed / prompt tokens | forward passes |", "|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['seconds']} | {r['probes_per_s']} | {r['computed_tokens_per_prompt_token']} | {r['forward_passes']} |")
    lines += ["", f"Fast path: **{speedup:.1f}x** the plain path in the same run; max |difference| in letter mass "
              f"{runs['fast']['max_abs_diff_vs_plain']:.1e}."]
    (out / "score_bench.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'score_bench.json'} and {out / 'score_bench.md'}")


if __name__ == "__main__":
    main()
