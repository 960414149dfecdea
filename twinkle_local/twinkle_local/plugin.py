"""twinkle-local's plugin module, loaded through the `twinkle` entry-point group.

Everything is registered as a "module:attr" string, so listing plugins imports neither torch
nor the backend.
"""

from __future__ import annotations

from typing import Any

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
    """The torch.distributed transports, one definition each (`twinkle_local.torchkit`):
    carried under torchrun by broadcasts, and by any other backend that builds
    torch.distributed groups between its groups (the Ray backend)."""
    register("gloo", "twinkle_local.transports:GlooTransport")
    register("nccl", "twinkle_local.transports:NcclTransport")
    register("hccl", "twinkle_local.transports:HcclTransport")


@hookimpl
def twinkle_init_distributed(context, platform, backend, timeout) -> bool | None:
    """`twinkle_core.init_distributed()` in a worker of mode 'local' (or a torchrun script
    outside any worker): the default group from torchrun's environment."""
    from .distributed import answers_for, init_from_env

    if not answers_for(context):
        return None
    return init_from_env(platform, backend, timeout)


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


@hookimpl
def twinkle_random_generators() -> list[Any]:
    """torch's generators, switched by fingerprint between the workers a process hosts."""
    from .rng import TorchGenerator

    return [TorchGenerator()]
