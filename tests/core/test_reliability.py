"""Faults and bad input in mode 'inprocess': clear early errors, never a silent wrong answer."""

from __future__ import annotations

import random

import numpy as np
import pytest
from _support.threads import from_threads

from twinkle_core import (
    CollectError,
    ConfigurationError,
    DeviceGroup,
    NotInitializedError,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)


@remote_class()
class Drawer:
    def __init__(self) -> None:
        self.calls = 0

    @remote_function(dispatch="all", collect="none")
    def draw(self):
        self.calls += 1
        return [self.calls, int(np.random.randint(0, 10**9)), random.random()]

    @remote_function(dispatch="all", collect="mean")
    def words(self):
        return "not a number"

    @remote_function(dispatch="all", collect="first")
    def fail_with_pid(self):
        from twinkle_core import get_worker_context

        raise RuntimeError(f"worker pid {4000 + get_worker_context().rank} at 0x7f{id(self):x}")


def _draws(threads: int, per_thread: int) -> tuple[list, bool]:
    initialize("inprocess", seed=3, groups=[DeviceGroup("g", 2)])
    try:
        drawer = Drawer(remote_group="g")
        before = (random.getstate(), np.random.get_state()[1].copy())
        out = from_threads(lambda: drawer.draw()(), threads, per_thread)
        untouched = random.getstate() == before[0] and bool(
            (np.random.get_state()[1] == before[1]).all()
        )
        return out, untouched
    finally:
        shutdown()


def test_driver_threads_calling_one_group_get_the_single_threaded_streams():
    concurrent, untouched = _draws(threads=8, per_thread=25)
    assert untouched  # the workers' draws never moved the driver's generators
    serial, _ = _draws(threads=1, per_thread=200)
    # Each call ran whole on each worker: the k-th call of a worker draws what the k-th call
    # of a single-threaded run draws, whichever thread made it.
    assert sorted(concurrent) == sorted(serial)
    assert len({tuple(map(tuple, v)) for v in concurrent}) == 200


@pytest.mark.parametrize("kind", ["staticmethod", "classmethod", "property"])
def test_remote_function_on_a_static_class_or_property_is_refused_at_definition(kind):
    wrap = {"staticmethod": staticmethod, "classmethod": classmethod, "property": property}[kind]
    with pytest.raises(ConfigurationError, match=f"@{kind}"):  # below @remote_function

        class Below:
            @remote_function(dispatch="all")
            @wrap
            def f(self):
                return 1

    with pytest.raises(ConfigurationError, match=f"@{kind} above @remote_function"):

        @remote_class()
        class Above:
            @wrap
            @remote_function(dispatch="all")
            def f(self):
                return 1


def test_a_collector_that_cannot_combine_names_method_collector_and_call_site():
    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    try:
        lazy = Drawer(remote_group="g").words()  # this line is the call site
        line = test_a_collector_that_cannot_combine_names_method_collector_and_call_site
        with pytest.raises(CollectError) as info:
            lazy()
        text = str(info.value)
        assert "Drawer.words" in text and "collect='mean'" in text
        assert f"{__file__}:{line.__code__.co_firstlineno + 3}" in text
        assert isinstance(info.value, TypeError)  # still what a bare TypeError was
    finally:
        shutdown()


def test_an_object_used_after_shutdown_raises_clearly():
    initialize("inprocess", groups=[DeviceGroup("g", 1)])
    drawer = Drawer(remote_group="g")
    assert drawer.draw()()[0][0] == 1
    shutdown()
    with pytest.raises(NotInitializedError, match=r"Drawer\.draw: this object belongs to run"):
        drawer.draw()
    initialize("inprocess", groups=[DeviceGroup("g", 1)])
    try:
        with pytest.raises(NotInitializedError, match="was shut down"):
            drawer.draw()  # a new run does not revive the old object
    finally:
        shutdown()


@pytest.mark.parametrize("device_type", ["gpu", "tpu", "cuda"])
def test_a_device_type_without_platform_or_device_is_refused(device_type):
    with pytest.raises(ConfigurationError, match="device_type="):
        initialize("inprocess", groups=[DeviceGroup("g", 2, device_type)])


def test_one_alert_per_error_whatever_numbers_its_message_holds():
    alerts: list[str] = []
    initialize("inprocess", groups=[DeviceGroup("g", 3)], notifier=alerts.append)
    try:
        drawer = Drawer(remote_group="g")
        for _ in range(2):
            with pytest.raises(RuntimeError, match="worker pid 4000"):
                drawer.fail_with_pid()()
    finally:
        shutdown()
    assert len(alerts) == 1, alerts
