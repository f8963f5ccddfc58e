"""Requests to an OpenAI-compatible chat endpoint that survive the network: a concurrency limit, retries
with exponential backoff on 429, 5xx, timeouts and refused connections, and an on-disk cache of every
request and its reply, keyed by (endpoint model, messages, parameters, sample index).

A request found in the cache is never sent again: a killed run resumes without re-paying, and a rerun with
the same seed reads the cache. The API key is read from the environment variable the user names, sent only
in the Authorization header, and never written to the cache, a manifest or a log line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from engine.errors import ReadoutError

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
"""HTTP statuses retried with backoff (rate limits, overload, gateway and server errors)."""
SEEDED_PREFILL_CRASH = "CPU Generator does not use offset"
"""What vLLM's CPU build logs when a seeded request meets chunked prefill; its engine is dead afterwards."""
DEAD_ENGINE_SIGNS = ("EngineDeadError", "EngineCore encountered an issue", SEEDED_PREFILL_CRASH)
"""Text in a reply or a server log that says vLLM's engine process has died: every later request fails the same way,
so it is not retried."""
DEAD_ENGINE_HINT = ("its log says why (one known cause: vLLM's CPU build dies when seeded requests meet chunked prefill; "
                    "--no-enable-chunked-prefill avoids it)")


class ServedError(ReadoutError):
    """The endpoint cannot be used (unreachable after retries, refused a request, or lacks a capability)."""


@dataclass(frozen=True)
class ClientSettings:
    """How requests are sent."""

    concurrency: int = 4
    """Requests in flight at once."""
    retries: int = 5
    """Further tries of a request after a retryable failure."""
    backoff: float = 1.0
    """Seconds before the first retry; doubled each time (with jitter), or the server's Retry-After."""
    timeout: float = 120.0
    """Seconds a request may take before it counts as a retryable failure."""


