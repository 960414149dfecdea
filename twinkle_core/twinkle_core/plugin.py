"""The plugin-author API: everything a backend, dispatcher, collector, platform or notifier
plugin needs, and nothing a driver script needs.

Plugins import only `twinkle_core` (the user API), this module and `twinkle_core.testing`;
the lint suite holds them to it with import-linter contracts. Every name here is documented
in docs/plugins.md.

- Hooks: `hookimpl` marks implementations of the hooks in `twinkle_core.hookspecs`.
- Interfaces: `ExecutionBackend` with `WorkerGroup`, `PendingCall`, `CompletedCall`,
  `WorkerCall` and `WorkerPlacement`; `Dispatcher`; `Collector` (and the built-in ones, for
  backends that treat them specially); `AcceleratorPlatform`; `Notifier`.
- Helpers every backend shares: `WorkerState` (run as a worker with its context and random
  generators), `run_method` and `worker_failure` (a user exception as a `WorkerFailure`
  record), `WorkersFailedError` (raised by a pending call), `portable_exception` (send any
  exception between processes), `add_note`, `read_options` (backend options with a clear
  error for unknown ones), seeding, the worker context, `representatives` and `call_mesh`.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import stacks
from . import trace as tracing
from .backend import (
    CompletedCall,
    ExecutionBackend,
    PendingCall,
    WorkerCall,
    WorkerGroup,
    WorkerPlacement,
    read_options,
)
from .calls import call_mesh, replace_lazy
from .collect import (
    BUILTIN_COLLECTORS,
    Collector,
    ConcatCollector,
    FirstCollector,
    FlattenCollector,
    LastPPCollector,
    MeanCollector,
    NoneCollector,
    SumCollector,
    as_collector,
    flatten_lists,
    representatives,
)
from .collective import (
    Collective,
    CollectiveGroup,
    CollectiveMember,
    MemberHub,
    ProcessLink,
    as_tensor_list,
    check_op,
    check_src,
)
from .context import WorkerContext, set_process_worker_context, worker_context
from .dispatch import BUILTIN_DISPATCHERS, Dispatcher, as_dispatcher
from .failures import (
    CallFailure,
    WorkerFailure,
    WorkersFailedError,
    add_note,
    format_remote_traceback,
    tag_call_site,
)
from .hookspecs import hookimpl
from .notify import Notifier
from .platform import AcceleratorPlatform, CpuPlatform, detect_platform, get_platform
from .plugins import get_plugin, registered_names
from .portable import PortableException, RemoteError, portable_exception, rebuilt
from .runtime import RuntimeConfig
from .seeding import get_rng_state, seed_everything, set_rng_state
from .sensitive import secret_env_patterns
from .slow_calls import waiting_for
from .structure import combine, is_array_like, torch_module
from .transport import (
    AUTO,
    OBJECT_STORE,
    Transport,
    choose_transport,
    explain_transport,
    note_fallback,
    transports_for,
)
from .worker import WorkerState, exit_error, run_method, worker_failure

__all__ = [
    "AUTO",
    "BUILTIN_COLLECTORS",
    "BUILTIN_DISPATCHERS",
    "OBJECT_STORE",
    "AcceleratorPlatform",
    "CallFailure",
    "Collective",
    "CollectiveGroup",
    "CollectiveMember",
    "Collector",
    "CompletedCall",
    "ConcatCollector",
    "CpuPlatform",
    "Dispatcher",
    "ExecutionBackend",
    "FirstCollector",
    "FlattenCollector",
    "LastPPCollector",
    "MeanCollector",
    "MemberHub",
    "NoneCollector",
    "Notifier",
    "PendingCall",
    "PortableException",
    "ProcessLink",
    "RemoteError",
    "RuntimeConfig",
    "SumCollector",
    "Transport",
    "WorkerCall",
    "WorkerContext",
    "WorkerFailure",
    "WorkerGroup",
    "WorkerPlacement",
    "WorkerState",
    "WorkersFailedError",
    "add_note",
    "as_collector",
    "as_dispatcher",
    "as_tensor_list",
    "call_mesh",
    "check_op",
    "check_src",
    "choose_transport",
    "combine",
    "detect_platform",
    "exit_error",
    "explain_transport",
    "flatten_lists",
    "format_remote_traceback",
    "get_platform",
    "get_plugin",
    "get_rng_state",
    "hookimpl",
    "is_array_like",
    "note_fallback",
    "portable_exception",
    "read_options",
    "rebuilt",
    "registered_names",
    "replace_lazy",
    "representatives",
    "run_method",
    "secret_env_patterns",
    "seed_everything",
    "set_process_worker_context",
    "set_rng_state",
    "stacks",
    "tag_call_site",
    "torch_module",
    "tracing",
    "transports_for",
    "waiting_for",
    "worker_context",
    "worker_failure",
]

#: Names renamed in 0.2 (records end in Failure, exceptions in Error), kept for one release.
DEPRECATED_ALIASES = {
    "RankFailure": "WorkerFailure",
    "RemoteFailure": "CallFailure",
    "WorkerErrors": "WorkersFailedError",
}


def deprecated_alias(module: str, name: str) -> Any:
    """The new object for an old name, with a `DeprecationWarning` naming the new one."""
    new = DEPRECATED_ALIASES[name]
    warnings.warn(
        f"{module}.{name} is deprecated and will be removed in twinkle-core 0.3; use "
        f"twinkle_core.plugin.{new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return globals()[new]


def __getattr__(name: str) -> Any:
    if name in DEPRECATED_ALIASES:
        return deprecated_alias(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
