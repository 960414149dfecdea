"""Counting the collectives a torchrun job's process runs (jobs import it from this folder).

Importing it wraps the collectives of `torch.distributed.ProcessGroup` so that each call, while
counting is on (`COUNTING[0]`, on by default), appends (name, bytes of its first argument's
tensors) to `SEEN`, and the slot gathers twinkle makes over Unix sockets when the job is on one
machine (`twinkle_local/node_sockets.py`) as ("socket_gather", bytes gathered).
`collectives(call)` runs `call` with counting on and returns what it ran.
"""

from __future__ import annotations

import torch.distributed as dist

from twinkle_local.node_sockets import SocketMesh

COLLECTIVES = (
    "allreduce",
    "allreduce_coalesced",
    "_allgather_base",
    "all_gather_single",
    "allgather",
    "allgather_coalesced",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "alltoall",
    "alltoall_base",
    "barrier",
)
SEEN: list[tuple[str, int]] = []
COUNTING = [True]


def _nbytes(value) -> int:
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return value.element_size() * value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _counting(name: str, method):
    def run(self, *args, **kwargs):
        if COUNTING[0]:
            SEEN.append((name, _nbytes(args[:1])))  # the input (or output) tensors
        return method(self, *args, **kwargs)

    return run


def _counting_socket_gather(method):
    def run(self, slot, extra=b""):
        if COUNTING[0]:
            SEEN.append(("socket_gather", len(slot) * self.world_size))
        return method(self, slot, extra)

    return run


SocketMesh.start_gather = _counting_socket_gather(SocketMesh.start_gather)

for _name in COLLECTIVES:
    _method = getattr(dist.ProcessGroup, _name, None)
    if _method is not None:
        setattr(dist.ProcessGroup, _name, _counting(_name, _method))


def collectives(call) -> tuple[object, list]:
    """(call(), the collectives it ran in this process), counting on while it runs."""
    start = len(SEEN)
    was, COUNTING[0] = COUNTING[0], True
    try:
        value = call()
    finally:
        COUNTING[0] = was
    return value, [list(c) for c in SEEN[start:]]
