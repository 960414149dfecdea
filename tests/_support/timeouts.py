"""pytest-timeout's `signal` method, made to interrupt `ray.get` too, with a last-resort bound.

Registered by tests/conftest.py when pytest-timeout is installed; the `timeout` and
`timeout_method` settings stay pytest-timeout's (pyproject.toml, `@pytest.mark.timeout`).

With `timeout_method = "signal"` a test that runs past its bound fails alone, with its stack
and the other threads' stacks, and the session goes on (the `thread` method ends the whole
pytest process). pytest-timeout's own signal handler raises `Failed`, which interrupts sleeps,
thread joins, event waits and subprocess waits in the main thread, but not `ray.get`: Ray's
signal check only honours `KeyboardInterrupt` (and swallows any other exception until the
object arrives, if ever). So the handler here raises `KeyboardInterrupt` instead, and the
wrappers below turn a `KeyboardInterrupt` that arrives after the bound into the test's failure
(`Timeout (>Ns)`), so pytest does not take it for Ctrl-C. A real Ctrl-C still stops the session.

Code that never returns to the interpreter (a C call that retries on EINTR, a deadlocked native
lock) cannot be interrupted by a signal at all. For that, the process dumps every thread's
stack and exits (as the `thread` method does) `BACKSTOP_GRACE` seconds after the bound: every
test stays bounded, and such a hang still fails the run loudly.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading

import pytest

#: Seconds past a test's bound before the process is ended because a signal could not stop it.
BACKSTOP_GRACE = 60.0
#: When the bound passes between test phases (in pytest's own code), retry this much later.
RETRY = 0.5


class _State:
    item: pytest.Item | None = None  # the test whose timer runs
    timeout: float = 0.0
    fired = False  # the bound passed: a KeyboardInterrupt now is the timeout's
    in_phase = False  # inside setup, call or teardown (where an interrupt becomes a failure)


class SignalTimeouts:
    """The plugin object (see the module's docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = _State()
        self.stderr = _stderr_copy()

    # --- the timer: pytest-timeout's hooks, for the signal method --------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(self, item, settings):
        if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
            return None  # pytest-timeout's own implementation (thread method)
        state = self.state
        state.item, state.timeout, state.fired = item, float(settings.timeout), False

        def on_alarm(signum, frame):
            if not state.in_phase:  # between phases: pytest's code must not be interrupted
                signal.setitimer(signal.ITIMER_REAL, RETRY)
                return
            if state.fired:
                return
            state.fired = True
            _dump_other_threads(item)
            raise KeyboardInterrupt(f"twinkle test timeout: {item.nodeid}")

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, state.timeout)
        faulthandler.dump_traceback_later(
            state.timeout + BACKSTOP_GRACE, exit=True, file=self.stderr
        )
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_cancel_timer(self, item):
        state = self.state
        if state.item is not item:
            return None
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        faulthandler.cancel_dump_traceback_later()
        state.item, state.fired = None, False
        return True

    # --- the phases: a KeyboardInterrupt after the bound is this test's failure -------------

    def _phase(self):
        state = self.state
        state.in_phase = True
        try:
            return (yield)
        except KeyboardInterrupt as exc:
            if not state.fired:
                raise  # Ctrl-C
            state.fired = False  # teardown still runs, with the interrupt spent
            raise pytest.fail.Exception(
                f"Timeout (>{state.timeout:g}s) from pytest-timeout (signal method)",
                pytrace=True,
            ) from exc
        finally:
            state.in_phase = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        return (yield from self._phase())


def _stderr_copy():
    """A file on the terminal's stderr for the backstop's dump (pytest captures fd 2 during
    tests; this runs from pytest_configure, when capturing is suspended)."""
    try:
        fd = os.dup(sys.__stderr__.fileno())
    except (AttributeError, OSError, ValueError):  # pragma: no cover - no real stderr
        return sys.__stderr__
    return os.fdopen(fd, "w")


def _dump_other_threads(item: pytest.Item) -> None:
    """Every other thread's stack on the terminal (the main thread's is in the failure)."""
    if threading.active_count() < 2:
        return
    from pytest_timeout import dump_stacks

    terminal = item.config.get_terminal_writer()
    terminal.sep("+", title="Timeout")
    dump_stacks(terminal)
    terminal.sep("+", title="Timeout")


def register(config: pytest.Config) -> None:
    """Add the plugin when pytest-timeout is active (call from pytest_configure)."""
    if config.pluginmanager.hasplugin("timeout") and not config.pluginmanager.hasplugin(
        "twinkle-signal-timeouts"
    ):
        config.pluginmanager.register(SignalTimeouts(config), "twinkle-signal-timeouts")
