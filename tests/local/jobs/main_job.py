"""One torchrun job with the checks that need real processes (batched: each job costs seconds).

Every rank writes `<out_dir>/rank<r>.json` (stdout of two processes interleaves) with:
- `reference_*`: the inprocess reference of the conformance driver and the scenarios,
- `local_*`: the same driver code in mode 'local',
- `checks`: things only mode 'local' has (torch mesh, separate groups, limits, divergence).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import scenarios
import torch
import torch.distributed as dist
from _support import conformance, design_example

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    TwinkleError,
    get_device_placement,
    init_distributed,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.runtime import current_runtime
from twinkle_local import to_torch_device_mesh

RANK = int(os.environ["RANK"])
RESULTS: dict = {}


def emit(name: str, value) -> None:
    RESULTS[name] = value


@remote_class()
class Caller:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def call_all(self, other):
        try:
            return ["ok", other.where()()]
        except Exception as exc:
            return [type(exc).__name__, str(exc)]


@remote_class()
class Broken:
    def __init__(self) -> None:
        if RANK == 1:
            raise ZeroDivisionError("no data on this rank")


@remote_class()
class Step:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def a(self):
        return "a"

    @remote_function(dispatch="all", collect="mean")
    def b(self):
        return 1.0

    @remote_function(dispatch="all", collect="first")
    def where(self):
        return "here"


def local_checks() -> dict:
    config = initialize(
        "local",
        seed=3,
        groups=[DeviceGroup("two", 2, "cpu"), DeviceGroup("one", 1, "cpu")],
        timeout=120,
    )
    out: dict = {"run_name": config.name}
    try:
        backend = current_runtime().backend
        control = backend.session.channel.group
        out["dist_backend_default"] = dist.get_backend()
        out["dist_backend_control"] = dist.get_backend(control)
        out["control_is_separate"] = control is not dist.group.WORLD
        # A user collective on the default group, between twinkle's exchanges.
        t = torch.tensor([float(RANK + 1)])
        dist.all_reduce(t)
        out["user_all_reduce"] = t.item()

        dp = to_torch_device_mesh(DeviceMesh.from_sizes(dp_size=2), "cpu")
        tp = to_torch_device_mesh(DeviceMesh.from_sizes(tp_size=2), "cpu")
        out["torch_mesh_dp"] = [list(dp.mesh_dim_names), dp.mesh.tolist(), dp.get_local_rank()]
        out["torch_mesh_tp"] = [list(tp.mesh_dim_names), tp.mesh.tolist()]

        caller = Caller(remote_group="two")
        one = Step(remote_group="one")
        out["nested"] = caller.call_all(one)()
        placement = get_device_placement(detail=True)
        out["placement_has_both_ranks"] = "rank 0" in placement and "rank 1" in placement
        out["holds_worker_one"] = one._twinkle_binding.workers.holds_worker

        try:
            Broken(remote_group="two")
            out["construct"] = None
        except ZeroDivisionError as exc:  # every rank raises rank 1's error
            out["construct"] = [str(exc), list(getattr(exc, "__notes__", []))]

        step = Step(remote_group="two")
        try:
            if RANK == 0:
                step.a()()
            else:
                step.b()()
            out["diverged"] = None
        except TwinkleError as exc:
            out["diverged"] = str(exc)
    finally:
        shutdown()
        shutdown()  # safe twice
    out["default_group_destroyed"] = not dist.is_initialized()
    return out


def user_group_checks() -> dict:
    """A default group the user started is used as is, and left alone at shutdown."""
    assert init_distributed("cpu", timeout=120)
    initialize("local", seed=3, groups=[DeviceGroup("two", 2, "cpu")], timeout=120)
    try:
        step = Step(remote_group="two")
        out = {"mean": step.b()(), "owns": current_runtime().backend.groups.owns_default_group}
    finally:
        shutdown()
    out["kept"] = dist.is_initialized()
    dist.destroy_process_group()
    return out


def main() -> None:
    emit("reference_conformance", conformance.run("inprocess"))
    emit("reference_scenarios", scenarios.run("inprocess"))
    emit("local_conformance", conformance.run("local"))
    emit("local_scenarios", scenarios.run("local", timeout=120))
    emit("design", design_example.run("local"))
    emit("checks", local_checks())
    emit("user_group", user_group_checks())
    out = Path(sys.argv[1]) / f"rank{RANK}.json"
    out.write_text(json.dumps(RESULTS, sort_keys=True))


if __name__ == "__main__":
    main()
