"""At most max_per_minute messages per robot; the overflow becomes one summary message."""

from __future__ import annotations

import time

from twinkle_notify_dingtalk import DingTalkNotifier
from twinkle_notify_dingtalk.ratelimit import RateLimiter


def test_overflow_is_folded_into_one_summary(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret, max_per_minute=3)
    notifier._limiter.window = 1.5  # a short "minute" so the test does not wait 60 s
    started = time.monotonic()
    for i in range(8):
        notifier.send(f"alert {i}", f"details of alert {i}")
    first = robot.wait_for(3, timeout=5)
    assert [m.title for m in first] == ["alert 0", "alert 1", "alert 2"]
    assert time.monotonic() - started < 1.0  # the first three go out at once
    msgs = robot.wait_for(4, timeout=5)
    assert time.monotonic() - started >= 1.5  # the summary waits for a free slot
    summary = msgs[3]
    assert "5 more alert(s)" in summary.title
    for i in range(3, 8):
        assert f"alert {i}" in summary.text
    assert "details of alert" not in summary.text  # titles only, details are in the logs
    notifier.close(timeout=5)
    assert len(robot.requests) == 4  # nothing else, and never a 130101 from the robot
    assert notifier.stats.sent == 3 and notifier.stats.summaries == 1
    assert notifier.stats.summarized == 5


def test_default_limit_keeps_under_dingtalks_twenty_a_minute(robot, secret, dtlog):
    notifier = DingTalkNotifier(robot.webhook, secret)  # max_per_minute=20 by default
    for i in range(25):
        notifier.send(f"alert {i}", "x")
    robot.wait_for(20, timeout=10)
    # The summary would need a free slot within the next minute: close gives up, says so.
    notifier.close(timeout=0.5)
    assert len(robot.requests) == 20
    assert all(r.errcode == 0 for r in robot.requests)  # the robot never had to throttle us
    assert "5 DingTalk alert(s) were not delivered" in dtlog.text
    assert notifier.stats.dropped == 5


def test_notifiers_of_one_robot_share_the_limit(robot, secret):
    a = DingTalkNotifier(robot.webhook, secret, max_per_minute=3)
    b = DingTalkNotifier(robot.webhook, secret, max_per_minute=3)
    assert a._limiter is b._limiter
    for i in range(2):
        a.send(f"a{i}", "x")
        a.flush(5)
        b.send(f"b{i}", "x")
        b.flush(5)
    a.close(timeout=0.2)
    b.close(timeout=0.2)
    assert len(robot.delivered) == 3


def test_limiter_sliding_window():
    now = [100.0]
    limiter = RateLimiter(window=60.0, clock=lambda: now[0])
    assert limiter.try_acquire(2)
    now[0] = 110.0
    assert limiter.try_acquire(2)
    now[0] = 115.0
    assert not limiter.try_acquire(2)
    assert limiter.wait_time(2) == 45.0  # until the send of t=100 leaves the window
    assert limiter.wait_time(3) == 0.0  # a caller with a higher limit may send now
    now[0] = 160.0
    assert limiter.wait_time(2) == 0.0 and limiter.try_acquire(2)
    assert not limiter.try_acquire(2)  # the send of t=110 is still in the window
    assert limiter.wait_time(2) == 10.0
    limiter.pause(90)  # DingTalk answered 130101
    now[0] = 230.0
    assert limiter.wait_time(5) == 20.0 and not limiter.try_acquire(5)
    now[0] = 250.0
    assert limiter.try_acquire(5)
