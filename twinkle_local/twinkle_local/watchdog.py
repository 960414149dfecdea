"""A watchdog thread per process: method timeouts, stacks of stuck processes, exchange progress.

- **Method timeouts.** A method declared with `@remote_function(timeout=T)` runs at most T
  seconds in its process: past the deadline the watchdog records where the method is (its
  stack) and interrupts it (an exception raised in its thread; in the main thread a SIGINT
  wakes a blocking call such as `time.sleep` first). The call then fails with
  `CallTimeoutError` on every process, carrying that stack. A method stuck inside a C call that
  does not return to Python cannot be interrupted; its process still reports its stack.
- **Stacks.** A process whose wait for the others timed out asks the others, through the
  torch.distributed store, where they are: each watchdog answers with the call it runs (or
  that it runs none) and its threads' stacks (`sys._current_frames()`), so the timeout's
  message shows the stuck process's stack without a debugger.
- **Progress.** Exchanges that need a second collective are finished in call order by the
  watchdog too when no driver thread collects them (e.g. a value collected on rank 0 only),
  so no process waits for another that went on with other work.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twinkle_core.plugin import user_stack

if TYPE_CHECKING:
    from .exchange import CallInfo
    from .session import Session

log = logging.getLogger("twinkle")

#: Seconds between two looks at the store for stack requests.
POLL_S = 0.25
#: Seconds between two looks at deadlines and unfinished exchanges while there are some.
TICK_S = 0.02
#: Seconds between two interruptions of a method that keeps running past its deadline.
REPEAT_S = 1.0
#: Frames of each stack shown.
STACK_FRAMES = 16


class RunTimedOut(Exception):
    """Raised inside a method that outlived its `timeout` (the call reports CallTimeoutError)."""


class ActiveRun:
    """A method running in this process: who runs it and until when it may."""

    __slots__ = (
        "deadline",
        "ident",
        "info",
        "interrupted",
        "last_interrupt",
        "lock",
        "running",
        "stack",
        "started",
        "thread",
    )

    def __init__(self, info: CallInfo, deadline: float | None) -> None:
        current = threading.current_thread()
        self.ident = current.ident
        self.thread = current.name
        self.info = info
        self.started = time.monotonic()
        self.deadline = deadline
        self.lock = threading.Lock()
        self.running = True
        self.interrupted = False
        self.last_interrupt = 0.0
        self.stack = ""


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in thread `ident` at its next bytecode (None: cancel a pending one)."""
    setter = ctypes.pythonapi.PyThreadState_SetAsyncExc
    setter.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    setter(ident, None if exc is None else id(exc))


