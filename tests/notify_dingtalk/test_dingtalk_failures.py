"""A down, slow, failing or throttling robot never raises into user code or delays a call."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import twinkle_core
from twinkle_core import DeviceGroup, remote_class, remote_function
from twinkle_notify_dingtalk import DingTalkNotifier


@remote_class()
class Worker:
    @remote_function(dispatch="all", collect="none")
    def fail(self, why: str):
        raise OSError(f"{why} on rank {twinkle_core.get_worker_context().rank}")


def _failing_call(notifier) -> tuple[float, float]:
    """(seconds the failing call took, seconds shutdown took) for one failing remote call."""
    twinkle_core.initialize(
        mode="inprocess",
        name="bad-endpoint",
        groups=[DeviceGroup("w", 2, "cpu")],
        notifier=notifier,
    )
    worker = Worker(remote_group="w")
    started = time.monotonic()
    with pytest.raises(OSError, match="disk gone on rank 0"):
        worker.fail("disk gone")()
    call = time.monotonic() - started
    started = time.monotonic()
    twinkle_core.shutdown(timeout=10)
    return call, time.monotonic() - started


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_unreachable_robot(dead_webhook, secret, dtlog):
    notifier = DingTalkNotifier(dead_webhook, secret, timeout=1.0)
    call, shutdown = _failing_call(notifier)
    assert call < 0.5  # the user's call does not wait for the notifier at all
    # The ranks' messages differ only in the rank number: one distinct error, one alert, given
    # at most timeout=1.0 s, retries included.
    assert shutdown < 2 * 1.0 + 0.5
    assert notifier.stats.failed == 1 and notifier.stats.sent == 0
    msgs = _warnings(dtlog)
    assert any("not delivered (gave up after" in m and "connection failed" in m for m in msgs)
    attempts = [int(m.split("after ")[1].split(" ")[0]) for m in msgs if "gave up after" in m]
    assert all(a >= 2 for a in attempts), attempts  # connection errors are retried


def test_slow_robot(robot, secret, dtlog):
    robot.delay = 5.0
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=0.5)
    call, shutdown = _failing_call(notifier)
    assert call < 0.5
    # Two alerts, each given at most timeout=0.5 s.
    assert shutdown < 2 * 0.5 + 0.5
    assert any("timed out" in m for m in _warnings(dtlog))


def test_close_is_bounded_even_when_delivery_is_not(robot, secret, dtlog):
    robot.delay = 3.0
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=2.5)
    started = time.monotonic()
    for i in range(5):
        notifier.send(f"alert {i}", "text")
    assert time.monotonic() - started < 0.1  # send() only queues
    started = time.monotonic()
    notifier.close(timeout=0.3)
    assert time.monotonic() - started < 0.6
    assert any("gave up waiting for DingTalk alerts" in m for m in _warnings(dtlog))


def test_throttling_robot(robot, secret, dtlog):
    robot.always_throttle = True
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=1.0)
    call, shutdown = _failing_call(notifier)
    assert call < 0.5 and shutdown < 2 * 1.0 + 0.5
    # 130101 is transient: retried with back-off within the budget, then held for a summary
    # that cannot go out before close (DingTalk throttles for minutes), which is reported.
    assert len(robot.requests) >= 2
    assert all(r.errcode == 130101 for r in robot.requests)
    msgs = _warnings(dtlog)
    assert any("errcode 130101" in m for m in msgs)
    assert any("were not delivered" in m and "bad-endpoint" in m for m in msgs)
    assert notifier.stats.sent == 0 and notifier.stats.dropped >= 1


def test_transient_server_errors_are_retried(robot, secret):
    robot.fail_next_http = 2  # HTTP 500 twice, then fine
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=5.0)
    notifier.send("flaky", "server hiccup")
    notifier.close(timeout=5)
    assert [r.http_status for r in robot.requests] == [500, 500, 200]
    assert notifier.stats.sent == 1


def test_a_single_throttle_answer_is_retried(robot, secret):
    robot.throttle_next = 1
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=5.0)
    notifier.send("t", "x")
    notifier.close(timeout=5)
    assert [r.errcode for r in robot.requests] == [130101, 0]


def test_refusals_are_not_retried(robot, dtlog):
    notifier = DingTalkNotifier(robot.webhook, "SECwrong-secret", timeout=5.0)
    notifier.send("signed wrong", "x")
    notifier.close(timeout=5)
    assert [r.errcode for r in robot.requests] == [310000]
    assert any("errcode 310000: sign not match" in m for m in _warnings(dtlog))
    assert notifier.stats.failed == 1


def test_send_never_raises_and_reuse_after_close(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret)
    notifier.send(object(), None)  # type: ignore[arg-type]  # odd input is stringified
    notifier.close(timeout=5)
    notifier.send("again", "after close")  # a new sender thread starts
    notifier.close(timeout=5)
    assert [r.title for r in robot.delivered][1] == "again"
    assert notifier.stats.sent == 2


def test_queue_is_bounded(robot, secret, dtlog):
    robot.delay = 1.0
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=0.2, max_per_minute=1000)
    for i in range(150):
        notifier.send(f"alert {i}", "x")
    assert notifier.stats.dropped >= 49
    drops = [m for m in _warnings(dtlog) if "dropping alert" in m]
    assert len(drops) == 1  # one warning per burst
    notifier.close(timeout=0.2)


def test_no_sender_thread_left_after_close(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret)
    notifier.send("x", "y")
    thread = notifier._sender.thread
    assert thread.is_alive()
    notifier.close(timeout=5)
    assert not thread.is_alive() and thread not in threading.enumerate()


def test_cores_alert_queue_flush_covers_the_delivery(robot, secret):
    # twinkle-core flushes its alert queue before torchrun ranks may exit; that flush must
    # cover the HTTP delivery, while send() itself never waits for the robot.
    from twinkle_core.notify import AlertQueue

    robot.delay = 0.5
    notifier = DingTalkNotifier(robot.webhook, secret, timeout=3)
    started = time.monotonic()
    notifier.send("from user code", "x")
    assert time.monotonic() - started < 0.1 and robot.requests == []
    queue = AlertQueue(notifier)
    assert queue.submit("key", "from core", "x")
    assert queue.flush(5)
    assert [r.title for r in robot.delivered] == ["from user code", "from core"]
    queue.close(timeout=5)
