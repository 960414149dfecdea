"""Moving data between the driver and workers through Ray's object store.

- torch tensors travel as numpy byte views: Ray ships numpy buffers out-of-band (pickle
  protocol 5, zero-copy into the object store), where a pickled tensor copies its whole storage
  through pickle, and a view would drag its base storage along. The receiver gets a writable
  tensor of the original dtype, shape, device and `requires_grad`.
- A result travels as itself when it is small (Ray inlines it in the task's reply, so the
  driver has it anyway). A large one (an array or tensor of `STORE_BYTES` or more, or a
  dict/list/tuple holding one) is put in the object store by the worker, and the reply carries
  a `Stored` envelope: its `ResultMeta` and the ref. The driver learns what it needs to hand the
  result to another group (kind, length, dtype) without fetching it.
- Remote placeholders stand for results that stay in the object store: a consumer worker
  fetches exactly the producer results it needs (`materialize`), the driver never does.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from twinkle_core.plugin import is_array_like

_registered = threading.local()
_lock = threading.Lock()
_registered_in_process = False


# ----------------------------------------------------------------------- torch tensors
def tensor_to_numpy(tensor: Any) -> tuple:
    """A tensor as (uint8 numpy view of exactly its bytes, dtype name, shape, device, grad)."""
    import torch

    t = tensor.detach()
    device = str(t.device)
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    shape = tuple(t.shape)
    flat = t.reshape(-1)
    data = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
    return (data, str(t.dtype).split(".")[-1], shape, device, bool(tensor.requires_grad))


def tensor_from_numpy(packed: tuple) -> Any:
    """Inverse of `tensor_to_numpy`: one memcpy out of the (read-only) object-store buffer."""
    import torch

    data, dtype_name, shape, device, requires_grad = packed
    dtype = getattr(torch, dtype_name)
    buf = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))
    out = buf.view(dtype).reshape(shape) if buf.numel() else torch.empty(shape, dtype=dtype)
    if device != "cpu":
        try:
            out = out.to(device)
        except Exception:  # the receiver has no such device: keep it on the CPU
            pass
    if requires_grad and out.is_floating_point():
        out.requires_grad_(True)
    return out


def register_tensor_serializer() -> None:
    """Make this process send torch tensors as numpy buffers (once per process)."""
    global _registered_in_process
    if _registered_in_process or "torch" not in sys.modules or not ray.is_initialized():
        return
    with _lock:
        if _registered_in_process:
            return
        import torch

        ray.util.register_serializer(
            torch.Tensor, serializer=tensor_to_numpy, deserializer=tensor_from_numpy
        )
        _registered_in_process = True


def reset_tensor_serializer() -> None:
    """Forget the registration (a new Ray connection starts with fresh serializers)."""
    global _registered_in_process
    _registered_in_process = False


# ----------------------------------------------------------------------- result metadata
@dataclass(frozen=True)
class ResultMeta:
    """What the driver needs to hand a result on without fetching it."""

    kind: str  # "ndarray", "tensor", "number", "container" (dict/list/tuple/array) or "opaque"
    length: int | None = None
    dtype: str = ""


#: Results this large (bytes of array data) are put in the object store by the worker and
#: travel as a `Stored` envelope; smaller ones are returned as they are. Ray inlines return
#: values below 100 KiB in the task's reply, so below this size there is nothing to keep away
#: from the driver.
STORE_BYTES = 100 * 1024

#: Types returned as they are without looking further.
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})


class Stored:
    """A large result left in the object store by the worker that made it, with its metadata.

    The worker owns the stored object, so it lives as long as that worker (and anyone holding
    the envelope or the ref) does.
    """

    __slots__ = ("meta", "ref")

    def __init__(self, meta: ResultMeta, ref: Any) -> None:
        self.meta = meta
        self.ref = ref

    def __reduce__(self):
        return (Stored, (self.meta, self.ref))

    def __repr__(self) -> str:
        return f"<Stored {self.meta.kind} len={self.meta.length}>"


def _array_bytes(value: Any) -> int:
    """Bytes of array data in `value` (an ndarray or a tensor), 0 for anything else."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if type(value).__module__.split(".", 1)[0] == "torch" and hasattr(value, "element_size"):
        try:
            return int(value.numel()) * int(value.element_size())
        except Exception:
            return 0
    return 0


#: How many items of a dict/list/tuple result are looked at for large arrays.
_SCAN_ITEMS = 64


def is_large(value: Any) -> bool:
    """Whether a result should stay in the object store: an array of `STORE_BYTES` or more,
    or a dict/list/tuple whose first items hold that many bytes of arrays."""
    kind = type(value)
    if kind in _PLAIN:
        return False
    if kind is dict or kind is list or kind is tuple:
        items = value.values() if kind is dict else value
        total = 0
        for i, item in enumerate(items):
            if i >= _SCAN_ITEMS:
                break
            total += _array_bytes(item)
            if total >= STORE_BYTES:
                return True
        return False
    return _array_bytes(value) >= STORE_BYTES


