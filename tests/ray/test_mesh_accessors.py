"""The original Twinkle infra's DeviceMesh accessors inside 8 Ray actors: each answers for the
worker running the code (its group rank, from the worker context), as inprocess and torchrun
workers do (tests/core/test_mesh_accessors.py, tests/local/test_torchrun.py)."""

from __future__ import annotations

import ray.cloudpickle
from _support import mesh_reader

from twinkle_core import DeviceGroup, initialize, shutdown

# Ray workers need not import the tests' helpers: the class travels by value.
ray.cloudpickle.register_pickle_by_value(mesh_reader)


def test_mesh_accessors_inside_eight_actors(cluster, no_runtime):
    initialize("ray", address=cluster.address, groups=[DeviceGroup("eight", 8, "cpu")])
    try:
        reader = mesh_reader.MeshReader(remote_group="eight")
        assert mesh_reader.read_all(reader) == mesh_reader.EXPECTED
        assert reader.own()() == [[r, 8, 1] for r in range(8)]
        mesh = mesh_reader.EIGHT["dp2_fsdp4"]
        assert (mesh.dp_rank, mesh.data_rank) == (None, None)  # on the driver
    finally:
        shutdown()
