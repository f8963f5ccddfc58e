"""A fixed-seed run's tables do not depend on how the engine batches: with decoding batches of a few rows
and small scoring batches, the sampled J and dose rollouts are the same texts and every read the same
number (within float rounding of differently shaped batches) as with the default bounds."""

import dataclasses

import pandas as pd
import pytest

import engine.batching as batching
from readouts.driver import ModelOptions, RunOptions, run
from readouts.gap import profile as gap_profile
from readouts.gap.study import GapStudy

PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="batch-test", max_units=4, chunk_size=4,
                              orders={"D": 3, "J0": 2, "control": 2, "raw": 2}, j_samples=3, j_budget=10,
                              dose_samples=2, dose_budget=8, dose_brief_budget=4)


@pytest.fixture(autouse=True)
def batch_profile(monkeypatch):
    monkeypatch.setitem(gap_profile.PROFILES, "batch-test", PROFILE)


def probes(tmp_path, name):
    options = RunOptions(model=ModelOptions("tiny-olmo3"), profile="batch-test", out=str(tmp_path / name), progress=False)
    path = run(GapStudy(), options, log=lambda _: None)
    return pd.read_parquet(path / "probes.parquet").sort_values("probe_id").reset_index(drop=True)


def test_tables_do_not_depend_on_batching(tmp_path, monkeypatch):
    default = probes(tmp_path, "default")
    monkeypatch.setitem(batching.DEFAULT_BOUNDS, "generate", {"cuda": (32768, 512), "cpu": (128, 5)})
    monkeypatch.setitem(batching.DEFAULT_BOUNDS, "score", {"cuda": (32768, 256), "cpu": (256, 7)})
    small = probes(tmp_path, "small")
    sampled = default[default.generated_text.notna() & (default.rollout > 0)]
    assert len(sampled) > 20 and sampled.generated_text.nunique() > 10  # sampled rollouts are covered
    pd.testing.assert_series_equal(default.generated_text, small.generated_text)
    pd.testing.assert_frame_equal(default, small, check_exact=False, rtol=1e-4, atol=1e-6)
