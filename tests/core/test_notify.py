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


def test_a_slow_notifier_never_delays_the_failing_call():
    rec = Recorder(delay=2.0)
    initialize("inprocess", groups=[DeviceGroup("g", 2)], notifier=rec)
    c = Counter(remote_group="g")
    start = time.monotonic()
    for message in ("a", "b", "c"):
        with pytest.raises(KeyError):
            c.fail(message)()
    assert time.monotonic() - start < 1.0
    start = time.monotonic()
    shutdown(timeout=0.5)
    assert time.monotonic() - start < 1.5  # bounded flush, not 3 x 2 s
    assert len(rec.sent) <= 1


def test_alert_queue_flushes_pending_alerts_at_close():
    rec = Recorder(delay=0.05)
    queue = AlertQueue(rec)
    for i in range(5):
        assert queue.submit(f"k{i}", f"t{i}", "x")
    assert not queue.submit("k0", "t0", "again")  # deduplicated
    queue.close(timeout=5)
    assert [t for t, _ in rec.sent] == [f"t{i}" for i in range(5)]
    assert not queue.submit("k9", "late", "x")  # closed


def test_alert_queue_is_bounded_and_never_blocks():
    release = threading.Event()

    class Stuck(Notifier):
        def send(self, title, text):
            release.wait(10)

    queue = AlertQueue(Stuck(), maxsize=2)
    start = time.monotonic()
    accepted = [queue.submit(f"k{i}", "t", "x") for i in range(10)]
    assert time.monotonic() - start < 0.5
    assert accepted.count(True) <= 3 and accepted[0]
    release.set()
    queue.close(timeout=5)


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
