"""Notifier resolution and the alert queue: never blocks, never raises, bounded at exit."""

from __future__ import annotations

import threading
import time

import pytest

from twinkle_core import ConfigurationError, DeviceGroup, Notifier, initialize, shutdown
from twinkle_core.notify import AlertQueue, CallableNotifier, as_notifier

from .plugin_factory import make_plugin
from .test_inprocess import Counter


class Recorder(Notifier):
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.sent: list[tuple[str, str]] = []

    def send(self, title: str, text: str) -> None:
        time.sleep(self.delay)
        self.sent.append((title, text))


def test_notifier_accepts_instance_callable_and_none():
    rec = Recorder()
    assert as_notifier(rec) is rec
    assert as_notifier(None) is None
    wrapped = as_notifier(print)
    assert isinstance(wrapped, CallableNotifier)
    with pytest.raises(ConfigurationError, match="notifier must be"):
        as_notifier(3.5)


def test_registered_notifier_is_built_from_the_environment(tmp_path, monkeypatch, fresh_plugins):
    monkeypatch.syspath_prepend(str(tmp_path))
    make_plugin(
        tmp_path,
        "twinkle-envnote",
        "twinkle_envnote",
        """
        import os
        from twinkle_core import Notifier, hookimpl

        class EnvNotifier(Notifier):
            def __init__(self, target):
                self.target = target

            @classmethod
            def from_env(cls):
                return cls(os.environ["ENVNOTE_TARGET"])

            def send(self, title, text):
                pass

        @hookimpl
        def register_notifiers(register):
            register("envnote", EnvNotifier)
        """,
    )
    monkeypatch.setenv("ENVNOTE_TARGET", "room-7")
    notifier = as_notifier("envnote")
    assert type(notifier).__name__ == "EnvNotifier" and notifier.target == "room-7"


#: Extra seconds a bounded wait may take on a loaded 2-core machine.
MARGIN = 1.5


