"""The command line's options and messages: numeric options are checked (each declares its bounds) before any
work, help examples are valid for their command, a JSON error says its last word once, a mistyped model name gets the
nearest alias, and the run summary is an aligned table with a settings note and the next command."""

import re

import click
import pytest

from cli.main import cli as cli_group
from contract.options import DEFAULT_MASS_FLOOR
from engine.errors import UnknownModelError
from engine.registry import resolve
from readouts.gap.profile import PROFILES as GAP_PROFILES
from readouts.nsi.profile import PROFILES as NSI_PROFILES
from readouts.profiles import apply_overrides
from tests.helpers import TINY_PROFILE, cli


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
                "steer": GAP_PROFILES["quick"], "watch": GAP_PROFILES["quick"]}
    for path, _ in _commands(cli_group):
        text = _help(path, capsys)
        sets = re.findall(r"--set ([a-z_][A-Za-z0-9_.]*=[^\s;)]+)", text)
        if path[0] in profiles:
            assert sets, path
        for example in sets:
            profile = NSI_PROFILES["quick"] if path[0] in ("sweep", "watch") and "with --study nsi" in text.split(example)[0] \
                else profiles[path[0]]
            apply_overrides(profile, (example,))  # raises on a field the command's profile does not have
        for example in re.findall(r"--template-kwarg .*?e\.g\. (\S+='[^']*')", text):
            from cli.options import template_kwargs as _template_kwargs
            assert _template_kwargs((example,))
    assert "nsi-<profile>-seed<seed>" in _help(("nsi",), capsys).replace(" ", "")  # click may break the path across lines
    assert "sweep's folder" in _help(("sweep",), capsys)
    assert f"default: {DEFAULT_MASS_FLOOR}" in _help(("stats",), capsys)


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
