"""A simulated two-node cluster with fake GPUs and NPUs: ranks map to nodes and physical devices
as planned, each actor sees exactly its devices and environment, `visible_devices` pins workers
to the physical ids asked for (and ids the run does not hold fail at initialize), and 4 actors
across the two nodes form a gloo group (after rank 0 finds its probed port taken) and all-reduce.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest
import ray
import ray.cloudpickle

from twinkle_core import (
    DeviceGroup,
    get_device_placement,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

_held: list[socket.socket] = []


@remote_class()
class Probe:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def where(self):
        ctx = get_worker_context()
        names = [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES",
            "ASCEND_RT_VISIBLE_DEVICES",
        ]
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "env": {n: os.environ.get(n) for n in names},
            "ctx": [ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size],
            "devices": list(ctx.device_ids),
        }

    @remote_function(dispatch="all", collect="none")
    def hold_master_port(self):
        """Rank 0 takes the port twinkle probed, as another process might in between."""
        if get_worker_context().rank != 0:
            return None
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("", int(os.environ["MASTER_PORT"])))
        s.listen(1)
        _held.append(s)
        return int(os.environ["MASTER_PORT"])

    @remote_function(dispatch="all", collect="none")
    def all_reduce(self):
        import torch
        import torch.distributed as dist

        from twinkle_core import init_distributed

        init_distributed(backend="gloo", timeout=60)
        value = torch.tensor([float(get_worker_context().rank + 1)])
        dist.all_reduce(value)
        world = dist.get_world_size()
        dist.destroy_process_group()
        return [float(value.item()), world, int(os.environ["MASTER_PORT"])]


@pytest.mark.parametrize(
    ("visible", "error", "words"),
    [
        ([1, 4], "ClusterResourceError", ["visible_devices[1]=4", "holds only cuda devices"]),
        ([2, 2], "ConfigurationError", ["visible_devices[1]=2", "device rank 0 of the same group"]),
        ([0, -1], "ConfigurationError", ["visible_devices[1]=-1", "non-negative integer"]),
    ],
)
def test_visible_devices_the_node_does_not_hold_fail_at_initialize(
    cluster, no_runtime, visible, error, words
):
    # Runs before the module's run exists. Both ranks sit on the first node (4 GPUs, ids 0-3).
    with pytest.raises(Exception) as info:
        initialize(
            "ray",
            address=cluster.address,
            nproc_per_node=4,
            groups=[DeviceGroup("pinned", [0, 1], "cuda", visible_devices=visible)],
            name="bad-visible",
            placement_timeout=20,
        )
    assert type(info.value).__name__ == error
    message = str(info.value)
    assert "DeviceGroup 'pinned'" in message and all(w in message for w in words), message
    ray.init(address=cluster.address)  # twinkle disconnected: look from a fresh driver
    try:
        pgs = [
            p
            for p in ray.util.placement_group_table().values()
            if p["name"].startswith("bad-visible") and p["state"] != "REMOVED"
        ]
    finally:
        ray.shutdown()
    assert pgs == []  # the placement groups reserved before the check were removed


@pytest.fixture(scope="module")
def run(cluster):
    initialize(
        "ray",
        address=cluster.address,
        nproc_per_node=4,
        groups=[
            DeviceGroup("gpu", [0, 1, 4, 5], "cuda"),
            DeviceGroup("wide", [2, 3, 6, 7], "cuda", gpus_per_worker=2),
            DeviceGroup("npu", [3, 4], "npu"),
            # Pinned by the user: device ranks 1 and 4 would be devices 1 and 0 by default.
            DeviceGroup("pinned", [1, 4, 5], "cuda", visible_devices=[3, 2, 0]),
        ],
        name="multinode",
    )
    try:
        yield {
            "gpu": Probe(remote_group="gpu"),
            "wide": Probe(remote_group="wide"),
            "npu": Probe(remote_group="npu"),
            "pinned": Probe(remote_group="pinned"),
        }
    finally:
        shutdown()


def _placements(obj):
    return obj.__dict__["_twinkle_binding"].workers.placements


def _node_order(cluster) -> list[str]:
    """Live node ids in twinkle's stable order: address, then id."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    nodes.sort(key=lambda n: (n["NodeManagerAddress"], n["NodeID"]))
    return [n["NodeID"] for n in nodes]


