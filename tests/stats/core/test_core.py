"""stats.core: the one seeding scheme (pinned to the draws the published numbers came from), the error root,
contract-typed table reading, and the one Markdown/CSV writer."""

import math

import numpy as np
import pandas as pd
import pytest

from contract.tables import DTYPES, NO_BOUND, NSI_CONTINUOUS, SCENARIOS
from stats.core import errors
from stats.core.output import frame_markdown, md_table, write_csv, write_table
from stats.core.seeding import ENTROPY, SPAWN, name_key, rng_for
from stats.core.tables import conform, read_table


def test_seeding_reproduces_both_papers_derivations():
    # The gap paper: names extend the seed's spawn key (values drawn by the code before the split).
    assert rng_for(0, "continuous/L0").random() == 0.5966743085436104
    assert rng_for(7, "slice/family=F3", mix=SPAWN).random() == 0.911853908412539
    assert rng_for(np.random.SeedSequence(11).spawn(2)[1], "x").random() == 0.7353967050208544
    # The negation paper: names join the seed in the entropy; an int is its own key.
    assert rng_for(0, "null", "m", "all", mix=ENTROPY).random() == 0.8187312170817252
    assert rng_for(3, "boot", "group", "OSS", mix=ENTROPY).random() == 0.37114794997091094
    assert rng_for(0, len("integrity"), mix=ENTROPY).random() == 0.5670919928835728
    assert rng_for(5, mix=ENTROPY).random() == 0.8050029237453802
    assert name_key(9) == 9 and name_key("a") == name_key("a") != name_key("b")
    with pytest.raises(ValueError, match="mix"):
        rng_for(0, "x", mix="order")


def test_every_error_is_a_stats_input_error():
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert len(classes) == 6 and all(issubclass(c, errors.StatsInputError) for c in classes)
    with pytest.raises(errors.StatsInputError):
        raise errors.NSITableError("x")


def _continuous_rows(n=2):
    return [{"model": "m", "dilemma_id": f"d{i}", "domain": "legal", "framing": "F0", "negated": False, "metadata": None,
             "mass_agree": 0.3, "mass_disagree": 0.5, "p_agree": 0.375, "p_endorse": 0.375, "prompt_tokens": 300,
             "mass_agree_tempered": 0.2, "mass_disagree_tempered": 0.6, "p_agree_tempered": 0.25,
             "p_endorse_tempered": 0.25, "tempered_temperature": 0.7, "tempered_top_p": 0.95, **NO_BOUND}
            for i in range(n)]


def test_optional_columns_of_an_older_writer_load_as_nulls(tmp_path):
    """A table written before the tempered reading loads with those columns null (listed in attrs["absent"]) when
    the reader names them optional, and is refused with a one-line error naming file and column otherwise."""
    old = [c for c in NSI_CONTINUOUS.names if c.endswith("tempered") or c.startswith("tempered_")]
    assert len(old) == 6
    path = tmp_path / NSI_CONTINUOUS.file
    pd.DataFrame(_continuous_rows()).drop(columns=old).to_parquet(path)
    got = read_table(path, NSI_CONTINUOUS, optional=tuple(old))
    assert list(got.columns) == list(NSI_CONTINUOUS.names) and got.attrs["absent"] == old
    assert got[old].isna().all().all() and (got["p_agree"] == 0.375).all()
    with pytest.raises(errors.TableSchemaError, match=r"nsi_continuous\.parquet: column mass_agree_tempered: missing \(declared"):
        read_table(path, NSI_CONTINUOUS)
    pd.DataFrame(_continuous_rows()).drop(columns=["p_agree"]).to_parquet(path)
    with pytest.raises(errors.TableSchemaError, match="column p_agree: missing"):  # optional only for the named columns
        read_table(path, NSI_CONTINUOUS, optional=tuple(old))


def test_read_table_types_columns_as_declared(tmp_path):
    df = pd.DataFrame(_continuous_rows())
    df["prompt_tokens"] = df["prompt_tokens"].astype(float)  # an older writer's float counts
    df["negated"] = df["negated"].astype(object)
    df["extra"] = 1
    path = tmp_path / NSI_CONTINUOUS.file
    df.to_parquet(path)
    got = read_table(path, NSI_CONTINUOUS)
    assert list(got.columns) == list(NSI_CONTINUOUS.names)
    assert {c.name: str(got[c.name].dtype) for c in NSI_CONTINUOUS.columns} == \
        {c.name: str(pd.Series([], dtype=DTYPES[c.dtype]).dtype) for c in NSI_CONTINUOUS.columns}


@pytest.mark.parametrize("change, message", [
    (lambda df: df.drop(columns=["p_agree"]), r"nsi_continuous\.parquet: column p_agree: missing"),
    (lambda df: df.assign(model=[None, "m"]), r"nsi_continuous\.parquet: column model: 1 null values"),
    (lambda df: df.assign(prompt_tokens=["a", "b"]), r"nsi_continuous\.parquet: column prompt_tokens: not readable as int"),
])
def test_read_table_errors_name_file_and_column(tmp_path, change, message):
    path = tmp_path / NSI_CONTINUOUS.file
    change(pd.DataFrame(_continuous_rows())).to_parquet(path)
    with pytest.raises(errors.TableSchemaError, match=message) as exc:
        read_table(path, NSI_CONTINUOUS)
    assert "\n" not in str(exc.value)


def test_read_table_file_errors(tmp_path):
    with pytest.raises(errors.RunDirError, match="scenarios.parquet: file not found"):
        read_table(tmp_path / SCENARIOS.file, SCENARIOS)
    (tmp_path / SCENARIOS.file).write_text("not parquet")
    with pytest.raises(errors.NSITableError, match="not a readable parquet table"):
        read_table(tmp_path / SCENARIOS.file, SCENARIOS, file_error=errors.NSITableError)
    with pytest.raises(errors.TableSchemaError, match="where: column p_agree: missing"):
        conform(pd.DataFrame(_continuous_rows()).drop(columns=["p_agree"]), NSI_CONTINUOUS, "where")


def test_markdown_writer(tmp_path):
    df = pd.DataFrame({"a|b": ["x|y", "line\nbreak", None], "v": [0.12345, 1e-5, math.nan], "ok": [True, False, True],
                       "n": [1, 2, 3]})
    assert frame_markdown(df).splitlines() == [
        "| a\\|b | v | ok | n |", "|---|---|---|---|",
        "| x\\|y | 0.123 | yes | 1 |", "| line break | 1.0e-05 | no | 2 |", "|  |  | yes | 3 |"]
    assert md_table(["h"], [[1]]) == "| h |\n|---|\n| 1 |"
    md = write_table(df.iloc[0:0], tmp_path, "t", "Title")
    assert md == "## Title\n\n(empty)\n" and (tmp_path / "t.md").read_text() == md
    write_table(pd.DataFrame({"x": [1 / 3]}), tmp_path, "full", "Full")
    write_csv(pd.DataFrame({"x": [1 / 3]}), tmp_path / "short.csv")
    assert (tmp_path / "full.csv").read_text() == "x\n0.3333333333333333\n"
    assert (tmp_path / "short.csv").read_text() == "x\n0.333333\n"
