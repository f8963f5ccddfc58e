"""`readout stats` on a steering run: steer_grid.csv/.md (every condition's estimates), steer_random_band.csv/.md,
steer_capability.csv/.md, steer_summary.md and the figure steer_strength.png."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from contract.names import RANDOM_DIRECTION, UNSTEERED
from contract.tables import STEER_CAPABILITY, STEERING
from stats.core.figures import BAND, MEASURE, NULL, new_figure, save
from stats.core.output import md_section, md_table, num, write_table
from stats.core.seeding import rng_for
from stats.core.tables import read_table
from stats.steer.compute import capability, estimates, random_band, verdict
from stats.steer.names import STEER_FIGURES, STEER_MARKDOWN, STEER_OUTPUTS

DEFINITIONS = (
    "E: the paired excess (p_D - p_J0) primary - twin on the held-out scenarios (J0, the letter-only judgment, in "
    "place of J: first-token readouts only), each condition against the unsteered read of the same scenarios (paired "
    "scenario bootstrap, 95%). The twin's move is p_D(twin) under the steering minus unsteered: steering applied where "
    "there is no pressure must not move it. J0's move: the judgment under the same steering. The random band: the range "
    "of E over random directions of the steered direction's norm at that layer. Capability: the shipped held-out text's "
    "mean per-token loss over the unsteered loss. Definitions: docs/steering.md (this project's extension).")


def is_steer_run(run_dir) -> bool:
    return (Path(run_dir) / STEERING.file).is_file()


def analyze_steering(run_dir, seed: int = 0, n_boot: int = 10_000):
    """(estimates, random band, capability, steered direction's name) of a steering run directory."""
    run_dir = Path(run_dir)
    steering = read_table(run_dir / STEERING.file, STEERING)
    cap_path = run_dir / STEER_CAPABILITY.file
    cap = read_table(cap_path, STEER_CAPABILITY) if cap_path.is_file() else pd.DataFrame(columns=list(STEER_CAPABILITY.names))
    est = estimates(steering, rng_for(seed, "steer", "grid"), n_boot)
    names = [d for d in steering.direction.unique() if d not in (UNSTEERED, RANDOM_DIRECTION)]
    return est, random_band(est), capability(cap), (names[0] if names else None)


def strength_figure(est: pd.DataFrame, band: pd.DataFrame, direction: str, path: Path) -> Path:
    layers = sorted(int(x) for x in est[est.direction == direction].layer.dropna().unique())
    fig, axes = new_figure(4.4 * max(1, len(layers)), 3.4, max(1, len(layers)))
    for ax, layer in zip(axes, layers):
        d = est[(est.direction == direction) & (est.layer == layer)]
        q = {name: d[d.quantity == name].sort_values("strength") for name in ("E", "E0", "p_D_twin", "J0_move", "twin_move")}
        e = q["E"]
        ax.plot(e.strength, e.value, color=MEASURE, marker="o", ms=3, label=f"E ({direction})")
        ax.fill_between(e.strength, e.low, e.high, color=MEASURE, alpha=0.2, lw=0)
        b = band[(band.layer == layer) & (band.quantity == "E")].sort_values("strength")
        if len(b):
            ax.fill_between(b.strength, b["low"], b["high"], color=NULL, alpha=0.35, lw=0, label="E, random directions")
        e0 = float(q["E0"].value.mean()) if len(q["E0"]) else np.nan
        ax.axhline(e0, color=NULL, ls="--", lw=1, label=f"E unsteered ({e0:.2f})")
        ax.axhline(0, color=NULL, lw=0.6)
        ax.plot(q["twin_move"].strength, q["twin_move"].value, color=BAND, marker="s", ms=3, lw=1, label="p_D(twin) move")
        ax.plot(q["J0_move"].strength, q["J0_move"].value, color=BAND, ls=":", marker="^", ms=3, lw=1, label="J0 move")
        ax.set_title(f"after layer {layer}: n={int(e.n.iloc[0]) if len(e) else 0} held-out scenarios", fontsize=9)
        ax.set_xlabel("strength")
        ax.set_ylabel("E; moves against unsteered")
        ax.legend(fontsize=6, frameon=False)
    return save(fig, path)


def summary_rows(est: pd.DataFrame, band: pd.DataFrame, direction: str) -> list[dict]:
    layers = sorted(int(x) for x in est[est.direction == direction].layer.dropna().unique())
    return [v for v in (verdict(est, band, direction, layer) for layer in layers) if v]


def summary_markdown(rows: list[dict], cap: pd.DataFrame, direction: str, manifest: dict) -> str:
    st = manifest.get("steering") or {}
    head = (f"Direction `{direction}`, positions `{st.get('positions')}`, split seed {st.get('split_seed')}: "
            f"{len(st.get('train', []))} training / {len(st.get('held_out', []))} held-out scenarios, "
            f"{len(st.get('random_seeds', []))} random directions.\n\n")
    table = md_table(
        ["layer", "strength", "E", "E unsteered", "halved", "p_D(twin) move", "J0 move (primary / twin)",
         "random E range", "random directions' largest J0 move", "capability ratio", "all met"],
        [[r["layer"], num(r["strength"], 2), f"{num(r['E'])} [{num(r['E_low'])}, {num(r['E_high'])}]",
          f"{num(r['E0'])} [{num(r['E0_low'])}, {num(r['E0_high'])}]", "yes" if r["halved"] else "no", num(r["twin_move"]),
          f"{num(r['J0_move'])} / {num(r['J0_twin_move'])}", f"{num(r['random_low'])} .. {num(r['random_high'])}",
          num(r["random_J0_move"]), _cap_ratio(cap, direction, r["layer"], r["strength"]), "yes" if r["met"] else "no"] for r in rows])
    note = ("Per layer, the weakest strength at which E is halved while the twin's p_D, J0 (primary and twin) and the "
            "random band's E each stay within 0.05 of unsteered (`all met`), or, where no strength meets them all, the "
            "strength with the least E. Beside them, not part of the verdict: the largest J0 move (either cell) under the random "
            "directions, against which the direction's own J0 move reads as the direction's or as any push's.\n\n")
    return md_section("Steering (held-out split)", head + note + table + "\n\n" + DEFINITIONS)


def _cap_ratio(cap: pd.DataFrame, direction: str, layer: int, strength: float) -> str:
    c = cap[(cap.direction == direction) & (cap.layer == layer) & (cap.strength == strength)] if len(cap) else cap
    return num(float(c.ratio.iloc[0])) if len(c) else "n/a"


def run_steer_report(run_dir, out_dir=None, seed: int = 0, n_boot: int = 10_000) -> list[str]:
    """Write the steering tables, figure and summary of one run into `out_dir` (default RUN_DIR/stats)."""
    est, band, cap, direction = analyze_steering(run_dir, seed, n_boot)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "stats"
    out.mkdir(parents=True, exist_ok=True)
    for name in STEER_OUTPUTS:
        (out / name).unlink(missing_ok=True)
    write_table(est, out, "steer_grid", "Steering: every condition's estimates against the unsteered read")
    write_table(band, out, "steer_random_band", "Steering: the random directions' range per layer and strength")
    write_table(cap, out, "steer_capability", "Steering: the capability text's loss per condition")
    manifest_path = Path(run_dir) / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    lines = []
    if direction is not None and len(est):
        strength_figure(est, band, direction, out / STEER_FIGURES[0])
        rows = summary_rows(est, band, direction)
        (out / STEER_MARKDOWN).write_text(summary_markdown(rows, cap, direction, manifest))
        for r in rows:
            lines.append(f"steer: layer {r['layer']}, strength {r['strength']:g}: E {r['E']:.3f} [{r['E_low']:.3f}, "
                         f"{r['E_high']:.3f}] against {r['E0']:.3f} unsteered; p_D(twin) {r['twin_move']:+.3f}, J0 "
                         f"{r['J0_move']:+.3f} / {r['J0_twin_move']:+.3f}; random E {r['random_low']:.3f} .. {r['random_high']:.3f}")
    lines.append(f"steer: wrote {', '.join(n for n in STEER_OUTPUTS if (out / n).exists())} to {out}")
    return lines
