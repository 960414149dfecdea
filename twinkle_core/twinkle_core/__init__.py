"""twinkle-core: write a distributed training driver once; run it in-process, under torchrun or
on Ray by changing only `initialize(mode=...)`.

Importing this package loads no plugin and imports neither torch nor ray.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .backend import (
    CompletedCall,
    ExecutionBackend,
    PendingCall,
    WorkerCall,
    WorkerGroup,
    WorkerPlacement,
)
from .callsite import CallSite
from .collect import Collector
from .context import WorkerContext, get_worker_context
from .device_group import DeviceGroup
from .device_mesh import DeviceMesh
from .dispatch import Dispatcher
from .errors import (
    CallTimeoutError,
    ConfigurationError,
    DuplicatePluginError,
    NotInitializedError,
    PluginLoadError,
    PluginNotFoundError,
    TwinkleError,
    WorkerDiedError,
)
from .failures import RankFailure, RemoteFailure, WorkerErrors
from .hookspecs import hookimpl
from .lazy import LazyCollect
from .notify import Notifier
from .placement import get_device_placement
from .platform import AcceleratorPlatform, detect_platform, get_platform
from .remote import remote_class, remote_function
from .runtime import RuntimeConfig, initialize, is_initialized, shutdown

__all__ = [
    "AcceleratorPlatform",
    "CallSite",
    "CallTimeoutError",
    "Collector",
    "CompletedCall",
    "ConfigurationError",
    "DeviceGroup",
    "DeviceMesh",
    "Dispatcher",
    "DuplicatePluginError",
    "ExecutionBackend",
    "LazyCollect",
    "NotInitializedError",
    "Notifier",
    "PendingCall",
    "PluginLoadError",
    "PluginNotFoundError",
    "RankFailure",
    "RemoteFailure",
    "RuntimeConfig",
    "TwinkleError",
    "WorkerCall",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerErrors",
    "WorkerGroup",
    "WorkerPlacement",
    "__version__",
    "detect_platform",
    "get_device_placement",
    "get_platform",
    "get_worker_context",
    "hookimpl",
    "initialize",
    "is_initialized",
    "remote_class",
    "remote_function",
    "shutdown",
]
