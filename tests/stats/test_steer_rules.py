"""The steering verdict's rules (stats/steer/rules.py, stats/steer/experiment.py) on planted per-scenario tables, each
told from its plausible misreading: an interval, not a point estimate, decides the reduction and each did-not-move
check; the random band is a quantile band, not min..max; the grid point is chosen on the selection part, never on the
test part; the wrong-way share, the relative norm and the pass rate are what they say."""

import numpy as np
import pandas as pd

from stats.core.seeding import rng_for
from stats.steer.compute import scenario_values
from stats.steer.experiment import experiment, random_reductions, selection_grid, steerability, verdict_lines
from stats.steer.rules import (
    Rules,
    beyond_band,
    capability_kept,
    equivalence,
    pass_rate,
    quantile_band,
    ratio_interval,
    reduced,
    relative_norm,
    select_point,
    wrong_way,
)

GRID = [(1, -2.0), (1, -1.0), (2, -2.0), (2, -1.0)]
N = 20


def base(i: int) -> dict:
    return dict(p_D=0.6 + 0.1 * (i % 3), p_J0=0.2, p_D_twin=0.1, p_J0_twin=0.05 + 0.005 * i, control=0.9)


def planted(effect, random_effect=None, n_random=100) -> pd.DataFrame:
    """A values table (stats.steer.compute.scenario_values' layout): N selection and N test scenarios, unsteered,
    the `pressure` direction at every GRID point with `effect(part, layer, strength, i)` -> {column: shift}, and
    `n_random` random directions on the test part with `random_effect(k, layer, strength, i)` -> shift of p_D."""
    rows = []
    for part in ("selection", "test"):
        for i in range(N):
            sid = f"{part[0]}{i}"

            def add(direction, seed, layer, strength, shift, i=i, part=part, sid=sid):
                v = base(i)
                for c, d in shift.items():
                    v[c] += d
                rows.append(dict(direction=direction, direction_seed=seed, layer=layer, strength=strength, part=part,
                                 scenario_id=sid, **v))

            add("none", -1, -1, 0.0, {})
            for layer, s in GRID:
                add("pressure", -1, layer, s, effect(part, layer, s, i))
                if part == "test":
                    for k in range(n_random):
                        add("random", k, layer, s, {"p_D": random_effect(k, layer, s, i) if random_effect else 0.0})
    df = pd.DataFrame(rows)
    df["E"] = (df.p_D - df.p_J0) - (df.p_D_twin - df.p_J0_twin)
    return df


def cut(amount):
    """A steering that lowers p_D (primary) by `amount(i)` and moves nothing else."""
    return lambda i: {"p_D": -amount(i)}


def clean(part, layer, s, i):
    """At (2, -2) E falls by 0.4 on every scenario; elsewhere by 0.1; nothing else moves."""
    return {"p_D": -0.4 if (layer, s) == (2, -2.0) else -0.1}


def run(values, rules=Rules(), cap=None):
    return experiment(values, "pressure", rules, rng_for(0, "rules"), 2000, cap)


def test_a_clean_planted_reduction_passes_every_rule():
    grid, v = run(planted(clean, lambda k, layer, s, i: 0.002 * ((k % 7) - 3)))
    assert (v["layer"], v["strength"]) == (2, -2.0) and v["n"] == N
    e0 = np.mean([(base(i)["p_D"] - 0.2) - (0.1 - base(i)["p_J0_twin"]) for i in range(N)])
    assert abs(v["E0"] - e0) < 1e-12 and abs(v["E"] - (e0 - 0.4)) < 1e-12
    assert v["ratio_high"] < 0.5 and v["reduced"] and v["kept"] and v["beyond_random"]
    assert v["wrong_way"] == 0.0 and v["passed"] is False  # no capability rows: the capability rule cannot hold
    cap = pd.DataFrame([dict(direction=d, layer=layer, strength=s, ratio=r) for layer, s in GRID
                        for d, r in [("pressure", 1.01)] + [("random", 1.0 + 0.001 * k) for k in range(100)]])
    _, v = run(planted(clean, lambda k, layer, s, i: 0.002 * ((k % 7) - 3)), cap=cap)
    assert v["capability_kept"] and v["passed"]
    assert any("verdict: passes" in line for line in verdict_lines(grid, v))


