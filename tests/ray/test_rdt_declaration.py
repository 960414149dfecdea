"""When twinkle declares a run's actors for Ray Direct Transport, and what an undeclared run does
with an RDT transport (`initialize(mode='ray', direct_transport=...)`, `backend.actor_class`).

Declared actors run their methods on a thread Ray starts (Ray gives them concurrency groups),
so twinkle declares them only when an RDT transport could serve the run; an undeclared run
that names `nixl` gets its values through the object store, with one log line, never a hang
(an RDT receive on an undeclared actor would wait for Ray's `_ray_system` thread forever).
"""

from __future__ import annotations

import logging
import sys
import threading
from types import SimpleNamespace as NS

import pytest
import ray.cloudpickle
from test_transport import describe, weights

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugin import WorkerPlacement
from twinkle_ray import transports
from twinkle_ray.backend import wants_direct_transport

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = 1024  # 1 MiB and more: large enough to be held


@remote_class()
class Producer:
    @remote_function(dispatch="all", collect="first", transport="nixl")
    def weights_nixl(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="first", transport="object_store")
    def weights_store(self, rows):
        return weights(rows)

    @remote_function(dispatch="all", collect="none")
    def on_main_thread(self):
        return threading.current_thread() is threading.main_thread()


@remote_class()
class Consumer:
    @remote_function(dispatch="all", collect="none")
    def take(self, value):
        return describe(value), sorted(transports._INBOX)


def _run(cluster, **options):
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("prod", 1, "cpu"), DeviceGroup("cons", 2, "cpu")],
        name="rdt-declaration",
        **options,
    )
    return Producer(remote_group="prod"), Consumer(remote_group="cons")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("option", [{}, {"direct_transport": False}], ids=["default", "False"])
def test_an_undeclared_run_keeps_the_main_thread_and_moves_nixl_results_by_the_store(
    cluster, caplog, option, monkeypatch
):
    import twinkle_core.transport

    monkeypatch.setattr(twinkle_core.transport, "_logged", set())  # once per run of this test
    caplog.set_level(logging.INFO, logger="twinkle")
    producer, consumer = _run(cluster, **option)
    try:
        assert producer.on_main_thread()() == [True]
        expected = consumer.take(producer.weights_store(ROWS))()
        for _ in range(2):
            got = consumer.take(producer.weights_nixl(ROWS))()
            assert [d for d, _ in got] == [d for d, _ in expected]
            # nothing went by RDT: no RDT object was made; the result came by the object
            # store, put by its holder for the consumer's task (`transports.given_ref`)
            assert transports.rdt_refs_count() == 0
            assert all(len(via) == 1 for _, via in got), got
    finally:
        shutdown()
    lines = [m for m in caplog.messages if "declared for Ray Direct Transport" in m]
    assert len(lines) == 1, caplog.messages
    assert "direct_transport=True" in lines[0]


@pytest.mark.timeout(300)
def test_a_declared_run_runs_methods_on_a_thread_ray_starts(cluster):
    producer, _ = _run(cluster, direct_transport=True)
    try:
        assert producer.on_main_thread()() == [False]
    finally:
        shutdown()


def test_who_is_declared():
    cpu, gpu = DeviceGroup("a", 2, "cpu"), DeviceGroup("b", [0], "cuda")
    assert wants_direct_transport(gpu, None) is True
    assert wants_direct_transport(cpu, None) is False  # plain unless asked (start-up, thread)
    assert wants_direct_transport(gpu, False) is False
    assert wants_direct_transport(cpu, True) is True


def test_direct_transport_must_be_a_bool_or_none():
    with pytest.raises(ConfigurationError, match=r"direct_transport=\.\.\.\) must be True, False"):
        initialize("ray", groups=[DeviceGroup("g", 1, "cpu")], direct_transport="yes")


def test_pairs_of_undeclared_actors_get_no_rdt_transport():
    def group(device, placements, declared):
        return NS(group=NS(device_type=device), placements=placements, direct_transport=declared)

    p = group("cuda", [WorkerPlacement(0, "n1", (0,), "cuda")], False)
    same = group("cuda", [WorkerPlacement(0, "n1", (0,), "cuda")], False)
    auto = transports.Held(None, "nccl", "k", None, 0, "", None, (), "cuda", True)
    assert transports.pair_transport(auto, p, same, 0) == ("nccl", "")  # no cuda_ipc upgrade
    for name in ("nixl", "cuda_ipc"):
        named = transports.Held(None, name, "k", None, 0, "", None, (), "cuda", False)
        got, why = transports.pair_transport(named, p, same, 0)
        assert got == "" and "declared for Ray Direct Transport" in why


def test_hccl_is_carried_on_ray_for_npu_results(monkeypatch):
    """An NPU platform's tensors travel over HCCL like CUDA's over NCCL (only the hardware
    probe is faked: no NPU here); without one, a named hccl takes the object store."""
    import twinkle_local.transports as torch_transports
    from twinkle_core.transport import choose_transport

    registered = transports.registered()
    assert registered["hccl"] is transports.HcclTransport
    assert transports.torch_backend(registered["hccl"]) == "hccl"
    big = 64 << 20
    assert not transports.HcclTransport.is_available()
    assert choose_transport("hccl", big, "npu", "ray", registered) == "object_store"
    monkeypatch.setattr(torch_transports, "npu_probe", lambda: True)
    assert choose_transport("auto", big, "npu", "ray", registered) == "hccl"
    held = transports.Held(None, "hccl", "k", None, 0, "", None, (), "npu", True)

    def group(device, declared=True):
        placements = [WorkerPlacement(0, "n1", (0,), device)]
        return NS(group=NS(device_type=device), placements=placements, direct_transport=declared)

    assert transports.pair_transport(held, group("npu"), group("npu"), 0) == ("hccl", "")
    got, why = transports.pair_transport(held, group("npu"), group("cpu"), 0)
    assert got == "" and "cannot receive over 'hccl'" in why
