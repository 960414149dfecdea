"""Moving data between the driver and workers through Ray's object store.

- torch tensors travel as numpy byte views: Ray ships numpy buffers out-of-band (pickle
  protocol 5, zero-copy into the object store), where a pickled tensor copies its whole storage
  through pickle, and a view would drag its base storage along. The receiver gets a tensor of
  the original dtype, shape, device and `requires_grad`: a zero-copy view over the object-store
  buffer for large ones, a private copy for small ones (see `tensor_from_numpy` and the
  "Tensors and writability" section of docs/ray.md).
- A result travels as itself when it is small (Ray inlines it in the task's reply, so the
  driver has it anyway). A large one (`STORE_BYTES` or more of arrays or tensors, also nested
  in dicts, lists and tuples) is put in the object store by the worker, and the reply carries a
  `Stored` envelope: its `ResultMeta` (with the result's `tree`: structure, array shapes and
  dtypes) and the ref. The driver learns what it needs to hand the result to another group
  without fetching it. A large tensor result that a device-direct transport carries stays in
  the worker instead, behind a `Held` envelope (transports.py).
- Remote placeholders stand for (parts of) results that stay in the object store: a consumer
  worker fetches exactly the producer results it needs (`materialize`), the driver never does.
  `mirror` turns a result's tree into real dicts/lists/tuples of placeholders, so dispatchers
  walk and slice them exactly as they would the value.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from twinkle_core.plugin import is_array_like

from .transports import Held, decide, fetch_ref, hold, keep, receive

_registered = threading.local()
_lock = threading.Lock()
_registered_in_process = False


# ----------------------------------------------------------------------- torch tensors
#: Received tensors of at least this many bytes are zero-copy views over the object-store
#: buffer (shared with every reader of the object on the node); smaller ones are private copies
#: (copying them costs microseconds, and they stay safely writable).
ZERO_COPY_BYTES = 1 << 20

_NOT_WRITABLE = "The given (NumPy array|buffer) is not writable"


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
    """Inverse of `tensor_to_numpy`.

    A buffer Ray hands over read-only (the object store's shared memory) becomes a zero-copy
    tensor when it holds `ZERO_COPY_BYTES` or more: the tensor must then be treated as
    read-only (torch cannot flag it so; an in-place write would change the object for every
    reader on the node). Smaller ones, and writable buffers, are copied / used as they are.
    """
    import torch

    data, dtype_name, shape, device, requires_grad = packed
    dtype = getattr(torch, dtype_name)
    if not data.size:
        out = torch.empty(shape, dtype=dtype)
    else:
        if data.flags.writeable:
            buf = torch.from_numpy(data)
        elif data.nbytes < ZERO_COPY_BYTES:
            buf = torch.from_numpy(data.copy())
        else:
            buf = shared_view(data)
        out = buf.view(dtype).reshape(shape)
    shared = bool(data.size) and not data.flags.writeable and data.nbytes >= ZERO_COPY_BYTES
    if device != "cpu":
        try:
            out = out.to(device)
            shared = False
        except Exception:  # the receiver has no such device: keep it on the CPU
            pass
    if requires_grad and out.is_floating_point():
        out.requires_grad_(True)
    if shared and _guard.on:
        _guard.received.append(weakref.ref(out))
    return out


def shared_view(data: np.ndarray) -> Any:
    """A tensor over a read-only numpy buffer without copying it.

    torch warns (once per process) that it cannot mark such a tensor read-only; the rule is
    documented instead, so the warning is silenced here, for this call only (the way Ray Data
    converts object-store arrays to tensors).
    """
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NOT_WRITABLE, category=UserWarning)
        return torch.from_numpy(data)


class WriteGuard:
    """Notices a method writing in place into a tensor it received as a view of the object
    store (against the rule in docs/ray.md, "Tensors and writability").

    Received views are remembered (weakly) as they are deserialized; around each method call
    an actor compares their version counters (torch bumps a tensor's counter, shared with its
    views, on every in-place write) and warns once per method. Only actors turn it on.
    """

    def __init__(self) -> None:
        self.on = False
        self.received: list[weakref.ref] = []
        self.warned: set[str] = set()

    def start(self) -> list[tuple[Any, int]]:
        """The views received since the last call (arguments of the one about to run)."""
        if not self.received:
            return []
        refs, self.received = self.received, []
        live = [r() for r in refs]
        return [(t, t._version) for t in live if t is not None]

    def finish(self, seen: list[tuple[Any, int]], where: str) -> None:
        written = [t for t, version in seen if t._version != version]
        if not written or where in self.warned:
            return
        self.warned.add(where)
        mib = sum(t.numel() * t.element_size() for t in written) / 2**20
        warnings.warn(
            f"twinkle: {where} wrote in place into {len(written)} tensor argument(s) "
            f"({mib:.1f} MiB) received as zero-copy views of Ray's object store: other "
            "readers of the same object on this node (other consumers of the same result) "
            "see the change. Copy what you write first (t = t.clone(), or copy_ into your own "
            "tensors); see 'Tensors and writability' in docs/ray.md",
            RuntimeWarning,
            stacklevel=2,
        )


#: This process's guard; `TwinkleActor` turns it on (a driver never drains it).
WRITE_GUARD = _guard = WriteGuard()


@contextlib.contextmanager
def transfer_guard(guard: WriteGuard) -> Iterator[WriteGuard]:
    """Let `guard` (turned on) watch the tensors received in the block (for tests)."""
    global _guard
    previous, _guard = _guard, guard
    guard.on = True
    try:
        yield guard
    finally:
        _guard = previous


def writable_copies(value: Any) -> Any:
    """`value` with every tensor and numpy array that is a view of the object store (nested
    in dicts, lists and tuples) replaced by a private, writable copy."""
    kind = type(value)
    if kind is dict:
        return {k: writable_copies(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(writable_copies(v) for v in value)
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return value.copy()
    if type(value).__module__.split(".", 1)[0] == "torch" and hasattr(value, "clone"):
        return value.clone() if _is_shared_view(value) else value
    return value


def _is_shared_view(tensor: Any) -> bool:
    try:
        return tensor.untyped_storage().nbytes() >= ZERO_COPY_BYTES and not tensor.is_cuda
    except Exception:
        return False


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
#: A result's tree: its structure as far as dispatchers and collectors look at it.
#: ("a", kind, shape, dtype): an ndarray or tensor of at least one dimension;
#: ("d", keys, children), ("l", children), ("t", children): a plain dict, list or tuple;
#: ("L", n): a list of n plain items (numbers, strings, None);
#: ("v",): anything dispatchers pass through whole (numbers, strings, 0-d arrays, objects);
#: ("?",): something placeholders cannot stand for (dict subclasses, namedtuples, other
#: array-likes, or too many nodes): such a result is collected on the driver instead.
Tree = tuple

#: At most this many nodes are described per result (beyond, it is collected on the driver).
TREE_NODES = 65536

#: A list of more plain items (numbers, strings) than this is collected on the driver.
PLAIN_ITEMS = 1 << 18

_UNKNOWN: Tree = ("?",)
_LEAF: Tree = ("v",)


@dataclass(frozen=True)
class ResultMeta:
    """What the driver needs to hand a result on without fetching it."""

    kind: str  # "ndarray", "tensor", "number", "container" (dict/list/tuple/array) or "opaque"
    length: int | None = None
    dtype: str = ""
    tree: Tree = _UNKNOWN


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

    __slots__ = ("meta", "ref", "why")

    def __init__(self, meta: ResultMeta, ref: Any, why: str | None = None) -> None:
        self.meta = meta
        self.ref = ref
        #: Why the method's named transport (or `auto`'s device-direct path) was not used.
        self.why = why

    def __reduce__(self):
        return (Stored, (self.meta, self.ref, self.why))

    def __repr__(self) -> str:
        return f"<Stored {self.meta.kind} len={self.meta.length}>"


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.split(".", 1)[0] == "torch" and hasattr(value, "element_size")


def _array_bytes(value: Any) -> int:
    """Bytes of array data in `value` (an ndarray or a tensor), 0 for anything else."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if _is_tensor(value):
        try:
            return int(value.numel()) * int(value.element_size())
        except Exception:
            return 0
    return 0


#: How many items of dict/list/tuple results (nested ones included) are looked at for arrays.
_SCAN_ITEMS = 256


def is_large(value: Any) -> bool:
    """Whether a result should stay in the object store: arrays of `STORE_BYTES` or more,
    alone or among the first `_SCAN_ITEMS` items of (nested) dicts, lists and tuples."""
    kind = type(value)
    if kind in _PLAIN:
        return False
    if kind is dict or kind is list or kind is tuple:
        budget = [_SCAN_ITEMS]
        return _container_bytes(value, budget) >= STORE_BYTES
    return _array_bytes(value) >= STORE_BYTES


def _container_bytes(value: Any, budget: list[int]) -> int:
    total = 0
    items = value.values() if type(value) is dict else value
    for item in items:
        if budget[0] <= 0 or total >= STORE_BYTES:
            break
        budget[0] -= 1
        kind = type(item)
        if kind is dict or kind is list or kind is tuple:
            total += _container_bytes(item, budget)
        elif kind not in _PLAIN:
            total += _array_bytes(item)
    return total


def pack_result(
    value: Any, transport: str = "object_store", method: str = "", colocated: bool = False
) -> Any:
    """What a worker returns for `value`: the value itself, a `Stored` envelope, or (a large
    tensor result whose `transport` a device-direct path serves) a `Held` one (transports.py).

    `colocated`: this process hosts several objects, so a large result that would go to the
    object store is kept here instead (`transports.keep`): a colocated consumer takes it by
    reference, anyone else from this worker through the object store when they ask. A method
    that names `transport='object_store'` keeps the object store."""
    if not is_large(value):
        return value
    why = None
    if transport != "object_store":
        chosen, skeleton, tensors, why = decide(transport, value, method)
        if chosen != "object_store":
            return hold(chosen, skeleton, tensors, result_meta(value), transport == "auto")
        if colocated:
            return keep(value, result_meta(value))
    return Stored(result_meta(value), ray.put(value), why)


#: The reply types that stand for a result kept elsewhere. Told by class, never by name: a
#: user's result of a class that happens to be called `Held` is a result like any other.
ENVELOPE_TYPES = frozenset({Stored, Held})


def is_envelope(value: Any) -> bool:
    """Whether a reply stands for a result kept elsewhere (`Stored` or `Held`)."""
    return type(value) in ENVELOPE_TYPES


def opened_ref(value: Any) -> Any:
    """A ref to the result an envelope stands for (a held one is put in the object store by
    its holder)."""
    if type(value) is Stored:
        return value.ref
    return fetch_ref(value)


def unpack(value: Any) -> Any:
    """The result itself, fetching it when `value` is an envelope."""
    if is_envelope(value):
        return ray.get(opened_ref(value))
    return value


def meta_of(value: Any) -> ResultMeta:
    """The metadata of a fetched reply: the envelope's, or computed from a small value."""
    if is_envelope(value):
        return value.meta
    return result_meta(value)


def result_meta(value: Any) -> ResultMeta:
    tree = tree_of(value)
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        return ResultMeta("ndarray", int(value.shape[0]), str(value.dtype), tree)
    mod = type(value).__module__.split(".", 1)[0]
    if mod == "torch" and hasattr(value, "dim") and value.dim() >= 1:
        return ResultMeta("tensor", int(value.shape[0]), str(value.dtype), tree)
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return ResultMeta("number", tree=tree)
    if isinstance(value, (dict, list, tuple)) or is_array_like(value):
        return ResultMeta("container", tree=tree)
    return ResultMeta("opaque", tree=tree)


def tree_of(value: Any, limit: int = TREE_NODES) -> Tree:
    """`value`'s tree (see `Tree`); `("?",)` when it has more than `limit` nodes."""
    budget = [limit]
    try:
        return _tree(value, budget)
    except _TooBig:
        return _UNKNOWN


class _TooBig(Exception):
    pass


def _tree(value: Any, budget: list[int]) -> Tree:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooBig
    kind = type(value)
    if kind in _PLAIN:
        return _LEAF
    if kind is dict:
        keys = tuple(value)
        return ("d", keys, tuple(_tree(value[k], budget) for k in keys))
    if kind is list:
        if len(value) > 8 and _PLAIN.issuperset(map(type, value)):
            if len(value) > PLAIN_ITEMS:
                raise _TooBig
            return ("L", len(value))  # plain items (tokens, tags): one node for all
        return ("l", tuple(_tree(v, budget) for v in value))
    if kind is tuple:
        return ("t", tuple(_tree(v, budget) for v in value))
    if isinstance(value, np.ndarray) or _is_tensor(value):
        if value.ndim == 0:
            return _LEAF
        kind_name = "ndarray" if isinstance(value, np.ndarray) else "tensor"
        return ("a", kind_name, tuple(int(n) for n in value.shape), str(value.dtype))
    if isinstance(value, (dict, list, tuple)) or is_array_like(value):
        return _UNKNOWN  # subclasses and other array-likes: dispatchers may treat them apart
    return _LEAF


def has_unknown(tree: Tree) -> bool:
    if tree[0] == "?":
        return True
    if tree[0] == "d":
        return any(has_unknown(c) for c in tree[2])
    if tree[0] in ("l", "t"):
        return any(has_unknown(c) for c in tree[1])
    return False


# ----------------------------------------------------------------------- placeholders
def _at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


class RemoteValue:
    """One worker result (or the item at `path` inside it) left in the object store."""

    __slots__ = ("path", "ref")

    def __init__(self, ref: ray.ObjectRef, path: tuple = ()) -> None:
        self.ref = ref
        self.path = path

    def refs(self) -> list:
        return [self.ref]

    def fetch(self, fetched: dict | None = None) -> Any:
        fetched = fetched if fetched is not None else _fetch_map(self.refs())
        return _at(fetched[self.ref], self.path)

    def __reduce__(self):
        return (RemoteValue, (self.ref, self.path))

    def __repr__(self) -> str:
        return f"<RemoteValue {self.ref.hex()[:10]}{list(self.path) if self.path else ''}>"


class RemoteCollected:
    """A collector applied, on the consumer, to results (or items at `path` inside them) left
    in the object store: for values dispatchers pass through whole (sum of numbers, ...), or
    any collected value when the call's dispatcher hands every worker the arguments whole.
    A `None` ref is a result the collector does not look at (never fetched)."""

    __slots__ = ("collector", "mesh", "path", "refs_")

    def __init__(self, refs: list, collector: Any, mesh: Any, path: tuple = ()) -> None:
        self.refs_ = list(refs)
        self.collector = collector
        self.mesh = mesh
        self.path = path

    def refs(self) -> list:
        return [r for r in self.refs_ if r is not None]

    def fetch(self, fetched: dict | None = None) -> Any:
        fetched = fetched if fetched is not None else _fetch_map(self.refs())
        values = [None if r is None else _at(fetched[r], self.path) for r in self.refs_]
        return self.collector.collect(values, self.mesh)

    def __reduce__(self):
        return (RemoteCollected, (self.refs_, self.collector, self.mesh, self.path))

    def __repr__(self) -> str:
        return f"<RemoteCollected {getattr(self.collector, 'name', '?')} of {len(self.refs_)}>"


class RemoteStacked:
    """`concat` of one plain leaf per result (numbers, strings, 0-d arrays): an array of one
    row per result, made on the consumer; sliceable like that array without fetching."""

    __slots__ = ("collector", "path", "refs_")

    def __init__(self, refs: list, collector: Any, path: tuple = ()) -> None:
        self.refs_ = list(refs)
        self.collector = collector
        self.path = path

    def __len__(self) -> int:
        return len(self.refs_)

    @property
    def shape(self) -> tuple[int]:
        return (len(self.refs_),)

    def __getitem__(self, item: Any) -> RemoteStacked:
        if not isinstance(item, slice):
            raise TypeError("a RemoteStacked (not fetched yet) only supports slices along dim 0")
        return RemoteStacked(self.refs_[item], self.collector, self.path)

    def refs(self) -> list:
        return list(self.refs_)

    def fetch(self, fetched: dict | None = None) -> Any:
        fetched = fetched if fetched is not None else _fetch_map(self.refs())
        values = [_at(fetched[r], self.path) for r in self.refs_]
        if not values:
            return np.empty(0)
        return self.collector.collect(values, None)

    def __reduce__(self):
        return (RemoteStacked, (self.refs_, self.collector, self.path))


class RemoteArray:
    """The dim-0 concatenation of arrays (results, or the items at `path` inside them) in the
    object store, sliceable without fetching.

    It looks array-like to dispatchers (`shape`, `len`, slicing), so `slice_dp` hands each
    consumer a `RemoteArray` over only the producer results its share overlaps. With `reduce`
    (a sum/mean collector) it stands for the element-wise reduction of its parts instead (all
    of one shape): slicing then slices every operand alike.
    """

    __slots__ = ("dtype", "inner", "kind", "parts", "path", "reduce")

    def __init__(
        self,
        parts: list[tuple[Any, int, int]],
        kind: str,
        path: tuple = (),
        inner: tuple = (),
        dtype: str = "",
        reduce: Any = None,
    ) -> None:
        self.parts = parts  # (ref, start, stop) within each result
        self.kind = kind
        self.path = path
        self.inner = inner  # the shape after dim 0
        self.dtype = dtype
        self.reduce = reduce

    def __len__(self) -> int:
        if self.reduce is not None:
            _, start, stop = self.parts[0]
            return stop - start
        return sum(stop - start for _, start, stop in self.parts)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.inner)

    @property
    def ndim(self) -> int:
        return 1 + len(self.inner)

    def __getitem__(self, item: Any) -> RemoteArray:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError(
                "a RemoteArray (a result of another group, not fetched yet) only supports "
                "contiguous slices along dim 0; fetch it in the worker to index it otherwise"
            )
        start, stop, _ = item.indices(len(self))
        stop = max(start, stop)
        if self.reduce is not None:
            parts = [(ref, a + start, a + stop) for ref, a, _ in self.parts]
            return self._with(parts)
        parts, offset = [], 0
        for ref, a, b in self.parts:
            n = b - a
            lo, hi = max(start - offset, 0), min(stop - offset, n)
            if lo < hi:
                parts.append((ref, a + lo, a + hi))
            offset += n
        return self._with(parts)

    def _with(self, parts: list) -> RemoteArray:
        return RemoteArray(parts, self.kind, self.path, self.inner, self.dtype, self.reduce)

    def refs(self) -> list:
        return [ref for ref, _, _ in self.parts]

    def fetch(self, fetched: dict | None = None) -> Any:
        fetched = fetched if fetched is not None else _fetch_map(self.refs())
        pieces = []
        for ref, a, b in self.parts:
            whole = _at(fetched[ref], self.path)
            pieces.append(whole if a == 0 and b == len(whole) else whole[a:b])
        if self.reduce is not None:
            return self.reduce.collect(pieces, None)
        if self.kind == "tensor":
            import torch

            if not pieces:
                return torch.empty((0, *self.inner), dtype=getattr(torch, self.dtype[6:]))
            return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
        if not pieces:
            return np.empty((0, *self.inner), dtype=self.dtype or None)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)

    def __reduce__(self):
        state = (self.parts, self.kind, self.path, self.inner, self.dtype, self.reduce)
        return (RemoteArray, state)

    def __repr__(self) -> str:
        how = f" {self.reduce.name}" if self.reduce is not None else ""
        return f"<RemoteArray{how} {self.kind} len={len(self)} parts={len(self.parts)}>"


