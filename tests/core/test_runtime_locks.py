"""No lock in core is held while calling code that may take another (review note in runtime.py).

Each test would hang on the old call path; pytest-timeout and the bounded waits below turn a
hang into a failure instead of a stuck suite.
"""

from __future__ import annotations

import threading

import pytest
from _support.threads import in_thread
from _support.workers import OkOrFail

from twinkle_core import (
    CallTimeoutError,
    DeviceGroup,
    hookimpl,
    initialize,
    shutdown,
)
from twinkle_core.plugins import plugin_system, reset_plugins


@pytest.fixture
def reported():
    """The methods whose failures reach the `twinkle_remote_failure` hook, in order."""
    seen: list[str] = []

    class Seen:
        @hookimpl
        def twinkle_remote_failure(self, failure):
            seen.append(failure.method)

    reset_plugins()
    plugin_system().add(Seen(), name="seen")
    try:
        yield seen
    finally:
        reset_plugins()


def test_a_call_after_an_uncollected_failure_returns():
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    w = OkOrFail(remote_group="g")
    w.fail()  # never collected: settled by the next calls' bookkeeping
    assert in_thread(lambda: [w.ok()() for _ in range(10)]) == ["ok"] * 10
    shutdown()


def test_a_failure_hook_may_make_remote_calls():
    """Reporting a failure runs hooks without the runtime's lock: a hook calling back in works."""
    seen = []

    class CallsBack:
        @hookimpl
        def twinkle_remote_failure(self, failure):
            seen.append((failure.method, w.ok()(timeout=30)))

    reset_plugins()
    plugin = CallsBack()
    plugin_system().add(plugin, name="calls-back")
    try:
        initialize("inprocess", groups=[DeviceGroup("g", 2)])
        w = OkOrFail(remote_group="g")
        with pytest.raises(ValueError):
            in_thread(lambda: w.fail()())
        assert seen == [("OkOrFail.fail", "ok")]
        w.fail()
        in_thread(lambda: [w.ok() for _ in range(8)])  # settles the failure, hook calls back
        shutdown()
    finally:
        reset_plugins()


def test_uncollected_failures_are_settled_in_batches(monkeypatch, reported):
    """A failure nobody collected is reported by later calls once `SETTLE_BATCH` finished
    calls wait or `SETTLE_AFTER_S` passed, not only at shutdown, and not one by one (for Ray
    each settling is a fetch)."""
    from twinkle_core.runtime import Runtime, current_runtime

    monkeypatch.setattr(Runtime, "SETTLE_AFTER_S", 3600.0)  # only the batch size counts
    monkeypatch.setattr(Runtime, "LOOK_EVERY_S", 0.0)  # every call looks ...
    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 0.0)  # ... at calls of any age
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    w = OkOrFail(remote_group="g")
    w.fail()  # never collected
    batch = current_runtime().SETTLE_BATCH
    for _ in range(batch - 2):
        w.ok()
    assert reported == []  # set aside, not settled one by one
    for _ in range(3):
        w.ok()
    assert reported == ["OkOrFail.fail"]
    monkeypatch.setattr(Runtime, "SETTLE_AFTER_S", 0.0)  # now time alone settles
    w.fail()
    w.ok()
    w.ok()
    assert reported == ["OkOrFail.fail"] * 2
    shutdown()


def test_tracking_many_calls_keeps_only_those_in_flight(monkeypatch):
    from twinkle_core.runtime import Runtime, current_runtime

    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 0.0)  # calls of any age are looked at
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    w = OkOrFail(remote_group="g")

    for _ in range(2000):
        w.ok()  # finished at once, never collected
    runtime = current_runtime()
    assert len(runtime._pending) <= 2 * runtime.SWEEP
    assert len(runtime._finished) < runtime.SETTLE_BATCH  # settled in batches, not kept
    shutdown()


