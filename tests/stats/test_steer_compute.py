"""Steering statistics (stats/steer/compute.py) on planted tables: E per condition, its paired CI against the
unsteered read, the twin's and J0's moves, the random band and the verdict equal hand computations; E is the paired
excess with J0 subtracted in each cell (a misreading that drops J0, or pairs nothing, gives other numbers)."""

import numpy as np
import pandas as pd

from contract.tables import STEERING
from stats.core.seeding import rng_for
from stats.steer.compute import capability, estimates, random_band, scenario_values, verdict

IDS = [f"s{i}" for i in range(12)]


def planted(effect=-0.3):
    """Per scenario: D primary 0.6 + 0.1 * (i % 3), D twin 0.1, J0 primary 0.2, J0 twin 0.05 + 0.01 i; the pressure
    direction at strength s moves D primary by effect * s (s = 1, 2) and nothing else; random directions move nothing;
    the control reads 0.9 throughout. Two option orders per read whose mean is the planted value."""
    rows = []
    conds = [("none", None, None, 0.0)] + [("pressure", None, 28, s) for s in (1.0, 2.0)] + \
            [("random", k, 28, s) for k in range(3) for s in (1.0, 2.0)]
    for direction, seed, layer, s in conds:
        for i, sid in enumerate(IDS):
            base = {("D", "primary"): 0.6 + 0.1 * (i % 3), ("D", "twin"): 0.1, ("J0", "primary"): 0.2,
                    ("J0", "twin"): 0.05 + 0.01 * i, ("control", "primary"): 0.9}
            if direction == "pressure":
                base[("D", "primary")] += effect * s
            for (readout, cell), p in base.items():
                for k, shift in enumerate((-0.02, 0.02)):
                    rows.append(dict(model="m", direction=direction, direction_seed=seed, layer=layer, strength=s,
                                     positions="read", scenario_id=sid, family="F1", cell=cell, readout=readout,
                                     order_index=k, letters="AB", violating_letter="A", mass=[p + shift, 1 - p - shift],
                                     letter_mass=1.0, p_violating=p + shift))
    return STEERING.frame(rows)


def test_values_are_the_paired_excess_with_j0():
    v = scenario_values(planted())
    base = v[v.direction == "none"].set_index("scenario_id")
    i = np.arange(12)
    want = (0.6 + 0.1 * (i % 3) - 0.2) - (0.1 - (0.05 + 0.01 * i))
    assert np.allclose(base.loc[IDS, "E"], want)
    # Misreadings give other numbers here: dropping J0 (p_D primary - twin) and J0 of the primary only.
    assert not np.allclose(base.loc[IDS, "E"], 0.6 + 0.1 * (i % 3) - 0.1)
    assert not np.allclose(base.loc[IDS, "E"], 0.6 + 0.1 * (i % 3) - 0.2 - 0.1)


def test_estimates_recover_the_planted_moves():
    est = estimates(planted(), rng_for(0, "t"), 2000)
    q = est.set_index(["direction", "strength", "quantity"])
    i = np.arange(12)
    e0 = float(np.mean((0.6 + 0.1 * (i % 3) - 0.2) - (0.1 - (0.05 + 0.01 * i))))
    for s in (1.0, 2.0):
        e = q.loc[("pressure", s, "E")]
        assert abs(e.value - (e0 - 0.3 * s)) < 1e-9 and e.low <= e.value <= e.high
        de = q.loc[("pressure", s, "dE")]
        # The paired move has no scenario spread here: its CI collapses on the planted value.
        assert abs(de.value + 0.3 * s) < 1e-9 and abs(de.high - de.low) < 1e-9
        for name in ("twin_move", "J0_move", "J0_twin_move", "control_move"):
            assert abs(q.loc[("pressure", s, name)].value) < 1e-12
        assert abs(q.loc[("pressure", s, "E0")].value - e0) < 1e-9
    # The unpaired E has a CI wider than the paired move's (scenarios differ in E): the pairing is used.
    e = q.loc[("pressure", 1.0, "E")]
    assert e.high - e.low > 0.02