PLACEHOLDERS = (RemoteValue, RemoteCollected, RemoteArray, RemoteStacked)


def mirror(tree: Tree, ref: Any, path: tuple = ()) -> Any:
    """A result as real dicts/lists/tuples of placeholders over `ref` (see `Tree`)."""
    tag = tree[0]
    if tag == "a":
        _, kind, shape, dtype = tree
        return RemoteArray([(ref, 0, shape[0])], kind, path, tuple(shape[1:]), dtype)
    if tag == "d":
        return {k: mirror(c, ref, (*path, k)) for k, c in zip(tree[1], tree[2], strict=True)}
    if tag == "l":
        return [mirror(c, ref, (*path, i)) for i, c in enumerate(tree[1])]
    if tag == "t":
        return tuple(mirror(c, ref, (*path, i)) for i, c in enumerate(tree[1]))
    if tag == "v":
        return RemoteValue(ref, path)
    if tag == "L":
        return [RemoteValue(ref, (*path, i)) for i in range(tree[1])]
    raise ValueError(f"no placeholder stands for a result of this shape ({tree!r})")


def _fetch_map(refs: list) -> dict:
    """{ref: result} for the distinct `refs` (task replies or stored results), one `ray.get`
    for all of them, envelopes opened as `_fetch_all` opens them."""
    unique = list(dict.fromkeys(refs))
    values = _fetch_all(unique)
    return dict(zip(unique, values, strict=True))


