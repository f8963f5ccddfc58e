"""Benchmark of the stats layer: `readout stats` on a 600-scenario x 4-model synthetic set, and compare.

Writes bench/results/stats_bench.json and .md. What is timed:
- each run's report (stats.gap.run_report: every analysis, every table and figure) in one process,
  after imports, and the sum over the four runs;
- the same four reports as four fresh interpreters, as four `readout stats RUN_DIR` calls would run
  (interpreter start and imports included);
- compare across the four runs, and across them plus a raw-frame-only base run (three-cell contrast).

Usage: .venv/bin/python bench/stats_bench.py [--out bench/results] [--n-scenarios 600] [--n-boot 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import scipy  # noqa: E402

from stats.gap import SyntheticSpec, compare_runs, make_run_dir, run_report  # noqa: E402

# (model, planted excess, lineage, stage): lineages as a run copies them from the registry.
MODELS = (("olmo-3-7b-sft", 0.03, "olmo-3-7b", "sft"), ("olmo-3-7b-dpo", 0.04, "olmo-3-7b", "dpo"),
          ("olmo-3-7b", 0.05, "olmo-3-7b", "final"), ("llama-3.1-8b", 0.08, "llama-3.1-8b", "final"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--n-scenarios", type=int, default=600)
    ap.add_argument("--n-boot", type=int, default=10_000)
    ap.add_argument("--workdir", default=None, help="where to write the synthetic runs (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="stats_bench_"))

    runs = []
    t = time.perf_counter()
    for i, (model, effect, lineage, stage) in enumerate(MODELS):
        runs.append(make_run_dir(work / model, SyntheticSpec(model=model, n_scenarios=args.n_scenarios, effect=effect,
                                                             seed=i + 1, lineage=lineage, stage=stage)))
    base = make_run_dir(work / "olmo-3-7b-base", SyntheticSpec(model="olmo-3-7b-base", n_scenarios=args.n_scenarios,
                                                               readouts=("raw",), raw_asymmetry=0.02, seed=9,
                                                               lineage="olmo-3-7b", stage="base"))
    generate_s = time.perf_counter() - t
    rows = {r.name: pd.read_parquet(r / "scenarios.parquet", columns=["scenario_id"]).shape[0] for r in runs}

    load_before = os.getloadavg()
    per_run, cpu_run, headlines = {}, {}, {}
    for r in runs:
        t, c = time.perf_counter(), time.process_time()
        lines = run_report(r, n_boot=args.n_boot, seed=0)
        per_run[r.name] = time.perf_counter() - t
        cpu_run[r.name] = time.process_time() - c
        headlines[r.name] = lines[:4]
    in_process = sum(per_run.values())

    fresh = {}
    code = "import sys; from stats.gap import run_report; run_report(sys.argv[1], n_boot=int(sys.argv[2]))"
    for r in runs:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, str(r), str(args.n_boot)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        fresh[r.name] = time.perf_counter() - t
    fresh_total = sum(fresh.values())
    # The CLI as a user runs it on the four runs: one `readout stats RUN_DIR...` command.
    t = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("readout")), "stats", *map(str, runs), "--n-boot", str(args.n_boot)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    cli_total = time.perf_counter() - t

    t = time.perf_counter()
    compare_lines = compare_runs(runs, work / "compare", n_boot=args.n_boot)
    compare_s = time.perf_counter() - t
    t = time.perf_counter()
    compare_base_lines = compare_runs(runs + [base], work / "compare_with_base", n_boot=args.n_boot)
    compare_base_s = time.perf_counter() - t

    result = {
        "what": "stats.gap.run_report on 4 synthetic runs, and stats.gap.compare_runs",
        "n_scenarios": args.n_scenarios, "models": [m[0] for m in MODELS], "n_boot": args.n_boot,
        "scenario_table_rows": rows,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "numpy": np.__version__, "scipy": scipy.__version__, "pandas": pd.__version__},
        "generate_s": round(generate_s, 2),
        "report_s_per_run_in_process": {k: round(v, 2) for k, v in per_run.items()},
        "report_s_total_in_process": round(in_process, 2),
        "report_cpu_s_per_run_in_process": {k: round(v, 2) for k, v in cpu_run.items()},
        "report_cpu_s_total_in_process": round(sum(cpu_run.values()), 2),
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "report_s_per_run_fresh_interpreter": {k: round(v, 2) for k, v in fresh.items()},
        "report_s_total_fresh_interpreters": round(fresh_total, 2),
        "readout_stats_one_command_4_runs_s": round(cli_total, 2),
        "compare_4_runs_s": round(compare_s, 2),
        "compare_4_runs_plus_base_s": round(compare_base_s, 2),
        "target_s": 30,
        "headlines": headlines,
        "compare_headline": compare_lines,
        "compare_with_base_headline": compare_base_lines,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stats_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# stats benchmark: `readout stats` on 600 scenarios x 4 models (synthetic)\n",
        f"Command: `.venv/bin/python bench/stats_bench.py` ({args.n_boot} bootstrap resamples, seed 0). "
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, "
        f"scipy {scipy.__version__}.\n",
        "| run | scenario rows | report wall, in process (s) | CPU (s) | report wall, fresh interpreter (s) |",
        "|---|---|---|---|---|",
    ]
    md += [f"| {k} | {rows[k]} | {per_run[k]:.2f} | {cpu_run[k]:.2f} | {fresh[k]:.2f} |" for k in per_run]
    md += [f"| **total, 4 runs** | | **{in_process:.2f}** | **{sum(cpu_run.values()):.2f}** | **{fresh_total:.2f}** |",
           "",
           f"Load average (1/5/15 min) before the reports: {', '.join(f'{x:.2f}' for x in load_before)}; other "
           "processes on the machine inflate wall time, CPU time is what the reports themselves used.", "",
           f"One command, `readout stats RUN1 RUN2 RUN3 RUN4` (process start and imports included): "
           f"**{cli_total:.2f} s**.", "",
           f"Target: under 30 s for the four runs on 2 cores. "
           f"Compare across the 4 runs: {compare_s:.2f} s; with a raw-frame base run added (three-cell contrast): "
           f"{compare_base_s:.2f} s (compare re-analyses every run). Generating the synthetic runs: {generate_s:.2f} s.",
           "", "Headlines (first lines per run):", ""]
    for k, lines in headlines.items():
        md += [f"- {k}: " + " / ".join(lines[1:3])]
    (out / "stats_bench.md").write_text("\n".join(md) + "\n")
    print(json.dumps({k: result[k] for k in ("report_s_total_in_process", "report_s_total_fresh_interpreters",
                                              "readout_stats_one_command_4_runs_s",
                                              "compare_4_runs_s", "compare_4_runs_plus_base_s")}))


if __name__ == "__main__":
    main()
