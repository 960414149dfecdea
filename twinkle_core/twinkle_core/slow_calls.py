"""Waits that say what they wait for: a driver blocked on a slow call logs it.

While user code waits for a call that has not finished (calling its LazyCollect, `wait`,
`await`), one watcher thread logs, every `TWINKLE_WAIT_LOG_INTERVAL` seconds (10 by default,
the same setting as the Ray backend's placement waits), a line under `twinkle.wait` naming the
method, its group, the driver line that made the call and how long it has been waited for.
A call that has already finished is collected without registering anything, so fast calls
cost nothing here; the watcher thread exists only while someone waits.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("twinkle.wait")

DEFAULT_INTERVAL_S = 10.0
INTERVAL_ENV = "TWINKLE_WAIT_LOG_INTERVAL"


def interval() -> float:
    """`TWINKLE_WAIT_LOG_INTERVAL` seconds when set and positive, else 10."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, "") or DEFAULT_INTERVAL_S)
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S


class _Watcher:
    """The waits in progress, and the one thread that reports the long ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def enter(self, what: str) -> int:
        token = next(self._ids)
        with self._lock:
            self._waits[token] = (what, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="twinkle-wait-log", daemon=True
                )
                self._thread.start()
        return token

    def leave(self, token: int) -> None:
        with self._lock:
            self._waits.pop(token, None)

    def _run(self) -> None:
        step = interval()
        while True:
            time.sleep(step)
            with self._lock:
                if not self._waits:
                    self._thread = None  # the next wait starts a new one
                    return
                now = time.monotonic()
                due = [(what, now - since) for what, since in self._waits.values()]
            for what, waited in due:  # logged outside the lock: handlers may take their own
                if waited >= step:
                    log.info("twinkle: still waiting for %s (%.0f s so far)", what, waited)


_watcher = _Watcher()


@contextlib.contextmanager
def waiting_for(what: str) -> Iterator[None]:
    """Report `what` every interval while the block runs (it waits for a call)."""
    token = _watcher.enter(what)
    try:
        yield
    finally:
        _watcher.leave(token)
