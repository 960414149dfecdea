"""Collective groups on Ray: a separate torch.distributed world over the actors of several groups.

Each actor may already have a default process group of its own group (MASTER_ADDR/PORT are set
for it); a collective group across groups cannot be a subgroup of that world, so it is a world
of its own: a `TCPStore` on the first member's node (a free port found there, like a group's
rendezvous), a `PrefixStore` per group name, and a process group made from that store with
torch's own helper (the way verl and OpenRLHF build their weight-sync groups between trainer and
inference actors), registered so `torch.distributed.broadcast(t, src=i, group=pg)` reads `src`
as a rank of this group. Every member joins through the actor method `_tw_apply`; the driver
waits at most the group's timeout and names the members that did not join.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from typing import Any

import ray

from twinkle_core import (
    CallTimeoutError,
    CollectiveBrokenError,
    ConfigurationError,
    get_worker_context,
)
from twinkle_core.plugin import (
    Collective,
    CollectiveGroup,
    as_tensor_list,
    check_op,
    check_src,
)
from twinkle_local.torchkit import as_inputs, reduce_op, torch_views

from .relay import post_on, remote_on

log = logging.getLogger("twinkle")


# ---------------------------------------------------------------------------- torch side
def new_world(store: Any, rank: int, size: int, backend: str, timeout: float, name: str) -> Any:
    """A process group over `store` that is independent of any default group (torch's helper
    when this torch has it, else the backend's class directly)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    delta = datetime.timedelta(seconds=timeout)
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is not None:
        try:
            made = helper(size, rank, [], backend, store, group_name=name, timeout=delta)
        except TypeError:  # another torch's signature
            made = None
        if made is not None:
            pg = made[0] if isinstance(made, tuple) else made
            c10d._world.pg_group_ranks[pg] = {i: i for i in range(size)}
            return pg
    if backend != "gloo":
        raise ConfigurationError(
            f"collective group {name!r}: this torch has no process-group helper for backend "
            f"{backend!r}; use backend='gloo'"
        )
    return dist.ProcessGroupGloo(store, rank, size, delta)


class TorchCollective(Collective):
    """A member with a process of its own: every collective is torch.distributed's."""

    def __init__(self, spec: CollectiveGroup, rank: int, pg: Any, store: Any) -> None:
        super().__init__(spec, rank)
        self._pg = pg
        self._store = store  # kept alive: rank 0 serves the rendezvous store
        #: Why the group cannot be used any more (a member stopped answering), or None.
        self._broken: str | None = None

    @property
    def process_group(self) -> Any:
        return self._pg

    def _run(self, op: str, fn: Any) -> Any:
        """Run collective `op`; a member that died or left turns torch's raw transport error
        into a `CollectiveBrokenError` naming the group and its members, and marks the group broken
        (every later collective fails at once saying so, instead of the same raw error)."""
        if self._broken is not None:
            raise CollectiveBrokenError(self._broken)
        try:
            return fn()
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            members = "; ".join(
                f"{cls} on {group!r}: ranks {start}-{start + size - 1}"
                for cls, group, start, size in self.spec.objects
            )
            self._broken = (
                f"collective group {self.name!r}: {op} on member rank {self.rank} failed because "
                f"a member stopped answering (died, or left the group): {first}. Members: "
                f"{members}. The collective group is broken until it is formed again: twinkle "
                "forms it again once the dead member's group restarted (DeviceGroup(max_restarts="
                "N)); without restarts, create the dead member's object again, then a new "
                "collective group (another name) over the objects"
            )
            raise CollectiveBrokenError(self._broken) from None

    def broadcast(self, tensors: Any, src: int = 0) -> list[Any]:
        import torch.distributed as dist

        items = as_tensor_list(tensors, f"collective {self.name!r}.broadcast(tensors)")
        check_src(src, self.world_size, f"collective {self.name!r}.broadcast")
        views = torch_views(items, f"collective {self.name!r}.broadcast")

        def run() -> None:
            for t in views:
                dist.broadcast(t, group_src=src, group=self._pg)

        self._run("broadcast", run)
        return items

    def all_reduce(self, tensors: Any, op: str = "sum") -> list[Any]:
        import torch.distributed as dist

        items = as_tensor_list(tensors, f"collective {self.name!r}.all_reduce(tensors)")
        check_op(op, f"collective {self.name!r}.all_reduce")
        views = torch_views(items, f"collective {self.name!r}.all_reduce")

        def run() -> None:
            for t in views:
                dist.all_reduce(t, op=reduce_op(op), group=self._pg)
                if op == "mean":
                    t.div_(self.world_size)

        self._run("all_reduce", run)
        return items

    def all_gather(self, tensor: Any) -> list[Any]:
        import torch
        import torch.distributed as dist

        (item,) = as_tensor_list(tensor, f"collective {self.name!r}.all_gather(tensor)")
        (view,) = torch_views([item], f"collective {self.name!r}.all_gather")
        out = [torch.empty_like(view) for _ in range(self.world_size)]
        self._run("all_gather", lambda: dist.all_gather(out, view, group=self._pg))
        return as_inputs(out, item)

    def barrier(self) -> None:
        import torch

        self.all_reduce(torch.zeros(1))

    def destroy(self) -> None:
        from torch.distributed import distributed_c10d as c10d

        pg, self._pg = self._pg, None
        if pg is not None:
            try:
                c10d.destroy_process_group(pg)
            except Exception as exc:
                log.debug("twinkle: destroying collective group %r: %s", self.name, exc)


def join(spec: CollectiveGroup, rank: int, host: str, port: int, arrived: str) -> bool:
    """Run in a member actor: join the collective group as `rank` (rank 0 serves the store).

    `arrived` is a key prefix in Ray's internal KV where the member notes that it started
    joining, so the driver can tell a member that never came from one waiting for the others.
    """
    import torch.distributed as dist
    from ray.experimental import internal_kv

    ctx = get_worker_context()
    if ctx is None:
        raise RuntimeError("twinkle: joining a collective group outside a worker actor")
    try:
        internal_kv._internal_kv_put(f"{arrived}{rank}".encode(), b"1")
    except Exception as exc:  # only the error message is poorer without it
        log.debug("twinkle: could not note the arrival: %s", exc)
    delta = datetime.timedelta(seconds=spec.timeout)
    store = dist.TCPStore(
        host, port, spec.world_size, rank == 0, timeout=delta, wait_for_workers=False
    )
    prefixed = dist.PrefixStore(f"twinkle/collective/{spec.name}", store)
    pg = new_world(prefixed, rank, spec.world_size, spec.backend, spec.timeout, spec.name)
    ctx.collectives[spec.name] = TorchCollective(spec, rank, pg, store)
    return True


def leave(name: str) -> bool:
    """Run in a member actor: destroy its part of collective group `name`."""
    ctx = get_worker_context()
    member = None if ctx is None else ctx.collectives.pop(name, None)
    if isinstance(member, TorchCollective):
        member.destroy()
    return member is not None


# ---------------------------------------------------------------------------- driver side
def create(spec: CollectiveGroup, workers: list[Any], up: Any = None) -> list[Any]:
    """Make every actor of `workers` (RayWorkerGroups, in rank order) join `spec`; returns the
    member handles. Bounded by `spec.timeout`; a member that fails or does not join in time is
    named in the error, and the members that did join leave again. `up(workers)` says whether
    a member's actors can join (default: not torn down; a restart also admits rebuilt ones)."""
    handles: list[Any] = []
    seen: dict[str, str] = {}
    for w in workers:
        if not (up(w) if up is not None else w.torn_down is None):
            raise ConfigurationError(
                f"collective_group({spec.name!r}): group {w.group.name!r} ({w.class_name}) is "
                f"torn down ({w.torn_down})"
            )
        for h in w.handles:
            actor_id = h._actor_id.hex()
            other = seen.get(actor_id)
            seen[actor_id] = w.class_name
            if other is not None:
                raise ConfigurationError(
                    f"collective_group({spec.name!r}): {w.class_name} and {other} are colocated "
                    f"on group {w.group.name!r} and share its worker processes, but a "
                    "collective group needs one process per member. Give one of them "
                    "processes of its own with @remote_class(colocate=False), or put it on "
                    "another group"
                )
        handles.extend(w.handles)
    assert len(handles) == spec.world_size
    try:
        where = ray.get(remote_on(handles[0], "_tw_free_port"), timeout=spec.timeout)
    except ray.exceptions.GetTimeoutError:
        raise CallTimeoutError(
            f"collective_group({spec.name!r}): {spec.members[0].describe()} did not join within "
            f"timeout={spec.timeout:g}s (it serves the rendezvous and did not answer; a member "
            "busy with a long call joins only after it)"
        ) from None
    arrived = f"twinkle:{workers[0].run_name}:collective:{spec.name}:{uuid.uuid4().hex[:8]}:"
    refs = [
        remote_on(h, "_tw_apply", join, spec, rank, where[0], int(where[1]), arrived)
        for rank, h in enumerate(handles)
    ]
    deadline = time.monotonic() + spec.timeout
    waiting = list(refs)
    failed: list[str] = []
    first_error: BaseException | None = None
    while waiting and not failed:  # the first failure ends the wait: the others cannot form
        done, waiting = ray.wait(
            waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
        )
        if not done:
            break
        for ref in done:
            try:
                ray.get(ref)
            except Exception as exc:
                member = spec.members[refs.index(ref)].describe()
                failed.append(f"{member}: {type(exc).__name__}: {exc}")
                first_error = first_error or exc
    try:
        if not waiting and not failed:
            return handles
        for h in handles:  # best effort: the ones that joined leave (a dead actor is skipped)
            try:
                post_on(h, "_tw_apply", leave, spec.name)
            except Exception:
                pass
        if failed:
            raise ConfigurationError(
                f"collective_group({spec.name!r}) failed: {'; '.join(failed)}"
            ) from first_error
        ranks = [refs.index(r) for r in waiting]
        came = _arrived(arrived, ranks)
        late = [spec.members[r].describe() for r in ranks if r not in came] or [
            spec.members[r].describe() for r in ranks
        ]
        raise CallTimeoutError(
            f"collective_group({spec.name!r}): {', '.join(late)} did not join within "
            f"timeout={spec.timeout:g}s (rendezvous at {where[0]}:{where[1]}; a member busy "
            "with a long call joins only after it)"
        )
    finally:
        _forget(arrived)


def _arrived(prefix: str, ranks: list[int]) -> set[int]:
    """The members among `ranks` that noted their arrival (empty when the KV is unreachable)."""
    from ray.experimental import internal_kv

    try:
        return {r for r in ranks if internal_kv._internal_kv_exists(f"{prefix}{r}".encode())}
    except Exception:
        return set()


def _forget(prefix: str) -> None:
    from ray.experimental import internal_kv

    try:
        internal_kv._internal_kv_del(prefix.encode(), del_by_prefix=True)
    except Exception:
        pass
