"""stats/depth on planted depth and patching tables, against a numpy recomputation written here: E by layer is
the paired excess (not the unpaired difference), the departure layer is where the planted excess starts, a
planted null has none, and closure is a ratio of means (not a mean of ratios)."""

import numpy as np
import pandas as pd
import pytest

from contract.tables import DEPTH, PATCHING
from stats.core.bootstrap import scenario_bootstrap, simultaneous_band
from stats.core.seeding import rng_for
from stats.depth.compute import band_excludes_zero, band_unbounded, closure_estimates, departure, depth_estimates, first_departure, paired_columns
from stats.depth.report import run_depth_report, uneven_sources
from tests.helpers import LAYERS, hand_excess, planted_depth


def test_excess_by_layer_is_the_paired_excess():
    df = planted_depth(n=12, drop_twin=(0, 1, 2), effect=0.3)
    est = depth_estimates(df, rng_for(0, "t"), 500)
    e = est[est.quantity == "E"].set_index("layer")
    want = hand_excess(df)
    for layer, value in want.items():
        assert e.loc[layer, "value"] == pytest.approx(value, abs=1e-12)
    assert (e.n == 9).all()
    # The misreading (mean g over every primary minus mean g over every twin, unpaired) differs here.
    d = df[df.layer == LAYERS]
    per = d.groupby(["scenario_id", "cell", "readout"]).p_violating.mean().unstack("readout")
    g = (per.D - per.J0).unstack("cell")
    unpaired = g.primary.mean() - g.twin.dropna().mean()
    assert abs(unpaired - e.loc[LAYERS, "value"]) > 1e-3


def test_departure_layer_recovers_the_planted_start():
    # Each null layer's 95% CI covers 0 with probability 0.95, all five with about 0.77: a seed where they do (a
    # null layer excluding 0 next to the effect would move the departure, as the definition says it should).
    df = planted_depth(n=40, start=5, effect=0.25, seed=1)
    est = depth_estimates(df, rng_for(0, "layers"), 2000)
    e = est[est.quantity == "E"].sort_values("layer")
    assert (e[e.layer < 5].low < 0).all() and (e[e.layer < 5].high > 0).all()  # CI covers 0 below the start
    assert (e[e.layer >= 5].low > 0.2).all()
    layers, _, values = paired_columns(df)
    dep = departure(values[:, 3, :], layers, est, rng_for(0, "dep"), n_outer=200, n_inner=200)
    assert dep.layer == 5
    assert dep.low <= 5 <= dep.high and dep.p_none == 0


def test_planted_null_has_no_departure():
    df = planted_depth(n=30, effect=0.0)
    est = depth_estimates(df, rng_for(1, "layers"), 2000)
    layers, _, values = paired_columns(df)
    dep = departure(values[:, 3, :], layers, est, rng_for(1, "dep"), n_outer=100, n_inner=200)
    assert dep.layer is None and dep.p_none > 0.5


def test_no_layer_of_a_planted_null_leaves_the_simultaneous_band():
    # Ten scenarios, nine layers, E 0 at every one: on seed 3 the per-layer CIs exclude 0 at layers 0 and 1 (one 95%
    # CI among nine misses often), so "E is 0 at every layer" read from them fails; the band covers 0 everywhere.
    est = depth_estimates(planted_depth(n=10, effect=0.0, seed=3), rng_for(0, "layers"), 2000)
    e = est[est.quantity == "E"].sort_values("layer")
    assert [int(x) for x in e.layer[(e.low > 0) | (e.high < 0)]] == [0, 1]
    assert band_excludes_zero(est) == []
    assert (e.band_low <= e.low).all() and (e.band_high >= e.high).all()
    # A planted effect still leaves it, at exactly the planted layers, of either sign.
    for effect in (0.25, -0.08):
        planted = planted_depth(n=10, effect=effect, start=5, seed=1)
        assert band_excludes_zero(depth_estimates(planted, rng_for(0, "layers"), 2000)) == [5, 6, 7, 8], effect


