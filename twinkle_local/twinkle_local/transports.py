"""Transports under torchrun: large tensor results broadcast as raw tensors over
torch.distributed, instead of pickled through the exchange's all-gather (issue 11, item 3).

Under torchrun every process is a driver, so a call's collected value must reach every process
(`exchange.py`). A method whose `transport=` resolves to one of these (core's
`twinkle_core.transport` rule) has each *used* result (the ones its collector looks at:
`collect='first'` uses rank 0's only) travel like this:

1. The producing process decides with the result in hand (`decide`): a tensor, or dicts
   (`OrderedDict` too: `state_dict()`), lists and tuples of tensors on one device type, with
   plain numbers, strings and None beside them, of at least `HOLD_BYTES`, whose chosen transport
   serves that device in mode `local`. Its slot says so (`F_HELD`) and carries a small envelope
   (structure, shapes, dtypes) instead of the pickled result.
2. Every process reads every slot (the exchange's one collective), so all take the same second
   step: for each held result, in rank order, the envelope (from the slot, or broadcast when
   it does not fit), then each tensor broadcast from its holder as raw bytes, over twinkle's
   own groups (the gloo control group for `gloo`; a `new_group` of the transport's backend,
   made on first use and destroyed at shutdown, for `nccl`/`hccl`), never the user's default
   group.
3. A failure, or processes at different calls, is seen in the slots first: then nothing is
   broadcast (the exchange reports it as before), so no process waits in a broadcast for a
   producer that has nothing to send.

Received tensors are fresh, writable buffers of every receiver's own (on its current device);
the holder gets a copy of its own result with `isolate=True` (the default, as in-process) and
the objects themselves with `isolate=False`, exactly as the exchange's pickled path does.

Names: this plugin registers `gloo` (CPU), `nccl` (CUDA) and `hccl` (NPU), the one definition
of each (also carried by the Ray backend, which reaches the classes and hardware probes through
the public `twinkle_local.torchkit`). This backend carries every registered transport that
names a `torch_backend` (`carries`).
"""

from __future__ import annotations

import logging
import pickle
import sys
from typing import Any, ClassVar

from twinkle_core.plugin import (
    OBJECT_STORE,
    Transport,
    explain_transport,
    registered_names,
    registered_transports,
)

from .skeleton import NotTensors, split, why_not_carried

log = logging.getLogger("twinkle")

#: This backend's mode, as fallback messages name it.
MODE = "local"
#: Results with fewer tensor bytes than this stay in the exchange even under a named transport
#: (the slot or one small all-gather is cheaper than a broadcast per tensor).
HOLD_BYTES = 64 * 1024
#: `auto` moves CPU tensors from this size (core's `AUTO_MIN_BYTES`, about 1 MB).
AUTO_MIN_BYTES = 1 << 20


# ----------------------------------------------------------------------- the transports
class GlooTransport(Transport):
    """CPU tensors over gloo (twinkle's control group). `auto` picks it from 1 MB: under
    torchrun the alternative is pickling the result and all-gathering the bytes to every
    process (measured in docs/data.md, "Transports under torchrun")."""

    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    torch_backend: ClassVar[str] = "gloo"
    min_bytes: ClassVar[int] = AUTO_MIN_BYTES

    @classmethod
    def is_available(cls) -> bool:
        return gloo_probe()


