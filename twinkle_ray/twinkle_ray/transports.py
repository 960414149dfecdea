"""Device-direct transports on Ray: large tensor results sent worker to worker, not through
the object store, either over a torch.distributed group twinkle creates between the producing
and the consuming group or by Ray Direct Transport (RDT).

`@remote_function(transport=...)` (core's `twinkle_core.transport`) names how a method's large
results travel. Carried here: the torch.distributed transports (one definition each, in
twinkle-local's public `twinkle_local.torchkit`, which registers them) and this plugin's own
Ray Direct Transport ones (registered by `plugin.py`):

- `gloo`: CPU tensors over a gloo group. `auto` never picks it on Ray (`auto_picks`: on one
  node the object store hands CPU tensors over as zero-copy views, faster than gloo's TCP),
  so it is used when named.
- `nccl`: CUDA tensors over an NCCL group; `auto` picks it for CUDA results of at least
  `Transport.min_bytes` when CUDA and NCCL are available in the producing worker.
- `hccl`: Ascend NPU tensors over an HCCL group, the same way (torch_npu in the worker).
- `cuda_ipc` (RDT): CUDA tensors mapped by a consumer on the producer's node and device;
  `auto` upgrades to it per consumer worker that shares the producer's device.
- `nixl` (RDT): CUDA or CPU tensors read by the consumer through NIXL; `auto` picks it for
  large CUDA results when NCCL is not available, CPU tensors only when named.

How a result travels (no driver in the data path; docs/data.md, "Transports" and "Ray Direct
Transport", says why it is done this way):

1. The producing worker decides with the real result in hand (`hold`): a tensor, or dicts,
   lists and tuples of tensors on one device type, large enough for `STORE_BYTES`, whose
   chosen transport is one of these. It keeps the tensors (`_OUTBOX`, no copy) and replies
   with a small `Held` envelope (structure, shapes, dtypes, its own actor handle). Anything
   else goes to the object store as before, and the envelope says why when a named transport
   could not be used; the driver logs that once per method and reason.
2. When the driver submits a consuming call whose arguments stand for held results
   (`before_submit`), it picks the transport per consumer worker (`pair_transport`).
   - Over torch.distributed: it makes sure a transport group over the producer's and the
     consumer's actors exists (created on first use with `collective.create`, ranks producer
     first, left at shutdown), then queues one `send_held` on each producer actor a consumer
     worker needs, right before the consumer's own task. Ray keeps one caller's order per
     actor, so the send runs before any later call of the producer: the receiver gets the
     tensors as they were then.
   - By RDT: it asks the producer once per held result and transport for an RDT object
     (`rdt_ref`: `_tw_rdt_give`, on the producer's `RDT_GROUP` thread) and submits the
     consumer's task with that ref as a top-level argument (`_tw_call_rdt`); Ray moves the
     tensors into the consumer before the task runs.
   - Otherwise (no transport serves the pair, or a result kept for colocated objects):
     the holder puts it in the object store, queued in its call order right before the
     consumer's task (`given_ref`), and the task takes that ref as an argument of its own,
     so Ray resolves it before the task starts. A consumer never waits inside its task for a
     holder that may be waiting for it (ranks of one group handing each other results).
   - A consumer in the holder's own process (an object colocated with the producer) needs
     nothing: it takes the result there, by reference.
3. The consumer's worker (`receive`) takes the result from its own process (`_OUTBOX`), or
   the tensors Ray delivered with the call (`delivered`), or else a status word and then every
   tensor from the producer's rank, in the order the driver queued the sends (both walk the
   arguments alike).

A process hosting several objects (colocated roles) also keeps its large results that would
go to the object store (`keep`, transport `in_process`): its other objects take them by
reference, and everyone else as above. The driver calling the LazyCollect gets a held result
through the object store from the producer (`give_held`): a transport never fails where the
object store would have worked. A held result lives until the driver's last reference to its
call is gone (`track`), or until shutdown.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
import weakref
from collections.abc import Iterable
from typing import Any, ClassVar

import ray

from twinkle_core import get_worker_context
from twinkle_core.plugin import (
    OBJECT_STORE,
    CollectiveGroup,
    CollectiveMember,
    Transport,
    explain_transport,
    note_fallback,
    registered_names,
    registered_transports,
)
from twinkle_local.torchkit import (
    GlooTransport,
    HcclTransport,
    NcclTransport,
    NotTensors,
    Slot,
    fill,
    receive_device,
    split,
    why_not_carried,
)

from .relay import post_on, remote_on

log = logging.getLogger("twinkle")

#: Seconds a transport group's members wait for each other (joining, and each send/recv).
GROUP_TIMEOUT_S = 300.0


# ----------------------------------------------------------------------- the transports
def torch_backend(cls: Any) -> str:
    """The torch.distributed backend that carries transport class `cls` point to point, or ""
    when it names none (then the Ray backend carries it only when it is an RDT transport,
    `rdt_name`; otherwise the object store is used).

    Any registered `Transport` with a `torch_backend` class attribute (e.g. an NPU plugin's
    `hccl`) is carried the same way as the built-in ones, without the plugin importing this one.
    """
    backend = getattr(cls, "torch_backend", "") if isinstance(cls, type) else ""
    return backend if isinstance(backend, str) else ""


class RdtTransport(Transport):
    """A transport carried by Ray Direct Transport: the producer hands its held tensors to Ray
    through `TwinkleActor._tw_rdt_give`, submitted with `.options(tensor_transport=...)`, and
    the consumer's task takes that ref as an argument of its own, so Ray moves the tensors
    (`rdt_refs`, `receive`). No torch.distributed group is made for it."""

    #: Ray's `tensor_transport` name.
    ray_tensor_transport: ClassVar[str] = ""
    #: Device types `auto` may pick it for (a subset of `device_types`).
    auto_device_types: ClassVar[tuple[str, ...]] = ()


def cuda_available() -> bool:
    """Whether this process has a CUDA device (the hardware probe of `cuda_ipc`)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


