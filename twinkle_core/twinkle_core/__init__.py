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

from typing import Any

from .collect import Collector
from .collective import Collective, CollectiveGroup, collective, collective_group
from .context import WorkerContext, get_worker_context
from .device_group import DeviceGroup
from .device_mesh import DeviceMesh
from .dispatch import Dispatcher
from .errors import (
    CallTimeoutError,
    CollectError,
    ConfigurationError,
    DuplicatePluginError,
    NotInitializedError,
    PluginLoadError,
    PluginNotFoundError,
    TwinkleError,
    WorkerDiedError,
    WorkerExitError,
)
from .hookspecs import hookimpl
from .lazy import LazyCollect
from .notify import Notifier
from .placement import get_device_placement
from .portable import RemoteError
from .remote import remote_class, remote_function
from .runtime import initialize, is_initialized, shutdown
from .stacks import dump_stacks
from .waiting import as_completed, wait

__all__ = [
    "CallTimeoutError",
    "CollectError",
    "Collective",
    "CollectiveGroup",
    "Collector",
    "ConfigurationError",
    "DeviceGroup",
    "DeviceMesh",
    "Dispatcher",
    "DuplicatePluginError",
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
    "get_device_placement",
    "get_worker_context",
    "hookimpl",
    "initialize",
    "is_initialized",
    "remote_class",
    "remote_function",
    "shutdown",
    "wait",
]

#: Names renamed in 0.2 (see `twinkle_core.plugin.DEPRECATED_ALIASES`).
_DEPRECATED = {"RankFailure", "RemoteFailure", "WorkerErrors"}

#: Backend-side names that lived here before 0.2: now in `twinkle_core.plugin`.
_MOVED_TO_PLUGIN = {
    "AcceleratorPlatform",
    "CallSite",
    "CompletedCall",
    "ExecutionBackend",
    "PendingCall",
    "RuntimeConfig",
    "WorkerCall",
    "WorkerGroup",
    "WorkerPlacement",
    "detect_platform",
    "get_platform",
}


def __getattr__(name: str) -> Any:
    import importlib
    import warnings

    if name not in _MOVED_TO_PLUGIN and name not in _DEPRECATED:
        # Also for submodules not imported yet (`from twinkle_core import plugin`): the import
        # system then loads them itself.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # importlib, not `from . import plugin`: that would ask this very __getattr__ again.
    plugin = importlib.import_module(f"{__name__}.plugin")
    if name in plugin.DEPRECATED_ALIASES:
        return plugin.deprecated_alias(__name__, name)
    if name in _MOVED_TO_PLUGIN:
        warnings.warn(
            f"twinkle_core.{name} moved to twinkle_core.plugin.{name} in 0.2 (the top level "
            "holds only the user API); the old name goes away in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        if name == "CallSite":
            from .callsite import CallSite

            return CallSite
        return getattr(plugin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