def test_a_layer_whose_band_is_unbounded_is_named_not_counted_as_zero(tmp_path):
    # At layer 2 eight of ten scenarios read exactly alike in every cell (E 0) and two have a primary D raised by
    # 0.05: the band there is infinite. It covers 0, but the report says it is unbounded rather than "covers 0".
    df = planted_depth(n=10, effect=0.0, seed=3, noise=0.02)
    at = df.layer == 2
    df.loc[at, "p_violating"] = 0.2
    df.loc[at & df.scenario_id.isin(["s00", "s01"]) & (df.readout == "D") & (df.cell == "primary"), "p_violating"] = 0.25
    est = depth_estimates(df, rng_for(0, "layers"), 2000)
    assert band_unbounded(est) == [2] and 2 not in band_excludes_zero(est)
    run = tmp_path / "run"
    run.mkdir()
    df.to_parquet(run / DEPTH.file)
    lines = run_depth_report(run, seed=0, n_boot=500)
    assert any("unbounded at layer 2 " in line for line in lines), lines


def test_the_band_is_each_quantitys_own_over_the_layers():
    df = planted_depth(n=12, effect=0.2, seed=4)
    layers, _, values = paired_columns(df)
    rng = rng_for(0, "t")
    est = depth_estimates(df, rng, 500)
    rng = rng_for(0, "t")
    scenario_bootstrap(values.reshape(len(values), -1), rng, 500)  # the per-layer CIs' draws come first
    for qi, name in enumerate(("p_D", "p_J0", "g", "E")):
        _, low, high, _ = simultaneous_band(values[:, qi, :], rng, 500)
        q = est[est.quantity == name].sort_values("layer")
        assert q.band_low.to_numpy() == pytest.approx(low) and q.band_high.to_numpy() == pytest.approx(high)


def test_first_departure_needs_every_later_layer():
    lo, hi = np.array([-1, 1, -1, 1, 1.0]), np.array([1, 2, 1, 2, 2.0])
    assert first_departure(lo, hi) == 3  # layer 1 excludes 0 but layer 2 does not
    assert first_departure(np.array([-1, 1, -1.0]), np.array([1, 2, 1.0])) is None
    assert first_departure(np.array([-2, -2.0]), np.array([-1, -1.0])) == 0  # negative excess departs too


def planted_patching(gaps, closes, layers=(0, 4, 8), start=4):
    """Per scenario, agent mass 0.2 + gap, judge read 0.2; the judge patch closes `closes[s]` of the gap (in mass)
    from layer `start`, the foreign patch nothing."""
    rows = []
    for s, (gap, close) in enumerate(zip(gaps, closes)):
        for source in ("judge", "twin_agent", "foreign_judge"):
            for layer in layers:
                shut = close if (source == "judge" and layer >= start) else 0.0
                rows.append(dict(model="m", scenario_id=f"s{s}", family="F1", cell="primary", order_index=0, order="a,b",
                                 letters="AB", violating_letter="A", layer=layer, n_layers=layers[-1], source=source,
                                 source_scenario_id=f"s{s}", mass=[0.0, 0.0], letter_mass=1.0,
                                 p_violating=0.2 + gap - shut, p_agent=0.2 + gap, p_source=0.2))
    return PATCHING.frame(rows)


def test_closure_is_a_ratio_of_means():
    gaps, closes = [0.5, 0.01], [0.5, 0.02]
    c = closure_estimates(planted_patching(gaps, closes), rng_for(0, "c"), 200).set_index(["source", "layer"])
    want = sum(closes) / sum(gaps)  # 1.0196...; the mean of ratios would be 1.5
    assert c.loc[("judge", 8), "closure"] == pytest.approx(want, abs=1e-12)
    assert abs(c.loc[("judge", 8), "closure"] - np.mean(np.array(closes) / np.array(gaps))) > 0.4
    assert c.loc[("judge", 0), "closure"] == pytest.approx(0.0, abs=1e-12)
    assert c.loc[("foreign_judge", 8), "closure"] == pytest.approx(0.0, abs=1e-12)


