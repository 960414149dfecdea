"""Collective groups on Ray: 2 + 2 actors of two groups in one separate torch.distributed world."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray.cloudpickle

from twinkle_core import (
    CallTimeoutError,
    ConfigurationError,
    DeviceGroup,
    collective,
    collective_group,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Reducing:
    """The reductions both sides of a collective group run (inherited remote functions)."""

    @remote_function(dispatch="all", collect="flatten")
    def reduce(self, name: str, op: str) -> list:
        import torch

        c = collective(name)
        (t,) = c.all_reduce([torch.full((3,), float(c.rank + 1))], op=op)
        return [t.tolist()]

    @remote_function(dispatch="all", collect="flatten")
    def gather(self, name: str) -> list:
        import torch

        c = collective(name)
        c.barrier()
        return [[float(t) for t in c.all_gather(torch.tensor([float(c.rank)]))]]


@remote_class()
class Policy(Reducing):
    """Has its own default process group (its group's world), like a data-parallel trainer."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.weights = torch.arange(8, dtype=torch.float32) + 100 * get_worker_context().rank

    @remote_function(dispatch="all", collect="flatten")
    def push(self, name: str) -> list:
        c = collective(name)
        c.broadcast([self.weights], src=0)
        return [(c.rank, c.world_size, c.process_group is not None, self.weights.tolist())]

    @remote_function(dispatch="all", collect="flatten")
    def own_world(self) -> list:
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return [(dist.get_world_size(), float(t))]

    @remote_function(dispatch="all", collect="none")
    def hold_until(self, release: str, limit: float) -> None:
        """Stay busy (so that a call queued behind this one waits) until the file `release`
        exists, at most `limit` s: a member as late as the test needs, released at once."""
        deadline = time.monotonic() + limit
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)


@remote_class()
class Sampler(Reducing):
    """No process group of its own."""

    def __init__(self) -> None:
        import torch

        self.weights = torch.zeros(8)

    @remote_function(dispatch="all", collect="flatten")
    def pull(self, name: str) -> list:
        import torch.distributed as dist

        c = collective(name)
        c.broadcast(self.weights, src=0)
        return [(c.rank, c.world_size, dist.is_initialized(), self.weights.tolist())]

    @remote_function(dispatch="all", collect="flatten")
    def raw_torch(self, name: str) -> list:
        """The process group with torch's own calls: `src` is a rank of the collective group."""
        import torch
        import torch.distributed as dist

        c = collective(name)
        t = torch.zeros(2)
        dist.broadcast(t, src=1, group=c.process_group)
        return [t.tolist()]


@remote_class()
class RawPolicy(Policy):
    @remote_function(dispatch="all", collect="flatten")
    def raw_torch(self, name: str) -> list:
        import torch
        import torch.distributed as dist

        c = collective(name)
        t = torch.full((2,), 7.0) if c.rank == 1 else torch.zeros(2)
        dist.broadcast(t, src=1, group=c.process_group)
        return [t.tolist()]


@pytest.fixture(scope="module")
def run(cluster):
    initialize(
        "ray",
        address=cluster.address,
        groups=[
            DeviceGroup("policy", 2, "cpu"),
            DeviceGroup("sampler", 2, "cpu"),
            DeviceGroup("slow", 1, "cpu"),
        ],
        name="collective-test",
    )
    try:
        policy = RawPolicy(remote_group="policy")
        sampler = Sampler(remote_group="sampler")
        group = collective_group("sync", [policy, sampler], timeout=60)
        yield policy, sampler, group
    finally:
        shutdown()


def test_broadcast_from_policy_rank_0_reaches_both_groups(run):
    policy, sampler, group = run
    assert group.world_size == 4 and group.ranks_of(sampler) == [2, 3]
    sent, got = policy.push("sync"), sampler.pull("sync")
    expected = [float(i) for i in range(8)]
    assert sent() == [(0, 4, True, expected), (1, 4, True, expected)]
    # the sampler has no default group: the collective group is a world of its own
    assert got() == [(2, 4, False, expected), (3, 4, False, expected)]
    # and the policy's own world (2 ranks) is untouched
    assert policy.own_world()() == [(2, 2.0), (2, 2.0)]


def test_all_reduce_all_gather_and_barrier_across_the_groups(run):
    policy, sampler, _ = run
    for op, value in (("sum", 10.0), ("mean", 2.5), ("max", 4.0), ("product", 24.0)):
        a, b = policy.reduce("sync", op), sampler.reduce("sync", op)
        assert a() + b() == [[value] * 3] * 4, op
    a, b = policy.gather("sync"), sampler.gather("sync")
    assert a() + b() == [[0.0, 1.0, 2.0, 3.0]] * 4


def test_the_process_group_works_with_torch_calls(run):
    policy, sampler, _ = run
    a, b = policy.raw_torch("sync"), sampler.raw_torch("sync")
    assert a() + b() == [[7.0, 7.0]] * 4


def test_a_name_is_created_once(run):
    policy, sampler, _ = run
    with pytest.raises(ConfigurationError, match="'sync' already exists"):
        collective_group("sync", [sampler, policy])


def test_a_member_that_does_not_join_in_time_is_named(run, tmp_path):
    policy, sampler, _ = run
    slow = Policy(remote_group="slow")
    # The slow member stays busy until the test releases it (not a fixed sleep to wait out).
    busy = slow.hold_until(str(tmp_path / "release-1"), 120)
    started = time.monotonic()
    try:
        with pytest.raises(CallTimeoutError) as info:
            collective_group("late", [slow, sampler], timeout=3)
        assert time.monotonic() - started < 11
    finally:
        (tmp_path / "release-1").touch()
    assert "Policy rank 0 (group 'slow') did not join within timeout=3s" in str(info.value)
    busy()
    # a late member that is not the first: the others wait at the rendezvous, then leave
    busy = slow.hold_until(str(tmp_path / "release-2"), 120)
    try:
        with pytest.raises(CallTimeoutError) as info:
            collective_group("late", [sampler, slow], timeout=3)
    finally:
        (tmp_path / "release-2").touch()
    assert "Policy rank 0 (group 'slow') did not join within timeout=3s" in str(info.value)
    assert "Sampler" not in str(info.value).split("did not join")[0]
    busy()
    # the sampler still works in its other group
    got = sampler.pull("sync")
    policy.push("sync")()
    assert got()[0][3] == [float(i) for i in range(8)]
