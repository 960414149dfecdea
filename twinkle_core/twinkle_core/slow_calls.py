"""Waits that say what they wait for: a driver blocked on a slow call logs it.

While user code waits for a call that has not finished (calling its LazyCollect, `wait`,
`await`), one watcher thread logs, every `TWINKLE_WAIT_LOG_INTERVAL` seconds (10 by default,
the same setting as the Ray backend's placement waits), a line under `twinkle.wait` naming the
method, its group, the driver line that made the call and how long it has been waited for.
A call that has already finished is collected without registering anything, so fast calls
cost nothing here; the watcher thread exists only while someone waits.

On a terminal the same waits also show as one live status line on stderr, redrawn every
second once a wait has lasted a second, and erased the moment the wait ends (before user code
prints again), the way pip and cargo show progress. `TWINKLE_STATUS_LINE` chooses: `auto` (the
default: only when stderr is a terminal and TERM is not `dumb`), `1` (always), `0` (never).
Only the process whose backend owns the console shows it (`ExecutionBackend.owns_console`:
under torchrun every rank is a driver, and rank 0 alone draws).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

log = logging.getLogger("twinkle.wait")

DEFAULT_INTERVAL_S = 10.0
INTERVAL_ENV = "TWINKLE_WAIT_LOG_INTERVAL"
STATUS_ENV = "TWINKLE_STATUS_LINE"
#: A wait shows on the status line once it has lasted this long (fast calls never flicker).
STATUS_AFTER_S = 1.0
#: How often the status line is redrawn.
STATUS_TICK_S = 1.0
_CLEAR = "\r\x1b[2K"


def interval() -> float:
    """`TWINKLE_WAIT_LOG_INTERVAL` seconds when set and positive, else 10."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, "") or DEFAULT_INTERVAL_S)
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S


def status_line_wanted(stream: TextIO | None = None) -> bool:
    """Whether `TWINKLE_STATUS_LINE` and `stream` (default stderr) call for a status line."""
    setting = os.environ.get(STATUS_ENV, "auto").strip().lower()
    if setting in {"0", "false", "no", "off"}:
        return False
    if setting in {"1", "true", "yes", "on"}:
        return True
    stream = sys.stderr if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


class _StatusLine:
    """One line on stderr, redrawn in place; every write goes through its own lock."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._shown = False

    def show(self, text: str) -> None:
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        if len(text) > width:
            text = text[: width - 3] + "..."
        with self._lock:
            self._write(_CLEAR + text)
            self._shown = True

    def clear(self) -> None:
        with self._lock:
            if self._shown:
                self._shown = False
                self._write(_CLEAR)

    @staticmethod
    def _write(text: str) -> None:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed terminal must not break the call
            pass


_PATH = re.compile(r"(?:[^\s():]*[/\\])+([^\s():/\\]+:\d+)")


def _status_text(waits: list[tuple[str, float]]) -> str:
    """The longest wait, with file paths cut to their names so the line fits a terminal."""
    what, waited = max(waits, key=lambda w: w[1])
    what = _PATH.sub(r"\1", what)
    more = f" (+{len(waits) - 1} more)" if len(waits) > 1 else ""
    return f"twinkle: waiting for {what}: {waited:.0f} s{more}"


class _Watcher:
    """The waits in progress, and the one thread that reports the long ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: token -> [what, started, last logged]
        self._waits: dict[int, list] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self.status = _StatusLine()

    def enter(self, what: str, log: bool = True) -> int:
        token = next(self._ids)
        now = time.monotonic()
        with self._lock:
            self._waits[token] = [what, now, now if log else float("inf")]
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="twinkle-wait-log", daemon=True
                )
                self._thread.start()
        return token

    def leave(self, token: int) -> None:
        with self._lock:
            self._waits.pop(token, None)
            last = not self._waits
        if last:
            # Erased here, before the caller goes on and prints. The thread is not woken: it
            # stays for the rest of its tick, so a run of slow calls reuses one thread.
            self.status.clear()

    def _run(self) -> None:
        step = interval()
        while True:
            tick = min(step, STATUS_TICK_S) if self.status.enabled else step
            time.sleep(tick)
            now = time.monotonic()
            with self._lock:
                if not self._waits:
                    self._thread = None  # the next wait starts a new one
                    return
                due = []
                for entry in self._waits.values():
                    if now - entry[2] >= step * 0.999:
                        entry[2] = now
                        due.append((entry[0], now - entry[1]))
                shown = [(e[0], now - e[1]) for e in self._waits.values()]
            # Written outside the lock: logging handlers and the terminal may take their own.
            if due:
                self.status.clear()
            for what, waited in due:
                log.info("twinkle: still waiting for %s (%.0f s so far)", what, waited)
            if self.status.enabled:
                long_ones = [w for w in shown if w[1] >= STATUS_AFTER_S]
                if long_ones:
                    self.status.show(_status_text(long_ones))


_watcher = _Watcher()


def configure_status_line(enabled: bool) -> None:
    """Turn the live status line on or off for this process (set by `initialize`)."""
    _watcher.status.enabled = enabled
    if not enabled:
        _watcher.status.clear()


@contextlib.contextmanager
def waiting_for(what: str, *, log: bool = True) -> Iterator[None]:
    """Report `what` every interval while the block runs (it waits for a call).

    `log=False` shows the wait on the status line only, for waits that log their own more
    detailed lines (e.g. a backend's placement wait naming free resources).
    """
    token = _watcher.enter(what, log)
    try:
        yield
    finally:
        _watcher.leave(token)