class CudaIpcTransport(RdtTransport):
    """CUDA tensors shared through CUDA IPC handles (Ray's `cuda_ipc`): the consumer maps the
    producer's memory, no copy. Serves a producer and consumer worker on one node whose
    devices include the producer's (`pair_transport`); `auto` picks it for those pairs."""

    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    auto_device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    ray_tensor_transport: ClassVar[str] = "cuda_ipc"
    same_device_only: ClassVar[bool] = True
    #: Only the driver picks it, per pair (`pair_transport`): never the producer alone.
    min_bytes: ClassVar[int] = 1 << 62

    @classmethod
    def is_available(cls) -> bool:
        return sys.modules[__name__].cuda_available()


def nixl_installed() -> bool:
    """Whether the `nixl` package (NVIDIA's transfer library Ray's `nixl` uses) is installed."""
    import importlib.util

    try:
        return importlib.util.find_spec("nixl") is not None
    except Exception:
        return False


class NixlTransport(RdtTransport):
    """CUDA or CPU tensors read by the consumer from the producer's memory through NIXL (UCX:
    RDMA between nodes, shared memory or TCP on one). `auto` picks it for large CUDA results
    when NCCL is not available; CPU tensors only when named (slower than the object store on
    one node: docs/data.md)."""

    device_types: ClassVar[tuple[str, ...]] = ("cuda", "cpu")
    auto_device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    ray_tensor_transport: ClassVar[str] = "nixl"

    @classmethod
    def is_available(cls) -> bool:
        return sys.modules[__name__].nixl_installed()


BUILTIN = {
    "gloo": GlooTransport,
    "nccl": NcclTransport,
    "hccl": HcclTransport,
    "cuda_ipc": CudaIpcTransport,
    "nixl": NixlTransport,
}


