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
from typing import Any

import ray

from twinkle_core.plugin import WorkerCall

_SMALL = (type(None), bool, int, float, complex)


def _is_small(value: Any) -> bool:
    if isinstance(value, _SMALL):
        return True
    return isinstance(value, (str, bytes)) and len(value) < 1024


class Shipper:
    """Puts each object shared by several workers' arguments into the object store once.

    `slice_dp` hands tp/pp peers the very same shard object and `dispatch='all'` every worker
    the same arguments: one `ray.put` per distinct object (by identity) and the same ref to
    each receiver, instead of one inline copy per worker. Ray resolves top-level refs before
    the method runs, so the worker sees the value.
    """

    def __init__(self, per_call: list[tuple[tuple, dict]]) -> None:
        self.counts = collections.Counter(
            id(v) for args, kwargs in per_call for v in (*args, *kwargs.values())
        )
        self.refs: dict[int, ray.ObjectRef] = {}
        self.puts = 0

    def ship(self, value: Any) -> Any:
        if self.counts[id(value)] < 2 or _is_small(value) or isinstance(value, ray.ObjectRef):
            return value
        ref = self.refs.get(id(value))
        if ref is None:
            ref = self.refs[id(value)] = ray.put(value)
            self.puts += 1
        return ref

    def ship_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(self.ship(a) for a in args), {k: self.ship(v) for k, v in kwargs.items()}


def ship_all(calls: list[WorkerCall]) -> list[tuple[tuple, dict]]:
    """Each call's arguments, objects shared between calls put in the object store once."""
    shared = False
    if len(calls) > 1:
        seen: set[int] = set()
        for call in calls:
            for v in (*call.args, *call.kwargs.values()):
                if not _is_small(v):
                    if id(v) in seen:
                        shared = True
                        break
                    seen.add(id(v))
            if shared:
                break
    if not shared:
        return [(c.args, c.kwargs) for c in calls]
    shipper = Shipper([(c.args, c.kwargs) for c in calls])
    return [shipper.ship_call(c.args, c.kwargs) for c in calls]
