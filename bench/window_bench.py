"""Windows of chunks (`--window`), measured on this machine: the same run of the embedded SmolLM2 (gap-v1, the
quick profile's J and dose readouts, `--limit` scenarios in chunks of one) computed one chunk at a time and with
the chunks decoded together. Reports wall times (their ratio, from one run of each), the decoding batches each
formed, and how far the two runs' tables differ (the texts must be the same; the numbers within float rounding).
On a CPU the gain is small (a batch's rows cost nearly their own time); the window is meant for a GPU, where a
step's cost hardly grows with its rows (bench/results/plan_8b.md estimates it there). Results go to
bench/results/window_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from readouts.driver import ModelOptions, RunOptions, run  # noqa: E402
from readouts.gap.study import GapStudy  # noqa: E402


def one(out: Path, model: str, limit: int, window: int) -> dict:
    options = RunOptions(model=ModelOptions(model), panel="gap-v1", profile="quick", limit=limit, out=str(out),
                         overrides=("chunk_size=1",), progress=False, window=window)
    t0 = time.perf_counter()
    run(GapStudy(readouts="J,dose"), options, log=lambda _: None, result=lambda _: None)
    wall = time.perf_counter() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    batches = {stage: [rows for _, rows, _, _ in b] for stage, b in manifest["last_session"]["decode_batches_by_stage"].items()}
    return {"window": window, "wall_s": round(wall, 1), "batches": batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one(Path(tmp) / f"w{w}", a.model, a.limit, w) for w in (1, a.window)]
        key = "probe_id"
        alone, together = (pd.read_parquet(Path(tmp) / f"w{w}" / "probes.parquet").sort_values(key).reset_index(drop=True)
                           for w in (1, a.window))
    same_texts = bool((alone.generated_text.fillna("") == together.generated_text.fillna("")).all())
    diff = float((alone.p_violating - together.p_violating).abs().max())
    result = {"bench": "window_bench", "model": a.model, "limit": a.limit, "cpus": os.cpu_count(), "runs": runs,
              "ratio": round(runs[0]["wall_s"] / runs[1]["wall_s"], 3), "rows": len(alone), "same_texts": same_texts,
              "max_abs_diff_p_violating": diff, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "window_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# window_bench ({result['when']})", "", __doc__.split("\n\n")[0].replace("\n", " "), "",
          f"{a.model}, {a.limit} scenarios, {result['cpus']} CPUs, one run each.", "",
          "| window | wall (s) | decoding batches (rows each) |", "|---|---|---|"]
    md += [f"| {r['window']} | {r['wall_s']} | " + "; ".join(f"{st}: {b}" for st, b in r["batches"].items()) + " |"
           for r in runs]
    md += ["", f"Ratio (window 1 / window {a.window}): **{result['ratio']}x**. {len(alone)} probe rows: the generated "
           f"texts are {'the same' if same_texts else 'NOT the same'}; p_violating differs by at most {diff:.2g}.", ""]
    (out / "window_bench.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
