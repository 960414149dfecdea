"""Transports on Ray (`twinkle_ray.transports`): large tensor results sent worker to worker over
a gloo group twinkle makes between the producing and the consuming group, with the same values
as the object store; fallbacks to the object store, each logged once; the `auto` rule; unknown
names refused; transport groups and held results cleaned up.

The producer's replies are looked at without opening them (`wait_replies`): a `Held` envelope
means the tensors stayed in the producer until the consumer received them, and each consumer
worker counts what it received over a transport group and what it fetched from the object store.
"""

from __future__ import annotations

import gc
import logging
import sys
import time

import numpy as np
import pytest
import ray.cloudpickle
import torch

import twinkle_local.transports as torch_transports
from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.transport import choose_transport
from twinkle_ray import transports
from twinkle_ray.transfer import Stored
from twinkle_ray.transports import GROUPS, Held

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Rows of 256 float32 (1 KiB each): 4096 rows are 4 MiB, far above the object store's
#: inline size and `auto`'s 1 MB.
ROWS = 4096


def weights(rows: int) -> dict:
    """A weight dict, different on every rank, with a bf16 tensor and a plain leaf."""
    r = get_worker_context().rank
    return {
        "w": torch.arange(rows * 256, dtype=torch.float32).reshape(rows, 256) + r,
        "b": (torch.linspace(0, 1, rows * 8) + r).to(torch.bfloat16),
        "layers": [torch.full((rows, 16), float(r + i)) for i in range(2)],
        "step": 7 + r,
    }


@remote_class()
class Producer:
    @remote_function(dispatch="all", collect="first", transport="gloo")
    def weights_gloo(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="first", transport="object_store")
    def weights_store(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="concat", transport="gloo")
    def shard_gloo(self, rows):
        r = get_worker_context().rank
        return torch.arange(rows * 256, dtype=torch.float64).reshape(rows, 256) + 1000 * r

    @remote_function(dispatch="all", collect="concat", transport="object_store")
    def shard_store(self, rows):
        r = get_worker_context().rank
        return torch.arange(rows * 256, dtype=torch.float64).reshape(rows, 256) + 1000 * r

    @remote_function(dispatch="all", collect="first", transport="gloo")
    def numpy_gloo(self, rows):
        return {"x": np.ones((rows, 256), dtype=np.float32)}

    @remote_function(dispatch="all", collect="first", transport="nccl")
    def cpu_nccl(self, rows):
        return {"x": torch.ones(rows, 256)}

    @remote_function(dispatch="all", collect="first")
    def auto_cpu(self, rows):
        return {"x": torch.ones(rows, 256)}

    @remote_function(dispatch="all", collect="none")
    def held(self):
        return transports.held_count()


def describe(value) -> object:
    """Types, dtypes, shapes and exact sums of everything in `value`."""
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), float(value.double().sum()))
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, float(value.sum()))
    return value


@remote_class()
class Consumer:
    def __init__(self) -> None:
        self.seen: list = []

    @remote_function(dispatch="all", collect="none")
    def take(self, value):
        return describe(value), _groups()

    @remote_function(dispatch="slice_dp", collect="none")
    def take_dp(self, value):
        return describe(value), _groups()


def _groups() -> list[str]:
    return sorted(n for n in get_worker_context().collectives if n.startswith("_tw_transport"))


def replies(lazy) -> list:
    """The producer's replies, envelopes unopened."""
    return lazy.source.pending.wait_replies(120)


@pytest.fixture(scope="module")
def run(cluster):
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("prod", 2, "cpu"), DeviceGroup("cons", 2, "cpu")],
        name="transport-test",
    )
    try:
        producer = Producer(remote_group="prod", device_mesh=DeviceMesh.from_sizes(dp_size=2))
        consumer = Consumer(remote_group="cons", device_mesh=DeviceMesh.from_sizes(dp_size=2))
        yield producer, consumer
    finally:
        shutdown()


@pytest.mark.timeout(300)
def test_gloo_delivers_a_tensor_dict_with_the_object_store_values(run):
    producer, consumer = run
    by_store = consumer.take(producer.weights_store(ROWS))(120)
    lazy = producer.weights_gloo(ROWS)
    by_gloo = consumer.take(lazy)(120)
    assert all(type(r) is Held for r in replies(lazy))
    assert all(type(r) is Stored for r in replies(producer.weights_store(ROWS)))
    assert [d for d, _ in by_gloo] == [d for d, _ in by_store]
    assert by_gloo[0][0]["w"][3] == float(
        (torch.arange(ROWS * 256, dtype=torch.float64)).sum()
    )  # rank 0's result ('first'), not rank 1's
    # Received over the transport group between the two groups, not fetched.
    assert all(len(groups) == 1 and "/gloo/" in groups[0] for _, groups in by_gloo)
    assert lazy.source.pending._values is None  # the driver never opened it
    # The driver itself still gets the value (from the producer, through the object store).
    assert describe(lazy(120)) == by_store[0][0]


