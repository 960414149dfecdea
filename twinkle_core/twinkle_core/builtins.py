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
