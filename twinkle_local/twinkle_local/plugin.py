"""twinkle-local's plugin module, loaded through the `twinkle` entry-point group.

Everything is registered as a "module:attr" string, so listing plugins imports neither torch
nor the backend.
"""

from __future__ import annotations

from typing import Any

import twinkle_core.plugin as core_plugin
from twinkle_core import hookimpl

from .platforms import PLATFORMS


@hookimpl
def register_backends(register) -> None:
    register("local", "twinkle_local.backend:LocalBackend")
    register("torchrun", "twinkle_local.backend:LocalBackend")


@hookimpl
def register_platforms(register) -> None:
    for name, target in PLATFORMS.items():
        # The torch-aware cpu replaces core's plain one (same name, same meaning, torch devices).
        register(name, target, override=(name == "cpu"))


@hookimpl
def register_transports(register) -> None:
    """Transports carried under torchrun by broadcasts (`twinkle_local.transports`).

    `gloo` and `nccl` are also names twinkle-ray registers for mode 'ray': core resolves a
    name per mode (`transports_for`). With a core older than that, two registrations of one
    name would be a conflict, so they are registered only where core has it (this backend then
    carries the other plugin's names with its own transports: `transports.registered`).
    """
    register("hccl", "twinkle_local.transports:HcclTransport")
    if getattr(core_plugin, "transports_for", None) is not None:
        register("gloo", "twinkle_local.transports:GlooTransport")
        register("nccl", "twinkle_local.transports:NcclTransport")


@hookimpl
def twinkle_seed(seed: int, full_determinism: bool) -> None:
    from .seeding import seed_torch

    seed_torch(seed, full_determinism)


@hookimpl
def twinkle_get_rng_state() -> dict[str, Any] | None:
    from .seeding import get_torch_rng_state

    return get_torch_rng_state()


@hookimpl
def twinkle_set_rng_state(state: dict[str, Any]) -> None:
    from .seeding import set_torch_rng_state

    set_torch_rng_state(state)
