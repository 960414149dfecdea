"""Device-direct transports on Ray: large tensor results sent worker to worker over a
torch.distributed group twinkle creates between the producing and the consuming group.

`@remote_function(transport=...)` (core's `twinkle_core.transport`) names how a method's large
results travel. Built in here (registered by `plugin.py`):

- `gloo`: CPU tensors over a gloo group. `auto` never picks it (on one node the object store
  hands CPU tensors over as zero-copy views, faster than gloo's TCP), so it is used when named.
- `nccl`: CUDA tensors over an NCCL group; `auto` picks it for CUDA results of at least
  `Transport.min_bytes` when CUDA and NCCL are available in the producing worker.

How a result travels (no driver in the data path, and no Ray Direct Transport: see
docs/data.md, "Transports", for why):

1. The producing worker decides with the real result in hand (`hold`): a tensor, or dicts,
   lists and tuples of tensors on one device type, large enough for `STORE_BYTES`, whose
   chosen transport is one of these. It keeps the tensors (`_OUTBOX`, no copy) and replies
   with a small `Held` envelope (structure, shapes, dtypes, its own actor handle). Anything
   else goes to the object store as before, and the envelope says why when a named transport
   could not be used; the driver logs that once per method and reason.
2. When the driver submits a consuming call whose arguments stand for held results
   (`before_submit`), it makes sure a transport group over the producer's and the consumer's
   actors exists (created on first use with `collective.create`, ranks producer first, left at
   shutdown), then queues one `send_held` on each producer actor a consumer worker needs, right
   before the consumer's own task. Ray keeps one caller's order per actor, so the send runs
   before any later call of the producer: the receiver gets the tensors as they were then.
3. The consumer's worker (`receive`) takes a status word and then every tensor from the
   producer's rank, in the order the driver queued the sends (both walk the arguments alike).

Whoever else needs a held result (the driver calling the LazyCollect, a worker outside a
transport group) gets it through the object store from the producer (`give_held`): a transport
never fails where the object store would have worked. A held result lives until the driver's
last reference to its call is gone (`track`), or until shutdown.
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
    AUTO,
    OBJECT_STORE,
    CollectiveGroup,
    CollectiveMember,
    Transport,
    explain_transport,
    get_plugin,
    note_fallback,
    registered_names,
)

log = logging.getLogger("twinkle")

#: Seconds a transport group's members wait for each other (joining, and each send/recv).
GROUP_TIMEOUT_S = 300.0


# ----------------------------------------------------------------------- the transports
def torch_backend(cls: Any) -> str:
    """The torch.distributed backend that carries transport class `cls` point to point, or ""
    when it names none (then the Ray backend cannot carry it: the object store is used).

    Any registered `Transport` with a `torch_backend` class attribute (e.g. an NPU plugin's
    `hccl`) is carried the same way as the built-in ones, without the plugin importing this one.
    """
    backend = getattr(cls, "torch_backend", "") if isinstance(cls, type) else ""
    return backend if isinstance(backend, str) else ""


def receive_device(device_type: str) -> Any:
    """Where a consumer allocates received tensors of `device_type`: its current device."""
    import torch

    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, getattr(torch, device_type).current_device())


class TorchTransport(Transport):
    """A transport carried by point-to-point sends over a torch.distributed group of the
    producer's and the consumer's actors (`torch_backend`), on Ray."""

    modes: ClassVar[tuple[str, ...]] = ("ray",)


class GlooTransport(TorchTransport):
    """CPU tensors over gloo. Only when named: `auto` keeps CPU tensors on the object store."""

    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    torch_backend: ClassVar[str] = "gloo"
    #: Never chosen by `auto` (a payload this large does not exist).
    min_bytes: ClassVar[int] = 1 << 62

    @classmethod
    def is_available(cls) -> bool:
        try:
            import torch.distributed as dist

            return bool(dist.is_available() and dist.is_gloo_available())
        except Exception:
            return False


def cuda_probe() -> bool:
    """Whether this process can send CUDA tensors over NCCL (the one hardware probe)."""
    try:
        import torch
        import torch.distributed as dist

        return bool(torch.cuda.is_available() and dist.is_nccl_available())
    except Exception:
        return False


class NcclTransport(TorchTransport):
    """CUDA tensors over NCCL; `auto` picks it for large CUDA results."""

    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    torch_backend: ClassVar[str] = "nccl"

    @classmethod
    def is_available(cls) -> bool:
        return sys.modules[__name__].cuda_probe()


BUILTIN = {"gloo": GlooTransport, "nccl": NcclTransport}


_loaded: dict[tuple[str, ...], dict[str, type[Transport]]] = {}


def registered() -> dict[str, type[Transport]]:
    """Every registered transport by name (loaded), in registration order; loaded once per
    set of names (a result's decision costs no plugin lookups)."""
    names = tuple(registered_names("transports"))
    hit = _loaded.get(names)
    if hit is None:
        hit = _loaded[names] = _load(names)
    return hit


def _load(names: tuple[str, ...]) -> dict[str, type[Transport]]:
    out: dict[str, type[Transport]] = {}
    for name in names:
        try:
            out[name] = get_plugin("transports", name)
        except Exception as exc:  # a broken plugin must not stop a result from travelling
            log.debug("twinkle: transport %r could not be loaded: %s", name, exc)
    return out


# ----------------------------------------------------------------------- producer side
class _Slot:
    """Where tensor `index` of a held result goes back in."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (_Slot, (self.index,))


class Held:
    """A large tensor result kept by the worker that made it, to be sent by `transport`.

    `skeleton` is the result with each tensor replaced by a `_Slot`; `specs` the tensors'
    (shape, dtype) in slot order, all on `device_type`; `holder` the producer's actor handle
    and `rank` its worker rank (its rank in every transport group it is in, whose producer
    side comes first).
    """

    __slots__ = (
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
            ),
        )

    def __repr__(self) -> str:
        return f"<Held by rank {self.rank} for {self.transport!r}, {len(self.specs)} tensors>"


#: key -> the tensors of a held result, in slot order (in the producing actor's process).
_OUTBOX: dict[str, list[Any]] = {}
_outbox_lock = threading.Lock()


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.split(".", 1)[0] == "torch" and hasattr(value, "element_size")


def _split(value: Any, tensors: list[Any]) -> Any:
    """`value` with every tensor replaced by a `_Slot` (appended to `tensors`); raises
    `_NotTensors` for arrays and containers a skeleton cannot stand for."""
    kind = type(value)
    if kind is dict:
        return {k: _split(v, tensors) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(_split(v, tensors) for v in value)
    if _is_tensor(value):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if kind in (type(None), bool, int, float, str) or (kind is bytes and len(value) < 1024):
        return value
    raise _NotTensors


class _NotTensors(Exception):
    pass


def _fill(skeleton: Any, tensors: list[Any]) -> Any:
    kind = type(skeleton)
    if kind is _Slot:
        return tensors[skeleton.index]
    if kind is dict:
        return {k: _fill(v, tensors) for k, v in skeleton.items()}
    if kind is list or kind is tuple:
        return kind(_fill(v, tensors) for v in skeleton)
    return skeleton


def decide(requested: str, value: Any, method: str) -> tuple[str, Any, list[Any], str | None]:
    """(transport, skeleton, tensors, why not) for a large result `value` of `method`.

    The transport is `object_store` or a registered one with a `torch_backend`; `why not`
    says why a named transport (or a large device result under `auto`) stays on the object store.
    """
    if requested == OBJECT_STORE:
        return OBJECT_STORE, None, [], None
    tensors: list[Any] = []
    try:
        skeleton = _split(value, tensors)
    except _NotTensors:
        skeleton = None
    if skeleton is None or not tensors:
        why = None
        if requested != AUTO:
            why = (
                f"transport {requested!r} moves torch tensors (alone or in dicts, lists and "
                "tuples of them); this result holds other values"
            )
        return OBJECT_STORE, None, [], why
    devices = {t.device.type for t in tensors}
    if len(devices) > 1:
        return OBJECT_STORE, None, [], f"the result holds tensors on {sorted(devices)}"
    device = devices.pop()
    nbytes = sum(int(t.numel()) * int(t.element_size()) for t in tensors)
    transports = registered()
    # Decided here, in the worker; the driver logs `why` once (`note_fallback`).
    chosen, why = explain_transport(requested, nbytes, device, "ray", transports)
    if chosen == OBJECT_STORE:
        return OBJECT_STORE, None, [], why
    if not torch_backend(transports[chosen]):
        return OBJECT_STORE, None, [], f"transport {chosen!r} is not one the Ray backend carries"
    return chosen, skeleton, tensors, None


def hold(transport: str, skeleton: Any, tensors: list[Any], meta: Any) -> Held:
    """Keep `tensors` here (no copy) and describe them for the driver and the consumers."""
    key = uuid.uuid4().hex
    with _outbox_lock:
        _OUTBOX[key] = [t.detach() for t in tensors]
    ctx = get_worker_context()
    specs = tuple((tuple(int(n) for n in t.shape), str(t.dtype).split(".")[-1]) for t in tensors)
    return Held(
        meta,
        transport,
        key,
        ray.get_runtime_context().current_actor,
        ctx.rank if ctx is not None else 0,
        os.environ.get("TWINKLE_WORKER_GROUP", ""),
        skeleton,
        specs,
        tensors[0].device.type,
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
    return _fill(skeleton, _taken(key))


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


def drop_held(keys: list[str]) -> int:
    """Run in the producer: forget held results nobody can ask for any more."""
    with _outbox_lock:
        return sum(_OUTBOX.pop(k, None) is not None for k in keys)


def held_count() -> int:
    """Run in a worker: how many results it holds (for tests)."""
    return len(_OUTBOX)


# ----------------------------------------------------------------------- consumer side
def group_name(backend: str, producer_tag: str, consumer_tag: str) -> str:
    """The transport group between two worker groups (tags: `TWINKLE_WORKER_GROUP`)."""
    return f"_tw_transport/{backend}/{producer_tag}/{consumer_tag}"


def receive(held: Held) -> Any:
    """Run in a consumer: the held result, over the transport group the driver set up for
    this pair of groups, else (no such group: the driver, another worker) through the object
    store from its holder."""
    with _outbox_lock:
        local = _OUTBOX.get(held.key)
    if local is not None:  # this worker made it
        return _fill(held.skeleton, local)
    backend = torch_backend(BUILTIN.get(held.transport) or registered().get(held.transport))
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
    return _fill(held.skeleton, tensors)


def fetch_ref(held: Held) -> Any:
    """A ref to the held result itself, put in the object store by its holder."""
    return held.holder._tw_apply.remote(give_held, held.key, held.skeleton)


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


def before_submit(consumer: Any, calls: list[Any], held: dict[Any, tuple[Held, Any]]) -> None:
    """Queue the sends of held results the consumer's `calls` stand for (see the module doc).

    `held` maps a producer's reply ref to its `Held` envelope and producer RayWorkerGroup.
    """
    from .transfer import _placeholders

    for call in calls:
        found: list[Any] = []
        _placeholders((call.args, call.kwargs), found)
        refs = dict.fromkeys(ref for p in found for ref in p.refs())
        for ref in refs:
            hit = held.get(ref)
            if hit is None:
                continue
            envelope, producer = hit
            if producer is consumer:
                continue  # a group handing to itself: the consumer fetches it from its holder
            cls = BUILTIN.get(envelope.transport) or registered().get(envelope.transport)
            backend = torch_backend(cls)
            if backend and consumer.group.device_type not in cls.device_types:
                note_fallback(
                    f"{consumer.class_name} (group {consumer.group.name!r})",
                    f"its {consumer.group.device_type} workers cannot receive over "
                    f"{envelope.transport!r}; results reach them from their holder",
                )
                continue
            name = GROUPS.ensure(backend, producer, consumer) if backend else None
            if name is None:
                continue
            dst = producer.size + call.rank
            producer.handles[envelope.rank]._tw_apply.remote(send_held, envelope.key, name, dst)


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
    if not ray.is_initialized():
        return
    for holder, ks in keys.items():
        try:
            holder._tw_apply.remote(drop_held, ks)
        except Exception:  # the actor or the cluster is gone
            pass
