"""twinkle-core: write a distributed training driver once; run it in-process, under torchrun or
on Ray by changing only `initialize(mode=...)`.

Importing this package loads no plugin and imports neither torch nor ray.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("twinkle-core")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0.0.0+unknown"

from .collect import Collector
from .collective import Collective, CollectiveGroup, collective, collective_group
from .context import WorkerContext, get_worker_context
from .device_group import DeviceGroup
from .device_mesh import DeviceMesh
from .dispatch import Dispatcher
from .distributed import init_distributed
from .errors import (
    CallLostError,
    CallTimeoutError,
    CollectError,
    CollectiveBrokenError,
    ConfigurationError,
    DuplicatePluginError,
    NotInitializedError,
    PluginLoadError,
    PluginNotFoundError,
    TwinkleError,
    WorkerDiedError,
    WorkerExitError,
)
from .health import GroupState
from .hookspecs import hookimpl
from .lazy import LazyCollect
from .notify import Notifier
from .placement import get_device_placement
from .portable import RemoteError
from .remote import remote_class, remote_function
from .runtime import group_state, initialize, is_initialized, shutdown
from .stacks import dump_stacks
from .waiting import as_completed, get, wait

__all__ = [
    "CallLostError",
    "CallTimeoutError",
    "CollectError",
    "Collective",
    "CollectiveBrokenError",
    "CollectiveGroup",
    "Collector",
    "ConfigurationError",
    "DeviceGroup",
    "DeviceMesh",
    "Dispatcher",
    "DuplicatePluginError",
    "GroupState",
    "LazyCollect",
    "NotInitializedError",
    "Notifier",
    "PluginLoadError",
    "PluginNotFoundError",
    "RemoteError",
    "TwinkleError",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerExitError",
    "__version__",
    "as_completed",
    "collective",
    "collective_group",
    "dump_stacks",
    "get",
    "get_device_placement",
    "get_worker_context",
    "group_state",
    "hookimpl",
    "init_distributed",
    "initialize",
    "is_initialized",
    "remote_class",
    "remote_function",
    "shutdown",
    "wait",
]
