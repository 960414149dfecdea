"""Notifiers and the one alert queue that feeds them.

twinkle owns all queueing of alerts: `AlertQueue` is a bounded queue drained by one daemon
thread, which calls the notifier's `send` synchronously, one alert at a time. A slow or broken
notification endpoint therefore never blocks or crashes training: only that thread waits.
Each distinct failure is sent once. Every wait on the queue (`flush`, `close`) is a wait on
its condition with a deadline, never a polling loop.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError

log = logging.getLogger("twinkle")


class Notifier(ABC):
    """Sends a human-readable alert somewhere (chat robot, e-mail, pager).

    twinkle calls every method from its alert thread (`AlertQueue`), one call at a time, never
    from the training thread; a notifier needs no queue or thread of its own.
    """

    @abstractmethod
    def send(self, title: str, text: str) -> None:
        """Deliver one alert now; `text` is markdown. Block at most a bounded time (use timeouts).

        May raise: the alert queue logs failures and carries on.
        """

    @classmethod
    def from_env(cls) -> Notifier:
        """Build the notifier from environment variables (used for `notifier='<name>'`)."""
        raise ConfigurationError(
            f"{cls.__name__} cannot be configured from the environment; pass an instance to "
            f"initialize(notifier=...)"
        )

    def send_held(self) -> float | None:
        """Deliver what the notifier held back earlier, if it can now.

        For notifiers that must sometimes delay a message (e.g. a rate limit: the overflow is
        sent later as one summary). The alert thread calls it after every `send` and again
        once the returned number of seconds has passed; None means nothing is held.
        """
        return None

    def close(self, timeout: float) -> None:
        """Deliver what the notifier still holds back, waiting at most `timeout` seconds.

        Called once by the alert thread when twinkle shuts down, with what is left of
        `shutdown()`'s deadline. The notifier may be used again afterwards.
        """


class CallableNotifier(Notifier):
    """Adapts any callable taking one string: it receives the title and text joined."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn

    def send(self, title: str, text: str) -> None:
        self.fn(f"{title}\n\n{text}")

    def __repr__(self) -> str:
        return f"CallableNotifier({self.fn!r})"


def as_notifier(obj: Any) -> Notifier | None:
    """Accept None, a Notifier, a registered notifier name, or a callable taking one string."""
    from .plugins import get_plugin

    if obj is None or isinstance(obj, Notifier):
        return obj
    if isinstance(obj, str):
        target = get_plugin("notifiers", obj)
        if inspect.isclass(target) and issubclass(target, Notifier):
            return target.from_env()
        if isinstance(target, Notifier):
            return target
        raise ConfigurationError(f"notifier {obj!r} is registered as {target!r}, not a Notifier")
    if inspect.isclass(obj) and issubclass(obj, Notifier):
        return obj.from_env()
    if callable(obj):
        return CallableNotifier(obj)
    raise ConfigurationError(
        "notifier must be a Notifier, the name of an installed notifier (e.g. 'dingtalk'), or a "
        f"callable taking one string; got {obj!r}"
    )


class _Stop:
    """Marker: the alert thread was told to stop."""


def _wake_time(later: Any) -> float | None:
    """When to call `send_held` again, from what it returned (seconds, or None)."""
    if later is None or isinstance(later, bool) or not isinstance(later, (int, float)):
        return None
    return time.monotonic() + max(0.0, float(later))


_STOP = _Stop()


