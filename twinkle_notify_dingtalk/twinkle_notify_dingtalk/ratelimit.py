"""A sliding one-minute send window per robot, shared by every notifier in the process.

DingTalk lets a custom robot post at most 20 messages a minute and throttles it (errcode
130101) for several minutes when it sends more. Two notifiers posting to the same robot share
one history, so together they stay under the limit.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable


class RateLimiter:
    """Send timestamps of one robot within the last `window` seconds, plus a pause after 130101."""

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._sent: collections.deque[float] = collections.deque()
        self._paused_until = 0.0
        # Nobody notifies it: slots free with time. It is what `acquire` waits on, bounded.
        self._lock = threading.Condition(threading.Lock())

    def _expire(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()

    def try_acquire(self, limit: int) -> bool:
        """Take a send slot if fewer than `limit` sends happened within the window."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            if now < self._paused_until or len(self._sent) >= limit:
                return False
            self._sent.append(now)
            return True

    def acquire(self, limit: int, timeout: float) -> bool:
        """Take a send slot, waiting up to `timeout` seconds for one to free.

        Returns False at once when no slot can free within `timeout`: it never waits in vain.
        """
        end = time.monotonic() + max(0.0, timeout)
        with self._lock:
            while True:
                now = self.clock()
                wait = self._wait_locked(now, limit)
                if wait <= 0:
                    self._sent.append(now)
                    return True
                if time.monotonic() + wait > end:
                    return False
                self._lock.wait(wait)

    def wait_time(self, limit: int) -> float:
        """Seconds until `try_acquire(limit)` can succeed (0 when it can now)."""
        with self._lock:
            return self._wait_locked(self.clock(), limit)

    def _wait_locked(self, now: float, limit: int) -> float:
        self._expire(now)
        wait = max(0.0, self._paused_until - now)
        if len(self._sent) >= limit:
            # The slot frees when the send `limit` places from the end leaves the window.
            oldest_blocking = self._sent[len(self._sent) - limit]
            wait = max(wait, oldest_blocking + self.window - now)
        return wait

    def pause(self, seconds: float) -> None:
        """Send nothing for `seconds` (DingTalk said the robot is throttled)."""
        with self._lock:
            self._paused_until = max(self._paused_until, self.clock() + seconds)


_limiters: dict[str, RateLimiter] = {}
_limiters_lock = threading.Lock()


def limiter_for(robot_key: str) -> RateLimiter:
    """The process-wide limiter of the robot identified by `robot_key`."""
    with _limiters_lock:
        limiter = _limiters.get(robot_key)
        if limiter is None:
            limiter = _limiters[robot_key] = RateLimiter()
        return limiter
