"""One GPU check's figures as a table: bench/results/gpu/<run>/ holds what `bash scripts/gpu_check.sh` wrote on a
lent GPU (gpu_equal.json, gpu_check_<arch>.json, gpu_generators_<arch>.json, its log); this writes bench/results/gpu_check.md from every such
run, newest last. The figures are the device's; nothing here measures anything.

    python bench/gpu_results.py                 # after copying a run's $OUT to bench/results/gpu/<date>-<letter>/
    python bench/gpu_results.py --run "$OUT"    # one run's tables on the terminal (gpu_check.sh's last output)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "bench" / "results" / "gpu"


def generator_lines(g: dict) -> list[str]:
    """scripts/gpu_check.py's generators part: the own decoder's graph and dynamic paths on one J workload, each in
    one call and in two, the seeded rollouts equal across the two batchings, and the vLLM generator's line."""
    lines = [f"Generators on a J workload at {g['shape']['label']} ({g['prompts']} prompts, {g['prompt_tokens']} prompt "
             f"tokens, {g['rollouts_per_prompt']} rollouts each, the first greedy, T {g['temperature']}, top-p {g['top_p']}, "
             f"{g['new_tokens']} new tokens per rollout; two calls of {' and '.join(map(str, g['two_calls']))} prompts):", "",
             "| generator | one call: s | new tokens/s | two calls: s | new tokens/s | sampled equal across batchings "
             "| greedy equal across batchings |", "|---|---|---|---|---|---|---|"]
    for path, r in g.get("paths", {}).items():
        name = f"own, {'graph' if path == 'graph' else 'dynamic'} path"
        if not isinstance(r, dict):
            lines.append(f"| {name} | {r} | | | | | |")
            continue
        calls = [f"{r[k]['seconds']:.2f} | {r[k]['new_tokens_per_s']:.0f}" if k in r else " | " for k in ("one_call", "two_calls")]
        same = [f"{r[k]} of {r[t]}" if k in r else "" for k, t in (("sampled_equal_across_batchings", "sampled_total"),
                                                                   ("greedy_equal_across_batchings", "greedy_total"))]
        lines.append(f"| {name}{' (CUDA graph)' if r.get('cuda_graph') else ''} | {' | '.join(calls)} | {' | '.join(same)} |")
    if "vllm" in g:
        lines.append(f"| vLLM | {g['vllm']} | | | | | |")
    across = g.get("greedy_graph_vs_dynamic")
    if isinstance(across, dict):
        lines += ["", f"Greedy rollouts of the graph path equal the dynamic path's: {across['rows_equal']} of {across['rows']}"
                  + ("" if across["median_first_difference"] is None
                     else f" (the others part at step {across['median_first_difference']} in the median)")]
    elif across:
        lines += ["", f"Greedy rollouts of the graph path against the dynamic path's: {across}"]
    return lines + [""]


