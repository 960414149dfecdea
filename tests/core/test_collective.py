"""Collective groups across remote objects on the in-process backend (numpy arrays, no torch)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from twinkle_core import (
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
from twinkle_core.plugin import ExecutionBackend


@remote_class()
class Trainer:
    def __init__(self) -> None:
        self.weights = np.arange(6, dtype=np.float32) + 100 * (get_worker_context().rank + 1)

    @remote_function(dispatch="all", collect="none")
    def push(self, name: str) -> None:
        collective(name).broadcast([self.weights], src=0)

    @remote_function(dispatch="all", collect="none")
    def bump(self) -> None:
        self.weights += 1000

    @remote_function(dispatch="all", collect="flatten")
    def membership(self, name: str) -> list:
        c = get_worker_context().collective(name)
        return [(c.rank, c.world_size, c.backend, c.process_group)]

    @remote_function(dispatch="all", collect="flatten")
    def reduce(self, name: str) -> list:
        return [collective(name).all_reduce(np.ones(2))[0].tolist()]

    @remote_function(dispatch="all", collect="flatten")
    def gather(self, name: str) -> list:
        rank = get_worker_context().rank
        return [[a.tolist() for a in collective(name).all_gather(np.full(2, float(rank)))]]

    @remote_function(dispatch="all", collect="none")
    def barrier(self, name: str) -> None:
        collective(name).barrier()

    @remote_function(dispatch="all", collect="none")
    def nested(self, name: str) -> None:
        collective_group(name, [])


@remote_class()
class Sampler:
    def __init__(self) -> None:
        self.weights = np.zeros(6, dtype=np.float32)

    @remote_function(dispatch="all", collect="flatten")
    def pull(self, name: str) -> list:
        collective(name).broadcast(self.weights, src=0)
        return [self.weights.tolist()]

    @remote_function(dispatch="all", collect="none")
    def pull_from(self, name: str, src: int) -> None:
        collective(name).broadcast(self.weights, src=src)

    @remote_function(dispatch="all", collect="none")
    def reduce_instead(self, name: str) -> None:
        collective(name).all_reduce(self.weights)

    @remote_function(dispatch="all", collect="flatten")
    def names(self) -> list:
        return [sorted(get_worker_context().collectives)]


def start(trainers: int = 2, samplers: int = 2):
    initialize(
        "inprocess",
        groups=[DeviceGroup("train", trainers), DeviceGroup("sample", samplers)],
    )
    return Trainer(remote_group="train"), Sampler(remote_group="sample")


def test_ranks_are_ordered_object_by_object():
    trainer, sampler = start(2, 3)
    group = collective_group("sync", [trainer, sampler])
    assert group.world_size == 5 and group.backend == "gloo" and group.mode == "inprocess"
    assert [(m.class_name, m.rank) for m in group.members] == [
        ("Trainer", 0),
        ("Trainer", 1),
        ("Sampler", 0),
        ("Sampler", 1),
        ("Sampler", 2),
    ]
    assert group.ranks_of(trainer) == [0, 1] and group.ranks_of(sampler) == [2, 3, 4]
    assert repr(group) == (
        "CollectiveGroup('sync', world_size=5, backend='gloo', mode='inprocess', "
        "Trainer on 'train': ranks 0-1, Sampler on 'sample': ranks 2-4)"
    )
    assert trainer.membership("sync")() == [(0, 5, "gloo", None), (1, 5, "gloo", None)]
    # the order given is the order of ranks
    reverse = collective_group("reverse", [sampler, trainer], backend="custom")
    assert reverse.ranks_of(trainer) == [3, 4] and reverse.backend == "custom"
    assert trainer.membership("reverse")()[0][:2] == (3, 5)
    assert sampler.names()() == [["reverse", "sync"]] * 3


def test_broadcast_copies_the_source_into_every_member():
    trainer, sampler = start()
    collective_group("sync", [trainer, sampler])
    trainer.push("sync")
    got = sampler.pull("sync")()
    assert got == [[100.0, 101.0, 102.0, 103.0, 104.0, 105.0]] * 2
    # The receivers got a snapshot: the source changing afterwards does not reach them, and
    # the next broadcast carries the new values.
    trainer.bump()
    trainer.push("sync")
    assert sampler.pull("sync")() == [[1100.0 + i for i in range(6)]] * 2


def test_a_receiver_before_its_source_is_refused_and_can_retry():
    trainer, sampler = start()
    collective_group("sync", [trainer, sampler])
    with pytest.raises(ConfigurationError, match="before its source Trainer rank 0") as info:
        sampler.pull("sync")()
    assert "call the source's method before the receivers'" in str(info.value)
    trainer.push("sync")  # the refused attempt did not count as a collective
    assert sampler.pull("sync")()[0][0] == 100.0


def test_broadcast_from_another_rank():
    trainer, sampler = start(1, 2)
    group = collective_group("sync", [sampler, trainer])
    # src 1 is the second sampler: its own zeros win, after the first sampler refused
    with pytest.raises(ConfigurationError, match="before its source Sampler rank 1"):
        sampler.pull_from("sync", 1)()
    assert group.ranks_of(trainer) == [2]


def test_collectives_needing_every_member_are_refused_where_members_share_a_process():
    trainer, sampler = start()
    collective_group("sync", [trainer, sampler])
    for call in (trainer.reduce("sync"), trainer.gather("sync"), trainer.barrier("sync")):
        with pytest.raises(ConfigurationError, match="needs every member at once") as info:
            call()
        assert "mode 'inprocess'" in str(info.value) and "mode 'ray'" in str(info.value)
    # a group of one member has nobody to wait for
    shutdown()
    initialize("inprocess", groups=[DeviceGroup("train", 1)])
    alone = Trainer(remote_group="train")
    collective_group("alone", [alone])
    assert alone.reduce("alone")() == [[1.0, 1.0]]
    assert alone.gather("alone")() == [[[0.0, 0.0]]]
    alone.barrier("alone")()


def test_every_member_must_make_the_same_collectives():
    trainer, sampler = start()
    collective_group("sync", [trainer, sampler])
    trainer.push("sync")
    with pytest.raises(ConfigurationError, match="needs every member at once"):
        sampler.reduce_instead("sync")()
    with pytest.raises(
        ConfigurationError, match=r"broadcast\(src=0\) for Trainer rank 0 \(group .train.\) but "
    ):
        sampler.pull_from("sync", 1)()


def test_a_name_is_created_once_per_run():
    trainer, sampler = start()
    collective_group("sync", [trainer, sampler])
    with pytest.raises(ConfigurationError, match="named 'sync' already exists"):
        collective_group("sync", [sampler])
    shutdown()
    trainer, sampler = start()
    collective_group("sync", [trainer, sampler])  # a new run: the name is free again


def test_arguments_are_checked():
    trainer, sampler = start()
    with pytest.raises(ConfigurationError, match=r"name=\.\.\."):
        collective_group("", [trainer])
    with pytest.raises(ConfigurationError, match="non-empty list of remote objects"):
        collective_group("x", [])
    with pytest.raises(ConfigurationError, match="must be remote objects"):
        collective_group("x", [object()])
    with pytest.raises(ConfigurationError, match="same object twice"):
        collective_group("x", [trainer, trainer])
    with pytest.raises(ConfigurationError, match="timeout"):
        collective_group("x", [trainer], timeout=0)
    with pytest.raises(ConfigurationError, match="backend"):
        collective_group("x", [trainer], backend=3)
    with pytest.raises(ConfigurationError, match="is called on the driver"):
        trainer.nested("x")()
    # a failed creation leaves the name free
    group = collective_group("x", [trainer])
    with pytest.raises(ConfigurationError, match="not one of its objects"):
        group.ranks_of(sampler)


def test_collective_outside_a_group_names_the_fix():
    trainer, sampler = start()
    collective_group("sync", [trainer])
    with pytest.raises(ConfigurationError, match="inside a worker"):
        collective("sync")
    with pytest.raises(
        ConfigurationError,
        match=r"not a member of a collective group named .sync. \(its groups: none\)",
    ):
        sampler.pull("sync")()


def test_a_backend_without_collective_groups_says_so():
    class Plain(ExecutionBackend):
        name = "plain"

        def create_workers(self, *args, **kwargs):
            raise NotImplementedError

    trainer, _ = start()
    group = collective_group("sync", [trainer])
    with pytest.raises(ConfigurationError, match="mode 'plain' does not support collective"):
        Plain().create_collective_group(group, [])


def test_a_context_sent_elsewhere_drops_its_process_local_groups():
    trainer, _ = start()
    collective_group("sync", [trainer])
    ctx = trainer._twinkle_binding.workers.states[0].context
    assert "sync" in ctx.collectives
    assert dict(pickle.loads(pickle.dumps(ctx)).collectives) == {}
    assert pickle.loads(pickle.dumps(ctx)) == ctx
