"""Steering statistics (stats/steer/compute.py) on planted tables: E per condition, its paired CI against the
unsteered read, the twin's and J0's moves and the random directions' quantile band equal hand computations; E is the
paired excess with J0 subtracted in each cell (a misreading that drops J0, or pairs nothing, gives other numbers).
The verdict's rules: tests/stats/test_steer_rules.py."""

import numpy as np
import pandas as pd

from contract.tables import STEERING
from stats.core.seeding import rng_for
from stats.steer.compute import capability, estimates, random_band, scenario_values

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
                                     letter_mass=1.0, p_violating=p + shift, part="test"))
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


def test_random_band_is_the_random_directions_quantiles():
    """Random direction k moves D primary by 0.01 k at strength 2: the band is the 5th / 50th / 95th percentile of the
    three E's (numpy's linear quantile), not their least and greatest."""
    t = planted()
    rnd = (t.direction == "random") & (t.strength == 2.0) & (t.readout == "D") & (t.cell == "primary")
    t.loc[rnd, "p_violating"] += 0.01 * t.loc[rnd, "direction_seed"].astype(float)
    est = estimates(t, rng_for(0, "t"), 500)
    band = random_band(est)
    e0 = float(est[(est.direction == "none") & (est.quantity == "E")].value.iloc[0])
    b = band[band.quantity == "E"].set_index("strength")
    assert (b.seeds == 3).all() and np.allclose(b.loc[1.0, ["low", "median", "high"]].astype(float), e0)
    want = np.quantile(e0 + 0.01 * np.arange(3), [0.05, 0.5, 0.95])
    assert np.allclose(b.loc[2.0, ["low", "median", "high"]].astype(float), want)
    assert b.loc[2.0, "high"] < e0 + 0.02 and b.loc[2.0, "low"] > e0  # inside min..max


def test_capability_ratio():
    cap = pd.DataFrame([dict(model="m", direction="none", direction_seed=None, layer=None, strength=0.0, positions="read",
                             loss=2.0, tokens=10),
                        dict(model="m", direction="pressure", direction_seed=None, layer=3, strength=1.0, positions="read",
                             loss=3.0, tokens=10)])
    assert capability(cap).ratio.tolist() == [1.0, 1.5]
