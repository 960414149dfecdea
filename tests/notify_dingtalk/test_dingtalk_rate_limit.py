"""At most max_per_minute messages per robot; the overflow becomes one summary message."""

from __future__ import annotations

import time

from twinkle_core.notify import AlertQueue
from twinkle_notify_dingtalk import DingTalkNotifier
from twinkle_notify_dingtalk.ratelimit import RateLimiter


def test_overflow_is_folded_into_one_summary(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret, max_per_minute=3)
    notifier._limiter.window = 1.5  # a short "minute" so the test does not wait 60 s
    started = time.monotonic()
    for i in range(8):
        notifier.send(f"alert {i}", f"details of alert {i}")
    # send() delivers synchronously: the first three are out, the other five held back.
    assert [m.title for m in robot.requests] == ["alert 0", "alert 1", "alert 2"]
    assert notifier.flush(30)  # waits (on the limiter) for a free slot, then sends the summary
    assert time.monotonic() - started >= 1.5  # the summary waited for a free slot
    summary = robot.requests[3]
    assert "5 more alert(s)" in summary.title
    for i in range(3, 8):
        assert f"alert {i}" in summary.text
    assert "details of alert" not in summary.text  # titles only, details are in the logs
    notifier.close(timeout=5)
    assert len(robot.requests) == 4  # nothing else, and never a 130101 from the robot
    assert notifier.stats.sent == 3 and notifier.stats.summaries == 1
    assert notifier.stats.summarized == 5


def test_cores_thread_sends_the_summary_when_a_slot_frees(robot, secret):
    # Under twinkle, nobody calls flush: core's alert thread calls send_held() back when the
    # notifier said a slot frees.
    notifier = DingTalkNotifier(robot.webhook, secret, max_per_minute=3)
    notifier._limiter.window = 1.5
    queue = AlertQueue(notifier)
    started = time.monotonic()
    for i in range(8):
        assert queue.submit(f"k{i}", f"alert {i}", f"details of alert {i}")
    msgs = robot.wait_for(4, timeout=60)
    assert time.monotonic() - started >= 1.5
    assert [m.title for m in msgs[:3]] == ["alert 0", "alert 1", "alert 2"]
    assert "more alert(s)" in msgs[3].title
    queue.close(timeout=60)
    # However the alerts were batched into summaries, every held alert was listed in one.
    summaries = [r for r in robot.requests[3:]]
    assert all("more alert(s)" in r.title and r.ok for r in summaries)
    for i in range(3, 8):
        assert sum(f"alert {i}" in r.text for r in summaries) == 1
    assert notifier.stats.summarized == 5 and notifier.stats.dropped == 0


def test_default_limit_keeps_under_dingtalks_twenty_a_minute(robot, secret, dtlog):
    notifier = DingTalkNotifier(robot.webhook, secret)  # max_per_minute=20 by default
    for i in range(25):
        notifier.send(f"alert {i}", "x")
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


def test_limiter_acquire_waits_for_a_slot_only_when_one_frees_in_time():
    now = [100.0]
    limiter = RateLimiter(window=60.0, clock=lambda: now[0])
    assert limiter.acquire(1, timeout=0)
    started = time.monotonic()
    assert not limiter.acquire(1, timeout=30)  # the slot frees in 60 s: no wait in vain
    assert time.monotonic() - started < 30
    real = RateLimiter(window=0.3)
    assert real.acquire(1, timeout=0)
    started = time.monotonic()
    assert real.acquire(1, timeout=30)  # waits for the slot, on the limiter's condition
    assert time.monotonic() - started >= 0.3 - 0.01
