"""Depth-readout benchmark: the D readout with the residual capture and the logit lens at every depth against the
D readout alone, on the same probes and model (SmolLM2-135M, fp32 CPU by default), in one process run.

Both sides run `score_ids` on the same prompts (agent frame, N gap-v1 scenarios x primary and twin x K orders);
the depth side also captures every depth's residual at the read position and applies the final norm and the fp32
head to each, with each depth's KL from the last (readouts/gap/depth.py's `lens_reads`); a third side adds a tuned
lens (its translators' values do not change the cost: a seeded random one). The sides alternate, `--reps` times each, and the best time
of each is kept (other processes on a shared machine slow either side). Before timing, the depth side's last-depth
lens is checked equal to the ordinary read (1e-5). Target: depth time <= 1.5x the D readout's.
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
from engine.residuals import n_depths  # noqa: E402
from engine.scoring import score_ids  # noqa: E402
from engine.tuned_lens import TunedLens  # noqa: E402
from panels.frames import render  # noqa: E402
from panels.orders import option_orders  # noqa: E402
from panels.schema import load_panel  # noqa: E402
from readouts.gap.depth import lens_reads  # noqa: E402

TARGET = 1.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scenarios", type=int, default=4)
    ap.add_argument("--orders", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--name", default="depth_bench")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    lm = load_model(args.model)
    tok, pad = lm.tokenizer, lm.pad_id
    scenarios = load_panel("gap-v1").records[: args.scenarios]
    seqs, letters = [], []
    for s in scenarios:
        for cell in ("primary", "twin"):
            for order in option_orders(len(s.options), args.orders, 0, f"{s.id}|D"):
                r = render(s, "agent", cell, order)
                seqs.append(encode_prompt(tok, Prompt(messages=r.messages)))
                letters.append(lm.letters(r.letters))
    n = len(seqs)

    def d_readout():
        return score_ids(lm.model, seqs, letters, pad_id=pad)

    cfg = lm.model.config
    gen = torch.Generator().manual_seed(0)
    tuned = TunedLens(1e-3 * torch.randn(cfg.num_hidden_layers, cfg.hidden_size, cfg.hidden_size, generator=gen),
                      torch.zeros(cfg.num_hidden_layers, cfg.hidden_size))

    def depth_readout(lens=None):
        res = score_ids(lm.model, seqs, letters, pad_id=pad, residuals=True)
        return res, lens_reads(lm.model, [r.residuals for r in res], letters, lens)

    plain = d_readout()
    res, lensed = depth_readout()
    diff = max(abs(a - b) for p, per in zip(plain, lensed) for a, b in zip(p.mass, per["logit"][0][-1].mass))
    assert diff < 1e-5, f"last-depth lens disagrees with the read: {diff}"
    times = {"D": [], "depth": [], "tuned": []}
    for _ in range(args.reps):
        for name, fn in (("D", d_readout), ("depth", depth_readout), ("tuned", lambda: depth_readout(tuned))):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    ratio = best["depth"] / best["D"]
    ratio_tuned = best["tuned"] / best["D"]
    result = dict(benchmark=args.name, model=args.model, dtype=lm.facts.dtype, device=lm.facts.device,
                  threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__, probes=n,
                  depths=n_depths(lm.model), scenarios=[s.id for s in scenarios], orders=args.orders,
                  mean_prompt_tokens=round(sum(map(len, seqs)) / n, 1), seconds=times, best_seconds=best,
                  ratio_depth_over_d=ratio, ratio_tuned_over_d=ratio_tuned, target=TARGET, meets_target=ratio <= TARGET, max_diff_last_depth=diff)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# {args.name}", "",
             f"{args.model} ({lm.facts.dtype}, {lm.facts.device}, {torch.get_num_threads()} threads): {n} D probes "
             f"({len(scenarios)} gap-v1 scenarios x 2 cells x {args.orders} orders, mean {result['mean_prompt_tokens']} tokens), "
             f"{n_depths(lm.model)} depths.", "",
             "| side | best of %d (s) | probes/s |" % args.reps, "|---|---|---|",
             f"| D readout | {best['D']:.2f} | {n / best['D']:.2f} |",
             f"| D + depth capture + logit lens | {best['depth']:.2f} | {n / best['depth']:.2f} |",
             f"| D + depth capture + logit and tuned lens | {best['tuned']:.2f} | {n / best['tuned']:.2f} |", "",
             f"ratio {ratio:.2f}x (target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'}); with the tuned lens "
             f"{ratio_tuned:.2f}x; "
             f"last-depth lens vs read max diff {diff:.1e}."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
