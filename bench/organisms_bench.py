"""Training cost of the shipped organisms, as each recorded it when it was trained (organisms/data/*/organism.json:
the frozen layers' pass, the optimizer steps and the final evaluation, in seconds on the machine that trained it),
with the training error that bought. Training is not rerun here: `readout organism train NAME` retrains one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from organisms import RECIPE_FILE, SHIPPED
from organisms.recipes import ORGANISMS


def rows() -> list[dict]:
    out = []
    for name in ORGANISMS:
        path = SHIPPED / name / RECIPE_FILE
        if not path.is_file():
            out.append(dict(organism=name, trained=False))
            continue
        rec = json.loads(path.read_text())
        err = rec["training_error"]
        out.append(dict(organism=name, trained=True, examples=sum(v["n"] for v in err.values()), steps=rec["recipe"]["steps"],
                        batch=rec["recipe"]["batch"], starts_from=rec["recipe"].get("init") or "", threads=rec["threads"],
                        **{f"{k}_s": v for k, v in rec["seconds"].items()},
                        total_s=round(sum(v for k, v in rec["seconds"].items() if k != "train_cpu"), 1),  # wall time
                        worst_mean_abs_error=round(max(v["mean_abs_error"] for v in err.values()), 4)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = rows()
    (out / "organisms.json").write_text(json.dumps(table, indent=1) + "\n")
    cols = ["organism", "examples", "steps", "batch", "starts_from", "threads", "cache_s", "train_s", "train_cpu_s",
            "evaluate_s", "total_s", "worst_mean_abs_error"]
    lines = ["# Organism training cost", "", "Wall seconds (train_cpu_s: the training steps' CPU seconds, where "
             "recorded) as recorded by `readout organism train` on the machine that trained each adapter (2 CPU "
             "cores, shared with other work while these were trained; the frozen-layer pass is cached across the gap "
             "organisms, so only the first pays it; a recipe that starts from another organism's adapter costs its own "
             "row plus that one's). Target: under 30 minutes each (two hours for those meant to generalize).", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table:
        lines.append("| " + " | ".join(str(r.get(c, "not trained" if c == "examples" else "")) for c in cols) + " |")
    (out / "organisms.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