def run_lines(folder: Path) -> list[str]:
    lines = [f"## {folder.name}", ""]
    equal = folder / "gpu_equal.json"
    if equal.is_file():
        e = json.loads(equal.read_text())
        bad = [f"{r['family']} {r['check']}" for r in e["results"] if not r["ok"]]
        lines += [f"- graph path against references (scripts/gpu_equal.py, fp32, {len({r['family'] for r in e['results']})} tiny "
                  f"families, torch {e['torch']} on {e['device']}): {sum(r['ok'] for r in e['results'])} of {len(e['results'])} "
                  "checks passed" + (f"; failed: {', '.join(bad)}" if bad else "")
                  + ("" if e.get("complete", True) else "; stopped before the end (its time limit)"), ""]
    draws = folder / "draw_bench.json"
    if draws.is_file():
        d = json.loads(draws.read_text())
        lines += [f"- the draw over the whole vocabulary at top-p 1 (bench/draw_bench.py, torch {d['torch']} on {d['device']}): "
                  + "; ".join(f"{x['rows']} x {x['vocab']:,}: {x['blocks_ms']:.3f} ms block by block, {x['running_sum_ms']:.3f} ms "
                              f"with one running sum ({x['speedup']:.1f}x)" for x in d["draws"]), ""]
    for f in sorted(folder.glob("gpu_check_*.json")):
        c = json.loads(f.read_text())
        lines += [f"### {c['arch']} ({c['params'] / 1e9:.2f} B parameters, random {c.get('dtype', 'bfloat16')} weights; "
                  f"{c.get('gpu') or c['device']}, torch "
                  f"{c.get('torch')}, transformers {c.get('transformers')})", ""]
        facts = [f"dense bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s"]
        if "hbm_gb_per_s" in c:
            facts.append(f"copy bandwidth {c['hbm_gb_per_s']:.0f} GB/s")
        if "d_tokens_per_s" in c:
            facts.append(f"D readout {c['d_probes']} probes in {c['d_seconds']:.1f} s ({c['d_probes_per_s']:.0f} probes/s, "
                         f"{c['d_tokens_per_s']:.0f} computed tokens/s, {100 * c['d_share_of_matmul']:.1f}% of the matmul rate)")
        if "gen_tokens_per_s" in c:
            facts.append(f"generation {c['gen_rollouts']} rollouts x {c['gen_tokens'] // c['gen_rollouts']} tokens: "
                         f"{c['gen_tokens_per_s']:.0f} new tokens/s")
        if "parts_done" in c and not c.get("complete"):  # stopped (its time limit) after writing these parts' figures
            facts.append(f"stopped before the end: parts finished {', '.join(c['parts_done']) or 'none'}"
                         + (f", {len(c['step_grid'])} grid shapes timed" if c.get("step_grid") else ""))
        lines += [f"- {x}" for x in facts] + [""]
        if c.get("decode"):
            lines += ["| batch | path | new tokens/s | ms per step | share of the larger bound | greedy rows equal to dynamic |",
                      "|---|---|---|---|---|---|"]
            for r in c["decode"]:
                path = "static + CUDA graph" if r["cuda_graph"] else ("static" if r["static"] else "dynamic")
                equal = (f"{r['rows_equal']} of {r['rows']}" if "rows_equal" in r
                         else {True: "all", False: "not all"}.get(r.get("greedy_equal_to_dynamic"), ""))
                lines.append(f"| {r['batch']} | {path} | {r['decode_tokens_per_s']:.0f} | "
                             f"{1e3 * r['rows'] / r['decode_tokens_per_s']:.1f} | {100 * r['share_of_floor']:.0f}% | {equal} |")
            lines.append("")
        if c.get("step_grid"):
            valid = c.get("step_grid_inference_mode", False)
            shape_set = f" for the {c['shape_set']}" if "shape_set" in c else ""
            lines.append(f"Step times at the paper plan's shapes{shape_set}" + ("" if valid else " (timed outside inference mode: the "
                         "eager steps kept their activations, so the larger shapes ran out of memory; the times of the "
                         "others are graph replays, over own buffers then held at the whole budget)") + ":")
            lines += ["", "| call | rows (bucket) | own budget | ms per step | read GB/s |", "|---|---|---|---|---|"]
            for r in c["step_grid"]:
                t = f"{1e3 * r['seconds_per_step']:.2f} | {r['bytes_per_s'] / 1e9:.0f}" if "seconds_per_step" in r else "out of memory |"
                lines.append(f"| {r['label']} | {r['bucket']} | {r['budget']} | {t} |")
            lines.append("")
        g = c.get("generate_per_step")
        if g:
            above = g.get("loop_overhead_per_step")
            sampled = f", T {g['temperature']}, top-p {g['top_p']}" if "temperature" in g else ""  # not recorded before 12-04 b
            lines += [f"- the whole generation loop at {g['label']} ({g['rows']} rows, {g['budget']} tokens{sampled}): "
                      f"{1e3 * g['seconds_per_step']:.2f} ms per step"
                      + (f", {1e3 * above:.2f} ms above the step alone" if above is not None else ""), ""]
        if c.get("generators"):
            lines += generator_lines(c["generators"])
    for f in sorted(folder.glob("gpu_generators_*.json")):
        c = json.loads(f.read_text())
        lines += [f"### generators, {c['arch']} ({c['params'] / 1e9:.2f} B parameters, random {c.get('dtype', 'bfloat16')} "
                  f"weights; {c.get('gpu') or c['device']}, torch {c.get('torch')}, transformers {c.get('transformers')})", ""]
        if c.get("generators"):
            lines += generator_lines(c["generators"])
        if not c.get("complete"):
            lines += [f"- stopped before the end (its time limit): parts finished {', '.join(c.get('parts_done', [])) or 'none'}", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(RUNS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_check.md"))
    ap.add_argument("--run", default=None, help="print one run folder's tables (scripts/gpu_check.sh ends with its $OUT) "
                    "and write nothing")
    a = ap.parse_args()
    if a.run:
        print("\n".join(run_lines(Path(a.run))))
        return
    md = ["# GPU checks", "", __doc__.split("\n\n")[0].replace("\n", " "), ""]
    for folder in sorted(p for p in Path(a.runs).iterdir() if p.is_dir()):
        notes = folder / "NOTES.md"
        md += run_lines(folder) + ([notes.read_text().strip(), ""] if notes.is_file() else [])
    Path(a.out).write_text("\n".join(md))


if __name__ == "__main__":
    main()
