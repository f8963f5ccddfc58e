"""Slices of the screened panel (the paper's Figure 4, Figure 5 and the F5 rows): the gap, its null and
the excess on both readouts, by family, generator, family x generator and prompt version.

Owns: which slices a run has and, in each, the continuous g, g_twin and E (screened scenarios with the
twin above the floor) and the binary gap, matched null and paired excess (each on its own set, see
stats.gap.binary), all at L0. Where a slice holds harm-matched twins (F5), the same quantities against
the harm twin are reported beside the plain-twin ones (`*_harm_twin`): the plain twin removes the harm
with the incentive when the pressure sentence carries the harm, so E against it mixes a harm contrast
into the incentive effect, while the harm twin keeps the harm and removes only the incentive.

Families include the appendix family (F2, marked); generator, family x generator and prompt-version
slices pool the gate families as Figure 4's lower rows do, except family x generator, which keeps each
family (Figure 5 is F4 by generator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from stats.core.estimate import Estimate
from stats.gap import binary, continuous
from stats.gap.names import CHAT, HARM_TWIN, TWIN, D
from stats.gap.screen import Reference, Screen, above_floor, reference
from stats.gap.tables import Run

SLICE_QUANTITIES = ("g", "g_twin", "E")
"""The continuous quantities of a slice (the binary ones are binary.QUANTITIES)."""
LEVEL = "L0"


@dataclass(frozen=True)
class Nulls:
    """The null cells a slice is read against: the twin cell's reference and floor per null cell."""

    twin_ok: dict
    """cell -> scenarios whose cell reference is non-violating at L0 and whose cell is above the floor."""
    floor: dict
    """cell -> scenarios whose cell (D and J) is above the floor."""


def nulls(run: Run, floor: float) -> Nulls:
    twin_ok, floors = {}, {}
    for cell in (TWIN, HARM_TWIN):
        if not run.has(D, cell):
            continue
        ref: Reference | None = reference(run, cell)
        floors[cell] = above_floor(run, cell, CHAT, floor)
        twin_ok[cell] = (ref.level(LEVEL) if ref is not None else np.zeros(run.n, bool)) & floors[cell]
    return Nulls(twin_ok, floors)


def groups(run: Run, in_gate: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(slice column, per-scenario value, scenarios it is taken within) for each kind of slice."""
    meta = run.meta
    fam = meta["family"].astype(str).to_numpy()
    gen = meta["generator"].astype(str).to_numpy()
    every = np.ones(run.n, dtype=bool)
    return [("family", fam, every), ("generator", gen, in_gate),
            ("family x generator", np.array([f"{f}, {g}" for f, g in zip(fam, gen)], dtype=object), every),
            ("prompt_version", meta["prompt_version"].astype(str).to_numpy(), in_gate)]


def slice_block(run: Run, scr: Screen, nul: Nulls, sel: np.ndarray, subset: str,
                rng: Callable[[str], np.random.Generator], n_boot: int) -> list[Estimate]:
    """Every slice quantity on the scenarios of `sel` (before the screen)."""
    out: list[Estimate] = []
    screened = scr.screened & sel
    for cell in (TWIN, HARM_TWIN):
        if cell not in nul.floor or (cell == HARM_TWIN and not (sel & nul.floor[cell]).any()):
            continue
        suffix = "" if cell == TWIN else f"_{cell}"
        qs = SLICE_QUANTITIES if cell == TWIN else SLICE_QUANTITIES[1:]
        out += continuous.continuous_block(run, screened & nul.floor[cell], subset, rng(f"slice/{cell}/{subset}"),
                                           n_boot, analysis="slices", quantities=qs, twin=cell)
        out += binary.binary_block(run, scr.acting & sel, scr.ref.level(LEVEL), nul.twin_ok[cell], subset,
                                   rng(f"slice-binary/{cell}/{subset}"), n_boot, analysis="slices", audit=False,
                                   twin=cell, suffix=suffix)
    return out


def slice_estimates(run: Run, scr: Screen, in_gate: np.ndarray, gate: tuple[str, ...], floor: float,
                    rng: Callable[[str], np.random.Generator], n_boot: int) -> list[Estimate]:
    """Every slice of the run that holds a screened scenario."""
    nul = nulls(run, floor)
    out: list[Estimate] = []
    for col, values, within in groups(run, in_gate):
        for v in sorted(set(values[within & scr.screened])):
            family = v.split(",")[0]
            appendix = col.startswith("family") and family not in gate
            subset = f"{col}={v}" + (" (appendix)" if appendix else "")
            out += slice_block(run, scr, nul, within & (values == v), subset, rng, n_boot)
    return out
