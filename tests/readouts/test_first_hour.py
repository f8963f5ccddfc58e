"""What a new user met in the first hour (issue 30): an empty table written without its header, a report stopped by
one unreadable part, numeric options accepted and failing later, help texts that disagree with the code, NaN
intervals, a doubled word in JSON errors, a typo'd model name without a suggestion."""

import re
import shutil

import click
import numpy as np
import pandas as pd
import pytest

from contract.options import DEFAULT_MASS_FLOOR
from engine.errors import UnknownModelError
from engine.registry import resolve
from readouts.cli import cli as cli_group
from readouts.cli import main
from readouts.gap.profile import PROFILES as GAP_PROFILES
from readouts.nsi.profile import PROFILES as NSI_PROFILES
from readouts.profiles import apply_overrides
from readouts.report import write_report
from stats.core.output import ci_text
from stats.nsi import run_nsi_stats
from tests.readouts.test_show import make_gap_run, make_nsi_run


def cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


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


@pytest.mark.parametrize("argv, option", [
    (["stats", "RUN", "--n-boot", "0"], "--n-boot"),
    (["stats", "RUN", "--mass-floor", "1.5"], "--mass-floor"),
    (["stats", "RUN", "--mass-floor", "-0.1"], "--mass-floor"),
    (["compare", "RUN", "-o", "X", "--n-boot", "-3"], "--n-boot"),
    (["score", "P", "-m", "tiny-qwen2", "-o", "X", "--top-p", "0"], "--top-p"),
    (["score", "P", "-m", "tiny-qwen2", "-o", "X", "--temperature", "-1"], "--temperature"),
    (["run", "-m", "tiny-qwen2", "--limit", "0"], "--limit"),
    (["nsi", "-m", "tiny-qwen2", "--samples", "-1"], "--samples"),
    (["report", "RUN", "--items", "-1"], "--items"),
    (["nsi-export", "RUN", "--n", "0"], "--n"),
])
def test_numeric_options_are_checked_before_any_work(argv, option, tmp_path, capsys):
    argv = [str(tmp_path / a) if a in ("RUN", "P", "X") else a for a in argv]
    code, out, err = cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing was written


def _commands(group, path=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_numeric_option_declares_its_bounds():
    loose = [f"{' '.join(p)} {o.opts[0]}" for p, cmd in _commands(cli_group) for o in cmd.params
             if isinstance(o, click.Option) and o.type in (click.INT, click.FLOAT)]
    assert loose == []


def _help(path, capsys) -> str:
    code, out, _ = cli([*path, "--help"], capsys)
    assert code == 0
    return " ".join(out.split())


def test_help_examples_are_valid_for_their_command(capsys):
    profiles = {"run": GAP_PROFILES["quick"], "nsi": NSI_PROFILES["quick"], "sweep": GAP_PROFILES["quick"],
                "steer": GAP_PROFILES["quick"]}
    for path, _ in _commands(cli_group):
        text = _help(path, capsys)
        sets = re.findall(r"--set ([a-z_][A-Za-z0-9_.]*=[^\s;)]+)", text)
        if path[0] in profiles:
            assert sets, path
        for example in sets:
            profile = NSI_PROFILES["quick"] if path[0] == "sweep" and "with --study nsi" in text.split(example)[0] \
                else profiles[path[0]]
            apply_overrides(profile, (example,))  # raises on a field the command's profile does not have
        for example in re.findall(r"--template-kwarg .*?e\.g\. (\S+='[^']*')", text):
            from readouts.cli import _template_kwargs
            assert _template_kwargs((example,))
    assert "nsi-<profile>-seed<seed>" in _help(("nsi",), capsys).replace(" ", "")  # click may break the path across lines
    assert "sweep's folder" in _help(("sweep",), capsys)
    assert f"default: {DEFAULT_MASS_FLOOR}" in _help(("stats",), capsys)


def test_a_missing_interval_says_no_ci():
    assert ci_text(float("nan"), float("nan")) == "[no CI]" and ci_text(None, 0.2) == "[no CI]"
    assert ci_text(0.66, 0.731) == "[0.66, 0.73]"


def test_a_json_error_does_not_double_its_last_word(tmp_path, capsys):
    probes = tmp_path / "p.csv"
    probes.write_text('id,text,letters\na,x,"[""A"", ""B]"\n')
    code, _, err = cli(["score", str(probes), "-m", "tiny-qwen2", "-o", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and "starting at character 7" in err and "at at" not in err


def test_a_typo_in_a_model_name_suggests_the_nearest_alias():
    with pytest.raises(UnknownModelError, match="did you mean 'tiny-qwen2'"):
        resolve("tiny-qwn2")
    with pytest.raises(UnknownModelError) as exc:
        resolve("zzzz")
    assert "did you mean" not in str(exc.value)


def test_run_summary_is_an_aligned_table_with_a_settings_note_and_the_next_command(tmp_path):
    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.gap import profile as gap_profile
    from readouts.gap.study import GapStudy
    from tests.readouts.test_show import TINY_PROFILE

    lines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, TINY_PROFILE.name, TINY_PROFILE)
        options = RunOptions(model=ModelOptions("tiny-qwen2"), profile=TINY_PROFILE.name, out=str(tmp_path / "run"),
                             progress=False)
        run_study(GapStudy(readouts="D,J"), options, log=lambda _: None, result=lines.append)
    assert any(line.startswith(f"note: profile '{TINY_PROFILE.name}' is not the paper's settings") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["family", "n"])
    table = lines[header:header + 1 + 3]  # one family row per family read, then "all"
    names = ["p_D", "p_J", "p_D(twin)", "p_J(twin)", "g", "g(twin)"]
    for name in names:  # every value ends where its column's name ends
        end = table[0].index(name) + len(name)
        for row in table[1:]:
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (name, table)
    assert lines[-1] == f"next: readout stats {tmp_path / 'run'}   (then: readout report {tmp_path / 'run'})"


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
