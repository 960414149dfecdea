"""DingTalk alerts from a real Ray job: 4 actors failing -> exactly one message.

The driver runs as its own process (it starts an embedded local Ray cluster) and dies of the
uncaught failure; the fake robot from tests/notify_dingtalk runs as another process.

The actors meet at a barrier (a small HTTP server in the test process) before raising, so they
fail together however loaded the machine is. How many of them the backend had seen fail when
it raised is its business (it may raise at the first failure and add later ones as notes):
the test asserts one alert per distinct error, not how the ranks were grouped.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _support import prestart
from _support.fake_dingtalk import SECRET, TOKEN, read_log, start_process
from _support.jobs import run_job

DRIVER = textwrap.dedent(
    """
    import json, os
    from twinkle_core import DeviceGroup, get_worker_context, initialize, remote_class
    from twinkle_core import remote_function

    def meet(barrier_url):
        # Wait until every actor arrived (the test's barrier server answers then), no proxy.
        import urllib.request
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open(barrier_url, timeout=180).read()

    @remote_class()
    class Rollout:
        @remote_function(dispatch="all", collect="none")
        def leaked(self):
            return sorted(k for k in os.environ if k.startswith("TWINKLE_DINGTALK_"))

        @remote_function(dispatch="all", collect="none")
        def generate(self, prompt, barrier_url):
            meet(barrier_url)
            raise ConnectionError(f"inference server refused prompt {prompt!r}")

    initialize("ray", name="ray-nightly", groups=[DeviceGroup("rollout", 4, "cpu")],
               notifier="dingtalk", num_cpus=4, object_store_memory=100 * 1024 * 1024)
    rollout = Rollout(remote_group="rollout")
    print("LEAKED " + json.dumps(rollout.leaked()()), flush=True)
    rollout.generate("hello", os.environ["BARRIER_URL"])()  # CALL-SITE: the driver dies here
    """
)


class BarrierServer:
    """`GET /` answers once `parties` requests are waiting (a barrier for other processes)."""

    def __init__(self, parties: int, timeout: float = 180.0) -> None:
        barrier = threading.Barrier(parties, timeout=timeout)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                try:
                    barrier.wait()
                    status, answer = 200, b"go"
                except threading.BrokenBarrierError:
                    status, answer = 503, b"not everybody arrived"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.barrier = barrier
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def __enter__(self) -> BarrierServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.barrier.abort()  # free anybody still waiting
        self.httpd.shutdown()
        self.httpd.server_close()


@prestart.fixture
def job(tmp_path_factory):
    """The driver's run against the fake robot, in the background from the session's start
    (tests/_support/prestart.py)."""
    tmp_path = tmp_path_factory.mktemp("dingtalk-ray")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    lines = DRIVER.splitlines()
    call_line = lines.index(next(ln for ln in lines if "CALL-SITE" in ln)) + 1
    server, port = start_process(str(tmp_path / "port"), str(tmp_path / "robot.jsonl"))
    try:
        with BarrierServer(4) as barrier:
            env = dict(
                os.environ,
                TWINKLE_DINGTALK_WEBHOOK=f"http://127.0.0.1:{port}/robot/send?access_token={TOKEN}",
                TWINKLE_DINGTALK_SECRET=SECRET,
                RAY_USAGE_STATS_ENABLED="0",
                BARRIER_URL=barrier.url,
                no_proxy="127.0.0.1,localhost",
            )
            env.pop("RAY_ADDRESS", None)  # never attach to another cluster on this machine
            job = run_job(
                [[sys.executable, str(driver)]],
                cwd=tmp_path,
                env=env,
                timeout=240,
                check_leftovers=False,
            )
            code, out = job.returncode, job.output
    finally:
        server.terminate()
        server.wait(10)
    return driver, call_line, code, out, read_log(str(tmp_path / "robot.jsonl"))


def test_four_failing_actors_send_exactly_one_message(job):
    driver, call_line, code, out, requests = job
    assert code == 1, out[-3000:]  # the uncaught failure ends the driver
    assert "LEAKED [[], [], [], []]" in out, out[-3000:]  # no secret reached an actor
    # Four actors, one distinct error: one alert, however the backend grouped the ranks (late
    # failures reach the runtime too, and are recognised as the same error).
    assert len(requests) == 1, (requests, out[-3000:])
    (msg,) = requests
    assert msg["errcode"] == 0, msg
    md = msg["body"]["markdown"]
    assert md["title"] == "twinkle run ray-nightly: Rollout.generate failed"
    text = md["text"]
    assert "(mode ray)" in text
    assert f"{driver}:{call_line}" in text
    # The ranks the backend had seen fail when it raised: at least one, only real ones.
    ranks_line = next(ln for ln in text.splitlines() if "**group / rank**" in ln)
    ranks = {int(r) for r in ranks_line.split("rollout / ")[1].split(", ")}
    assert ranks and ranks <= {0, 1, 2, 3}, ranks_line
    assert "\x1b" not in text  # Ray's coloured traceback header is cleaned for the chat
    assert "ConnectionError: inference server refused prompt 'hello'" in text
    assert "raise ConnectionError(" in text  # the end of the actor's traceback
    assert SECRET not in out and TOKEN not in out


def test_ray_never_forwards_dingtalk_credentials():
    # When the variables are still in the driver's environment (the user built the notifier
    # himself, or TWINKLE_DINGTALK_KEEP_ENV=1), the Ray backend's pass-through must skip them:
    # `select` decides both the actors' runtime_env and what an embedded cluster inherits.
    from twinkle_notify_dingtalk import SECRET_ENV_VARS
    from twinkle_ray.envvars import passthrough_patterns, select

    environ = {name: "credential" for name in SECRET_ENV_VARS}
    environ["TWINKLE_DINGTALK_KEYWORD"] = "kw"
    environ["TWINKLE_MODE"] = "ray"
    forwarded = select(environ, passthrough_patterns())
    assert "TWINKLE_MODE" in forwarded  # twinkle's own settings do travel
    assert not [k for k in forwarded if k.startswith("TWINKLE_DINGTALK_")], forwarded
