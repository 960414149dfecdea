"""The alert about the crash that ends the program is delivered at exit (bounded wait)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

CRASHING_DRIVER = textwrap.dedent(
    """
    import sys
    import twinkle_core
    from twinkle_core import DeviceGroup, remote_class, remote_function

    @remote_class()
    class Trainer:
        @remote_function(dispatch="all")
        def step(self):
            raise MemoryError("out of memory in step 1234")

    twinkle_core.initialize(mode="inprocess", name="crashing-run",
                            groups=[DeviceGroup("t", 1, "cpu")], notifier="dingtalk")
    Trainer(remote_group="t").step()()   # uncaught: the program dies here
    """
)

DIRECT_USE = textwrap.dedent(
    """
    import sys
    from twinkle_notify_dingtalk import DingTalkNotifier
    n = DingTalkNotifier(sys.argv[1], sys.argv[2], timeout=float(sys.argv[3]))
    n.send("direct", "sent right before exit")
    """
)


def _run(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc, time.monotonic() - started


def test_crash_alert_is_delivered_at_exit(robot, secret):
    import os

    env = {
        **os.environ,
        "TWINKLE_DINGTALK_WEBHOOK": robot.webhook,
        "TWINKLE_DINGTALK_SECRET": secret,
    }
    proc, _ = _run(CRASHING_DRIVER, env=env)
    assert proc.returncode == 1 and "MemoryError" in proc.stderr
    assert len(robot.requests) == 1 and robot.requests[0].ok
    assert "crashing-run" in robot.requests[0].title
    assert "MemoryError: out of memory in step 1234" in robot.requests[0].text


def test_direct_use_is_flushed_at_exit(robot, secret):
    proc, _ = _run(DIRECT_USE, robot.webhook, secret, "5")
    assert proc.returncode == 0, proc.stderr
    assert [r.title for r in robot.delivered] == ["direct"]


def test_exit_wait_is_bounded_when_the_robot_hangs(robot, secret):
    robot.delay = 30.0
    proc, elapsed = _run(DIRECT_USE, robot.webhook, secret, "1")
    assert proc.returncode == 0
    # Interpreter start-up plus at most 2 x timeout for the flush.
    assert elapsed < 2 * 1.0 + 3.0
    assert "not delivered" in proc.stderr or "gave up" in proc.stderr
    assert secret not in proc.stderr and robot.token not in proc.stderr
