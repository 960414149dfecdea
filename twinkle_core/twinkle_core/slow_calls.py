"""Waits that say what they wait for: a driver blocked on a slow call logs it.

While user code waits for a call that has not finished (calling its LazyCollect, `wait`,
`await`), one watcher thread logs, every `TWINKLE_WAIT_LOG_INTERVAL` seconds (10 by default,
the same setting as the Ray backend's placement waits), a line under `twinkle.wait` naming the
method, its group, the driver line that made the call and how long it has been waited for.
Registering a wait costs a dict entry (its text is built only if it is shown), so fast calls
cost next to nothing here; the watcher thread exists only while someone waits (and for one
interval after).

On a terminal the same waits also show as one live status line on stderr, redrawn twice
a second once a wait has lasted a second, and erased the moment the wait ends (before user code
prints again), the way pip and cargo show progress. `TWINKLE_STATUS_LINE` chooses: `auto` (the
default: only when stderr is a terminal and TERM is not `dumb`), `1` (always), `0` (never).
Only the process whose backend owns the console shows it (`ExecutionBackend.owns_console`:
under torchrun every rank is a driver, and rank 0 alone draws).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger("twinkle.wait")

DEFAULT_INTERVAL_S = 10.0
INTERVAL_ENV = "TWINKLE_WAIT_LOG_INTERVAL"
STATUS_ENV = "TWINKLE_STATUS_LINE"
#: A wait shows on the status line once it has lasted this long (fast calls never flicker).
STATUS_AFTER_S = 1.0
#: How often the watcher looks at the waits (and redraws the status line) while any exist.
WATCH_TICK_S = 0.5
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

    def show(self, text: str, active: Callable[[], bool] = lambda: True) -> None:
        """Draw `text`, unless `active()` says the waits it describes have all ended.

        `active` is asked under the lock after the line is marked shown: a wait that ends
        meanwhile (`clear` from the waiting thread, without the lock while nothing is shown)
        either saw the mark and waits for this draw to erase it, or ended before the question,
        which then stops the draw. Either way no line outlives the last wait.
        """
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        if len(text) > width:
            text = text[: width - 3] + "..."
        with self._lock:
            self._shown = True
            if not active():
                self._shown = False
                return
            self._write(_CLEAR + text)

    def clear(self) -> None:
        if not self._shown:  # the common case, on every collected call: no lock
            return
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

    # enter/leave run on every collected call, so they take no lock on their common path:
    # one dict store or pop is atomic under the GIL, and the thread reads a copy of the dict.
    # Only starting and stopping the thread is done under the lock.

    def enter(self, what: str | Callable[[], str], log: bool = True) -> int:
        token = next(self._ids)
        now = time.monotonic()
        self._waits[token] = [what, now, now if log else float("inf")]
        if self._thread is None:
            self._ensure_thread()
        return token

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="twinkle-wait-log", daemon=True
                )
                self._thread.start()

    def leave(self, token: int) -> None:
        waits = self._waits
        waits.pop(token, None)
        if not waits and self.status._shown:
            # Erased here, before the caller goes on and prints. The thread is not woken: it
            # stays for the rest of its tick, so a run of slow calls reuses one thread.
            self.status.clear()

    def _stop_if_idle(self) -> bool:
        """Stop this thread if nothing waits; a wait that arrives meanwhile keeps it."""
        with self._lock:
            if self._waits:
                return False
            self._thread = None
        if self._waits:  # entered after the check: it saw a thread, so this one carries on
            with self._lock:
                if self._thread is None:
                    self._thread = threading.current_thread()
                    return False
        return True

    def _run(self) -> None:
        while True:
            # Short ticks, and the interval read at each: a thread started under another
            # TWINKLE_WAIT_LOG_INTERVAL (or before the status line was turned on) follows the
            # current one within a tick.
            step = interval()
            time.sleep(min(step, WATCH_TICK_S))
            if not self._tick(step):
                return

    def _tick(self, step: float) -> bool:
        """One look at the waits; False when the thread should stop. A function of its own so
        that its copies of the waits (and what their descriptions hold: a call, its refs) are
        dropped when it returns, not kept through the next sleep. A Ray ref kept that way
        outlived its session once and, freed after the next `initialize`, ended the process."""
        now = time.monotonic()
        waits = list(self._waits.values())  # a copy: enter/leave change the dict freely
        if not waits and self._stop_if_idle():
            return False
        due = []
        for entry in waits:
            if now - entry[2] >= step * 0.999:
                entry[2] = now
                due.append((_text(entry[0]), now - entry[1]))
        # Written without the lock: logging handlers and the terminal may take their own.
        if due:
            self.status.clear()
        for what, waited in due:
            log.info("twinkle: still waiting for %s (%.0f s so far)", what, waited)
        if self.status.enabled:
            long_ones = [(_text(e[0]), now - e[1]) for e in waits if now - e[1] >= STATUS_AFTER_S]
            if long_ones:  # drawn only while some wait remains (they may end meanwhile)
                self.status.show(_status_text(long_ones), lambda: bool(self._waits))
        return True


def _text(what: str | Callable[[], str]) -> str:
    """A wait's description; built only when it is shown (most waits end unseen)."""
    if callable(what):
        try:
            return what()
        except Exception as exc:  # a description must never break the watcher
            return f"a call (its description failed: {exc!r})"
    return what


_watcher = _Watcher()

#: `enter(what)` registers a wait and returns its token; `leave(token)` ends it. What
#: `waiting_for` does, as two plain calls for the one place that runs on every collected call
#: (a `with` block costs four Python calls more there).
enter = _watcher.enter
leave = _watcher.leave


def configure_status_line(enabled: bool) -> None:
    """Turn the live status line on or off for this process (set by `initialize`)."""
    _watcher.status.enabled = enabled
    if not enabled:
        _watcher.status.clear()


class waiting_for:  # lowercase: used like a function, `with waiting_for(...):`
    """Report `what` every interval while the block runs (it waits for a call).

    `what` may be a function returning the text: it is called only if the wait lasts long
    enough to be shown, so a wait that ends at once costs a dict entry and nothing else (a
    plain class, not a generator-based context manager, as it runs on every collected call).

    `log=False` shows the wait on the status line only, for waits that log their own more
    detailed lines (e.g. a backend's placement wait naming free resources).
    """

    __slots__ = ("_log", "_token", "_what")

    def __init__(self, what: str | Callable[[], str], *, log: bool = True) -> None:
        self._what = what
        self._log = log
        self._token = -1

    def __enter__(self) -> None:
        self._token = _watcher.enter(self._what, self._log)

    def __exit__(self, *exc: object) -> None:
        _watcher.leave(self._token)