def rdt_name(cls: Any) -> str:
    """Ray's `tensor_transport` name for transport class `cls`, or "" when it is not one."""
    name = getattr(cls, "ray_tensor_transport", "") if isinstance(cls, type) else ""
    return name if isinstance(name, str) else ""


def carried(cls: Any) -> bool:
    """Whether the Ray backend carries transport class `cls` (over torch.distributed or RDT)."""
    return bool(torch_backend(cls) or rdt_name(cls))


def transport_class(name: str) -> Any:
    return BUILTIN.get(name) or registered().get(name)


_loaded: dict[tuple[str, ...], dict[str, type[Transport]]] = {}


def registered() -> dict[str, type[Transport]]:
    """Every registered transport by name (loaded), in registration order; loaded once per
    set of names (a result's decision costs no plugin lookups)."""
    names = tuple(registered_names("transports"))
    hit = _loaded.get(names)
    if hit is None:
        hit = _loaded[names] = registered_transports()
    return hit


# ----------------------------------------------------------------------- producer side
class Held:
    """A large tensor result kept by the worker that made it, to be sent by `transport`.

    `skeleton` is the result with each tensor replaced by a `Slot` (`twinkle_local.skeleton`);
    `specs` the tensors' (shape, dtype) in slot order, all on `device_type`; `holder` the
    producer's actor handle and `rank` its worker rank (its rank in every transport group it is
    in, whose producer side comes first).
    """

    __slots__ = (
        "auto",
        "device_type",
        "group_tag",
        "holder",
        "key",
        "meta",
        "rank",
        "skeleton",
        "specs",
        "transport",
    )

    def __init__(
        self,
        meta: Any,
        transport: str,
        key: str,
        holder: Any,
        rank: int,
        group_tag: str,
        skeleton: Any,
        specs: tuple[tuple[tuple[int, ...], str], ...],
        device_type: str = "cpu",
        auto: bool = False,
    ) -> None:
        self.meta = meta
        self.transport = transport
        self.key = key
        self.holder = holder
        self.rank = rank
        self.group_tag = group_tag
        self.skeleton = skeleton
        self.specs = specs
        self.device_type = device_type
        #: Chosen by `auto` (the driver may then pick another transport per consumer pair).
        self.auto = auto

    def __reduce__(self):
        return (
            Held,
            (
                self.meta,
                self.transport,
                self.key,
                self.holder,
                self.rank,
                self.group_tag,
                self.skeleton,
                self.specs,
                self.device_type,
                self.auto,
            ),
        )

    def __repr__(self) -> str:
        return f"<Held by rank {self.rank} for {self.transport!r}, {len(self.specs)} tensors>"


#: key -> the tensors of a held result, in slot order (in the producing actor's process); for
#: a kept one (`keep`), the result itself.
_OUTBOX: dict[str, list[Any]] = {}
_outbox_lock = threading.Lock()

#: The skeleton of a kept result: the whole value is its one "tensor".
_WHOLE = Slot(0)


def decide(requested: str, value: Any, method: str) -> tuple[str, Any, list[Any], str | None]:
    """(transport, skeleton, tensors, why not) for a large result `value` of `method`.

    The transport is `object_store` or a registered one the Ray backend carries (`carried`:
    it has a `torch_backend` or is an RDT transport); `why not` says why a named transport (or
    a large device result under `auto`) stays on the object store.
    """
    if requested == OBJECT_STORE:
        return OBJECT_STORE, None, [], None
    tensors: list[Any] = []
    try:
        skeleton = split(value, tensors)
    except NotTensors as exc:
        return OBJECT_STORE, None, [], why_not_carried(requested, exc)
    if not tensors:
        return OBJECT_STORE, None, [], why_not_carried(requested)
    devices = {tensor_device(t) for t in tensors}
    if len(devices) > 1:
        return OBJECT_STORE, None, [], f"the result holds tensors on {sorted(devices)}"
    device = devices.pop()
    nbytes = sum(int(t.numel()) * int(t.element_size()) for t in tensors)
    # Decided here, in the worker; the driver logs `why` once (`note_fallback`).
    chosen, why = explain(requested, nbytes, device)
    if chosen == OBJECT_STORE:
        return OBJECT_STORE, None, [], why
    if not carried(registered()[chosen]):
        return OBJECT_STORE, None, [], f"transport {chosen!r} is not one the Ray backend carries"
    return chosen, skeleton, tensors, None


