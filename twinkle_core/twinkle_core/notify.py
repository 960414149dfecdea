"""Notifiers and the background alert queue that feeds them.

Alerts are sent from one daemon thread through a bounded queue, so a slow or broken
notification endpoint never blocks or crashes training. Each distinct failure is sent once.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError

log = logging.getLogger("twinkle")


class Notifier(ABC):
    """Sends a human-readable alert somewhere (chat robot, e-mail, pager)."""

    @abstractmethod
    def send(self, title: str, text: str) -> None:
        """Deliver one alert; `text` is markdown. May raise: the alert queue logs failures."""

    @classmethod
    def from_env(cls) -> Notifier:
        """Build the notifier from environment variables (used for `notifier='<name>'`)."""
        raise ConfigurationError(
            f"{cls.__name__} cannot be configured from the environment; pass an instance to "
            f"initialize(notifier=...)"
        )

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for alerts the notifier buffers itself to be delivered.

        Returns whether everything was delivered. Notifiers that send synchronously in `send`
        have nothing to flush.
        """
        return True

    def close(self, timeout: float) -> None:
        """Deliver anything the notifier buffers itself, waiting at most `timeout` seconds."""


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


class AlertQueue:
    """Delivers alerts to one notifier from a daemon thread, once per distinct key."""

    def __init__(self, notifier: Notifier, maxsize: int = 100) -> None:
        self.notifier = notifier
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="twinkle-alerts", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, key: str, title: str, text: str) -> bool:
        """Queue an alert unless `key` was already sent; never blocks, never raises."""
        with self._lock:
            if self._closed or key in self._seen:
                return False
            self._seen.add(key)
        try:
            self._queue.put_nowait((title, text))
        except queue.Full:
            log.warning("twinkle: alert queue full, dropping alert %r", title)
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                title, text = item
                try:
                    self.notifier.send(title, text)
                except Exception as exc:
                    log.warning(
                        "twinkle: notifier %s failed to send alert %r: %s: %s",
                        type(self.notifier).__name__,
                        title,
                        type(exc).__name__,
                        exc,
                    )
            finally:
                self._queue.task_done()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued alerts to be delivered; True if all were.

        Waits for this queue, then for the notifier's own buffer (`Notifier.flush`).
        """
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        try:
            return bool(self.notifier.flush(max(0.0, deadline - time.monotonic())))
        except Exception as exc:
            log.warning("twinkle: notifier flush failed: %s", exc)
            return False

    def close(self, timeout: float = 10.0) -> None:
        """Flush with a bounded wait, then stop the thread and let the notifier flush."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        start = time.monotonic()
        if not self.flush(timeout):
            log.warning("twinkle: gave up waiting for alerts after %.1fs", timeout)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        try:
            self.notifier.close(max(0.0, timeout - (time.monotonic() - start)))
        except Exception as exc:
            log.warning("twinkle: notifier close failed: %s", exc)
