"""Colocated roles on Ray (issue 27, item 1): the objects of one group share its actors, one
process per rank; a role may still ask for processes of its own (`colocate=False`)."""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import numpy as np
import pytest
import ray.cloudpickle

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    WorkerDiedError,
    collective_group,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: What this process's objects did, in the order they did it (one list per worker process).
_LOG: list[str] = []


@remote_class()
class Role:
    def __init__(self, name):
        self.name = name
        # Seeded as a fresh worker: the first draws of the run's seed, whoever else is here.
        self.first = [random.random(), float(np.random.random())]

    @remote_function(dispatch="all", collect="none")
    def where(self):
        return [get_worker_context().rank, os.getpid()]

    @remote_function(dispatch="all", collect="none")
    def mark(self, tag):
        _LOG.append(f"{self.name}:{tag}")
        return len(_LOG)

    @remote_function(dispatch="all", collect="none")
    def nap(self, seconds):
        time.sleep(seconds)
        return True

    @remote_function(dispatch="all", collect="none")
    def log(self):
        return list(_LOG)

    @remote_function(dispatch="all", collect="none")
    def draws(self):
        return [self.first, [random.random(), float(np.random.random())]]


@remote_class(colocate=False)
class Loner(Role):
    pass


@remote_class()
class Broken:
    def __init__(self):
        raise ValueError("broken on purpose")


def _fresh_draws(seed: int) -> list[float]:
    random.seed(seed)
    np.random.seed(seed)
    return [random.random(), float(np.random.random())]


@pytest.fixture
def run(cluster, no_runtime):
    initialize("ray", address=cluster.address, seed=5, groups=[DeviceGroup("g", 2, "cpu")])
    try:
        yield
    finally:
        shutdown()


def test_objects_of_one_group_share_one_process_per_rank(run):
    policy, reference = Role("policy", remote_group="g"), Role("reference", remote_group="g")
    here = policy.where()()
    assert reference.where()() == here  # the same process on each rank
    assert len({pid for _, pid in here}) == 2  # and one per rank
    loner = Loner("loner", remote_group="g")  # processes of its own
    assert not {pid for _, pid in loner.where()()} & {pid for _, pid in here}


def test_calls_to_colocated_objects_run_in_the_order_issued(run):
    a, b = Role("a", remote_group="g"), Role("b", remote_group="g")
    pending = [a.mark(1), b.mark(1), a.mark(2), b.mark(2), a.mark(3)]  # none awaited
    assert [p() for p in pending] == [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]]
    assert a.log()() == [["a:1", "b:1", "a:2", "b:2", "a:3"]] * 2


def test_each_colocated_object_has_generators_of_its_own(run):
    """Seeded like a fresh worker, drawing its own sequence, whatever its neighbours draw: the
    numbers of a process of its own (as inprocess and torchrun give)."""
    first = _fresh_draws(5)
    a = Role("a", remote_group="g")
    a_draws = a.draws()()
    b = Role("b", remote_group="g")  # built after a drew: still the seed's first numbers
    b_draws = b.draws()()
    again = a.draws()()
    for rank in range(2):
        assert a_draws[rank][0] == first and b_draws[rank][0] == first
        assert b_draws[rank][1] == a_draws[rank][1]  # each continues its own sequence
        assert again[rank][1] != a_draws[rank][1]


@remote_class()
class TorchRole:
    """Draws from python's, numpy's and torch's generators (torch imported by the role)."""

    def __init__(self):
        import torch

        self.first = [random.random(), float(np.random.normal()), float(torch.rand(1))]

    @remote_function(dispatch="all", collect="none")
    def draws(self):
        import torch

        return [random.random(), float(np.random.normal()), float(torch.randn(1))]


@remote_class(colocate=False)
class TorchLoner(TorchRole):
    pass


def test_colocated_objects_draw_what_processes_of_their_own_draw(run):
    """Three roles share each rank's process: the third one's python, numpy (a cached normal
    deviate included) and torch numbers, call after call interleaved with the others' draws,
    are those of the same role in processes of its own."""
    a, b, c = TorchRole(remote_group="g"), TorchRole(remote_group="g"), TorchRole(remote_group="g")
    alone = TorchLoner(remote_group="g")
    shared, own = [], []
    for step in range(4):
        if step % 2:
            a.draws()(), b.draws()()  # the neighbours draw between c's calls
        shared.append(c.draws()())
        own.append(alone.draws()())
    assert shared == own
    assert len({repr(x) for x in shared}) == 4  # each call drew new numbers


def test_roles_called_in_runs_draw_what_processes_of_their_own_draw(run):
    """A later role's generators stay in its process's place after its call (its next call
    switches nothing), and the first role's call puts the process's own back first: runs of
    calls to one role, then the other, draw what each draws in processes of its own."""
    first, second = TorchRole(remote_group="g"), TorchRole(remote_group="g")  # slots 0 and 1
    first_alone, second_alone = TorchLoner(remote_group="g"), TorchLoner(remote_group="g")
    shared, own, of_first = [], [], []
    for role, alone, times in (
        (second, second_alone, 3),
        (first, first_alone, 2),
        (second, second_alone, 1),
        (first, first_alone, 3),
    ):
        for _ in range(times):
            shared.append(role.draws()())
            own.append(alone.draws()())
            if role is first:
                of_first.append(repr(shared[-1]))
    assert shared == own
    assert len(set(of_first)) == 5  # each call drew new numbers


def test_a_failed_constructor_leaves_the_group_usable(run):
    a = Role("a", remote_group="g")
    with pytest.raises(ValueError, match="broken on purpose"):
        Broken(remote_group="g")
    c = Role("c", remote_group="g")  # the next slot, numbered alike on every rank
    assert c.where()() == a.where()()
    assert c.mark("x")() == [1, 1] and a.log()() == [["c:x"]] * 2


def test_a_collective_group_of_two_colocated_objects_is_refused(run):
    a, b = Role("a", remote_group="g"), Role("b", remote_group="g")
    with pytest.raises(ConfigurationError, match=r"colocated.*colocate=False"):
        collective_group("weights", [a, b])


def test_a_killed_shared_process_fails_every_role_on_it_attributably(run):
    """SIGKILL rank 1's process: both roles living in it fail with WorkerDiedError naming the
    group, rank 1 and the class, at the driver's call site, within a bound; a new role on the
    group gets fresh processes."""
    policy, reference = Role("policy", remote_group="g"), Role("reference", remote_group="g")
    pid = dict(policy.where()())[1]
    busy = policy.nap(30)
    queued = reference.nap(0)  # behind the nap in the same process
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"rank 1 of group 'g' \(Role\)") as info:
        busy()
    assert "test_colocation.py" in str(info.value)  # the driver's own call site
    # The other role in the dead process fails too (the group is torn down as a whole).
    with pytest.raises(WorkerDiedError, match=r"of group 'g' \(Role\)"):
        queued()
    assert time.monotonic() - start < 15.0
    fresh = Role("fresh", remote_group="g")
    assert pid not in {p for _, p in fresh.where()()}