def tensor_device(tensor: Any) -> str:
    """The device type of a result's tensor (the hardware probe tests fake)."""
    return str(tensor.device.type)


def auto_serves(cls: Any, device_type: str) -> bool:
    """Whether `auto` may pick transport class `cls` for `device_type` tensors."""
    only = getattr(cls, "auto_device_types", None)
    return only is None or device_type in only


def auto_picks(cls: Any, device_type: str) -> bool:
    """The Ray backend's `auto` rule: never CPU tensors over a torch.distributed transport
    (on one node the object store hands CPU tensors over as zero-copy views, faster than
    gloo's TCP: docs/data.md), and only device types a transport's `auto_device_types`
    name (nixl serves CPU tensors when named, but `auto` leaves them on the object store)."""
    if device_type == "cpu" and torch_backend(cls):
        return False
    return auto_serves(cls, device_type)


def explain(requested: str, nbytes: int, device_type: str, mode: str = "ray") -> tuple[str, Any]:
    """Core's `explain_transport` over the registered transports with the Ray backend's
    rules: what it carries (`carried`) and what `auto` may pick (`auto_picks`)."""
    return explain_transport(
        requested,
        nbytes,
        device_type,
        mode,
        registered(),
        carries=carried,
        auto_picks=auto_picks,
    )


def hold(transport: str, skeleton: Any, tensors: list[Any], meta: Any, auto: bool = False) -> Held:
    """Keep `tensors` here (no copy) and describe them for the driver and the consumers."""
    specs = tuple((tuple(int(n) for n in t.shape), str(t.dtype).split(".")[-1]) for t in tensors)
    kept = [t.detach() for t in tensors]
    return _held_here(kept, meta, transport, skeleton, specs, tensor_device(tensors[0]), auto)


#: The transport name of a result kept by its worker for colocated objects (`keep`).
IN_PROCESS = "in_process"


def keep(value: Any, meta: Any) -> Held:
    """Keep a large result of a process hosting several objects here, as it is (no copy):
    an object of this process receives it by reference (`receive` finds it in `_OUTBOX`),
    the driver and other processes get it from here through the object store (`give_held`,
    `given_ref`), as they do for results held for a device-direct transport."""
    return _held_here([value], meta, IN_PROCESS, _WHOLE, ())


def _held_here(
    items: list[Any],
    meta: Any,
    transport: str,
    skeleton: Any,
    specs: tuple,
    device_type: str = "cpu",
    auto: bool = False,
) -> Held:
    key = uuid.uuid4().hex
    with _outbox_lock:
        _OUTBOX[key] = items
    ctx = get_worker_context()
    return Held(
        meta,
        transport,
        key,
        ray.get_runtime_context().current_actor,
        ctx.rank if ctx is not None else 0,
        os.environ.get("TWINKLE_WORKER_GROUP", ""),
        skeleton,
        specs,
        device_type,
        auto,
    )


def _taken(key: str) -> list[Any]:
    with _outbox_lock:
        tensors = _OUTBOX.get(key)
    if tensors is None:
        raise RuntimeError(
            f"twinkle: held result {key[:8]} is no longer held by this worker (the driver "
            "dropped every reference to its call, or the worker was restarted)"
        )
    return tensors


def give_held(key: str, skeleton: Any) -> Any:
    """Run in the producer: a held result itself, to travel through the object store."""
    return fill(skeleton, _taken(key))