def test_foreign_controls_on_different_scenarios_are_warned():
    """A run resumed across the change that added `foreign_agent` has its rows in newer chunks only: said in a line."""
    old = planted_patching([0.5, 0.4, 0.3], [0.5, 0.4, 0.3])
    newer = old[(old.source == "foreign_judge") & (old.scenario_id == "s2")].assign(source="foreign_agent")
    rng = rng_for(0, "c")
    [line] = uneven_sources(closure_estimates(pd.concat([old, newer]), rng, 50))
    assert "foreign_agent rests on 1 scenarios and foreign_judge on 3" in line
    assert uneven_sources(closure_estimates(old, rng, 50))  # none at all: warned too
    every = [old.assign(source="foreign_agent")[old.source == "foreign_judge"], old]
    assert uneven_sources(closure_estimates(pd.concat(every), rng, 50)) == []


def test_closure_ci_covers_the_planted_share():
    rng = np.random.default_rng(4)
    gaps = rng.uniform(0.2, 0.6, 40)
    closes = gaps * (0.6 + rng.normal(0, 0.05, 40))
    c = closure_estimates(planted_patching(gaps, closes), rng_for(0, "c"), 2000)
    row = c[(c.source == "judge") & (c.layer == 8)].iloc[0]
    assert row.low < 0.6 < row.high and row.high - row.low < 0.1


def test_readout_stats_writes_depth_tables_and_figures(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    planted_depth(n=15, seed=1, effect=0.4).to_parquet(run / DEPTH.file)
    planted_patching([0.3] * 15, [0.2] * 15).to_parquet(run / PATCHING.file)
    lines = run_depth_report(run, seed=0, n_boot=300)
    out = run / "stats"
    for name in ("depth_layers.csv", "depth_departure.md", "depth_closure.csv", "depth_excess.png", "depth_closure.png"):
        assert (out / name).is_file(), name
    assert any("departure layer 5" in line for line in lines)
    assert any("simultaneous band over the layers excludes 0 at layers 5, 6, 7, 8" in line for line in lines), lines
    # The planted patching table predates foreign_agent (no such rows): the report says so.
    assert "foreign_agent rests on 0 scenarios and foreign_judge on 15" in (out / "depth_departure.md").read_text()
    layers = pd.read_csv(out / "depth_layers.csv")
    assert set(layers.quantity) == {"p_D", "p_J0", "g", "E"}


def test_compare_overlays_each_runs_curves(tmp_path):
    from stats.depth.compare import depth_compare

    for name, start in (("sft", 6), ("final", 3)):
        run = tmp_path / name
        run.mkdir()
        planted_depth(n=12, start=start, effect=0.4, seed=1).to_parquet(run / DEPTH.file)
        planted_patching([0.3] * 12, [0.2] * 12).to_parquet(run / PATCHING.file)
    out = tmp_path / "cmp"
    lines = depth_compare([tmp_path / "sft", tmp_path / "final"], out, {str(tmp_path / "final"): "m:final"}, n_boot=200)
    assert lines and (out / "depth_compare.png").is_file()
    curves = pd.read_csv(out / "depth_compare.csv")
    assert set(curves.run) == {"sft", "m:final"} and set(curves.curve) == {"E", "closure"}
    e = curves[curves.curve == "E"].pivot(index="layer", columns="run", values="value")
    want = {run: hand_excess(planted_depth(n=12, start=s, effect=0.4, seed=1)) for run, s in (("sft", 6), ("m:final", 3))}
    for run, values in want.items():
        assert np.allclose(e[run].to_numpy(), [values[k] for k in sorted(values)], atol=1e-12)