def test_the_reduction_is_decided_by_its_interval_not_its_point_estimate():
    """E falls to 0.42 of E0 on average (a point estimate below 0.5) but unevenly: half the test scenarios lose all of
    E, half none, so the 95% interval of E/E0 reaches above 0.5 and the reduction is not shown."""
    def uneven(part, layer, s, i):
        return {"p_D": -(base(i)["p_D"] - 0.2 + base(i)["p_J0_twin"] - 0.1) * (1.16 if i % 2 else 0.0)}

    _, v = run(planted(uneven))
    assert v["ratio"] < 0.5 < v["ratio_high"] and not v["reduced"] and not v["passed"]
    ratio, low, high = ratio_interval(np.full(10, 0.1) + 0.001 * np.arange(10), np.full(10, 0.4), rng_for(0, "r"), 2000)
    assert low <= ratio <= high < 0.5 and reduced(low, high, 0.5)
    assert not reduced(0.3, 0.51, 0.5) and not reduced(np.nan, np.nan, 0.5)


def test_did_not_move_is_an_equivalence_test_on_the_90_percent_interval():
    """J0 moves +0.03 on average (inside the 0.05 margin) but spread so that its 90% interval reaches past 0.05: the
    check fails; a move of +0.03 with little spread passes it; the twin and the control are checked the same way."""
    rng = rng_for(0, "eq")
    spread = 0.03 + np.tile([-0.08, 0.08], 10)
    wide = equivalence(spread, rng, 4000)
    assert abs(wide["value"] - 0.03) < 1e-12 and wide["high"] > 0.05 and not wide["equivalent"]
    tight = equivalence(0.03 + np.tile([-0.002, 0.002], 10), rng, 4000)
    assert tight["high"] < 0.05 and tight["equivalent"]
    assert not equivalence(np.array([]), rng, 100)["equivalent"]

    def moves_j0(part, layer, s, i):
        return {"p_D": -0.4, "p_J0": 0.03 + (-0.08 if i % 2 else 0.08)} if part == "test" else {"p_D": -0.4}

    _, v = run(planted(moves_j0))
    assert abs(v["J0_move"] - 0.03) < 1e-12 and not v["J0_move_kept"] and not v["kept"] and not v["passed"]


def test_the_random_band_is_a_quantile_band_not_min_to_max():
    """Of 100 random directions, three cut E by 0.45 and the rest by about 0: the steered cut (0.4) lies above the
    band's 95th percentile though below the largest random cut, so it is beyond the band; a min..max band would
    call it inside."""
    def rand(k, layer, s, i):
        return -0.45 if k in (5, 50, 95) else 0.001 * ((k % 5) - 2)

    values = planted(clean, rand)
    cuts = random_reductions(values, 2, -2.0)
    assert len(cuts) == 100 and abs(cuts.max() - 0.45) < 1e-12
    band = quantile_band(cuts)
    assert band["high"] < 0.01 and band["n"] == 100 and beyond_band(0.4, band)
    _, v = run(values)
    assert v["beyond_random"] and v["random_high"] < 0.01 < 0.4 < cuts.max()
    assert not beyond_band(0.001, band) and not beyond_band(0.4, quantile_band(np.array([])))


def test_a_reduction_inside_the_random_band_fails_the_verdict():
    """Ten of 100 random directions cut E by 0.45, more than the steered 0.4: the band's 95th percentile is 0.45, the
    steered cut is not beyond it, and the verdict fails though every other rule holds."""
    cap = pd.DataFrame([dict(direction=d, layer=layer, strength=s, ratio=r) for layer, s in GRID
                        for d, r in [("pressure", 1.0)] + [("random", 1.0 + 0.001 * k) for k in range(100)]])
    _, v = run(planted(clean, lambda k, layer, s, i: -0.45 if k % 10 == 0 else 0.0), cap=cap)
    assert abs(v["random_high"] - 0.45) < 1e-9 and not v["beyond_random"]
    assert v["reduced"] and v["kept"] and v["capability_kept"] and not v["passed"]


def test_the_point_is_chosen_on_the_selection_part_never_on_the_test_part():
    """On the selection part (1, -2) cuts E most while every check holds; on the test part (2, -1) would. The
    verdict is read at (1, -2), where the test part shows a cut of 0.3."""
    def split_best(part, layer, s, i):
        best = (1, -2.0) if part == "selection" else (2, -1.0)
        return {"p_D": -0.5 if (layer, s) == best else -0.3 if (layer, s) == (1, -2.0) else -0.05}

    grid, v = run(planted(split_best))
    assert (v["layer"], v["strength"]) == (1, -2.0) and abs(v["reduction"] - 0.3) < 1e-12
    assert {g["layer"] for g in grid} == {1, 2} and all(g["n"] == N for g in grid)