def pack_result(value: Any) -> Any:
    """What a worker returns for `value`: the value itself, or a `Stored` envelope."""
    if is_large(value):
        return Stored(result_meta(value), ray.put(value))
    return value


def unpack(value: Any) -> Any:
    """The result itself, fetching it when `value` is a `Stored` envelope."""
    if type(value) is Stored:
        return ray.get(value.ref)
    return value


def meta_of(value: Any) -> ResultMeta:
    """The metadata of a fetched reply: the envelope's, or computed from a small value."""
    if type(value) is Stored:
        return value.meta
    return result_meta(value)


def result_meta(value: Any) -> ResultMeta:
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        return ResultMeta("ndarray", int(value.shape[0]), str(value.dtype))
    mod = type(value).__module__.split(".", 1)[0]
    if mod == "torch" and hasattr(value, "dim") and value.dim() >= 1:
        return ResultMeta("tensor", int(value.shape[0]), str(value.dtype))
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return ResultMeta("number")
    if isinstance(value, (dict, list, tuple)) or is_array_like(value):
        return ResultMeta("container")
    return ResultMeta("opaque")


# ----------------------------------------------------------------------- placeholders
class RemoteValue:
    """One worker result left in the object store."""

    __slots__ = ("ref",)

    def __init__(self, ref: ray.ObjectRef) -> None:
        self.ref = ref

    def fetch(self) -> Any:
        return unpack(ray.get(self.ref))

    def __reduce__(self):
        return (RemoteValue, (self.ref,))

    def __repr__(self) -> str:
        return f"<RemoteValue {self.ref.hex()[:10]}>"


class RemoteCollected:
    """A collector applied, on the consumer, to results left in the object store."""

    __slots__ = ("collector", "mesh", "refs")

    def __init__(self, refs: list, collector: Any, mesh: Any) -> None:
        self.refs = refs
        self.collector = collector
        self.mesh = mesh

    def fetch(self) -> Any:
        return self.collector.collect(_fetch_all(list(self.refs)), self.mesh)

    def __reduce__(self):
        return (RemoteCollected, (self.refs, self.collector, self.mesh))


class RemoteArray:
    """The dim-0 concatenation of array results in the object store, sliceable without fetching.

    It looks array-like to dispatchers (`shape`, `len`, slicing), so `slice_dp` hands each
    consumer a `RemoteArray` over only the producer results its share overlaps.
    """

    __slots__ = ("kind", "parts")

    def __init__(self, parts: list[tuple[ray.ObjectRef, int, int]], kind: str) -> None:
        self.parts = parts  # (ref, start, stop) within each result
        self.kind = kind

    def __len__(self) -> int:
        return sum(stop - start for _, start, stop in self.parts)

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, item: Any) -> RemoteArray:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("a RemoteArray only supports contiguous slices along dim 0")
        start, stop, _ = item.indices(len(self))
        parts, offset = [], 0
        for ref, a, b in self.parts:
            n = b - a
            lo, hi = max(start - offset, 0), min(stop - offset, n)
            if lo < hi:
                parts.append((ref, a + lo, a + hi))
            offset += n
        return RemoteArray(parts, self.kind)

    def fetch(self) -> Any:
        values = _fetch_all([ref for ref, _, _ in self.parts])
        pieces = [v[a:b] for v, (_, a, b) in zip(values, self.parts, strict=True)]
        if self.kind == "tensor":
            import torch

            return pieces[0].clone() if len(pieces) == 1 else torch.cat(pieces, dim=0)
        if len(pieces) == 1:
            return np.array(pieces[0], copy=True)
        return np.concatenate(pieces, axis=0)

    def __reduce__(self):
        return (RemoteArray, (self.parts, self.kind))

    def __repr__(self) -> str:
        return f"<RemoteArray {self.kind} len={len(self)} parts={len(self.parts)}>"


def _fetch_all(refs: list) -> list[Any]:
    """The results behind `refs` (task replies), envelopes opened with one more `ray.get`."""
    values = ray.get(refs)
    stored = [i for i, v in enumerate(values) if type(v) is Stored]
    if stored:
        for i, inner in zip(stored, ray.get([values[i].ref for i in stored]), strict=True):
            values[i] = inner
    return values


PLACEHOLDERS = (RemoteValue, RemoteCollected, RemoteArray)


def materialize(value: Any) -> Any:
    """Replace every placeholder in nested dicts/lists/tuples by its fetched value."""
    if isinstance(value, PLACEHOLDERS):
        return value.fetch()
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(materialize(v) for v in value)
    return value
