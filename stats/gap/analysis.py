"""The whole per-run analysis of the judgment-action gap paper, as data (no files, no figures).

Owns: which analyses a run's readouts allow (a missing readout skips the analyses that need it, with
the reason recorded, never silently), the scenario sets each analysis runs on, the verdict level, and
`RunAnalysis`, the result that `stats.gap.report` writes and `stats.gap.compare` combines across runs.
Every analysis draws from its own Generator derived from (seed, analysis name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from stats.core.bootstrap import estimates_from
from stats.core.estimate import Estimate
from stats.core.seeding import rng_for
from stats.gap import binary, continuous, control, dose, harness, paraphrase, raw, slices
from stats.gap.names import CHAT, HARM_TWIN, KNOWN_GAP, PRIMARY, RAW, TWIN, D, J
from stats.gap.screen import (
    DEFAULT_MASS_FLOOR,
    GATE_FAMILIES,
    LEVELS,
    Screen,
    ScreenRow,
    above_floor,
    gate_mask,
    reference,
    screen,
    screen_table,
    verdict_level,
)
from stats.gap.tables import Run, load_run


@dataclass(frozen=True)
class Skipped:
    """An analysis the run's tables do not allow, and why."""

    analysis: str
    reason: str


@dataclass(frozen=True)
class FloorRow:
    """Letter mass of one readout of one cell against the mass floor."""

    cell: str
    readout: str
    frame: str
    rows: int
    """Scenarios with this readout."""
    below_floor: int
    """Of those, total letter mass below the floor."""
    median_mass: float | None
    min_mass: float | None


@dataclass(frozen=True)
class RunAnalysis:
    """Everything computed on one run directory."""

    run: Run
    floor: float
    """Mass floor applied (total letter mass)."""
    gate: tuple[str, ...]
    """Gate families (the headline's scenario families)."""
    seed: int
    n_boot: int
    screen_rows: tuple[ScreenRow, ...]
    floors: tuple[FloorRow, ...]
    estimates: tuple[Estimate, ...]
    verdict_level: Mapping[str, str | None]
    """Per readout (continuous, binary): the strictest level with >= 40 paired scenarios, or None."""
    skipped: tuple[Skipped, ...]
    per_scenario: pd.DataFrame
    """One row per scenario: metadata, screen category, levels, the values the figures plot."""
    harness: pd.DataFrame | None = None
    """The harness calibration table (stats.gap.harness); None when the run has no probes table."""

    def get(self, analysis: str, quantity: str, subset: str | None = None) -> Estimate | None:
        for e in self.estimates:
            if e.analysis == analysis and e.quantity == quantity and (subset is None or e.subset == subset):
                return e
        return None

    def select(self, analysis: str, subset: str | None = None) -> list[Estimate]:
        return [e for e in self.estimates if e.analysis == analysis and (subset is None or e.subset == subset)]

    @property
    def model(self) -> str:
        return self.run.model


@dataclass(frozen=True)
class _Setup:
    """What every analysis of one run shares: the run, its seed and resamples, and the floor and gate masks."""

    run: Run
    seed: int
    n_boot: int
    floor: float
    gate: tuple[str, ...]
    in_gate: np.ndarray
    """Scenarios of the gate families."""
    floor_p: np.ndarray
    """D and J of the primary at or above the mass floor."""
    floor_t: np.ndarray
    """D and J of the twin at or above the mass floor."""

    def rng(self, name: str) -> np.random.Generator:
        return rng_for(self.seed, name)


def _floors(run: Run, floor: float) -> list[FloorRow]:
    rows = []
    for (cell, readout, frame, budget), block in sorted(run.blocks.items(), key=lambda kv: tuple(map(str, kv[0]))):
        mass = pd.to_numeric(block["letter_mass"], errors="coerce").dropna().to_numpy()
        name = frame if budget is None else f"{frame} ({budget})"
        rows.append(FloorRow(cell, readout, name, len(mass), int((mass < floor).sum()),
                             float(np.median(mass)) if len(mass) else None, float(mass.min()) if len(mass) else None))
    return rows


def _have(run: Run, readouts: tuple[str, ...], cells=(PRIMARY, TWIN)) -> str | None:
    """None when every readout is there on every cell, else the reason to skip."""
    missing = [f"{r} ({c})" for r in readouts for c in cells if not run.has(r, c)]
    if not missing:
        return None
    present = sorted(run.readouts(PRIMARY)) or ["none"]
    return f"needs {', '.join(missing)}; this run has {', '.join(present)}"


