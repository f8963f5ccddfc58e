"""Small commands and their one-line errors: `--version`, `compare --role` names the form it parses, a CUDA device
on a CPU-only torch is one line, `readout panels list` names every shipped panel, and a panel summary's quartiles stay
inside the data."""

import json

import pytest
import torch

from engine.errors import ReadoutError
from engine.loading import check_device, load_model
from readouts.panel_tools import quartile_line
from tests.helpers import MSG, cli


def test_version(capsys):
    code, out, _ = cli(["--version"], capsys)
    assert code == 0 and out.startswith("readout (logit-readout) ")


def test_compare_role_names_the_form_it_parses(tmp_path, capsys):
    code, out, _ = cli(["compare", "--help"], capsys)
    assert code == 0 and "RUN_DIR=lineage:stage" in out
    code, _, err = cli(["compare", str(tmp_path), "--out", str(tmp_path / "o"), "--role", f"{tmp_path}=sft"], capsys)
    assert code == 2 and "must look like RUN_DIR=lineage:stage" in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_on_a_cpu_only_torch_is_one_line(tmp_path, capsys):
    with pytest.raises(ReadoutError, match=r"--device: 'cuda' asked for, but this torch .* use --device cpu"):
        check_device("cuda")
    with pytest.raises(ReadoutError, match="--device: 'cuda:1'"):
        load_model("tiny-qwen2", device="cuda:1")
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "messages": MSG, "letters": ["A", "B"]}) + "\n")
    code, _, err = cli(["score", str(probes), "--model", "tiny-qwen2", "--out", str(probes) + ".out", "--device", "cuda"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--device: 'cuda'" in err
    check_device("cpu")


def test_quartiles_stay_inside_the_data():
    # Two values: the exclusive method would put q1 at 0 and q3 at 12, outside [2, 10].
    line = quartile_line([2, 10])
    q = dict(part.split() for part in line.split(", "))
    assert float(q["min"]) <= float(q["q1"]) <= float(q["median"]) <= float(q["q3"]) <= float(q["max"])
    assert quartile_line([5]) == "5 (one scenario)" and quartile_line([]) == "no scenarios"


def test_panels_list_names_every_shipped_panel(capsys):
    code, out, _ = cli(["panels", "list"], capsys)
    lines = {line.split()[0]: line.split() for line in out.splitlines()}
    assert code == 0 and set(lines) == {"gap-v1", "gap-v2", "gap-v2x", "nsi-14"}
    assert lines["gap-v2"][1:3] == ["gap", "248"] and lines["nsi-14"][1:3] == ["nsi", "14"]
    assert lines["gap-v2x"][1:3] == ["gap", "208"]
