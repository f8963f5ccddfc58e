"""The continuous readout at the sampling settings (p_endorse_tempered) beside T = 1: its own table and headline
in nsi-stats, computed from its own columns; runs written before that reading still load, with a note."""

import numpy as np
import pandas as pd
import pytest

from contract.tables import NSI_CONTINUOUS, NSI_TEMPERED
from stats.core.errors import NSITableError
from stats.nsi import coherent_rates, run_nsi_stats, write_synthetic_run
from stats.nsi.synth import acquiescent_rates


def _run(tmp_path, name, rates, seed, tempered=None):
    """A noise-free synthetic run; ``tempered`` (S, 4) endorsement rates replace its tempered reading."""
    run = write_synthetic_run(tmp_path / name, name, rates, seed=seed, n_samples=6, continuous_noise=0.0)
    if tempered is not None:
        path = run / NSI_CONTINUOUS.file
        df = pd.read_parquet(path)
        pe = np.array([tempered[i // 4, i % 4] for i in range(len(df))])  # rows are dilemma-major, F0..F3
        pa = np.where(df["negated"], 1 - pe, pe)
        df = df.assign(p_endorse_tempered=pe, p_agree_tempered=pa, mass_agree_tempered=pa * 0.8,
                       mass_disagree_tempered=(1 - pa) * 0.8, tempered_temperature=0.7, tempered_top_p=0.95)
        df.to_parquet(path, index=False)
    return run


def test_tempered_nsi_is_read_from_its_own_columns(tmp_path):
    """A model swinging with polarity at T = 1 but steady at the sampling settings: the two tables differ as planted."""
    rng = np.random.default_rng(3)
    swing, steady = acquiescent_rates(rng, strength=1.0), coherent_rates(rng)
    run = _run(tmp_path, "m", swing, 1, tempered=steady)
    lines = run_nsi_stats([run], tmp_path / "out", seed=0, n_null=100, n_boot=100)
    t1 = pd.read_csv(tmp_path / "out" / "nsi_continuous.csv").set_index("model")
    tt = pd.read_csv(tmp_path / "out" / "nsi_continuous_tempered.csv").set_index("model")
    assert t1.loc["m", "nsi_continuous"] == pytest.approx(np.mean(swing.max(1) - swing.min(1)), abs=1e-9)
    assert tt.loc["m", "nsi_continuous"] == pytest.approx(0.0, abs=1e-9)
    assert (tt.loc["m", "temperature"], tt.loc["m", "top_p"]) == (0.7, 0.95)
    line = [x for x in lines if "continuous NSI at T 0.7, top-p 0.95" in x]
    assert len(line) == 1 and line[0].startswith("m: continuous NSI at T 0.7, top-p 0.95: 0.000")
    assert not any("predate" in x for x in lines)


def test_older_run_without_the_tempered_columns_still_loads(tmp_path):
    rng = np.random.default_rng(4)
    new = _run(tmp_path, "new", acquiescent_rates(rng), 1)
    old = _run(tmp_path, "old", acquiescent_rates(rng), 2)
    path = old / NSI_CONTINUOUS.file
    pd.read_parquet(path).drop(columns=list(NSI_TEMPERED)).to_parquet(path, index=False)
    lines = run_nsi_stats([new, old], tmp_path / "out", seed=0, n_null=100, n_boot=100)
    t1 = pd.read_csv(tmp_path / "out" / "nsi_continuous.csv")
    tt = pd.read_csv(tmp_path / "out" / "nsi_continuous_tempered.csv")
    assert sorted(t1["model"]) == ["new", "old"] and list(tt["model"]) == ["new"]
    note = [x for x in lines if "predate" in x]
    assert len(note) == 1 and str(path) in note[0] and "T = 1 only" in note[0]


def test_tempered_reading_half_present_or_out_of_range_is_one_line_error(tmp_path):
    run = _run(tmp_path, "m", coherent_rates(np.random.default_rng(5)), 1)
    path = run / NSI_CONTINUOUS.file
    full = pd.read_parquet(path)
    full.drop(columns=["p_agree_tempered"]).to_parquet(path, index=False)
    with pytest.raises(NSITableError, match=r"nsi_continuous\.parquet: column p_agree_tempered: missing while") as exc:
        run_nsi_stats([run], tmp_path / "out", seed=0, n_null=10, n_boot=10)
    assert "\n" not in str(exc.value)
    full.assign(p_endorse_tempered=full["p_endorse_tempered"] + 2).to_parquet(path, index=False)
    with pytest.raises(NSITableError, match=r"column p_endorse_tempered: values outside \[0, 1\]"):
        run_nsi_stats([run], tmp_path / "out", seed=0, n_null=10, n_boot=10)


def test_no_word_in_the_nucleus_is_named_not_refused(tmp_path):
    """Neither word in the top-p nucleus leaves p_agree_tempered undefined for that read only."""
    run = _run(tmp_path, "m", coherent_rates(np.random.default_rng(6)), 1)
    path = run / NSI_CONTINUOUS.file
    df = pd.read_parquet(path)
    for col in ("mass_agree_tempered", "mass_disagree_tempered"):
        df.loc[0, col] = 0.0
    df.loc[0, ["p_agree_tempered", "p_endorse_tempered"]] = np.nan
    df.to_parquet(path, index=False)
    lines = run_nsi_stats([run], tmp_path / "out", seed=0, n_null=10, n_boot=10)
    note = [x for x in lines if "top-p nucleus" in x]
    assert len(note) == 1 and note[0].startswith("1 continuous reads") and f"m {df.loc[0, 'dilemma_id']} F0" in note[0]
    tt = pd.read_csv(tmp_path / "out" / "nsi_continuous_tempered.csv").set_index("model")
    assert tt.loc["m", "n_dilemmas"] == 13
