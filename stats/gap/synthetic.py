"""Synthetic gap-paper run directories with planted effects, for tests and benchmarks.

Owns: a per-scenario generative model whose paired excess E on the screened scenarios is known
exactly (`screened_values`, usable for one panel or thousands at once), and `make_run_dir`, which turns
it into `scenarios.parquet` (every column of contract.tables.SCENARIOS, typed as declared, the violating
option's id included) + `manifest.json`. First-token readouts get exact tempered fractions and
Poisson-binomial majority probabilities, as the readouts layer computes them; readouts, frames, groups
and dose budgets come from the readout specs (contract.readouts).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from contract import JUDGE_AGGREGATE, JUDGE_FRAMES, readout, readout_groups
from contract.tables import SCENARIOS
from stats.core.tables import conform
from stats.gap.names import CONTROL, DOSE, HARM_TWIN, J0, PRIMARY, RAW_D, RAW_J, TWIN, D, J

OPTIONS = ("honest", "violate", "defer")
VIOLATING = "violate"
DOSE_PLANTS = (  # the arm's spec, planted shift of the violating mass, completed fraction
    (readout("dose_reasoning"), -0.08, 0.10),
    (readout("dose_filler"), 0.0, 0.95),
    (readout("dose_truncated_filler"), 0.03, 0.0),
    (readout("dose_brief"), 0.02, 0.60),
    (readout("dose_norm"), -0.03, 0.15),
)
assert tuple(spec.name for spec, *_ in DOSE_PLANTS) == DOSE, "plant every dose arm of the contract, in table order"
BUDGETS = {"dose_budget": 512, "dose_brief_budget": 64, "j_budget": 512}
"""The synthetic profile's budgets, by the profile field a readout spec names."""

FAMILY_WEIGHTS = (("F1", 0.23), ("F2", 0.14), ("F3", 0.23), ("F4", 0.17), ("F5", 0.23))
DOMAINS = ("software", "medicine", "finance", "logistics", "research", "education", "energy", "retail")


@dataclass(frozen=True)
class SyntheticSpec:
    """What to plant in one synthetic run."""

    model: str = "synthetic-instruct"
    """Model name written to the manifest and the table."""
    lineage: str | None = None
    """The manifest's model.lineage (as a run copies it from the registry); None: not in a lineage."""
    stage: str | None = None
    """The manifest's model.stage: base, sft, dpo, rl-<step> or final."""
    base_lineage: str | None = None
    """The manifest's model.base_lineage."""
    panel: str = "synthetic-gap"
    n_scenarios: int = 600
    effect: float = 0.05
    """Planted paired excess E: the expected (g - g_twin) of a screened scenario."""
    spread: float = 0.08
    """Half-width of the per-scenario spread of the acting side of the excess."""
    judge_shift: float = 0.04
    """Half-width of the primary-minus-twin judgment shift (mean zero)."""
    categories: tuple[float, float, float, float] = (0.55, 0.20, 0.08, 0.17)
    """Shares of screened, no pressure, judged violating, judgment unstable primaries."""
    below_floor: float = 0.03
    """Share of scenarios whose chat letter mass is below the floor."""
    l1_fail: float = 0.08
    """Of screened: two frames judge violating (fails L1)."""
    l2_fail: float = 0.35
    """Of screened passing L1: one frame names a different non-violating option (fails L2)."""
    twin_unstable: float = 0.10
    control_band: float = 0.50
    """Planted known-gap control move p_D(control) - p_J0."""
    raw_effect: float = 0.02
    raw_asymmetry: float = -0.03
    raw_below_floor: float = 0.10
    n_orders: int = 32
    temperature: float = 0.7
    readouts: tuple[str, ...] = field(default_factory=readout_groups)
    """Which readout groups to write (contract.readout_groups: D, J, J0, raw, control, dose)."""
    harm_effect: float | None = None
    """F5's harm-matched twin: None draws it just below the primary (no planted harm contrast); a number plants
    the harm contrast g_harm_twin - g_twin = harm_effect, so E against the plain twin is `effect` (incentive
    plus harm) and E against the harm twin is effect - harm_effect (the incentive alone)."""
    exchangeable: bool = False
    """Planted null with selection: primary and twin drawn iid (most acting masses near 0), every
    judgment stable and non-violating, so the screen's selection on the acting mass alone biases the
    own-screen E upward while the selection-matched null carries the same bias."""
    seed: int = 0
    panel_seed: int = 12345
    """Seeds the scenario metadata, so runs of one panel share ids, families and generators."""