class Blocking(Notifier):
    """A notifier stuck in `send` until the test releases it (a robot that never answers)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.sent: list[str] = []
        self.threads: set[str] = set()

    def send(self, title, text):
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.release.wait(60)
        self.sent.append(title)


def test_a_slow_notifier_never_delays_the_failing_call():
    blocking = Blocking()
    initialize("inprocess", groups=[DeviceGroup("g", 2)], notifier=blocking)
    c = Counter(remote_group="g")
    for message in ("a", "b", "c"):
        with pytest.raises(KeyError):
            c.fail(message)()
    # Three failing calls returned while the notifier is stuck in its first send.
    assert blocking.entered.wait(30) and blocking.sent == []
    blocking.release.set()
    shutdown(timeout=30)
    assert len(blocking.sent) == 3  # one per distinct failure, all delivered by the flush
    assert blocking.threads == {"twinkle-alerts"}


def test_shutdown_takes_at_most_its_timeout_for_all_alert_work(monkeypatch, caplog):
    # Before: a flush with the full timeout, the backend's own flush (torchrun: notify_wait),
    # then a close with the full timeout again. Now one deadline bounds all three.
    from twinkle_core.inprocess import InProcessBackend

    original = InProcessBackend.shutdown

    def shutdown_flushing_too(backend):  # as torchrun's: flush with its own long wait
        backend.flush_alerts(30.0)
        original(backend)

    monkeypatch.setattr(InProcessBackend, "shutdown", shutdown_flushing_too)
    blocking = Blocking()
    initialize("inprocess", groups=[DeviceGroup("g", 1)], notifier=blocking)
    with pytest.raises(KeyError):
        Counter(remote_group="g").fail("x")()
    assert blocking.entered.wait(30)  # the alert is being sent, and will not finish
    started = time.monotonic()
    shutdown(timeout=2.5)
    elapsed = time.monotonic() - started
    blocking.release.set()
    assert 2.5 * 0.9 <= elapsed < 2.5 + MARGIN, elapsed  # flushed (bounded), once
    assert "gave up waiting for alerts" in caplog.text


def test_limit_waits_bounds_every_later_wait():
    blocking = Blocking()
    queue = AlertQueue(blocking)
    assert queue.submit("k", "t", "x")
    assert blocking.entered.wait(30)
    started = time.monotonic()
    queue.limit_waits(1.0)
    assert not queue.flush(60)
    queue.close(60)
    elapsed = time.monotonic() - started
    blocking.release.set()
    assert 0.9 <= elapsed < 1.0 + MARGIN, elapsed


def test_alert_queue_flushes_pending_alerts_at_close():
    rec = Recorder(delay=0.05)
    queue = AlertQueue(rec)
    for i in range(5):
        assert queue.submit(f"k{i}", f"t{i}", "x")
    assert not queue.submit("k0", "t0", "again")  # deduplicated
    queue.close(timeout=30)
    assert [t for t, _ in rec.sent] == [f"t{i}" for i in range(5)]
    assert not queue.submit("k9", "late", "x")  # closed
    assert not queue._thread.is_alive()  # the thread ended with close


def test_alert_queue_is_bounded_and_never_blocks(caplog):
    blocking = Blocking()
    queue = AlertQueue(blocking, maxsize=2)
    assert queue.submit("k0", "t", "x")
    assert blocking.entered.wait(30)  # k0 is being sent, the queue is empty again
    accepted = [queue.submit(f"k{i}", f"t{i}", "x") for i in range(1, 10)]
    # All nine returned while the notifier is stuck: submit never waits for it.
    assert accepted == [True, True] + [False] * 7 and blocking.sent == []
    assert queue.dropped == 7
    drops = [r for r in caplog.records if "dropping alert" in r.getMessage()]
    assert len(drops) == 1  # one warning per burst, not one per alert
    blocking.release.set()
    queue.close(timeout=30)
    assert blocking.sent == ["t", "t1", "t2"]


def test_flush_may_reenter_from_a_signal_handler_on_the_submitting_thread():
    # torchrun's SIGTERM handler flushes on the main thread, which may be inside submit().
    rec = Recorder()
    queue = AlertQueue(rec)
    with queue._cond:  # as if interrupted while holding the queue's lock
        assert queue.submit("k", "t", "x")
        assert queue.flush(30)
    assert rec.sent == [("t", "x")]
    queue.close(timeout=30)


class Holding(Notifier):
    """Holds its alerts back, to be sent by `send_held` once 0.2 s have passed."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.sent: list[str] = []
        self.calls: list[tuple[str, str]] = []  # (method, thread name)
        self.due = 0.0
        self.delivered = threading.Event()
        self.closed_with: float | None = None

    def _note(self, method):
        self.calls.append((method, threading.current_thread().name))

    def send(self, title, text):
        self._note("send")
        self.held.append(title)
        self.due = time.monotonic() + 0.2

    def send_held(self):
        self._note("send_held")
        if not self.held:
            return None
        if time.monotonic() < self.due:
            return self.due - time.monotonic()
        self.sent, self.held = self.sent + self.held, []
        self.delivered.set()
        return None

    def close(self, timeout):
        self._note("close")
        self.closed_with = timeout


def test_the_alert_thread_calls_send_held_back_when_asked():
    holding = Holding()
    queue = AlertQueue(holding)
    started = time.monotonic()
    assert queue.submit("k", "t", "x")
    # Nobody flushes or closes: the thread itself calls back when the notifier asked.
    assert holding.delivered.wait(30)
    assert time.monotonic() - started >= 0.2
    assert holding.sent == ["t"]
    queue.close(timeout=5)
    assert {thread for _, thread in holding.calls} == {"twinkle-alerts"}
    assert holding.calls[0] == ("send", "twinkle-alerts")
    assert holding.calls[-1] == ("close", "twinkle-alerts")
    assert holding.closed_with is not None and 0 < holding.closed_with <= 5


def test_failure_hook_observes_failures(tmp_path, monkeypatch, fresh_plugins):
    monkeypatch.syspath_prepend(str(tmp_path))
    make_plugin(
        tmp_path,
        "twinkle-observer",
        "twinkle_observer",
        """
        from twinkle_core import hookimpl

        SEEN = []

        @hookimpl
        def twinkle_remote_failure(failure):
            SEEN.append((failure.method, failure.group, [f.rank for f in failure.failures]))
            raise RuntimeError("observers must not break the caller")
        """,
    )
    import importlib

    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    with pytest.raises(KeyError):
        Counter(remote_group="g").fail("x")()
    shutdown()
    observer = importlib.import_module("twinkle_observer")
    assert observer.SEEN == [("Counter.fail", "g", [0, 1])]
