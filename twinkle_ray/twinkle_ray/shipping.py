"""Shipping one call's arguments to several workers: each shared object goes to the object
store once.

Ray serializes every argument of every actor task on its own, so an object handed to several
workers of one call (`slice_dp` gives tp/pp peers the very same shard, `dispatch='all'` gives
every worker the same arguments) would be copied once per worker. `ship_all` puts such objects
in the object store once and hands each worker the same ref; calls without a shared object
are left exactly as they are.
"""

from __future__ import annotations

import collections
import operator
from typing import Any

import ray

from twinkle_core.plugin import WorkerCall

_SCALARS = (type(None), bool, int, float, complex)

#: Arguments estimated below this many bytes travel inline with each task, as raw Ray passes
#: them (Ray inlines task arguments up to 100 KiB, `max_direct_call_object_size`); larger
#: ones shared by several workers go to the object store once. Measured (benchmark case 20):
#: a put plus a fetch per worker costs more than serializing a 64 KiB value once per worker.
INLINE_BYTES = 100 * 1024

#: Items of (nested) dicts, lists and tuples looked at to estimate a size; a larger container
#: counts as large without being walked.
_SCAN_ITEMS = 512


def _is_small(value: Any) -> bool:
    """Whether `value` is cheap enough to send inline to every worker (see `INLINE_BYTES`)."""
    if isinstance(value, _SCALARS):
        return True
    return _estimate(value, [_SCAN_ITEMS]) < INLINE_BYTES


def _estimate(value: Any, budget: list[int]) -> int:
    """Roughly the bytes `value` pickles to; `INLINE_BYTES` for anything not understood (or
    past the item budget), so that it is put in the object store as before."""
    budget[0] -= 1
    if budget[0] < 0:
        return INLINE_BYTES
    kind = type(value)
    if kind in _SCALARS:
        return 16
    if kind is str or kind is bytes or kind is bytearray:
        return len(value) + 32
    if kind is dict:
        total = 64
        for k, v in value.items():
            total += _estimate(k, budget) + _estimate(v, budget)
            if total >= INLINE_BYTES:
                return total
        return total
    if kind is list or kind is tuple:
        total = 64
        for v in value:
            total += _estimate(v, budget)
            if total >= INLINE_BYTES:
                return total
        return total
    nbytes = getattr(value, "nbytes", None)  # numpy arrays
    if isinstance(nbytes, int) and type(value).__module__ == "numpy":
        return nbytes + 160
    if type(value).__module__.split(".", 1)[0] == "torch" and hasattr(value, "element_size"):
        try:
            return int(value.numel()) * int(value.element_size()) + 320
        except Exception:
            return INLINE_BYTES
    return INLINE_BYTES


def _all_small_and_the_same(calls: list[WorkerCall]) -> bool:
    """Whether every call has the very same positional arguments, no keywords, and none of
    them large (`dispatch='all'` with a config dict, the common call): nothing to put, known
    without the `Shipper`'s counting (measured: 6 us of a 4-worker call's 17 us of Python)."""
    args = calls[0].args
    for call in calls:
        if call.args is not args or call.kwargs:
            return False
    return all(_is_small(value) for value in args)


class Shipper:
    """Puts each large object shared by several workers' arguments into the object store once.

    `slice_dp` hands tp/pp peers the very same shard object and `dispatch='all'` every worker
    the same arguments: one `ray.put` per distinct large object (by identity) and the same ref
    to each receiver, instead of one inline copy per worker. Ray resolves top-level refs before
    the method runs, so the worker sees the value. Small objects (`INLINE_BYTES`) travel
    inline, as raw Ray sends them: a put and a fetch per worker would cost more.
    """

    def __init__(self, per_call: list[tuple[tuple, dict]]) -> None:
        counts = collections.Counter(
            id(v) for args, kwargs in per_call for v in (*args, *kwargs.values())
        )
        #: ids of the objects to put: shared by several calls and large (estimated once each).
        self.large: set[int] = set()
        for args, kwargs in per_call:
            for v in (*args, *kwargs.values()):
                key = id(v)
                if counts[key] < 2 or isinstance(v, ray.ObjectRef):
                    continue
                counts[key] = 0  # estimated: not again
                if not _is_small(v):
                    self.large.add(key)
        self.refs: dict[int, ray.ObjectRef] = {}
        self.puts = 0

    def ship(self, value: Any) -> Any:
        if id(value) not in self.large:
            return value
        ref = self.refs.get(id(value))
        if ref is None:
            ref = self.refs[id(value)] = ray.put(value)
            self.puts += 1
        return ref

    def ship_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(self.ship(a) for a in args), {k: self.ship(v) for k, v in kwargs.items()}


#: A `WorkerCall`'s (args, kwargs).
_ARGS_AND_KWARGS = operator.itemgetter(1, 2)


def ship_all(calls: list[WorkerCall]) -> list[tuple[tuple, dict]]:
    """Each call's arguments, large objects shared between calls put in the object store
    once; everything else exactly as given."""
    per_call = list(map(_ARGS_AND_KWARGS, calls))  # (args, kwargs) of each, made in C
    if len(calls) < 2:
        return per_call
    if _all_small_and_the_same(calls):
        return per_call
    shipper = Shipper(per_call)
    if not shipper.large:
        return per_call
    return [shipper.ship_call(a, k) for a, k in per_call]