def test_ranks_map_to_nodes_and_devices_in_order(run, cluster):
    nodes = _node_order(cluster)
    assert len(nodes) == 2
    info = run["gpu"].where()()
    assert [i["node_id"] for i in info] == [nodes[0], nodes[0], nodes[1], nodes[1]]
    assert [i["env"]["CUDA_VISIBLE_DEVICES"] for i in info] == ["0", "1", "0", "1"]
    assert [i["ctx"] for i in info] == [[0, 4, 0, 2], [1, 4, 1, 2], [2, 4, 0, 2], [3, 4, 1, 2]]
    for rank, i in enumerate(info):
        env = i["env"]
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "4")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank % 2), "2")
        assert env["MASTER_ADDR"] == info[0]["env"]["MASTER_ADDR"]
        assert env["MASTER_PORT"] == info[0]["env"]["MASTER_PORT"]
        assert env["ASCEND_RT_VISIBLE_DEVICES"] is None
    placements = _placements(run["gpu"])
    assert [p.devices for p in placements] == [(0,), (1,), (0,), (1,)]
    expected = [nodes[0][:8], nodes[0][:8], nodes[1][:8], nodes[1][:8]]
    assert [p.node[-8:] for p in placements] == expected


def test_gpus_per_worker_gives_each_worker_its_devices_on_one_node(run, cluster):
    nodes = _node_order(cluster)
    info = run["wide"].where()()
    assert [i["node_id"] for i in info] == nodes
    assert [i["env"]["CUDA_VISIBLE_DEVICES"] for i in info] == ["2,3", "2,3"]
    assert [i["devices"] for i in info] == [[0, 1], [0, 1]]  # as torch sees them
    assert [p.devices for p in _placements(run["wide"])] == [(2, 3), (2, 3)]  # physical
    assert [i["ctx"] for i in info] == [[0, 2, 0, 1], [1, 2, 0, 1]]


def test_npu_like_resource_sets_its_own_visibility_variable(run, cluster):
    nodes = _node_order(cluster)
    info = run["npu"].where()()
    assert [i["node_id"] for i in info] == nodes
    assert [i["env"]["ASCEND_RT_VISIBLE_DEVICES"] for i in info] == ["3", "0"]
    assert [i["env"]["CUDA_VISIBLE_DEVICES"] for i in info] == [None, None]


def test_visible_devices_pin_each_worker_to_those_physical_devices(run, cluster):
    nodes = _node_order(cluster)
    info = run["pinned"].where()()
    assert [i["node_id"] for i in info] == [nodes[0], nodes[1], nodes[1]]
    assert [i["env"]["CUDA_VISIBLE_DEVICES"] for i in info] == ["3", "2", "0"]
    assert [i["devices"] for i in info] == [[0], [0], [0]]  # as torch sees them
    assert [p.devices for p in _placements(run["pinned"])] == [(3,), (2,), (0,)]
    text = get_device_placement(detail=True)
    section = text[text.index("group pinned") :]
    places = zip(_placements(run["pinned"]), (1, 4, 5), (3, 2, 0), strict=True)
    for rank, (p, global_rank, device) in enumerate(places):
        row = f"group rank {rank}   global rank {global_rank}   node {p.node}  device cuda:{device}"
        assert f"{row} " in section, section


def test_device_placement_shows_the_physical_mapping(run):
    text = get_device_placement(detail=True)
    placements = _placements(run["wide"])
    assert f"node {placements[1].node}  device cuda:2,3" in text
    assert "npu:3" in text and "npu:0" in text


def test_four_actors_on_two_nodes_all_reduce_over_gloo(run):
    gpu = run["gpu"]
    probed = gpu.hold_master_port()()[0]
    results = gpu.all_reduce()()
    assert [r[0] for r in results] == [10.0] * 4 and [r[1] for r in results] == [4] * 4
    ports = {r[2] for r in results}
    assert len(ports) == 1 and probed not in ports  # rank 0 moved to a fresh port, all followed
