"""A remote class reading the original Twinkle infra's DeviceMesh accessors inside its workers,
and what 8 workers must answer: shared by the inprocess, torchrun and Ray tests of them."""

from __future__ import annotations

from twinkle_core import DeviceMesh, get_worker_context, remote_class, remote_function

#: Two meshes of 8 workers: pp=2 x dp=2 x tp=2, and the original's dp=2 x fsdp=4.
EIGHT = {
    "pp2_dp2_tp2": DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2),
    "dp2_fsdp4": DeviceMesh.from_sizes(dp_size=2, fsdp_size=4),
}
#: [pp_rank, dp_rank, fsdp_rank, tp_rank, data_rank] of each of the 8 workers, worked out from
#: the rank order pp, dp, fsdp, ep, cp, tp (outermost first).
EXPECTED = {
    "pp2_dp2_tp2": [[r // 4, (r // 2) % 2, 0, r % 2, (r // 2) % 2] for r in range(8)],
    "dp2_fsdp4": [[0, r // 4, r % 4, 0, r] for r in range(8)],
}


@remote_class()
class MeshReader:
    @remote_function(dispatch="all", collect="none")
    def read(self, mesh):
        """The accessors of `mesh` for this worker (the mesh handed to every worker whole)."""
        assert mesh.data_rank == mesh.data_rank_of(get_worker_context().rank)
        return [mesh.pp_rank, mesh.dp_rank, mesh.fsdp_rank, mesh.tp_rank, mesh.data_rank]

    @remote_function(dispatch="all", collect="none")
    def own(self):
        """The accessors of the object's own mesh (dp=n by default)."""
        mesh = get_worker_context().device_mesh
        return [mesh.dp_rank, mesh.dp_world_size, mesh.tp_world_size]


def read_all(reader) -> dict:
    """What `reader` (a MeshReader on an 8-worker group) answers for both meshes."""
    return {name: reader.read(mesh)() for name, mesh in EIGHT.items()}
