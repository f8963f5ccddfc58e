"""Table 17's unit rows: primaries (primary against twin) and harm twins as units of their own (harm twin
against the same twin), each paired base vs instruct in the raw frame."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stats.gap.raw import three_cell
from stats.gap.tables import Run

N = 40
HARM = np.arange(N) % 2 == 0  # every other scenario is F5 with a harm twin


def _run(shift_h: float, seed: int) -> Run:
    rng = np.random.default_rng(seed)
    ids = pd.Index([f"s{i:02d}" for i in range(N)], name="scenario_id")
    meta = pd.DataFrame({"family": np.where(HARM, "F5", "F1"), "domain": "d", "generator": "g",
                         "prompt_version": "1", "violating": "v"}, index=ids)
    p_jt = rng.uniform(0.2, 0.4, N)
    vals = {"twin": (p_jt + 0.05, p_jt), "primary": (p_jt + 0.15, p_jt),
            "harm_twin": (np.where(HARM, p_jt + 0.05 + shift_h, np.nan), np.where(HARM, p_jt, np.nan))}
    blocks = {}
    for cell, (d, j) in vals.items():
        for readout, frame, p in (("raw_D", "raw_agent", d), ("raw_J", "raw_judge", j)):
            blocks[(cell, readout, frame, None)] = pd.DataFrame(
                {"p_violating": p, "letter_mass": np.where(np.isnan(p), np.nan, 0.9)}, index=ids)
    return Run(path=Path("."), model="m", panel="p", manifest={}, meta=meta, blocks=blocks)


def test_harm_twins_are_units_of_their_own():
    base, instruct = _run(0.02, 1), _run(0.08, 2)
    est = three_cell(base, instruct, 0.5, np.random.default_rng(0), 300, ("F1", "F5"))
    get = {(e.subset, e.quantity): e for e in est}
    prim = get[("units=primaries", "Delta_E (base - instruct)")]
    harm = get[("units=harm twins", "Delta_E (base - instruct)")]
    assert prim.n == N and harm.n == HARM.sum()
    assert prim.value == pytest.approx(0.0)  # primaries: E = 0.10 on both models
    assert get[("units=harm twins", "E base")].value == pytest.approx(0.02)
    assert harm.value == pytest.approx(0.02 - 0.08)
    # Misreading: harm twins as the F5 subset of the primaries reads primary against twin there (Delta 0).
    assert get[("family=F5", "Delta_E (base - instruct)")].value == pytest.approx(0.0)
