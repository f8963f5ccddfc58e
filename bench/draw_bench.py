"""The draw over the whole vocabulary (top-p 1, the gap profiles' setting): engine/sampling.py's block-by-block
inverse CDF against the one float64 running sum over rows x vocabulary it replaced, side by side in one process.

- draw alone: `sample_tokens(logits, 0.7, 1.0, uniforms)` at each (rows, vocabulary) of `--shapes` on random
  logits, with the block draw and with the running sum patched in (`running_sum_draw`, the code as it was); the
  two must pick the same tokens on the timed inputs (checked before timing). Best of `--reps`, interleaved.
- whole loop: `engine.generation.generate` on `--model` (the embedded SmolLM2 by default), gap-v2 agent prompts,
  sampled at T 0.7 / top-p 1.0 with the greedy rollout first and no stop tokens, with either draw; the rollouts must
  be equal. On `--device` (cpu here; scripts/gpu_check.sh runs the draw alone with `--device auto` on the GPU).
Results go to bench/results/draw_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from engine import sampling  # noqa: E402
from engine.sampling import row_uniforms, sample_tokens  # noqa: E402

SHAPES = "1x128256,64x49152,256x128256"


def running_sum_draw(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The draw as it was: one float64 running sum over each whole row, searched at u x total."""
    cdf = weights.double().cumsum(-1)
    target = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)[:, 0]


@contextmanager
def drawing_with(kind: str):
    """`sample_tokens` draws with the block draw ("blocks", the engine's) or the running sum ("running_sum")."""
    own = sampling._inverse_cdf
    if kind == "running_sum":
        sampling._inverse_cdf = running_sum_draw
    try:
        yield
    finally:
        sampling._inverse_cdf = own


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def draw_times(shapes, device: torch.device, reps: int = 5, calls: int = 10) -> list[dict]:
    """Milliseconds per `sample_tokens` call at top-p 1 (T 0.7) with each draw, at each (rows, vocabulary); checks
    that both draw the same tokens first."""
    out = []
    for rows, vocab in shapes:
        gen = torch.Generator().manual_seed(rows + vocab)
        logits = (torch.randn(rows, vocab, generator=gen) * 3.0).to(device)
        uniforms = row_uniforms(range(rows), 1)[:, 0].to(device)
        picks = {}
        for kind in ("blocks", "running_sum"):
            with drawing_with(kind):
                picks[kind] = sample_tokens(logits, 0.7, 1.0, uniforms)
        if not torch.equal(picks["blocks"], picks["running_sum"]):
            raise AssertionError(f"{rows}x{vocab}: the block draw and the running sum draw different tokens")
        best = {}
        for _ in range(reps):
            for kind in ("blocks", "running_sum"):
                with drawing_with(kind):
                    sample_tokens(logits, 0.7, 1.0, uniforms)  # warm
                    _sync(device)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        sample_tokens(logits, 0.7, 1.0, uniforms)
                    _sync(device)
                    ms = 1e3 * (time.perf_counter() - t0) / calls
                best[kind] = min(best.get(kind, ms), ms)
        out.append(dict(rows=rows, vocab=vocab, blocks_ms=best["blocks"], running_sum_ms=best["running_sum"],
                        speedup=best["running_sum"] / best["blocks"]))
        print(f"draw {rows:4d} x {vocab:6d}: blocks {best['blocks']:8.3f} ms, running sum {best['running_sum']:8.3f} ms "
              f"({out[-1]['speedup']:.1f}x)", flush=True)
    return out


def loop_times(model_name: str, prompts: int, rollouts: int, tokens: int, reps: int) -> dict:
    """Seconds of `generate` at top-p 1 with each draw (best of `reps`, interleaved); the rollouts must be equal."""
    from gen_bench import agent_prompts

    from engine.generation import generate
    from engine.loading import load_model

    lm = load_model(model_name)
    ps = agent_prompts(lm.tokenizer, prompts)
    kw = dict(max_new_tokens=tokens, stop_ids=frozenset(), n=rollouts, seeds=list(range(1, prompts + 1)), pad_id=lm.pad_id,
              max_rows=prompts * rollouts, greedy_first=True, temperature=0.7, top_p=1.0)
    seconds, rolled = {}, {}
    for _ in range(reps):
        for kind in ("blocks", "running_sum"):
            with drawing_with(kind):
                t0 = time.perf_counter()
                out = generate(lm.model, ps, **kw)
                seconds.setdefault(kind, []).append(time.perf_counter() - t0)
            rolled[kind] = [r.tokens for rs in out for r in rs]
    if rolled["blocks"] != rolled["running_sum"]:
        raise AssertionError("generate's rollouts differ between the block draw and the running sum")
    new = prompts * rollouts * tokens
    best = {k: min(v) for k, v in seconds.items()}
    return dict(model=model_name, vocab=lm.model.config.vocab_size, rows=prompts * rollouts, tokens=tokens, new_tokens=new,
                seconds=seconds, blocks_tokens_per_s=new / best["blocks"], running_sum_tokens_per_s=new / best["running_sum"],
                speedup=best["running_sum"] / best["blocks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated ROWSxVOCAB for the draw alone")
    ap.add_argument("--model", default="smollm2-135m", help="the whole loop's model ('' to leave the loop out)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda where there is one)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    result = dict(bench="draw_bench", device=str(device), threads=torch.get_num_threads(), torch=torch.__version__,
                  machine=platform.machine(), draw_block=sampling.DRAW_BLOCK, draws=draw_times(shapes, device, a.reps))
    if a.model:
        result["loop"] = loop_times(a.model, a.prompts, a.rollouts, a.tokens, a.reps)
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "draw_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "draw_bench.md").write_text("\n".join(report_lines(result)) + "\n")
    print(f"wrote {out / 'draw_bench'}.json and .md")


def report_lines(result: dict) -> list[str]:
    lines = [f"# draw_bench ({result['date']})", "", __doc__.split("\n\n")[0].replace("\n", " "), "",
             f"torch {result['torch']} on {result['device']}, {result['threads']} threads; blocks of "
             f"{result['draw_block']} tokens. Best of interleaved repetitions; both draws pick the same tokens on every "
             "timed input (checked before timing).", "",
             "| rows x vocabulary | block draw (ms) | running sum (ms) | speed-up |", "|---|---|---|---|"]
    lines += [f"| {d['rows']} x {d['vocab']:,} | {d['blocks_ms']:.3f} | {d['running_sum_ms']:.3f} | {d['speedup']:.1f}x |"
              for d in result["draws"]]
    if "loop" in result:
        lp = result["loop"]
        lines += ["", f"Whole loop: `generate` on {lp['model']} (vocabulary {lp['vocab']:,}), {lp['rows']} rows x {lp['tokens']} "
                  f"new tokens, T 0.7 / top-p 1.0: {lp['blocks_tokens_per_s']:.1f} tokens/s with the block draw, "
                  f"{lp['running_sum_tokens_per_s']:.1f} with the running sum ({lp['speedup']:.2f}x); the rollouts are equal."]
    return lines


if __name__ == "__main__":
    main()