def gloo_probe() -> bool:
    """Whether this process can send CPU tensors over gloo."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_gloo_available())
    except Exception:
        return False


def cuda_probe() -> bool:
    """Whether this process can broadcast CUDA tensors over NCCL (the one hardware probe)."""
    try:
        import torch
        import torch.distributed as dist

        return bool(torch.cuda.is_available() and dist.is_nccl_available())
    except Exception:
        return False


def npu_probe() -> bool:
    """Whether this process can broadcast NPU tensors over HCCL (torch_npu installed)."""
    try:
        import torch

        npu = getattr(torch, "npu", None)
        return bool(npu is not None and npu.is_available())
    except Exception:
        return False


class NcclTransport(Transport):
    """CUDA tensors over an NCCL group twinkle makes; `auto` picks it for large CUDA results."""

    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    torch_backend: ClassVar[str] = "nccl"

    @classmethod
    def is_available(cls) -> bool:
        return sys.modules[__name__].cuda_probe()


class HcclTransport(Transport):
    """Ascend NPU tensors over an HCCL group twinkle makes (the NPU platform's backend)."""

    device_types: ClassVar[tuple[str, ...]] = ("npu",)
    torch_backend: ClassVar[str] = "hccl"

    @classmethod
    def is_available(cls) -> bool:
        return sys.modules[__name__].npu_probe()


BUILTIN: dict[str, type[Transport]] = {
    "gloo": GlooTransport,
    "nccl": NcclTransport,
    "hccl": HcclTransport,
}


def carries(cls: Any) -> bool:
    """Whether this backend can carry transport `cls`: any that names a torch.distributed
    backend (it is broadcast over a group of that backend)."""
    backend = getattr(cls, "torch_backend", "") if isinstance(cls, type) else ""
    return isinstance(backend, str) and bool(backend)


def serves_here(cls: Any, device_type: str) -> bool:
    return isinstance(cls, type) and cls.serves(device_type) and carries(cls)


_loaded: dict[tuple[str, ...], dict[str, type[Transport]]] = {}


def registered() -> dict[str, type[Transport]]:
    """Every registered transport by name; loaded once per set of registered names."""
    names = tuple(registered_names("transports"))
    hit = _loaded.get(names)
    if hit is None:
        hit = _loaded[names] = registered_transports()
    return hit


def explain(requested: str, nbytes: int, device_type: str) -> tuple[str, str | None]:
    """Core's rule with this backend's `carries`: (the transport, why not, or None)."""
    return explain_transport(requested, nbytes, device_type, MODE, registered(), carries=carries)


# ----------------------------------------------------------------------- structures
class Held:
    """This process's result, to be broadcast: its tensors and its envelope (the bytes its
    slot carries: skeleton, specs, device type, torch backend)."""

    __slots__ = ("backend", "envelope", "tensors")

    def __init__(self, backend: str, envelope: bytes, tensors: list[Any]) -> None:
        self.backend = backend
        self.envelope = envelope
        self.tensors = tensors


class Envelope:
    """What receivers need to allocate a held result's tensors and rebuild it."""

    __slots__ = ("backend", "device_type", "skeleton", "specs")

    def __init__(
        self,
        skeleton: Any,
        specs: list[tuple[tuple[int, ...], str]],
        device_type: str,
        backend: str,
    ) -> None:
        self.skeleton = skeleton
        self.specs = specs
        self.device_type = device_type
        self.backend = backend

    def __reduce__(self):
        return (Envelope, (self.skeleton, self.specs, self.device_type, self.backend))


def decide(requested: str, value: Any, method: str) -> tuple[Held | None, str | None]:
    """(the result as held, or None: it takes the exchange; why a named transport could not
    carry it, or None). Never raises."""
    if requested == OBJECT_STORE:
        return None, None
    tensors: list[Any] = []
    try:
        skeleton = split(value, tensors)
    except NotTensors as exc:
        return None, why_not_carried(requested, exc)
    except Exception:  # an odd object: the exchange's pickling handles (or reports) it
        return None, None
    if not tensors:
        return None, why_not_carried(requested)
    devices = {t.device.type for t in tensors}
    if len(devices) > 1:
        return None, f"the result holds tensors on {sorted(devices)}"
    device = devices.pop()
    nbytes = sum(int(t.numel()) * int(t.element_size()) for t in tensors)
    if nbytes < HOLD_BYTES:
        return None, None  # small: one slot or one small all-gather is cheaper
    chosen, why = explain(requested, nbytes, device)
    if chosen == OBJECT_STORE:
        return None, why
    backend = getattr(registered().get(chosen), "torch_backend", "")
    if not isinstance(backend, str) or not backend:
        return None, f"transport {chosen!r} names no torch.distributed backend"
    specs = [(tuple(int(n) for n in t.shape), str(t.dtype).split(".")[-1]) for t in tensors]
    try:
        envelope = pickle.dumps(Envelope(skeleton, specs, device, backend), protocol=5)
    except Exception:
        return None, None
    return Held(backend, envelope, tensors), None


# ----------------------------------------------------------------------- moving them
def _as_bytes(t: Any) -> Any:
    """A flat uint8 view of contiguous tensor `t` (gloo and nccl broadcast any dtype so)."""
    import torch

    return t.reshape(-1).view(torch.uint8)


def broadcast_held(pg: Any, src: int, held: Held | None, envelope: Envelope, isolate: bool) -> list:
    """Broadcast a held result's tensors from group rank `src` over `pg`: the holder sends
    `held.tensors` and gets copies of them when `isolate` (made while the broadcasts run, so
    the copy costs no time of its own), the others receive into new tensors on their current
    device. The same call, in the same order, on every process."""
    import torch
    import torch.distributed as dist

    works = []
    if held is not None:
        for t in held.tensors:
            send = t.detach() if t.is_contiguous() else t.detach().contiguous()
            if send.numel():
                works.append(
                    dist.broadcast(_as_bytes(send), group_src=src, group=pg, async_op=True)
                )
        out = [t.detach().clone() for t in held.tensors] if isolate else list(held.tensors)
    else:
        device = receive_device(envelope.device_type)
        out = []
        for shape, dtype in envelope.specs:
            t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            if t.numel():
                works.append(dist.broadcast(_as_bytes(t), group_src=src, group=pg, async_op=True))
            out.append(t)
    for work in works:
        work.wait()
    return out


def broadcast_bytes(pg: Any, src: int, payload: bytes | None, length: int) -> bytes:
    """`length` bytes from group rank `src` (which passes `payload`) on every process."""
    import torch
    import torch.distributed as dist

    if payload is not None:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        buf = torch.empty(length, dtype=torch.uint8)
    dist.broadcast(buf, group_src=src, group=pg)
    return payload if payload is not None else buf.numpy().tobytes()


def receive_device(device_type: str) -> Any:
    """Where a receiver allocates tensors of `device_type`: its current device."""
    import torch

    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, getattr(torch, device_type).current_device())
