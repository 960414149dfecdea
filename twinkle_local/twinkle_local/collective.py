"""Collective groups under torchrun: members share processes, processes share a subgroup.

Every group of k workers lives on processes 0..k-1, so the workers of several objects share
processes (the policy's worker 0 and the sampler's worker 0 are both in process 0). A member is
worker r of an object, hosted by process r. The processes holding members exchange over a
`torch.distributed.new_group` of those processes (every process of the job creates it, in the
same order, as the driver script runs everywhere); members in one process meet through core's
`MemberHub` (see `twinkle_core.collective`: broadcast with its source first works across
objects; collectives needing every member at once need one member per process).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from twinkle_core import ConfigurationError
from twinkle_core.plugin import CollectiveGroup, MemberHub, ProcessLink

log = logging.getLogger("twinkle")


def reduce_op(op: str) -> Any:
    """torch.distributed's reduce op for a twinkle op name (mean is a sum, divided afterwards:
    gloo has no AVG)."""
    import torch.distributed as dist

    return {
        "sum": dist.ReduceOp.SUM,
        "mean": dist.ReduceOp.SUM,  # divided afterwards: gloo has no AVG
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT,
    }[op]


def torch_views(items: list[Any], argument: str) -> list[Any]:
    """`items` as torch tensors for torch.distributed: tensors as they are, numpy arrays as
    tensors sharing their memory (a collective into them writes the arrays), so a collective
    group means the same with numpy in every mode. A read-only array (one received as an
    argument from the object store) cannot be written: a clear error says how to fix it."""
    import numpy as np

    out = []
    for t in items:
        if isinstance(t, np.ndarray):
            if not t.flags.writeable:
                raise ConfigurationError(
                    f"{argument}: a read-only numpy array (received from another worker) cannot "
                    "take a collective's result; pass a copy (arr.copy()) or declare the method "
                    "@remote_function(writable_args=True)"
                )
            import torch

            t = torch.from_numpy(t)
        out.append(t)
    return out


def as_inputs(gathered: list[Any], like: Any) -> list[Any]:
    """An all_gather's tensors as the caller's kind: numpy arrays for a numpy input."""
    import numpy as np

    if isinstance(like, np.ndarray):
        return [t.numpy() for t in gathered]
    return gathered


class SubgroupLink(ProcessLink):
    """The processes holding members, as a torch.distributed subgroup (positions = group ranks)."""

    def __init__(self, pg: Any, index: int, size: int) -> None:
        self.pg = pg
        self.index = index
        self.size = size

    @property
    def process_group(self) -> Any:
        return self.pg

    def broadcast(self, tensors: list[Any], src: int) -> None:
        import torch.distributed as dist

        for t in torch_views(tensors, "collective broadcast"):
            dist.broadcast(t, group_src=src, group=self.pg)

    def all_reduce(self, tensors: list[Any], op: str) -> None:
        import torch.distributed as dist

        for t in torch_views(tensors, "collective all_reduce"):
            dist.all_reduce(t, op=reduce_op(op), group=self.pg)
            if op == "mean":
                t.div_(self.size)

    def all_gather(self, tensor: Any) -> list[Any]:
        import torch
        import torch.distributed as dist

        (view,) = torch_views([tensor], "collective all_gather")
        out = [torch.empty_like(view) for _ in range(self.size)]
        dist.all_gather(out, view, group=self.pg)
        return as_inputs(out, tensor)

    def barrier(self) -> None:
        import torch

        self.all_reduce([torch.zeros(1)], "sum")

    def destroy(self) -> None:
        import torch.distributed as dist

        pg, self.pg = self.pg, None
        if pg is not None and dist.is_initialized():
            try:
                dist.destroy_process_group(pg)
            except Exception as exc:
                log.warning("twinkle: destroying a collective group's subgroup failed: %s", exc)


def create(
    spec: CollectiveGroup, workers: list[Any], rank: int, distributed: bool
) -> SubgroupLink | None:
    """Make this process's members of `spec` (workers of `workers`, LocalWorkerGroups, in rank
    order) find their `Collective`; returns the subgroup to destroy at shutdown (None in a
    one-process job). `rank` is this process's torchrun rank."""
    hosts = [m.rank for m in spec.members]  # worker r lives in process r
    processes = sorted(set(hosts))
    link: SubgroupLink | None = None
    if distributed and len(processes) > 1:
        import torch.distributed as dist

        pg = dist.new_group(
            ranks=processes,
            backend=spec.backend,
            timeout=datetime.timedelta(seconds=spec.timeout),
        )
        if rank in processes:
            link = SubgroupLink(pg, processes.index(rank), len(processes))
    positions = [processes.index(h) for h in hosts]
    mine = [i for i, h in enumerate(hosts) if h == rank]
    if not distributed:  # one process holds every member
        positions = [0] * len(hosts)
        mine = list(range(len(hosts)))
    if mine:
        hub = MemberHub(spec, mine, positions, link, mode="local")
        member = 0
        for w in workers:
            for _ in range(w.size):
                if member in mine:
                    assert w.state is not None, "a process holds the workers of its rank"
                    w.state.context.collectives[spec.name] = hub.member(member)
                member += 1
    return link
