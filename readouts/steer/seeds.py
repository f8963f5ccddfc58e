"""The steering experiment over several split seeds: one run per seed (its own three-way split, direction, selection
and verdict), then the pass rate of each direction's verdict over the seeds (stats.steer.rules.pass_rate)."""

from __future__ import annotations

import json
from pathlib import Path

from contract.names import RANDOM_DIRECTION, UNSTEERED
from contract.tables import STEER_ADDED, STEER_CAPABILITY, STEERING
from readouts.steer.summary import N_BOOT
from stats.core.seeding import rng_for
from stats.core.tables import read_table
from stats.steer.compute import capability, scenario_values
from stats.steer.experiment import experiment
from stats.steer.rules import Rules, pass_rate

SEEDS_FILE = "steer_seeds.json"
"""Written beside the seeds' run directories (under --out): each seed's verdicts and the pass rate per direction."""


def seed_out(out: str | None, seed: int, n_seeds: int) -> str | None:
    """Where seed `seed`'s run goes: --out itself for one seed, --out/seed-S for several (None: the default
    directory, which names the seed)."""
    if out is None or n_seeds == 1:
        return out
    return str(Path(out) / f"seed-{seed}")


def run_verdicts(run_dir: Path, n_boot: int = N_BOOT) -> dict:
    """direction -> its verdict (stats.steer.experiment) on one finished run directory."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    steering = read_table(run_dir / STEERING.file, STEERING, optional=STEER_ADDED)
    cap = read_table(run_dir / STEER_CAPABILITY.file, STEER_CAPABILITY)
    rules = Rules.from_dict((manifest.get("steering") or {}).get("rules"))
    norms = {"direction": manifest.get("steering_norms", {}), "residual": manifest.get("steering_residual_norms", {})}
    values = scenario_values(steering)
    out = {}
    for d in [d for d in dict.fromkeys(values.direction) if d not in (UNSTEERED, RANDOM_DIRECTION)]:
        out[d] = experiment(values, d, rules, rng_for(0, "steer", "verdict", d), n_boot, capability(cap), norms)[1]
    return out


def pass_rate_lines(run_dirs: list[Path], out: str | None) -> list[str]:
    """The pass rate per direction over the seeds' runs; with --out, also SEEDS_FILE there."""
    per_seed = {str(p): run_verdicts(p) for p in run_dirs}
    directions = list(dict.fromkeys(d for v in per_seed.values() for d in v))
    lines, record = [], {"runs": {}, "pass_rate": {}}
    for d in directions:
        passed = [v[d]["passed"] for v in per_seed.values() if d in v]
        rate = pass_rate(passed)
        record["pass_rate"][d] = rate
        lines.append(f"steer: {d}: passes on {rate['passed']} of {rate['n']} split seeds (rate {rate['rate']:.2f}, "
                     f"95% Wilson interval [{rate['low']:.2f}, {rate['high']:.2f}])")
    for path, v in per_seed.items():
        record["runs"][path] = {d: {k: _plain(x) for k, x in verdict.items()} for d, verdict in v.items()}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / SEEDS_FILE).write_text(json.dumps(record, indent=1, default=float))
        lines.append(f"steer: wrote {Path(out) / SEEDS_FILE}")
    return lines


def _plain(x):
    """A verdict's value as JSON holds it."""
    return x if isinstance(x, (str, bool, type(None))) else float(x)
