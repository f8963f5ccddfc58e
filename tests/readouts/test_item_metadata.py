"""A user's own item metadata rides along to every output row, and probe files come as JSONL, CSV or parquet:
the three formats give the same probes and the same scores; bad tables get one line naming file, row, column."""

import dataclasses
import json

import pandas as pd
import pytest

from cli.main import main
from contract.metadata import METADATA, decode_metadata
from contract.tables import NSI_CONTINUOUS, NSI_REPLIES, PROBES, SCENARIOS
from engine.errors import ProbeInputError
from panels.records import PanelError
from panels.schema import load_panel
from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.gap.study import GapStudy
from readouts.probes_io import read_probes
from tests.helpers import ROOT

EXAMPLES = ROOT / "examples"
PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="meta-test", max_units=2,
                              orders={"D": 2, "J0": 2, "control": 2, "raw": 2}, j_samples=0, j_budget=4,
                              dose_budget=4, dose_brief_budget=2, dose_samples=0, chunk_size=2)


def _cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_csv_and_parquet_probes_equal_the_jsonl_ones(tmp_path):
    jsonl = read_probes(EXAMPLES / "probes.jsonl")
    csv = read_probes(EXAMPLES / "probes.csv")
    df = pd.read_csv(EXAMPLES / "probes.csv", dtype=str, keep_default_na=False)
    # Parquet with native types: messages as a list of structs, letters as a list, one metadata struct column.
    pq = df.assign(messages=[json.loads(m) if m else None for m in df.messages],
                   letters=[s.split(",") for s in df.letters], system=df.system.replace("", None),
                   text=df.text.replace("", None),
                   metadata=[{"source": s, "frame": f} for s, f in zip(df["metadata.source"], df["metadata.frame"])])
    pq = pq.drop(columns=["metadata.source", "metadata.frame"])
    pq.to_parquet(tmp_path / "p.parquet")
    parquet = read_probes(tmp_path / "p.parquet")
    assert len(jsonl) == len(csv) == len(parquet) == 5
    for a, b, c in zip(jsonl, csv, parquet):
        assert (a.id, a.prompt, a.letters) == (b.id, b.prompt, b.letters) == (c.id, c.prompt, c.letters)
        assert dict(b.metadata) == dict(c.metadata) == {"source": "examples/probes.jsonl", "frame": a.id.split("-")[0]}
    assert csv[1].where.endswith("probes.csv:row 2")


def test_score_echoes_metadata_and_tables_score_like_jsonl(tmp_path, capsys):
    outs = {}
    for name in ("probes.jsonl", "probes.csv"):
        out = tmp_path / f"{name}.scores.jsonl"
        code, _, err = _cli(["score", str(EXAMPLES / name), "--model", "tiny-llama3", "--out", str(out)], capsys)
        assert code == 0, err
        outs[name] = [json.loads(line) for line in out.read_text().splitlines()]
    for a, b in zip(outs["probes.jsonl"], outs["probes.csv"]):
        assert METADATA not in a and b[METADATA] == {"source": "examples/probes.jsonl", "frame": a["id"].split("-")[0]}
        assert {k: v for k, v in b.items() if k != METADATA} == a


@pytest.mark.parametrize("header, row, needle", [
    ("id,text,letters,colour", "a,Pick,\"A,B\",red", "p.csv:row 1: colour: unknown field"),
    ("id,messages,letters", "a,[{oops,\"A,B\"", "p.csv:row 1: messages: not valid JSON"),
    ("id,text,letters,metadata,metadata.x", "a,Pick,\"A,B\",{},1", "p.csv: metadata: give either"),
    ("id,text,letters,metadata", "a,Pick,\"A,B\",[1]", "p.csv:row 1: metadata: must be an object"),
    ("id,text,letters", "a,Pick,A", "p.csv:row 1: letters: must be a list of at least 2"),
])
def test_bad_tables_fail_on_one_line(tmp_path, header, row, needle):
    (tmp_path / "p.csv").write_text(f"{header}\n{row}\n")
    with pytest.raises(ProbeInputError) as exc:
        read_probes(tmp_path / "p.csv")
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def _panel_with_metadata(tmp_path, source, n, meta):
    lines = (ROOT / "panels" / "data" / source).read_text().splitlines()[:n]
    objs = [json.loads(line) for line in lines]
    for obj, m in zip(objs, meta):
        if m is not None:
            obj[METADATA] = m
    path = tmp_path / source.replace(".jsonl", "-meta.jsonl")
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path, [o["id"] for o in objs]


def test_panel_metadata_is_checked(tmp_path):
    path, _ = _panel_with_metadata(tmp_path, "gap-v1.jsonl", 1, [{"source": ["a", "b"]}])
    with pytest.raises(PanelError, match=r"gap-v1-meta.jsonl:1: metadata.source: must be a string, number"):
        load_panel(str(path), review=False)


def test_gap_run_carries_scenario_metadata_to_every_row(tmp_path, monkeypatch):
    monkeypatch.setitem(gap_profile.PROFILES, "meta-test", PROFILE)
    meta = [{"source": "ethics-bench", "item": 17, "hard": True}, None]
    path, ids = _panel_with_metadata(tmp_path, "gap-v1.jsonl", 2, meta)
    options = RunOptions(model=ModelOptions("tiny-qwen2"), panel=str(path), profile="meta-test",
                         out=str(tmp_path / "run"), progress=False)
    run_dir = run_study(GapStudy(readouts="D,J"), options, log=lambda line: None)
    expect = dict(zip(ids, meta))
    for table in (SCENARIOS, PROBES):
        df = pd.read_parquet(run_dir / table.file)
        assert METADATA in df.columns and set(df.scenario_id) == set(ids)
        for sid, text in zip(df.scenario_id, df[METADATA]):
            assert decode_metadata(text) == (expect[sid] or {}), (table.name, sid)
    from stats.gap import analyze

    per = analyze(str(run_dir), n_boot=50).per_scenario
    assert {sid: decode_metadata(t) for sid, t in zip(per.scenario_id, per[METADATA])} == {
        sid: m or {} for sid, m in expect.items()}
    # A table written before the column existed reads with the column null.
    old = pd.read_parquet(run_dir / SCENARIOS.file).drop(columns=[METADATA])
    old.to_parquet(run_dir / SCENARIOS.file)
    assert analyze(str(run_dir), n_boot=50).per_scenario[METADATA].isna().all()


def test_nsi_run_carries_dilemma_metadata(tmp_path, capsys):
    path, ids = _panel_with_metadata(tmp_path, "nsi-14.jsonl", 1, [{"source": "paper", "n": 1.5}])
    code, _, err = _cli(["nsi", "--model", "tiny-llama3", "--panel", str(path), "--profile", "quick",
                         "--samples", "1", "--set", "max_units=1", "--out", str(tmp_path / "nsi")], capsys)
    assert code == 0, err
    for table in (NSI_REPLIES, NSI_CONTINUOUS):
        df = pd.read_parquet(tmp_path / "nsi" / table.file)
        assert len(df) and all(decode_metadata(t) == {"source": "paper", "n": 1.5} for t in df[METADATA])
