"""User registry files (`--models FILE`, LOGIT_READOUT_MODELS): aliases and lineages added in models.toml's format,
validated in one line naming the file, alias and field; a built-in alias is shadowed only with `override = true`;
`readout models` lists user entries with their file; a run's manifest names the registry file and its sha256."""

import hashlib
import json
import os
import shutil

import pytest

from cli.main import main
from engine.registry import (
    BUILTIN,
    USER_MODELS_ENV,
    RegistryError,
    registry,
    resolve,
)
from engine.tiny import ensure_tiny


@pytest.fixture(autouse=True)
def _no_user_files(monkeypatch):
    monkeypatch.delenv(USER_MODELS_ENV, raising=False)


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def write(path, text):
    path.write_text(text)
    return path


MINE = """
["my-rl-200"]
source = "hub"
hf_id = "allenai/Olmo-3-7B-Instruct"
revision = "step_200"
lineage = "olmo-3-7b"
stage = "rl-200"

["my-ckpt"]
source = "local"
path = "ckpt"
lineage = "mine"
stage = "step-1000"
"""


def test_user_file_adds_aliases_with_their_file(tmp_path):
    f = write(tmp_path / "models.toml", MINE)
    assert "my-rl-200" not in registry()
    spec = resolve("my-rl-200", [f])
    assert (spec.hf_id, spec.revision, spec.lineage, spec.stage) == ("allenai/Olmo-3-7B-Instruct", "step_200", "olmo-3-7b", "rl-200")
    assert spec.registry_file == str(f) and spec.registry_sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert resolve("my-ckpt", [f]).path == str(tmp_path / "ckpt")  # relative to the file's folder
    assert resolve("olmo-3-7b", [f]).registry_file == BUILTIN  # built-ins stay
    assert "my-rl-200" in registry([f]) and "my-rl-200" not in registry()  # the cache is keyed by the files in force


def test_environment_variable_and_edits_are_read_afresh(tmp_path, monkeypatch):
    a = write(tmp_path / "a.toml", '["alias-a"]\nsource = "hub"\nhf_id = "org/a"\n')
    b = write(tmp_path / "b.toml", '["alias-b"]\nsource = "hub"\nhf_id = "org/b"\n')
    monkeypatch.setenv(USER_MODELS_ENV, os.pathsep.join([str(a), str(b)]))
    assert {"alias-a", "alias-b"} <= set(registry())
    write(b, '["alias-c"]\nsource = "hub"\nhf_id = "org/c"\nchat = true\n')  # same file, other content
    assert "alias-c" in registry() and "alias-b" not in registry()
    monkeypatch.setenv(USER_MODELS_ENV, str(tmp_path / "gone.toml"))
    with pytest.raises(RegistryError, match=f"{USER_MODELS_ENV}: .*gone.toml: no such registry file"):
        registry()


def test_shadowing_a_built_in_alias_needs_override(tmp_path):
    f = write(tmp_path / "m.toml", '["tiny-llama3"]\nsource = "tiny"\nfamily = "qwen2"\n')
    with pytest.raises(RegistryError) as err:
        registry([f])
    assert str(err.value).startswith(f"{f}: [tiny-llama3]: alias already defined in {BUILTIN}") and "override = true" in str(err.value)
    write(f, '["tiny-llama3"]\nsource = "tiny"\nfamily = "qwen2"\noverride = true\n')
    assert resolve("tiny-llama3", [f]).family == "qwen2" and resolve("tiny-llama3", [f]).registry_file == str(f)
    write(f, '["no-such"]\nsource = "hub"\nhf_id = "org/x"\noverride = true\n')
    with pytest.raises(RegistryError, match=r"\[no-such\] override: there is no earlier alias"):
        registry([f])


@pytest.mark.parametrize("text, message", [
    ('["x"]\nsource = "hub"\nhf_id = "a/b"\ncolour = "red"\n', r"\[x\] colour: unknown field; allowed: source"),
    ('["x"]\nsource = "cloud"\n', r"\[x\] source: must be one of hub, tiny, embedded, local"),
    ('["x"]\nsource = "hub"\n', r"\[x\] hf_id: required for a hub model"),
    ('["x"]\nsource = "hub"\nhf_id = "a/b"\nchat = "yes"\n', r"\[x\] chat: must be true or false"),
    ('["x"]\nsource = "hub"\nhf_id = "a/b"\nstage = "sft"\n', r"\[x\] lineage: lineage and stage go together"),
    ('["x"]\nsource = "hub"\nhf_id = "a/b"\nlineage = "l"\nstage = "two words"\n', r"\[x\] stage: 'two words' must be a name"),
    ('["x"]\nsource = "tiny"\nfamily = "llama3"\n', r"\[x\] source: tiny models are built in by name"),
    ('["x"]\nsource = "local"\npath = "p"\nrevision = "main"\n', r"\[x\] revision: applies to hub models only"),
    ('x = 1\n', r"\[x\]: must be a table of fields"),
    ('["x"\nsource = "tiny"\n', r"not valid TOML"),
])
def test_bad_entries_name_the_file_alias_and_field(tmp_path, capsys, text, message):
    f = write(tmp_path / "bad.toml", text)
    with pytest.raises(RegistryError, match=message) as err:
        registry([f])
    assert str(err.value).startswith(str(f)) and "\n" not in str(err.value)
    code, _, stderr = run(["models", "--models", str(f)], capsys)
    assert code == 2 and stderr.count("\n") == 1 and str(f) in stderr and "Traceback" not in stderr


def test_models_lists_user_entries_with_their_file(tmp_path, capsys):
    f = write(tmp_path / "models.toml", MINE)
    code, out, _ = run(["models", "--models", str(f)], capsys)
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert f"[{f}]" in lines["my-rl-200"] and f"[{f}]" in lines["my-ckpt"]
    assert str(f) not in lines["tiny-llama3"]


def test_run_manifest_names_the_registry_file(tmp_path, capsys):
    shutil.copytree(ensure_tiny("tiny-llama3"), tmp_path / "ckpt")
    f = write(tmp_path / "models.toml", MINE)
    out = tmp_path / "run"
    code, _, err = run(["run", "--models", str(f), "--model", "my-ckpt", "--readouts", "D", "--limit", "2",
                        "--set", "orders.D=1", "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model_registry"] == {"file": str(f), "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    assert (manifest["model"]["name"], manifest["model"]["lineage"], manifest["model"]["stage"]) == ("my-ckpt", "mine", "step-1000")
    assert manifest["model"]["path"] == str((tmp_path / "ckpt").resolve())
    code, _, err = run(["run", "--model", "my-ckpt", "--out", str(tmp_path / "r2")], capsys)  # no file: unknown alias
    assert code == 2 and "unknown model 'my-ckpt'" in err


def test_a_registered_folder_that_is_missing_is_named_with_its_file(tmp_path, capsys):
    f = write(tmp_path / "models.toml", MINE)  # my-ckpt points at tmp_path/ckpt, which does not exist
    code, out, _ = run(["models", "--models", str(f)], capsys)
    assert code == 0 and f"no folder at {tmp_path / 'ckpt'}" in out
    (tmp_path / "p.jsonl").write_text('{"id": 1, "text": "Pick", "letters": ["A", "B"]}\n')
    code, _, err = run(["score", str(tmp_path / "p.jsonl"), "--model", "my-ckpt", "--models", str(f),
                        "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"the local folder {tmp_path / 'ckpt'} does not exist (registered in {f})" in err
