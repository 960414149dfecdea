"""The options of `initialize(mode='local', ...)`: their defaults and their checks.

They are read once, at initialize and before any process waits for another, so a mistyped or
ill-typed option fails at once, naming the options the backend accepts.
"""

from __future__ import annotations

from typing import Any

from twinkle_core import ConfigurationError
from twinkle_core.plugin import as_timeout

from .defaults import DEFAULT_TIMEOUT_S

#: Options of `initialize(mode='local', ...)` and their defaults.
DEFAULT_OPTIONS: dict[str, Any] = {
    # Seconds a twinkle call waits for the other processes before the job is declared broken
    # (the timeout of twinkle's own gloo group).
    "timeout": DEFAULT_TIMEOUT_S,
    # Timeout of the default process group, when twinkle creates it (start-up included).
    "dist_timeout": DEFAULT_TIMEOUT_S,
    # Copy arguments and results as a real transport would (like mode 'inprocess').
    "isolate": True,
    # torch.distributed backend of the default group; None: the platform's (nccl/hccl/gloo).
    "dist_backend": None,
    # Seconds the other processes wait at shutdown for the elected one to send its alerts.
    "notify_wait": 30.0,
    # Each call's first exchange over Unix sockets when every process runs on this machine
    # (about 10x faster than gloo for these small messages); False: always over gloo.
    "node_sockets": True,
}


def parse_options(given: dict[str, Any]) -> dict[str, Any]:
    """`DEFAULT_OPTIONS` updated with `given`, checked: `timeout` and `dist_timeout` become
    timedeltas, `notify_wait` seconds; anything unknown or ill-typed is a ConfigurationError."""
    unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"initialize(mode='local') got unknown options {unknown}; the local backend "
            f"accepts: {', '.join(DEFAULT_OPTIONS)}"
        )
    options = {**DEFAULT_OPTIONS, **given}
    for key in ("timeout", "dist_timeout"):
        options[key] = as_timeout(options[key], f"initialize(mode='local', {key}=...)")
    options["notify_wait"] = as_timeout(
        options["notify_wait"], "initialize(mode='local', notify_wait=...)"
    ).total_seconds()
    for key in ("isolate", "node_sockets"):
        if not isinstance(options[key], bool):
            raise ConfigurationError(
                f"initialize(mode='local', {key}=...) must be True or False, got {options[key]!r}"
            )
    backend = options["dist_backend"]
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ConfigurationError(
            "initialize(mode='local', dist_backend=...) must be a torch.distributed backend "
            f"name such as 'gloo' or 'nccl', or None for the platform's; got {backend!r}"
        )
    return options
