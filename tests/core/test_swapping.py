"""Roles take turns on a group's devices (issue 27, item 3): `offload()`/`onload()` run around
switches between colocated objects, so at most one role holds its device buffers at a time,
and results are those of a run without swapping."""

from __future__ import annotations

import numpy as np
import pytest

from twinkle_core import (
    DeviceGroup,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

#: Per worker rank, the roles holding their buffers "on the device" right now, and every
#: switch seen (in-process: one table for all simulated workers).
ON_DEVICE: dict[int, set[str]] = {}
EVENTS: list[str] = []


class _Role:
    fail_offload = False

    def __init__(self, name, scale):
        self.name, self.scale = name, scale
        self.weights = np.arange(4.0) * scale  # the "device" buffers
        self._hold()

    def _hold(self):
        holders = ON_DEVICE.setdefault(get_worker_context().rank, set())
        holders.add(self.name)
        assert len(holders) == 1, f"two roles hold the device: {sorted(holders)}"

    def offload(self):
        if self.fail_offload:
            raise RuntimeError(f"{self.name} cannot offload")
        EVENTS.append(f"off:{self.name}:{get_worker_context().rank}")
        self.cpu_copy, self.weights = self.weights, None
        ON_DEVICE[get_worker_context().rank].discard(self.name)

    def onload(self):
        EVENTS.append(f"on:{self.name}:{get_worker_context().rank}")
        self.weights, self.cpu_copy = self.cpu_copy, None
        self._hold()

    @remote_function(dispatch="slice_dp", collect="mean")
    def step(self, batch):
        return float(np.sum(self.weights) * np.sum(batch))


@remote_class()
class Role(_Role):
    pass


@remote_class(swap=False)
class Plain:
    def __init__(self, name, scale):
        self.weights = np.arange(4.0) * scale

    @remote_function(dispatch="slice_dp", collect="mean")
    def step(self, batch):
        return float(np.sum(self.weights) * np.sum(batch))


def _interleaved(cls):
    policy = cls("policy", 1.0, remote_group="g")
    reference = cls("reference", 2.0, remote_group="g")
    sampler = cls("sampler", 3.0, remote_group="g")
    out = []
    for step in range(3):
        batch = [step, step + 1, step + 2, step + 3]
        out += [policy.step(batch)(), sampler.step(batch)(), reference.step(batch)()]
    return out


@pytest.fixture
def fresh():
    ON_DEVICE.clear()
    EVENTS.clear()
    Role.fail_offload = False
    initialize(mode="inprocess", groups=[DeviceGroup("g", 2, "cpu")])
    yield
    shutdown()


def test_at_most_one_role_holds_the_device_and_results_are_unchanged(fresh):
    swapped = _interleaved(Role)  # every switch asserts a single holder (in _hold)
    assert all(len(holders) == 1 for holders in ON_DEVICE.values())
    switched = len(EVENTS)
    plain = _interleaved(Plain)  # building the first Plain offloads the last Role
    assert swapped == plain
    assert len(EVENTS) == switched + 2
    # Built in turn (each offloads the one before), then step by step: off the last role,
    # on the called one, on every worker, once per switch.
    assert EVENTS[:4] == ["off:policy:0", "off:policy:1", "off:reference:0", "off:reference:1"]
    assert EVENTS[4:8] == ["off:sampler:0", "off:sampler:1", "on:policy:0", "on:policy:1"]
    # Built: 2 offloads x 2 ranks; then 9 calls, each a switch: offload and onload x 2 ranks.
    assert switched == 4 + 9 * 4


def test_no_switch_while_one_role_is_called_again(fresh):
    policy = Role("policy", 1.0, remote_group="g")
    for _ in range(3):
        policy.step([1, 2])()
    assert EVENTS == []


def test_a_failing_offload_fails_the_call_that_needed_it_and_the_group_goes_on(fresh):
    policy = Role("policy", 1.0, remote_group="g")
    sampler = Role("sampler", 3.0, remote_group="g")  # policy offloaded to build it
    policy.step([1, 2])()  # sampler off, policy on
    Role.fail_offload = True
    with pytest.raises(RuntimeError, match="policy cannot offload") as info:
        sampler.step([1, 2])  # the switch runs before the call is submitted
    notes = "\n".join(getattr(info.value, "__notes__", []))
    text = str(info.value) + notes
    assert "Role.offload" in text and "test_swapping.py" in text
    Role.fail_offload = False
    assert sampler.step([1, 2])() == 3 * 6 * 1.5  # the switch is tried again, and works
