"""D-readout benchmark: this engine against the naive path and against lm-evaluation-harness, on the same
chat-rendered prompts and the same model (SmolLM2-135M, fp32 CPU by default), in one process run.

- engine: `score_ids` (prefix reuse, token-budget batches, head on read positions) on every probe:
  32 option orders x N gap-v1 scenarios x (primary, twin), agent frame.
- naive: one prompt at a time, `model.generate(max_new_tokens=1, output_scores=True)`.
- lm-eval: `HFLM.loglikelihood` with the letters' single-token continuations ("A" and " A" ...) on the
  same contexts (install with `make bench-deps`; skipped with a note if lm_eval is missing).
The slow sides run on a seeded subset of the probes (their per-probe cost does not depend on the rest);
all sides are checked to agree within 1e-4 on the letter distribution before anything is timed or reported.
Also: tokens computed per prompt token, the share of this machine's fp32 matmul rate (measured in the
same run), peak memory, and the J readout's generation throughput batched vs one prompt at a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.generation import generate  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.planner import plan_prefix_groups  # noqa: E402
from engine.render import Prompt, encode_prompt  # noqa: E402
from engine.scoring import ScoreStats, score_ids  # noqa: E402
from panels.frames import render  # noqa: E402
from panels.orders import option_orders  # noqa: E402
from panels.schema import load_panel  # noqa: E402


def matmul_rate(n=2048, reps=10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def normalized(values):
    total = sum(values)
    return [v / total for v in values]


def naive_masses(lm, ids, letter_tokens):
    out = lm.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=1, do_sample=False, output_scores=True, return_dict_in_generate=True,
                            pad_token_id=lm.tokenizer.pad_token_id)
    probs = out.scores[0][0].float().softmax(-1)
    return [float(probs[list(t)].sum()) for t in letter_tokens.token_ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scenarios", type=int, default=16)
    ap.add_argument("--orders", type=int, default=32)
    ap.add_argument("--subset", type=int, default=48, help="probes timed on the slow sides")
    ap.add_argument("--options", type=int, default=None,
                    help="only scenarios with this many options (4: 24 distinct orders, few repeats among 32)")
    ap.add_argument("--name", default="d_readout_bench", help="result file name (without extension)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    lm = load_model(args.model)
    tok = lm.tokenizer
    params = sum(p.numel() for p in lm.model.parameters())
    records = load_panel("gap-v1").records
    scenarios = [s for s in records if args.options in (None, len(s.options))][: args.scenarios]
    kind = f"gap-v1 scenarios with {args.options} options" if args.options else "gap-v1 scenarios"
    seqs, letters, texts = [], [], []
    for s in scenarios:
        for cell in ("primary", "twin"):
            for order in option_orders(len(s.options), args.orders, 0, f"{s.id}|D"):
                r = render(s, "agent", cell, order)
                ids = encode_prompt(tok, Prompt(messages=r.messages))
                seqs.append(ids)
                letters.append(lm.letters(r.letters))
                texts.append(tok.decode(ids))
    n = len(seqs)
    pad = tok.pad_token_id or 0
    subset = sorted(random.Random(0).sample(range(n), min(args.subset, n)))
    print(f"{n} probes ({len(scenarios)} {kind} x 2 cells x {args.orders} orders), mean {sum(map(len, seqs)) / n:.0f} tokens; "
          f"slow sides on {len(subset)} of them")
    result = dict(benchmark=args.name, scenarios=[s.id for s in scenarios], model=args.model, dtype=lm.facts.dtype, device=lm.facts.device,
                  threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__, probes=n,
                  subset=len(subset), mean_prompt_tokens=round(sum(map(len, seqs)) / n, 1), params=params)

    # --- correctness first: all sides agree on the subset ---------------------------------------------
    engine_rows = score_ids(lm.model, [seqs[i] for i in subset], [letters[i] for i in subset], pad_id=pad)
    naive_rows = [naive_masses(lm, seqs[i], letters[i]) for i in subset[:8]]
    diff_naive = max(abs(a - b) for r, m in zip(engine_rows, naive_rows) for a, b in zip(r.option_mass, normalized(m)))
    result["max_diff_naive"] = diff_naive
    assert diff_naive < 1e-4, f"naive path disagrees: {diff_naive}"
    lmeval = None
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM

        lmeval = HFLM(pretrained=lm.model, tokenizer=tok, batch_size=16, device="cpu")
    except ImportError:
        result["lm_eval"] = "not installed (make bench-deps)"
        print("lm_eval not installed: `make bench-deps` adds it; skipping that side")

    def lmeval_masses(indices):
        reqs, spans = [], []
        for i in indices:
            start = len(reqs)
            for lt in [letters[i]]:
                for ids in lt.token_ids:
                    for t in ids:
                        reqs.append(Instance("loglikelihood", {}, (texts[i], tok.decode([t])), len(reqs)))
            spans.append((start, len(reqs)))
        out = lmeval.loglikelihood(reqs, disable_tqdm=True)
        masses = []
        for i, (a, _end) in zip(indices, spans):
            vals, k = [], a
            for ids in letters[i].token_ids:
                vals.append(sum(float(torch.tensor(out[k + j][0]).exp()) for j in range(len(ids))))
                k += len(ids)
            masses.append(vals)
        return masses

    if lmeval is not None:
        lm_rows = lmeval_masses(subset[:8])
        diff_lm = max(abs(a - b) for r, m in zip(engine_rows, lm_rows) for a, b in zip(r.option_mass, normalized(m)))
        result["max_diff_lm_eval"] = diff_lm
        assert diff_lm < 1e-4, f"lm-eval disagrees: {diff_lm}"
    print(f"agreement on the letter distribution: naive {diff_naive:.1e}" + (f", lm-eval {result['max_diff_lm_eval']:.1e}" if lmeval else ""))

    # --- timing ----------------------------------------------------------------------------------------
    rate = matmul_rate()
    result["matmul_gflops"] = rate / 1e9
    stats = ScoreStats()
    t0 = time.perf_counter()
    timed_rows = score_ids(lm.model, seqs, letters, pad_id=pad, stats=stats)
    secs = time.perf_counter() - t0
    engine_rate = n / secs
    # The timed run's own numbers agree with the naive ones checked above.
    diff_timed = max(abs(a - b) for i, m in zip(subset[:8], naive_rows) for a, b in zip(timed_rows[i].option_mass, normalized(m)))
    assert diff_timed < 1e-4, f"timed engine run disagrees with the naive path: {diff_timed}"
    result["max_diff_naive_timed_run"] = diff_timed
    # Where the saving comes from: identical prompts (orders of 3 options repeat: 6 permutations for 32
    # orders), the prefix tree, and what a one-level grouping (the engine's previous plan) would compute.
    distinct = {tuple(s): i for i, s in enumerate(seqs)}
    uniq = [seqs[i] for i in distinct.values()]
    one_level = plan_prefix_groups(seqs, nest=False)
    one_level_tokens = sum(g.prefix_len + sum(len(seqs[i]) - g.prefix_len for i in g.members) for g in one_level)
    t0 = time.perf_counter()
    score_ids(lm.model, uniq, [letters[i] for i in distinct.values()], pad_id=pad)
    distinct_rate = len(uniq) / (time.perf_counter() - t0)
    result["distinct_prompts"] = dict(count=len(uniq), engine_prompts_per_s=distinct_rate,
                                      one_level_tokens_per_prompt_token=one_level_tokens / stats.prompt_tokens)
    print(f"{len(uniq)} distinct prompts: engine {distinct_rate:.2f} distinct prompts/s; a one-level grouping without "
          f"the duplicate collapse would compute {one_level_tokens / stats.prompt_tokens:.3f} tokens per prompt token")
    # FLOPs actually needed: the transformer body on every computed token, the output head only on the
    # read positions (a tied embedding lookup costs nothing).
    head = lm.model.get_output_embeddings().weight.numel()
    body = params - lm.model.get_input_embeddings().weight.numel()
    if not getattr(lm.model.config, "tie_word_embeddings", False):
        body -= head
    flops = 2 * body * stats.computed_tokens + 2 * head * n
    result["engine"] = dict(seconds=secs, probes_per_s=engine_rate,
                            computed_tokens_per_prompt_token=stats.computed_tokens / stats.prompt_tokens,
                            flops=flops, share_of_matmul_rate=flops / secs / rate)
    print(f"engine: {engine_rate:.2f} probes/s, {stats.computed_tokens / stats.prompt_tokens:.3f} tokens computed per prompt token, "
          f"{100 * result['engine']['share_of_matmul_rate']:.0f}% of the matmul rate")
    t0 = time.perf_counter()
    for i in subset:
        naive_masses(lm, seqs[i], letters[i])
    naive_rate = len(subset) / (time.perf_counter() - t0)
    result["naive"] = dict(probes_per_s=naive_rate, speedup_engine=engine_rate / naive_rate,
                           speedup_engine_distinct_only=distinct_rate / naive_rate)
    print(f"naive generate(max_new_tokens=1): {naive_rate:.2f} probes/s -> engine {engine_rate / naive_rate:.1f}x")
    if lmeval is not None:
        t0 = time.perf_counter()
        lmeval_masses(subset)
        lm_rate = len(subset) / (time.perf_counter() - t0)
        result["lm_eval"] = dict(probes_per_s=lm_rate, speedup_engine=engine_rate / lm_rate, batch_size=16)
        print(f"lm-eval HFLM.loglikelihood: {lm_rate:.2f} probes/s -> engine {engine_rate / lm_rate:.1f}x")

    # --- J readout generation: batched vs one prompt at a time -------------------------------------------
    prompts = [encode_prompt(tok, Prompt(messages=render(s, f).messages)) for s in scenarios[:4] for f in ("judge_1", "judge_2")]
    stop = frozenset()  # fixed length on both sides, so the token counts are equal
    kw = dict(max_new_tokens=32, stop_ids=stop, n=3, greedy_first=True, temperature=0.7, pad_id=pad)
    t0 = time.perf_counter()
    batched = generate(lm.model, prompts, **kw)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in prompts:
        generate(lm.model, [p], **kw)
    t_single = time.perf_counter() - t0
    new = sum(len(r.tokens) for rs in batched for r in rs)
    result["generation"] = dict(prompts=len(prompts), rollouts_per_prompt=3, new_tokens=new,
                                batched_tokens_per_s=new / t_batched, single_tokens_per_s=new / t_single,
                                speedup=t_single / t_batched)
    print(f"J generation: batched {new / t_batched:.0f} tokens/s vs one prompt at a time {new / t_single:.0f} tokens/s "
          f"({t_single / t_batched:.1f}x)")
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# {args.name} ({result['date']})", "",
             f"`{args.model}` {lm.facts.dtype} on {lm.facts.device}, {result['threads']} threads; {n} probes "
             f"({len(scenarios)} {kind} x primary/twin x {args.orders} orders), mean {result['mean_prompt_tokens']} tokens.", "",
             "| side | probes/s | engine speed-up |", "|---|---|---|",
             f"| engine (all {n} probes) | {engine_rate:.2f} | 1.0x |",
             f"| naive generate, one at a time ({len(subset)} probes) | {naive_rate:.2f} | {engine_rate / naive_rate:.1f}x |"]
    if lmeval is not None:
        lines.append(f"| lm-eval HFLM.loglikelihood, batch 16 ({len(subset)} probes) | {result['lm_eval']['probes_per_s']:.2f} | "
                     f"{result['lm_eval']['speedup_engine']:.1f}x |")
    else:
        lines.append("| lm-eval | not installed (`make bench-deps`) | |")
    d = result["distinct_prompts"]
    lines += ["", f"Agreement before timing (max |difference| of the normalized letter distribution): naive "
              f"{diff_naive:.1e}" + (f", lm-eval {result['max_diff_lm_eval']:.1e}" if lmeval else "") +
              f"; the timed engine run against the naive path: {diff_timed:.1e}.",
              f"Distinct prompts: {d['count']} of {n} (a 3-option scenario has 6 orders, a 4-option one 24: the 32 repeat them). Scored alone, "
              f"the engine runs {d['engine_prompts_per_s']:.2f} distinct prompts/s, {result['naive']['speedup_engine_distinct_only']:.1f}x "
              "the naive per-prompt rate: the speed-up without counting the duplicate collapse.",
              f"Tokens computed per prompt token: {result['engine']['computed_tokens_per_prompt_token']:.3f} (prefix tree and "
              f"duplicate collapse; a one-level grouping of prefixes without the collapse: {d['one_level_tokens_per_prompt_token']:.3f}). "
              f"Engine FLOP rate {100 * result['engine']['share_of_matmul_rate']:.0f}% of a {result['matmul_gflops']:.0f} GFLOP/s "
              f"fp32 matmul measured in the same run. Peak RSS {result['peak_rss_gb']:.1f} GB.",
              f"J generation ({len(prompts)} prompts x 3 rollouts x 32 tokens): batched {result['generation']['batched_tokens_per_s']:.0f} "
              f"tokens/s vs one prompt at a time {result['generation']['single_tokens_per_s']:.0f} ({result['generation']['speedup']:.1f}x)."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / args.name}.json and .md")


if __name__ == "__main__":
    main()
