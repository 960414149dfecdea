"""Ray Direct Transport transports (`cuda_ipc`, `nixl`; `twinkle_ray.transports`) on a real
local Ray cluster.

nixl runs here for real on CPU tensors (the `nixl` package's UCX backend works without a GPU):
the producer keeps its result, the driver submits `_tw_rdt_give` with
`.options(tensor_transport="nixl")` once per held result, and each consumer task takes that ref
as an argument, so Ray moves the tensors from the producer's memory into the consumer's. CUDA
is absent, so only the hardware probes are faked for `cuda_ipc` and `auto`'s CUDA choice
(`tensor_device`, `cuda_probe`, `colocated`): everything up to Ray's submission runs, and the
submission is recorded (a `cuda_ipc` one is then carried by nixl, the only RDT transport this
machine can run).
"""

from __future__ import annotations

import gc
import logging
import sys
import time

import pytest
import ray.cloudpickle
import torch
from test_transport import ROWS, describe, replies, weights

# Where the torch transports' hardware probes live (their one definition: twinkle-local's).
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
from twinkle_ray import transports

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@remote_class()
class Producer:
    @remote_function(dispatch="all", collect="first", transport="nixl")
    def weights_nixl(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="first", transport="object_store")
    def weights_store(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="concat", transport="nixl")
    def shard_nixl(self, rows):
        r = get_worker_context().rank
        return torch.arange(rows * 256, dtype=torch.float64).reshape(rows, 256) + 1000 * r

    @remote_function(dispatch="all", collect="concat", transport="object_store")
    def shard_store(self, rows):
        r = get_worker_context().rank
        return torch.arange(rows * 256, dtype=torch.float64).reshape(rows, 256) + 1000 * r

    @remote_function(dispatch="all", collect="first")
    def weights_auto(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="first", transport="cuda_ipc")
    def weights_cuda_ipc(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="none")
    def fake_cuda(self, on):
        """Fake this worker's hardware probes: its tensors look like CUDA ones, NCCL absent."""
        if on:
            transports.tensor_device = lambda tensor: "cuda"
            torch_transports.cuda_probe = lambda: False
        else:
            transports.tensor_device = _real_tensor_device
            torch_transports.cuda_probe = _real_cuda_probe
        return True

    @remote_function(dispatch="all", collect="none")
    def held(self):
        return transports.held_count()


_real_tensor_device = transports.tensor_device
_real_cuda_probe = torch_transports.cuda_probe


@remote_class()
class Consumer:
    @remote_function(dispatch="all", collect="none")
    def take(self, value):
        return describe(value), _via()

    @remote_function(dispatch="slice_dp", collect="none")
    def take_dp(self, value):
        return describe(value), _via()

    @remote_function(dispatch="all", collect="none")
    def take_and_write(self, value):
        value["w"][0, 0] = -1.0  # received tensors are the consumer's own
        return float(value["w"][0, 0])


def _via() -> list[str]:
    """How this call's held results arrived: the keys Ray delivered with it (RDT)."""
    return sorted(transports._INBOX)


class Submissions:
    """Records the driver's `submit_rdt` calls (holder rank unknown: the handle's id)."""

    def __init__(self, monkeypatch, carry: str | None = None) -> None:
        self.seen: list[tuple[str, str]] = []
        real = transports.submit_rdt

        def record(handle, key, tensor_transport):
            self.seen.append((key, tensor_transport))
            return real(handle, key, carry or tensor_transport)

        monkeypatch.setattr(transports, "submit_rdt", record)


@pytest.fixture(scope="module")
def run(cluster):
    initialize(
        "ray",
        address=cluster.address,
        groups=[
            DeviceGroup("prod", 2, "cpu"),
            DeviceGroup("cons", 2, "cpu"),
            DeviceGroup("gprod", [0], "cuda"),
            DeviceGroup("gcons", [1], "cuda"),
        ],
        name="rdt-test",
        direct_transport=True,  # the CPU groups too (nixl runs for real between them)
    )
    try:
        mesh = DeviceMesh.from_sizes(dp_size=2)
        yield (
            Producer(remote_group="prod", device_mesh=mesh),
            Consumer(remote_group="cons", device_mesh=mesh),
            Producer(remote_group="gprod"),
            Consumer(remote_group="gcons"),
        )
    finally:
        shutdown()