def send_held(key: str, group: str, dst: int) -> bool:
    """Run in the producer: send a held result's tensors to rank `dst` of transport group
    `group` (a status word first, so a result no longer held fails the receiver at once)."""
    import torch
    import torch.distributed as dist

    ctx = get_worker_context()
    member = None if ctx is None else ctx.collectives.get(group)
    if member is None:
        raise RuntimeError(f"twinkle: this worker is not in transport group {group!r}")
    pg = member.process_group
    with _outbox_lock:
        tensors = _OUTBOX.get(key)
    device = tensors[0].device if tensors else "cpu"
    status = torch.tensor([1 if tensors is not None else 0], device=device)
    dist.send(status, group_dst=dst, group=pg)
    _taken(key)  # raises (here too) when it is gone
    for t in tensors or ():
        dist.send(t if t.is_contiguous() else t.contiguous(), group_dst=dst, group=pg)
    return True


#: key -> how many of the `parts` drops of a held result arrived (see `_drop`).
_DROPS: dict[str, int] = {}


def drop_held(keys: list[str], parts: int = 1) -> int:
    """Run in the producer: forget held results nobody can ask for any more, once `parts`
    drops of each arrived (one per thread that may still use it: see `_drop`)."""
    dropped = 0
    with _outbox_lock:
        for key in keys:
            if parts > 1:
                arrived = _DROPS.get(key, 0) + 1
                if arrived < parts:
                    _DROPS[key] = arrived
                    continue
                _DROPS.pop(key, None)
            dropped += _OUTBOX.pop(key, None) is not None
    return dropped


def held_count() -> int:
    """Run in a worker: how many results it holds (for tests)."""
    return len(_OUTBOX)


# ----------------------------------------------------------------------- consumer side
def group_name(backend: str, producer_tag: str, consumer_tag: str) -> str:
    """The transport group between two worker groups (tags: `TWINKLE_WORKER_GROUP`)."""
    return f"_tw_transport/{backend}/{producer_tag}/{consumer_tag}"


def receive(held: Held) -> Any:
    """Run in a consumer: the held result, delivered by Ray Direct Transport with this call
    (`delivered`), else over the transport group the driver set up for this pair of groups,
    else (no such group: the driver, another worker) through the object store from its
    holder."""
    with _outbox_lock:
        local = _OUTBOX.get(held.key)
        if local is None:
            local = _INBOX.get(held.key)
    if local is not None:  # this worker made it, or Ray delivered it with this call
        return fill(held.skeleton, local)
    backend = torch_backend(transport_class(held.transport))
    ctx = get_worker_context()
    name = group_name(backend, held.group_tag, os.environ.get("TWINKLE_WORKER_GROUP", ""))
    member = None if ctx is None or not backend else ctx.collectives.get(name)
    if member is None:
        return ray.get(fetch_ref(held))
    import torch
    import torch.distributed as dist

    pg = member.process_group
    device = receive_device(held.device_type)
    status = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(status, group_src=held.rank, group=pg)
    if int(status.item()) != 1:
        raise RuntimeError(
            f"twinkle: rank {held.rank} of {held.group_tag!r} no longer holds the result this "
            "call was given (the driver dropped every reference to its call)"
        )
    tensors = []
    for shape, dtype in held.specs:
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        dist.recv(t, group_src=held.rank, group=pg)
        tensors.append(t)
    return fill(held.skeleton, tensors)


def fetch_ref(held: Held) -> Any:
    """A ref to the held result itself, put in the object store by its holder."""
    return remote_on(held.holder, "_tw_apply", give_held, held.key, held.skeleton)


# ----------------------------------------------------------------------- Ray Direct Transport
#: The actors' concurrency group (one thread) that hands held tensors to Ray's RDT store, so a
#: producer busy with a long call does not hold its consumers up (`TwinkleActor._tw_rdt_give`).
RDT_GROUP = "_tw_rdt"

#: key -> the tensors Ray delivered for a held result as an argument of the running call (in a
#: consumer, while `TwinkleActor._tw_call_rdt` runs).
_INBOX: dict[str, list[Any]] = {}


