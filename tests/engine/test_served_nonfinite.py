"""A served model whose logits were NaN or infinite: its logprobs at a position come back all null (vLLM writes a NaN
as null) or NaN, and the read is refused in one line instead of being written as NaN masses or as letters "outside
the top k"; so is any logprob no softmax gives (NaN, above 0). A null beside readable numbers is a token of
probability 0 (the llama.cpp server writes log 0 as null) and is left out. The refused reply is never cached; every
other reply of the batch is, so the same command resumes. On loopback servers this test starts (no model server
needed)."""

import json
import math

import pytest

from engine.errors import NonFiniteLogitsError
from engine.served import ServedModel, ServedSpec, _reply, unreadable_position
from engine.served_client import ClientSettings, ReplyCache, cache_key
from tests.served_helpers import CannedServer

FAST = ClientSettings(concurrency=2, retries=1, backoff=0.01, timeout=10)
NULL, NAN, INF = None, math.nan, math.inf


def position(token, logprob, top):
    """One generated token's logprobs entry: its own logprob and (text, logprob) alternatives."""
    return {"token": token, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": x} for t, x in top]}


def raw(*positions, text="A"):
    return {"model": "canned-1", "choices": [{"message": {"content": text}, "finish_reason": "stop",
                                              "logprobs": {"content": list(positions)}}]}


GOOD = position("A", math.log(0.6), [("A", math.log(0.6)), ("B", math.log(0.3))])


@pytest.mark.parametrize("bad", [NULL, NAN, INF])
def test_a_position_with_no_readable_number_is_found(bad):
    broken = position("A", bad, [("A", bad), ("B", bad)])
    assert unreadable_position(raw(broken)) == 0
    assert unreadable_position(raw(GOOD, GOOD, broken, GOOD)) == 2
    assert unreadable_position(raw(GOOD, GOOD)) is None


def test_a_null_beside_readable_numbers_is_a_probability_of_zero_and_left_out():
    # The token's own logprob and two alternatives are readable: the nulls are llama.cpp's log 0, not broken logits.
    zeros = position("A", math.log(0.7), [("A", math.log(0.7)), ("B", NULL), ("C", NULL), ("D", -math.inf)])
    assert unreadable_position(raw(zeros)) is None
    top = _reply(raw(zeros)).tokens[0].top
    assert [t for t, _ in top] == ["A", "D"] and top[0][1] == pytest.approx(0.7) and top[1][1] == 0.0
    # Rounding just above 0 at p = 1 is read (as p slightly above 1), not refused.
    assert unreadable_position(raw(position("A", 1e-7, [("A", 1e-7)]))) is None


@pytest.mark.parametrize("bad", [NAN, INF, 0.5, True, "-0.1"])
def test_a_logprob_no_softmax_gives_is_refused_even_beside_readable_ones(bad):
    # Only null has a meaning beside readable numbers (log 0); a NaN, a log-probability above 0, or what is not a
    # number is a server's or a model's fault, never a smaller letter mass.
    odd = position("A", math.log(0.7), [("A", math.log(0.7)), ("B", bad), ("C", math.log(0.1))])
    assert unreadable_position(raw(GOOD, odd)) == 1


def test_a_json_integer_past_a_floats_range_is_read_not_raised():
    # JSON has integers of any length and json.loads keeps them exact: one far below 0 is a probability of 0, one far
    # above 0 is refused like any logprob above 0; neither may raise OverflowError on the way to a float.
    huge = "1" + "0" * 400
    text = json.dumps(raw(position("A", math.log(0.6), [("A", math.log(0.6)), ("B", 0), ("C", 0)])))
    low = json.loads(text.replace('"B", "logprob": 0', f'"B", "logprob": -{huge}'))
    assert unreadable_position(low) is None
    assert dict(_reply(low).tokens[0].top)["B"] == 0.0
    high = json.loads(text.replace('"C", "logprob": 0', f'"C", "logprob": {huge}'))
    assert isinstance(high["choices"][0]["logprobs"]["content"][0]["top_logprobs"][2]["logprob"], int)
    assert unreadable_position(high) == 0


def test_a_reply_without_logprobs_is_not_broken():
    assert unreadable_position({"choices": [{"message": {"content": "hi"}}]}) is None
    assert unreadable_position(raw({"token": "A", "top_logprobs": []})) is None


@pytest.fixture
def upstream():
    """Replies to a read with the letters' logprobs; a message holding "BROKEN" gets every number set to `bad`
    (while `state["broken"]` holds), and `state["sent"]` counts the requests."""
    state = {"broken": True, "bad": None, "sent": 0}

    def answer(body, headers):
        state["sent"] += 1
        broken = state["broken"] and "BROKEN" in body["messages"][-1]["content"]
        x = (lambda v: state["bad"]) if broken else (lambda v: v)
        n = body["max_tokens"]
        pos = [position("A", x(math.log(0.6)), [("A", x(math.log(0.6))), ("B", x(math.log(0.3)))]) for _ in range(n)]
        if broken and n > 1:  # a generation whose logits turn NaN at its third token
            pos[:2] = [GOOD, GOOD]
        return json.dumps(raw(*pos, text="A" * n)).encode()  # json writes a NaN or an inf as NaN / Infinity

    server = CannedServer(answer)
    yield f"http://127.0.0.1:{server.port}/v1", state
    server.close()


def served(url, cache):
    return ServedModel(ServedSpec(name="canned", url=url, cache=str(cache), client=FAST))


def reads(*texts):
    return [([{"role": "user", "content": t}], None) for t in texts]


@pytest.mark.parametrize("bad", [NULL, NAN, INF])
def test_a_broken_read_stops_in_one_line_and_the_others_are_cached(upstream, tmp_path, bad):
    url, state = upstream
    state["bad"] = bad
    asked = reads("Pick a letter.", "Pick one: BROKEN case here", "Pick again.", "And once more.")
    with pytest.raises(NonFiniteLogitsError) as exc:
        served(url, tmp_path).read(asked)
    msg = str(exc.value)
    assert "\n" not in msg and "'canned'" in msg and "(NaN, above 0, or all null) at generated token 1 of 1" in msg
    assert "sample 0" in msg and "'Pick one: BROKEN case here'" in msg and "the same command resumes" in msg
    assert state["sent"] == 4
    assert len(list(tmp_path.rglob("*.json"))) == 3, "every reply but the broken one is cached"
    # The server fixed, the same reads send only the one that was refused.
    state["broken"] = False
    again = served(url, tmp_path)
    replies = again.read(asked)
    assert state["sent"] == 5 and again.client.sent == 1 and again.client.cached == 3
    assert [dict(r.tokens[0].top)["A"] for r in replies] == [pytest.approx(0.6)] * 4


def test_a_generation_broken_at_its_third_token_is_named(upstream, tmp_path):
    url, state = upstream
    sm = served(url, tmp_path)
    body = sm.body([{"role": "user", "content": "Reason, BROKEN."}], max_tokens=5, temperature=0.7, seed=3, logprobs=True)
    with pytest.raises(NonFiniteLogitsError, match=r"generated token 3 of 5 \(sample 2,"):
        sm.complete([(body, 2)])
    assert not list(tmp_path.rglob("*.json")), "a generation read from broken logits must not be cached"


def test_a_broken_reply_in_the_cache_is_asked_for_again(upstream, tmp_path):
    # A reply cached before replies were checked: refused from the cache, asked again, and the fixed answer kept.
    url, state = upstream
    sm = served(url, tmp_path)
    body = sm.read_bodies(reads("Pick a letter.")[0][0])
    ReplyCache(tmp_path).put(cache_key("canned", url, body, 0), body, raw(position("A", NULL, [("A", NULL)])))
    (reply,) = sm.read(reads("Pick a letter."))
    assert sm.client.sent == 1 and dict(reply.tokens[0].top)["A"] == pytest.approx(0.6)
    assert unreadable_position(ReplyCache(tmp_path).get(cache_key("canned", url, body, 0))) is None


def test_a_read_without_logprobs_is_not_cached_and_a_cached_one_is_asked_again(upstream, tmp_path):
    # A server that dropped logprobs once (or an older cache that kept such a reply) must not pin a run to it.
    url, state = upstream
    sm = served(url, tmp_path)
    body = sm.read_bodies(reads("Pick a letter.")[0][0])
    key = cache_key("canned", url, body, 0)
    bare = {"model": "canned-1", "choices": [{"message": {"content": "A"}, "finish_reason": "stop"}]}
    ReplyCache(tmp_path).put(key, body, bare)
    (reply,) = sm.read(reads("Pick a letter."))
    assert sm.client.sent == 1 and dict(reply.tokens[0].top)["A"] == pytest.approx(0.6)
    assert ReplyCache(tmp_path).get(key) != bare
    # A generation (not a read) without logprobs is kept as it is.
    gen = sm.body([{"role": "user", "content": "Reason."}], max_tokens=3, temperature=0.7, seed=1)
    ReplyCache(tmp_path).put(cache_key("canned", url, gen, 1), gen, bare)
    assert sm.complete([(gen, 1)])[0].text == "A" and sm.client.sent == 1


def test_the_capability_check_says_broken_logits_not_missing_logprobs(upstream, tmp_path, monkeypatch):
    url, state = upstream
    sm = served(url, tmp_path)
    monkeypatch.setattr(sm, "body", lambda messages, **kw: ServedModel.body(sm, [{"role": "user", "content": "BROKEN"}], **kw))
    with pytest.raises(NonFiniteLogitsError, match="NaN or infinite"):
        sm.check_logprobs()
    assert not list(tmp_path.rglob("*.json"))
