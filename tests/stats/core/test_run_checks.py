"""The analyses check what they are given: the manifest's kind and completeness, and rows whose values are
not finite are counted and named instead of vanishing."""

import json

import numpy as np
import pandas as pd
import pytest

from stats.core.errors import RunDirError
from stats.gap import SyntheticSpec, analyze, load_run, make_run_dir
from stats.nsi import run_nsi_stats
from stats.nsi.synth import acquiescent_rates, write_synthetic_run


def _edit_manifest(run, **changes):
    path = run / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_gap_stats_refuse_another_kind_and_an_unfinished_run(tmp_path):
    run = make_run_dir(tmp_path / "gap", SyntheticSpec(n_scenarios=40))
    _edit_manifest(run, kind="nsi")
    with pytest.raises(RunDirError, match="kind: this is a nsi run.*readout nsi-stats"):
        load_run(run)
    _edit_manifest(run, kind="judgment-action", complete=False, chunks=["a"], n_chunks=3)
    with pytest.raises(RunDirError, match=r"complete: the run has not finished \(1 of 3 chunks\)"):
        load_run(run)
    _edit_manifest(run, complete=True)
    assert load_run(run).n == 40


def test_nsi_stats_refuse_a_gap_run(tmp_path):
    run = write_synthetic_run(tmp_path / "nsi", "m", acquiescent_rates(np.random.default_rng(0)), n_samples=4)
    _edit_manifest(run, kind="judgment-action")
    with pytest.raises(RunDirError, match="read it with readout stats"):
        run_nsi_stats([run], tmp_path / "out", n_null=20, n_boot=20)


def test_non_finite_gap_rows_are_noted_and_listed_as_skipped(tmp_path):
    run = make_run_dir(tmp_path / "gap", SyntheticSpec(n_scenarios=40))
    df = pd.read_parquet(run / "scenarios.parquet")
    hit = df.index[(df.readout == "D") & (df.cell == "primary")][:3]
    df.loc[hit, "p_violating"] = np.nan
    df.to_parquet(run / "scenarios.parquet", index=False)
    loaded = load_run(run)
    assert len(loaded.nonfinite) == 3 and any("3 rows with a non-finite" in n for n in loaded.notes)
    skipped = [s for s in analyze(loaded, n_boot=50).skipped if "not finite" in s.reason]
    assert len(skipped) == 3


def test_undefined_continuous_reads_are_counted_not_refused(tmp_path):
    run = write_synthetic_run(tmp_path / "nsi", "m", acquiescent_rates(np.random.default_rng(0)), n_samples=4)
    cont = pd.read_parquet(run / "nsi_continuous.parquet")
    cont.loc[:1, ["mass_agree", "mass_disagree", "p_agree", "p_endorse"]] = [0.0, 0.0, np.nan, np.nan]
    cont.to_parquet(run / "nsi_continuous.parquet", index=False)
    lines = run_nsi_stats([run], tmp_path / "out", n_null=20, n_boot=20)
    assert any(line.startswith("2 continuous reads put no mass on either word") for line in lines)
