"""Served models end to end against a real OpenAI-compatible server: vLLM (CPU) on the embedded SmolLM2,
started on 127.0.0.1 behind a counting, fault-injecting loopback proxy (tests/served_helpers.py).
No request goes anywhere else.

The NSI and gap J quick runs write tables that `nsi-stats` / `stats` read like a local run's; a killed run
resumes without re-sending a request; a stopped server ends the run in one line and a later run resumes;
injected 429/500 are retried; a malformed reply is a parse failure; a server without logprobs is refused; a read
whose logprobs come back null (vLLM's NaN) stops the run in one line and the same command resumes.
"""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pandas as pd
import pytest

from cli.main import main
from tests.helpers import ROOT
from tests.served_helpers import SERVED_NAME, FaultProxy

pytestmark = [pytest.mark.smollm, pytest.mark.served]
KEY_VALUE = "sk-test-never-recorded-4f1c"
QUICK_NSI = ["--limit", "2", "--set", "samples=1", "--set", "budget=40"]


@pytest.fixture
def server(served_server):
    return served_server


@pytest.fixture
def proxy(server):
    p = FaultProxy(server.port)
    yield p
    p.close()


@dataclass
class Result:
    exit_code: int
    output: str
    """stdout and stderr together."""
    err: str


@pytest.fixture
def readout(capsys, monkeypatch):
    """`readout ARGS` as the console script runs it (errors: one line on stderr, exit 2)."""
    monkeypatch.setenv("SERVED_TEST_KEY", KEY_VALUE)

    def call(args):
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out, err = capsys.readouterr()
        return Result(exc.value.code, out + err, err)
    return call


def served_args(proxy, tmp_path, *extra, name="run", cache="cache", retries=2):
    return ["--model", f"openai:{SERVED_NAME}@{proxy.url}", "--api-key-env", "SERVED_TEST_KEY", "--out", str(tmp_path / name),
            "--served-cache", str(tmp_path / cache), "--no-progress", "--retries", str(retries), "--backoff", "0.05", *extra]


def test_nsi_quick_run_reads_like_a_local_run_and_a_rerun_reads_the_cache(server, proxy, tmp_path, readout):
    res = readout(["nsi", *served_args(proxy, tmp_path), *QUICK_NSI])
    assert res.exit_code == 0, res.output
    run = tmp_path / "run"
    replies = pd.read_parquet(run / "nsi_replies.parquet")
    cont = pd.read_parquet(run / "nsi_continuous.parquet")
    assert len(replies) == 2 * 4 * 2 and len(cont) == 2 * 4
    assert set(replies.temperature) == {0.0, 0.7}
    assert replies.text.str.len().gt(0).all()
    assert cont.top_k.eq(20).all() and cont.unseen_mass.between(0, 1).all() and cont.token_bound.notna().all()
    seen = cont[cont.outside_top_k == ""]
    assert len(seen) and seen.p_agree.between(0, 1).all()
    assert cont[cont.outside_top_k != ""].p_agree.isna().all()  # outside the top k: unknown, not zero
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["model"]["served"] is True and manifest["model"]["name"] == "smollm2"
    assert manifest["model"]["served_id"] and manifest["served"]["url"] == proxy.url
    assert manifest["last_session"]["requests"]["sent"] == proxy.chat_forwarded() == 2 * 4 * 2 + 2 * 4 + 1
    # The key's value is in no file the run wrote (manifest, tables, cache).
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY_VALUE.encode() not in path.read_bytes(), path
    stats = readout(["nsi-stats", str(run)])
    assert stats.exit_code == 0, stats.output
    assert (run / "stats").is_dir()
    # A second run with the same seed into a fresh directory sends nothing: every reply is in the cache.
    before = proxy.chat_forwarded()
    again = readout(["nsi", *served_args(proxy, tmp_path, name="again"), *QUICK_NSI])
    assert again.exit_code == 0, again.output
    assert proxy.chat_forwarded() == before
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "again" / "nsi_replies.parquet"), replies)


