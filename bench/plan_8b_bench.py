"""The paper profile's `--plan` at 8B-class dimensions: gap-v2 (and nsi-14) at the paper profile, prompts
tokenized with the embedded SmolLM2's real tokenizer (49k vocabulary; the target models' own tokenizers are
not on this machine, and give prompts of about the same length in English), the model's size, key/value bytes
and host launches from the public Llama-3.1-8B and OLMo-3-7B architectures (scripts/gpu_check.py's ARCHS),
the batches as `generate` would form them on the named GPU. Estimates, not measurements: the GPU target (the
paper profile on gap-v2 for one 8B-class model in under 40 minutes on one H200) is checked against these where no
GPU run has measured it (`--measured` costs the plan from a GPU run's step times). Results go to bench/results/plan_8b.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoConfig  # noqa: E402

from engine.decode import bucket  # noqa: E402
from engine.loading import load_tokenizer_config  # noqa: E402
from readouts import vllm_plan  # noqa: E402
from readouts.chunks import WINDOW_DEFAULT, windows  # noqa: E402
from readouts.driver import ModelOptions, RunOptions, _resolve  # noqa: E402
from readouts.gap.study import GapStudy  # noqa: E402
from readouts.nsi.study import NsiStudy  # noqa: E402
from readouts.plan import GPUS, gpu_batch_bounds, model_size, plan_lines, plan_table  # noqa: E402

_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

STUDIES = {"gap-v2": (GapStudy, "gap-v2"), "nsi-14": (NsiStudy, "nsi-14")}


def plan(study_name: str, arch: str, gpu: str, window: int):
    study_cls, panel = STUDIES[study_name]
    study = study_cls()
    job = _resolve(study, RunOptions(model=ModelOptions("smollm2-135m"), panel=panel, profile="paper", progress=False))
    spec = dict(gpu_check.ARCHS[arch])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    size = model_size(config)
    tokenizer, _ = load_tokenizer_config("smollm2-135m")
    stages = study.workload(tokenizer, windows(job.chunks, window), job.profile, job.seed, gpu_batch_bounds(config, size, gpu))
    header = (f"plan: {arch} architecture (SmolLM2's tokenizer) on {panel}, profile paper, {len(job.records)} records "
              f"in {len(job.chunks)} chunks of {job.profile.chunk_size}, decoded {window} chunks at a time")
    rows = plan_table(stages, size, gpu)
    drawn, assumed = vllm_plan.vllm_plan_table(stages, size, gpu, config)
    lines = plan_lines(rows, size, gpu, header)
    lines += ["", "with --generator vllm:", *plan_lines(drawn, size, gpu, header, assumed)[3:]]
    return rows, lines, job.profile, drawn[-1]


def shapes(rows: list[dict], profile) -> list[dict]:
    """The distinct decoding shapes of a plan (call label, row bucket, longest budget), with the rollouts per prompt,
    how many batches run at each, their mean real rows and distinct prompt tokens, and the profile's sampling
    (temperature, top-p): what scripts/gpu_check.py --shapes times."""
    seen: dict[tuple, dict] = {}
    for row in rows:
        for label, n_rows, prompt_tokens, budget in row.get("decode_batches") or ():
            key = (label, bucket(n_rows), budget)
            s = seen.setdefault(key, dict(label=label, bucket=key[1], budget=budget, n=int(label.rsplit(" x", 1)[1]),
                                          batches=0, rows=0, prompt_tokens=0, temperature=profile.temperature,
                                          top_p=profile.top_p))
            s["batches"] += 1
            s["rows"] += n_rows
            s["prompt_tokens"] += prompt_tokens
    return [dict(s, rows=s["rows"] // s["batches"], prompt_tokens=s["prompt_tokens"] // s["batches"]) for s in seen.values()]


def write_shapes(path: Path, gpu: str, grid: dict[str, list]) -> None:
    """Put `grid` (architecture -> shapes) into the shapes file `path` as the set for `gpu`, beside the other GPUs'
    sets, each with the GPU's memory (scripts/gpu_check.py picks a set by the device's memory), largest first."""
    sets = json.loads(path.read_text()) if path.is_file() else {}
    sets = {name: s for name, s in sets.items() if isinstance(s, dict) and "shapes" in s}
    sets[gpu] = dict(memory_bytes=GPUS[gpu].memory, shapes=grid)
    path.write_text(json.dumps(dict(sorted(sets.items(), key=lambda kv: -kv[1]["memory_bytes"])), indent=2) + "\n")


def measured_total(rows: list[dict], check: dict) -> dict:
    """A plan's seconds from one GPU run's figures (scripts/gpu_check.py --shapes on that architecture) instead of
    the model's rates: each decoding batch steps its whole budget at the step time measured at its (call, bucket,
    budget) shape, plus the loop's measured overhead per step (sampling, checks; generate_per_step less the step
    alone); every read (a first-token probe, or a re-read after the anchor: a short suffix on held keys) at the D
    readout's measured probes per second; the prompts generated from at its computed tokens per second."""
    steps = {(r["label"], r["bucket"], r["budget"]): r["seconds_per_step"] for r in check["step_grid"] if "seconds_per_step" in r}
    overhead = max(0.0, check["generate_per_step"].get("loop_overhead_per_step") or 0.0)
    out = {"prefill_s": 0.0, "decode_s": 0.0, "reread_s": 0.0, "unmeasured_batches": 0}
    for row in rows[:-1]:
        if row["rollouts"]:
            out["prefill_s"] += row["computed_tokens"] / check["d_tokens_per_s"]
            out["reread_s"] += row["reads"] / check["d_probes_per_s"]
        else:
            out["prefill_s"] += row["reads"] / check["d_probes_per_s"]
        for label, n_rows, _, budget in row["decode_batches"]:
            key = (label, bucket(n_rows), budget)
            if key not in steps:
                out["unmeasured_batches"] += 1
                continue
            out["decode_s"] += budget * (steps[key] + overhead)
    out["total_s"] = out["prefill_s"] + out["decode_s"] + out["reread_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--studies", default=",".join(STUDIES), help="comma-separated, of " + ", ".join(STUDIES))
    ap.add_argument("--windows", default=f"1,{WINDOW_DEFAULT['cuda']}", help="comma-separated --window values "
                    "(chunks decoded together; 1: every chunk alone, as before windows)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--shapes-out", default=None, help="write the gap-v2 plans' decoding shapes at the largest window, "
                    "per architecture, into this JSON: one set for each GPU of --shape-gpus, keeping the file's other "
                    "sets (scripts/gpu_check.py --shapes times the set for its device's memory)")
    ap.add_argument("--shape-gpus", default="h200,h100", help="comma-separated GPUs whose shape sets --shapes-out writes")
    ap.add_argument("--measured", default=None, help="a folder of gpu_check_<arch>.json from one GPU run: each plan is "
                    "also costed from those measured figures")
    a = ap.parse_args()
    measured = {}
    if a.measured:
        for arch in gpu_check.ARCHS:
            f = Path(a.measured) / f"gpu_check_{arch}.json"
            if f.is_file() and "step_grid" in json.loads(f.read_text()):
                measured[arch] = json.loads(f.read_text())
    grid: dict[str, list] = {}
    md = [f"# plan_8b ({time.strftime('%Y-%m-%d %H:%M:%S')})", "", __doc__.split("\n\n")[0].replace("\n", " "), ""]
    result = {"bench": "plan_8b", "gpu": a.gpu, "plans": []}
    sections = []
    for study_name in a.studies.split(","):
        for arch in gpu_check.ARCHS:
            for window in (int(w) for w in a.windows.split(",")):
                rows, lines, profile, drawn = plan(study_name, arch, a.gpu, window)
                total = rows[-1]
                entry = {"study": study_name, "arch": arch, "window": window, "total_s": total["total_s"],
                         "decode_s": total["decode_s"], "prefill_s": total["prefill_s"], "reread_s": total["reread_s"],
                         "vllm": {k: drawn[k] for k in ("total_s", "decode_s", "prefill_s", "reread_s")}}
                if study_name == "gap-v2" and window == max(int(w) for w in a.windows.split(",")):
                    grid[arch] = shapes(rows, profile)
                if arch in measured and study_name == "gap-v2":
                    entry["measured"] = measured_total(rows, measured[arch])
                    m = entry["measured"]
                    lines.append(f"from the GPU run's figures: prefill {m['prefill_s'] / 60:.1f} min, decode {m['decode_s'] / 60:.1f} min, "
                                 f"re-read {m['reread_s'] / 60:.1f} min, total {m['total_s'] / 60:.1f} min "
                                 f"({m['unmeasured_batches']} batches at a shape not measured, left out)")
                result["plans"].append(entry)
                sections += [f"## {study_name}, {arch}, window {window}", "", "```", *lines, "```", ""]
                print("\n".join(lines), "\n")
    md += ["| study | architecture | window | decode | re-read | total | total, vLLM generator (decode, prefill + re-read) |",
           "|---|---|---|---|---|---|---|"]
    md += [f"| {p['study']} | {p['arch']} | {p['window']} | {p['decode_s'] / 60:.1f} min | {p['reread_s'] / 60:.1f} min "
           f"| **{p['total_s'] / 60:.1f} min** | **{p['vllm']['total_s'] / 60:.1f} min** ({p['vllm']['decode_s'] / 60:.1f}, "
           f"{(p['vllm']['prefill_s'] + p['vllm']['reread_s']) / 60:.1f}) |" for p in result["plans"]]
    if measured:
        md += ["", f"From one GPU run's figures ({a.measured}/gpu_check_<arch>.json, scripts/gpu_check.py --shapes): each "
               "batch steps its budget at the measured step time of its shape plus the loop's measured overhead; reads "
               "at the D readout's measured probes/s, the prompts generated from at its computed tokens/s.", "",
               "| study | architecture | window | decode | prefill + re-read | total | batches not measured |", "|---|---|---|---|---|---|---|"]
        md += [f"| {p['study']} | {p['arch']} | {p['window']} | {p['measured']['decode_s'] / 60:.1f} min | "
               f"{(p['measured']['prefill_s'] + p['measured']['reread_s']) / 60:.1f} min | **{p['measured']['total_s'] / 60:.1f} min** | "
               f"{p['measured']['unmeasured_batches']} |" for p in result["plans"] if "measured" in p]
    md += ["", *sections]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_8b.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "plan_8b.md").write_text("\n".join(md))
    if a.shapes_out:
        largest = max(int(w) for w in a.windows.split(","))
        for gpu in a.shape_gpus.split(","):
            if gpu == a.gpu and "gap-v2" in a.studies.split(","):
                write_shapes(Path(a.shapes_out), gpu, grid)
                continue
            sets = {}
            for arch in gpu_check.ARCHS:
                rows, _, profile, _ = plan("gap-v2", arch, gpu, largest)
                sets[arch] = shapes(rows, profile)
            write_shapes(Path(a.shapes_out), gpu, sets)


if __name__ == "__main__":
    main()
