"""Roles take turns on a Ray group's actors (issue 27, item 3): the same `offload()`/`onload()`
switches as in-process (tests/core/test_swapping.py), in the shared actor of each rank."""

from __future__ import annotations

import sys

import numpy as np
import ray.cloudpickle

from twinkle_core import (
    DeviceGroup,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The roles holding their buffers in this process right now.
HOLDERS: set[str] = set()


@remote_class()
class Role:
    def __init__(self, name, scale):
        self.name, self.weights, self.parked = name, np.arange(4.0) * scale, None
        HOLDERS.add(name)

    def offload(self):
        self.parked, self.weights = self.weights, None
        HOLDERS.discard(self.name)

    def onload(self):
        self.weights, self.parked = self.parked, None
        HOLDERS.add(self.name)

    @remote_function(dispatch="slice_dp", collect="none")
    def step(self, batch):
        # Runs after the switch: only this role holds the device on this rank.
        return [get_worker_context().rank, sorted(HOLDERS), float(np.sum(self.weights * 2))]


def test_roles_take_turns_in_the_shared_actors(cluster, no_runtime):
    initialize("ray", address=cluster.address, groups=[DeviceGroup("g", 2, "cpu")])
    try:
        named = [("policy", 1), ("ref", 2), ("gen", 3)]
        roles = [(Role(n, s, remote_group="g"), n, s) for n, s in named]
        for _ in range(2):
            for role, name, scale in roles:
                got = role.step([1, 2])()
                # on both ranks: only the called role holds its buffers, which are its own
                assert got == [[0, [name], 12.0 * scale], [1, [name], 12.0 * scale]]
    finally:
        shutdown()
