"""`init_distributed()` inside Ray actors: torch.distributed with the platform's backend.

Every actor already has RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so a plain
`torch.distributed.init_process_group()` works. This helper adds what env:// cannot: it picks
the platform's backend (nccl, hccl, gloo), and when the probed port was taken between probing
and use, rank 0 retries on a fresh port and tells the other ranks through Ray's key-value store.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

from twinkle_core import get_worker_context
from twinkle_core.plugin import AcceleratorPlatform

#: How many ports rank 0 tries before giving up.
DEFAULT_PORT_ATTEMPTS = 3

_generation: dict[str, int] = {}


def _kv_key(base: str, generation: int) -> bytes:
    run = os.environ.get("TWINKLE_RUN_NAME", "")
    return f"twinkle:{run}:{base}:rdzv:{generation}".encode()


def _port_in_use(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "address already in use" in text or "errno 98" in text or "eaddrinuse" in text


def init_distributed(
    device_type: str | AcceleratorPlatform | None = None,
    *,
    backend: str | None = None,
    timeout: float | datetime.timedelta = 1800.0,
    port_attempts: int = DEFAULT_PORT_ATTEMPTS,
) -> bool:
    """Initialize torch.distributed's default group for this worker's group.

    Returns True when this call created the group, False when it already existed. Outside a
    twinkle Ray actor it falls back to `twinkle_local.init_distributed` (env://).
    """
    import ray
    import torch.distributed as dist

    from twinkle_local.distributed import as_timeout, resolve_platform
    from twinkle_local.distributed import init_distributed as local_init

    if dist.is_initialized():
        return False
    ctx = get_worker_context()
    platform = resolve_platform(device_type or (ctx.device_type if ctx else None))
    base = os.environ.get("TWINKLE_WORKER_GROUP")
    if ctx is None or base is None or not ray.is_initialized():
        return local_init(platform, backend=backend, timeout=timeout)
    td = as_timeout(timeout, "init_distributed(timeout=...)")
    if platform.device_type != "cpu" and platform.is_available():
        platform.set_device(0)  # twinkle narrowed visibility to this worker's devices
    generation = _generation.get(base, 0)
    _generation[base] = generation + 1
    store = _rendezvous(ctx.rank, ctx.world_size, _kv_key(base, generation), td, port_attempts)
    dist.init_process_group(
        backend=backend or platform.dist_backend,
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=td,
    )
    return True


def _rendezvous(
    rank: int, world_size: int, key: bytes, timeout: datetime.timedelta, attempts: int
) -> Any:
    from ray.experimental import internal_kv
    from torch.distributed import TCPStore

    from .actor import free_port

    addr = os.environ["MASTER_ADDR"]
    if rank == 0:
        port = int(os.environ["MASTER_PORT"])
        for attempt in range(attempts):
            try:
                store = TCPStore(
                    addr, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False
                )
            except Exception as exc:
                if not _port_in_use(exc) or attempt == attempts - 1:
                    raise
                port = free_port()
                continue
            os.environ["MASTER_PORT"] = str(port)
            internal_kv._internal_kv_put(key, str(port).encode(), overwrite=True)
            return store
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        value = internal_kv._internal_kv_get(key)
        if value is not None:
            port = int(value)
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {rank}: rank 0 did not publish its rendezvous port within {timeout}"
            )
        time.sleep(0.05)
    os.environ["MASTER_PORT"] = str(port)
    return TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
