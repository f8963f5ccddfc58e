"""The depth departure rule's minimum effect size and readability mask (stats/depth/compute.py) on planted per-layer
tables: an effect of a thousandth with a narrow CI that excludes 0 is no departure (its CI is not outside +-0.02);
a layer where the lens puts almost no mass on the letters is unreadable, skipped by the rule and named as such in
the tables, the summary and the figure; an unreadable layer neither departs nor interrupts a departure."""

import numpy as np
import pandas as pd

from stats.core.seeding import rng_for
from stats.depth.compute import (
    DepartureRule,
    departure,
    departure_bound,
    depth_estimates,
    first_departure,
    paired_columns,
    readability,
)
from stats.depth.report import run_depth_report
from tests.helpers import LAYERS, planted_depth


def rule_departure(df, rule=DepartureRule(), readable=None):
    est = depth_estimates(df, rng_for(0, "layers"), 2000)
    layers, _, values = paired_columns(df)
    if readable is None:
        read = readability(df, rule).set_index("layer")
        readable = read.readable.reindex(layers).to_numpy(bool)
    return est, departure(values[:, 3, :], layers, est, rng_for(0, "dep"), n_outer=100, n_inner=200, rule=rule,
                          readable=readable)


def test_a_tiny_effect_is_no_departure():
    """E +0.001 from layer 5 with little noise: every per-layer CI from 5 on excludes 0 (the rule without a minimum
    size would depart at 5), but none lies outside +-0.02, so there is no departure; an effect of 0.25 departs at 5."""
    df = planted_depth(n=40, start=5, effect=0.001, noise=0.0002, seed=2)
    est, dep = rule_departure(df)
    e = est[est.quantity == "E"].sort_values("layer")
    assert (e[e.layer >= 5].low > 0).all() and (e[e.layer >= 5].high < 0.002).all()
    assert first_departure(e.low.to_numpy(), e.high.to_numpy()) == 5  # the misreading: outside 0
    assert dep.bound == 0.02 and dep.layer is None and dep.p_none == 1.0
    _, big = rule_departure(planted_depth(n=40, start=5, effect=0.25, seed=1))
    assert big.layer == 5


def test_the_bound_can_be_a_share_of_the_final_excess():
    est = depth_estimates(planted_depth(n=20, start=5, effect=0.3, seed=1), rng_for(0, "layers"), 500)
    assert departure_bound(est, DepartureRule(delta=0.02, final_share=0.5)) > 0.14
    assert departure_bound(est, DepartureRule(delta=0.02)) == 0.02
    assert first_departure(np.array([0.01, 0.2]), np.array([0.03, 0.3]), 0.02) == 1


def test_an_unreadable_layer_is_masked():
    """The excess starts at layer 3, but the lens puts 0.001 on the letters at layers 0-3 (unreadable) and at layer 6:
    the departure is layer 4, the first readable one of the run, and layer 6 (E there as elsewhere) neither departs
    nor breaks it; without the mask the run would depart at 3."""
    df = planted_depth(n=30, start=3, effect=0.25, seed=1)
    dark = df.layer.isin([0, 1, 2, 3, 6])
    df.loc[dark, "letter_mass"] = 0.001
    read = readability(df, DepartureRule()).set_index("layer")
    assert list(read.index[~read.readable]) == [0, 1, 2, 3, 6]
    _, dep = rule_departure(df)
    assert dep.layer == 4 and dep.unreadable == (0, 1, 2, 3, 6)
    _, unmasked = rule_departure(df, readable=np.ones(LAYERS + 1, bool))
    assert unmasked.layer == 3


def test_an_unreadable_layer_does_not_interrupt_a_departure():
    """Layer 6's E is 0 (its planted effect removed) and the lens cannot read it: the departure from 3 stands; read as
    a readable layer, it would move the departure to 7."""
    df = planted_depth(n=30, start=3, effect=0.25, seed=1)
    six = (df.layer == 6) & (df.readout == "D") & (df.cell == "primary")
    df.loc[six, "p_violating"] -= 0.25
    df.loc[df.layer == 6, "letter_mass"] = 0.001
    _, dep = rule_departure(df)
    assert dep.layer == 3
    _, unmasked = rule_departure(df, readable=np.ones(LAYERS + 1, bool))
    assert unmasked.layer == 7


def test_the_last_layer_is_always_readable_and_kl_can_mask_too():
    df = planted_depth(n=10, start=3, effect=0.25, seed=1)
    df["letter_mass"] = 0.001
    read = readability(df, DepartureRule()).set_index("layer")
    assert list(read.index[read.readable]) == [LAYERS]
    df["letter_mass"] = 1.0
    df["kl_final"] = np.where(df.layer < 4, 12.0, 0.5)
    read = readability(df, DepartureRule(max_kl=2.0)).set_index("layer")
    assert list(read.index[~read.readable]) == [0, 1, 2, 3]


def test_unreadable_layers_are_shown_in_the_tables_and_summary(tmp_path):
    df = planted_depth(n=12, start=3, effect=0.25, seed=1)
    df.loc[df.layer.isin([0, 1, 2]), "letter_mass"] = 0.001
    run = tmp_path / "run"
    run.mkdir()
    df.to_parquet(run / "depth.parquet")
    lines = run_depth_report(run, n_boot=300)
    layers = pd.read_csv(run / "stats" / "depth_layers.csv")
    e = layers[layers.quantity == "E"].set_index("layer")
    assert list(e.index[~e.readable]) == [0, 1, 2] and (e.loc[[0, 1, 2], "letter_mass"] < 0.01).all()
    assert any("unreadable (skipped): 0-2" in line for line in lines), lines
    assert "unreadable" in (run / "stats" / "depth_departure.md").read_text()