def cache_key(model: str, url: str, body: dict, sample: int) -> str:
    """The cache key of one request: sha256 of the endpoint's model and address, the request body (messages
    and parameters) and the sample index, as canonical JSON."""
    ident = {"model": model, "url": url.rstrip("/"), "body": body, "sample": sample}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ReplyCache:
    """One JSON file per request (`<key[:2]>/<key>.json`, written atomically), holding the body and the reply."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root is not None else None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if self.root is None:
            return None
        path = self._path(key)
        try:
            return json.loads(path.read_text())["reply"]
        except (OSError, ValueError, KeyError):
            return None

    def put(self, key: str, body: dict, reply: dict) -> None:
        if self.root is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps({"body": body, "reply": reply}, ensure_ascii=False))
        os.replace(tmp, path)


class Client:
    """Posts chat-completion bodies to `<url>/chat/completions` (url ends in /v1 or the like)."""

    def __init__(self, url: str, model: str, key_env: str | None, cache: ReplyCache, settings: ClientSettings):
        self.url, self.model, self.cache, self.settings = url.rstrip("/"), model, cache, settings
        self.key_env = key_env
        if key_env is not None and not os.environ.get(key_env):
            raise ServedError(f"--api-key-env: the environment variable {key_env} is not set (or empty)")
        self.cache_identity = self.url
        """What stands for the endpoint in cache keys (its URL; a server the project starts on a free port: the
        identity of what it serves)."""
        self.sent = 0
        """Requests sent over the network by this client (cache hits not counted)."""
        self.cached = 0
        """Requests answered from the cache."""
        self._lock = threading.Lock()

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.key_env is not None:
            headers["Authorization"] = f"Bearer {os.environ[self.key_env]}"
        return headers

    def _once(self, path: str, body: dict | None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=self._headers(), method="GET" if body is None else "POST")
        with urllib.request.urlopen(req, timeout=self.settings.timeout) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise _Transient(f"reply is not JSON ({raw[:60]!r})") from None

    def request(self, path: str, body: dict | None) -> dict:
        """One request with retries; ServedError (one line) once they are spent or on a non-retryable status."""
        delay = self.settings.backoff
        last = ""
        for attempt in range(self.settings.retries + 1):
            if attempt:
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
            try:
                with self._lock:
                    self.sent += 1
                return self._once(path, body)
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if any(sign in detail for sign in DEAD_ENGINE_SIGNS):
                    raise ServedError(f"{self.url}{path}: the server's engine has died (HTTP {exc.code}: {detail}); "
                                      f"{DEAD_ENGINE_HINT}; finished requests are cached: the same command resumes") from None
                if exc.code not in RETRY_STATUS:
                    raise ServedError(f"{self.url}{path}: HTTP {exc.code} for model {self.model!r}: {detail}") from None
                last = f"HTTP {exc.code} {detail}"
                after = exc.headers.get("Retry-After") if exc.headers else None
                if after and after.replace(".", "", 1).isdigit():
                    delay = max(delay, float(after))
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, _Transient) as exc:
                last = str(getattr(exc, "reason", None) or exc)
        raise ServedError(f"{self.url}{path}: no usable reply after {self.settings.retries + 1} tries ({last}); "
                          "finished requests are cached: the same command resumes")

    def chat(self, body: dict, sample: int, accept=None) -> dict:
        """The reply to one chat-completion body (`ask` at /chat/completions)."""
        return self.ask("/chat/completions", body, sample, accept)

    def ask(self, path: str, body: dict, sample: int, accept=None) -> dict:
        """The reply to one body posted to `path`, from the cache when it holds it. A reply `accept(reply)`
        refuses is returned but not cached (a rerun asks again), and a cached one it refuses is asked for again."""
        key = self._key(path, body, sample)
        hit = self.cache.get(key)
        if hit is not None and (accept is None or accept(hit)):
            with self._lock:
                self.cached += 1
            return hit
        reply = self.request(path, body)
        if not isinstance(reply, dict) or "choices" not in reply:
            raise ServedError(f"{self.url}{path}: the reply has no 'choices' ({str(reply)[:80]})")
        if accept is None or accept(reply):
            self.cache.put(key, body, reply)
        return reply

    def _key(self, path: str, body: dict, sample: int) -> str:
        where = self.cache_identity if path == "/chat/completions" else f"{self.cache_identity}{path}"
        return cache_key(self.model, where, body, sample)

    def chat_many(self, items: Sequence[tuple[dict, int]], on_done=None, accept=None) -> list[dict]:
        """Replies to chat-completion (body, sample) pairs (`post_many` at /chat/completions)."""
        return self.post_many("/chat/completions", items, on_done, accept)

    def post_many(self, path: str, items: Sequence[tuple[dict, int]], on_done=None, accept=None) -> list[dict]:
        """Replies to (body, sample) pairs posted to `path`, `settings.concurrency` at a time, in order. Pairs with
        the same cache key (two readouts that read the same text) are sent once and share the reply. The first
        failure stops the rest (replies already received are in the cache)."""
        if not items:
            return []
        first: dict[str, int] = {}
        copies: dict[int, list[int]] = {}
        for i, (body, sample) in enumerate(items):
            j = first.setdefault(self._key(path, body, sample), i)
            copies.setdefault(j, []).append(i)
        out: list[dict | None] = [None] * len(items)

        def one(j):
            reply = self.ask(path, *items[j], accept=accept)
            for i in copies[j]:
                out[i] = reply
            if on_done is not None:
                on_done(len(copies[j]))

        with ThreadPoolExecutor(max_workers=max(1, self.settings.concurrency)) as pool:
            futures = [pool.submit(one, j) for j in copies]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        return out


class _Transient(Exception):
    """A reply that cannot be read (retried like a network failure)."""


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read().decode(errors="replace")
        msg = json.loads(text).get("error", text)
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        return " ".join(str(msg).split())[:160]
    except Exception:  # any unreadable error body: the status alone says enough
        return ""
