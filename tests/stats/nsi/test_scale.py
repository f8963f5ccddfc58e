"""Sec. 4.4's scale correlation: Pearson r^2 of per-model NSI against parameter count, from the real nsi-stats."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from stats.nsi import NSITableError, load_params, run_nsi_stats, write_count_run


def test_scale_correlation_of_nsi_and_parameter_count(tmp_path):
    params = {"m1": 1.0, "m2": 3.8, "m3": 8.0, "m4": 70.0, "m5": 400.0}
    flips = {"m1": 12, "m2": 10, "m3": 9, "m4": 4, "m5": 5}  # dilemmas flipping F0 -> F1
    dirs = []
    for i, (m, f) in enumerate(flips.items()):
        n = np.full((14, 4), 10)
        k = np.zeros((14, 4), dtype=int)
        k[:f, 1] = 10
        dirs.append(write_count_run(tmp_path / m, m, n, k, seed=i))
    (tmp_path / "params.json").write_text(json.dumps(params))
    lines = run_nsi_stats(dirs, tmp_path / "out", seed=0, n_null=100, n_boot=100, params=load_params(tmp_path / "params.json"))
    scale = pd.read_csv(tmp_path / "out" / "nsi_scale.csv").set_index(["metric", "x"])
    models = pd.read_csv(tmp_path / "out" / "nsi_models.csv").set_index("model")
    x = np.array(list(params.values()))
    y = models.loc[list(params), "nsi"].to_numpy()
    assert list(y) == pytest.approx([f / 14 for f in flips.values()])
    r = sps.pearsonr(x, y)
    assert scale.loc[("nsi", "params"), "r_sq"] == pytest.approx(r.statistic ** 2)
    assert scale.loc[("nsi", "params"), "p_two_sided"] == pytest.approx(r.pvalue)
    assert scale.loc[("nsi", "log10_params"), "r"] == pytest.approx(sps.pearsonr(np.log10(x), y).statistic)
    assert scale.loc[("nsi", "params"), "r"] < 0 and scale.loc[("nsi", "params"), "n"] == 5
    assert any(line.startswith("scale: NSI vs parameter count over 5 models") for line in lines)


def test_params_file_errors(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"a": -1}))
    with pytest.raises(NSITableError, match=r"p.json: model 'a': parameter count -1 is not a positive number"):
        load_params(tmp_path / "p.json")
    with pytest.raises(NSITableError, match="file not found"):
        load_params(tmp_path / "none.json")