def test_killed_run_resumes_without_sending_a_request_twice(server, proxy, tmp_path, readout):
    proxy.stall_after = 12  # request 13 onwards is held: the run is mid-chunk when it is killed
    args = served_args(proxy, tmp_path, "--concurrency", "2")
    env = {**os.environ, "SERVED_TEST_KEY": KEY_VALUE}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "nsi", *args, *QUICK_NSI], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while proxy.stalled_count < 2 and time.time() < deadline:  # both workers held: nothing is in flight upstream
        time.sleep(0.05)
    assert proxy.stalled_count == 2, "the run never reached the stall"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "run" / "nsi_replies.parquet").exists()
    sent_before = proxy.chat_forwarded()
    assert sent_before == 12
    proxy.stall_after = None
    proxy.release.set()
    res = readout(["nsi", *args, *QUICK_NSI])
    assert res.exit_code == 0, res.output
    assert max(proxy.forwarded.values()) == 1, "a request was sent twice"
    assert proxy.chat_forwarded() == 2 * 4 * 2 + 2 * 4 + 1
    assert len(pd.read_parquet(tmp_path / "run" / "nsi_replies.parquet")) == 16


def test_server_stopped_mid_run_stops_in_one_line_and_resumes(server, proxy, tmp_path, readout):
    stopped = {"done": False}
    real_forward = proxy.forwarded

    class StopAt(dict):  # stops the real server once 10 chat replies have come back through the proxy
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            if sum(self.values()) == 10 and not stopped["done"]:
                stopped["done"] = True
                server.stop()

    proxy.forwarded = StopAt(real_forward)
    try:
        res = readout(["nsi", *served_args(proxy, tmp_path), *QUICK_NSI])
        assert res.exit_code == 2
        lines = res.err.strip().splitlines()
        # Requests in flight when the engine is stopped are answered HTTP 500 by the dying server (named as a dead
        # engine, not retried); those sent after it find no server (retried, then given up).
        gone = "no usable reply after 3 tries" in lines[0] or "the server's engine has died" in lines[0]
        assert len(lines) == 1 and lines[0].startswith("error:") and gone and "resumes" in lines[0], res.output
    finally:
        server.start()
    res = readout(["nsi", *served_args(proxy, tmp_path), *QUICK_NSI])
    assert res.exit_code == 0, res.output
    assert max(proxy.forwarded.values()) == 1
    assert proxy.chat_forwarded() == 2 * 4 * 2 + 2 * 4 + 1


def test_injected_429_and_500_are_retried(server, proxy, tmp_path, readout):
    proxy.fail = {2: 429, 3: 500, 7: 503}
    # Four tries: which request meets which fault depends on the concurrent requests' timing, and one request may
    # meet all three (requests 2 and 3, then 7 after its backoff); three tries would then be spent.
    res = readout(["nsi", *served_args(proxy, tmp_path, retries=3), "--limit", "1", "--set", "samples=0", "--set", "budget=24"])
    assert res.exit_code == 0, res.output
    assert proxy.received == proxy.chat_forwarded() + 3
    assert len(pd.read_parquet(tmp_path / "run" / "nsi_replies.parquet")) == 4


def test_malformed_reply_is_a_parse_failure(server, proxy, tmp_path, readout):
    proxy.garble = lambda body: body["max_tokens"] > 1 and body["temperature"] == 0.0
    res = readout(["nsi", *served_args(proxy, tmp_path), "--limit", "1", "--set", "samples=1", "--set", "budget=24"])
    assert res.exit_code == 0, res.output
    replies = pd.read_parquet(tmp_path / "run" / "nsi_replies.parquet")
    greedy = replies[replies["sample"] == 0]
    assert len(greedy) == 4 and not greedy.parse_ok.any() and greedy.parse_error.notna().all()
    assert greedy.endorse.isna().all()


