"""Collective groups across remote objects: one communication group over the workers of several
groups (e.g. the policy's and the sampler's), for broadcasting weights without the driver.

The driver calls `collective_group(name, [policy, sampler])` once; every worker of the listed
objects becomes a member, ranked object by object (the policy's workers first, then the
sampler's). Inside a member, `collective(name)` (or `get_worker_context().collective(name)`)
returns its `Collective`: `rank`, `world_size`, `process_group` (a torch.distributed group when
every member has a process of its own, else None) and `broadcast`/`all_reduce`/`all_gather`/
`barrier`, which mean the same in every mode.

How members meet depends on the mode (docs/data.md, "Collective groups"):
- Ray: every member is an actor of its own; the group is a separate torch.distributed world
  (its own TCPStore on the first member's node), so it never touches the groups' own worlds.
- torchrun (`local`): groups share processes (a group of k workers lives on ranks 0..k-1), so
  members sharing a process meet through a process-local `MemberHub`; processes exchange over
  a `torch.distributed.new_group` of the processes holding members.
- in-process: every member lives in the driver's process; they meet through a `MemberHub`.

Members sharing a process run one after another (their calls are serialized), so a collective
that needs every member at once (`all_reduce`, `all_gather`, `barrier`) is refused there with
an error saying so, and a broadcast needs its source to take part first (the source's method
is called before the receivers'). Both hold for the weight-sync pattern: the policy's call
broadcasts, then the sampler's call receives.
"""

from __future__ import annotations

import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .backend import WorkerGroup
    from .runtime import Runtime

#: Default seconds members wait for each other (joining the group, and each collective).
DEFAULT_TIMEOUT_S = 300.0
#: Reduction names `Collective.all_reduce` accepts.
REDUCE_OPS = ("sum", "mean", "max", "min", "product")


@dataclass(frozen=True)
class CollectiveMember:
    """One member: worker `rank` of the object of class `class_name` on device group `group`."""

    group: str
    class_name: str
    rank: int

    def describe(self) -> str:
        return f"{self.class_name} rank {self.rank} (group {self.group!r})"


