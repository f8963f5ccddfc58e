"""The two generators on the same rollouts: the project's own decoder (`engine.generation.generate`) against vLLM
(`engine.vllm_generation`, the server the project starts for the same checkpoint, its start-up counted), on the
quick profile's J workload of the embedded SmolLM2 in float32.

The workload is recorded, not rebuilt: a quick gap run (readouts J) is made with a recording generator, which keeps
every call the runner makes (prompts, budgets, rollouts, temperature, top-p, seeds, ties) and answers it with the
own decoder; then each side replays every recorded call, the own decoder first, vLLM after it (a fresh server, a
fresh rollout cache: nothing is answered from disk). Reported: wall seconds per side (vLLM's with and without its
start-up), new tokens per second, and how many greedy rollouts have the same token ids on both sides (where they
part, the top-2 logit gap of a plain forward there). Run with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.generation import generate  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.vllm_generation import close_generator, start_generator  # noqa: E402


def record_workload(lm, limit: int | None) -> list[tuple[list, dict]]:
    """The generate calls of a quick gap run's J readout (the run itself made with the own decoder)."""
    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.gap.study import GapStudy

    calls = []

    def recording(model, prompts, **kw):
        calls.append(([tuple(p) for p in prompts], {k: v for k, v in kw.items() if k not in ("on_batch", "on_rollouts",
                                                                                           "row_kv", "batches")}))
        return generate(model, prompts, **kw)

    study = GapStudy(readouts="J")
    original = study.runner

    def runner(*args, **kw):
        return original(*args[:5], generate=recording)

    study.runner = runner
    with tempfile.TemporaryDirectory() as out:
        run_study(study, RunOptions(model=ModelOptions("smollm2-135m", loaded=lm), profile="quick", limit=limit, out=out,
                                    progress=False), log=lambda _line: None)
    return calls


def replay(draw, lm, calls) -> tuple[list, float]:
    t0 = time.perf_counter()
    out = [draw(lm.model, prompts, **kw) for prompts, kw in calls]
    return out, time.perf_counter() - t0


def near_tie_gap(lm, prompt, a, b) -> float | None:
    t = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if t is None:
        return None
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([list(prompt) + list(a[:t])])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--limit", type=int, default=None, help="scenarios of the quick profile (default: all 10)")
    a = ap.parse_args(argv)
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    calls = record_workload(lm, a.limit)
    own, own_s = replay(generate, lm, calls)
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        gen = start_generator(lm, log=str(Path(cache) / "server.log"))
        gen.client.cache.root = Path(cache) / "rollouts"
        try:
            gen.server.start()
            startup = time.perf_counter() - t0
            drawn, vllm_s = replay(gen, lm, calls)
        finally:
            close_generator(gen)
    pairs = [(p, a_, b_) for (prompts, _), o, d in zip(calls, own, drawn) for p, ra, rb in zip(prompts, o, d)
             for a_, b_ in zip(ra, rb)]
    greedy = [(p, x, y) for p, x, y in pairs if x.greedy]
    same = sum(x.tokens == y.tokens for _, x, y in greedy)
    gaps = [near_tie_gap(lm, p, x.tokens, y.tokens) for p, x, y in greedy if x.tokens != y.tokens]
    tokens_own = sum(len(x.tokens) for _, x, _ in pairs)
    tokens_vllm = sum(len(y.tokens) for _, _, y in pairs)
    result = {
        "workload": {"profile": "quick", "readouts": "J", "limit": a.limit, "calls": len(calls),
                     "prompts": sum(len(p) for p, _ in calls), "rollouts": len(pairs), "greedy_rollouts": len(greedy)},
        "own": {"seconds": round(own_s, 2), "new_tokens": tokens_own, "tokens_per_s": round(tokens_own / own_s, 1)},
        "vllm": {"startup_seconds": round(startup, 2), "seconds": round(vllm_s, 2),
                 "seconds_with_startup": round(vllm_s + startup, 2), "new_tokens": tokens_vllm,
                 "tokens_per_s": round(tokens_vllm / vllm_s, 1),
                 "tokens_per_s_with_startup": round(tokens_vllm / (vllm_s + startup), 1), **gen.spec.identity},
        "greedy_same_tokens": same, "greedy_part_at_logit_gaps": [round(g, 5) for g in gaps],
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_gen_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "vllm_gen_bench.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    w, o, v = r["workload"], r["own"], r["vllm"]
    lines = [
        "# The two generators on the same rollouts (bench/vllm_gen_bench.py)", "",
        f"SmolLM2-135M-Instruct, float32, CPU ({r['machine']['threads']} threads); the quick profile's J workload: "
        f"{w['prompts']} prompts, {w['rollouts']} rollouts ({w['greedy_rollouts']} greedy) in {w['calls']} calls.", "",
        "| generator | seconds | new tokens | tokens/s |", "|---|---|---|---|",
        f"| own decoder | {o['seconds']} | {o['new_tokens']} | {o['tokens_per_s']} |",
        f"| vLLM {v.get('vllm', '')} (rollouts only) | {v['seconds']} | {v['new_tokens']} | {v['tokens_per_s']} |",
        f"| vLLM, server start-up ({v['startup_seconds']} s) counted | {v['seconds_with_startup']} | {v['new_tokens']} | "
        f"{v['tokens_per_s_with_startup']} |", "",
        f"Greedy rollouts with the same token ids on both sides: {r['greedy_same_tokens']} of {w['greedy_rollouts']}"
        + (f"; the others part where a plain forward's top-2 logits are {r['greedy_part_at_logit_gaps']} apart."
           if r["greedy_part_at_logit_gaps"] else "."), "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