def analyze(run: Run | str, seed: int = 0, n_boot: int = 10_000, floor: float = DEFAULT_MASS_FLOOR,
            gate: tuple[str, ...] = GATE_FAMILIES) -> RunAnalysis:
    """Run every analysis the run's readouts allow."""
    if not isinstance(run, Run):
        run = load_run(run)
    s = _Setup(run, seed, n_boot, floor, tuple(gate), gate_mask(run, gate), above_floor(run, PRIMARY, CHAT, floor),
               above_floor(run, TWIN, CHAT, floor))
    est: list[Estimate] = []
    skipped: list[Skipped] = [Skipped(f"row {row}", "p_violating or letter_mass is not finite; counted as missing")
                              for row in run.nonfinite]
    verdict: dict[str, str | None] = {"continuous": None, "binary": None}
    chat_missing = _have(run, CHAT)
    scr: Screen | None = None
    if chat_missing is None:
        est += continuous.continuous_block(run, s.in_gate & s.floor_p & s.floor_t, "all above floor",
                                           s.rng("continuous/all"), n_boot)
        scr = screen(run, floor)
        if scr is None:
            skipped.append(Skipped("screen, strictness ladder, binary readout, slices, selection null",
                                   "needs the four judge frames (judge_1..judge_4) of J"))
    else:
        skipped.append(Skipped("continuous readout (g, twin g, E), screen, strictness ladder, binary readout, "
                               "slices, selection null", chat_missing))
    if scr is not None:
        e, sk, verdict = _screened(s, scr)
        est, skipped = est + e, skipped + sk
    for part in (_dose(s, scr), _known_gap(s), _raw(s, chat_missing)):
        est, skipped = est + part[0], skipped + part[1]
    if run.has(D, HARM_TWIN) and run.has(J, HARM_TWIN) and chat_missing is None:
        est += _harm_twin(s)
    est += paraphrase.paraphrase_swap(run, floor, s.rng, n_boot)
    if scr is not None:
        est += floor_sensitivity(run, tuple(sorted({*SENSITIVITY_FLOORS, floor})), s.gate, seed, n_boot)
    return RunAnalysis(
        run=run, floor=floor, gate=tuple(gate), seed=seed, n_boot=n_boot,
        screen_rows=tuple(screen_table(run, scr, gate)) if scr is not None else (),
        floors=tuple(_floors(run, floor)), estimates=tuple(est), verdict_level=verdict,
        skipped=tuple(skipped), per_scenario=_per_scenario(run, scr, floor, s.in_gate),
        harness=harness.harness_table(run.path),
    )


def _screened(s: _Setup, scr: Screen) -> tuple[list[Estimate], list[Skipped], dict[str, str | None]]:
    """On the screened scenarios: the strictness ladder of both readouts and their verdict levels, the
    paraphrase floor, the rollout-level fraction, the slices and the selection-matched null."""
    run, est, skipped = s.run, [], []
    ref_t = reference(run, TWIN)
    if ref_t is None:
        skipped.append(Skipped("binary matched null", "the twin cell lacks the four judge frames of J"))
    for level in LEVELS:
        prim = s.in_gate & scr.screened & scr.ref.level(level)
        est += continuous.continuous_block(run, prim & s.floor_t, level, s.rng(f"continuous/{level}"), s.n_boot)
        twin_ok = (ref_t.level(level) if ref_t is not None else np.zeros(run.n, bool)) & s.floor_t
        est += binary.binary_block(run, s.in_gate & scr.acting, scr.ref.level(level), twin_ok, level,
                                   s.rng(f"binary/{level}"), s.n_boot)
    verdict = {kind: verdict_level({lv: e.n for lv in LEVELS if (e := _get(est, kind, quantity, lv))})
               for kind, quantity in (("continuous", "E"), ("binary", "binary_excess"))}
    l0 = s.in_gate & scr.screened
    est.append(continuous.paraphrase_floor(run, l0, "L0", s.rng("paraphrase"), s.n_boot))
    vf = run.col(PRIMARY, D, "violating_fraction")
    est += estimates_from("binary", "L0", ["rollout_violating_fraction"], vf[l0 & ~np.isnan(vf)],
                          s.rng("rollout-fraction"), s.n_boot)
    est += slices.slice_estimates(run, scr, s.in_gate, s.gate, s.floor, s.rng, s.n_boot)
    twin_scr = screen(run, s.floor, cell=TWIN)
    if twin_scr is None:
        skipped.append(Skipped("selection-matched null", "the twin cell lacks D or the four judge frames of J"))
    else:
        est += continuous.selection_null(run, s.in_gate & scr.screened & s.floor_t,
                                         s.in_gate & twin_scr.screened & s.floor_p, s.rng("selection"), s.n_boot)
    return est, skipped, verdict


SENSITIVITY_FLOORS = (0.3, 0.5, 0.7)
"""Mass floors of the sensitivity table (the paper does not state its floor; 0.5 is this tool's default)."""


def floor_sensitivity(run: Run, floors=SENSITIVITY_FLOORS, gate: tuple[str, ...] = GATE_FAMILIES, seed: int = 0,
                      n_boot: int = 10_000) -> list[Estimate]:
    """The headline numbers at each mass floor: E (screened, L0) and the binary gap, null and excess,
    each with its n, so a reader sees how much the unstated floor moves them (subset `floor=<f>`)."""
    out: list[Estimate] = []
    in_gate = gate_mask(run, gate)
    ref_t = reference(run, TWIN)
    for f in floors:
        scr = screen(run, f)
        if scr is None:
            return []
        floor_t = above_floor(run, TWIN, CHAT, f)
        sub = f"floor={f:g}"
        out += continuous.continuous_block(run, in_gate & scr.screened & floor_t, sub,
                                           rng_for(seed, f"floor/{f:g}"), n_boot, analysis="floor_sensitivity",
                                           quantities=("g", "g_twin", "E"))
        twin_ok = (ref_t.level("L0") if ref_t is not None else np.zeros(run.n, bool)) & floor_t
        out += binary.binary_block(run, in_gate & scr.acting, scr.ref.level("L0"), twin_ok, sub,
                                   rng_for(seed, f"floor-binary/{f:g}"), n_boot, analysis="floor_sensitivity",
                                   audit=False)
    return out