def screened_values(rng: np.random.Generator, size, effect: float, spread: float = 0.08,
                    judge_shift: float = 0.04) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """p_D, p_J, p_D twin, p_J twin of screened scenarios; E[(pD - pJ) - (pDt - pJt)] = effect exactly.

    size: anything numpy accepts (S, or (panels, S) for vectorized simulation). Values stay inside
    (0, 1) without clipping for |effect| <= 0.2, so the planted mean is exact.
    """
    p_d = rng.uniform(0.3, 0.7, size)  # acting mass inside the screen band at any temperature used
    p_dt = p_d - (effect + rng.uniform(-spread, spread, size))
    p_jt = rng.uniform(0.1, 0.5, size)
    p_j = p_jt + rng.uniform(-judge_shift, judge_shift, size)
    return p_d, p_j, p_dt, p_jt


def _orders(rng, p: np.ndarray, k: int, sd: float = 0.08) -> np.ndarray:
    """Per-order violating mass (S, k) whose mean over orders is exactly p, inside (0, 1)."""
    z = rng.standard_normal((len(p), k))
    z -= z.mean(axis=1, keepdims=True)
    room = 0.95 * np.minimum(p, 1 - p)[:, None] / np.maximum(np.abs(z).max(axis=1, keepdims=True), 1e-9)
    return p[:, None] + np.minimum(sd, room) * z


def _temper(p: np.ndarray, t: float) -> np.ndarray:
    a = p ** (1 / t)
    return a / (a + (1 - p) ** (1 / t))


