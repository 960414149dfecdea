"""A down, slow, failing or throttling robot never raises into user code or delays a call.

No assertion here depends on how fast a loaded machine is: "the call did not wait for the
robot" is shown by a robot that holds every request until the test releases it (the call has
returned while the robot still holds the alert), and upper bounds on waits the code bounds
itself carry a margin of 1.5 s.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

import twinkle_core
from twinkle_core import DeviceGroup, remote_class, remote_function
from twinkle_core.notify import AlertQueue
from twinkle_notify_dingtalk import DingTalkNotifier, transport

#: Extra seconds a bounded wait may take on a loaded 2-core machine.
MARGIN = 1.5


@remote_class()
class Worker:
    @remote_function(dispatch="all", collect="none")
    def fail(self, why: str):
        raise OSError(f"{why} on rank {twinkle_core.get_worker_context().rank}")


def _start(notifier) -> None:
    twinkle_core.initialize(
        mode="inprocess",
        name="bad-endpoint",
        groups=[DeviceGroup("w", 2, "cpu")],
        notifier=notifier,
    )


def _fail_once() -> None:
    # The ranks' messages differ only in the rank number: one distinct error, one alert.
    with pytest.raises(OSError, match="disk gone on rank 0"):
        Worker(remote_group="w").fail("disk gone")()


def _timed_shutdown(timeout: float = 10.0) -> float:
    started = time.monotonic()
    twinkle_core.shutdown(timeout=timeout)
    return time.monotonic() - started


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_failing_call_never_waits_for_the_robot(robot, secret):
    robot.block()
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=60)
    _start(notifier)
    _fail_once()
    # The call has returned, and the robot holds its alert unanswered: the call did not wait.
    assert robot.wait_held(1)
    assert robot.requests == []
    robot.release()
    assert _timed_shutdown(timeout=30) < 30
    assert [r.title for r in robot.delivered] == ["twinkle run bad-endpoint: Worker.fail failed"]
    assert notifier.stats.sent == 1


@pytest.mark.parametrize("timeout", [1.0, 3.0])
def test_shutdown_takes_at_most_its_timeout_when_the_robot_never_answers(
    robot, secret, dtlog, timeout
):
    robot.block()
    # One alert may take 60 s; shutdown(timeout) waits for it once, not for its 60 s nor twice
    # `timeout` (a flush, then a close with the full timeout again: 6 s for timeout=3.0).
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=60)
    _start(notifier)
    _fail_once()
    assert robot.wait_held(1)  # the alert is in flight
    elapsed = _timed_shutdown(timeout=timeout)
    assert 0.9 * timeout <= elapsed < timeout + MARGIN, elapsed  # flushed (bounded), once
    assert any("gave up waiting for alerts" in m for m in _warnings(dtlog))
    assert robot.requests == []


def test_unreachable_robot(dead_webhook, secret, dtlog):
    notifier = DingTalkNotifier(dead_webhook, secret, timeout=1.0)
    _start(notifier)
    _fail_once()
    # One alert, given at most timeout=1.0 s, retries included: shutdown waits no longer.
    assert _timed_shutdown() < 1.0 + MARGIN
    assert notifier.stats.failed == 1 and notifier.stats.sent == 0
    msgs = _warnings(dtlog)
    assert any("not delivered (gave up after" in m and "connection failed" in m for m in msgs)
    attempts = [int(m.split("after ")[1].split(" ")[0]) for m in msgs if "gave up after" in m]
    assert all(a >= 2 for a in attempts), attempts  # connection errors are retried


def test_slow_robot(robot, secret, dtlog):
    robot.block()  # never answers while the test runs
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=0.5)
    _start(notifier)
    _fail_once()
    assert robot.wait_held(1)
    # The alert is abandoned when its timeout=0.5 s is spent: shutdown waits no longer.
    assert _timed_shutdown() < 0.5 + MARGIN
    assert any("timed out" in m for m in _warnings(dtlog))
    assert notifier.stats.failed == 1


def test_direct_send_blocks_at_most_its_timeout(robot, secret, dtlog):
    # Used on its own (without twinkle's alert thread), send() delivers on the caller's thread.
    robot.block()
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=1.0)
    started = time.monotonic()
    notifier.send("direct", "x")
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 1.0 + MARGIN, elapsed
    assert robot.held == 1 and notifier.stats.failed == 1
    assert any("not delivered" in m for m in _warnings(dtlog))


def test_throttling_robot(robot, secret, dtlog):
    robot.always_throttle = True
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=1.0)
    _start(notifier)
    _fail_once()
    # 130101 is transient: retried with back-off within the 1 s budget, then held for a summary
    # that cannot go out before close (DingTalk throttles for minutes): close does not wait for
    # a slot that cannot free in time, and says so.
    assert _timed_shutdown() < 1.0 + MARGIN
    assert len(robot.requests) >= 2
    assert all(r.errcode == 130101 for r in robot.requests)
    msgs = _warnings(dtlog)
    assert any("errcode 130101" in m for m in msgs)
    assert any("were not delivered" in m and "bad-endpoint" in m for m in msgs)
    assert notifier.stats.sent == 0 and notifier.stats.dropped == 1


def test_transient_server_errors_are_retried(robot, secret):
    robot.fail_next_http = 2  # HTTP 500 twice, then fine
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=5.0)
    import random

    before = random.getstate()
    notifier.send("flaky", "server hiccup")
    assert [r.http_status for r in robot.requests] == [500, 500, 200]
    assert notifier.stats.sent == 1
    # The back-off jitter has its own generator: a seeded user run draws what it would.
    assert random.getstate() == before


def test_a_single_throttle_answer_is_retried(robot, secret):
    robot.throttle_next = 1
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=5.0)
    notifier.send("t", "x")
    assert [r.errcode for r in robot.requests] == [130101, 0]
    assert notifier.stats.sent == 1 and notifier.stats.dropped == 0


def test_refusals_are_not_retried(robot, dtlog):
    notifier = DingTalkNotifier(robot.webhook, "SECwrong-secret", timeout=5.0)
    notifier.send("signed wrong", "x")
    assert [r.errcode for r in robot.requests] == [310000]
    assert any("errcode 310000: sign not match" in m for m in _warnings(dtlog))
    assert notifier.stats.failed == 1


def test_send_never_raises_and_reuse_after_close(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret)
    notifier.send(object(), None)  # type: ignore[arg-type]  # odd input is stringified
    notifier.close(timeout=5)
    notifier.send("again", "after close")
    assert [r.title for r in robot.delivered][1] == "again"
    assert notifier.stats.sent == 2


def test_every_post_runs_on_cores_alert_thread(robot, secret, monkeypatch):
    # One owner of queueing: the notifier starts no thread; under twinkle it posts from
    # twinkle-core's alert thread, used on its own from the caller's thread.
    posters: list[str] = []
    post = transport.post

    def recording_post(*args, **kwargs):
        posters.append(threading.current_thread().name)
        return post(*args, **kwargs)

    monkeypatch.setattr(transport, "post", recording_post)
    notifier = DingTalkNotifier(robot.webhook, secret)
    notifier.send("direct", "x")
    assert posters == [threading.current_thread().name]
    _start(notifier)
    _fail_once()
    twinkle_core.shutdown(timeout=30)
    assert posters[1:] == ["twinkle-alerts"]
    assert len(robot.delivered) == 2
    assert "twinkle-dingtalk" not in [t.name for t in threading.enumerate()]


def test_cores_alert_queue_flush_covers_the_delivery(robot, secret):
    # twinkle-core flushes its alert queue before torchrun ranks may exit: the flush is done
    # only once the robot answered.
    robot.block()
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=60)
    queue = AlertQueue(notifier)
    assert queue.submit("key", "from core", "x")
    assert robot.wait_held(1)
    assert not queue.flush(0.2)  # the robot has not answered: not delivered yet
    robot.release()
    assert queue.flush(30)
    assert [r.title for r in robot.delivered] == ["from core"]
    queue.close(timeout=5)
