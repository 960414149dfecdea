"""The original Twinkle infra's DeviceMesh accessors (`dp_rank`, `tp_rank`, ..., `data_rank`,
`<dim>_world_size`): the running worker's place, the same in every mode (inprocess here; the
conformance kit on every backend, and 8-worker runs in tests/local and tests/ray)."""

from __future__ import annotations

import pytest
from _support.mesh_reader import EXPECTED, MeshReader, read_all
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_core import DeviceGroup, DeviceMesh, initialize, shutdown
from twinkle_core.plugin import WorkerContext, worker_context

DIMS = ("pp", "dp", "fsdp", "ep", "cp", "tp")


def test_eight_workers_in_process():
    initialize(mode="inprocess", groups=[DeviceGroup("eight", ranks=8, device_type="cpu")])
    try:
        reader = MeshReader(remote_group="eight")
        assert read_all(reader) == EXPECTED
        assert reader.own()() == [[r, 8, 1] for r in range(8)]
    finally:
        shutdown()


def test_on_the_driver_and_outside_the_mesh_the_ranks_are_none():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    assert (mesh.dp_rank, mesh.tp_rank, mesh.data_rank) == (None, None, None)
    assert (mesh.dp_world_size, mesh.tp_world_size, mesh.fsdp_world_size) == (2, 2, 1)
    outside = WorkerContext(
        rank=7, world_size=8, local_rank=7, local_world_size=8, group_name="g",
        device_mesh=DeviceMesh.from_sizes(dp_size=8),
    )  # fmt: skip
    with worker_context(outside):
        assert mesh.dp_rank is None and mesh.data_rank is None
        assert mesh.tp_world_size == 2


def test_custom_dimensions_and_unknown_names():
    mesh = DeviceMesh([[0, 1], [2, 3]], ("stage", "shard"))
    inside = WorkerContext(
        rank=3, world_size=4, local_rank=3, local_world_size=4, group_name="g", device_mesh=mesh
    )
    with worker_context(inside):
        assert (mesh.stage_rank, mesh.shard_rank) == (1, 1)
        assert (mesh.stage_world_size, mesh.tp_world_size) == (2, 1)
        assert mesh.tp_rank == 0  # a standard dimension the mesh lacks: size 1, coordinate 0
    with pytest.raises(AttributeError, match=r"stag_rank.*dimensions: stage, shard"):
        _ = mesh.stag_rank


@given(sizes=st.lists(st.integers(1, 3), min_size=6, max_size=6), data=st.data())
@settings(max_examples=60, deadline=None)
def test_accessors_are_the_coordinates_of_the_running_worker(sizes, data):
    mesh = DeviceMesh.from_sizes(**{f"{d}_size": s for d, s in zip(DIMS, sizes, strict=True)})
    rank = data.draw(st.sampled_from(mesh.ranks))
    ctx = WorkerContext(
        rank=rank, world_size=mesh.world_size, local_rank=rank,
        local_world_size=mesh.world_size, group_name="g", device_mesh=mesh,
    )  # fmt: skip
    with worker_context(ctx):
        for d, size in zip(DIMS, sizes, strict=True):
            assert getattr(mesh, f"{d}_rank") == mesh.coordinate(rank, d)
            assert getattr(mesh, f"{d}_world_size") == size
        # the original's rule: data_rank = dp_rank * fsdp_world_size + fsdp_rank
        assert mesh.data_rank == mesh.dp_rank * mesh.fsdp_world_size + mesh.fsdp_rank
        assert mesh.data_rank == ctx.data_rank
