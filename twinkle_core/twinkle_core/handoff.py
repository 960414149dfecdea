"""By-reference hand-off between colocated objects: a result of object A handed to object B
on the same group reaches B's worker on each rank as the very object A's worker returned there.

Backends whose workers of one group share a process per rank (all three built-in ones) use
this module to build the argument from the producer's per-rank results instead of from the
collected value:

- `hand_off_value(collector, mesh, results)` is what `collector.collect(results, mesh)` would
  give, built from the result objects themselves: `none`, `first`, `last_pp` and `flatten`
  place those objects in the value as they are, and `concat` makes each array leaf a
  `RankParts`, which `slice_dp` (or any dim-0 slice) cuts back into the very part one rank
  returned when the slice covers exactly that part, and into a real slice otherwise.
- `finish_hand_off(args, kwargs)` turns the `RankParts` a dispatcher left whole (`dispatch=
  'all'`) into the arrays they stand for, once per stand-in, right before the workers run.
- `reference_memo(result)` is a `copy.deepcopy` memo that keeps a worker's own result (and
  everything in it) out of the argument copy a backend makes for isolation: rank r's worker
  receives rank r's result by reference, any other rank's result as a copy.

Only the built-in collectors and dispatchers are followed (a user's collector or dispatcher
may look inside the value, so it gets the collected value as always): `builtin_hand_off`
says whether a call qualifies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .collect import (
    ConcatCollector,
    FirstCollector,
    FlattenCollector,
    LastPPCollector,
    NoneCollector,
    _concat_leaf,
    representatives,
)
from .device_mesh import DeviceMesh
from .dispatch import BUILTIN_DISPATCHERS
from .structure import combine, torch_module

#: Collectors whose value is made of the results themselves (exactly these classes).
_PLACING = (NoneCollector, FirstCollector, LastPPCollector, FlattenCollector)
_DISPATCHERS = tuple(type(d) for d in BUILTIN_DISPATCHERS.values())


class RankParts:
    """Stands for the dim-0 concatenation of one array leaf of every data shard's result.

    It has the concatenation's `len`, `shape`, `ndim` and `dtype`, so dispatchers measure and
    slice it like the array. A contiguous slice that covers exactly one part is that part,
    the very object its worker returned; any other index is applied to the concatenation
    (made once, on first need).
    """

    __slots__ = ("_whole", "parts")

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self._whole: Any = None

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *tuple(self.parts[0].shape)[1:])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self.parts[0].dtype

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, slice) and item.step in (None, 1):
            start, stop, _ = item.indices(len(self))
            offset = 0
            for part in self.parts:
                n = len(part)
                if start == offset and stop == offset + n and n > 0:
                    return part
                offset += n
        return self.value()[item]

    def value(self) -> Any:
        """The concatenation itself (what `concat` collects)."""
        if self._whole is None:
            self._whole = _concat_leaf(self.parts)
        return self._whole

    def __repr__(self) -> str:
        return f"<RankParts of {len(self.parts)} shape={self.shape}>"


def _is_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim >= 1
    torch = torch_module(value)
    return torch is not None and isinstance(value, torch.Tensor) and value.dim() >= 1


def _concat_parts(values: list) -> Any:
    first = values[0]
    if _is_array(first) and all(type(v) is type(first) and _is_array(v) for v in values):
        inner = tuple(first.shape)[1:]
        if all(tuple(v.shape)[1:] == inner and v.dtype == first.dtype for v in values):
            return RankParts(list(values))
    return _concat_leaf(values)


def builtin_hand_off(collector: Any, dispatcher: Any) -> bool:
    """Whether a hand-off collected by `collector` and split by `dispatcher` (None: not
    known yet, e.g. a constructor's arguments) can be built by reference here."""
    kind = type(collector)
    if kind is not ConcatCollector and kind not in _PLACING:
        return False
    return dispatcher is None or type(dispatcher) in _DISPATCHERS


def hand_off_value(collector: Any, mesh: DeviceMesh | None, results: list) -> Any:
    """`collector.collect(results, mesh)`, built from the result objects themselves (see the
    module doc); the caller checked `builtin_hand_off`."""
    if type(collector) is ConcatCollector:
        return combine(representatives(results, mesh), _concat_parts)
    return collector.collect(results, mesh)


def _finish(value: Any, done: dict[int, Any]) -> Any:
    kind = type(value)
    if kind is RankParts:
        hit = done.get(id(value))
        if hit is None:
            hit = done[id(value)] = value.value()
        return hit
    if kind is dict:
        return {k: _finish(v, done) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(_finish(v, done) for v in value)
    return value


def has_stand_ins(value: Any) -> bool:
    """Whether `value` holds a `RankParts` (only dicts and tuples are walked: `concat` makes
    its stand-ins there, never inside lists, so a long list of items costs nothing)."""
    kind = type(value)
    if kind is RankParts:
        return True
    if kind is dict:
        return any(has_stand_ins(v) for v in value.values())
    if kind is tuple:
        return any(has_stand_ins(v) for v in value)
    return False


def colocated_source(value: Any, consumer: Any) -> Any:
    """The `CallSource` of LazyCollect `value` when it is a call of another object on the
    consumer's group (same kind of worker group, same group name, same size), else None."""
    source = getattr(value, "source", None)
    producer = getattr(source, "workers", None)
    if (
        producer is None
        or type(producer) is not type(consumer)
        or producer.group.name != consumer.group.name
        or producer.size != consumer.size
    ):
        return None
    return source


def by_reference(value: Any, consumer: Any, call: Any) -> Any | None:
    """The default by-reference hand-off (`WorkerGroup.resolve_argument`): the argument built
    from the finished results of a colocated producer as they are, or None."""
    source = colocated_source(value, consumer)
    if source is None or not builtin_hand_off(source.collector, call.dispatcher):
        return None
    pending = source.pending
    if not pending.done() or not pending.succeeded():
        return None  # (waits, raises as collecting does)
    try:
        results = pending.wait(0)
        if len(results) != consumer.size:
            return None  # a call to some of the workers
        return hand_off_value(source.collector, source.device_mesh, results)
    except Exception:
        return None  # the collector's error, raised as collecting raises it


def finish_hand_off(worker_args: list[tuple[tuple, dict]]) -> list[tuple[tuple, dict]]:
    """Every worker's `(args, kwargs)` with the `RankParts` a dispatcher passed on whole
    replaced by the arrays they stand for (each made once, however many workers get it)."""
    done: dict[int, Any] = {}
    return [(_finish(a, done), _finish(k, done)) for a, k in worker_args]


def reference_memo(result: Any) -> dict[int, Any]:
    """A `copy.deepcopy` memo that leaves `result` and everything inside its dicts, lists and
    tuples uncopied: the objects a worker receives by reference."""
    memo: dict[int, Any] = {}
    _memo(result, memo)
    return memo


def _memo(value: Any, memo: dict[int, Any]) -> None:
    memo[id(value)] = value
    kind = type(value)
    if kind is dict:
        for v in value.values():
            _memo(v, memo)
    elif kind is list or kind is tuple:
        for v in value:
            _memo(v, memo)