def _dose(s: _Setup, scr: Screen | None) -> tuple[list[Estimate], list[Skipped]]:
    run = s.run
    if not any(run.has(a) for a in dose.ARMS):
        return [], [Skipped("dose arm", "no dose_* readouts in this run")]
    if scr is None:
        return [], [Skipped("dose arm", "runs on the screened scenarios, and the screen could not be applied")]
    d = dose.dose_estimates(run, s.in_gate & scr.screened, s.floor, s.rng("dose"), s.n_boot)
    if not any(" - " in e.quantity for e in d):
        arms = sorted(a for a in dose.ARMS if run.has(a))
        return d, [Skipped("dose contrasts", f"no contrast of Table 8 can be formed from {', '.join(arms)}")]
    return d, []


def _known_gap(s: _Setup) -> tuple[list[Estimate], list[Skipped]]:
    """The known-gap control move and the binary band, on the primary."""
    ctl_missing = _have(s.run, KNOWN_GAP, cells=(PRIMARY,))
    if ctl_missing is not None:
        return [], [Skipped("known-gap control and band", ctl_missing)]
    mask = s.in_gate & above_floor(s.run, PRIMARY, KNOWN_GAP, s.floor)
    return [control.control_estimate(s.run, mask, s.rng("control"), s.n_boot),
            binary.binary_band(s.run, mask, s.rng("band"), s.n_boot)], []


def _raw(s: _Setup, chat_missing: str | None) -> tuple[list[Estimate], list[Skipped]]:
    """The raw frame's summary and, with the chat readouts too, the chat-vs-raw bridge."""
    if not raw.has_frame(s.run, "raw"):
        return [], [Skipped("raw frame and chat-vs-raw bridge", _have(s.run, RAW))]
    est = raw.frame_summary(s.run, "raw", s.in_gate, s.floor, s.rng("raw"), s.n_boot)
    if chat_missing is None:
        est += raw.bridge(s.run, s.run, s.floor, s.rng("bridge"), s.n_boot, mask=s.in_gate)
    return est, []


def _get(est, analysis, quantity, subset):
    return next((e for e in est if e.analysis == analysis and e.quantity == quantity and e.subset == subset), None)


def _harm_twin(s: _Setup) -> list[Estimate]:
    """F5's harm-matched twin beside its primary: descriptive g of each cell and their paired difference."""
    run = s.run
    p_d, p_j = continuous.chat_values(run, PRIMARY)
    h_d, h_j = continuous.chat_values(run, HARM_TWIN)
    ok = s.floor_p & above_floor(run, HARM_TWIN, CHAT, s.floor) & ~np.isnan(p_d - p_j + h_d - h_j)
    cols = np.column_stack([p_d, p_j, h_d, h_j, p_d - p_j, h_d - h_j, (p_d - p_j) - (h_d - h_j)])
    names = ["p_D", "p_J", "p_D_harm_twin", "p_J_harm_twin", "g", "g_harm_twin", "g - g_harm_twin"]
    return estimates_from(HARM_TWIN, "primary and harm twin above floor", names, cols[ok], s.rng(HARM_TWIN), s.n_boot)


def _per_scenario(run: Run, scr: Screen | None, floor: float, in_gate: np.ndarray) -> pd.DataFrame:
    """Level columns L0..L2 mark the scenarios the paired excess at that level is computed on."""
    df = run.meta.copy()
    df["gate"] = in_gate
    if scr is not None:
        df["screen"] = scr.category
        floor_t = above_floor(run, TWIN, CHAT, floor)
        for level in LEVELS:
            df[level] = in_gate & scr.screened & scr.ref.level(level) & floor_t
    for cell, suffix in ((PRIMARY, ""), (TWIN, "_twin")):
        for readout, name in ((D, "p_D"), (J, "p_J")):
            if run.has(readout, cell):
                df[name + suffix] = run.col(cell, readout, "p_violating")
        if run.has(D, cell):
            df["violating_fraction" + suffix] = run.col(cell, D, "violating_fraction")
            df["majority_violating_prob" + suffix] = run.col(cell, D, "majority_violating_prob")
        if run.has(D, cell) and run.has(J, cell):
            df["g" + suffix] = df["p_D" + suffix] - df["p_J" + suffix]
            df["above_floor" + suffix] = above_floor(run, cell, CHAT, floor)
    if "g" in df and "g_twin" in df:
        df["excess"] = df["g"] - df["g_twin"]
    if all(run.has(r) for r in KNOWN_GAP):
        df["control_move"] = control.control_move(run)
    return df.reset_index()