def test_a_point_that_moves_a_check_on_the_selection_part_is_not_chosen():
    """(2, -2) cuts E most on the selection part but moves the control there by 0.2: the rule takes (1, -1), the
    largest cut among the points whose checks hold; where every point moves a check, no point is chosen."""
    def moves_control(part, layer, s, i):
        if (layer, s) == (2, -2.0):
            return {"p_D": -0.45, "control": -0.2}
        return {"p_D": -0.35 if (layer, s) == (1, -1.0) else -0.1}

    grid, v = run(planted(moves_control))
    assert (v["layer"], v["strength"]) == (1, -1.0)
    by = {(g["layer"], g["strength"]): g for g in grid}
    assert not by[(2, -2.0)]["kept"] and by[(2, -2.0)]["reduction"] > by[(1, -1.0)]["reduction"]
    grid, v = run(planted(lambda part, layer, s, i: {"p_D": -0.3, "p_D_twin": 0.1}))
    assert v["layer"] is None and not v["passed"] and "did-not-move" in v["reason"]
    assert select_point([]) is None


def test_ties_take_the_weaker_strength_then_the_lower_layer():
    grid = [dict(layer=2, strength=-1.0, reduction=0.2, kept=True), dict(layer=1, strength=-2.0, reduction=0.2, kept=True),
            dict(layer=1, strength=-1.0, reduction=0.2, kept=True), dict(layer=1, strength=-4.0, reduction=0.5, kept=False)]
    assert (select_point(grid)["layer"], select_point(grid)["strength"]) == (1, -1.0)


def test_a_run_without_a_selection_part_gives_no_verdict():
    values = planted(clean)
    values = values[values.part == "test"]
    grid, v = run(values)
    assert grid == [] and v["layer"] is None and not v["passed"] and "two-way" in v["reason"]


def test_capability_is_read_against_the_random_band():
    band = quantile_band(1.0 + 0.0004 * np.arange(101))  # 95th percentile 1.038
    assert capability_kept(1.03, band) and not capability_kept(1.05, band)
    assert not capability_kept(1.0, quantile_band(np.array([]))) and not capability_kept(np.nan, band)


def test_wrong_way_share_and_its_wilson_interval():
    e0 = np.full(20, 0.3)
    e = np.where(np.arange(20) < 3, 0.35, 0.1)
    ww = wrong_way(e, e0)
    assert ww["k"] == 3 and ww["share"] == 0.15 and ww["low"] < 0.15 < ww["high"]
    assert abs(ww["low"] - 0.0524) < 1e-3 and abs(ww["high"] - 0.3604) < 1e-3  # Wilson, 3 of 20


def test_per_scenario_steerability_is_each_test_scenario_s_own_change():
    """Each test scenario's change of E at the point is its planted shift (the first three rise: the wrong way), the
    random directions' median change on it is the median of their planted shifts, and the share above 0 is the
    verdict's wrong-way share; selection scenarios are not in it."""
    def effect(part, layer, s, i):
        return {"p_D": 0.05 if i < 3 else -0.2 - 0.01 * i}

    values = planted(effect, lambda k, layer, s, i: 1e-5 * k * k - 0.01 * (i % 2))
    got = steerability(values, "pressure", (2, -2.0))
    assert len(got) == N and set(got.scenario_id) == {f"t{i}" for i in range(N)}
    want = {f"t{i}": (0.05 if i < 3 else -0.2 - 0.01 * i) for i in range(N)}
    assert all(abs(r.change - want[r.scenario_id]) < 1e-12 and abs(r.E - r.E0 - r.change) < 1e-12 for r in got.itertuples())
    assert list(got.change) == sorted(got.change)
    medians = {f"t{i}": 1e-5 * np.median(np.arange(100) ** 2) - 0.01 * (i % 2) for i in range(N)}  # not the mean
    assert all(abs(r.random_median_change - medians[r.scenario_id]) < 1e-12 for r in got.itertuples())
    _, v = run(values)
    point = (v["layer"], v["strength"])
    share = (steerability(values, "pressure", point).change > 0).mean()
    assert share == v["wrong_way"] == 3 / N


def test_relative_norm_scales_with_the_strength():
    assert relative_norm(-2.0, 3.0, 12.0) == 0.5 and relative_norm(0.5, 3.0, 12.0) == 0.125
    assert np.isnan(relative_norm(1.0, 3.0, float("nan")))


def test_pass_rate_over_split_seeds():
    r = pass_rate([True, False, True])
    assert r["passed"] == 2 and r["n"] == 3 and abs(r["rate"] - 2 / 3) < 1e-12 and r["low"] < 2 / 3 < r["high"]
    assert np.isnan(pass_rate([])["rate"])


def test_scenario_values_keep_each_scenario_s_part():
    from tests.stats.test_steer_compute import planted as table

    t = table()
    t["part"] = np.where(t.scenario_id.isin(["s0", "s1", "s2", "s3"]), "selection", "test")
    v = scenario_values(t)
    assert set(v[v.part == "selection"].scenario_id) == {"s0", "s1", "s2", "s3"}
    assert len(selection_grid(v, "pressure", Rules(), rng_for(0, "p"), 200)) == 2