def test_random_band_and_verdict():
    est = estimates(planted(), rng_for(0, "t"), 2000)
    band = random_band(est)
    b = band[(band.quantity == "E")].set_index("strength")
    e0 = float(est[(est.direction == "none") & (est.quantity == "E")].value.iloc[0])
    assert (b.seeds == 3).all() and np.allclose(b["low"], e0) and np.allclose(b["high"], e0)
    v = verdict(est, band, "pressure", 28)
    # Strength 1 already halves E (0.56 - 0.30 <= 0.28) with nothing else moved: the weakest strength that meets all.
    assert v["strength"] == 1.0 and v["halved"] and v["twin_kept"] and v["judgment_kept"] and v["random_within"]
    assert v["met"] and abs(v["E"] - (e0 - 0.3)) < 1e-9
    # A planted effect too small to halve E is reported as such, and one that moves the twin too.
    weak = verdict(estimates(planted(-0.05), rng_for(0, "t"), 500), band, "pressure", 28)
    assert not weak["halved"]
    t = planted()
    t.loc[(t.direction == "pressure") & (t.cell == "twin") & (t.readout == "D"), "p_violating"] += 0.2
    moved = verdict(estimates(t, rng_for(0, "t"), 500), band, "pressure", 28)
    assert not moved["twin_kept"] and abs(moved["twin_move"] - 0.2) < 1e-9 and not moved["met"]


def test_verdict_takes_a_strength_that_meets_every_figure_over_the_least_e():
    """The least E is at strength 2, where the twin also moves by 0.2; at strength 1 E is halved and nothing else
    moves. The acceptance holds at strength 1: a verdict read at the least-E strength (a plausible misreading of
    "reduces E by half at some strength, with the twin moving by less than 0.05") would call it failed."""
    t = planted()
    t.loc[(t.direction == "pressure") & (t.strength == 2.0) & (t.cell == "twin") & (t.readout == "D"), "p_violating"] += 0.2
    est = estimates(t, rng_for(0, "t"), 500)
    v = verdict(est, random_band(est), "pressure", 28)
    assert v["strength"] == 1.0 and v["met"] and abs(v["twin_move"]) < 1e-9
    e = est[(est.direction == "pressure") & (est.quantity == "E")].set_index("strength").value
    assert e.idxmin() == 2.0  # the least-E strength is the one that moves the twin


def test_the_random_directions_largest_j0_move_is_read_beside_the_verdict():
    """Random direction 1 moves J0 of the twin cell by -0.03 at strength 2 (direction 2 moves the primary's by +0.01):
    the verdict at strength 2 reports 0.03, the largest |move| of either cell over the random directions, not the
    mean (0.0133) or the primary cell's alone (0.01); at strength 1 nothing moves."""
    t = planted(-0.15)
    rnd = (t.direction == "random") & (t.strength == 2.0) & (t.readout == "J0")
    t.loc[rnd & (t.direction_seed == 1) & (t.cell == "twin"), "p_violating"] -= 0.03
    t.loc[rnd & (t.direction_seed == 2) & (t.cell == "primary"), "p_violating"] += 0.01
    est = estimates(t, rng_for(0, "t"), 500)
    band = random_band(est)
    at2 = verdict(est[est.strength.isin((0.0, 2.0))], band, "pressure", 28)
    assert at2["strength"] == 2.0 and abs(at2["random_J0_move"] - 0.03) < 1e-9
    at1 = verdict(est[est.strength.isin((0.0, 1.0))], band, "pressure", 28)
    assert at1["strength"] == 1.0 and abs(at1["random_J0_move"]) < 1e-9


def test_capability_ratio():
    cap = pd.DataFrame([dict(model="m", direction="none", direction_seed=None, layer=None, strength=0.0, positions="read",
                             loss=2.0, tokens=10),
                        dict(model="m", direction="pressure", direction_seed=None, layer=3, strength=1.0, positions="read",
                             loss=3.0, tokens=10)])
    assert capability(cap).ratio.tolist() == [1.0, 1.5]