@pytest.mark.timeout(300)
def test_gloo_results_sliced_to_consumers_match_the_object_store(run):
    producer, consumer = run
    by_store = consumer.take_dp(producer.shard_store(ROWS))(120)
    lazy = producer.shard_gloo(ROWS)
    by_gloo = consumer.take_dp(lazy)(120)
    assert all(type(r) is Held for r in replies(lazy))
    assert [d for d, _ in by_gloo] == [d for d, _ in by_store]
    # Each consumer got its own half: rank 0 the first producer's rows, rank 1 the second's.
    assert by_gloo[0][0][3] != by_gloo[1][0][3]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("method", "why"),
    [
        ("numpy_gloo", "transport 'gloo' moves torch tensors"),
        ("cpu_nccl", "transport 'nccl' cannot move cpu tensors in mode 'ray'"),
    ],
)
def test_a_transport_that_cannot_carry_the_result_falls_back_with_one_log_line(
    run, caplog, method, why
):
    producer, consumer = run
    with caplog.at_level(logging.INFO, logger="twinkle"):
        for _ in range(2):  # two calls of two workers: four fallbacks, one line
            lazy = getattr(producer, method)(ROWS)
            got = consumer.take(lazy)(120)
            assert all(type(r) is Stored for r in replies(lazy))
            assert got[0][0]["x"][3] == float(ROWS * 256)
    lines = [r.getMessage() for r in caplog.records if "using the object store" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"Producer.{method}" in lines[0] and why in lines[0]


@pytest.mark.timeout(300)
def test_auto_keeps_cpu_tensors_on_the_object_store_silently(run, caplog):
    producer, consumer = run
    with caplog.at_level(logging.INFO, logger="twinkle"):
        lazy = producer.auto_cpu(ROWS)
        got = consumer.take(lazy)(120)
    assert all(type(r) is Stored for r in replies(lazy))
    assert got[0][0]["x"][3] == float(ROWS * 256)
    assert not [r for r in caplog.records if "using the object store" in r.getMessage()]


@pytest.mark.timeout(300)
def test_held_results_are_dropped_when_the_driver_lets_go(run):
    producer, consumer = run
    gc.collect()
    lazy = producer.weights_gloo(ROWS)
    consumer.take(lazy)(120)
    assert all(n >= 1 for n in producer.held()(60))
    del lazy
    gc.collect()
    deadline = time.monotonic() + 60
    while any(producer.held()(60)) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    assert producer.held()(60) == [0, 0]


def test_auto_picks_nccl_for_large_cuda_results_when_the_probe_says_so(monkeypatch):
    """The NCCL path shares the gloo code; without a GPU only its selection is checked (the
    Ray Direct Transport ones: test_rdt.py)."""
    registered = transports.registered()
    assert set(registered) >= {"gloo", "nccl"}
    mb = 1 << 20

    def choose(requested, nbytes, device, mode="ray"):
        return transports.explain(requested, nbytes, device, mode)[0]

    monkeypatch.setattr(torch_transports, "cuda_probe", lambda: True)
    assert choose("auto", 64 * mb, "cuda") == "nccl"
    assert choose("auto", 64 * 1024, "cuda") == "object_store"
    assert choose("auto", 64 * mb, "cpu") == "object_store"
    assert choose("gloo", 64 * mb, "cpu") == "gloo"
    assert choose_transport("gloo", 64 * mb, "cpu", "ray", registered) == "gloo"
    monkeypatch.setattr(torch_transports, "cuda_probe", lambda: False)
    monkeypatch.setattr(transports, "nixl_installed", lambda: False)
    assert choose("auto", 64 * mb, "cuda") == "object_store"


@pytest.mark.timeout(300)
def test_members_leave_transport_groups_and_a_new_one_is_made_on_next_use(run):
    producer, consumer = run
    (_, before), _ = consumer.take(producer.weights_gloo(ROWS))(120)
    assert len(before) == 1
    assert GROUPS.leave_all() == before  # what shutdown does, before it kills the actors
    assert consumer.take(producer.auto_cpu(8))(120)[0][1] == []  # left
    (described, after), _ = consumer.take(producer.weights_gloo(ROWS))(120)
    assert after == before and described["step"] == 7
