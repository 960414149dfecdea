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
    """Device-direct transports carried by the Ray backend (`twinkle_ray.transports`)."""
    register("gloo", "twinkle_ray.transports:GlooTransport")
    register("nccl", "twinkle_ray.transports:NcclTransport")
    register("hccl", "twinkle_ray.transports:HcclTransport")
    register("cuda_ipc", "twinkle_ray.transports:CudaIpcTransport")
    register("nixl", "twinkle_ray.transports:NixlTransport")


@hookimpl
def twinkle_doctor_probe(backend: str, address: str, timeout: float) -> dict | None:
    """`twinkle doctor --ray [ADDRESS]`: the cluster's nodes (`twinkle_ray.doctor_probe`)."""
    if backend != "ray":
        return None
    from .doctor_probe import probe

    return probe(address, timeout)
