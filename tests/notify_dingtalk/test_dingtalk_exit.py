"""The alert about the crash that ends the program is delivered at exit (bounded wait).

Waits are measured inside the child (from just before the alert to the last exit hook), so
interpreter start-up on a loaded machine does not count.
"""

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
    import atexit, sys, time
    # Registered first, so it runs last: after every hook of twinkle and the notifier.
    atexit.register(lambda: print(f"EXIT-WAIT {time.monotonic() - t0:.3f}", file=sys.stderr))
    from twinkle_notify_dingtalk import DingTalkNotifier
    n = DingTalkNotifier(sys.argv[1], sys.argv[2], timeout=float(sys.argv[3]))
    t0 = time.monotonic()
    n.send("direct", "sent right before exit")
    """
)

CRASH_WITH_HANGING_ROBOT = textwrap.dedent(
    """
    import atexit, sys, time
    atexit.register(lambda: print(f"EXIT-WAIT {time.monotonic() - t0:.3f}", file=sys.stderr))
    import twinkle_core
    from twinkle_core import DeviceGroup, remote_class, remote_function
    from twinkle_notify_dingtalk import DingTalkNotifier

    @remote_class()
    class Trainer:
        @remote_function(dispatch="all")
        def step(self):
            raise MemoryError("out of memory in step 1234")

    twinkle_core.initialize(mode="inprocess", name="hanging-robot",
                            groups=[DeviceGroup("t", 1, "cpu")],
                            notifier=DingTalkNotifier(sys.argv[1], sys.argv[2], timeout=60))
    t0 = time.monotonic()
    Trainer(remote_group="t").step()()   # uncaught; exit runs shutdown() (timeout 10 s)
    """
)


def _exit_wait(stderr: str) -> float:
    return float(stderr.split("EXIT-WAIT ")[1].split()[0])


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
    robot.block()  # never answers while the child runs
    proc, _ = _run(DIRECT_USE, robot.webhook, secret, "1")
    assert proc.returncode == 0, proc.stderr
    # send() gives the alert its timeout=1 s; nothing else waits at exit.
    assert _exit_wait(proc.stderr) < 1.0 + 1.5, proc.stderr
    assert "not delivered" in proc.stderr
    assert secret not in proc.stderr and robot.token not in proc.stderr


def test_crash_exit_waits_shutdowns_timeout_once_when_the_robot_hangs(robot, secret):
    robot.block()
    proc, _ = _run(CRASH_WITH_HANGING_ROBOT, robot.webhook, secret)
    assert proc.returncode == 1 and "MemoryError" in proc.stderr
    # shutdown() at exit waits its default 10 s once for the alert (which may take 60 s),
    # then the process ends: not 2 x 10 s, not the alert's 60 s.
    assert 9.5 <= _exit_wait(proc.stderr) < 10.0 + 1.5, proc.stderr
    assert "gave up waiting for alerts" in proc.stderr
    assert secret not in proc.stderr and robot.token not in proc.stderr
