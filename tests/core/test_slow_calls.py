"""A driver waiting for a slow call says so, under `twinkle.wait`, every interval.

The calls here run on a small backend whose calls finish when the test says so (a real
plugin registered at run time), so "slow" is decided by the test, not by the machine's speed.
"""

from __future__ import annotations

import logging
import threading

import pytest

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
from twinkle_core.plugin import (
    CompletedCall,
    ExecutionBackend,
    PendingCall,
    WorkerGroup,
    hookimpl,
)
from twinkle_core.plugins import plugin_system


class _Held(PendingCall):
    """Finishes when `release` is set."""

    def __init__(self, release: threading.Event, n: int) -> None:
        self.release = release
        self.n = n

    def done(self) -> bool:
        return self.release.is_set()

    def wait(self, timeout):
        assert self.release.wait(60), "the test never released the call"
        return [None] * self.n


class _Group(WorkerGroup):
    def submit(self, call):
        if call.method == "slow":
            return _Held(self.release, len(call.calls))
        return CompletedCall([None] * len(call.calls))


class _Backend(ExecutionBackend):
    name = "held"

    def create_workers(self, cls, group, device_mesh, args, kwargs, *, num_workers):
        workers = _Group(group, device_mesh, cls.__name__, num_workers)
        workers.release = self.release
        return workers


class _Plugin:
    @hookimpl
    def register_backends(self, register):
        register("held", _Backend)


@remote_class()
class Job:
    @remote_function(dispatch="all")
    def slow(self):
        return None

    @remote_function(dispatch="all")
    def fast(self):
        return None


@pytest.fixture
def job(fresh_plugins, monkeypatch):
    monkeypatch.setenv("TWINKLE_WAIT_LOG_INTERVAL", "0.2")
    plugin_system().add(_Plugin(), "held-backend")
    release = threading.Event()
    _Backend.release = release
    initialize("held", groups=[DeviceGroup("g", 2)])
    try:
        yield Job(remote_group="g"), release
    finally:
        release.set()
        shutdown()


def test_a_slow_call_is_reported_while_the_driver_waits(job, caplog):
    obj, release = job
    caplog.set_level(logging.INFO, logger="twinkle.wait")
    lazy = obj.slow()  # a line of this file: the message names it
    timer = threading.Timer(1.5, release.set)
    timer.start()
    try:
        lazy()
    finally:
        timer.cancel()
    lines = [r.getMessage() for r in caplog.records if r.name == "twinkle.wait"]
    assert lines, "nothing was logged during a 1.5 s wait with a 0.2 s interval"
    assert all("still waiting for Job.slow on group 'g' (called at" in m for m in lines)
    assert all("test_slow_calls.py:" in m for m in lines)
    count = len(lines)
    obj.fast()()
    threading.Event().wait(0.6)  # three intervals: the finished wait is no longer reported
    assert len([r for r in caplog.records if r.name == "twinkle.wait"]) == count


def test_finished_calls_never_register_a_wait(job, caplog):
    obj, release = job
    release.set()
    caplog.set_level(logging.INFO, logger="twinkle.wait")
    from twinkle_core import slow_calls

    for _ in range(50):
        obj.slow()()
    assert slow_calls._watcher._thread is None or not slow_calls._watcher._waits
    threading.Event().wait(0.5)
    assert not [r for r in caplog.records if r.name == "twinkle.wait"]


def test_the_watcher_keeps_nothing_of_a_finished_wait(monkeypatch):
    """What a wait's description holds (a call, and on Ray its refs) is let go when the wait
    ends, not kept by the watcher thread through its sleep: a Ray ref kept that way outlived
    its session once and, freed after the next `initialize`, ended the process."""
    import gc
    import time
    import weakref

    from twinkle_core import slow_calls

    # Described every 1 s; the watcher then sleeps WATCH_TICK_S (0.5 s) between looks.
    monkeypatch.setenv("TWINKLE_WAIT_LOG_INTERVAL", "1")
    described = threading.Event()

    class Call:
        pass

    def description(call: Call):
        def text() -> str:
            described.set()  # on the watcher's thread, in its look at the waits
            return f"a call ({type(call).__name__})"

        return text

    call = Call()
    gone = weakref.ref(call)
    with slow_calls.waiting_for(description(call)):
        assert described.wait(30), "the watcher never looked at the wait"
    del call
    time.sleep(0.1)  # the look has ended; the watcher sleeps for about 0.4 s more
    gc.collect()
    assert gone() is None, "the watcher thread still holds the finished wait's description"
