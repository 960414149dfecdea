"""Core's own plugin: registered through the `twinkle` entry-point group like any other."""

from __future__ import annotations

from .collect import BUILTIN_COLLECTORS
from .dispatch import BUILTIN_DISPATCHERS
from .hookspecs import hookimpl


@hookimpl
def register_backends(register) -> None:
    register("inprocess", "twinkle_core.inprocess:InProcessBackend")


@hookimpl
def register_dispatchers(register) -> None:
    for name, dispatcher in BUILTIN_DISPATCHERS.items():
        register(name, dispatcher)


@hookimpl
def register_collectors(register) -> None:
    for name, collector in BUILTIN_COLLECTORS.items():
        register(name, collector)


@hookimpl
def register_platforms(register) -> None:
    register("cpu", "twinkle_core.platform:CpuPlatform")


@hookimpl
def twinkle_init_distributed(context, platform, backend, timeout) -> bool | None:
    """In-process workers share the driver's process: one torch.distributed rank per worker
    cannot exist there, so say so (instead of no plugin answering)."""
    if context is None or context.mode != "inprocess":
        return None
    from .errors import ConfigurationError

    raise ConfigurationError(
        f"init_distributed(): group {context.group_name!r} runs in mode 'inprocess', where every "
        "worker is an object in the driver's process, so torch.distributed cannot give each "
        "its own rank. Run the same script with initialize(mode='local') under torchrun, or "
        "initialize(mode='ray'); keep inprocess for code that does not set up a process group"
    )
