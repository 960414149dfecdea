"""The plugin-author API: everything a backend, dispatcher, collector, platform, transport or
notifier plugin needs, and nothing a driver script needs.

Plugins import only `twinkle_core` (the user API), this module and `twinkle_core.testing`
(the conformance kit); import-linter contracts hold them to it. Every name here is used by a
plugin twinkle ships or by the conformance kit, and is described in docs/plugins.md
("The plugin API"), which tests/core/test_plugin_api.py checks. Hooks are the only registry:
what a backend adds to a core feature (worker stacks, trace events, a cluster probe,
torch.distributed set-up) it gives through a hook or a method of its interface, never by
registering a function with a core module at import time.
"""

from __future__ import annotations

from types import MappingProxyType

from .backend import (
    CompletedCall,
    ExecutionBackend,
    PendingCall,
    PreparedCall,
    WorkerCall,
    WorkerGroup,
    WorkerPlacement,
)
from .calls import call_mesh
from .callsite import user_call_site, user_stack
from .collect import (
    Collector,
    ConcatCollector,
    FirstCollector,
    FlattenCollector,
    LastPPCollector,
    MeanCollector,
    NoneCollector,
    SumCollector,
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
from .copying import copy_arguments
from .dispatch import BUILTIN_DISPATCHERS as _BUILTIN_DISPATCHERS
from .dispatch import Dispatcher
from .distributed import as_timeout, resolve_platform
from .failures import (
    WorkerFailure,
    WorkersFailedError,
    add_note,
    format_remote_traceback,
    unsendable_result,
)
from .handoff import builtin_hand_off, hand_off_value, reference_memo
from .health import RESTART, RESTARTING, TEAR_DOWN
from .hookspecs import hookimpl
from .notify import Notifier
from .plain import is_plain_data
from .platform import AcceleratorPlatform, CpuPlatform, detect_platform, get_platform
from .plugins import get_plugin, registered_names
from .portable import PortableException, portable_exception, rebuilt
from .remote import class_options, method_options
from .rng_switch import RandomGenerator
from .seeding import get_rng_state, seed_everything, set_rng_state
from .sensitive import looks_secret, secret_env_patterns
from .slow_calls import waiting_for
from .stacks import thread_stacks
from .structure import combine, is_array_like
from .trace import now_ns, recorder
from .trace import start_worker as start_worker_trace
from .trace import worker_wanted as worker_trace_wanted
from .transport import (
    AUTO,
    OBJECT_STORE,
    Transport,
    explain_transport,
    note_fallback,
    registered_transports,
)
from .worker import WorkerState, exit_error, run_method, worker_failure

#: The built-in dispatchers by name (read-only).
BUILTIN_DISPATCHERS = MappingProxyType(_BUILTIN_DISPATCHERS)

__all__ = [
    "AUTO",
    "BUILTIN_DISPATCHERS",
    "OBJECT_STORE",
    "RESTART",
    "RESTARTING",
    "TEAR_DOWN",
    "AcceleratorPlatform",
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
    "PreparedCall",
    "ProcessLink",
    "RandomGenerator",
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
    "as_tensor_list",
    "as_timeout",
    "builtin_hand_off",
    "call_mesh",
    "check_op",
    "check_src",
    "class_options",
    "combine",
    "copy_arguments",
    "detect_platform",
    "exit_error",
    "explain_transport",
    "flatten_lists",
    "format_remote_traceback",
    "get_platform",
    "get_plugin",
    "get_rng_state",
    "hand_off_value",
    "hookimpl",
    "is_array_like",
    "is_plain_data",
    "looks_secret",
    "method_options",
    "note_fallback",
    "now_ns",
    "portable_exception",
    "rebuilt",
    "recorder",
    "reference_memo",
    "registered_names",
    "registered_transports",
    "representatives",
    "resolve_platform",
    "run_method",
    "secret_env_patterns",
    "seed_everything",
    "set_process_worker_context",
    "set_rng_state",
    "start_worker_trace",
    "thread_stacks",
    "unsendable_result",
    "user_call_site",
    "user_stack",
    "waiting_for",
    "worker_context",
    "worker_failure",
    "worker_trace_wanted",
]
