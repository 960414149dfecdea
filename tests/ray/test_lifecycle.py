"""Runs coming and going on one cluster: requests that cannot fit fail fast and clearly,
nothing outlives a run, and failures nobody collected are reported by shutdown."""

from __future__ import annotations

import logging
import sys
import time

import pytest
import ray
import ray.cloudpickle
from ray.util.placement_group import placement_group, remove_placement_group

import twinkle_core
from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
from twinkle_ray.resources import ClusterResourceError

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@remote_class()
class Worker:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def fail(self):
        raise ZeroDivisionError("nobody looked at this")

    @remote_function(dispatch="all", collect="none")
    def ok(self):
        return 1


def _live_twinkle_state(run_name: str) -> tuple[list, list]:
    """Placement groups and actors of `run_name` still alive, seen from a driver."""
    pgs = [
        p
        for p in ray.util.placement_group_table().values()
        if p["name"].startswith(run_name) and p["state"] != "REMOVED"
    ]
    actors = [
        a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(run_name)
    ]
    return pgs, actors


def test_request_larger_than_the_cluster_fails_before_asking(cluster, no_runtime):
    start = time.monotonic()
    with pytest.raises(ClusterResourceError) as info:
        initialize(
            "ray",
            address=cluster.address,
            nproc_per_node=8,
            groups=[DeviceGroup("model", list(range(16)), "cuda")],
            name="too-large",
        )
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "nproc_per_node=8" in message and "ranks up to 15" in message
    assert message.count("GPU=4") == 2 and message.count("CPU=6") == 2  # every node's resources
    assert not twinkle_core.is_initialized() and not ray.is_initialized()


def test_cpu_request_larger_than_the_cluster_fails_with_what_was_asked(cluster, no_runtime):
    with pytest.raises(ClusterResourceError, match=r"'big': 13 x 1 CPU"):
        initialize("ray", address=cluster.address, groups=[DeviceGroup("big", 13, "cpu")])
    assert not ray.is_initialized()


def test_busy_cluster_fails_within_placement_timeout(cluster, no_runtime):
    ray.init(address=cluster.address)
    try:
        # Another job holds 5 of the 6 CPUs of each node: totals fit, placement cannot.
        hog = placement_group([{"CPU": 5}, {"CPU": 5}], strategy="STRICT_SPREAD")
        ray.get(hog.ready(), timeout=30)
        start = time.monotonic()
        with pytest.raises(ClusterResourceError, match=r"placement_timeout=1\.5s"):
            initialize(
                "ray",
                groups=[DeviceGroup("wide", 1, "cpu")],
                cpus_per_worker=3,
                placement_timeout=1.5,
                name="busy-run",
            )
        assert time.monotonic() - start < 10
        pgs, _ = _live_twinkle_state("busy-run")
        assert pgs == []  # the pending placement group was removed, not left waiting
        remove_placement_group(hog)
    finally:
        ray.shutdown()


def test_repeated_runs_leave_no_actor_or_placement_group(cluster, no_runtime):
    # The caller's own connection: twinkle uses it, cleans up its own things while the job
    # lives on (so Ray's job-exit cleanup cannot hide a leak), and never disconnects it.
    ray.init(address=cluster.address)
    try:
        for i in range(2):
            initialize("ray", groups=[DeviceGroup("g", 2, "cpu")], name=f"repeat-{i}")
            assert Worker(remote_group="g").ok()() == [1, 1]
            pgs, actors = _live_twinkle_state(f"repeat-{i}")
            # Two workers, and a relay per node when Ray placed them on both nodes (a node's
            # CPUs may still be held by the previous test's placement group, being removed).
            relays = [a for a in actors if ":relay:" in a["name"]]
            assert len(pgs) == 1 and len(actors) - len(relays) == 2
            assert len(relays) in (0, 2), relays
            shutdown()
            shutdown()  # safe twice
            assert ray.is_initialized()
            deadline = time.monotonic() + 15
            while True:
                pgs, actors = _live_twinkle_state(f"repeat-{i}")
                if (not pgs and not actors) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert pgs == [] and actors == []
    finally:
        ray.shutdown()


def test_unobserved_failure_is_reported_no_later_than_shutdown(cluster, caplog, no_runtime):
    sent: list[str] = []
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("solo", 1, "cpu")],
        notifier=sent.append,
        name="unobserved",
    )
    worker = Worker(remote_group="solo")
    worker.fail()  # never resolved by the caller
    time.sleep(1.0)
    with caplog.at_level(logging.ERROR, logger="twinkle"):
        shutdown()
    assert any("never collected" in r.getMessage() for r in caplog.records)
    assert len(sent) == 1 and "nobody looked at this" in sent[0]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"adress": "x"}, r"unknown options \['adress'\].*accepts: address"),
        ({"cpus_per_worker": {"g": 0}}, r"cpus_per_worker=\.\.\.\) must be a positive number"),
        ({"placement_timeout": -1}, r"placement_timeout=\.\.\.\) must be a positive number"),
        ({"env_passthrough": "WANDB_*"}, r"env_passthrough=\.\.\.\) must be a list"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options, match, no_runtime):
    with pytest.raises(twinkle_core.ConfigurationError, match=match):
        initialize("ray", groups=[DeviceGroup("g", 1, "cpu")], **options)
    assert not ray.is_initialized()


def test_worker_spanning_two_nodes_is_refused(cluster, no_runtime):
    with pytest.raises(twinkle_core.ConfigurationError, match=r"span nodes.*gpus_per_worker"):
        initialize(
            "ray",
            address=cluster.address,
            nproc_per_node=4,
            groups=[DeviceGroup("wide", [2, 3, 4, 5, 6, 7], "cuda", gpus_per_worker=3)],
        )
    assert not ray.is_initialized()


def test_first_only_class_and_fractional_cpus(cluster, no_runtime):
    @remote_class(execute="first")
    class Single:
        def __init__(self) -> None:
            pass

        @remote_function(dispatch="all", collect="none")
        def rank(self):
            from twinkle_core import get_worker_context

            return get_worker_context().rank

    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("half", 3, "cpu")],
        cpus_per_worker={"half": 0.5},
        name="first-only",
    )
    try:
        single = Single(remote_group="half")
        assert single.rank()() == [0]  # one actor, not one per rank
        assert len(single.__dict__["_twinkle_binding"].workers.handles) == 1
        pgs, actors = _live_twinkle_state("first-only")
        assert [p["bundles"] for p in pgs] == [{0: {"CPU": 0.5}, 1: {"CPU": 0.5}, 2: {"CPU": 0.5}}]
        assert len(actors) == 1
    finally:
        shutdown()


def test_physical_device_ids_come_from_the_node(cluster, no_runtime, monkeypatch):
    """A node whose raylet sees CUDA_VISIBLE_DEVICES=5,7 holds devices 5 and 7, not 0 and 1."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from twinkle_ray.resources import _probe_devices, ray_request

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    node = cluster.add_node(num_cpus=1, num_gpus=2, resources={"odd_node": 1})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    ray.init(address=cluster.address)
    try:
        pg = placement_group([{"GPU": 2, "odd_node": 1}], strategy="STRICT_PACK")
        ray.get(pg.ready(), timeout=30)
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        probe = _probe_devices.options(**ray_request({"GPU": 2.0}), scheduling_strategy=strategy)
        node_id, devices = ray.get(probe.remote("GPU", 2), timeout=60)
        assert node_id == node.node_id and devices == [5, 7]
        remove_placement_group(pg)
    finally:
        ray.shutdown()
        cluster.remove_node(node)
