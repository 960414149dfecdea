"""Driver threads calling one Ray group at once: every call whole, the streams of one thread.

The in-process version of this test is in tests/core/test_reliability.py; the meaning must be
the same here: each worker runs one call at a time, its k-th call draws what the k-th call of
a single-threaded run draws, whichever thread made it, and the driver's generators never move.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import ray.cloudpickle
from _support.threads import from_threads

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import it


@remote_class()
class Drawer:
    def __init__(self) -> None:
        self.calls = 0

    @remote_function(dispatch="all", collect="none")
    def draw(self):
        self.calls += 1
        return [self.calls, int(np.random.randint(0, 10**9)), random.random()]


@pytest.fixture(scope="module")
def run(cluster):
    initialize(
        "ray",
        address=cluster.address,
        seed=3,
        groups=[DeviceGroup("g", 2, "cpu")],
        cpus_per_worker=0.5,
        name="threads-test",
    )
    try:
        yield
    finally:
        shutdown()


def _draws(threads: int, per_thread: int) -> list:
    drawer = Drawer(remote_group="g")  # a fresh pair of workers, seeded with the run's seed
    return from_threads(lambda: drawer.draw()(), threads, per_thread, timeout=240)


def test_driver_threads_calling_one_group_get_the_single_threaded_streams(run):
    before = (random.getstate(), np.random.get_state()[1].copy())
    concurrent = _draws(threads=8, per_thread=10)
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all()
    serial = _draws(threads=1, per_thread=80)
    assert sorted(concurrent) == sorted(serial)
    # Every worker counted 80 calls, each exactly once: no call was lost or run twice.
    for rank in range(2):
        assert sorted(v[rank][0] for v in concurrent) == list(range(1, 81))


def test_lazy_results_resolved_from_other_threads_are_each_their_own_call(run):
    drawer = Drawer(remote_group="g")
    lazies = [drawer.draw() for _ in range(40)]
    values = from_threads(lambda: [lazy() for lazy in lazies], threads=4, per_thread=1)
    # Four threads resolving the same 40 LazyCollects see the same 40 values, in issue order.
    assert all(v == values[0] for v in values)
    assert [v[0][0] for v in values[0]] == list(range(1, 41))
