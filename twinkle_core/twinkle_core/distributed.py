"""`init_distributed()`: torch.distributed's default group inside a worker, in every mode.

Worker code imports only `twinkle_core`: the same method sets up its process group under
torchrun and on Ray. Core resolves what is the same everywhere (the platform, from the
worker's device type, and so nccl/hccl/gloo; the timeout) and asks the plugins through the
`twinkle_init_distributed` hook; the backend that runs the worker answers with what only it
knows (torchrun's environment, Ray's rendezvous through its key-value store). Core never
imports torch.
"""

from __future__ import annotations

import datetime
from typing import Any

from .context import get_worker_context
from .errors import ConfigurationError
from .platform import AcceleratorPlatform, detect_platform, get_platform

#: Default timeout of twinkle's process groups: long enough for slow checkpoints, as torch's own.
DEFAULT_TIMEOUT_S = 1800.0


def as_timeout(value: Any, argument: str = "timeout") -> datetime.timedelta:
    """Seconds (int/float > 0) or a timedelta as a timedelta; a clear error otherwise."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigurationError(
            f"{argument} must be a positive number of seconds or a datetime.timedelta, "
            f"got {value!r}"
        )
    return datetime.timedelta(seconds=seconds)


def resolve_platform(device_type: str | AcceleratorPlatform | None) -> AcceleratorPlatform:
    """The platform for `device_type` (an alias, a platform, or None to auto-detect)."""
    if isinstance(device_type, AcceleratorPlatform):
        return device_type
    if device_type is None:
        return detect_platform()
    return get_platform(device_type)


def init_distributed(
    device_type: str | AcceleratorPlatform | None = None,
    *,
    backend: str | None = None,
    timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S,
) -> bool:
    """Initialize torch.distributed's default group for this worker's group.

    Call it inside a remote method (or, under torchrun, anywhere in the script). The group
    holds the workers of this worker's `DeviceGroup`, ranks as `get_worker_context().rank`.
    The backend is the platform's (`nccl` for cuda, `hccl` for npu, `gloo` for cpu and mps)
    unless `backend` is given; `device_type` defaults to the worker's. On an accelerator the
    worker's device is made current first, as nccl/hccl expect. Returns True when this call
    created the group, False when it already existed (then nothing changes).
    """
    context = get_worker_context()
    wanted = device_type if device_type is not None else (context and context.device_type)
    platform = resolve_platform(wanted or None)
    delta = as_timeout(timeout, "init_distributed(timeout=...)")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ConfigurationError(
            f"init_distributed(backend=...) must be a torch.distributed backend name such as "
            f"'gloo' or 'nccl', or None for the platform's ({platform.dist_backend!r}); got "
            f"{backend!r}"
        )
    from .plugins import plugin_system

    answer = plugin_system().hook.twinkle_init_distributed(
        context=context,
        platform=platform,
        backend=backend or platform.dist_backend,
        timeout=delta,
    )
    if answer is None:
        where = (
            f"a worker of mode {context.mode!r}"
            if context is not None and context.mode
            else "a process outside any twinkle worker"
        )
        raise ConfigurationError(
            f"init_distributed(): no installed plugin sets up torch.distributed for {where}. "
            "Call it inside a remote method of a run started with initialize(mode='local') "
            "(under torchrun) or initialize(mode='ray'), with that backend installed "
            "(`twinkle plugins` lists them)"
        )
    return bool(answer)
