"""A new user's path (issue 30): every `readout` command in a shell block of README.md and docs/*.md parses against
the command line it names (options, types, bounds, required arguments), and the README's quickstart runs end to end
at reduced size on a tiny model (the Python example of docs/own-items-and-api.md runs in tests/readouts/test_api.py)."""

import re
import shlex

import click
import pytest

from readouts.cli import cli, main
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shell_commands():
    """(page, command line) for every `readout ...` line of every ```bash block; `\\` continuations joined,
    comments dropped, `[...]` optional parts and lines with a placeholder (<...>, ..., RUN_DIR) left out."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                line = re.sub(r"\s*\[[^\]]*\]", "", line)
                m = re.match(r"^(?:\.venv/bin/|\$\(VENV\)/bin/)?readout\s+(.*)$", line)
                if m and not re.search(r"<[^>]*>|\.\.\.|\$|\|", m.group(1)):
                    out.append((page.name, m.group(1)))
    return out


COMMANDS = shell_commands()


def test_the_pages_hold_commands():
    assert len(COMMANDS) >= 20 and {p for p, _ in COMMANDS} >= {"README.md", "gap-study.md", "negation-audit.md"}


@pytest.mark.parametrize("page, line", COMMANDS, ids=[f"{p}:{line[:40]}" for p, line in COMMANDS])
def test_every_documented_command_parses(page, line):
    args = shlex.split(line)
    ctx = cli.make_context("readout", args)
    while isinstance(ctx.command, click.Group):
        name, cmd, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = cmd.make_context(name, rest, parent=ctx)
    assert ctx.command.name


def test_the_readme_quickstart_runs(tmp_path, capsys):
    """make readout (its command, on tiny-qwen2, two scenarios, short budgets), then stats and report."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make readout " in readme and "readout stats runs/smollm2-135m/gap-v2/quick-seed0" in readme
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^\t(\$\(VENV\)/bin/readout run --model .*)$", make, re.M).group(1)  # the plain branch of `readout:`
    args = shlex.split(recipe.replace("$(VENV)/bin/readout ", "").replace("$(MODEL)", "tiny-qwen2")
                       .replace("$(PANEL)", "gap-v2").replace("$(PROFILE)", "quick"))
    run = tmp_path / "runs" / "tiny-qwen2" / "gap-v2" / "quick-seed0"
    reduced = ["--limit", "2", "--readouts", "D,J", "--set", "j_budget=6", "--set", "j_samples=1", "--set", "orders.D=2",
               "--out", str(run), "--no-progress"]
    for argv in ([*args, *reduced], ["stats", str(run), "--n-boot", "20"], ["report", str(run)]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, err = capsys.readouterr()
        assert exc.value.code == 0, (argv, err[-2000:])
    assert (run / "stats" / "report.md").is_file() and 'class="card"' in (run / "report.html").read_text(encoding="utf-8")
