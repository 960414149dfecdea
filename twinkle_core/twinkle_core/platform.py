"""Accelerator platforms: what twinkle needs to know about a kind of device."""

from __future__ import annotations

import inspect
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from .device_group import canonical_device_type
from .errors import ConfigurationError

log = logging.getLogger("twinkle")


class AcceleratorPlatform(ABC):
    """One kind of device (cuda, npu, mps, cpu, ...), as seen by backends and workers.

    Class attributes describe the platform statically so that a driver can plan placement
    without importing torch; the methods probe the machine and must never raise when the
    hardware or its library is absent.
    """

    #: Canonical device type name, e.g. "cuda".
    device_type: ClassVar[str]
    #: Other names users may write for it (case-insensitive), e.g. ("gpu",).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Environment variable that limits which devices a process sees, e.g. CUDA_VISIBLE_DEVICES.
    visible_devices_env: ClassVar[str | None] = None
    #: Ray resource name, e.g. "GPU"; None when the platform has no Ray resource.
    ray_resource: ClassVar[str | None] = None
    #: torch.distributed backend for this device, e.g. "nccl".
    dist_backend: ClassVar[str] = "gloo"
    #: Variables that stop Ray from overriding the visible-devices variable twinkle sets.
    ray_noset_env_vars: ClassVar[tuple[str, ...]] = ()
    #: Higher is preferred by `detect_platform()`; cpu is 0.
    detection_priority: ClassVar[int] = 0

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this machine has the device and its library; never raises."""

    @classmethod
    @abstractmethod
    def device_count(cls) -> int:
        """Number of devices visible to this process (0 when unavailable); never raises."""

    def local_device(self, index: int = 0) -> Any:
        """The device object for local index `index` (a `torch.device` on torch platforms)."""
        return f"{self.device_type}:{index}"

    def set_device(self, index: int) -> None:
        """Make local device `index` the current one for this process (no-op by default)."""

    def manual_seed(self, seed: int) -> None:
        """Seed this device's random generators (no-op by default)."""

    def get_rng_state(self) -> Any:
        """This device's random-generator state, or None when it has none."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore a state returned by `get_rng_state`."""

    def visible_devices_environment(self, device_ids: Sequence[int]) -> dict[str, str]:
        """Environment that makes exactly `device_ids` visible to a worker process."""
        if not self.visible_devices_env:
            return {}
        return {self.visible_devices_env: ",".join(str(int(d)) for d in device_ids)}


class CpuPlatform(AcceleratorPlatform):
    """Plain CPU processes: always available, no device visibility to manage."""

    device_type = "cpu"
    aliases = ("host",)
    ray_resource = "CPU"
    dist_backend = "gloo"
    detection_priority = 0

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def device_count(cls) -> int:
        return os.cpu_count() or 1

    def local_device(self, index: int = 0) -> Any:
        return "cpu"


def _platform_classes() -> dict[str, type[AcceleratorPlatform]]:
    from .plugins import plugin_system

    system = plugin_system()
    out = {}
    for name in system.names("platforms"):
        try:
            out[name] = system.get("platforms", name)
        except Exception as exc:  # a broken platform plugin must not break detection
            log.warning("twinkle: platform %r could not be loaded: %s", name, exc)
    return out


def platform_aliases() -> dict[str, str]:
    """Every alias a registered platform declares (lower case) -> that platform's name."""
    out: dict[str, str] = {}
    for name, cls in _platform_classes().items():
        for alias in getattr(cls, "aliases", ()):
            out.setdefault(str(alias).lower(), name)
    return out


def get_platform(device_type: str) -> AcceleratorPlatform:
    """An instance of the platform registered for `device_type` (aliases accepted)."""
    from .plugins import get_plugin

    name = canonical_device_type(device_type)
    platform = get_plugin("platforms", name)
    if inspect.isclass(platform):
        platform = platform()
    if not isinstance(platform, AcceleratorPlatform):
        raise ConfigurationError(
            f"platform {name!r} is registered as {platform!r}, which is not an AcceleratorPlatform"
        )
    return platform


def detect_platform() -> AcceleratorPlatform:
    """The available platform with the highest priority (cpu when nothing else is there)."""
    candidates = sorted(
        _platform_classes().items(),
        key=lambda kv: -getattr(kv[1], "detection_priority", 0),
    )
    for name, cls in candidates:
        try:
            if cls.is_available():
                return get_platform(name)
        except Exception as exc:
            log.debug("twinkle: platform %r detection failed: %s", name, exc)
    return CpuPlatform()


def check_device_type(group: Any, mode: str) -> AcceleratorPlatform:
    """The platform of `group.device_type`; a `ConfigurationError` naming the group when no
    platform is registered for it or this machine has fewer of its devices than the group
    asks for. For backends whose workers run on the driver's machine."""
    from .errors import PluginNotFoundError

    try:
        platform = get_platform(group.device_type)
    except PluginNotFoundError as exc:
        raise ConfigurationError(
            f"DeviceGroup({group.name!r}, device_type={group.device_type!r}): no platform is "
            f"registered for {group.device_type!r} in mode {mode!r}. {exc}"
        ) from None
    if group.device_type == "cpu":
        return platform
    needed = max(group.rank_list) + 1 if group.rank_list else 0
    count = platform.device_count() if platform.is_available() else 0
    if count < needed:
        raise ConfigurationError(
            f"DeviceGroup({group.name!r}, device_type={group.device_type!r}) uses device "
            f"ranks up to {needed - 1}, but this machine has {count} {group.device_type} "
            f"device(s) visible in mode {mode!r}. Use device_type='cpu' to run the group on "
            "CPU workers, or run where the devices are"
        )
    return platform
