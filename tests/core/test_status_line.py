"""On a terminal, a driver waiting for a slow call shows one live status line on stderr.

Each test runs a driver in a fresh interpreter whose stderr is a real pseudo-terminal (or a
pipe), on a small backend plugin whose call finishes when the test says so: the test releases
it only after it has seen the status line, so nothing depends on the machine's speed.
"""

from __future__ import annotations

import logging
import os
import pty
import select
import subprocess
import sys
import textwrap
import threading
import time

import pytest

DRIVER = textwrap.dedent(
    """
    import sys, threading
    from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
    from twinkle_core.plugin import CompletedCall, ExecutionBackend, PendingCall, WorkerGroup
    from twinkle_core.plugin import hookimpl
    from twinkle_core.plugins import plugin_system

    release = threading.Event()
    OWNS = sys.argv[1] == "owner"
    HOLD = float(sys.argv[2])  # 0: until a line arrives on stdin

    class Held(PendingCall):
        def __init__(self, n):
            self.n = n
        def done(self):
            return release.is_set()
        def wait(self, timeout):
            assert release.wait(60), "never released"
            return [7] * self.n

    class Group(WorkerGroup):
        def submit(self, call):
            return Held(len(call.calls))

    class Backend(ExecutionBackend):
        name = "held"
        @property
        def owns_console(self):
            return OWNS
        def create_workers(self, cls, group, device_mesh, args, kwargs, *, num_workers):
            return Group(group, device_mesh, cls.__name__, num_workers)

    class Plugin:
        @hookimpl
        def register_backends(self, register):
            register("held", Backend)

    @remote_class()
    class Job:
        @remote_function(dispatch="all", collect="first")
        def slow(self):
            return 7

    if HOLD:
        threading.Timer(HOLD, release.set).start()
    else:
        threading.Thread(target=lambda: (sys.stdin.readline(), release.set()), daemon=True).start()
    plugin_system().add(Plugin(), "held-backend")
    initialize("held", groups=[DeviceGroup("g", 2)])
    value = Job(remote_group="g").slow()()
    sys.stderr.write(f"AFTER {value}\\n")
    sys.stderr.flush()
    shutdown()
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINKLE_")}
    env.update(TERM="xterm", TWINKLE_WAIT_LOG_INTERVAL="600", **extra)
    return env


def _read_until(fd: int, marker: bytes, seen: bytearray, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{marker!r} never appeared on the terminal; got {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                assert marker in seen, f"{marker!r} never appeared; got {bytes(seen)!r}"
            seen.extend(chunk)


def _run_on_terminal(tmp_path, owner: str, hold: float, **env: str) -> bytes:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    master, slave = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, str(script), owner, str(hold)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=_env(**env),
    )
    os.close(slave)
    seen = bytearray()
    try:
        if not hold:
            _read_until(master, b"twinkle: waiting for Job.slow on group 'g'", seen)
            child.stdin.write(b"go\n")
            child.stdin.flush()
        _read_until(master, b"AFTER 7", seen)
        assert child.wait(60) == 0
    finally:
        child.kill()
        os.close(master)
    return bytes(seen)


def test_a_slow_call_shows_a_status_line_that_is_erased_when_it_ends(tmp_path):
    out = _run_on_terminal(tmp_path, "owner", 0)
    status = out.index(b"twinkle: waiting for Job.slow on group 'g' (called at")
    assert out[status - 5 : status] == b"\r\x1b[2K", "the line is not drawn in place"
    assert b"driver.py:" in out[status:], "the status line does not name the call site"
    after = out.index(b"AFTER 7")
    assert b"\r\x1b[2K" in out[status:after], "the status line was not erased before user output"
    between = out[out.rindex(b"\r\x1b[2K", status, after) : after]
    assert b"waiting" not in between


@pytest.mark.parametrize(
    ("owner", "setting"),
    [("owner", "0"), ("other", "auto")],
    ids=["TWINKLE_STATUS_LINE=0", "backend-does-not-own-the-console"],
)
def test_no_status_line_when_turned_off_or_not_the_console_owner(tmp_path, owner, setting):
    out = _run_on_terminal(tmp_path, owner, 2.5, TWINKLE_STATUS_LINE=setting)
    assert b"AFTER 7" in out
    assert b"twinkle: waiting" not in out
    assert b"\x1b[2K" not in out


def test_no_status_line_when_stderr_is_not_a_terminal(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, str(script), "owner", "2.5"],
        capture_output=True,
        env=_env(),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert b"AFTER 7" in done.stderr
    assert b"twinkle: waiting" not in done.stderr and b"\x1b[2K" not in done.stderr


def test_a_wait_registered_without_logging_shows_but_never_logs(monkeypatch, caplog):
    """`waiting_for(..., log=False)`: for backends that log their own detailed lines."""
    from twinkle_core.slow_calls import waiting_for

    monkeypatch.setenv("TWINKLE_WAIT_LOG_INTERVAL", "0.05")
    caplog.set_level(logging.INFO, logger="twinkle.wait")

    def logged(what: str) -> int:
        return sum(what in r.getMessage() for r in caplog.records if r.name == "twinkle.wait")

    with waiting_for("the quiet one", log=False), waiting_for("the loud one"):
        deadline = time.monotonic() + 60
        while logged("the loud one") < 3:
            assert time.monotonic() < deadline, "the logged wait was never reported"
            time.sleep(0.05)
    assert logged("the quiet one") == 0


def test_a_draw_decided_after_the_last_wait_ended_writes_nothing(monkeypatch):
    """The watcher draws from a copy of the waits; if the last one ended meanwhile (its
    `clear` found nothing shown yet), the draw must not put a stale line on the terminal."""
    import io

    from twinkle_core.slow_calls import _CLEAR, _StatusLine

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    line = _StatusLine()
    line.show("twinkle: waiting for a call: 1 s", lambda: False)  # the wait ended first
    line.clear()
    assert err.getvalue() == ""
    line.show("twinkle: waiting for a call: 1 s", lambda: True)  # still waiting: drawn
    line.clear()  # the wait ends: erased
    assert err.getvalue() == _CLEAR + "twinkle: waiting for a call: 1 s" + _CLEAR


def test_a_wait_ending_while_the_line_is_drawn_erases_it(monkeypatch):
    """The other order: the wait ends while the draw holds the line's lock. Its `clear` sees
    the line marked shown, waits for the draw, then erases it."""
    import io

    from twinkle_core.slow_calls import _CLEAR, _StatusLine

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    line = _StatusLine()
    ended = threading.Thread(target=line.clear)

    def still_waiting() -> bool:
        ended.start()  # the wait ends now, on another thread, while the draw is decided
        ended.join(0.2)  # it blocks on the line's lock (or has not reached it yet)
        return True

    line.show("twinkle: waiting for a call: 1 s", still_waiting)
    ended.join(30)
    assert not ended.is_alive()
    assert err.getvalue() == _CLEAR + "twinkle: waiting for a call: 1 s" + _CLEAR
