"""`--plan` for a served model: the requests the study's own served runner would send, counted without a server
(the endpoint below has nothing listening: a request sent would fail the test), and the cache's share."""

import pytest

from cli.main import main
from engine.served import ServedModel, ServedSpec

NOWHERE = "http://127.0.0.1:9/v1"


def plan(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    return out


def test_nsi_plan_counts_the_runs_requests(tmp_path, capsys):
    out = plan(["nsi", "--model", f"openai:m@{NOWHERE}", "--limit", "2", "--set", "samples=3", "--set", "budget=50",
                "--served-cache", str(tmp_path), "--plan"], capsys)
    assert "generation requests: 32 (0 already in the cache)" in out  # 2 dilemmas x 4 framings x (1 + 3)
    assert "1,600 completion tokens at most" in out
    assert "read requests: 8 (0 already in the cache)" in out
    assert "total: 40 requests, 40 to send" in out


def test_plan_counts_what_the_cache_holds(tmp_path, capsys):
    from engine.sampling import derive_seed
    from panels.frames import render_polarity
    from panels.schema import load_panel

    sm = ServedModel(ServedSpec(name="m", url=NOWHERE, cache=str(tmp_path)))
    d = load_panel("nsi-14").records[0]
    body = sm.body(render_polarity(d, "F0").messages, max_tokens=50, temperature=0.0, top_p=1.0,
                   seed=derive_seed(42, d.id, "F0", 0))
    from engine.served_client import cache_key
    from readouts.nsi.recipe import DECISION_PREFIX

    sm.client.cache.put(cache_key("m", NOWHERE, body, 0), body, {"choices": []})
    # Replies a run would not take from the cache (it asks again) are not counted: a generation whose logprobs are
    # all null (a model's NaN logits), and a read without logprobs.
    other = sm.body(render_polarity(d, "F1").messages, max_tokens=50, temperature=0.0, top_p=1.0,
                    seed=derive_seed(42, d.id, "F1", 0))
    null = {"token": "A", "logprob": None, "top_logprobs": [{"token": "A", "logprob": None}]}
    sm.client.cache.put(cache_key("m", NOWHERE, other, 0), other, {"choices": [{"logprobs": {"content": [null]}}]})
    read = sm.read_bodies(render_polarity(d, "F0").messages, DECISION_PREFIX)
    sm.client.cache.put(cache_key("m", NOWHERE, read, 0), read, {"choices": [{"message": {"content": "agree"}}]})
    out = plan(["nsi", "--model", f"openai:m@{NOWHERE}", "--limit", "1", "--set", "samples=0", "--set", "budget=50",
                "--served-cache", str(tmp_path), "--plan"], capsys)
    assert "generation requests: 4 (1 already in the cache)" in out
    assert "read requests: 4 (0 already in the cache)" in out
    assert "total: 8 requests, 7 to send" in out


def test_gap_plan_refuses_raw_on_a_served_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", f"openai:m@{NOWHERE}", "--readouts", "D,raw", "--served-cache", str(tmp_path), "--plan"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "raw not available on a served model" in err and len(err.strip().splitlines()) == 1
