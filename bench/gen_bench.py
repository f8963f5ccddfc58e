"""Generation benchmark: the engine's decode loop against transformers' `generate` and against a reference loop
without the cascade decoder, side by side in one process, on the same prompts, rows and settings.

- prompts: the first N gap-v2 scenarios in the agent frame, rendered and encoded as readouts/gap/recipe.py
  does (`panels.frames.render`, `engine.render.encode_prompt`); R rollouts per prompt; T new tokens per row,
  no stop tokens (every row generates exactly T tokens on every side, so token counts are equal).
- settings: sampling at T 0.7 / top-p 0.95 (rollout 0 greedy, as the readouts run it), and greedy.
- engine: `engine.generation.generate` (cascade decode state, on-device vectorized sampling, compaction; on
  CPU, decoding steps' linear layers on packed oneDNN weights, engine/packed.py).
- before: `engine.generation._generate_v1`, a loop without the cascade decoder (the model's own forward and cache,
  sampling from per-row CPU generators; kept for this comparison).
- transformers: `model.generate` on the same rows (each prompt repeated R times, left-padded), `do_sample`
  with the same temperature and top-p (top-k off: only its temperature and top-p warpers run), or greedy;
  no EOS, `max_new_tokens` T.
Greedy tokens are checked equal between the engine and the reference loop before anything is timed, and their
agreement with transformers' greedy rows is recorded. The sides run interleaved, `--reps` times each; the
best time of each side counts. Also: the share of the matmul-bound rate (this machine's fp32 matmul rate,
measured in the same run, over 2 x (transformer body + output head) FLOPs per new token).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from d_readout_bench import matmul_rate  # noqa: E402  (the same fp32 matmul measurement as the D-readout benchmark)

from engine.generation import _generate_v1, generate  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.render import Prompt, encode_prompt  # noqa: E402
from panels.frames import render  # noqa: E402
from panels.schema import load_panel  # noqa: E402


def agent_prompts(tok, count: int) -> list[list[int]]:
    """The agent frame of the first `count` gap-v2 scenarios, as the gap recipe renders and encodes it."""
    out = []
    for s in load_panel("gap-v2").records[:count]:
        r = render(s, "agent")
        prompt = Prompt(text=r.text) if r.text is not None else Prompt(messages=r.messages, system=r.system)
        out.append(encode_prompt(tok, prompt))
    return out


def hf_generate(lm, prompts, rollouts, tokens, sample: bool, seed: int) -> list[list[int]]:
    """transformers' generate on the same rows: each prompt repeated `rollouts` times, left-padded."""
    from transformers import GenerationConfig

    pad = lm.pad_id
    rows = [p for p in prompts for _ in range(rollouts)]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    # top_k=0 and an empty EOS list: left unset, the model's generation config would add top-k 50 and stop at EOS.
    cfg = GenerationConfig(max_new_tokens=tokens, do_sample=sample, temperature=0.7 if sample else None,
                           top_p=0.95 if sample else None, top_k=0, eos_token_id=[], pad_token_id=pad)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = lm.model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    assert out.shape[1] == width + tokens
    return out[:, width:].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2, help="timed runs of each side (interleaved); the best counts")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    ap.add_argument("--skip-hf", action="store_true", help="leave out transformers' generate (the slowest side)")
    ap.add_argument("--name", default="gen_bench")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    lm = load_model(args.model)
    prompts = agent_prompts(lm.tokenizer, args.prompts)
    rows, new = args.prompts * args.rollouts, args.prompts * args.rollouts * args.tokens
    params = sum(p.numel() for p in lm.model.parameters())
    head = lm.model.get_output_embeddings().weight.numel()
    body = params - lm.model.get_input_embeddings().weight.numel() - (0 if lm.model.config.tie_word_embeddings else head)
    flops_per_token = 2 * (body + head)
    print(f"{args.prompts} gap-v2 agent prompts (mean {sum(map(len, prompts)) / len(prompts):.0f} tokens) x {args.rollouts} rollouts "
          f"x {args.tokens} tokens = {new} new tokens; {torch.get_num_threads()} threads", flush=True)

    seeds = list(range(1, args.prompts + 1))
    engine_kw = dict(max_new_tokens=args.tokens, stop_ids=frozenset(), n=args.rollouts, seeds=seeds, pad_id=lm.pad_id,
                     max_rows=rows)
    modes = {"sampling": dict(greedy_first=True, temperature=0.7, top_p=0.95), "greedy": dict(temperature=0.0)}
    sides = {
        "engine": lambda mode: generate(lm.model, prompts, **engine_kw, **modes[mode]),
        "before": lambda mode: _generate_v1(lm.model, prompts, **engine_kw, **modes[mode]),
    }
    if not args.skip_hf:
        sides["transformers"] = lambda mode: hf_generate(lm, prompts, args.rollouts, args.tokens, mode == "sampling", seed=0)

    # --- correctness first ------------------------------------------------------------------------------
    greedy = {side: run("greedy") for side, run in sides.items()}
    flat = lambda out: [list(r.tokens) for rs in out for r in rs]  # noqa: E731
    assert flat(greedy["engine"]) == flat(greedy["before"]), "greedy tokens differ from the reference loop"
    result = dict(benchmark=args.name, model=args.model, dtype=lm.facts.dtype, device=lm.facts.device, threads=torch.get_num_threads(),
                  machine=platform.machine(), torch=torch.__version__, prompts=args.prompts, rollouts=args.rollouts,
                  tokens=args.tokens, rows=rows, new_tokens=new, prompt_tokens=[len(p) for p in prompts], params=params,
                  flops_per_new_token=flops_per_token, reps=args.reps,
                  before="engine.generation._generate_v1 (the reference loop without the cascade decoder), same process")
    if "transformers" in greedy:
        same = sum(a == b for a, b in zip(flat(greedy["engine"]), greedy["transformers"]))
        result["greedy_rows_equal_to_transformers"] = f"{same} of {rows}"
        print(f"greedy rows equal to transformers' generate: {same} of {rows}", flush=True)
    print("greedy tokens equal to the reference loop's: yes", flush=True)

    # --- timing: interleaved, best of reps ----------------------------------------------------------------
    times = {mode: {side: [] for side in sides} for mode in modes}
    rates = []
    for rep in range(args.reps):
        rates.append(matmul_rate())
        for mode in modes:
            for side, run in sides.items():
                t0 = time.perf_counter()
                run(mode)
                times[mode][side].append(time.perf_counter() - t0)
                print(f"rep {rep} {mode:8s} {side:12s} {times[mode][side][-1]:7.1f} s  {new / times[mode][side][-1]:7.1f} tokens/s", flush=True)
    rates.append(matmul_rate())
    rate = max(rates)
    bound = rate / flops_per_token
    result.update(matmul_gflops=rate / 1e9, matmul_gflops_all=[r / 1e9 for r in rates], matmul_bound_tokens_per_s=bound)
    for mode in modes:
        best = {side: min(t) for side, t in times[mode].items()}
        result[mode] = {side: dict(seconds=best[side], seconds_all=times[mode][side], tokens_per_s=new / best[side],
                                   share_of_matmul_bound=new / best[side] / bound,
                                   engine_speedup=best[side] / best["engine"]) for side in sides}
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    names = {"engine": "engine `generate`", "before": "reference loop without the cascade decoder (`_generate_v1`)",
             "transformers": "transformers `generate`"}
    lines = [f"# {args.name} ({result['date']})", "",
             f"`{args.model}` {lm.facts.dtype} on {lm.facts.device}, {result['threads']} threads; {args.prompts} gap-v2 agent-frame "
             f"prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens) x {args.rollouts} rollouts x {args.tokens} new "
             f"tokens = {rows} rows, {new} new tokens per run, no stop tokens. Best of {args.reps} interleaved runs per side.", "",
             "| side | sampling T 0.7 / top-p 0.95: tokens/s | engine speed-up | share of matmul bound | greedy: tokens/s "
             "| engine speed-up | share of matmul bound |", "|---|---|---|---|---|---|---|"]
    for side in sides:
        s, g = result["sampling"][side], result["greedy"][side]
        lines.append(f"| {names[side]} | {s['tokens_per_s']:.1f} | {s['engine_speedup']:.2f}x | {100 * s['share_of_matmul_bound']:.0f}% "
                     f"| {g['tokens_per_s']:.1f} | {g['engine_speedup']:.2f}x | {100 * g['share_of_matmul_bound']:.0f}% |")
    lines += ["", f"Matmul bound: {rate / 1e9:.0f} GFLOP/s fp32 (2048x2048 matmul, best of {len(rates)} measured between the runs) "
              f"over {flops_per_token / 1e9:.3f} GFLOP per new token (2 x (body + output head)) = {bound:.0f} new tokens/s; prefill "
              "work is not in the bound, so the shares include it as overhead.",
              "Greedy tokens of the engine equal the reference loop's on all rows (checked before timing)"
              + (f"; equal to transformers' greedy rows on {result['greedy_rows_equal_to_transformers']}." if "transformers" in sides else "."),
              f"Sampled rollouts differ from the reference loop's by design (counter-based per-row uniforms replace per-row CPU generators). "
              f"The reference loop is `engine.generation._generate_v1`, timed in the same process. Peak RSS {result['peak_rss_gb']:.1f} GB."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / args.name}.json and .md")


if __name__ == "__main__":
    main()