def format_stack(ident: int | None, limit: int = STACK_FRAMES) -> str:
    """Thread `ident`'s stack, without twinkle's own frames."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    return user_stack(frame, limit)


class Watchdog:
    """One per run of mode 'local'; a daemon thread from `start()` to `stop()`."""

    def __init__(self, session: Session) -> None:
        self.session = session
        #: Finishes the exchanges every process has reached; True while some are left
        #: (`ExchangeQueue.progress`, given to `start()`).
        self._progress: Callable[[], bool] = _nothing_left
        self._runs: dict[int, ActiveRun] = {}  # methods running with a deadline, by thread
        self._calls: dict[int, tuple] = {}  # (info, started) of the others, by thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._answered = 0
        self._store_broken = False
        self._main = threading.main_thread().ident
        self._sigint_previous: Any = None
        self._nudges = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self, progress: Callable[[], bool]) -> None:
        """Start the thread; it also calls `progress()` (it must never wait) to finish the
        exchanges no driver thread collects."""
        self._progress = progress
        self._install_sigint()
        self._thread = threading.Thread(target=self._loop, name="twinkle-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        self._uninstall_sigint()

    def _install_sigint(self) -> None:
        """Our SIGINT handler wakes a method blocked in the main thread; other SIGINTs go to
        Python's default handler as before. Only when SIGINT still has that default."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        self._sigint_previous = signal.default_int_handler
        signal.signal(signal.SIGINT, self._on_sigint)

    def _uninstall_sigint(self) -> None:
        if self._sigint_previous is None:
            return
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) == self._on_sigint
        ):
            signal.signal(signal.SIGINT, self._sigint_previous)
        self._sigint_previous = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._nudges > 0:
            self._nudges -= 1
            run = self._runs.get(self._main)  # type: ignore[arg-type]
            if run is not None and run.running and run.interrupted:
                raise RunTimedOut()
            return  # our own nudge arrived after the method ended: nothing to do
        handler = self._sigint_previous or signal.default_int_handler
        handler(signum, frame)

    # ----------------------------------------------------------------- running methods
    def run(self, info: CallInfo, timeout: float | None, body: Any) -> tuple[tuple, float, str]:
        """`body()` (a method's run, returning (ok, value)) bounded by `timeout` seconds.

        Returns (body's result or None when it was interrupted outside user code, seconds it
        took, the stack recorded when the deadline passed or "").
        """
        if timeout is None:  # nothing to interrupt: only remembered for stack reports
            ident = threading.get_ident()
            outer_call = self._calls.get(ident)
            started = time.monotonic()
            self._calls[ident] = (info, started)
            try:
                result = body()
            finally:
                if outer_call is None:
                    self._calls.pop(ident, None)
                else:
                    self._calls[ident] = outer_call
            return result, time.monotonic() - started, ""
        run = ActiveRun(info, time.monotonic() + timeout)
        ident = run.ident
        outer = self._runs.get(ident)  # a nested call on the same thread
        result: Any = None
        try:
            try:
                self._runs[ident] = run
                result = body()
            finally:
                with run.lock:
                    run.running = False
                    if run.interrupted:
                        _set_async_exc(ident, None)
                if outer is None:
                    self._runs.pop(ident, None)
                else:
                    self._runs[ident] = outer
        except RunTimedOut:  # delivered after the method returned: the run timed out anyway
            result = None
        took = time.monotonic() - run.started
        return result, took, run.stack

    def _check_deadlines(self, now: float) -> None:
        for run in list(self._runs.values()):
            if run.deadline is None or now < run.deadline or not run.running:
                continue
            if run.interrupted and now - run.last_interrupt < REPEAT_S:
                continue
            with run.lock:
                if not run.running:
                    continue
                if not run.stack:
                    run.stack = format_stack(run.ident)
                run.interrupted = True
                run.last_interrupt = now
                _set_async_exc(run.ident, RunTimedOut)
                if run.ident == self._main and self._sigint_previous is not None:
                    self._nudges += 1
                    with contextlib.suppress(Exception):
                        signal.pthread_kill(run.ident, signal.SIGINT)

    # ----------------------------------------------------------------- stacks
    def describe_self(self) -> str:
        """Where this process is: the methods it runs (or none) and the stacks."""
        session = self.session
        now = time.monotonic()
        lines = [f"process {session.env.rank} (node {session.node}, pid {os.getpid()}):"]
        runs = [(r.ident, r.info, r.started) for r in list(self._runs.values())]
        runs += [(ident, *call) for ident, call in list(self._calls.items())]
        names = {t.ident: t.name for t in threading.enumerate()}
        shown = set()
        for ident, info, started in runs:
            lines.append(
                f"  running {info.label} (call #{info.seq} from {info.site}) for "
                f"{now - started:.1f}s in thread {names.get(ident, ident)!r}:"
            )
            lines.append(format_stack(ident).rstrip("\n"))
            shown.add(ident)
        if self._main not in shown:
            if not runs:
                lines.append("  not running a remote method;")
            lines.append("  main thread at:")
            lines.append(format_stack(self._main).rstrip("\n"))
        return "\n".join(lines)

    def request_stacks(self, wait: float) -> dict[int, str]:
        """The other processes' `describe_self()`, as many as answer within `wait` seconds."""
        channel = self.session.channel
        store = channel.store
        if store is None or channel.world_size <= 1 or self._store_broken:
            return {}
        try:
            request = int(store.add(channel.key("stackreq"), 1))
            keys = {
                r: channel.key("stack", request, r)
                for r in range(channel.world_size)
                if r != channel.rank
            }
            found: dict[int, str] = {}
            deadline = time.monotonic() + wait
            while keys:
                for rank, key in list(keys.items()):
                    if store.check([key]):
                        found[rank] = store.get(key).decode(errors="replace")
                        del keys[rank]
                if not keys or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            return found
        except Exception as exc:
            log.debug("twinkle: could not ask the other processes for their stacks: %s", exc)
            return {}

    def _answer_requests(self) -> None:
        channel = self.session.channel
        store = channel.store
        if store is None or channel.world_size <= 1 or self._store_broken:
            return
        try:
            asked = int(store.add(channel.key("stackreq"), 0))
            if asked > self._answered:
                report = self.describe_self()
                for request in range(self._answered + 1, asked + 1):
                    store.set(channel.key("stack", request, channel.rank), report)
                self._answered = asked
        except Exception as exc:  # the store went away with the job: stop asking it
            self._store_broken = True
            log.debug("twinkle: watchdog cannot reach the store: %s", exc)

    # ----------------------------------------------------------------- loop
    def _loop(self) -> None:
        next_poll = 0.0
        delay = TICK_S
        while not self._stop.wait(delay):
            now = time.monotonic()
            try:
                self._check_deadlines(now)
                if now >= next_poll:
                    self._answer_requests()
                    next_poll = now + POLL_S
                busy = self._progress()
            except Exception as exc:  # never let the watchdog die silently
                log.warning("twinkle: watchdog: %s: %s", type(exc).__name__, exc)
                busy = False
            timed = any(r.deadline is not None for r in list(self._runs.values()))
            delay = TICK_S if (busy or timed) else POLL_S


def _nothing_left() -> bool:
    return False
