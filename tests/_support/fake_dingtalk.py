"""A local stand-in for DingTalk's custom-robot endpoint (``POST /robot/send``).

It checks what the real robot checks and answers with DingTalk's error codes:

- ``access_token`` must match (errcode 300001 "token is not exist" otherwise);
- with a secret: ``timestamp`` (ms) within one hour of now and ``sign`` equal to
  base64(HMAC-SHA256(secret, f"{timestamp}\\n{secret}")) (errcode 310000 otherwise);
- with a keyword: the keyword must appear in the message (310000 "keywords not in content");
- a body over 20000 bytes is refused (460101 "message too long, exceed 20000 bytes");
- more than ``rate_limit`` messages within ``rate_window`` seconds: 130101 "send too fast".

It can also be told to be slow (``delay`` seconds before answering), to hold every request
until the test lets it answer (``block()`` / ``release()``: a robot that never answers, with no
timing guesses), to always throttle, or to fail the next N requests with HTTP 500. Use it
in-process (``FakeDingTalk().start()``) or as a standalone process for tests whose notifier
lives in another process (torchrun ranks, Ray):

    python tests/_support/fake_dingtalk.py --port-file PORT --log LOG.jsonl \
        [--token T] [--secret S] ...

The standalone server writes its port to --port-file once listening, appends one JSON line per
request to --log, and exits on SIGTERM/SIGINT or after --max-lifetime seconds.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "fake-token-0123456789abcdef"
SECRET = "SECfake0123456789secret"
TIMESTAMP_WINDOW_MS = 3600 * 1000
MAX_BODY_BYTES = 20000


def expected_sign(timestamp: str, secret: str) -> str:
    message = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), message, hashlib.sha256).digest()).decode()


@dataclass
class Request:
    """One request the server answered."""

    path: str
    query: dict[str, str]
    body: Any
    size: int
    errcode: int
    errmsg: str
    http_status: int
    received: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.errcode == 0 and self.http_status == 200

    @property
    def title(self) -> str:
        return self.body["markdown"]["title"]

    @property
    def text(self) -> str:
        return self.body["markdown"]["text"]

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "query": self.query,
            "body": self.body,
            "size": self.size,
            "errcode": self.errcode,
            "errmsg": self.errmsg,
            "http_status": self.http_status,
            "received": self.received,
        }


class FakeDingTalk:
    """The fake robot: configuration, behaviour switches and the requests it saw."""

    def __init__(
        self,
        token: str = TOKEN,
        secret: str | None = SECRET,
        keyword: str | None = None,
        *,
        rate_limit: int = 20,
        rate_window: float = 60.0,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | None = None,
    ) -> None:
        self.token = token
        self.secret = secret
        self.keyword = keyword
        self.rate_limit = rate_limit
        self.rate_window = rate_window
        self.delay = 0.0
        #: Cleared by `block()`: requests wait here (at most `max_block` s) until `release()`.
        self.gate = threading.Event()
        self.gate.set()
        self.max_block = 120.0
        #: Requests that arrived while the gate was closed (answered or not).
        self.held = 0
        self.always_throttle = False
        self.fail_next_http = 0
        self.throttle_next = 0
        self.requests: list[Request] = []
        self.log_path = log_path
        self._accepted_times: list[float] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def webhook(self) -> str:
        return f"http://127.0.0.1:{self.port}/robot/send?access_token={self.token}"

    def start(self) -> FakeDingTalk:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()  # let held requests end
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeDingTalk:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def block(self) -> None:
        """Hold every request from now on, unanswered, until `release()`."""
        self.gate.clear()

    def release(self) -> None:
        """Let held and later requests be answered."""
        self.gate.set()

    # ------------------------------------------------------------------ queries
    @property
    def delivered(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.ok]

    def wait_for(self, count: int, timeout: float = 10.0, delivered: bool = True) -> list[Request]:
        """Wait until `count` requests (delivered ones by default) arrived; return them."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                got = [r for r in self.requests if r.ok or not delivered]
                remaining = deadline - time.monotonic()
                if len(got) >= count or remaining <= 0:
                    return got
                self._arrived.wait(remaining)

    def wait_held(self, count: int, timeout: float = 30.0) -> bool:
        """Wait until `count` requests arrived at the closed gate; whether they did."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.held >= count, timeout)

    # ------------------------------------------------------------------ the robot
    def judge(self, path: str, query: dict[str, str], raw: bytes) -> tuple[int, int, str, Any]:
        """(http status, errcode, errmsg, parsed body) for one request, as DingTalk answers."""
        if path != "/robot/send":
            return 404, 404, "not found", None
        if self.fail_next_http > 0:
            self.fail_next_http -= 1
            return 500, -1, "system busy", None
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return 200, 40035, "invalid json body", None
        if query.get("access_token") != self.token:
            return 200, 300001, "token is not exist", body
        if self.secret is not None:
            timestamp, sign = query.get("timestamp"), query.get("sign")
            if not timestamp or not sign:
                return 200, 310000, "sign not match, more: [missing timestamp or sign]", body
            try:
                skew = abs(int(timestamp) - time.time() * 1000)
            except ValueError:
                return 200, 310000, "invalid timestamp", body
            if skew > TIMESTAMP_WINDOW_MS:
                return 200, 310000, "invalid timestamp (more than 1 hour from now)", body
            if not hmac.compare_digest(sign, expected_sign(timestamp, self.secret)):
                return 200, 310000, "sign not match", body
        if len(raw) > MAX_BODY_BYTES:
            return 200, 460101, "message too long, exceed 20000 bytes", body
        if not isinstance(body, dict) or body.get("msgtype") not in ("text", "markdown"):
            return 200, 40035, "unsupported msgtype", body
        if body["msgtype"] == "markdown":
            md = body.get("markdown") or {}
            if not isinstance(md.get("title"), str) or not isinstance(md.get("text"), str):
                return 200, 40035, "markdown needs title and text", body
            content = md["text"]
        else:
            content = (body.get("text") or {}).get("content", "")
        if self.keyword is not None and self.keyword not in content:
            return 200, 310000, "keywords not in content", body
        now = time.monotonic()
        self._accepted_times = [t for t in self._accepted_times if t > now - self.rate_window]
        if self.always_throttle or self.throttle_next > 0:
            self.throttle_next = max(0, self.throttle_next - 1)
            return 200, 130101, "send too fast, exceed 20 times per minute", body
        if len(self._accepted_times) >= self.rate_limit:
            return 200, 130101, "send too fast, exceed 20 times per minute", body
        self._accepted_times.append(now)
        return 200, 0, "ok", body

    def _record(self, request: Request) -> None:
        with self._arrived:
            self.requests.append(request)
            self._arrived.notify_all()
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(request.as_json()) + "\n")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                if not server.gate.is_set():
                    with server._arrived:
                        server.held += 1
                        server._arrived.notify_all()
                    server.gate.wait(server.max_block)
                if server.delay:
                    time.sleep(server.delay)
                with server._lock:
                    status, errcode, errmsg, body = server.judge(parts.path, query, raw)
                server._record(Request(parts.path, query, body, len(raw), errcode, errmsg, status))
                answer = json.dumps({"errcode": errcode, "errmsg": errmsg}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json;charset=UTF-8")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the client gave up (timeout): nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler


def read_log(path: str) -> list[dict[str, Any]]:
    """The requests a standalone server logged (one JSON object per line)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def start_process(
    port_file: str, log_path: str, *args: str, timeout: float = 10.0, python: str = sys.executable
):
    """Start the server as a subprocess; returns (process, port). The caller must stop it."""
    import subprocess

    proc = subprocess.Popen(
        [python, os.path.abspath(__file__), "--port-file", port_file, "--log", log_path, *args]
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            with open(port_file) as f:
                return proc, int(f.read().strip())
        if proc.poll() is not None:
            raise RuntimeError(f"fake DingTalk server exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"fake DingTalk server did not start within {timeout}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True, help="append one JSON line per request here")
    parser.add_argument("--token", default=TOKEN)
    parser.add_argument("--secret", default=SECRET, help="'' for a robot without signing")
    parser.add_argument("--keyword", default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--rate-limit", type=int, default=20)
    parser.add_argument("--always-throttle", action="store_true")
    parser.add_argument("--max-lifetime", type=float, default=600.0)
    args = parser.parse_args(argv)
    server = FakeDingTalk(
        args.token,
        args.secret or None,
        args.keyword,
        rate_limit=args.rate_limit,
        port=args.port,
        log_path=args.log,
    )
    server.delay = args.delay
    server.always_throttle = args.always_throttle
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.port))
    os.replace(tmp, args.port_file)
    stop.wait(args.max_lifetime)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
