"""What `readout report` and the stats commands write for runs at their edges: every table with its header (an empty
one too), an unreadable part noted in place while the rest renders, the answer (the card) before the tables, a
repeated prompt shown once, warnings grouped one line per kind, a missing interval written "[no CI]", and the stats
headline's note on a run not at the paper's settings."""

import shutil

import numpy as np
import pandas as pd
import pytest

from readouts.report import write_report
from stats.core.output import ci_text
from stats.nsi import run_nsi_stats
from tests.helpers import cli, make_gap_run, make_nsi_run


@pytest.fixture(scope="module")
def nsi_untempered(tmp_path_factory):
    """An NSI run whose reads at the sampling settings are all undefined (neither word in the nucleus), as on a
    tiny model's quick run: nsi_continuous_tempered has no rows."""
    run = make_nsi_run(tmp_path_factory.mktemp("nsi") / "run")
    path = run / "nsi_continuous.parquet"
    df = pd.read_parquet(path)
    df[["mass_agree_tempered", "mass_disagree_tempered"]] = 0.0
    df[["p_agree_tempered", "p_endorse_tempered"]] = np.nan
    df.to_parquet(path, index=False)
    run_nsi_stats([run], None, seed=0, n_null=20, n_boot=20)
    return run


def test_every_table_nsi_stats_writes_has_its_header(nsi_untempered):
    stats = nsi_untempered / "stats"
    tempered = pd.read_csv(stats / "nsi_continuous_tempered.csv")
    assert len(tempered) == 0 and {"model", "nsi_continuous", "ci_low", "temperature", "top_p"} <= set(tempered.columns)
    for csv in stats.glob("*.csv"):
        assert csv.read_text().splitlines()[0].strip(), csv.name


def test_report_renders_a_run_with_an_empty_table(nsi_untempered, tmp_path, capsys):
    code, out, err = cli(["report", str(nsi_untempered), "--out", str(tmp_path / "r.html")], capsys)
    assert code == 0, err
    assert "nsi_continuous_tempered.csv (0 rows)" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_an_unreadable_part_is_a_note_in_place_and_the_rest_renders(nsi_untempered, tmp_path):
    run = tmp_path / "nsi"
    shutil.copytree(nsi_untempered, run)
    (run / "stats" / "nsi_models.csv").write_bytes(b"")  # an unreadable table
    (run / "stats" / "nsi_report.md").write_bytes(b"\xff\xfe not utf-8")  # an unreadable markdown report
    gap = make_gap_run(tmp_path / "gap")
    out = tmp_path / "r.html"
    lines = write_report([run, tmp_path / "missing", gap], out)
    html = out.read_text(encoding="utf-8")
    assert "nsi_models.csv: not a readable CSV table" in html
    assert "nsi_report.md: not readable" in html
    assert "Not readable: " in html and "missing: not a folder" in html  # a combined report keeps the other folders
    assert 'data-kind="gap"' in html and 'data-kind="nsi"' in html
    assert "nsi_parse.csv (" in html  # the run's other tables still render
    assert any("nsi_models.csv: not a readable CSV table" in line for line in lines)


def test_a_missing_interval_says_no_ci():
    assert ci_text(float("nan"), float("nan")) == "[no CI]" and ci_text(None, 0.2) == "[no CI]"
    assert ci_text(0.66, 0.731) == "[0.66, 0.73]"


@pytest.fixture(scope="module")
def gap_with_stats(tmp_path_factory):
    from stats.gap import run_report

    run = make_gap_run(tmp_path_factory.mktemp("gap") / "run")
    run_report(run, n_boot=20)  # the default mass floor: a tiny model's letters carry little mass
    return run


def test_report_leads_with_the_answer(gap_with_stats, nsi_untempered, tmp_path):
    out = tmp_path / "r.html"
    write_report([gap_with_stats, nsi_untempered], out)
    html = out.read_text(encoding="utf-8")
    gap_part, nsi_part = html.split('data-kind="nsi"')
    card = gap_part.index('class="card"')
    assert card < gap_part.index("Tables") < gap_part.index("Run facts") < gap_part.index("Per scenario")
    assert "Nothing screened: the model rarely answers with a letter" in gap_part
    assert "verdict level" in gap_part and "known-gap control" in gap_part and "not the paper&#x27;s settings" in gap_part
    assert 'class="card"' in nsi_part and "NSI" in nsi_part
    assert "![" not in html  # the NSI report's figures are embedded, not raw markdown
    assert nsi_part.count("data:image/png;base64,") >= 2 * len(list((nsi_untempered / "stats").glob("*.png")))
    probes = pd.read_parquet(gap_with_stats / "probes.parquet")
    distinct = probes.drop_duplicates(["scenario_id", "cell", "readout", "prompt_text"])
    assert gap_part.count("<summary>prompt (") == len(distinct)


def test_the_drill_down_shows_a_repeated_prompt_once(gap_with_stats, tmp_path):
    run = tmp_path / "gap"
    shutil.copytree(gap_with_stats, run)
    path = run / "probes.parquet"
    probes = pd.read_parquet(path)
    d = probes[(probes.readout == "D") & (probes.cell == "primary") & (probes.scenario_id == probes.scenario_id.iloc[0])]
    assert d.order_index.nunique() == 2
    first = d[d.order_index == d.order_index.min()].prompt_text.iloc[0]
    probes.loc[d.index, "prompt_text"] = first  # two option orders that read the same text
    probes.to_parquet(path, index=False)
    out = tmp_path / "r.html"
    write_report([run], out)
    html = out.read_text(encoding="utf-8")
    shown = probes.drop_duplicates(["scenario_id", "cell", "readout", "prompt_text"])
    assert html.count("<summary>prompt (") == len(shown) == len(
        probes.drop_duplicates(["scenario_id", "cell", "readout", "frame", "order_index"])) - 1
    assert "2 option orders</div>" in html


def test_warnings_are_grouped_one_line_per_kind():
    from readouts.report.card import group_warnings

    lines = [f"warning: forced reads dominate {r} in {k} of 8 frame x cell groups (judge_{k}/primary 100%)"
             for k, r in enumerate(("J", "J", "J0", "dose_reasoning", "dose_filler"))]
    lines += ["warning: the mass floor 0.5 removes 1 of 1 gate-family primaries", "skipped: dose arm: no dose_* readouts"]
    assert group_warnings(lines) == [(lines[0], 5), (lines[5], 1), (lines[6], 1)]


@pytest.mark.parametrize("profile, noted", [("quick", True), ("paper", False)])
def test_the_stats_headline_says_when_a_run_is_not_at_the_papers_settings(gap_with_stats, tmp_path, capsys, profile,
                                                                          noted):
    """`readout stats` on a run of the quick profile prints the one-line settings notice in its headline and writes
    it into report.md; on a run of the paper profile (no --set, no --limit) neither says it."""
    import json

    run = tmp_path / "run"
    shutil.copytree(gap_with_stats, run)
    manifest = json.loads((run / "manifest.json").read_text())
    assert not manifest.get("overrides") and not manifest.get("limit")
    manifest["profile"]["name"] = profile
    (run / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = cli(["stats", str(run), "--n-boot", "20"], capsys)
    assert code == 0, err
    notice = ("note: not the paper's settings (profile 'quick'): these numbers are not comparable with the paper's "
              "(rerun with --profile paper)")
    lines = out.splitlines()
    assert (notice in lines) == noted, out
    assert ("not the paper's settings" in out) == noted
    if noted:
        assert lines.index(notice) == 1  # right under the line naming the model and the panel
    assert ("not the paper's settings" in (run / "stats" / "report.md").read_text()) == noted
