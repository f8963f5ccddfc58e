"""The request layer on loopback servers this test starts (no model server needed): a canned chat upstream behind
the fault proxy. Retries on 429/5xx and unreadable replies, a non-retryable status in one line, the cache
answering a repeated request, concurrency, and the key sent as a header but never stored."""

import json

import pytest

from engine.served_client import Client, ClientSettings, ReplyCache, ServedError
from tests.served_helpers import CannedServer, FaultProxy

FAST = ClientSettings(concurrency=3, retries=3, backoff=0.01, timeout=10)


@pytest.fixture(scope="module")
def upstream():
    seen = {"auth": []}

    def answer(body, headers):
        seen["auth"].append(headers.get("Authorization"))
        if body.get("garbage"):
            return b"<html>not json</html>"
        text = body["messages"][-1]["content"].upper()
        return json.dumps({"model": "canned-1", "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()

    server = CannedServer(answer)
    yield server.port, seen
    server.close()


def body(text, **extra):
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def test_retries_then_cache(upstream, tmp_path, monkeypatch):
    port, seen = upstream
    proxy = FaultProxy(port)
    proxy.fail = {1: 429, 2: 500, 4: 503}
    monkeypatch.setenv("CLIENT_TEST_KEY", "sk-secret-77")
    client = Client(proxy.url, "m", "CLIENT_TEST_KEY", ReplyCache(tmp_path), FAST)
    replies = client.chat_many([(body(f"q{i}"), i) for i in range(5)])
    assert [r["choices"][0]["message"]["content"] for r in replies] == [f"Q{i}" for i in range(5)]
    assert proxy.received == 5 + 3 and client.sent == 8
    assert seen["auth"][-1] == "Bearer sk-secret-77"
    again = Client(proxy.url, "m", "CLIENT_TEST_KEY", ReplyCache(tmp_path), FAST)
    assert again.chat_many([(body(f"q{i}"), i) for i in range(5)]) == replies
    assert again.sent == 0 and again.cached == 5 and proxy.received == 8
    assert all(b"sk-secret-77" not in p.read_bytes() for p in tmp_path.rglob("*.json"))
    proxy.close()


def test_unreadable_reply_is_retried_and_spent_retries_are_one_line(upstream, tmp_path):
    port, _ = upstream
    proxy = FaultProxy(port)
    client = Client(proxy.url, "m", None, ReplyCache(tmp_path), FAST)
    with pytest.raises(ServedError, match=r"no usable reply after 4 tries \(reply is not JSON") as exc:
        client.chat(body("x", garbage=True), 0)
    assert "\n" not in str(exc.value) and proxy.received == 4
    assert not list(tmp_path.rglob("*.json"))  # nothing cached for a failed request
    proxy.close()


def test_a_client_error_is_not_retried(upstream, tmp_path):
    port, _ = upstream
    proxy = FaultProxy(port)
    proxy.fail = {1: 400}
    client = Client(proxy.url, "m", None, ReplyCache(tmp_path), FAST)
    with pytest.raises(ServedError, match="HTTP 400 for model 'm': injected fault"):
        client.chat(body("x"), 0)
    assert proxy.received == 1
    proxy.close()


def test_missing_key_variable_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ServedError, match="NO_SUCH_KEY_VAR is not set"):
        Client("http://127.0.0.1:9/v1", "m", "NO_SUCH_KEY_VAR", ReplyCache(tmp_path), FAST)


def test_the_same_request_twice_in_one_batch_is_sent_once(upstream, tmp_path):
    """Two readouts that read the same text (a filler read cut where it ends) ask the same thing: one request,
    the reply given to both, and progress counts both."""
    port, _ = upstream
    proxy = FaultProxy(port)
    client = Client(proxy.url, "m", None, ReplyCache(tmp_path), FAST)
    done = []
    items = [(body("same"), 0), (body("other"), 0), (body("same"), 0), (body("same"), 1)]
    replies = client.chat_many(items, on_done=done.append)
    assert [r["choices"][0]["message"]["content"] for r in replies] == ["SAME", "OTHER", "SAME", "SAME"]
    assert proxy.chat_forwarded() == 3 and max(proxy.forwarded.values()) == 2  # sample 1 is its own request
    assert sum(done) == 4
    proxy.close()
