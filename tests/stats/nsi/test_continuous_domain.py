"""`readout nsi-stats` on runs whose continuous reads give no finite value for any model and domain (a served run
whose decision words all fall outside the top k): the continuous tables are written with their header and no
rows. A continuous table naming another model than its run's replies is refused in one line (exit code 2)."""

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from contract.tables import NSI_CONTINUOUS, NSI_REPLIES
from stats.core.errors import NSITableError
from stats.nsi import coherent_rates, run_nsi_stats, write_synthetic_run
from stats.nsi.continuous import CONTINUOUS_COLUMNS, DOMAIN_COLUMNS, SETTINGS_COLUMNS


def _run(tmp_path, edit):
    """A synthetic run of model "m" whose nsi_continuous.parquet `edit` changes in place."""
    run = write_synthetic_run(tmp_path / "run", "m", coherent_rates(np.random.default_rng(1)), seed=1, n_samples=6)
    path = run / NSI_CONTINUOUS.file
    df = pd.read_parquet(path)
    edit(df)
    df.to_parquet(path, index=False)
    return run


def _no_word_in_the_top_k(df: pd.DataFrame) -> None:
    """No start token of either word among the top k: no mass and p_agree undefined, at both settings."""
    for col in ("mass_agree", "mass_disagree", "mass_agree_tempered", "mass_disagree_tempered"):
        df[col] = 0.0
    for col in ("p_agree", "p_endorse", "p_agree_tempered", "p_endorse_tempered"):
        df[col] = np.nan


def _another_model(df: pd.DataFrame) -> None:
    df["model"] = "other-model"


def test_no_finite_continuous_read_writes_the_continuous_tables_with_their_header(tmp_path, capsys):
    run = _run(tmp_path, _no_word_in_the_top_k)
    lines = run_nsi_stats([run], tmp_path / "out", seed=0, n_null=20, n_boot=20)
    header = {"nsi_continuous_domain": DOMAIN_COLUMNS, "nsi_continuous": CONTINUOUS_COLUMNS,
              "nsi_continuous_tempered": CONTINUOUS_COLUMNS + SETTINGS_COLUMNS}
    for name, columns in header.items():
        assert (tmp_path / "out" / f"{name}.csv").read_text().splitlines() == [",".join(columns)], name
    note = [x for x in lines if "put no mass on either word" in x]
    assert len(note) == 1 and note[0].startswith("56 continuous reads")
    assert not any(x.startswith("m: continuous NSI") for x in lines)
    with pytest.raises(SystemExit) as done:
        main(["nsi-stats", str(run), "--out", str(tmp_path / "cli")])
    assert done.value.code in (0, None)
    assert (tmp_path / "cli" / "nsi_continuous_domain.csv").read_text().splitlines() == [",".join(DOMAIN_COLUMNS)]


def test_a_continuous_table_of_another_model_than_the_replies_is_refused_in_one_line(tmp_path, capsys):
    run = _run(tmp_path, _another_model)
    message = (f"{run / NSI_CONTINUOUS.file}: column model: 'other-model' is not the model of the run's replies "
               f"('m' in {NSI_REPLIES.file})")
    with pytest.raises(NSITableError) as exc:
        run_nsi_stats([run], tmp_path / "out", seed=0, n_null=20, n_boot=20)
    assert str(exc.value) == message
    with pytest.raises(SystemExit) as done:
        main(["nsi-stats", str(run), "--out", str(tmp_path / "cli")])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {message}"]
