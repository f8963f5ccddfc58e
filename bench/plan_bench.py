"""`--plan` benchmark: wall time of `readout run --plan` (and `readout nsi --plan`) on the paper profile, as a
user runs it: a fresh process each time (imports, tokenizer and config read, every prompt rendered and
tokenized), no weights loaded. The gap-v1 paper plan's target is under 10 s. Each command runs
`--reps` times; best and median count. Results go to bench/results/plan_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READOUT = Path(sys.executable).parent / "readout"

COMMANDS = {
    "gap-v1 paper (readout run --plan)": ["run", "--plan", "--panel", "gap-v1", "--profile", "paper", "--gpu", "h200"],
    "nsi-14 paper (readout nsi --plan)": ["nsi", "--plan", "--profile", "paper", "--gpu", "h200"],
}


def timed(args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([str(READOUT), *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"plan_bench: {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return wall, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    rows = []
    for name, args in COMMANDS.items():
        walls, out = [], ""
        for _ in range(a.reps):
            wall, out = timed([*args[:2], "--model", a.model, *args[2:]])
            walls.append(wall)
        total = next((line for line in out.splitlines() if line.startswith("total ")), "")
        rows.append({"command": name, "best_s": round(min(walls), 2), "median_s": round(statistics.median(walls), 2),
                     "runs_s": [round(w, 2) for w in walls], "total_row": " ".join(total.split())})
    result = {"bench": "plan_bench", "model": a.model, "reps": a.reps, "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count(), "rows": rows,
              "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# plan_bench ({result['when']})", "",
          f"`--plan` with `{a.model}`'s tokenizer and config (no weights), a fresh process per run, {a.reps} runs each, "
          f"{result['cpus']} CPUs.", "",
          "| command | best (s) | median (s) | runs (s) | workload total row |", "|---|---|---|---|---|"]
    md += [f"| {r['command']} | {r['best_s']} | {r['median_s']} | {', '.join(map(str, r['runs_s']))} | `{r['total_row']}` |"
           for r in rows]
    (out_dir / "plan_bench.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
