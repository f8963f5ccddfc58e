"""stats/depth with two lenses on a planted depth table: the tuned lens's E by layer is computed from its own rows
(a misreading that pools both lenses' rows gives another number), each lens gets its own departure layer, and the
KL table equals a hand mean of kl_final; an older table without kl_final still reads."""

import numpy as np
import pandas as pd
import pytest

from contract.tables import DEPTH
from stats.core.seeding import rng_for
from stats.depth.compute import depth_estimates, lens_kl
from stats.depth.report import run_depth_report
from tests.helpers import LAYERS, hand_excess, planted_depth


def two_lenses(n=40, seed=0):
    """The logit lens departs at layer 6, the tuned lens at layer 3 (its rows planted separately); kl_final planted
    as a function of lens and layer, 0 at the last."""
    logit = planted_depth(n=n, start=6, effect=0.3, seed=seed)
    tuned = planted_depth(n=n, start=3, effect=0.3, seed=seed + 1).assign(lens="tuned")
    df = pd.concat([logit, tuned], ignore_index=True)
    rng = np.random.default_rng(seed)
    scale = np.where(df.lens == "logit", 5.0, 1.0)
    df["kl_final"] = np.where(df.layer == LAYERS, 0.0, scale * (LAYERS - df.layer) * rng.uniform(0.5, 1.5, len(df)))
    return DEPTH.frame(df.to_dict("records"))


def test_each_lens_has_its_own_excess():
    df = two_lenses()
    for lens, start in (("logit", 6), ("tuned", 3)):
        est = depth_estimates(df, rng_for(0, "t"), 300, lens)
        e = est[est.quantity == "E"].set_index("layer")
        want = hand_excess(df[df.lens == lens])
        for layer, value in want.items():
            assert e.loc[layer, "value"] == pytest.approx(value, abs=1e-12), (lens, layer)
        assert e.loc[start, "value"] > 0.25 and abs(e.loc[start - 1, "value"]) < 0.05
    pooled = hand_excess(df)  # both lenses' rows averaged: the misreading
    tuned = depth_estimates(df, rng_for(0, "t"), 300, "tuned")
    assert abs(pooled[4] - tuned[(tuned.quantity == "E") & (tuned.layer == 4)].value.iloc[0]) > 0.1


def test_the_report_gives_each_lens_its_departure_and_the_kl_table(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    df = two_lenses()
    df.to_parquet(run / DEPTH.file)
    lines = run_depth_report(run, n_boot=400)
    assert any(line.startswith("depth: departure layer 6") for line in lines), lines
    assert any(line.startswith("depth (tuned lens): departure layer 3") for line in lines), lines
    kl = pd.read_csv(run / "stats" / "depth_lens_kl.csv")
    for row in kl.itertuples():
        sel = df[(df.lens == row.lens) & (df.layer == row.layer)].kl_final
        assert row.mean == pytest.approx(sel.mean(), rel=1e-12) and row.n == len(sel)
        assert row.p90 == pytest.approx(np.quantile(sel, 0.9), rel=1e-12)
    assert list(kl.lens.unique()) == ["logit", "tuned"]
    layers = pd.read_csv(run / "stats" / "depth_layers.csv")
    assert set(layers.lens) == {"logit", "tuned"}


def test_a_depth_table_from_before_kl_final_still_reads(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    planted_depth(n=10).drop(columns=["kl_final"]).to_parquet(run / DEPTH.file)
    lines = run_depth_report(run, n_boot=200)
    assert not (run / "stats" / "depth_lens_kl.csv").exists()
    assert lens_kl(pd.read_parquet(run / DEPTH.file)).empty
    assert any(line.startswith("depth: ") for line in lines)