def test_tracking_stops_at_a_running_call_and_stays_bounded_behind_long_ones(monkeypatch):
    """With many calls in flight, a look asks one running call, not more (each question is a
    `done()`); finished calls queued behind long-running ones are still retired, so the
    list stays within a small multiple of the calls really running."""
    from twinkle_core import LazyCollect
    from twinkle_core.runtime import Runtime, current_runtime

    monkeypatch.setattr(Runtime, "LOOK_EVERY_S", 0.0)  # every call looks ...
    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 0.0)  # ... at calls of any age
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    runtime = current_runtime()
    looks = []

    def call(running: bool) -> LazyCollect:
        def is_done() -> bool:
            looks.append(running)
            return not running

        return LazyCollect(lambda timeout: None, is_done)

    try:
        long_ones = [call(running=True) for _ in range(10)]
        for lazy in long_ones:
            runtime.track(lazy)
        looks.clear()
        for _ in range(100):
            runtime.track(call(running=True))
        assert len(looks) == 100  # one look per call: the first running call ends it
        for _ in range(2000):
            runtime.track(call(running=False))
        running = 10 + 100
        assert len(runtime._pending) <= 2 * running + 2 * runtime.SWEEP
    finally:
        shutdown()


def test_a_second_waiter_is_bounded_by_its_own_timeout():
    from twinkle_core import LazyCollect

    release = threading.Event()
    lazy = LazyCollect(lambda timeout: release.wait(30) and "value", lambda: release.is_set())
    holder = threading.Thread(target=lazy, daemon=True)
    holder.start()
    while not lazy._lock.locked():
        threading.Event().wait(0.01)
    with pytest.raises(CallTimeoutError, match="another thread is collecting it"):
        lazy(timeout=0.2)
    release.set()
    holder.join(30)
    assert lazy() == "value"


def test_memory_stays_flat_over_many_calls(monkeypatch):
    """No per-call state is kept once a call is resolved or dropped: the number of live
    objects does not grow with the number of calls (one object kept per call would fail).
    Dropped calls are held until they are `LOOK_AFTER_S` old, at most `TRACK_MAX` of them."""
    import gc

    from twinkle_core.runtime import Runtime

    monkeypatch.setattr(Runtime, "TRACK_MAX", 50)
    # Every call looks at the oldest held ones (not every 10 ms): how many dropped calls are
    # held when counting is then the same at both counts, however fast calls are made (a
    # fast machine made over 200 in the last 10 ms, and the count moved by 600 objects).
    monkeypatch.setattr(Runtime, "LOOK_EVERY_S", 0.0)
    initialize("inprocess", groups=[DeviceGroup("g", 1)])
    try:
        w = OkOrFail(remote_group="g")

        def calls(n):
            for i in range(n):
                lazy = w.ok()
                if i % 2:
                    lazy()  # half resolved, half dropped unresolved

        calls(300)  # warm up caches
        gc.collect()
        before = len(gc.get_objects())
        calls(4000)
        gc.collect()
        grown = len(gc.get_objects()) - before
    finally:
        shutdown()
    assert grown < 1000, f"{grown} more live objects after 4000 calls"


def test_a_collected_call_is_released_by_the_runtime_at_once():
    """The runtime watches calls for failures nobody collects, but a call user code collected
    is released right then, not when later calls get round to the list: after the last call
    of a burst nothing else looks at the list, and on Ray what the runtime holds pins the
    call's results in the object store. Nothing here runs the garbage collector: the holder
    and the call must not keep each other alive either."""
    import gc
    import weakref

    from twinkle_core.runtime import current_runtime

    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    gc.disable()
    try:
        w = OkOrFail(remote_group="g")
        lazies = [w.ok() for _ in range(50)]  # a burst, collected after the last was issued
        refs = [weakref.ref(lazy) for lazy in lazies]
        assert all(lazy() == ["ok", "ok"] or lazy() == "ok" for lazy in lazies)
        del lazies
        alive = sum(ref() is not None for ref in refs)
        assert alive == 0, f"{alive} of 50 collected calls still held"
        runtime = current_runtime()
        assert not runtime._pending  # each collected call left on its own
        uncollected = w.ok()  # a call nobody collected stays watched
        assert list(runtime._pending.values()) == [uncollected]
    finally:
        gc.enable()
        shutdown()


def test_shutdown_releases_calls_that_still_run():
    """Calls still running at shutdown are dropped from the watch list without a reference
    cycle left between them and their holders."""
    import gc
    import weakref

    from twinkle_core import LazyCollect
    from twinkle_core.runtime import current_runtime

    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    gc.disable()
    try:
        lazy = LazyCollect(lambda timeout: None, lambda: False)
        current_runtime().track(lazy)
        ref = weakref.ref(lazy)
        del lazy
        shutdown()
        assert ref() is None
    finally:
        gc.enable()


