"""torch.distributed under torchrun: the default group from torchrun's environment (what
`twinkle_core.init_distributed()` does in mode 'local', through the `twinkle_init_distributed`
hook), and a twinkle `DeviceMesh` as torch's own `DeviceMesh`.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from twinkle_core import ConfigurationError, DeviceMesh
from twinkle_core.plugin import AcceleratorPlatform, resolve_platform

#: The modes whose workers this plugin sets torch.distributed up for.
MODES = ("local", "torchrun")

# How many times this process started a default group; every process of a job starts them in
# the same order, so the count names the store keys of each generation alike everywhere.
_generation = 0


def answers_for(context: Any) -> bool:
    """Whether `twinkle_init_distributed` is this plugin's to answer: a worker of mode 'local',
    or a torchrun script outside any worker (torchrun's variables set)."""
    if context is not None:
        return context.mode in MODES
    return all(os.environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_from_env(
    platform: AcceleratorPlatform,
    backend: str,
    timeout: datetime.timedelta,
    local_rank: int | None = None,
) -> bool:
    """Start torch.distributed's default group from torchrun's environment.

    On an accelerator, the local device (`LOCAL_RANK` unless `local_rank` is given) is made
    current first, as nccl/hccl expect. Returns True when this call created the group, False
    when it was already initialized (then nothing is changed).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if platform.device_type != "cpu" and platform.is_available():
        platform.set_device(local_rank)
    global _generation
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if _generation == 0 and restart == 0:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        # A default group started again in the same job, or in a job torchrun restarted
        # (--max-restarts): torchrun's store outlives the attempt, and torch would read the
        # destroyed group's keys (and connect to stale addresses: "Connection refused" in
        # gloo's connectFullMesh). A prefix per attempt and generation keeps them apart.
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"twinkle/restart{restart}/generation{_generation}", store)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    _generation += 1
    return True


def to_torch_device_mesh(
    mesh: DeviceMesh,
    device_type: str | AcceleratorPlatform | None = None,
    *,
    keep_size_one: bool = False,
) -> Any:
    """torch's `DeviceMesh` with the same ranks and dimension names as the twinkle `mesh`.

    Dimensions of size 1 are dropped unless `keep_size_one` (torch would create a process
    group per dimension for nothing); a mesh of one rank keeps `dp` (or its first dimension). Mesh
    entries are taken as global torch.distributed ranks, which is what they are in local mode
    (a group of k workers lives on ranks 0..k-1). Like every torch mesh construction this is a
    collective: every process of the default group must call it, and it must be initialized.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise ConfigurationError(
            f"to_torch_device_mesh(mesh=...) must be a twinkle_core.DeviceMesh, got {mesh!r}"
        )
    if not dist.is_initialized():
        raise ConfigurationError(
            "to_torch_device_mesh needs torch.distributed to be initialized: call "
            "twinkle_core.initialize(mode='local') or twinkle_core.init_distributed() first"
        )
    world = dist.get_world_size()
    if max(mesh.ranks) >= world:
        raise ConfigurationError(
            f"to_torch_device_mesh: mesh {mesh!r} uses ranks up to {max(mesh.ranks)} but the "
            f"torch.distributed world has {world} processes; use a mesh of at most {world} ranks"
        )
    array = mesh.mesh
    names = mesh.mesh_dim_names
    if not keep_size_one:
        serial = [names.index("dp")] if "dp" in names else [0]
        keep = [i for i, size in enumerate(array.shape) if size > 1] or serial
        names = tuple(names[i] for i in keep)
        array = array.reshape(tuple(array.shape[i] for i in keep))
    platform = resolve_platform(device_type)
    return TorchDeviceMesh(
        platform.device_type,
        torch.as_tensor(array.copy(), dtype=torch.int),
        mesh_dim_names=names,
    )
