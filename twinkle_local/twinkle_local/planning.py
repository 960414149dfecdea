"""The checks of `initialize(mode='local')` that need no other process, and the default group.

In mode 'local' torchrun decides the number of processes and a group of k workers runs on ranks
0..k-1, one process per device. Whether the requested groups and mesh fit that world, and its
devices, is known in each process before any process group exists: checked here first, a script
that cannot run fails at once on every process instead of leaving the others waiting.
"""

from __future__ import annotations

from twinkle_core import ConfigurationError, DeviceGroup, DeviceMesh, PluginNotFoundError
from twinkle_core.plugin import AcceleratorPlatform, get_platform

from .env import TorchrunEnv


def plan(config, env: TorchrunEnv, platform: AcceleratorPlatform) -> None:
    """Default group and mesh, and every check that can fail before any process waits."""
    world = env.world_size
    how = (
        f"the torchrun world has {world} process(es)"
        if env.launched
        else "this process was not started by torchrun, so the world is this one process"
    )
    fix = "start the script with `torchrun --nproc_per_node=N script.py` for a larger N"
    if config.nproc_per_node is not None and config.nproc_per_node != env.local_world_size:
        raise ConfigurationError(
            f"initialize(nproc_per_node={config.nproc_per_node}) but {how} "
            f"({env.local_world_size} on this node); in mode 'local' torchrun decides the "
            f"number of processes: pass the same --nproc_per_node to torchrun, or drop "
            f"nproc_per_node"
        )
    mesh = config.global_device_mesh
    if mesh is not None and mesh.world_size > world:
        raise ConfigurationError(
            f"initialize(global_device_mesh={mesh!r}) needs {mesh.world_size} workers but "
            f"{how}; use a mesh of at most {world} ranks or {fix}"
        )
    if not config.groups:
        size = mesh.world_size if mesh is not None else world
        config.groups = {"default": DeviceGroup("default", size, platform.device_type)}
        if mesh is None:
            config.global_device_mesh = DeviceMesh.from_sizes(dp_size=world)
    for group in config.groups.values():
        if group.num_workers > world:
            raise ConfigurationError(
                f"DeviceGroup {group.name!r} has {group.num_workers} workers but {how}; in "
                f"mode 'local' a group of k workers runs on ranks 0..k-1 of the torchrun "
                f"world: use at most {world} workers or {fix}"
            )
        if group.device_type != "cpu":
            check_devices(group, env, platform)


def check_devices(group: DeviceGroup, env: TorchrunEnv, platform: AcceleratorPlatform) -> None:
    """A group's device type must name a platform with a device for each of its workers
    in this process (one process per device: worker r uses local device LOCAL_RANK)."""
    try:
        group_platform = get_platform(group.device_type)
    except PluginNotFoundError as exc:
        raise ConfigurationError(
            f"DeviceGroup {group.name!r} asks for device_type {group.device_type!r}, for "
            f"which no platform is registered in mode 'local'; use device_type="
            f"{platform.device_type!r} (detected here). {exc}"
        ) from None
    if not group_platform.is_available():
        raise ConfigurationError(
            f"DeviceGroup {group.name!r} asks for device_type "
            f"{group.device_type!r}, but this process sees no such device (detected "
            f"platform: {platform.device_type!r}); use device_type="
            f"{platform.device_type!r} or run where the devices are"
        )
    count = group_platform.device_count()
    if env.rank < group.num_workers and env.local_rank >= count:
        raise ConfigurationError(
            f"DeviceGroup {group.name!r} puts worker rank {env.rank} on local "
            f"{group.device_type} device {env.local_rank} (LOCAL_RANK), but this node has "
            f"{count} such device(s); in mode 'local' each process uses one device: start "
            f"at most {count} process(es) per node (torchrun --nproc_per_node={count})"
        )