def give_tensors(key: str) -> list[Any]:
    """Run in the producer: a held result's tensors (a kept result: `[value]`). From
    `_tw_rdt_give`, Ray keeps them in its RDT store (no copy) and moves them to each consumer
    task that takes the returned ref; from `given_ref`, they go through the object store."""
    return list(_taken(key))


class delivered:
    """`with delivered(keys, tensor_lists):` makes the tensors Ray delivered for held results
    `keys` what `receive` returns for them while the consumer's call runs."""

    def __init__(self, keys: tuple[str, ...], tensor_lists: tuple[Any, ...]) -> None:
        self.items = dict(zip(keys, tensor_lists, strict=True))

    def __enter__(self) -> None:
        with _outbox_lock:
            _INBOX.update(self.items)

    def __exit__(self, *exc: Any) -> None:
        with _outbox_lock:
            for key in self.items:
                _INBOX.pop(key, None)


#: (held key, Ray's transport name) -> the ref `_tw_rdt_give` returned, on the driver: one RDT
#: object per held result and transport, however many consumer tasks take it.
_RDT_REFS: dict[tuple[str, str], Any] = {}
_rdt_lock = threading.Lock()


def submit_rdt(handle: Any, key: str, tensor_transport: str) -> Any:
    """Have the producer actor `handle` hand held result `key` to Ray Direct Transport."""
    method = handle._tw_rdt_give.options(
        tensor_transport=tensor_transport, concurrency_group=RDT_GROUP
    )
    return method.remote(key)


def rdt_ref(handle: Any, key: str, tensor_transport: str) -> Any:
    """The RDT ref of held result `key` (made on first use, `submit_rdt`)."""
    with _rdt_lock:
        ref = _RDT_REFS.get((key, tensor_transport))
        if ref is None:
            submit = sys.modules[__name__].submit_rdt  # looked up here: tests record it
            ref = _RDT_REFS[(key, tensor_transport)] = submit(handle, key, tensor_transport)
        return ref


def rdt_refs_count() -> int:
    """How many RDT objects the driver keeps for held results (for tests)."""
    return len(_RDT_REFS)


def colocated(producer: Any, rank: int, consumer: Any, consumer_rank: int) -> bool:
    """Whether consumer worker `consumer_rank` runs on producer worker `rank`'s node and sees
    its devices (what CUDA IPC needs), by twinkle's own placements."""
    try:
        p, c = producer.placements[rank], consumer.placements[consumer_rank]
    except (IndexError, AttributeError):
        return False
    return bool(p.node and p.node == c.node and p.devices and set(p.devices) <= set(c.devices))


def pair_transport(envelope: Held, producer: Any, consumer: Any, rank: int) -> tuple[str, str]:
    """(the transport carrying held result `envelope` to consumer worker `rank`, why not):
    the name and "", or "" and the reason its holder serves it through the object store.

    `auto` (the producer chose a device-direct path) takes a same-device-only transport
    (`cuda_ipc`) for a consumer that shares the producer's device; a named one must serve the
    consumer's device type, and `cuda_ipc` a consumer sharing the device.
    """
    ctype = consumer.group.device_type
    name = envelope.transport
    rdt_ready = getattr(producer, "direct_transport", True) and getattr(
        consumer, "direct_transport", True
    )
    if envelope.auto and rdt_ready and colocated(producer, envelope.rank, consumer, rank):
        for other, cls in registered().items():
            if getattr(cls, "same_device_only", False) and envelope.device_type in getattr(
                cls, "auto_device_types", ()
            ):
                return other, ""
    cls = transport_class(name)
    if rdt_name(cls):
        if not rdt_ready:
            return "", (
                f"{name!r} needs actors declared for Ray Direct Transport, and this run's are "
                "not (initialize(mode='ray', direct_transport=True) declares them); results "
                "reach its workers from their holder"
            )
        if ctype != envelope.device_type:
            return "", (
                f"its {ctype} workers cannot receive {envelope.device_type} tensors over "
                f"{name!r}; results reach them from their holder"
            )
        if getattr(cls, "same_device_only", False) and not colocated(
            producer, envelope.rank, consumer, rank
        ):
            return "", (
                f"{name!r} needs the consumer on the producer's node and device; results "
                "reach its workers from their holder"
            )
        return name, ""
    if torch_backend(cls) and ctype not in cls.device_types:
        return "", (
            f"its {ctype} workers cannot receive over {name!r}; results reach them from "
            "their holder"
        )
    return (name, "") if torch_backend(cls) else ("", f"{name!r} is not carried on Ray")


