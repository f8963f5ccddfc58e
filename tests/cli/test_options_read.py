"""Every option a command accepts is read, and an option a command would ignore is refused in one line (exit 2).

A command's options are of two kinds: its own, which are parameters of its function, and the shared groups
(cli/options.py: the model, the run, the plan, a sweep's loading), which reach the function as one built value.
The checks, on every command the `readout` group holds:
- each option is a parameter of the command's function or of one of the groups it takes;
- each parameter of the function (a group's value included) is used in the function's body;
- each group's builder reads every value it is given.
"""

import ast
import inspect
import textwrap

import click
import pytest

from cli.main import cli, main
from cli.options import Group


def commands(group: click.Group = cli, prefix: str = "readout") -> list[tuple[str, click.Command]]:
    out = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        out += commands(command, path) if isinstance(command, click.Group) else [(path, command)]
    return out


COMMANDS = commands()


def groups_of(command: click.Command) -> tuple[Group, ...]:
    return getattr(command.callback, "groups", ())


def names_used(function) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    return {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}


class Reads(dict):
    """A dict that records which keys were read (by [], get or pop)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def pop(self, key, *default):
        self.read.add(key)
        return super().pop(key, *default)


def test_every_command_is_checked():
    assert len(COMMANDS) >= 20 and {"readout sweep", "readout steer", "readout run", "readout lens train"} <= dict(COMMANDS).keys()


@pytest.mark.parametrize("path, command", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_option_is_a_parameter_of_the_command_or_of_a_group_it_takes(path, command):
    function = inspect.unwrap(command.callback)
    own = set(inspect.signature(function).parameters)
    grouped = {name for g in groups_of(command) for name in g.params}
    params = {p.name for p in command.params}
    assert params - own - grouped == set(), f"{path}: options no parameter takes"
    assert own - params - {g.name for g in groups_of(command)} == set(), f"{path}: parameters no option fills"


@pytest.mark.parametrize("path, command", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_parameter_is_used_by_the_command(path, command):
    function = inspect.unwrap(command.callback)
    unused = set(inspect.signature(function).parameters) - names_used(function)
    assert not unused, f"{path}: parameters its function never reads: {sorted(unused)}"


GROUPS = {id(g): (path, g) for path, command in COMMANDS for g in groups_of(command)}


@pytest.mark.parametrize("path, group", GROUPS.values(), ids=[f"{p}:{g.name}" for p, g in GROUPS.values()])
def test_each_group_reads_every_value(path, group):
    values = Reads(parsed(group, ["--model", "tiny-qwen2"] if "model" in group.params else []))
    group.build(values)
    assert values.read == set(group.params), f"{path}: {group.name} ignores {sorted(set(group.params) - values.read)}"


def parsed(group: Group, args: list[str]) -> dict:
    """The group's values as click parses `args` (defaults for the rest)."""
    def probe():
        pass
    for option in group.options:
        option(probe)
    command = click.Command("probe", params=list(reversed(probe.__click_params__)))
    return dict(command.make_context("probe", args).params)


def test_a_builder_that_skips_a_value_is_caught():
    group = Group("x", (click.option("--a"), click.option("--b")), lambda v: v["a"])
    values = Reads({"a": 1, "b": 2})
    group.build(values)
    assert values.read != set(group.params)


@pytest.mark.parametrize("argv, says", [
    (["sweep", "--window", "2", "-m", "tiny-qwen2", "-o", "x"], "No such option '--window'"),
    (["sweep", "--shard", "0/2", "-m", "tiny-qwen2", "-o", "x"], "No such option '--shard'"),
    (["sweep", "--endpoint", "http://127.0.0.1:1/v1", "-m", "tiny-qwen2", "-o", "x"], "No such option '--endpoint'"),
    (["sweep", "--plan", "-m", "tiny-qwen2", "-o", "x"], "No such option '--plan'"),
    (["steer", "--window", "2", "-m", "tiny-qwen2", "--layers", "1"], "No such option '--window'"),
    (["steer", "--concurrency", "3", "-m", "tiny-qwen2", "--layers", "1"], "No such option '--concurrency'"),
    (["score", "p.jsonl", "-o", "x", "-m", "tiny-qwen2", "--endpoint", "http://127.0.0.1:1/v1"], "No such option '--endpoint'"),
    (["run", "-m", "tiny-qwen2", "--concurrency", "8"], "--concurrency: read for served models only"),
    (["nsi", "-m", "tiny-qwen2", "--top-logprobs", "5"], "--top-logprobs: read for served models only"),
    (["run", "-m", "openai:m@http://127.0.0.1:1/v1", "--dtype", "bfloat16"], "--dtype: the served model 'm' loads nothing here"),
    (["run", "-m", "tiny-qwen2", "--gpu", "h100"], "--gpu: names the GPU of a --plan estimate; give it with --plan"),
    (["panels", "show", "gap-v1", "x", "-f", "agent", "--models", "m.toml"], "--models: registry files resolve --model"),
    (["run", "-m", "tiny-qwen2", "--generator-url", "http://127.0.0.1:1/v1", "--generator-model", "m"],
     "--generator-url: reads a vLLM server; give it with --generator vllm"),
    (["nsi", "-m", "tiny-qwen2", "--generator", "vllm", "--generator-url", "http://127.0.0.1:1/v1"],
     "--generator-url and --generator-model go together"),
    (["run", "-m", "openai:m@http://127.0.0.1:1/v1", "--generator", "vllm"], "--generator: a served model draws its own"),
    (["steer", "-m", "tiny-qwen2", "--layers", "1", "--generator", "vllm"], "No such option '--generator'"),
])
def test_an_option_a_command_would_ignore_is_refused_in_one_line(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()  # nothing ran