@pytest.mark.timeout(300)
def test_nixl_delivers_a_tensor_dict_with_the_object_store_values(run, monkeypatch):
    producer, consumer, _, _ = run
    submitted = Submissions(monkeypatch)
    lazy = producer.weights_nixl(ROWS)
    held = replies(lazy)
    assert [type(r).__name__ for r in held] == ["Held", "Held"]
    assert {r.transport for r in held} == {"nixl"} and not any(r.auto for r in held)
    got = consumer.take(lazy)(120)
    expected = consumer.take(producer.weights_store(ROWS))(120)
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert got[0][0]["step"] == 7 and got[0][0]["w"][3] > 0
    # Every consumer worker got rank 0's result delivered by Ray with its call; one RDT
    # object (one submission with tensor_transport="nixl") served both.
    assert [g[1] for g in got] == [[held[0].key]] * 2
    assert [e[1] for e in expected] == [[], []]
    assert submitted.seen == [(held[0].key, "nixl")]
    # What the consumer received is its own copy, not the producer's memory.
    assert consumer.take_and_write(lazy)(120) == [-1.0, -1.0]
    again = consumer.take(lazy)(120)
    assert again[0][0]["w"] == expected[0][0]["w"]
    assert len(submitted.seen) == 1  # the held result's RDT object is reused


@pytest.mark.timeout(300)
def test_nixl_results_sliced_to_consumers_match_the_object_store(run, monkeypatch):
    producer, consumer, _, _ = run
    submitted = Submissions(monkeypatch)
    lazy = producer.shard_nixl(ROWS)
    keys = [r.key for r in replies(lazy)]
    got = consumer.take_dp(lazy)(120)
    expected = consumer.take_dp(producer.shard_store(ROWS))(120)
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert [g[1] for g in got] == [[keys[0]], [keys[1]]]  # each worker only its share
    assert sorted(submitted.seen) == sorted((k, "nixl") for k in keys)


@pytest.mark.timeout(300)
def test_auto_keeps_cpu_tensors_on_the_object_store_with_nixl_installed(run, monkeypatch, caplog):
    producer, consumer, _, _ = run
    assert transports.nixl_installed() and transports.NixlTransport.is_available()
    submitted = Submissions(monkeypatch)
    with caplog.at_level(logging.INFO, logger="twinkle"):
        lazy = producer.weights_auto(ROWS)
        assert [type(r).__name__ for r in replies(lazy)] == ["Stored", "Stored"]
        assert consumer.take(lazy)(120)[0][1] == []
    assert submitted.seen == []
    assert not [r for r in caplog.records if "object store" in r.getMessage()]


@pytest.mark.timeout(300)
def test_auto_picks_nixl_for_a_fake_cuda_result_and_ray_carries_it(run, monkeypatch):
    """The producer's probes say CUDA without NCCL: `auto` holds the result for nixl, and the
    consumer on (fake) GPUs gets it through Ray Direct Transport."""
    _, _, gproducer, gconsumer = run
    submitted = Submissions(monkeypatch)
    gproducer.fake_cuda(True)(60)
    try:
        lazy = gproducer.weights_auto(ROWS)
        (held,) = replies(lazy)
        assert type(held).__name__ == "Held"
        assert (held.transport, held.device_type, held.auto) == ("nixl", "cuda", True)
        ((described, via),) = gconsumer.take(lazy)(120)
        assert via == [held.key] and submitted.seen == [(held.key, "nixl")]
        assert described["w"][3] == float(torch.arange(ROWS * 256.0).double().sum())
    finally:
        gproducer.fake_cuda(False)(60)


@pytest.mark.timeout(300)
def test_auto_submits_cuda_ipc_for_a_consumer_sharing_the_producers_device(run, monkeypatch):
    """For a consumer on the producer's node and device, `auto` takes `cuda_ipc`: the driver
    submits `_tw_rdt_give` with tensor_transport="cuda_ipc" (recorded; nixl carries it, as
    this machine has no CUDA)."""
    _, _, gproducer, gconsumer = run
    submitted = Submissions(monkeypatch, carry="nixl")
    monkeypatch.setattr(transports, "colocated", lambda *a: True)
    gproducer.fake_cuda(True)(60)
    try:
        lazy = gproducer.weights_auto(ROWS)
        (held,) = replies(lazy)
        ((described, via),) = gconsumer.take(lazy)(120)
        assert submitted.seen == [(held.key, "cuda_ipc")] and via == [held.key]
        assert described["step"] == 7
    finally:
        gproducer.fake_cuda(False)(60)


