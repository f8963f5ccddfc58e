"""Servers the served-model tests start on the loopback address, and nothing else: the llama.cpp server
(`llama-server`, built by scripts/install_llama_server.sh into the venv) on the embedded SmolLM2 GGUF, and a
counting proxy in front of it that can inject faults (429/500, a stopped server, a malformed reply, a stall).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SERVER_ENV = "LLAMA_SERVER"
"""An explicit path to the llama-server binary (else <venv>/bin/llama-server, else PATH)."""
REQUIRE_ENV = "LOGIT_READOUT_REQUIRE_SERVER"
"""Set (by .ci/run) to make a missing llama-server a failure instead of a skip."""


def server_binary() -> str | None:
    explicit = os.environ.get(SERVER_ENV)
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return str(beside)
    return shutil.which("llama-server")


def require_binary() -> str:
    path = server_binary()
    if path is None:
        msg = "llama-server not installed (scripts/install_llama_server.sh; make install builds it)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on the embedded GGUF at 127.0.0.1:<port>; `stop()` and `start()` again on the same port."""

    def __init__(self, binary: str, gguf: Path, port: int | None = None, log: Path | None = None):
        self.binary, self.gguf, self.port = binary, gguf, port or free_port()
        self.log = log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 60.0) -> None:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [self.binary, "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port), "-c", "4096",
             "--parallel", "2", "-t", "2", "--no-webui", "--jinja",
             # the sampler is then the request's temperature and top-p alone (llama.cpp adds top-k 40, min-p 0.05)
             "--top-k", "0", "--min-p", "0"],
            stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} (log: {self.log})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not ready after {timeout} s (log: {self.log})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def body_key(raw: bytes) -> str:
    """A request body's identity for counting (its canonical JSON's sha256)."""
    return hashlib.sha256(json.dumps(json.loads(raw), sort_keys=True).encode()).hexdigest()


class FaultProxy:
    """A loopback HTTP proxy in front of an upstream server. It counts every chat request it forwards (by
    body), and, per request, may answer a fault instead: `fail` maps a 1-based request number to an HTTP
    status; `garble(body) -> bool` marks requests whose reply content is replaced by text no parser reads;
    `down` drops connections without a reply; `strip_logprobs` removes the replies' logprobs; `stall_after` N holds request N+1 onwards
    without forwarding until `release` is set."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.forwarded: dict[str, int] = {}
        self.received = 0
        self.fail: dict[int, int] = {}
        self.garble = None
        self.down = False
        self.strip_logprobs = False
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
                    if proxy.garble is not None and proxy.garble(json.loads(raw)):
                        reply = json.loads(data)
                        reply["choices"][0]["message"]["content"] = "Sure! I think the answer is probably yes, maybe."
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