# ----------------------------------------------------------------------- driver side
class _Groups:
    """The transport groups of this driver: name -> member actor handles."""

    def __init__(self) -> None:
        self.members: dict[str, list[Any]] = {}
        self.failed: set[str] = set()
        self.lock = threading.Lock()

    def ensure(self, backend: str, producer: Any, consumer: Any) -> str | None:
        """The name of the transport group over `producer`'s then `consumer`'s actors (both
        RayWorkerGroups), created on first use; None when it cannot be made (logged once)."""
        from . import collective as ray_collective

        name = group_name(backend, producer.tag, consumer.tag)
        with self.lock:
            if name in self.members:
                return name
            if name in self.failed:
                return None
            members = tuple(
                CollectiveMember(w.group.name, w.class_name, r)
                for w in (producer, consumer)
                for r in range(w.size)
            )
            spec = CollectiveGroup(
                name,
                backend,
                members,
                "ray",
                GROUP_TIMEOUT_S,
                tuple(
                    (w.group.name, w.class_name, first, w.size)
                    for w, first in ((producer, 0), (consumer, producer.size))
                ),
            )
            try:
                self.members[name] = ray_collective.create(spec, [producer, consumer])
            except Exception as exc:
                self.failed.add(name)
                log.warning(
                    "twinkle: transport group %s could not be created (%s: %s); results "
                    "between these groups use the object store",
                    name,
                    type(exc).__name__,
                    exc,
                )
                return None
            return name

    def leave_all(self) -> list[str]:
        """Every member leaves its transport groups (queued behind running calls); the names."""
        from . import collective as ray_collective

        with self.lock:
            members, self.members = self.members, {}
            self.failed = set()
        for name, handles in members.items():
            for handle in handles:
                try:
                    handle._tw_apply.remote(ray_collective.leave, name)
                except Exception:
                    pass
        return list(members)

    def names(self) -> list[str]:
        with self.lock:
            return list(self.members)


GROUPS = _Groups()


def before_submit(
    consumer: Any,
    calls: list[Any],
    wanted: list[list[Any]],
    held: dict[Any, tuple[Held, Any]],
) -> dict[int, list[tuple[str, Any]]]:
    """Queue the sends of held results the consumer's `calls` stand for (see the module doc);
    {call index: [(held key, RDT ref)]} for results Ray Direct Transport carries, which the
    call's task must take as arguments of its own (`TwinkleActor._tw_call_rdt`).

    `wanted[i]` lists the producers' reply refs that call i's arguments stand for (distinct,
    `transfer.placeholder_refs`); `held` maps a producer's reply ref to its `Held` envelope
    and producer RayWorkerGroup.
    """
    extra: dict[int, list[tuple[str, Any]]] = {}
    for index, (call, refs) in enumerate(zip(calls, wanted, strict=True)):
        for ref in refs:
            hit = held.get(ref)
            if hit is None:
                continue
            envelope, producer = hit
            holder = producer.handles[envelope.rank]
            if same_actor(holder, consumer.handles[call.rank]):
                continue  # in the holder's own process: `receive` takes it by reference
            chosen, why = "", ""
            if producer is not consumer and envelope.transport != IN_PROCESS:
                chosen, why = pair_transport(envelope, producer, consumer, call.rank)
            name = None
            cls = transport_class(chosen) if chosen else None
            if cls is not None and rdt_name(cls):
                ref = rdt_ref(holder, envelope.key, rdt_name(cls))
                extra.setdefault(index, []).append((envelope.key, ref))
                continue
            if cls is not None:
                name = GROUPS.ensure(torch_backend(cls), producer, consumer)
            if name is not None:
                remote_on(
                    holder, "_tw_apply", send_held, envelope.key, name, producer.size + call.rank
                )
                continue
            if why:
                note_fallback(f"{consumer.class_name} (group {consumer.group.name!r})", why)
            # Through the object store, put by the holder in its call order right before this
            # task, and resolved by Ray before the task starts: a consumer never waits inside
            # its task for a holder that may be waiting for it (two ranks handing each other
            # their results with dispatch='all').
            extra.setdefault(index, []).append((envelope.key, given_ref(holder, envelope.key)))
    return extra


