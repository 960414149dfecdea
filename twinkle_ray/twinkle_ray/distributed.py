"""`twinkle_core.init_distributed()` inside Ray actors (this plugin's answer to the
`twinkle_init_distributed` hook): torch.distributed's default group for the actor's group.

Every actor already has RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so a plain
`torch.distributed.init_process_group()` works. This adds what env:// cannot: when the probed
port was taken between probing and use, rank 0 retries on a fresh port and tells the other
ranks through Ray's key-value store. Core has already chosen the torch backend from the
platform (nccl, hccl, gloo) and the timeout.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

#: How many ports rank 0 tries before giving up.
DEFAULT_PORT_ATTEMPTS = 3

_generation: dict[str, int] = {}


def _kv_key(base: str, generation: int) -> bytes:
    run = os.environ.get("TWINKLE_RUN_NAME", "")
    return f"twinkle:{run}:{base}:rdzv:{generation}".encode()


def _port_in_use(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "address already in use" in text or "errno 98" in text or "eaddrinuse" in text


def init_in_actor(
    context: Any,
    platform: Any,
    backend: str,
    timeout: datetime.timedelta,
    port_attempts: int = DEFAULT_PORT_ATTEMPTS,
) -> bool:
    """Initialize torch.distributed's default group for the group of the actor `context`
    describes. Returns True when this call created the group, False when it already existed.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    base = os.environ.get("TWINKLE_WORKER_GROUP") or context.group_name
    if platform.device_type != "cpu" and platform.is_available():
        platform.set_device(0)  # twinkle narrowed visibility to this worker's devices
    generation = _generation.get(base, 0)
    _generation[base] = generation + 1
    key = _kv_key(base, generation)
    store = _rendezvous(context.rank, context.world_size, key, timeout, port_attempts)
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=context.rank,
        world_size=context.world_size,
        timeout=timeout,
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