def test_calls_look_at_the_tracked_calls_at_most_every_look_interval(monkeypatch):
    """Asking a call whether it is done can be a question to the backend (Ray: a `ray.wait`,
    about 80 us) costing more than the rest of a call: calls made faster than
    `LOOK_EVERY_S` do not each ask. The first call looks; the next ones only append."""
    from twinkle_core import LazyCollect
    from twinkle_core.runtime import Runtime, current_runtime

    monkeypatch.setattr(Runtime, "LOOK_EVERY_S", 3600.0)
    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 0.0)
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    runtime = current_runtime()
    asked = []

    def call() -> LazyCollect:
        return LazyCollect(lambda timeout: None, lambda: asked.append(1) or False)

    try:
        runtime.track(call())
        assert asked == [1]  # the first call looks: it asks itself, which runs
        for _ in range(50):
            runtime.track(call())
        assert asked == [1]  # within the interval: no look
        runtime._next_look = 0.0  # the interval has passed
        runtime.track(call())
        assert asked == [1, 1]  # one question: the oldest still runs, the look ends there
        for _ in range(49):
            runtime.track(call())
        assert asked == [1, 1]
        assert len(runtime._pending) == 101
    finally:
        runtime._pending.clear()
        shutdown()


def test_calls_collected_soon_after_they_were_made_are_never_asked(monkeypatch, reported):
    """A look asks only calls made at least `LOOK_AFTER_S` ago: a batch of calls issued and
    then collected (the common pattern) costs no question, fetch or settling; a call left
    uncollected is asked once it is that old, and its failure reported."""
    from twinkle_core import LazyCollect
    from twinkle_core.runtime import Runtime, current_runtime

    monkeypatch.setattr(Runtime, "LOOK_EVERY_S", 0.0)  # every call looks ...
    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 3600.0)  # ... at calls an hour old
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    runtime = current_runtime()
    asked = []
    young = [LazyCollect(lambda t: None, lambda: asked.append(1) or True) for _ in range(50)]
    for lazy in young:
        runtime.track(lazy)
    assert asked == []  # all younger than LOOK_AFTER_S
    w = OkOrFail(remote_group="g")
    w.fail()  # never collected
    w.ok()
    assert reported == []
    for lazy in runtime._pending.values():
        lazy._since -= 7200.0  # two hours pass
    monkeypatch.setattr(Runtime, "SETTLE_AFTER_S", 0.0)
    w.ok()
    assert len(asked) == 50 and reported == ["OkOrFail.fail"]
    shutdown()


def test_a_look_asks_without_holding_the_runtime_lock(monkeypatch):
    """`done()` is backend code: a look asks it with the runtime's lock free, so a backend
    whose answer takes the lock (or reports a failure) does not deadlock."""
    from twinkle_core import LazyCollect
    from twinkle_core.runtime import Runtime, current_runtime

    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 0.0)
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    runtime = current_runtime()
    free = []

    def is_done() -> bool:
        got = runtime._lock.acquire(timeout=5)
        free.append(got)
        if got:
            runtime._lock.release()
        return True

    try:
        runtime.track(LazyCollect(lambda timeout: None, is_done))
        runtime._next_look = 0.0
        in_thread(lambda: runtime.track(LazyCollect(lambda timeout: None, lambda: True)))
        assert free == [True]
    finally:
        shutdown()


def test_a_dropped_call_is_settled_while_no_further_call_is_made(monkeypatch, reported):
    """The runtime's watcher thread looks at the watched calls by itself: the failure of a
    call dropped uncollected is reported (and its results freed) even when the driver makes
    no further call."""
    import time

    from twinkle_core.runtime import Runtime

    monkeypatch.setattr(Runtime, "LOOK_AFTER_S", 0.0)
    monkeypatch.setattr(Runtime, "SETTLE_AFTER_S", 0.0)
    monkeypatch.setattr(Runtime, "WATCH_EVERY_S", 0.05)
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    w = OkOrFail(remote_group="g")
    w.fail()  # dropped; no call after it
    end = time.monotonic() + 30
    while not reported and time.monotonic() < end:
        time.sleep(0.02)
    assert reported == ["OkOrFail.fail"]
    shutdown()