def same_actor(a: Any, b: Any) -> bool:
    """Whether two actor handles name one actor (colocated objects share their hosts)."""
    return a is b or a._actor_id == b._actor_id


#: held key -> (its holder's actor id, the ref of the result put in the object store by its
#: holder: `given_ref`).
_GIVEN: dict[str, tuple[Any, Any]] = {}


def given_ref(holder: Any, key: str) -> Any:
    """A ref to held result `key` as a list of its tensors (or, kept, `[value]`), put in the
    object store by its holder on its own thread, in its call order; one per result, however
    many consumers take it."""
    with _rdt_lock:
        given = _GIVEN.get(key)
        if given is None:
            given = _GIVEN[key] = (
                holder._actor_id,
                remote_on(holder, "_tw_apply", give_tensors, key),
            )
        return given[1]


def forget_given(handles: Iterable[Any]) -> int:
    """Forget the refs `given_ref` keeps for results held by the actors `handles`: sent through
    a relay, they belong to it, and are lost with it when it dies (`rerouting.py`); the
    holders still hold the results and give them again when asked. How many were forgotten."""
    ids = {handle._actor_id for handle in handles}
    with _rdt_lock:
        stale = [key for key, (holder, _) in _GIVEN.items() if holder in ids]
        for key in stale:
            del _GIVEN[key]
    return len(stale)


def held_replies(refs: list[Any], replies: Iterable[Any]) -> dict[Any, Held]:
    """{reply ref: Held} for the replies that are `Held` envelopes."""
    return {ref: r for ref, r in zip(refs, replies, strict=True) if type(r) is Held}


def track(pending: Any, replies: list[Any]) -> None:
    """When `pending` (a driver-side call) is garbage, its held results are dropped."""
    keys: dict[Any, list[str]] = {}
    for reply in replies:
        if type(reply) is Held:
            keys.setdefault(reply.holder, []).append(reply.key)
    if keys:
        weakref.finalize(pending, _drop, keys)


def _drop(keys: dict[Any, list[str]]) -> None:
    """Have the holders forget `keys`. The drop is queued behind the sends on the actor's own
    thread; a result also given to Ray Direct Transport is dropped only when a second drop,
    queued behind its gives on the `RDT_GROUP` thread, arrived too (the two threads run in no
    order with each other)."""
    gone = {k for ks in keys.values() for k in ks}
    with _rdt_lock:  # Ray frees an RDT object when its last ref is gone
        for key in gone:
            _GIVEN.pop(key, None)
        given = {p[0] for p in _RDT_REFS if p[0] in gone}
        for pair in [p for p in _RDT_REFS if p[0] in gone]:
            del _RDT_REFS[pair]
    if not ray.is_initialized():
        return
    for holder, ks in keys.items():
        plain, both = [k for k in ks if k not in given], [k for k in ks if k in given]
        try:
            if plain:
                post_on(holder, "_tw_apply", drop_held, plain)
            if both:
                post_on(holder, "_tw_apply", drop_held, both, 2)
                rdt_thread = holder._tw_apply.options(concurrency_group=RDT_GROUP)
                rdt_thread.remote(drop_held, both, 2)
        except Exception:  # the actor or the cluster is gone
            pass
