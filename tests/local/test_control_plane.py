"""The control plane in one process: generator switching, method timeouts, driver threads,
objects of a shut-down run, and device checks at initialize (torchrun jobs: test_reliability)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from _support.rng import DRAWS, WHO, check_switching
from _support.threads import from_threads, in_thread
from _support.workers import OkOrFail
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_core import (
    CallTimeoutError,
    ConfigurationError,
    DeviceGroup,
    NotInitializedError,
    get_worker_context,
    initialize,
    is_initialized,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.rng_switch import rng_switch
from twinkle_local.env import TorchrunEnv
from twinkle_local.planning import check_devices
from twinkle_local.platforms import TorchCpuPlatform

pytestmark = pytest.mark.usefixtures("single_process")


# --------------------------------------------------------------------------- generator switch
#: The shared check's draws, and torch's (twinkle-local's generator in core's switch).
TORCH_DRAWS = {
    **DRAWS,
    "torch_rand": lambda: float(torch.rand(1)),
    "torch_randn": lambda: float(torch.randn(1)),
}


def _constructor_draws() -> None:
    random.random(), np.random.normal(), torch.rand(2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(WHO), st.sampled_from(sorted(TORCH_DRAWS))), max_size=40))
def test_switching_draws_exactly_what_full_save_and_restore_draws(steps):
    torch.rand(1)  # torch imported and drawn from before the switch sees it
    assert any(type(g).__name__ == "TorchGenerator" for g in rng_switch().generators)
    check_switching(steps, TORCH_DRAWS, _constructor_draws)


# --------------------------------------------------------------------------- calls
@remote_class()
class Busy:
    def __init__(self) -> None:
        self.calls = 0

    @remote_function(dispatch="all", collect="first", timeout=0.5)
    def spin(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # pure Python: interrupted where it runs
            pass
        return "finished"

    @remote_function(dispatch="all", collect="first")
    def draw(self):
        self.calls += 1
        return [self.calls, int(np.random.randint(0, 10**9)), float(torch.rand(1))]

    @remote_function(dispatch="all", collect="first")
    def call_other(self, other):
        return other.draw()()


def test_a_method_past_its_timeout_is_stopped_in_a_lone_process():
    initialize("local")
    try:
        busy = Busy(remote_group="default")
        start = time.monotonic()
        with pytest.raises(
            CallTimeoutError, match=r"\] Busy\.spin on group 'default' did not .*timeout=0\.5s"
        ):
            busy.spin(30)()
        assert time.monotonic() - start < 10  # stopped, not run for 30 s
        assert busy.draw()()[0] == 1  # the worker goes on
    finally:
        shutdown()


def _lone_draws(threads: int, per_thread: int) -> list:
    initialize("local", seed=5)
    try:
        busy = Busy(remote_group="default")
        out = from_threads(lambda: busy.draw()(), threads, per_thread)
        return sorted(out)
    finally:
        shutdown()


def test_driver_threads_get_the_single_threaded_stream_in_a_lone_process():
    assert _lone_draws(8, 25) == _lone_draws(1, 200)


def test_an_object_of_a_shut_down_run_used_inside_a_worker_raises_clearly():
    """Core checks driver calls; a call from inside a worker reaches the backend's check."""
    initialize("local")
    old = Busy(remote_group="default")
    name = old._twinkle_binding.run_name
    shutdown()
    initialize("local")
    try:
        caller = Busy(remote_group="default")
        with pytest.raises(NotInitializedError) as info:
            caller.call_other(old)()
        message = f"Busy.draw: this object belongs to run {name!r}, which was shut down"
        assert message in str(info.value), str(info.value)
        assert get_worker_context() is None
    finally:
        shutdown()


# --------------------------------------------------------------------------- devices
def test_an_unknown_device_type_is_a_configuration_error_at_initialize():
    with pytest.raises(ConfigurationError, match=r"DeviceGroup 'g' asks for device_type 'tpu'"):
        initialize("local", groups=[DeviceGroup("g", 1, "tpu")])
    assert not is_initialized()


def test_more_processes_than_devices_on_a_node_is_a_configuration_error(fake_cuda):
    """torchrun --nproc_per_node=8 on a node with 4 GPUs: process 5 has no device of its own."""
    env = TorchrunEnv(8, 5, 5, 8, "127.0.0.1", 29500)
    group = DeviceGroup("gpus", 8, "cuda")
    with pytest.raises(ConfigurationError, match=r"local cuda device 5 .* 4 such device"):
        check_devices(group, env, TorchCpuPlatform())
    check_devices(group, TorchrunEnv(8, 3, 3, 8, "127.0.0.1", 29500), TorchCpuPlatform())


# --------------------------------------------------------------------------- lock order


def test_a_failure_hook_may_make_remote_calls_and_uncollected_failures_settle():
    """The backend's lock is taken after a LazyCollect's (a failure hook calling back in), never
    the other way round; calls after an uncollected failure return."""
    from twinkle_core import hookimpl
    from twinkle_core.plugins import plugin_system, reset_plugins

    seen = []

    class CallsBack:
        @hookimpl
        def twinkle_remote_failure(self, failure):
            seen.append((failure.method, flaky.ok()(timeout=30)))

    reset_plugins()
    plugin_system().add(CallsBack(), name="calls-back")
    try:
        initialize("local")
        try:
            flaky = OkOrFail(remote_group="default")
            with pytest.raises(ValueError):
                in_thread(lambda: flaky.fail()())
            assert seen == [("OkOrFail.fail", "ok")]
            flaky.fail()  # never collected: settled by later calls' bookkeeping
            assert in_thread(lambda: [flaky.ok()() for _ in range(10)]) == ["ok"] * 10
        finally:
            shutdown()
    finally:
        reset_plugins()
