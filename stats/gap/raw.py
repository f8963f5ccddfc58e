"""The raw completion frame: each model's raw-frame excess, the chat-vs-raw bridge and the three-cell
base-vs-instruct contrast (the gap paper's Tables 6, 15-17 and Figure 9).

Owns: frame-generic per-scenario values (chat = D and J under the template, raw = raw_D and raw_J with
no template), alignment of two runs on shared scenario ids, and the paired contrasts across frames
(bridge: one instruct model read both ways) and across models (three-cell: base vs instruct, raw frame,
on the scenarios where both clear the mass floor on the primary and on the twin). Raw-frame numbers are
descriptive for a templated model: the paper shows the raw frame misreads one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stats.core.bootstrap import estimates_from
from stats.core.estimate import Estimate
from stats.gap.names import CHAT, HARM_TWIN, PAIRED, PRIMARY, RAW, TWIN
from stats.gap.tables import Run

FRAME_READOUTS = {"chat": CHAT, "raw": RAW}
"""Acting and judging readouts of each frame: under the chat template, and raw completion."""


def has_frame(run: Run, frame: str) -> bool:
    return all(run.has(r, c) for r in FRAME_READOUTS[frame] for c in PAIRED)


def _take(run: Run, ids: np.ndarray | None, arr: np.ndarray) -> np.ndarray:
    if ids is None:
        return arr
    pos = run.meta.index.get_indexer(ids)
    return np.where(pos >= 0, arr[np.maximum(pos, 0)], np.nan)


def frame_values(run: Run, frame: str, cell: str, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """p_D, p_J of a cell in a frame, optionally aligned to other scenario ids (NaN where absent)."""
    d, j = FRAME_READOUTS[frame]
    return _take(run, ids, run.col(cell, d, "p_violating")), _take(run, ids, run.col(cell, j, "p_violating"))


def frame_floor(run: Run, frame: str, cell: str, floor: float, ids: np.ndarray | None = None) -> np.ndarray:
    ok = np.ones(run.n, dtype=bool)
    for r in FRAME_READOUTS[frame]:
        ok &= np.nan_to_num(run.col(cell, r, "letter_mass"), nan=-1.0) >= floor
    return _take(run, ids, ok.astype(float)) == 1.0


def frame_summary(run: Run, frame: str, mask: np.ndarray, floor: float, rng, n_boot: int,
                  analysis: str = "raw") -> list[Estimate]:
    """One model in one frame on all its above-floor scenarios (the paper's Table 15 column)."""
    p_d, p_j = frame_values(run, frame, PRIMARY)
    p_dt, p_jt = frame_values(run, frame, TWIN)
    prim = mask & frame_floor(run, frame, PRIMARY, floor) & ~np.isnan(p_d - p_j)
    twin = mask & frame_floor(run, frame, TWIN, floor) & ~np.isnan(p_dt - p_jt)
    both = prim & twin
    out = estimates_from(analysis, "primary above floor", ["p_D", "p_J", "g"],
                         np.column_stack([p_d, p_j, p_d - p_j])[prim], rng, n_boot)
    out += estimates_from(analysis, "twin above floor", ["p_D_twin", "p_J_twin", "g_twin"],
                          np.column_stack([p_dt, p_jt, p_dt - p_jt])[twin], rng, n_boot)
    out += estimates_from(analysis, "primary and twin above floor", ["E", "acting_side", "judging_side"],
                          np.column_stack([(p_d - p_j) - (p_dt - p_jt), p_d - p_dt, p_j - p_jt])[both], rng, n_boot)
    return out


def bridge(chat_run: Run, raw_run: Run, floor: float, rng, n_boot: int, mask: np.ndarray | None = None) -> list[Estimate]:
    """One instruct model under its chat template and in the raw frame, paired on shared scenarios.

    Quantities: g_twin (nothing at stake), g and E in each frame, and raw minus chat for each. The
    paper's bridge finding is a sign reversal of g_twin; a note marks one when both CIs exclude zero
    on opposite sides.
    """
    ids = chat_run.ids if mask is None else chat_run.ids[mask]
    cd, cj = frame_values(chat_run, "chat", PRIMARY, ids)
    cdt, cjt = frame_values(chat_run, "chat", TWIN, ids)
    rd, rj = frame_values(raw_run, "raw", PRIMARY, ids)
    rdt, rjt = frame_values(raw_run, "raw", TWIN, ids)
    ok = (frame_floor(chat_run, "chat", PRIMARY, floor, ids) & frame_floor(chat_run, "chat", TWIN, floor, ids)
          & frame_floor(raw_run, "raw", PRIMARY, floor, ids) & frame_floor(raw_run, "raw", TWIN, floor, ids))
    cols = {
        "g_twin (chat)": cdt - cjt, "g_twin (raw)": rdt - rjt, "g (chat)": cd - cj, "g (raw)": rd - rj,
        "E (chat)": (cd - cj) - (cdt - cjt), "E (raw)": (rd - rj) - (rdt - rjt),
        "g_twin raw - chat": (rdt - rjt) - (cdt - cjt), "g raw - chat": (rd - rj) - (cd - cj),
        "E raw - chat": ((rd - rj) - (rdt - rjt)) - ((cd - cj) - (cdt - cjt)),
    }
    x = np.column_stack(list(cols.values()))
    ok &= ~np.isnan(x).any(axis=1)
    label = "chat and raw above floor" if chat_run is raw_run else f"shared with {raw_run.path.name}"
    out = estimates_from("bridge", label, list(cols), x[ok], rng, n_boot)
    chat_t, raw_t = out[0], out[1]
    if chat_t.low is not None and raw_t.low is not None:
        if (chat_t.low > 0 and raw_t.high < 0) or (chat_t.high < 0 and raw_t.low > 0):
            out[1] = replace(raw_t, note="sign of g_twin reverses between the frames")
    return out


def three_cell(base: Run, instruct: Run, floor: float, rng, n_boot: int, gate: tuple[str, ...]) -> list[Estimate]:
    """Base vs instruct in the raw frame on their shared above-floor scenarios (Tables 6, 16, 17)."""
    ids = instruct.ids
    fam = instruct.meta["family"].astype(str).to_numpy()
    in_gate = np.isin(fam, gate) if np.isin(fam, gate).any() else np.ones(len(ids), dtype=bool)
    bd, bj = frame_values(base, "raw", PRIMARY, ids)
    bdt, bjt = frame_values(base, "raw", TWIN, ids)
    idd, ij = frame_values(instruct, "raw", PRIMARY, ids)
    idt, ijt = frame_values(instruct, "raw", TWIN, ids)
    prim = in_gate & frame_floor(base, "raw", PRIMARY, floor, ids) & frame_floor(instruct, "raw", PRIMARY, floor, ids)
    both = prim & frame_floor(base, "raw", TWIN, floor, ids) & frame_floor(instruct, "raw", TWIN, floor, ids)
    prim &= ~np.isnan(bd - bj + idd - ij)
    both &= ~np.isnan(bd - bj + idd - ij + bdt - bjt + idt - ijt)
    out = estimates_from("three_cell", "shared primary above floor", ["g base - instruct"],
                         ((bd - bj) - (idd - ij))[prim], rng, n_boot)
    e_b, e_i = (bd - bj) - (bdt - bjt), (idd - ij) - (idt - ijt)
    cols = {
        "p_D_twin base": bdt, "p_D base": bd, "p_J_twin base": bjt, "p_J base": bj,
        "p_D_twin instruct": idt, "p_D instruct": idd, "p_J_twin instruct": ijt, "p_J instruct": ij,
        "E base": e_b, "E instruct": e_i, "Delta_E (base - instruct)": e_b - e_i,
        "acting side base": bd - bdt, "acting side instruct": idd - idt,
        "acting side base - instruct": (bd - bdt) - (idd - idt),
        "judging side base": bj - bjt, "judging side instruct": ij - ijt,
        "judging side base - instruct": (bj - bjt) - (ij - ijt),
    }
    out += estimates_from("three_cell", "shared with twins", list(cols), np.column_stack(list(cols.values()))[both],
                          rng, n_boot)
    meta = instruct.meta
    for col in ("prompt_version", "family"):
        values = meta[col].astype(str).to_numpy()
        for v in sorted(set(values[both])):
            m = both & (values == v)
            out += estimates_from("three_cell", f"{col}={v}", ["E base", "E instruct", "Delta_E (base - instruct)"],
                                  np.column_stack([e_b, e_i, e_b - e_i])[m], rng, n_boot)
    return out + _unit_slices(base, instruct, ids, in_gate, floor, both, (e_b, e_i), rng, n_boot)


def _unit_slices(base: Run, instruct: Run, ids, in_gate, floor: float, both, e_primary, rng, n_boot) -> list[Estimate]:
    """Table 17's unit rows: primaries (primary against twin) and harm twins as units of their own (the
    harm twin against the same twin), each paired base vs instruct; none when no harm twin was read raw."""
    if not all(r.has(x, HARM_TWIN) for r in (base, instruct) for x in RAW):
        return []
    names = ["E base", "E instruct", "Delta_E (base - instruct)"]
    e_b, e_i = e_primary
    out = estimates_from("three_cell", "units=primaries", names, np.column_stack([e_b, e_i, e_b - e_i])[both],
                         rng, n_boot)
    g = {}
    for key, run in (("base", base), ("instruct", instruct)):
        hd, hj = frame_values(run, "raw", HARM_TWIN, ids)
        td, tj = frame_values(run, "raw", TWIN, ids)
        g[key] = (hd - hj) - (td - tj)
    ok = in_gate & ~np.isnan(g["base"] + g["instruct"])
    for run in (base, instruct):
        ok &= frame_floor(run, "raw", HARM_TWIN, floor, ids) & frame_floor(run, "raw", TWIN, floor, ids)
    cols = np.column_stack([g["base"], g["instruct"], g["base"] - g["instruct"]])
    return out + estimates_from("three_cell", "units=harm twins", names, cols[ok], rng, n_boot)
