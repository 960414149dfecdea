"""A 4-process job: groups smaller than the world, and a 2-D mesh over all four processes.

Usage `wide_job.py OUT_DIR`; every rank writes OUT_DIR/rank<r>.json with the inprocess reference
and the local results of the same driver code, and its view of a 2-D torch mesh.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import scenarios
import torch.distributed as dist
from _support import conformance

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_local import to_torch_device_mesh

RANK = int(os.environ["RANK"])


@remote_class()
class Model:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="slice_dp", collect="mean")
    def loss(self, batch):
        ctx = get_worker_context()
        # tp peers compute the same shard; the tp coordinate must not change the mean.
        return float(np.sum(batch)) + 1000.0 * ctx.device_mesh.coordinate(ctx.rank, "tp")

    @remote_function(dispatch="slice_dp", collect="concat")
    def outputs(self, batch):
        return np.asarray(batch) * 10

    @remote_function(dispatch="all", collect="none")
    def coords(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.data_rank, ctx.device_mesh.coordinate(ctx.rank, "tp")]


def mesh_run(mode: str) -> dict:
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    initialize(mode, seed=11, groups=[DeviceGroup("model", 4, "cpu")], global_device_mesh=mesh)
    try:
        model = Model(remote_group="model")
        batch = [1, 2, 3, 4, 5]
        out = {
            "loss": model.loss(batch)(),
            "outputs": model.outputs(batch)().tolist(),
            "coords": model.coords()(),
        }
        if mode == "local":
            torch_mesh = to_torch_device_mesh(mesh, "cpu")
            out["torch_mesh"] = [
                list(torch_mesh.mesh_dim_names),
                torch_mesh.mesh.tolist(),
                torch_mesh.get_local_rank("dp"),
                torch_mesh.get_local_rank("tp"),
                dist.get_process_group_ranks(torch_mesh.get_group("tp")),
            ]
        return out
    finally:
        shutdown()


def main() -> None:
    results = {
        "reference_conformance": conformance.run("inprocess"),
        "reference_scenarios": scenarios.run("inprocess"),
        "reference_mesh": mesh_run("inprocess"),
        "local_conformance": conformance.run("local"),
        "local_scenarios": scenarios.run("local", timeout=120),
        "local_mesh": mesh_run("local"),
    }
    (Path(sys.argv[1]) / f"rank{RANK}.json").write_text(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
