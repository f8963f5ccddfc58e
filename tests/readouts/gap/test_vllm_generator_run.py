"""A gap run whose J rollouts vLLM draws (`--generator vllm`) on the embedded SmolLM2 in float32: every letter mass
it writes is a plain forward of the prompt and the drawn text, `readout stats` reads its tables, and a run stopped
after its first chunk resumes on a server started again (what the first session drew comes from the cache)."""

import dataclasses

import pandas as pd
import pytest
import torch

from readouts.driver import Interrupted
from readouts.options import Generation
from tests.helpers import TEST_PROFILE, cli, gap_run, get_model
from tests.served_helpers import SERVED_NAME

pytestmark = [pytest.mark.smollm, pytest.mark.served]
TOLERANCE = 1e-5
PROFILE = dataclasses.replace(TEST_PROFILE, name="vllm-test", max_units=4, j_budget=24, chunk_size=2)


@pytest.fixture()
def profile(monkeypatch):
    from readouts.gap import profile as gap_profile

    monkeypatch.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
    return PROFILE.name


def test_letter_masses_equal_a_plain_forward_of_the_drawn_text(served_server, profile, tmp_path, monkeypatch, capsys):
    import readouts.gap.recipe as recipe

    reads = []
    real = recipe.score_ids

    def recording(model, ids, letters, **kw):
        results = real(model, ids, letters, **kw)
        reads.extend(zip(ids, letters, results))
        return results

    monkeypatch.setattr(recipe, "score_ids", recording)
    generation = Generation("vllm", served_server.url, SERVED_NAME)
    path, _ = gap_run(tmp_path, model="smollm2-135m", readouts="J", profile=profile, generation=generation)
    probes = pd.read_parquet(path / "probes.parquet")
    j = probes[probes.readout == "J"]
    assert len(j) > 0 and (j.generated_tokens > 0).any()
    lm = get_model("smollm2-135m")
    worst, checked = 0.0, 0
    with torch.no_grad():
        for ids, letters, res in reads:
            if len(ids) <= min(len(i) for i, _, _ in reads):
                continue  # the shortest reads are prompts without drawn text
            probs = lm.model(input_ids=torch.tensor([list(ids)])).logits[0, -1].float().softmax(-1)
            plain = [float(probs[list(forms)].sum()) for forms in letters.token_ids]
            worst = max(worst, max(abs(a - b) for a, b in zip(plain, res.mass)))
            checked += 1
    assert checked >= len(j) // 2 and worst < TOLERANCE
    manifest = pd.read_json(path / "manifest.json", typ="series")
    assert manifest["engine"]["generator"]["name"] == "vllm"
    code, out, err = cli(["stats", str(path)], capsys)
    assert code in (0, None), err


def test_a_stopped_run_resumes_on_a_restarted_server(profile, tmp_path):
    with pytest.raises(Interrupted):
        gap_run(tmp_path, model="smollm2-135m", readouts="J", profile=profile, generation=Generation("vllm"),
                stop_after_chunks=1)
    path, logs = gap_run(tmp_path, model="smollm2-135m", readouts="J", profile=profile, generation=Generation("vllm"))
    manifest = pd.read_json(path / "manifest.json", typ="series")
    assert manifest["complete"] and manifest["last_session"]["computed_chunks"] == 1
    asked = manifest["generator"]["requests"]
    assert asked["sent"] + asked["from_cache"] > 0  # the resumed chunk's rollouts: drawn now, or by the first session
    assert (path / "vllm-server.log").is_file()


def test_sampled_texts_are_the_same_when_the_run_is_sharded(served_server, profile, tmp_path, monkeypatch):
    """The whole run, then its two shards merged, each asking vLLM afresh (another rollout cache): every J text,
    greedy and sampled, is the same (on this CPU vLLM's seeded draws do not depend on the batch they ran in)."""
    import engine.vllm_generation as vg
    from readouts.driver import merge_run

    generation = Generation("vllm", served_server.url, SERVED_NAME)
    caches = iter([tmp_path / "cache-whole", tmp_path / "cache-shards", tmp_path / "cache-shards"])
    monkeypatch.setattr(vg, "ReplyCache", lambda _root, real=vg.ReplyCache: real(next(caches)))
    whole, _ = gap_run(tmp_path, "whole", model="smollm2-135m", readouts="J", profile=profile, generation=generation)
    for k in range(2):
        gap_run(tmp_path, "sharded", model="smollm2-135m", readouts="J", profile=profile, generation=generation,
                shard=(k, 2))
    merged = merge_run(tmp_path / "sharded", log=lambda _line: None)
    key = ["probe_id"]
    a = pd.read_parquet(whole / "probes.parquet").query("readout == 'J'").sort_values(key)
    b = pd.read_parquet(merged / "probes.parquet").query("readout == 'J'").sort_values(key)
    assert len(a) == len(b) > 0 and (a.rollout > 0).any()
    assert a.generated_text.tolist() == b.generated_text.tolist()



def test_a_server_gone_mid_run_stops_it_in_one_line_and_the_same_command_resumes(served_server, profile, tmp_path,
                                                                                 monkeypatch):
    """A vLLM server the run is pointed at goes away after 6 rollouts: the run stops with one line saying the
    finished requests are cached; given the same command once the server is back, it completes without asking
    again for any rollout it had received."""
    import engine.vllm_generation as vg
    from engine.served_client import ServedError
    from tests.served_helpers import FaultProxy

    monkeypatch.setattr(vg, "ReplyCache", lambda _root, real=vg.ReplyCache: real(tmp_path / "rollouts"))  # nothing drawn yet
    proxy = FaultProxy(served_server.port)

    class DownAfter(dict):  # the proxy stops forwarding once 6 rollouts have come back through it
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            if sum(self.values()) >= 6:
                proxy.down = True

    proxy.forwarded = DownAfter()
    generation = Generation("vllm", f"http://127.0.0.1:{proxy.port}/v1", SERVED_NAME)
    try:
        with pytest.raises(ServedError) as err:
            gap_run(tmp_path, model="smollm2-135m", readouts="J", profile=profile, generation=generation)
        message = str(err.value)
        assert "\n" not in message and "finished requests are cached: the same command resumes" in message
        proxy.down = False
        path, _ = gap_run(tmp_path, model="smollm2-135m", readouts="J", profile=profile, generation=generation)
    finally:
        proxy.close()
    assert pd.read_json(path / "manifest.json", typ="series")["complete"]
    assert max(proxy.forwarded.values()) == 1, "a rollout was asked for twice"
