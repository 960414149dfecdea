"""twinkle-ray's plugin module, loaded through the `twinkle` entry-point group.

The backend is registered as a "module:attr" string, so listing plugins imports neither ray nor
the backend.
"""

from __future__ import annotations

from twinkle_core import hookimpl


@hookimpl
def register_backends(register) -> None:
    register("ray", "twinkle_ray.backend:RayBackend")


@hookimpl
def register_transports(register) -> None:
    """Ray's own transports, over Ray Direct Transport (`twinkle_ray.transports`). The
    torch.distributed ones (`gloo`, `nccl`, `hccl`) are twinkle-local's, carried here too."""
    register("cuda_ipc", "twinkle_ray.transports:CudaIpcTransport")
    register("nixl", "twinkle_ray.transports:NixlTransport")


@hookimpl
def twinkle_init_distributed(context, platform, backend, timeout) -> bool | None:
    """`twinkle_core.init_distributed()` inside a Ray actor of this backend."""
    if context is None or context.mode != "ray":
        return None
    from .distributed import init_in_actor

    return init_in_actor(context, platform, backend, timeout)


@hookimpl
def twinkle_doctor_probe(backend: str, address: str, timeout: float) -> dict | None:
    """`twinkle doctor --ray [ADDRESS]`: the cluster's nodes (`twinkle_ray.doctor_probe`)."""
    if backend != "ray":
        return None
    from .doctor_probe import probe

    return probe(address, timeout)