class AlertQueue:
    """Delivers alerts to one notifier from one daemon thread, once per distinct key.

    The only queue and thread of the alert path: `submit` appends (never blocks, never
    raises), the thread calls `notifier.send` for each alert and `notifier.send_held` when the
    notifier asked for it. `flush` and `close` wait on one condition with a deadline.
    """

    def __init__(self, notifier: Notifier, maxsize: int = 100) -> None:
        self.notifier = notifier
        self.maxsize = maxsize
        #: Alerts dropped because `maxsize` alerts were already waiting, or left at the deadline.
        self.dropped = 0
        self._items: deque[tuple[str, str]] = deque()
        self._seen: set[str] = set()
        # One condition (an RLock inside) for the items, the busy flag and the stop request.
        # Reentrant on purpose: a SIGTERM handler may flush on the thread that was submitting.
        self._cond = threading.Condition()
        self._busy = False  # the thread is inside a notifier call
        self._closed = False  # no more submissions
        self._dropping = False  # warned about this burst of drops already
        self._limit: float | None = None  # no wait ends later than this (time.monotonic())
        self._stop_at: float | None = None  # set by close(): the thread's deadline
        self._thread = threading.Thread(target=self._run, name="twinkle-alerts", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producers
    def submit(self, key: str, title: str, text: str) -> bool:
        """Queue an alert unless `key` was already sent; never blocks, never raises."""
        with self._cond:
            if self._closed or key in self._seen:
                return False
            self._seen.add(key)
            warn = False
            if len(self._items) >= self.maxsize:
                self.dropped += 1
                warn, self._dropping = not self._dropping, True
            else:
                self._items.append((title, text))
                if len(self._items) <= self.maxsize // 2:
                    self._dropping = False
                self._cond.notify_all()
                return True
        if warn:  # one warning per burst of drops, not one per alert
            log.warning(
                "twinkle: %d alerts are already waiting for the notifier; dropping alert %r and "
                "further ones until the queue drains",
                self.maxsize,
                title,
            )
        return False

    # ------------------------------------------------------------------ the thread
    def _next(self, wake: float | None) -> tuple[str, str] | _Stop | None:
        """Wait for the next thing to do: an alert, the stop, or (None) `send_held` is due."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._stop_at is not None and (not self._items or now >= self._stop_at):
                    return _STOP
                if self._items:
                    self._busy = True
                    return self._items.popleft()
                if wake is not None and now >= wake:
                    self._busy = True
                    return None
                self._cond.wait(None if wake is None else wake - now)

    def _idle(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            log.warning(
                "twinkle: notifier %s failed to %s: %s: %s",
                type(self.notifier).__name__,
                what,
                type(exc).__name__,
                exc,
            )
            return None

    def _run(self) -> None:
        wake: float | None = None  # when the notifier wants send_held() called again
        while True:
            item = self._next(wake)
            if isinstance(item, _Stop):
                self._finish()
                return
            try:
                if item is not None:
                    title, text = item
                    self._call(f"send alert {title!r}", self.notifier.send, title, text)
                later = self._call("send held alerts", self.notifier.send_held)
                wake = _wake_time(later)
            finally:
                self._idle()

    def _finish(self) -> None:
        """Stop: drop what the deadline left, let the notifier deliver what it held back."""
        with self._cond:
            left, self._items = len(self._items), deque()
            self.dropped += left
            stop_at = self._stop_at if self._stop_at is not None else time.monotonic()
        if left:
            log.warning(
                "twinkle: %d alert(s) not sent: the notifier was too slow for the shutdown's "
                "deadline",
                left,
            )
        self._call("close", self.notifier.close, max(0.0, stop_at - time.monotonic()))

    # ------------------------------------------------------------------ waiting
    def _deadline(self, timeout: float) -> float:
        deadline = time.monotonic() + max(0.0, timeout)
        return deadline if self._limit is None else min(deadline, self._limit)

    def limit_waits(self, timeout: float) -> None:
        """From now on, no `flush` or `close` waits longer than `timeout` seconds from now.

        `shutdown(timeout)` calls this first, so all its alert work (the flush before the
        backend stops, flushes the backend does while stopping, the close) shares one deadline.
        """
        with self._cond:
            limit = time.monotonic() + max(0.0, timeout)
            self._limit = limit if self._limit is None else min(self._limit, limit)

    def time_left(self, timeout: float) -> float:
        """`timeout`, cut to what is left of the deadline `limit_waits` set: for backends
        whose own alert hand-shakes (e.g. waiting for another process to send) must end with
        the shutdown's deadline too."""
        return max(0.0, self._deadline(timeout) - time.monotonic())

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every queued alert was handed to the notifier
        and it returned; True if so. Does not wait for what the notifier holds back."""
        deadline = self._deadline(timeout)
        if threading.current_thread() is self._thread:
            return not self._items  # called from a notifier: waiting would wait for itself
        # Acquire with a bound too: never hang, whatever the thread holding the lock does.
        if not self._cond.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            while self._items or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(remaining)
            return True
        finally:
            self._cond.release()

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking alerts; deliver the queued ones and let the notifier `close`, all
        within `timeout` seconds; then the thread ends. Safe twice."""
        started = time.monotonic()
        with self._cond:
            if self._stop_at is not None:
                return
            self._closed = True
            self._stop_at = stop_at = self._deadline(timeout)
            self._cond.notify_all()
        if threading.current_thread() is self._thread:
            return  # called from a notifier: the thread stops when that call returns
        self._thread.join(max(0.0, stop_at - time.monotonic()))
        if self._thread.is_alive():
            with self._cond:
                queued = len(self._items)
            log.warning(
                "twinkle: gave up waiting for alerts after %.1fs (%d still queued): the "
                "notifier %s is still busy, slow or unreachable",
                time.monotonic() - started,
                queued,
                type(self.notifier).__name__,
            )