@dataclass(frozen=True)
class CollectiveGroup:
    """The driver's handle of a collective group: its name, backend and members in rank order.

    Member `i` of `members` has rank `i` in the group. `ranks_of(obj)` gives the ranks of one
    listed object's workers (for `broadcast(src=...)`).
    """

    name: str
    backend: str
    members: tuple[CollectiveMember, ...]
    mode: str
    timeout: float = DEFAULT_TIMEOUT_S
    #: (class name, device group, first rank, number of workers) of each listed object.
    objects: tuple[tuple[str, str, int, int], ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        objects = ", ".join(
            f"{c} on {g!r}: ranks {f}-{f + n - 1}" if n > 1 else f"{c} on {g!r}: rank {f}"
            for c, g, f, n in self.objects
        )
        return (
            f"CollectiveGroup({self.name!r}, world_size={self.world_size}, "
            f"backend={self.backend!r}, mode={self.mode!r}, {objects})"
        )

    def ranks_of(self, obj: Any) -> list[int]:
        """The group ranks of `obj`'s workers (`obj` is one of the listed remote objects)."""
        workers = _workers_of(obj, "ranks_of(obj)")
        for class_name, group, first, size in self.objects:
            if class_name == workers.class_name and group == workers.group.name:
                return list(range(first, first + size))
        raise ConfigurationError(
            f"collective group {self.name!r}.ranks_of(obj): {workers.class_name} on group "
            f"{workers.group.name!r} is not one of its objects "
            f"({', '.join(f'{c} on {g!r}' for c, g, _, _ in self.objects)})"
        )


# ---------------------------------------------------------------------------------- workers
class Collective(ABC):
    """What a member sees of its collective group, inside a worker.

    Tensors are torch tensors (numpy arrays where members share a process); collectives work
    in place on the tensors given and return them, like torch.distributed. `src` is a group
    rank (0 .. world_size-1), not a global rank.
    """

    def __init__(self, spec: CollectiveGroup, rank: int) -> None:
        self.spec = spec
        self.rank = rank

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def members(self) -> tuple[CollectiveMember, ...]:
        return self.spec.members

    @property
    def process_group(self) -> Any:
        """The torch.distributed group (use `group_src=`/`group_dst=` ranks with it), or None
        where members share a process (in-process, or several objects under torchrun)."""
        return None

    @abstractmethod
    def broadcast(self, tensors: Any, src: int = 0) -> list[Any]:
        """Copy member `src`'s tensors into every member's tensors (same shapes and dtypes)."""

    @abstractmethod
    def all_reduce(self, tensors: Any, op: str = "sum") -> list[Any]:
        """Reduce each tensor over the members (`op`: sum, mean, max, min, product)."""

    @abstractmethod
    def all_gather(self, tensor: Any) -> list[Any]:
        """Every member's `tensor` (same shape everywhere), in rank order."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every member reached this point."""

    def __repr__(self) -> str:
        return (
            f"Collective({self.name!r}, rank={self.rank}, world_size={self.world_size}, "
            f"backend={self.backend!r})"
        )


def as_tensor_list(tensors: Any, argument: str) -> list[Any]:
    """One tensor or a list/tuple of them, as a list; a clear error for anything else."""
    items = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    for t in items:
        if getattr(t, "shape", None) is None:
            raise ConfigurationError(
                f"{argument} must be a tensor or a list of tensors, got {type(t).__name__}"
            )
    return items


def check_op(op: str, argument: str) -> str:
    if op not in REDUCE_OPS:
        raise ConfigurationError(f"{argument}: op must be one of {REDUCE_OPS}, got {op!r}")
    return op


def check_src(src: Any, world_size: int, argument: str) -> int:
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world_size:
        raise ConfigurationError(
            f"{argument}: src must be a group rank in 0..{world_size - 1}, got {src!r}"
        )
    return src


def _clone(t: Any) -> Any:
    clone = getattr(t, "clone", None)  # torch
    if clone is not None:
        return t.detach().clone()
    return t.copy()  # numpy and alike


def _copy_into(dst: Any, src: Any) -> None:
    if hasattr(dst, "copy_"):  # torch
        dst.copy_(src)
    else:
        dst[...] = src


class ProcessLink(ABC):
    """How the processes holding members exchange (torchrun: a torch.distributed subgroup).

    `index` is this process's position among `size` processes; members are mapped to process
    positions by the hub.
    """

    index: int
    size: int

    @abstractmethod
    def broadcast(self, tensors: list[Any], src: int) -> None:
        """In place, from process position `src`."""

    @abstractmethod
    def all_reduce(self, tensors: list[Any], op: str) -> None:
        """In place over processes."""

    @abstractmethod
    def all_gather(self, tensor: Any) -> list[Any]:
        """One tensor per process position."""

    @abstractmethod
    def barrier(self) -> None: ...

    @property
    def process_group(self) -> Any:
        return None

    def destroy(self) -> None:
        """Release the link (at shutdown)."""


@dataclass
class _Slot:
    """The k-th collective of a group as seen in one process."""

    kind: str
    src: int | None
    first: CollectiveMember
    result: list[Any]
    remaining: int


class MemberHub:
    """The members of one collective group that live in this process, and how they meet.

    Each member counts its own collectives; the k-th of every member is the same collective
    (as with torch.distributed). The first member of this process to reach collective k does
    the exchange with the other processes (through `link`) and leaves the result in a slot for
    the process's other members, which copy it when they reach k.
    """

    def __init__(
        self,
        spec: CollectiveGroup,
        local_ranks: Sequence[int],
        process_of: Sequence[int],
        link: ProcessLink | None,
        mode: str,
    ) -> None:
        self.spec = spec
        self.local_ranks = tuple(local_ranks)
        #: member rank -> process position (0 .. link.size-1); all 0 without a link.
        self.process_of = tuple(process_of)
        self.link = link
        self.mode = mode
        self.lock = threading.Lock()
        self.slots: dict[int, _Slot] = {}
        self.counts = dict.fromkeys(self.local_ranks, 0)
        self.alone = all(process_of.count(p) == 1 for p in set(process_of))

    def member(self, rank: int) -> HubCollective:
        return HubCollective(self.spec, rank, self)

    def _sharing_error(self, rank: int, kind: str) -> ConfigurationError:
        others = [self.spec.members[r].describe() for r in self.local_ranks if r != rank]
        return ConfigurationError(
            f"collective group {self.spec.name!r}: {kind} needs every member at once, but "
            f"{self.spec.members[rank].describe()} shares its process with {', '.join(others)} "
            f"in mode {self.mode!r}, and members sharing a process run one after another. Use "
            "broadcast (call the source's method first), or mode 'ray', where every member is "
            "a process of its own"
        )

    def _check_spans(self, rank: int, k: int, kind: str) -> None:
        """The first member of a process to reach collective k exchanges with the other
        processes' first members: they must be in the same call, i.e. its object must have a
        worker in every process of the group (else they would wait for each other forever)."""
        if self.link is None or self.link.size <= 1:
            return
        for class_name, group, first, size in self.spec.objects:
            if first <= rank < first + size:
                spans = {self.process_of[r] for r in range(first, first + size)}
                missing = sorted(set(range(self.link.size)) - spans)
                if not missing:
                    return
                whole = [
                    f"{c} (group {g!r})"
                    for c, g, f, n in self.spec.objects
                    if {self.process_of[r] for r in range(f, f + n)} >= set(range(self.link.size))
                ]
                self.counts[rank] = k  # not taken
                raise ConfigurationError(
                    f"collective group {self.spec.name!r}: {class_name} (group {group!r}) "
                    f"reached {kind} #{k + 1} first in its process, but it has no worker in "
                    f"{len(missing)} of the group's {self.link.size} processes, which would not "
                    f"take part in this call. In mode {self.mode!r}, call first the method of an "
                    "object with a worker in every process of the group"
                    + (f" ({', '.join(whole)})" if whole else "")
                )
        return

    def _take(self, rank: int, kind: str, src: int | None) -> tuple[int, _Slot | None]:
        """This member's sequence number, and the slot of it if another member made it."""
        k = self.counts[rank]
        self.counts[rank] = k + 1
        slot = self.slots.get(k)
        if slot is not None and (slot.kind, slot.src) != (kind, src):
            raise ConfigurationError(
                f"collective group {self.spec.name!r}: collective #{k + 1} is "
                f"{slot.kind}(src={slot.src}) for {slot.first.describe()} but "
                f"{kind}(src={src}) for {self.spec.members[rank].describe()}; every member "
                "must make the same collectives in the same order"
            )
        return k, slot

    def _leave(self, k: int, slot: _Slot) -> None:
        slot.remaining -= 1
        if slot.remaining <= 0:
            self.slots.pop(k, None)

    def broadcast(self, rank: int, tensors: list[Any], src: int) -> list[Any]:
        with self.lock:
            k, slot = self._take(rank, "broadcast", src)
            if slot is not None:
                for dst, value in zip(tensors, slot.result, strict=True):
                    _copy_into(dst, value)
                self._leave(k, slot)
                return tensors
            here = self.process_of[rank]
            source_here = self.process_of[src] == here
            if source_here and rank != src:
                self.counts[rank] = k  # not taken: let the source come first
                raise ConfigurationError(
                    f"collective group {self.spec.name!r}: "
                    f"{self.spec.members[rank].describe()} reached broadcast #{k + 1} before its "
                    f"source {self.spec.members[src].describe()}, which shares its process in "
                    f"mode {self.mode!r} (members sharing a process run one after another): "
                    "call the source's method before the receivers'"
                )
            if self.link is not None and self.link.size > 1:
                self._check_spans(rank, k, "broadcast")
                self.link.broadcast(tensors, self.process_of[src])
            result = [_clone(t) for t in tensors]
            remaining = len(self.local_ranks) - 1
            if remaining > 0:
                self.slots[k] = _Slot("broadcast", src, self.spec.members[rank], result, remaining)
            return tensors

    def _whole(self, rank: int, kind: str) -> int:
        if len(self.local_ranks) > 1:
            raise self._sharing_error(rank, kind)
        k, _ = self._take(rank, kind, None)
        self._check_spans(rank, k, kind)
        return k

    def all_reduce(self, rank: int, tensors: list[Any], op: str) -> list[Any]:
        with self.lock:
            self._whole(rank, "all_reduce")
        if self.link is not None and self.link.size > 1:
            self.link.all_reduce(tensors, op)
        return tensors

    def all_gather(self, rank: int, tensor: Any) -> list[Any]:
        with self.lock:
            self._whole(rank, "all_gather")
        if self.link is None or self.link.size == 1:
            return [_clone(tensor)]
        by_process = self.link.all_gather(tensor)
        return [by_process[self.process_of[r]] for r in range(self.spec.world_size)]

    def barrier(self, rank: int) -> None:
        with self.lock:
            self._whole(rank, "barrier")
        if self.link is not None and self.link.size > 1:
            self.link.barrier()


class HubCollective(Collective):
    """A member whose peers may share its process (in-process and torchrun modes)."""

    def __init__(self, spec: CollectiveGroup, rank: int, hub: MemberHub) -> None:
        super().__init__(spec, rank)
        self.hub = hub

    @property
    def process_group(self) -> Any:
        link = self.hub.link
        return link.process_group if link is not None and self.hub.alone else None

    def broadcast(self, tensors: Any, src: int = 0) -> list[Any]:
        items = as_tensor_list(tensors, f"collective {self.name!r}.broadcast(tensors)")
        check_src(src, self.world_size, f"collective {self.name!r}.broadcast")
        return self.hub.broadcast(self.rank, items, src)

    def all_reduce(self, tensors: Any, op: str = "sum") -> list[Any]:
        items = as_tensor_list(tensors, f"collective {self.name!r}.all_reduce(tensors)")
        check_op(op, f"collective {self.name!r}.all_reduce")
        return self.hub.all_reduce(self.rank, items, op)

    def all_gather(self, tensor: Any) -> list[Any]:
        (item,) = as_tensor_list(tensor, f"collective {self.name!r}.all_gather(tensor)")
        return self.hub.all_gather(self.rank, item)

    def barrier(self) -> None:
        self.hub.barrier(self.rank)


# ---------------------------------------------------------------------------------- driver
#: The collective groups of each run (names are unique within a run).
_registry: weakref.WeakKeyDictionary[Runtime, dict[str, CollectiveGroup]] = (
    weakref.WeakKeyDictionary()
)
_registry_lock = threading.Lock()


def _workers_of(obj: Any, argument: str) -> WorkerGroup:
    from .remote import BINDING_ATTR

    binding = getattr(obj, "__dict__", {}).get(BINDING_ATTR)
    if binding is None:
        raise ConfigurationError(
            f"{argument} must be remote objects (created with remote_group=...), got "
            f"{type(obj).__name__} {obj!r}"
        )
    return binding.workers  # type: ignore[no-any-return]


def _default_backend(workers: list[WorkerGroup], name: str) -> str:
    from .platform import get_platform

    types = sorted({w.group.device_type for w in workers})
    if len(types) > 1:
        raise ConfigurationError(
            f"collective_group({name!r}): its objects run on different device types {types}; "
            "pass backend=... (e.g. 'gloo', which every device type can use for CPU tensors)"
        )
    return get_platform(types[0]).dist_backend


def collective_group(
    name: str,
    objects: Sequence[Any],
    backend: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> CollectiveGroup:
    """Put every worker of `objects` (remote objects) into one collective group called `name`.

    Members are ranked object by object, each object's workers in rank order. `backend` is the
    torch.distributed backend (default: the platform's, e.g. gloo on CPU, nccl on CUDA).
    `timeout` bounds the members' meeting and each collective. Call it once per name, on the
    driver (under torchrun: in every process, in the same order, like every driver call); the
    group lives until `shutdown()`. Inside a member, `twinkle_core.collective(name)` returns its
    `Collective`.
    """
    from .context import get_worker_context
    from .runtime import current_runtime

    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(
            f"collective_group(name=...) must be a non-empty string, got {name!r}"
        )
    if get_worker_context() is not None:
        raise ConfigurationError(
            f"collective_group({name!r}) is called on the driver, not inside a worker: create "
            "the group after creating the objects, before calling their methods"
        )
    if isinstance(objects, (str, bytes)) or not isinstance(objects, Sequence) or not objects:
        raise ConfigurationError(
            f"collective_group({name!r}, objects=...) must be a non-empty list of remote "
            f"objects, got {objects!r}"
        )
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ConfigurationError(
            f"collective_group({name!r}, backend=...) must be a torch.distributed backend name "
            f"such as 'gloo' or 'nccl', or None for the platform's; got {backend!r}"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError(
            f"collective_group({name!r}, timeout=...) must be a positive number of seconds, "
            f"got {timeout!r}"
        )
    runtime = current_runtime()
    workers = [_workers_of(o, f"collective_group({name!r}, objects=...)") for o in objects]
    if len({id(w) for w in workers}) != len(workers):
        raise ConfigurationError(
            f"collective_group({name!r}, objects=...) lists the same object twice; list each "
            "remote object once"
        )
    members: list[CollectiveMember] = []
    placed: list[tuple[str, str, int, int]] = []
    for w in workers:
        placed.append((w.class_name, w.group.name, len(members), w.size))
        members.extend(CollectiveMember(w.group.name, w.class_name, r) for r in range(w.size))
    spec = CollectiveGroup(
        name=name,
        backend=backend or _default_backend(workers, name),
        members=tuple(members),
        mode=runtime.config.mode,
        timeout=float(timeout),
        objects=tuple(placed),
    )
    with _registry_lock:
        known = _registry.setdefault(runtime, {})
        if name in known:
            raise ConfigurationError(
                f"collective_group({name!r}): a collective group named {name!r} already exists "
                "in this run (created once, destroyed at shutdown); choose another name"
            )
        known[name] = spec  # reserved now: a concurrent second call fails at once
    try:
        runtime.backend.create_collective_group(spec, workers)
    except BaseException:
        with _registry_lock:
            known.pop(name, None)
        raise
    return spec


def collective(name: str) -> Collective:
    """This worker's member of collective group `name` (inside a remote method)."""
    from .context import get_worker_context

    ctx = get_worker_context()
    if ctx is None:
        raise ConfigurationError(
            f"twinkle_core.collective({name!r}) is for code running inside a worker (a remote "
            "method); on the driver, collective_group() returns the group's handle"
        )
    return ctx.collective(name)
