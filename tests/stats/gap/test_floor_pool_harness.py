"""The mass-floor sensitivity table, pooling pods of one model (Table 12's union), and the harness
calibration table (Table 11's harness side) with its forced-read warning."""

import json

import numpy as np
import pandas as pd
import pytest

from contract.tables import SCENARIOS
from stats.core.errors import TableValueError
from stats.gap import SyntheticSpec, analyze, make_run_dir, run_report, simulate_tables
from stats.gap.harness import forced_warnings, harness_table
from stats.gap.screen import above_floor, screen
from stats.gap.tables import load_run, pool_runs


def test_floor_sensitivity_reruns_the_screen_at_each_floor(tmp_path):
    table, manifest = simulate_tables(SyntheticSpec(n_scenarios=500, seed=4, readouts=("D", "J"), below_floor=0.0))
    ids = sorted(table.scenario_id.unique())
    low, mid = set(ids[0::5]), set(ids[1::5])  # every letter mass 0.4 (passes 0.3 only) or 0.6 (fails 0.7)
    table.loc[table.scenario_id.isin(low), "letter_mass"] = 0.4
    table.loc[table.scenario_id.isin(mid), "letter_mass"] = 0.6
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    table.to_parquet(run_dir / SCENARIOS.file, index=False)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, default=str))
    a = analyze(run_dir, n_boot=300)
    run = load_run(run_dir)
    in_gate = a.per_scenario["gate"].to_numpy()
    ns = {}
    for f in (0.3, 0.5, 0.7):
        e = a.get("floor_sensitivity", "E", f"floor={f:g}")
        assert e.n == (in_gate & screen(run, f).screened & above_floor(run, "twin", ("D", "J"), f)).sum()
        ns[f] = e.n
    assert ns[0.3] > ns[0.5] > ns[0.7]
    assert a.get("floor_sensitivity", "E", "floor=0.5").value == pytest.approx(a.get("continuous", "E", "L0").value)
    assert a.get("floor_sensitivity", "binary_null", "floor=0.5").n == a.get("binary", "binary_null", "L0").n


def _pod(tmp_path, name, seed, prefix, model="synthetic-instruct"):
    table, manifest = simulate_tables(SyntheticSpec(n_scenarios=200, seed=seed, model=model, readouts=("D", "J")))
    ids = sorted(table.scenario_id.unique())
    rename = {s: (f"{prefix}-{s}" if i % 2 else s) for i, s in enumerate(ids)}  # half shared with other pods
    table["scenario_id"] = table["scenario_id"].map(rename)
    out = tmp_path / name
    out.mkdir()
    table.to_parquet(out / SCENARIOS.file, index=False)
    (out / "manifest.json").write_text(json.dumps(manifest, default=str))
    return out


@pytest.mark.heavy  # the bootstrap over several planted runs
def test_pool_is_the_union_with_shared_scenarios_once(tmp_path):
    a, b = _pod(tmp_path, "pilot", 1, "p"), _pod(tmp_path, "full", 2, "f")
    pooled = pool_runs([a, b], "union")
    ra, rb = load_run(a), load_run(b)
    union = set(ra.ids) | set(rb.ids)
    assert pooled.n == len(union) < ra.n + rb.n  # a scenario read in both pods counts once
    shared = sorted(set(ra.ids) & set(rb.ids))
    # ... from the first pod given.
    pos_p, pos_a = pooled.meta.index.get_indexer(shared), ra.meta.index.get_indexer(shared)
    assert np.array_equal(pooled.col("primary", "D", "p_violating")[pos_p], ra.col("primary", "D", "p_violating")[pos_a])
    assert any("count once" in n for n in pooled.notes)
    lines = run_report(pooled, n_boot=200)
    assert (tmp_path / "union" / "stats" / "estimates.csv").is_file() and lines[0].startswith("synthetic-instruct on union")


def test_pool_refuses_different_models(tmp_path):
    a, b = _pod(tmp_path, "a", 1, "p"), _pod(tmp_path, "b", 2, "f", model="other")
    with pytest.raises(TableValueError, match="different models"):
        pool_runs([a, b], "union")


@pytest.mark.heavy  # the bootstrap over several planted runs
def test_harness_table_and_forced_warning(tmp_path):
    run_dir = make_run_dir(tmp_path / "r", SyntheticSpec(n_scenarios=60, seed=2, readouts=("D", "J")))
    rules = (["own"] * 3 + ["own_bold+wrapped"] + ["forced_at_budget"] * 6  # judge_1: 60% forced
             + ["own"] * 8 + ["own_final+tool:B"] + ["forced_after_completion"])  # judge_2: 10% forced
    frames = ["judge_1"] * 10 + ["judge_2"] * 10
    pd.DataFrame({"readout": "J", "frame": frames, "cell": "primary", "anchor_rule": rules}).to_parquet(
        run_dir / "probes.parquet")
    h = harness_table(run_dir).set_index("frame")
    assert h.loc["judge_1", "reads"] == 10 and h.loc["judge_1", "share_forced"] == pytest.approx(0.6)
    assert h.loc["judge_1", "share_own_bold"] == pytest.approx(0.1) and h.loc["judge_1", "share_wrapped"] == pytest.approx(0.1)
    assert h.loc["judge_2", "share_tool_name"] == pytest.approx(0.1) and h.loc["judge_2", "share_own"] == pytest.approx(0.8)
    assert h.loc["judge_2", "share_forced"] == pytest.approx(0.1)  # forced after a finished reply counts too
    warn = forced_warnings(h.reset_index())
    assert len(warn) == 1 and "J in 1 of 2" in warn[0] and "judge_1/primary 60%" in warn[0]
    lines = run_report(run_dir, n_boot=100)
    assert any(x.startswith("warning: forced reads dominate J") for x in lines)
    assert (run_dir / "stats" / "harness.csv").is_file()