def test_pair_choice_and_colocation_rules():
    """Which transport carries a held result to a consumer worker (driver side)."""
    from types import SimpleNamespace as NS

    from twinkle_core.plugin import WorkerPlacement

    def group(device, placements):
        return NS(group=NS(device_type=device), placements=placements)

    p = group("cuda", [WorkerPlacement(0, "n1", (0,), "cuda")])
    same = group("cuda", [WorkerPlacement(0, "n1", (0, 1), "cuda")])
    other = group("cuda", [WorkerPlacement(0, "n1", (1,), "cuda")])
    far = group("cuda", [WorkerPlacement(0, "n2", (0,), "cuda")])
    cpu = group("cpu", [WorkerPlacement(0, "n1", (), "cpu")])
    held = transports.Held(None, "nccl", "k", None, 0, "", None, (), "cuda", True)
    assert transports.colocated(p, 0, same, 0)
    assert not transports.colocated(p, 0, other, 0) and not transports.colocated(p, 0, far, 0)
    assert transports.pair_transport(held, p, same, 0) == ("cuda_ipc", "")
    assert transports.pair_transport(held, p, other, 0) == ("nccl", "")
    named = transports.Held(None, "cuda_ipc", "k", None, 0, "", None, (), "cuda", False)
    assert transports.pair_transport(named, p, same, 0) == ("cuda_ipc", "")
    name, why = transports.pair_transport(named, p, other, 0)
    assert name == "" and "producer's node and device" in why
    nixl = transports.Held(None, "nixl", "k", None, 0, "", None, (), "cuda", False)
    assert transports.pair_transport(nixl, p, far, 0) == ("nixl", "")
    name, why = transports.pair_transport(nixl, p, cpu, 0)
    assert name == "" and "cpu workers cannot receive cuda tensors over 'nixl'" in why


def test_auto_rule_for_the_rdt_transports(monkeypatch):
    """`auto` on CUDA: nccl when NCCL is there, else nixl when installed, else the object
    store (with a reason); never nixl or cuda_ipc for CPU tensors."""
    mb = 1 << 20

    def auto(device):
        return transports.explain("auto", 64 * mb, device)

    assert {"cuda_ipc", "nixl"} <= set(transports.registered())
    monkeypatch.setattr(torch_transports, "cuda_probe", lambda: True)
    assert auto("cuda") == ("nccl", None)
    monkeypatch.setattr(torch_transports, "cuda_probe", lambda: False)
    assert auto("cuda") == ("nixl", None)
    assert transports.explain("nixl", 64 * mb, "cpu") == ("nixl", None)  # named: served
    monkeypatch.setattr(transports, "nixl_installed", lambda: False)
    assert auto("cuda")[0] == "object_store" and auto("cuda")[1]
    assert auto("cpu") == ("object_store", None)
    monkeypatch.setattr(transports, "cuda_available", lambda: True)
    assert transports.explain("cuda_ipc", 64 * mb, "cuda") == ("cuda_ipc", None)


@pytest.mark.timeout(300)
def test_cuda_ipc_named_for_cpu_tensors_falls_back_with_one_log_line(run, caplog):
    producer, consumer, _, _ = run
    with caplog.at_level(logging.INFO, logger="twinkle"):
        for _ in range(2):
            lazy = producer.weights_cuda_ipc(ROWS)
            assert [type(r).__name__ for r in replies(lazy)] == ["Stored", "Stored"]
            assert consumer.take(lazy)(120)[0][0]["step"] == 7
    lines = [r.getMessage() for r in caplog.records if "'cuda_ipc'" in r.getMessage()]
    assert lines == [
        "twinkle: Producer.weights_cuda_ipc: transport 'cuda_ipc' cannot move cpu tensors in "
        "mode 'ray'; using the object store"
    ]


@pytest.mark.timeout(300)
def test_held_results_and_their_rdt_objects_are_dropped_when_the_driver_lets_go(run):
    producer, consumer, _, _ = run
    lazy = producer.weights_nixl(ROWS)
    consumer.take(lazy)(120)
    assert transports.rdt_refs_count() >= 1 and producer.held()(60) != [0, 0]
    del lazy
    for _ in range(100):
        gc.collect()
        if transports.rdt_refs_count() == 0 and producer.held()(60) == [0, 0]:
            break
        time.sleep(0.1)
    assert transports.rdt_refs_count() == 0
    assert producer.held()(60) == [0, 0]


@pytest.mark.timeout(300)
def test_a_result_dropped_right_after_its_consumer_is_submitted_still_arrives(run):
    """`consumer.take(producer.f())`: the producer's call is garbage as soon as the consumer's
    is submitted, while its give to Ray waits on the producer's RDT thread (kept busy here);
    the drop must not overtake the give."""
    producer, consumer, _, _ = run
    busy = [
        h._tw_apply.options(concurrency_group=transports.RDT_GROUP).remote(time.sleep, 1.5)
        for h in producer.__dict__["_twinkle_binding"].workers.handles
    ]
    got = consumer.take(producer.weights_nixl(ROWS))(120)
    assert got[0][0]["step"] == 7 and len(got[0][1]) == 1
    ray.get(busy)
    for _ in range(3):
        assert consumer.take(producer.weights_nixl(ROWS))(120)[1][0]["step"] == 7
    for _ in range(100):
        gc.collect()
        if producer.held()(60) == [0, 0]:
            break
        time.sleep(0.1)
    assert producer.held()(60) == [0, 0]