def test_server_without_logprobs_is_refused_before_any_run_request(server, proxy, tmp_path, readout):
    proxy.strip_logprobs = True
    res = readout(["nsi", *served_args(proxy, tmp_path), *QUICK_NSI])
    assert res.exit_code == 2
    assert "returns no logprobs" in res.err and len(res.err.strip().splitlines()) == 1, res.output
    assert proxy.chat_forwarded() == 1  # the capability check only


def test_a_read_from_nan_logits_stops_the_run_in_one_line_and_it_resumes(server, proxy, tmp_path, readout):
    """One D read's reply comes back with every logprob null (vLLM's NaN): the run stops naming it and the chunk,
    caches every other reply, and the same command, the server fixed, sends only that read again."""
    picked = {}

    def one_read(body):
        if body["max_tokens"] != 1 or body["messages"][-1]["content"] == "Say A.":  # not the capability check
            return False
        key = json.dumps(body, sort_keys=True)
        return picked.setdefault("key", key) == key

    proxy.null_logprobs = one_read
    args = ["run", *served_args(proxy, tmp_path), "--readouts", "D", "--limit", "2", "--set", "orders.D=2"]
    res = readout(args)
    assert res.exit_code == 2, res.output
    assert len(res.err.strip().splitlines()) == 1 and "chunk 1/1: " in res.err, res.err
    assert "(NaN, above 0, or all null) at generated token 1 of 1" in res.err and "the same command resumes" in res.err
    assert not (tmp_path / "run" / "probes.parquet").exists()
    sent = proxy.chat_forwarded()
    proxy.null_logprobs = None
    res = readout(args)
    assert res.exit_code == 0, res.output
    assert proxy.chat_forwarded() == sent + 1, "only the refused read is asked again"
    probes = pd.read_parquet(tmp_path / "run" / "probes.parquet")
    assert len(probes) == 2 * 2 * 2 and probes.p_violating.between(0, 1).all()


def test_gap_quick_run_reads_like_a_local_run(server, proxy, tmp_path, readout):
    res = readout(["run", *served_args(proxy, tmp_path), "--readouts", "D,J", "--limit", "2",
                   "--set", "j_samples=1", "--set", "j_budget=32", "--set", "orders.D=2"])
    assert res.exit_code == 0, res.output
    run = tmp_path / "run"
    probes = pd.read_parquet(run / "probes.parquet")
    j = probes[probes.readout == "J"]
    assert len(j) and j.anchor_rule.notna().all() and j.generated_text.notna().all()
    assert probes.top_k.eq(20).all() and probes.unseen_mass.notna().all()
    inside = probes[probes.outside_top_k == ""]
    assert inside.p_violating.between(0, 1).all()
    assert probes[probes.outside_top_k != ""].p_violating.isna().all()
    stats = readout(["stats", str(run), "--n-boot", "200"])
    assert stats.exit_code == 0, stats.output


def test_gap_first_token_and_dose_readouts_run_served(server, proxy, tmp_path, readout):
    """J0, the known-gap control and every dose arm on one scenario: the arms' generations and reads go through
    the served runner, and each arm writes its rows with the served bound columns."""
    res = readout(["run", *served_args(proxy, tmp_path), "--readouts", "J0,control,dose", "--limit", "1",
                   "--set", "dose_budget=16", "--set", "dose_brief_budget=8", "--set", "dose_samples=0"])
    assert res.exit_code == 0, res.output
    probes = pd.read_parquet(tmp_path / "run" / "probes.parquet")
    assert {"J0", "control"} <= set(probes.readout)
    dose = probes[probes.readout.str.startswith("dose")]
    assert dose.frame.nunique() >= 4, sorted(dose.frame.unique())  # reasoning, filler, truncated, brief, norm ...
    generated = dose[dose.generated_tokens.notna()]
    assert len(generated) and generated.generated_text.notna().all()
    assert probes.top_k.eq(20).all() and probes.unseen_mass.between(0, 1).all()
    assert probes[probes.outside_top_k != ""].p_violating.isna().all()
    twice = [proxy.bodies[k] for k, n in proxy.forwarded.items() if n > 1]
    assert not twice, twice  # no request sent twice