def _first_token(rng, p: np.ndarray, k: int, t: float) -> dict:
    """Exact first-token readout columns from the per-scenario violating mass."""
    q = _temper(_orders(rng, p, k), t)
    return {"p_violating": p, "violating_fraction": q.mean(axis=1),
            "majority_violating_prob": sps.poisson_binom(q).sf(k // 2), "n_orders": k, "n_rollouts": k}


def _mass(rng, n, below: np.ndarray) -> np.ndarray:
    return np.where(below, rng.uniform(0.05, 0.4, n), rng.uniform(0.85, 0.99, n))


def _meta(spec: SyntheticSpec) -> pd.DataFrame:
    rng = np.random.default_rng(spec.panel_seed)
    n = spec.n_scenarios
    fams = rng.choice([f for f, _ in FAMILY_WEIGHTS], size=n, p=[w for _, w in FAMILY_WEIGHTS])
    gens = np.array(["team-a", "team-b", "team-c", "team-d"])[np.arange(n) % 4]
    return pd.DataFrame({
        "scenario_id": [f"syn-{f.lower()}-{i:04d}" for i, f in enumerate(fams)],
        "family": fams,
        "domain": rng.choice(DOMAINS, size=n),
        "generator": gens,
        "prompt_version": np.where(np.arange(n) < n * 0.3, "1.0.0", "1.1.0"),
        "violating": VIOLATING,
    })


@dataclass
class _Tables:
    """The rows being written: one block (DataFrame) per cell x readout x frame."""

    meta: pd.DataFrame
    blocks: list = field(default_factory=list)

    def add(self, cell: str, name: str, cols: dict, frame: str | None = None, budget=None, rows=None) -> None:
        """Rows of readout `name` (read in its default frame unless `frame` is given) for `rows` of the panel."""
        n = len(self.meta)
        rows = np.ones(n, dtype=bool) if rows is None else rows
        b = self.meta[rows].copy()
        b["cell"], b["readout"], b["frame"], b["budget"] = cell, name, frame or readout(name).default_frame, budget
        for c, v in cols.items():
            b[c] = v[rows] if isinstance(v, np.ndarray) and v.shape[:1] == (n,) else v
        self.blocks.append(b)


def _plant(spec: SyntheticSpec, rng, n: int):
    """Per-scenario screen category and the chat values (p_D, p_J, twins) each category plants."""
    cat = rng.choice(4, size=n, p=np.asarray(spec.categories) / np.sum(spec.categories))
    if spec.exchangeable:
        cat[:] = 0
    screened, no_pressure, judged_viol, unstable = (cat == i for i in range(4))
    p_d, p_j, p_dt, p_jt = screened_values(rng, n, spec.effect, spec.spread, spec.judge_shift)
    low = rng.random(n) < 0.8
    p_d = np.where(no_pressure, np.where(low, rng.uniform(0.005, 0.08, n), rng.uniform(0.93, 0.99, n)), p_d)
    p_j = np.where(judged_viol, rng.uniform(0.55, 0.9, n), p_j)
    p_jt = np.where(judged_viol, np.clip(p_j + rng.uniform(-0.05, 0.05, n), 0.01, 0.99), p_jt)
    p_dt = np.clip(np.where(no_pressure, p_d - spec.effect * rng.random(n), p_dt), 0.003, 0.997)
    below = rng.random(n) < spec.below_floor
    if spec.exchangeable:
        p_d, p_dt = (np.clip(rng.beta(0.7, 1.8, n), 0.003, 0.997) for _ in range(2))
        p_j, p_jt = (np.clip(rng.beta(1.0, 4.0, n), 0.003, 0.997) for _ in range(2))
    return (screened, judged_viol, unstable), (p_d, p_j, p_dt, p_jt), below


def _judgments(spec: SyntheticSpec, rng, n: int, screened, judged_viol, unstable) -> dict:
    """Per cell: the option each judge frame names (4, S) and whether each frame is stable (4, S)."""
    l1_fail = screened & (rng.random(n) < spec.l1_fail) & (not spec.exchangeable)
    l2_fail = screened & ~l1_fail & (rng.random(n) < spec.l2_fail)
    opt = np.full((4, n), OPTIONS[0], dtype=object)
    opt[:, judged_viol] = VIOLATING
    opt[1:3, l1_fail] = VIOLATING
    opt[3, l2_fail] = OPTIONS[2]
    stab = np.ones((4, n), dtype=bool)
    stab[0, unstable] = False
    topt = np.full((4, n), OPTIONS[0], dtype=object)
    tstab = np.ones((4, n), dtype=bool)
    if not spec.exchangeable:
        tstab[0] = rng.random(n) >= spec.twin_unstable
        topt[:, judged_viol & (rng.random(n) < 0.5)] = VIOLATING
    return {PRIMARY: (opt, stab), TWIN: (topt, tstab)}


def _judge_rows(t: _Tables, rng, cell: str, pj_c, judged, below, rows) -> None:
    """J: one row per judge frame and the aggregate row over the four."""
    n = len(t.meta)
    opt_c, stab_c = judged
    z = rng.standard_normal((4, n))
    z -= z.mean(axis=0)
    room = 0.9 * np.minimum(pj_c, 1 - pj_c) / np.maximum(np.abs(z).max(axis=0), 1e-9)
    pj_frames = pj_c + np.minimum(0.05, room) * z
    mass_j = _mass(rng, n, below)
    budget = BUDGETS[readout(J).budget]
    for i, f in enumerate(JUDGE_FRAMES):
        t.add(cell, J, {"p_violating": pj_frames[i], "violating_fraction": pj_frames[i],
                        "majority_violating_prob": (opt_c[i] == VIOLATING).astype(float),
                        "letter_mass": mass_j, "judged_option": opt_c[i], "stability": stab_c[i],
                        "n_orders": 1, "n_rollouts": 9, "completed_fraction": 0.9}, frame=f, budget=budget, rows=rows)
    n_viol = (opt_c == VIOLATING).sum(axis=0)
    agg = []
    for col in opt_c.T:
        vals, counts = np.unique(col.astype(str), return_counts=True)
        top = np.flatnonzero(counts == counts.max())
        agg.append(vals[top[0]] if len(top) == 1 else None)
    t.add(cell, J, {"p_violating": pj_frames.mean(axis=0), "violating_fraction": pj_frames.mean(axis=0),
                    "majority_violating_prob": (n_viol > 2).astype(float), "letter_mass": mass_j,
                    "judged_option": np.array(agg, dtype=object), "stability": stab_c.all(axis=0),
                    "violating_judged_frames": n_viol, "n_orders": 1, "n_rollouts": 36,
                    "completed_fraction": 0.9}, frame=JUDGE_AGGREGATE, budget=budget, rows=rows)


def _cell_rows(t: _Tables, spec: SyntheticSpec, rng, cell: str, pd_c, pj_c, judged, below) -> None:
    """Every readout of one cell (the harm twin: D and J of the F5 scenarios only)."""
    n, k, temp = len(t.meta), spec.n_orders, spec.temperature
    rows = (t.meta["family"].to_numpy() == "F5") if cell == HARM_TWIN else None
    mass_d = _mass(rng, n, below)
    if D in spec.readouts:
        t.add(cell, D, {**_first_token(rng, pd_c, k, temp), "letter_mass": mass_d}, rows=rows)
    if J in spec.readouts:
        _judge_rows(t, rng, cell, pj_c, judged, below, rows)
    if cell == HARM_TWIN:
        return
    p_j0 = np.clip(pj_c + rng.uniform(-0.05, 0.05, n), 0.01, 0.99)
    if J0 in spec.readouts:
        t.add(cell, J0, {**_first_token(rng, p_j0, k, temp), "letter_mass": _mass(rng, n, below)})
    if CONTROL in spec.readouts:
        p_c = np.clip(p_j0 + spec.control_band + rng.uniform(-0.15, 0.15, n), 0.01, 0.99)
        t.add(cell, CONTROL, {**_first_token(rng, p_c, k, temp), "letter_mass": _mass(rng, n, below)})
    if "dose" in spec.readouts:
        for arm, shift, completed in DOSE_PLANTS:
            p_a = np.clip(pd_c + shift + rng.uniform(-0.05, 0.05, n), 0.005, 0.995)
            draws = rng.binomial(8, p_a) / 8
            t.add(cell, arm.name,
                  {"p_violating": p_a, "violating_fraction": draws, "majority_violating_prob": (draws > 0.5) * 1.0,
                   "letter_mass": _mass(rng, n, below), "n_orders": 8, "n_rollouts": 8,
                   "completed_fraction": np.clip(completed + rng.uniform(-0.05, 0.05, n), 0, 1)},
                  budget=BUDGETS[arm.budget])


def _raw_rows(t: _Tables, spec: SyntheticSpec, rng) -> None:
    """raw_D and raw_J on primary and twin: a small planted excess read greedily over 8 orders."""
    n = len(t.meta)
    r_jt = rng.uniform(0.15, 0.45, n)
    r_dt = r_jt + spec.raw_asymmetry + rng.uniform(-0.05, 0.05, n)
    r_d = r_dt + spec.raw_effect + rng.uniform(-0.05, 0.05, n)
    r_j = r_jt + rng.uniform(-0.03, 0.03, n)
    r_below = rng.random(n) < spec.raw_below_floor
    for cell, pd_c, pj_c in ((PRIMARY, r_d, r_j), (TWIN, r_dt, r_jt)):
        for name, p in ((RAW_D, pd_c), (RAW_J, pj_c)):
            per = _orders(rng, np.clip(p, 0.01, 0.99), 8)
            share = (per > 0.5).mean(axis=1)  # greedy: the violating letter tops its order
            t.add(cell, name, {"p_violating": per.mean(axis=1), "violating_fraction": share,
                               "majority_violating_prob": (share > 0.5) * 1.0,
                               "letter_mass": _mass(rng, n, r_below), "n_orders": 8, "n_rollouts": 8})


def simulate_tables(spec: SyntheticSpec) -> tuple[pd.DataFrame, dict]:
    """The scenarios table (as contract.tables.SCENARIOS declares it) and the manifest of one synthetic run."""
    rng = np.random.default_rng(spec.seed)
    t = _Tables(_meta(spec))
    n = len(t.meta)
    (screened, judged_viol, unstable), (p_d, p_j, p_dt, p_jt), below = _plant(spec, rng, n)
    judged = _judgments(spec, rng, n, screened, judged_viol, unstable)
    values = {PRIMARY: (p_d, p_j), TWIN: (p_dt, p_jt)}
    if (t.meta["family"].to_numpy() == "F5").any():
        if spec.harm_effect is None:
            values[HARM_TWIN] = (np.clip(p_d - rng.uniform(0, 0.05, n), 0.003, 0.997), p_j)
        else:  # p_D of the harm twin sits between the primary's and the plain twin's by the planted shares
            incentive = spec.effect - spec.harm_effect
            p_dh = p_d - incentive - rng.uniform(-spec.spread, spec.spread, n)
            values[HARM_TWIN] = (np.clip(p_dh, 0.003, 0.997), p_j)  # clipping touches unscreened scenarios only
        judged[HARM_TWIN] = judged[PRIMARY]
    for cell, (pd_c, pj_c) in values.items():
        _cell_rows(t, spec, rng, cell, pd_c, pj_c, judged[cell], below)
    if "raw" in spec.readouts:
        _raw_rows(t, spec, rng)
    table = pd.concat(t.blocks, ignore_index=True)
    table.insert(0, "model", spec.model)
    table.insert(1, "panel", spec.panel)
    for c in ("judged_option", "stability", "violating_judged_frames", "completed_fraction"):
        if c not in table.columns:
            table[c] = None
    table = table.sort_values(["scenario_id", "cell", "readout", "frame"], kind="stable").reset_index(drop=True)
    manifest = {
        "model": {"name": spec.model, "source": "synthetic", "lineage": spec.lineage, "stage": spec.stage,
                  "base_lineage": spec.base_lineage},
        "panel": {"name": spec.panel, "record_count": n},
        "profile": {"name": "synthetic"},
        "readouts": list(spec.readouts),
        "seed": spec.seed,
        "sample": False,
        "synthetic": asdict(spec),
    }
    return conform(table, SCENARIOS, "synthetic scenarios table"), manifest


def make_run_dir(out_dir: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Write one synthetic run directory (manifest.json, scenarios.parquet)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table, manifest = simulate_tables(spec)
    table.to_parquet(out / SCENARIOS.file, index=False)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    return out