def _fetch_all(refs: list) -> list[Any]:
    """The results behind `refs` (task replies): `Stored` envelopes opened with one more
    `ray.get` for all of them, `Held` ones received from their holder (`transports.receive`)."""
    values = ray.get(refs)
    held = [i for i, v in enumerate(values) if is_envelope(v) and type(v) is not Stored]
    if held:
        for i in held:  # in the order the driver queued their sends (transports.py)
            values[i] = receive(values[i])
    stored = [i for i, v in enumerate(values) if type(v) is Stored]
    if stored:
        for i, inner in zip(stored, ray.get([values[i].ref for i in stored]), strict=True):
            values[i] = inner
    return values


def _placeholders(value: Any, out: list) -> None:
    if isinstance(value, PLACEHOLDERS):
        out.append(value)
    elif type(value) is dict:
        for v in value.values():
            _placeholders(v, out)
    elif type(value) in (list, tuple):
        for v in value:
            _placeholders(v, out)


def placeholder_refs(value: Any) -> list:
    """The distinct refs (first seen first) of the results that the placeholders in nested
    dicts/lists/tuples `value` stand for."""
    found: list = []
    _placeholders(value, found)
    return list(dict.fromkeys(ref for p in found for ref in p.refs()))


def _replace(value: Any, fetched: dict) -> Any:
    if isinstance(value, PLACEHOLDERS):
        return value.fetch(fetched)
    if type(value) is dict:
        return {k: _replace(v, fetched) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_replace(v, fetched) for v in value)
    return value


def materialize(value: Any) -> Any:
    """Replace every placeholder in nested dicts/lists/tuples by its fetched value: each
    distinct result is fetched once (one `ray.get` for all of them), however many
    placeholders stand for parts of it."""
    found: list = []
    _placeholders(value, found)
    if not found:
        return value
    fetched = _fetch_map([ref for p in found for ref in p.refs()])
    return _replace(value, fetched)
